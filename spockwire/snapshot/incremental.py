"""Snapshots of tables that join a running stream (added to the publication or replication set later).

The ingest worker keeps streaming its slot; a table it has no snapshot of gets one when

* its first change arrives in the stream (a new relation),
* `spockwire snapshot --table T --staging OUT` leaves a request in OUT/_spockwire/snapshot-requests/, or
* the periodic check of the publication / replication sets finds it (a table added but not yet changed).

Each table snapshot is exact the way PostgreSQL's own table synchronisation is: a temporary slot created with an
exported snapshot gives a pair (consistent point P, snapshot S) in which S sees exactly the transactions that
committed before P. The table is read under S; its rows are staged as snapshot rows at P (one Parquet file,
published by one staging commit together with a "snapshot" record), and from then on the writer drops the
stream's changes of that table with a (`_commit_lsn`, `_seq`) at or below the snapshot's (so every change that
committed before P, which S already shows) and keeps every later one. No watermark has to be written into the
source, the table needs no key, and a crash before the commit leaves nothing visible: the restarted worker sees the
table's changes again and takes a new snapshot.

While a table is read the worker does not consume the stream (its status thread keeps the connection alive); the
stream resumes where it was, without a resync.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from ..model import ChangeBatch, Truncate
from .initial import (SnapshotError, SnapshotProgress, create_slot_with_snapshot, iter_snapshot_rows,
                      replicated_tables, snapshot_rows, snapshot_time)

__all__ = ["IncrementalSnapshots", "request_snapshot", "REQUESTS_DIR"]

log = logging.getLogger("spockwire.snapshot")

#: Where `request_snapshot` leaves requests for the worker of a staging folder (relative to the folder).
REQUESTS_DIR = "_spockwire/snapshot-requests"


def request_snapshot(out_dir: str | os.PathLike[str], tables: Iterable[str]) -> Path:
    """Ask the ingest worker of staging folder `out_dir` to snapshot `tables` ("schema.table") it has no
    snapshot of yet. Returns the request file; the worker removes it once it has acted on it."""
    folder = Path(out_dir) / REQUESTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps({"tables": sorted(set(tables))}) + "\n")
    os.replace(tmp, folder / name)
    return folder / name


class IncrementalSnapshots:
    """The worker's bookkeeping of which tables have a snapshot, and the snapshots of the others."""

    def __init__(self, worker: Any, check_interval: float = 10.0) -> None:
        self.worker = worker
        self.config = worker.config
        self.check_interval = check_interval
        state = worker.writer.state
        self.known: set[str] = set()
        for record in state.snapshots:
            self.known.update(record.get("tables", {}))
        self.known.update(state.files)          # tables with staged rows (a snapshot, or older changes)
        self.count = len(state.snapshots)
        self._last_check = time.monotonic()
        self.requests = Path(self.config.out) / REQUESTS_DIR

    # ------------------------------------------------------------------ triggers
    def before(self, event: Any) -> None:
        """Called with every event before the writer adds it: a table seen for the first time is read first."""
        if isinstance(event, ChangeBatch):
            names = [event.relation.qualified_name]
        elif isinstance(event, Truncate):
            names = [r.qualified_name for r in event.relations]
        else:
            return
        new = [n for n in names if n not in self.known]
        if new:
            self.snapshot(new, reason="new relation in the stream")

    def poll(self) -> None:
        """Requests left by `spockwire snapshot --table`, and every `check_interval` seconds the publication's
        tables."""
        try:
            names = sorted(n for n in os.listdir(self.requests) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            names = []
        for name in names:
            path = self.requests / name
            try:
                wanted = json.loads(path.read_text()).get("tables", [])
            except (OSError, ValueError):
                wanted = []
            new = [t for t in wanted if t not in self.known]
            for t in wanted:
                if t in self.known:
                    log.info(json.dumps({"event": "snapshot_skipped", "table": t,
                                         "reason": "the table already has a snapshot or staged rows"}))
            if new:
                self.snapshot(new, reason="requested")
            path.unlink(missing_ok=True)
        now = time.monotonic()
        if self.check_interval and now - self._last_check >= self.check_interval:
            self._last_check = now
            cfg = self.config
            try:
                tables = replicated_tables(cfg.dsn, cfg.plugin, publication=cfg.publication,
                                           replication_sets=cfg.replication_sets,
                                           connect_kwargs=cfg.extra.get("connect_kwargs"), skip=self.known)
            except SnapshotError as exc:
                log.warning("cannot list the replicated tables: %s", exc)
                return
            new = [t.name for t in tables if t.name not in self.known]
            if new:
                self.snapshot(new, reason="added to the publication")

    # ------------------------------------------------------------------ the snapshot
    def snapshot(self, names: list[str], *, reason: str) -> None:
        """Read `names` under a fresh exported snapshot and publish their rows in one staging commit."""
        worker = self.worker
        cfg = self.config
        writer = worker.writer
        self.count += 1
        temp_slot = f"{cfg.slot}_snap_{os.getpid()}_{self.count}"[:63]
        progress = SnapshotProgress()
        worker.metrics.snapshot = progress
        ck = cfg.extra.get("connect_kwargs")
        with create_slot_with_snapshot(cfg.dsn, temp_slot, cfg.plugin, temporary=True,
                                       connect_kwargs=ck) as exported:
            tables = {t.name: t for t in replicated_tables(cfg.dsn, cfg.plugin, publication=cfg.publication,
                                                           replication_sets=cfg.replication_sets,
                                                           snapshot=exported.name, connect_kwargs=ck)}
            chosen = [tables[n] for n in names if n in tables]
            for n in names:
                if n not in tables:
                    log.warning(json.dumps({"event": "snapshot_skipped", "table": n,
                                            "reason": "not replicated at the snapshot"}))
            log.info(json.dumps({"event": "snapshot_start", "kind": "incremental", "reason": reason,
                                 "tables": [t.name for t in chosen],
                                 "consistent_point": exported.consistent_point_text}))
            progress.tables_total = len(chosen)
            progress.estimated_rows = sum(max(t.estimated_rows, 0) for t in chosen)
            commit_ts = snapshot_time(cfg.dsn, exported.name, ck)
            counts: dict[str, int] = {}
            for table in chosen:
                progress.current = table.name
                batches = iter_snapshot_rows(cfg.dsn, table, exported.name, workers=cfg.snapshot_workers,
                                             types=cfg.types, connect_kwargs=ck)
                counts[table.name] = writer.stage_snapshot_table(
                    table.relation, snapshot_rows(batches, table.relation, exported.consistent_point, commit_ts,
                                                  progress))
                progress.tables_done += 1
            progress.current = None
            meta = {"kind": "incremental", "slot": temp_slot, "consistent_point": exported.consistent_point,
                    "consistent_point_text": exported.consistent_point_text, "snapshot_name": exported.name,
                    "snapshot_ts": commit_ts.isoformat(), "tables": counts}
            # the log's LSN stays where the stream's staging has it: the snapshot rows lie ahead of it
            entry = writer.commit(writer.committed_lsn, snapshot=meta)
        if entry is not None:
            worker.metrics.record_commit(entry)
        self.known.update(names)
        log.info(json.dumps({"event": "snapshot_done", "kind": "incremental", "tables": counts,
                             "consistent_point": exported.consistent_point_text,
                             "commit": entry["commit"] if entry else None}))
