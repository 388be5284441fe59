"""Repairing a divergence: the staging holds changes a promoted standby never had.

When the stream finds that the server's new timeline left the old one before the staged position
(:class:`~spockwire.connection.TimelineDiverged`: a standby that lagged was promoted), every change staged past the
switch point is one the new primary never had. The worker repairs the staging without rewriting it (its log only
grows, and readers may have read it already):

1. The new primary's WAL is moved past the staged position (``pg_switch_wal()`` a segment at a time where the role
   may call it, non-transactional logical messages no stream receives otherwise), so positions keep increasing
   in the staging and every reader orders the repair after what it replaces.
2. A temporary slot created with an exported snapshot gives a consistent point P past it.
3. One staging commit publishes a truncate of every replicated table, at P - 1 (before the snapshot rows, whose
   ``_seq`` starts at the lowest value), and every row of each table at P, read under the snapshot. Its log
   entry's "snapshot" record has kind "repair" and says what it replaced (``switch_point``, ``from_timeline``,
   ``replaced_up_to``); the entry records the new timeline.
4. The stream resumes from P on the new timeline: everything the new primary committed before P is in the
   snapshot.

A crash before that commit leaves nothing visible: the next start finds the same divergence and repairs again.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from ..connection.errors import TimelineDiverged
from ..connection.failover import move_wal_past
from ..connection.slots import format_lsn
from ..model import Truncate

__all__ = ["repair_divergence"]

log = logging.getLogger("spockwire.ingest")


def repair_divergence(worker: Any, diverged: TimelineDiverged) -> dict[str, Any] | None:
    """Stage the repair of `diverged` into the worker's staging folder (a writer of its own); returns the log
    entry. The worker resumes from its position afterwards."""
    from ..connection.session import pinned_connect
    from ..snapshot.initial import (SnapshotProgress, create_slot_with_snapshot, replicated_tables, snapshot_record,
                                    snapshot_time, stage_snapshot_tables)
    from .source import read_source
    from .staging import StagingWriter

    cfg = worker.config
    ck = cfg.extra.get("connect_kwargs")
    source = read_source(cfg.dsn, slot=cfg.slot, plugin=cfg.plugin, publication=cfg.publication,
                         replication_sets=cfg.replication_sets, connect_kwargs=ck)
    writer = StagingWriter(cfg.out, worker.protocol, compression=cfg.compression, source=source)
    try:
        staged = writer.newest_lsn
        conn = pinned_connect(cfg.dsn, **dict(ck or {}))
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                move_wal_past(cur, max(staged, diverged.acked) + 1)
        finally:
            conn.close()
        temp_slot = f"{cfg.slot}_repair_{os.getpid()}"[:63]
        progress = SnapshotProgress()
        worker.metrics.snapshot = progress
        with create_slot_with_snapshot(cfg.dsn, temp_slot, cfg.plugin, temporary=True,
                                       connect_kwargs=ck) as exported:
            point = exported.consistent_point
            tables = replicated_tables(cfg.dsn, cfg.plugin, publication=cfg.publication,
                                       replication_sets=cfg.replication_sets, snapshot=exported.name,
                                       connect_kwargs=ck)
            log.warning(json.dumps({"event": "divergence_repair", "switch_point": format_lsn(diverged.switch_point),
                                    "staged_lsn": format_lsn(staged), "timeline": diverged.timeline,
                                    "consistent_point": exported.consistent_point_text,
                                    "tables": [t.name for t in tables]}))
            commit_ts = snapshot_time(cfg.dsn, exported.name, ck)
            if tables:
                writer.add(Truncate(relations=tuple(t.relation for t in tables), cascade=False,
                                    restart_identity=False, commit_lsn=point - 1, commit_ts=commit_ts, xid=0, seq=0,
                                    origin=None))
            counts = stage_snapshot_tables(writer, cfg.dsn, exported, tables, commit_ts, workers=cfg.snapshot_workers,
                                           types=cfg.types, progress=progress, connect_kwargs=ck)
            meta = snapshot_record("repair", exported, commit_ts, counts, switch_point=diverged.switch_point,
                                   from_timeline=writer.state.timeline, replaced_up_to=staged)
            writer.timeline = diverged.timeline
            entry = writer.commit(point, snapshot=meta)
        if entry is not None:
            worker.metrics.record_commit(entry, "snapshot")
        log.warning(json.dumps({"event": "divergence_repaired", "commit": entry["commit"] if entry else None,
                                "consistent_point": exported.consistent_point_text, "tables": counts}))
        return entry
    finally:
        writer.close()
