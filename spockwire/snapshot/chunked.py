"""Chunked snapshots of a table that joins a running stream, deduplicated against it with watermarks (DBLog).

The stream keeps being consumed while the table is read. The table is read in key order, one chunk at a time
(``WHERE key > last AND key <= upper``, composite keys by row comparison; `upper` is the chunk's last key, found
with ``ORDER BY key OFFSET n-1 LIMIT 1`` in the same snapshot), each chunk on an ordinary SQL connection of a
background thread, between two watermarks written into the WAL:

1. low watermark: ``pg_logical_emit_message(true, 'spockwire.watermark', '<window>:low')`` (its own transaction,
   whose commit flushes the WAL);
2. ``BEGIN REPEATABLE READ``; the snapshot S (``pg_current_snapshot()``), the chunk's rows under S; ``COMMIT``;
3. high watermark: the same with ``'<window>:high'``.

The stream delivers both watermarks as logical decoding messages, in commit order with the changes. pglogical and
spock forward no logical messages: with them a watermark is a row of ``public.spockwire_watermark`` (WATERMARK_TABLE,
one row per slot, upserted in its own transaction), which the worker creates and adds to the stream's replication
set; the stream delivers its change in commit order like any other, and the worker takes it as the watermark and
drops it (it is never staged, and no snapshot reads that table). In the stream
every change of the table between the window's low and high watermark removes its keys (new and old) from the
chunk: such a change may or may not be visible to S, and its own row (or its absence) is the newer state. A change
delivered before the low watermark by a transaction S does not see yet (its commit record was written before the
low watermark, but its backend had not left the proc array when S was taken) is treated the same way: the worker
keeps the keys of the table's changes per transaction until a chunk's snapshot shows the transaction as visible.
At the high watermark the chunk's remaining rows are staged as snapshot rows at the high watermark's position
(`_commit_lsn` = the commit LSN of its transaction, `_seq` from -2^63, `_xid` null), in one staging commit with
every change delivered before it and a "snapshot" record (kind "chunk", the chunk's last key); then the next chunk
starts. Changes before the high watermark sort before the chunk's rows, later ones after.

The range chunks stop at the table's largest key when its snapshot started (rows with larger keys exist only
through changes the stream delivers after that). A change that leaves a TOAST value unchanged is applied onto the
row its key had, which may not be staged yet while the range chunks run: such keys are read again, after the last
range chunk, by refetch chunks (``WHERE key IN (...)``, same watermarks). A truncate of the table in a window redoes
the window (new watermarks, same bounds).

After a crash the worker resumes at the chunk after the last staged one (the log's snapshot records); a window
that was open is read again with new watermarks. The staged changes of the table before a key's chunk (changes of
keys not read yet) are kept: apply them as upserts (an update or insert sets the row, a delete removes it if it is
there); the chunk's row at its later position then sets the key to the state the source had (docs/snapshot.md).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..model import ChangeBatch, LogicalMessage, Truncate
from .initial import WATERMARK_TABLE, SnapshotProgress, SnapshotTable, snapshot_batch
from .reader import iter_table_batches

__all__ = ["WATERMARK_PREFIX", "WATERMARK_TABLE", "ChunkedSnapshots", "key_columns", "DEFAULT_CHUNK_ROWS",
           "ensure_watermark_table", "order_around_watermarks"]

log = logging.getLogger("spockwire.snapshot")

#: prefix of the watermark messages; the worker consumes them, they are never staged
WATERMARK_PREFIX = "spockwire.watermark"
#: rows of a chunk (`--snapshot-chunk-rows`)
DEFAULT_CHUNK_ROWS = 10_000

_KEY_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
  FROM pg_class c
  JOIN pg_index i ON i.indrelid = c.oid
   AND ((c.relreplident = 'i' AND i.indisreplident) OR (c.relreplident IN ('d', 'f') AND i.indisprimary))
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey::int2[])
 WHERE c.oid = %s
 ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def key_columns(cur: Any, relid: int) -> list[tuple[str, str]]:
    """The columns (name, SQL type) a table's chunks are ordered by: the replica identity index, for REPLICA
    IDENTITY DEFAULT or FULL the primary key. Empty: the table has no such key (no chunked snapshot)."""
    cur.execute(_KEY_COLUMNS, (relid,))
    return [(r[0], r[1]) for r in cur.fetchall()]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _row_keys(rb: pa.RecordBatch, names: list[str]) -> list[tuple]:
    cols = [rb.column(rb.schema.get_field_index(n)).to_pylist() for n in names]
    return [tuple(_freeze(v) for v in row) for row in zip(*cols)]


def _snapshot_xids(text: str) -> tuple[int, set[int]]:
    """xmax and the in-progress xids of a ``pg_current_snapshot()`` text, as 32-bit xids (the stream's)."""
    _xmin, xmax, xip = text.split(":")
    return int(xmax) & 0xFFFFFFFF, {int(x) & 0xFFFFFFFF for x in xip.split(",") if x}


def _invisible(xid: int, xmax: int, xip: set[int]) -> bool:
    """Whether a transaction that committed (the stream delivered it) is not visible to the snapshot."""
    return xid in xip or ((xid - xmax) & 0xFFFFFFFF) < 0x80000000


def _literal(value: Any) -> str:
    """A key value from the stream as PostgreSQL input text for its type (read back with ``'text'::type``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    return str(value)


@dataclass
class _Mark:
    """A watermark as the stream delivered it: a logical message's content, or the `mark` of a watermark row."""

    content: str
    commit_lsn: int | None
    lsn: int
    commit_ts: Any


def ensure_watermark_table(cur: Any, protocol: str, replication_set: str) -> None:
    """Create WATERMARK_TABLE if missing and add it to `replication_set` (pglogical or spock) if it is not there."""
    schema = "pglogical" if protocol == "pglogical" else "spock"
    add = "pglogical.replication_set_add_table" if protocol == "pglogical" else "spock.repset_add_table"
    cur.execute(f"CREATE TABLE IF NOT EXISTS {WATERMARK_TABLE} (slot text PRIMARY KEY, mark text NOT NULL)")
    cur.execute(f"SELECT slot, mark FROM {WATERMARK_TABLE} LIMIT 0")     # an older table of that name: refused
    cur.execute(f"SELECT 1 FROM {schema}.replication_set_table t JOIN {schema}.replication_set s "
                f"ON s.set_id = t.set_id JOIN {schema}.local_node l ON l.node_id = s.set_nodeid "
                f"WHERE s.set_name = %s AND t.set_reloid = %s::regclass", (replication_set, WATERMARK_TABLE))
    if cur.fetchone() is None:
        cur.execute(f"SELECT {add}(%s, %s::regclass, false)", (replication_set, WATERMARK_TABLE))


@dataclass
class _Window:
    """One chunk: read by the thread, deduplicated by the worker against the stream. A range chunk reads the keys
    after `lower` up to the table's bound; a refetch chunk reads the keys `refetch` (literals)."""

    id: str
    lower: list[str] | None
    refetch: list[tuple[str, ...]] | None = None
    opened: bool = False                     # the low watermark arrived
    touched: set = field(default_factory=set)          # keys changed between the watermarks
    truncated: bool = False
    result: Any = None                        # set by the thread before it writes the high watermark
    failed_at: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Seen:
    """The table's changes of one transaction delivered before the current window's low watermark."""

    keys: set = field(default_factory=set)
    truncated: bool = False


@dataclass
class _Job:
    table: SnapshotTable
    keys: list[tuple[str, str]]
    bound: list[str] | None                   # the largest key when the snapshot started (None: empty table)
    last_key: list[str] | None = None         # the last range chunk's last key
    ranges_done: bool = False
    refetch: dict = field(default_factory=dict)    # literal key tuple -> None (an ordered set)
    chunks: int = 0
    rows: int = 0
    window: _Window | None = None
    redone: int = 0
    failures: int = 0
    seen: dict[int, _Seen] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.table.name


def order_around_watermarks(events: list[Any]) -> list[Any]:
    """Drained events with the rows of every watermark row's transaction in their commit order.

    A decoder drains one batch per relation for the transactions of a read, so a batch of another table can hold
    rows committed both before and after a watermark row that comes in a later batch. Between two events that are
    not change batches (truncates and messages keep their places), every batch is cut at the commit LSNs of the
    watermark rows and the pieces are put in commit order: each watermark after the rows that committed before
    it and before those that committed after it."""
    marks = sorted({int(v) for e in events if isinstance(e, ChangeBatch)
                    and e.relation.qualified_name == WATERMARK_TABLE
                    for v in e.to_arrow().column("_commit_lsn").to_pylist()})
    if not marks:
        return events
    out: list[Any] = []
    segment: list[ChangeBatch] = []

    def flush() -> None:
        pieces = []
        for order, e in enumerate(segment):
            rb = e.to_arrow()
            lsn = rb.column("_commit_lsn")
            is_mark = e.relation.qualified_name == WATERMARK_TABLE
            start = 0
            for i, w in enumerate(marks + [None]):
                stop = rb.num_rows if w is None else int(pc.sum(pc.less_equal(lsn, w)).as_py() or 0)
                if stop > start:
                    pieces.append((i, is_mark, order, ChangeBatch(e.relation, rb.slice(start, stop - start))))
                    start = stop
        pieces.sort(key=lambda p: (p[0], p[1], p[2]))
        out.extend(p[3] for p in pieces)
        segment.clear()

    for e in events:
        if isinstance(e, ChangeBatch):
            segment.append(e)
        else:
            flush()
            out.append(e)
    flush()
    return out


class ChunkedSnapshots:
    """The worker's chunked snapshots: one table at a time, one chunk (window) at a time.

    `before(event)` sees every stream event before the writer does and returns whether the writer gets it;
    `start(...)` queues a table; `busy` is true while a table is queued or being read."""

    def __init__(self, worker: Any, chunk_rows: int = DEFAULT_CHUNK_ROWS, *, transport: str = "message") -> None:
        if int(chunk_rows) < 1:
            raise ValueError(f"snapshot chunk rows must be at least 1, got {chunk_rows}")
        if transport not in ("message", "table"):
            raise ValueError(f"watermark transport must be 'message' or 'table', got {transport!r}")
        self.transport = transport
        self._unavailable: str | None = None
        self._prepared = transport == "message"
        self.worker = worker
        self.config = worker.config
        self.chunk_rows = int(chunk_rows)
        self.queue: list[_Job] = []
        self.job: _Job | None = None
        self.run_id = uuid.uuid4().hex[:12]
        self.windows = 0
        self.progress: SnapshotProgress | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._catalog: Any = None

    # ------------------------------------------------------------------ bookkeeping
    @property
    def busy(self) -> bool:
        return self.job is not None or bool(self.queue)

    def tables(self) -> set[str]:
        """Tables queued or being read."""
        return {j.name for j in self._jobs()}

    def _jobs(self) -> list[_Job]:
        return ([self.job] if self.job is not None else []) + self.queue

    def start(self, table: SnapshotTable, keys: list[tuple[str, str]], bound: list[str] | None, *,
              last_key: list[str] | None = None, ranges_done: bool = False,
              refetch: list[list[str]] | None = None, chunks: int = 0, rows: int = 0) -> None:
        """Queue `table` (key columns `keys`, largest key `bound` when its snapshot started); a resumed table
        continues after `last_key` (or with its refetch chunks when `ranges_done`)."""
        job = _Job(table, keys, bound, last_key, ranges_done, {tuple(k): None for k in refetch or ()},
                   chunks=chunks, rows=rows)
        self.queue.append(job)
        if self.progress is None or self.job is None:
            self.progress = SnapshotProgress()
            self.worker.metrics.snapshot = self.progress
        self.progress.tables_total += 1
        self.progress.estimated_rows += max(table.estimated_rows, 0)
        self._next()

    def add_refetch(self, name: str, keys: list[tuple]) -> None:
        """Keys of a queued or running table whose staged rows may lack a TOAST value (see `_changes`)."""
        for job in self._jobs():
            if job.name == name:
                for key in keys:
                    job.refetch[tuple(_literal(v) for v in key)] = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    def unavailable(self) -> str | None:
        """Why watermarks cannot be written (then tables are read whole, with the stream paused), or None. With the
        table transport, the first call creates WATERMARK_TABLE and adds it to the replication set."""
        if self._prepared or self._unavailable is not None:
            return self._unavailable
        import psycopg2

        from ..connection.options import plugin_protocol, split_names
        from ..connection.session import pinned_connect

        cfg = self.config
        sets = list(split_names(cfg.replication_sets)) or ["default"]
        try:
            conn = pinned_connect(cfg.dsn, **dict(cfg.extra.get("connect_kwargs") or {}))
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    ensure_watermark_table(cur, plugin_protocol(cfg.plugin), sets[0])
            finally:
                conn.close()
        except psycopg2.Error as exc:
            self._unavailable = (f"the watermark table {WATERMARK_TABLE} cannot be created or added to replication "
                                 f"set {sets[0]}: {str(exc).strip()}")
            log.warning(json.dumps({"event": "snapshot_watermarks_unavailable", "reason": self._unavailable}))
            return self._unavailable
        self._prepared = True
        return None

    # ------------------------------------------------------------------ the stream side
    def before(self, event: Any) -> bool:
        if isinstance(event, ChangeBatch) and event.relation.qualified_name == WATERMARK_TABLE:
            if self.transport == "table":
                self._watermark_rows(event.to_arrow())
            return False
        if isinstance(event, LogicalMessage):
            if event.prefix == WATERMARK_PREFIX:
                self._watermark(event)
                return False
            return bool(self.config.messages)
        if isinstance(event, ChangeBatch):
            name = event.relation.qualified_name
            for job in self._jobs():
                if job.name == name:
                    self._changes(job, event.to_arrow())
        elif isinstance(event, Truncate):
            names = {r.qualified_name for r in event.relations}
            for job in self._jobs():
                if job.name in names:
                    w = job.window
                    if w is not None and w.opened:
                        w.truncated = True
                    else:
                        job.seen.setdefault(int(event.xid or 0), _Seen()).truncated = True
        return True

    def _changes(self, job: _Job, rb: pa.RecordBatch) -> None:
        """Track a change batch of a table being snapshotted.

        Its keys: in an open window they leave the chunk; before the window they are kept per transaction (a
        transaction the chunk's snapshot does not see yet has them leave the chunk too). A row that leaves a TOAST
        value unchanged is applied onto the row its key had; until every key's chunk is staged that row may not
        be staged yet, so the key is read again by a refetch chunk at the end (during the refetch chunks: only
        when its old key is itself waiting to be read again)."""
        names = [k for k, _ in job.keys]
        keys = _row_keys(rb, names)
        toast = rb.column(rb.schema.get_field_index("_unchanged_toast"))
        has_toast = pc.fill_null(pc.greater(pc.list_value_length(toast), 0), False).to_pylist()
        if any(has_toast):
            kinds = rb.column(rb.schema.get_field_index("_change_type")).to_pylist()
            old: tuple | None = None
            for key, kind, t in zip(keys, kinds, has_toast):
                if kind == "update_preimage":
                    old = key
                    continue
                if t:
                    literal = tuple(_literal(v) for v in key)
                    source = tuple(_literal(v) for v in (old if old is not None else key))
                    window = job.window
                    if (not job.ranges_done or source in job.refetch
                            or (window is not None and window.refetch is not None and source in window.refetch)):
                        job.refetch[literal] = None
                old = None
        w = job.window
        if w is not None and w.opened:
            w.touched.update(keys)
            return
        xids = rb.column(rb.schema.get_field_index("_xid")).to_pylist()
        for key, xid in zip(keys, xids):
            if xid is None:
                continue
            seen = job.seen.get(xid)
            if seen is None:
                seen = job.seen[xid] = _Seen()
            seen.keys.add(key)

    def _watermark_rows(self, rb: pa.RecordBatch) -> None:
        """The watermark rows this worker wrote (its slot's row), in stream order; other workers' are ignored."""
        if "slot" not in rb.schema.names or "mark" not in rb.schema.names:
            return
        cols = [rb.column(rb.schema.get_field_index(n)).to_pylist()
                for n in ("_change_type", "_commit_lsn", "_commit_ts", "slot", "mark")]
        for kind, lsn, ts, slot, mark in zip(*cols):
            if kind not in ("insert", "update", "update_postimage") or mark is None:
                continue
            if isinstance(slot, bytes):
                slot = slot.decode(errors="replace")
            if slot != self.config.slot:
                continue
            self._watermark(_Mark(mark.decode(errors="replace") if isinstance(mark, bytes) else mark, lsn, lsn, ts))

    def _watermark(self, m: Any) -> None:
        try:
            content = m.content if isinstance(m.content, str) else bytes(m.content).decode()
        except UnicodeDecodeError:
            return
        window_id, _, kind = content.rpartition(":")
        job = self.job
        w = job.window if job is not None else None
        if w is None or window_id != w.id:
            return                                    # an earlier run's or a redone window's watermark
        if kind == "low":
            w.opened = True
        elif kind == "high":
            w.ready.wait()                            # set before the thread wrote the high watermark
            if w.opened or isinstance(w.result, BaseException):
                self._finish_window(job, w, m)

    def poll(self) -> None:
        """A window whose reading failed without a high watermark reaching the stream is read again."""
        job = self.job
        w = job.window if job is not None else None
        if (w is not None and w.ready.is_set() and isinstance(w.result, BaseException)
                and time.monotonic() - w.failed_at > 10.0):
            job.window = None
            self._failed(job, w.result)

    def _failed(self, job: _Job, exc: BaseException) -> None:
        job.failures += 1
        log.warning(json.dumps({"event": "snapshot_chunk_failed", "table": job.name, "chunk": job.chunks,
                                "error": str(exc).strip(), "attempt": job.failures}))
        if job.failures < 5:
            self._read_next(job)
            return
        # given up for this run: the log has no finished record, so the next start resumes the table
        log.warning(json.dumps({"event": "snapshot_abandoned", "table": job.name, "chunks": job.chunks}))
        self.job = None
        self._next()

    def _finish_window(self, job: _Job, w: _Window, high: Any) -> None:
        result = w.result
        job.window = None
        if isinstance(result, BaseException):
            self._failed(job, result)
            return
        job.failures = 0
        batches, snapshot_text, upper = result
        xmax, xip = _snapshot_xids(snapshot_text)
        removed = set(w.touched)
        truncated = w.truncated
        for xid in list(job.seen):
            seen = job.seen[xid]
            if _invisible(xid, xmax, xip):
                removed |= seen.keys
                truncated = truncated or seen.truncated
            else:
                del job.seen[xid]                     # visible to this and every later chunk's snapshot
        names = [k for k, _ in job.keys]
        if truncated:
            job.redone += 1
            log.info(json.dumps({"event": "snapshot_chunk_redone", "table": job.name, "chunk": job.chunks,
                                 "reason": "a truncate of the table"}))
            self._read_next(job)
            return
        relation = job.table.relation
        position = int(high.commit_lsn if high.commit_lsn is not None else high.lsn)
        ts = high.commit_ts or _dt.datetime.now(_dt.timezone.utc)
        writer = self.worker.writer
        row = 0
        read = sum(b.num_rows for b in batches)
        for values in batches:
            if removed and values.num_rows:
                keep = pa.array([k not in removed for k in _row_keys(values, names)], pa.bool_())
                values = values.filter(keep)
            if values.num_rows == 0:
                continue
            writer.add(ChangeBatch(relation, snapshot_batch(relation, values, row, position, ts)))
            row += values.num_rows
        kind = "range"
        if w.refetch is not None:
            kind = "refetch"
            # read again: every key of the window, except those a change took out of it (their rows are the
            # stream's, which may again lack a TOAST value: they stay for the next refetch chunk)
            again = {tuple(_literal(v) for v in k) for k in removed}
            for key in w.refetch:
                if key not in again:
                    job.refetch.pop(key, None)
        elif upper is None:
            job.ranges_done = True
        else:
            job.last_key = upper
        done = job.ranges_done and not job.refetch
        job.chunks += 1
        job.rows += row
        meta = {"kind": "chunk", "table": job.name, "tables": {job.name: row}, "chunk": job.chunks - 1,
                "chunk_kind": kind, "consistent_point": position, "consistent_point_text": _lsn_text(position),
                "snapshot_ts": ts.isoformat(), "key_columns": names, "bound": job.bound, "last_key": job.last_key,
                "ranges_done": job.ranges_done, "refetch": [list(k) for k in job.refetch], "done": done,
                "rows_read": read, "rows_changed_in_stream": read - row}
        entry = writer.commit(writer.committed_lsn, snapshot=meta)
        if entry is not None:
            self.worker.metrics.record_commit(entry)
        if self.progress is not None:
            self.progress.rows += row
        if done:
            log.info(json.dumps({"event": "snapshot_done", "kind": "chunked", "table": job.name,
                                 "chunks": job.chunks, "rows": job.rows, "redone": job.redone}))
            if self.progress is not None:
                self.progress.tables_done += 1
            self.job = None
            self._next()
        else:
            self._read_next(job)

    # ------------------------------------------------------------------ the reading side
    def _next(self) -> None:
        if self.job is not None or not self.queue:
            return
        self.job = self.queue.pop(0)
        if self.progress is not None:
            self.progress.current = self.job.name
        log.info(json.dumps({"event": "snapshot_start", "kind": "chunked", "table": self.job.name,
                             "key": [k for k, _ in self.job.keys], "chunk_rows": self.chunk_rows,
                             "bound": self.job.bound, "resume_after": self.job.last_key,
                             "refetch": len(self.job.refetch)}))
        self._read_next(self.job)

    def _read_next(self, job: _Job) -> None:
        if self._thread is not None:
            self._thread.join()
        self.windows += 1
        refetch = None
        if job.ranges_done or job.bound is None:
            job.ranges_done = True
            refetch = list(job.refetch)[:self.chunk_rows]
        w = job.window = _Window(f"{self.run_id}.{self.windows}", job.last_key, refetch)
        self._thread = threading.Thread(target=self._read, args=(job, w), name="spockwire-chunk", daemon=True)
        self._thread.start()

    def _read(self, job: _Job, w: _Window) -> None:
        try:
            self._read_chunk(job, w)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker with the high watermark
            if w.ready.is_set():
                return                                    # read and handed over; only the high watermark failed
            w.failed_at = time.monotonic()
            w.result = exc
            if not self._stop.is_set():
                try:
                    self._emit(f"{w.id}:high")            # the worker learns of the failure in stream order
                except Exception:  # noqa: BLE001 - the server is gone: the stream fails as well
                    pass
        finally:
            w.ready.set()

    def _emit(self, content: str, cur: Any = None) -> None:
        from ..connection.session import pinned_connect

        if self.transport == "table":
            sql = (f"INSERT INTO {WATERMARK_TABLE} (slot, mark) VALUES (%s, %s) "
                   f"ON CONFLICT (slot) DO UPDATE SET mark = EXCLUDED.mark")
            args: tuple = (self.config.slot, content)
        else:
            sql, args = "SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, content)
        if cur is not None:
            cur.execute(sql, args)
            return
        conn = pinned_connect(self.config.dsn, **dict(self.config.extra.get("connect_kwargs") or {}))
        try:
            conn.autocommit = True
            with conn.cursor() as c:
                c.execute(sql, args)
        finally:
            conn.close()

    def _read_chunk(self, job: _Job, w: _Window) -> None:
        from ..connection.session import pinned_connect
        from ..values.catalog import PostgresTypeCatalog

        cfg = self.config
        ck = dict(cfg.extra.get("connect_kwargs") or {})
        if self._catalog is None and cfg.types != "raw":
            self._catalog = PostgresTypeCatalog(cfg.dsn, strict=False)
        conn = pinned_connect(cfg.dsn, **ck)
        try:
            conn.autocommit = True
            cur = conn.cursor()
            self._emit(f"{w.id}:low", cur)
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SELECT pg_current_snapshot()::text, pg_export_snapshot(), c.relkind, "
                        "quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                        (job.table.relation.relid,))
            found = cur.fetchone()
            if found is None:
                raise RuntimeError(f"{job.name} no longer exists")
            snapshot_text, name, relkind, qualified = found
            keys = ", ".join(_quote(k) for k, _ in job.keys)

            def row(values: Any) -> str:
                return "(" + ", ".join(cur.mogrify(f"%s::{t}", (v,)).decode()
                                       for (_, t), v in zip(job.keys, values)) + ")"

            where = [f"({job.table.where})"] if job.table.where else []
            upper = None
            if w.refetch is not None:
                if not w.refetch:
                    where.append("false")
                else:
                    where.append(f"({keys}) IN ({', '.join(row(k) for k in w.refetch)})")
            else:
                if w.lower is not None:
                    where.append(f"({keys}) > {row(w.lower)}")
                where.append(f"({keys}) <= {row(job.bound)}")
                only = "" if relkind == "p" else "ONLY "
                # named apart from the key columns: ORDER BY a bare name would sort the text output columns
                texts = ", ".join(f"{_quote(k)}::text AS _spockwire_k{i}" for i, (k, _) in enumerate(job.keys))
                cur.execute(f"SELECT {texts} FROM {only}{qualified} WHERE {' AND '.join(where)} "
                            f"ORDER BY {keys} OFFSET %s LIMIT 1", (self.chunk_rows - 1,))
                found = cur.fetchone()
                if found is not None:
                    upper = list(found)
                    where.append(f"({keys}) <= {row(upper)}")
            batches: list[pa.RecordBatch] = []
            for source in job.table.sources:
                for b in iter_table_batches(cfg.dsn, source, snapshot=name,
                                            columns=job.table.column_names, types=cfg.types,
                                            where=" AND ".join(where), type_catalog=self._catalog,
                                            connect_kwargs=ck):
                    batches.extend(b.to_batches() if isinstance(b, pa.Table) else [b])
                    if self._stop.is_set():
                        raise RuntimeError("stopped")
            cur.execute("COMMIT")
            # upper None: the last range chunk (fewer rows than a chunk were left up to the bound)
            w.result = (batches, snapshot_text, upper)
            w.ready.set()
            self._emit(f"{w.id}:high", cur)
        finally:
            conn.close()


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
