"""Snapshots of tables that join a running stream (added to the publication or replication set later).

The ingest worker keeps streaming its slot; a table it has no snapshot of gets one when

* its first change arrives in the stream (a new relation),
* `spockwire snapshot --table T --staging OUT` leaves a request in OUT/_spockwire/snapshot-requests/, or
* the periodic check of the publication / replication sets finds it (a table added but not yet changed).

A table with a key (its replica identity index, or its primary key) is read in chunks while the stream goes on
(chunked.py: the DBLog watermark method; pgoutput on PostgreSQL 14 or later writes its watermarks as logical
messages, pglogical and spock as rows of the watermark table): nothing pauses. A "snapshot" record
of kind "chunked" in the staging log marks such a table's start, one of kind "chunk" each staged chunk (its last
key, "done" on the last): a restarted worker resumes the table at the chunk after the last staged one.

Every other table (no key; older servers; a watermark table that cannot be created or added to the replication
set) is read whole, exactly the way PostgreSQL's own table synchronisation is: a temporary slot created with an
exported snapshot gives a pair (consistent point P, snapshot S) in which S sees exactly the transactions that
committed before P. The table is read under S; its rows are staged as snapshot rows at P (one Parquet file,
published by one staging commit together with a "snapshot" record of kind "incremental"), and from then on the
writer drops the stream's changes of that table with a (`_commit_lsn`, `_seq`) at or below the snapshot's (so
every change that committed before P, which S already shows) and keeps every later one. A crash before the commit
leaves nothing visible: the restarted worker sees the table's changes again and takes a new snapshot. While such
a table is read the worker does not consume the stream (its status thread keeps the connection alive); the stream
resumes where it was, without a resync.
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
from .chunked import DEFAULT_CHUNK_ROWS, WATERMARK_TABLE, ChunkedSnapshots, key_columns, order_around_watermarks
from .initial import (SnapshotError, SnapshotProgress, create_slot_with_snapshot, replicated_tables, snapshot_record,
                      snapshot_time, stage_snapshot_tables)

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

    def __init__(self, worker: Any, check_interval: float = 10.0, *, chunked: bool = False,
                 chunk_rows: int | None = None, watermarks: str = "message") -> None:
        self.worker = worker
        self.config = worker.config
        self.check_interval = check_interval
        state = worker.writer.state
        self.known: set[str] = set()
        unfinished: dict[str, dict[str, Any]] = {}   # table -> its newest chunked/chunk record, chunks, rows
        for record in state.snapshots:
            self.known.update(record.get("tables", {}))
            table = record.get("table")
            if record.get("kind") == "chunked":
                unfinished[table] = {"record": record, "chunks": 0, "rows": 0}
            elif record.get("kind") == "chunk" and table in unfinished:
                was = unfinished[table]
                unfinished[table] = {"record": record, "chunks": was["chunks"] + 1,
                                     "rows": was["rows"] + int(record["tables"][table])}
                if record.get("done"):
                    del unfinished[table]
            if table:
                self.known.add(table)
        self.known.update(state.files)          # tables with staged rows (a snapshot, or older changes)
        self.count = len(state.snapshots)
        self._last_check = time.monotonic()
        self.requests = Path(self.config.out) / REQUESTS_DIR
        self.chunked = ChunkedSnapshots(worker, chunk_rows or DEFAULT_CHUNK_ROWS,
                                        transport=watermarks) if chunked else None
        if unfinished and chunked:
            log.info(json.dumps({"event": "snapshot_resumed", "tables": sorted(unfinished)}))
            self._start_chunked(sorted(unfinished), reason="resumed", resume=unfinished)
        elif unfinished:
            log.warning(json.dumps({"event": "snapshot_not_resumed", "tables": sorted(unfinished),
                                    "reason": "chunked snapshots need pgoutput with logical messages "
                                              "(PostgreSQL 14 or later), or pglogical / spock with the "
                                              "watermark table"}))

    @property
    def busy(self) -> bool:
        """A chunked snapshot is queued or under way."""
        return self.chunked is not None and self.chunked.busy

    def close(self) -> None:
        if self.chunked is not None:
            self.chunked.close()

    # ------------------------------------------------------------------ triggers
    def order(self, events: list[Any]) -> list[Any]:
        """The drained events, with watermark rows in commit order among the other tables' rows (table
        transport); unchanged otherwise."""
        if self.chunked is None or self.chunked.transport != "table":
            return events
        return order_around_watermarks(events)

    def before(self, event: Any) -> bool:
        """Called with every event before the writer adds it: a table seen for the first time gets its snapshot
        (read first, or started in chunks). Returns whether the writer gets the event (watermarks: no)."""
        if isinstance(event, ChangeBatch):
            names = [event.relation.qualified_name]
            if names[0] == WATERMARK_TABLE:             # watermarks: this worker's or another's, never staged
                return self.chunked.before(event) if self.chunked is not None else False
        elif isinstance(event, Truncate):
            names = [r.qualified_name for r in event.relations]
        else:
            names = []
        new = [n for n in names if n not in self.known]
        if new:
            self.snapshot(new, reason="new relation in the stream")
        if self.chunked is not None:
            return self.chunked.before(event)
        return True

    def poll(self) -> None:
        """Requests left by `spockwire snapshot --table`, and every `check_interval` seconds the publication's
        tables."""
        try:
            names = sorted(n for n in os.listdir(self.requests) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            names = []
        if self.chunked is not None:
            self.chunked.poll()
        running = self.chunked.tables() if self.chunked is not None else set()
        for name in names:
            path = self.requests / name
            try:
                wanted = json.loads(path.read_text()).get("tables", [])
            except (OSError, ValueError):
                wanted = []
            new = [t for t in wanted if t not in self.known]
            for t in wanted:
                if t in self.known and t not in running:
                    log.info(json.dumps({"event": "snapshot_skipped", "table": t,
                                         "reason": "the table already has a snapshot or staged rows"}))
            if new:
                self.snapshot(new, reason="requested")
                running = self.chunked.tables() if self.chunked is not None else set()
            if not running.intersection(wanted):     # acted on: read whole, or every chunk of it staged
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
        """Start chunked snapshots of the tables of `names` that have a key (when the stream carries watermarks);
        read the others under a fresh exported snapshot and publish their rows in one staging commit."""
        if self.chunked is not None:
            names = self._start_chunked(names, reason=reason)
            if not names:
                return
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
            commit_ts = snapshot_time(cfg.dsn, exported.name, ck)
            counts = stage_snapshot_tables(writer, cfg.dsn, exported, chosen, commit_ts, workers=cfg.snapshot_workers,
                                           types=cfg.types, progress=progress, connect_kwargs=ck)
            # the log's LSN stays where the stream's staging has it: the snapshot rows lie ahead of it
            entry = writer.commit(writer.committed_lsn,
                                  snapshot=snapshot_record("incremental", exported, commit_ts, counts))
        if entry is not None:
            worker.metrics.record_commit(entry)
        self.known.update(names)
        log.info(json.dumps({"event": "snapshot_done", "kind": "incremental", "tables": counts,
                             "consistent_point": exported.consistent_point_text,
                             "commit": entry["commit"] if entry else None}))

    def _start_chunked(self, names: list[str], *, reason: str,
                       resume: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Queue chunked snapshots of the tables of `names` with a key; returns the other names."""
        import psycopg2

        from ..connection.session import pinned_kwargs

        cfg = self.config
        ck = cfg.extra.get("connect_kwargs")
        if self.chunked.unavailable() is not None:
            return names                               # read whole, with the stream paused (logged once)
        try:
            tables = {t.name: t for t in replicated_tables(cfg.dsn, cfg.plugin, publication=cfg.publication,
                                                           replication_sets=cfg.replication_sets,
                                                           connect_kwargs=ck)}
            conn = psycopg2.connect(cfg.dsn, **pinned_kwargs(cfg.dsn, dict(ck or {})))
        except (SnapshotError, psycopg2.Error) as exc:
            log.warning("cannot list the replicated tables: %s", exc)
            return names
        rest: list[str] = []
        try:
            with conn.cursor() as cur:
                for name in names:
                    table = tables.get(name)
                    if table is None:
                        if resume:
                            log.warning(json.dumps({"event": "snapshot_skipped", "table": name,
                                                    "reason": "no longer replicated"}))
                        else:
                            rest.append(name)      # the whole-table path reports it
                        continue
                    keys = key_columns(cur, table.relation.relid)
                    if not keys or not {k for k, _ in keys} <= set(table.column_names):
                        rest.append(name)
                        continue
                    if resume and name in resume:
                        self._resume(table, keys, resume[name])
                        continue
                    bound = _largest_key(cur, table, keys)
                    writer = self.worker.writer
                    # recorded first: after a crash the table resumes, also when some of its changes are staged
                    entry = writer.commit(writer.committed_lsn, snapshot={
                        "kind": "chunked", "table": name, "tables": {}, "reason": reason,
                        "consistent_point": writer.committed_lsn, "key_columns": [k for k, _ in keys],
                        "bound": bound, "chunk_rows": self.chunked.chunk_rows})
                    if entry is not None:
                        self.worker.metrics.record_commit(entry)
                    self.known.add(name)
                    self.chunked.start(table, keys, bound)
        finally:
            conn.close()
        return rest

    def _resume(self, table: Any, keys: list[tuple[str, str]], was: dict[str, Any]) -> None:
        """Queue a table whose chunked snapshot a stopped worker left unfinished, at the chunk after its last
        staged one. The keys it would have read again (changes leaving a TOAST value unchanged) are the last
        chunk record's plus those of the table's rows staged after that record."""
        record = was["record"]
        self.chunked.start(table, keys, record.get("bound"), last_key=record.get("last_key"),
                           ranges_done=bool(record.get("ranges_done")), refetch=record.get("refetch"),
                           chunks=was["chunks"], rows=was["rows"])
        names = [k for k, _ in keys]
        later: list[tuple] = []
        for entry in self.worker.writer.state.entries:
            if entry["commit"] <= record["commit"]:
                continue
            for f in entry.get("files", ()):
                if f["table"] != table.name:
                    continue
                import pyarrow.parquet as pq

                data = pq.read_table(Path(self.config.out) / f["path"], columns=names + ["_unchanged_toast"])
                toast = data.column("_unchanged_toast").to_pylist()
                cols = [data.column(n).to_pylist() for n in names]
                later += [k for k, t in zip(zip(*cols), toast) if t]
        if later:
            self.chunked.add_refetch(table.name, later)


def _largest_key(cur: Any, table: Any, keys: list[tuple[str, str]]) -> list[str] | None:
    """The table's largest key now (as text), the bound of its range chunks; None when it has no row."""
    cur.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = %s", (table.relation.relid,))
    only = "" if cur.fetchone()[0] == "p" else "ONLY "
    cur.execute("SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (table.relation.relid,))
    qualified = cur.fetchone()[0]
    # named apart from the key columns: ORDER BY a bare name would sort the text output columns
    texts = ", ".join(f'"{k.replace(chr(34), chr(34) * 2)}"::text AS _spockwire_k{i}' for i, (k, _) in enumerate(keys))
    desc = ", ".join('"' + k.replace('"', '""') + '" DESC' for k, _ in keys)
    cur.execute(f"SELECT {texts} FROM {only}{qualified} {'WHERE ' + table.where if table.where else ''} "
                f"ORDER BY {desc} LIMIT 1")
    row = cur.fetchone()
    return None if row is None else list(row)
