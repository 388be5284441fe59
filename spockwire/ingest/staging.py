"""The Parquet staging layout: a folder of per-table Parquet files plus an append-only commit log.

This module is the writer (`StagingWriter`) and the one import point of the staging API: the log, its entries
and `StagingState` are in staging_log.py, the readers (`read_staging`, `read_messages`, `list_tables`) in
staging_read.py, the source record in source.py, the stored form of intervals in stored_types.py, the Parquet
choices and the files of a commit other than its part files in staging_files.py.

`StagingWriter` buffers drained decoder events per table and schema version; `commit(committed_lsn)` writes the
files, makes them durable, then appends the log entry that publishes them. A writer given a `source` records it
in every log entry and refuses a folder whose recorded source differs. The full description is docs/staging.md.
"""
from __future__ import annotations

import collections
import datetime as _dt
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model import ChangeBatch, LogicalMessage, Relation, Truncate
from .source import StagingSource
from .staging_log import (FORMAT_VERSION, LOCK_FILE, LOG_DIR, MESSAGES_DIR, MESSAGES_SCHEMA, META_DIR, PathLike,
                          SchemaVersion, StagedFile, StagingError, StagingState, _ensure_dir, _fsync_dir, _key_le,
                          _Lock, _log_dir, _max_key, _why, _write_durable, format_lsn, log_name, part_name, read_log,
                          table_folder_name)
from .staging_read import list_tables, read_messages, read_staging
from .staging_files import (_batch_bounds, _drop_staged, _file_metadata, _Group, _iso, _messages_table,
                            _schema_version_of, _Sealed, _SnapshotFile, dictionary_columns, statistics_columns)
from .stored_types import _needs_store, store_batch
from ..wire.views import to_plain

__all__ = [
    "FORMAT_VERSION", "StagingError", "StagedFile", "SchemaVersion", "StagingState", "StagingWriter",
    "read_log", "read_staging", "read_messages", "list_tables", "table_folder_name", "MESSAGES_SCHEMA",
    "StagingSource", "LOCK_FILE", "META_DIR", "format_lsn",
]

DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_BYTES = 128 << 20
DEFAULT_MAX_AGE = 10.0
COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")


# ---------------------------------------------------------------------------------------------------- the writer

#: staging commits `commit_async` has being written at once: the newer one's files are encoded, written and
#: fsynced while the older one finishes; its log entry waits for the older one's (the log has no gaps)
MAX_COMMITS_IN_FLIGHT = 2

#: one table schema version's rows in one staging commit are written as several part files, encoded side by side,
#: once there are at least twice this many (each file then holds at least this many rows): pyarrow's Parquet
#: writer encodes a file on one thread, about 4M rows/s here against the decoder's 8M
PART_MIN_ROWS = 65_536
#: part files of one commit encoded at once (per writer); pyarrow releases the GIL while it encodes
ENCODE_THREADS = max(1, min(os.cpu_count() or 1, 4))

#: batches averaging fewer rows than this are combined into one chunk before they are encoded
_COMBINE_MAX_MEAN_ROWS = 1024


def _row_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of the part files `rows` (at least 1) rows are written as: up to `parts` of at least
    PART_MIN_ROWS."""
    count = max(1, min(parts, rows // PART_MIN_ROWS))
    step = -(-rows // count)
    return [(offset, min(step, rows - offset)) for offset in range(0, rows, step)]


class StagingWriter:
    """Buffers decoded events per table and schema version and commits them to the staging layout.

        with StagingWriter(out, protocol="pgoutput") as w:
            w.add_all(decoder.drain())            # everything drained so far ...
            if w.should_flush():
                w.commit(decoder.committed_lsn)   # ... before reading committed_lsn

    Opening takes the folder's writer lock, reads the log and removes crash leftovers (see `StagingState.open`).
    Events already staged are dropped on `add`: rows and truncates with `_commit_lsn` below the resume LSN or at
    or below their table's high-water mark (`_commit_lsn`, `_seq`); messages likewise (docs/staging.md, "dedup").

    Flush policy: `should_flush()` is true once `max_rows` buffered rows, `max_bytes` buffered bytes (Arrow
    buffers + message contents) or `max_age` seconds since the oldest buffered event is reached. The writer never
    commits on its own: the caller decides, because only it knows the LSN that covers what it added.
    """

    def __init__(self, out_dir: PathLike, protocol: str, *, compression: str = "zstd",
                 max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age: float = DEFAULT_MAX_AGE, source: StagingSource | None = None) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        if max_rows < 1 or max_bytes < 1 or max_age < 0:
            raise ValueError("max_rows and max_bytes must be positive and max_age not negative")
        self.out_dir = Path(out_dir)
        self.protocol = protocol
        self.source = source
        #: the server timeline the positions being committed were read on (recorded in each log entry)
        self.timeline: int | None = None
        self.compression = compression
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age = max_age
        try:
            if not self.out_dir.is_dir():
                self.out_dir.mkdir(parents=True, exist_ok=True)
                _fsync_dir(self.out_dir.resolve().parent)
            _ensure_dir(self.out_dir, LOG_DIR)
        except OSError as exc:
            raise StagingError(f"cannot create the staging folder {self.out_dir}: {_why(exc)}") from exc
        self._lock: _Lock | None = _Lock.acquire(self.out_dir)
        try:
            self.state = StagingState._open_locked(self.out_dir)
            if self.state.protocol is not None and self.state.protocol != protocol:
                raise StagingError(f"staging folder {self.out_dir} holds a {self.state.protocol} stream; "
                                   f"refusing to add {protocol} changes to it")
            recorded = self.state.source
            if source is not None and recorded is not None and recorded != source:
                raise StagingError(f"staging folder {self.out_dir} holds changes from {recorded.describe()}; "
                                   f"refusing to add changes from {source.describe()}")
        except BaseException:
            self._lock.release()
            self._lock = None
            raise
        self.resume_lsn = self.state.committed_lsn
        self._current: dict[str, SchemaVersion] = {t: v[-1] for t, v in self.state.schemas.items() if v}
        self._next_version: dict[str, int] = {t: max(s.schema_version for s in v)
                                              for t, v in self.state.schemas.items() if v}
        self._hwm: dict[str, tuple[int, int]] = dict(self.state.high_water)
        self._msg_hwm = self.state.message_high_water
        self._nontx_hwm = self.state.nontransactional_high_water
        self._version_cache: dict[str, tuple[Relation, pa.Schema, SchemaVersion]] = {}
        # staging commits handed to the background writers (`commit_async`), oldest first: at most
        # MAX_COMMITS_IN_FLIGHT Futures of their log entries
        self._executor: Any = None
        self._encoders: Any = None      # the threads that encode one commit's part files side by side
        self._inflight: collections.deque[Any] = collections.deque()
        self._failed: BaseException | None = None
        #: log entries of `commit_async` commits that became durable, for the caller to take (and clear)
        self.completed: list[dict[str, Any]] = []
        self._sealed_commit = self.state.commit
        self._sealed_lsn = self.state.committed_lsn
        self.skipped_rows = 0
        self.skipped_truncates = 0
        self.skipped_messages = 0
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._groups: dict[tuple[str, int], _Group] = {}
        self._truncates: list[dict[str, Any]] = []
        self._messages: list[LogicalMessage] = []
        self._new_versions: list[SchemaVersion] = []
        self._pending_files: list[dict[str, Any]] = []   # snapshot files written, published by the next commit
        self._rows = 0
        self._bytes = 0
        self._oldest: float | None = None

    # ------------------------------------------------------------------ properties
    @property
    def committed_lsn(self) -> int:
        """The LSN of the newest log entry: safe to acknowledge."""
        return self.state.committed_lsn

    @property
    def newest_lsn(self) -> int:
        """The highest position this writer holds anything at: the log's LSN, the commit being written, and the
        `_commit_lsn` of every row, truncate and message staged or buffered (a commit inside a large drain
        stages rows ahead of the log's LSN)."""
        keys = [k for k in (*self._hwm.values(), self._msg_hwm) if k is not None]
        return max([self.state.committed_lsn, self._sealed_lsn, self._nontx_hwm or 0, *(k[0] for k in keys)])

    @property
    def buffered_rows(self) -> int:
        return self._rows

    @property
    def buffered_bytes(self) -> int:
        """Memory held by buffered events (Arrow buffer sizes plus message contents)."""
        return self._bytes

    @property
    def buffered_events(self) -> int:
        return sum(len(g.batches) for g in self._groups.values()) + len(self._truncates) + len(self._messages)

    def buffered_age(self, now: float | None = None) -> float:
        """Seconds since the oldest buffered event was added (0 when nothing is buffered)."""
        if self._oldest is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self._oldest)

    def flush_reason(self, now: float | None = None) -> str | None:
        """"rows", "bytes" or "age" when a limit is reached, else None."""
        if self._rows >= self.max_rows:
            return "rows"
        if self._bytes >= self.max_bytes:
            return "bytes"
        if self._oldest is not None and self.buffered_age(now) >= self.max_age:
            return "age"
        return None

    def should_flush(self, now: float | None = None) -> bool:
        """True when the flush policy says: commit now. `now` is a `time.monotonic()` value (for tests)."""
        return self.flush_reason(now) is not None

    # ------------------------------------------------------------------ adding
    def _touch(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()

    def _version_for(self, relation: Relation, schema: pa.Schema) -> SchemaVersion:
        table = relation.qualified_name
        candidate = _schema_version_of(relation, schema, 0)
        current = self._current.get(table)
        if current is not None and current.identity == candidate.identity:
            return current
        number = self._next_version.get(table, 0) + 1
        self._next_version[table] = number
        sv = _schema_version_of(relation, schema, number)
        self._current[table] = sv
        self._new_versions.append(sv)
        return sv

    def add(self, event: Any) -> int:
        """Buffer one drained event; returns the rows (or events) kept after dropping already-staged ones."""
        self._check_open()
        if isinstance(event, ChangeBatch):
            return self._add_batch(event)
        if isinstance(event, Truncate):
            return self._add_truncate(event)
        if isinstance(event, LogicalMessage):
            return self._add_message(event)
        raise TypeError(f"StagingWriter.add takes ChangeBatch, Truncate or LogicalMessage, not {type(event).__name__}")

    def add_all(self, events: Iterable[Any]) -> int:
        return sum(self.add(e) for e in events)

    def _add_batch(self, batch: ChangeBatch) -> int:
        # the per-batch work stays small (a batch can be a few rows): bounds, dedup check, version lookup; the
        # change counts, the stored form of intervals and the file metadata are done once per file at commit.
        # A decoder with strings="view": staged as string / binary like any other (and the batch's copy no longer
        # keeps the decoder's input buffers alive while it waits for the commit)
        rb, _views = to_plain(batch.to_arrow())
        n = rb.num_rows
        if n == 0:
            return 0
        table = batch.relation.qualified_name
        bounds = _batch_bounds(rb)
        hwm = self._hwm.get(table)
        if bounds[0][0] >= self.resume_lsn and (hwm is None or bounds[0] > hwm):
            kept = rb
        else:
            kept = _drop_staged(rb, self.resume_lsn, hwm)
            self.skipped_rows += n - kept.num_rows
            if kept.num_rows == 0:
                return 0
            bounds = _batch_bounds(kept)
        sv = self._cached_version(batch.relation, kept.schema)
        group = self._groups.get((table, sv.schema_version))
        if group is None:
            group = self._groups[(table, sv.schema_version)] = _Group(sv)
        self._hwm[table] = _max_key(hwm, bounds[1])
        group.batches.append(kept)
        rows = kept.num_rows
        group.rows += rows
        size = kept.get_total_buffer_size()       # `nbytes` walks the buffers: ~80 us on a 14-column batch
        group.nbytes += size
        self._rows += rows
        self._bytes += size
        if self._oldest is None:
            self._oldest = time.monotonic()
        return rows

    def _cached_version(self, relation: Relation, schema: pa.Schema) -> SchemaVersion:
        """`_version_for`, skipped while the same relation object comes with an equal Arrow schema."""
        table = relation.qualified_name
        cached = self._version_cache.get(table)
        if (cached is not None and cached[0] is relation and cached[2] is self._current.get(table)
                and cached[1].equals(schema)):
            return cached[2]
        sv = self._version_for(relation, schema)
        self._version_cache[table] = (relation, schema, sv)
        return sv

    def _add_truncate(self, t: Truncate) -> int:
        tables = [r.qualified_name for r in t.relations]
        key = (t.commit_lsn, t.seq)
        if t.commit_lsn < self.resume_lsn or (tables and all(_key_le(key, self._hwm.get(n)) for n in tables)):
            self.skipped_truncates += 1
            return 0
        for n in tables:
            self._hwm[n] = _max_key(self._hwm.get(n), key)
        self._truncates.append({
            "tables": tables, "relids": [r.relid for r in t.relations], "cascade": bool(t.cascade),
            "restart_identity": bool(t.restart_identity), "commit_lsn": t.commit_lsn,
            "commit_ts": _iso(t.commit_ts), "seq": t.seq, "xid": t.xid, "origin": t.origin,
        })
        self._bytes += 256
        self._touch()
        return 1

    def _add_message(self, m: LogicalMessage) -> int:
        if m.transactional and m.commit_lsn is not None:
            key = (m.commit_lsn, m.seq or 0)
            if m.commit_lsn < self.resume_lsn or _key_le(key, self._msg_hwm):
                self.skipped_messages += 1
                return 0
            self._msg_hwm = _max_key(self._msg_hwm, key)
        else:
            if m.lsn < self.resume_lsn or (self._nontx_hwm is not None and m.lsn <= self._nontx_hwm):
                self.skipped_messages += 1
                return 0
            self._nontx_hwm = m.lsn
        self._messages.append(m)
        self._bytes += len(m.content) + len(m.prefix) + 64
        self._touch()
        return 1

    # ------------------------------------------------------------------ snapshot files
    def stage_snapshot_table(self, relation: Relation, batches: Iterable[pa.RecordBatch]) -> int:
        """Write the snapshot rows of one table (change batches, as `spockwire.snapshot.initial.snapshot_rows`
        makes them) into Parquet, a row group at a time, so memory stays bounded whatever the table's size: one
        file per schema version (a column the reader had to turn to text mid-table starts a new version, as in
        the stream). The files are durable on return but not data yet: the next `commit` names them in its log
        entry (docs/staging.md, "Snapshot rows"); a crash before that leaves files the next writer removes.
        Returns the rows written (0: no file)."""
        self._check_open()
        self.wait()
        table = relation.qualified_name
        if any(t == table for t, _ in self._groups) or any(f["table"] == table for f in self._pending_files):
            raise StagingError(f"{table}: snapshot rows must be staged before any other change of the table in "
                               "the same commit, and once")
        number = self.state.commit + 1
        current: _SnapshotFile | None = None
        written: list[_SnapshotFile] = []
        rows = 0
        try:
            for rb in batches:
                if rb.num_rows == 0:
                    continue
                sv = self._version_for(relation, rb.schema)
                if current is None or current.sv is not sv:
                    if current is not None:
                        current.finish()
                    lo, _ = _batch_bounds(rb)
                    folder = _ensure_dir(self.out_dir, f"{table_folder_name(sv.namespace, sv.name)}/"
                                                       f"v{sv.schema_version}")
                    current = _SnapshotFile(sv, folder, lo[0], number, self.compression)
                    written.append(current)
                current.write(rb)
                rows += rb.num_rows
            if current is not None:
                current.finish()
            for f in written:
                f.publish()
        except BaseException as exc:
            close = getattr(batches, "close", None)
            if close is not None:             # a generator (a prefetching reader): end it and its connections now
                close()
            for f in written:
                f.discard()
            if isinstance(exc, OSError):
                raise StagingError(f"writing the snapshot of {table} to {self.out_dir} failed: {_why(exc)}") from exc
            raise
        for f in written:
            self._pending_files.append({
                "path": f.final.relative_to(self.out_dir).as_posix(), "table": table, "relid": f.sv.relid,
                "schema_version": f.sv.schema_version, "first_commit_lsn": f.first[0], "last_commit_lsn": f.last[0],
                "first_seq": f.first[1], "last_seq": f.last[1], "rows": f.rows, "bytes": f.final.stat().st_size,
                "change_counts": {"insert": f.rows},
            })
            self._hwm[table] = _max_key(self._hwm.get(table), f.last)
        return rows

    # ------------------------------------------------------------------ committing
    def _encode_parquet(self, table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=self.compression if self.compression != "none" else None,
                       use_dictionary=dictionary_columns(table),
                       write_statistics=statistics_columns(table.schema))
        return sink.getvalue()

    def _put(self, rel_dir: str, name: str, data: pa.Buffer, created: list[Path], dirs: set[Path]) -> None:
        folder = _ensure_dir(self.out_dir, rel_dir)
        tmp = folder / f".{name}.tmp"
        final = folder / name
        created.append(tmp)
        _write_durable(tmp, data)
        os.replace(tmp, final)
        created.append(final)
        dirs.add(folder)

    @property
    def sealed_lsn(self) -> int:
        """The LSN the newest staging commit records once written: `committed_lsn`, or the LSN of the commit
        `commit_async` handed to the background writer (not durable yet: never acknowledge it)."""
        return self._sealed_lsn

    @property
    def sealed_commit(self) -> int:
        """The number of the newest staging commit, once written (see `sealed_lsn`)."""
        return self._sealed_commit

    @property
    def busy(self) -> bool:
        """True while a commit handed to `commit_async` is being written (or written and not yet collected)."""
        return bool(self._inflight)

    def _seal(self, committed_lsn: int, snapshot: dict[str, Any] | None) -> _Sealed | None:
        """What the next commit writes: the buffered events (taken as they are), its number and LSN."""
        lsn = int(committed_lsn)
        if lsn < 0:
            raise ValueError(f"committed_lsn must not be negative, got {lsn}")
        previous = self._sealed_lsn
        new_lsn = max(lsn, previous)
        if (not self._groups and not self._truncates and not self._messages and not self._pending_files
                and snapshot is None and new_lsn == previous):
            return None
        sealed = _Sealed(self._sealed_commit + 1, previous, new_lsn, list(self._groups.values()),
                         list(self._truncates), list(self._messages), list(self._new_versions),
                         list(self._pending_files), snapshot)
        sealed.timeline = self.timeline
        return sealed

    def commit(self, committed_lsn: int, *, snapshot: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Write everything buffered, make it durable, then append the log entry that publishes it.

        `committed_lsn` is the decoder's `committed_lsn` read after the events were added; the entry records the
        larger of it and the previous entry's. Returns the log entry (a dict, as written), or None when there was
        nothing to write and the LSN did not move. On failure raises StagingError and commits nothing.
        `snapshot` (a JSON object) is recorded as the entry's "snapshot": the entry publishes snapshot rows.
        A commit still being written by `commit_async` is finished first.
        """
        self._check_open()
        self.wait()
        sealed = self._seal(committed_lsn, snapshot)
        if sealed is None:
            return None
        entry = self._write_sealed(sealed)       # on failure the buffer is kept: the commit can be retried
        self._sealed_commit, self._sealed_lsn = sealed.number, sealed.new_lsn
        self._reset_buffer()
        self._apply_entry(entry)
        return entry

    def commit_async(self, committed_lsn: int) -> bool:
        """Hand everything buffered to a background thread that writes it as the next staging commit, exactly as
        `commit` does, and return at once: the caller goes on adding events while the files are encoded,
        compressed, written and fsynced (pyarrow and fsync release the GIL). At most `MAX_COMMITS_IN_FLIGHT`
        commits are in flight, on as many threads: with that many, this waits for the oldest first
        (back-pressure). A newer commit's files are written beside the older one's; its log entry only after the
        older one's. The commit is durable -- and `committed_lsn` moves to it -- only once `poll()` or `wait()`
        collected its entry (in `completed`); until then only the previous `committed_lsn` may be acknowledged.
        A failure is raised by the next `poll`, `wait`, `commit` or `commit_async` (the same StagingError
        `commit` raises); the events of the failed commit and of any newer one in flight are not kept (their files
        are removed), and the writer refuses further commits. Returns False when there was nothing to commit."""
        self._check_open()
        self._raise_failed()
        while len(self._inflight) >= MAX_COMMITS_IN_FLIGHT:
            self._collect_oldest()
        sealed = self._seal(committed_lsn, None)
        if sealed is None:
            return False
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=MAX_COMMITS_IN_FLIGHT,
                                                thread_name_prefix="spockwire-staging")
        self._sealed_commit, self._sealed_lsn = sealed.number, sealed.new_lsn
        self._reset_buffer()
        before = self._inflight[-1] if self._inflight else None
        self._inflight.append(self._executor.submit(self._write_sealed, sealed, before))
        return True

    def poll(self) -> dict[str, Any] | None:
        """Collect the commits `commit_async` started that are durable, oldest first, without waiting; the newest
        one's log entry (None if none was)."""
        entry = None
        while self._inflight and self._inflight[0].done():
            entry = self._collect_oldest()
        self._raise_failed()
        return entry

    def wait(self) -> dict[str, Any] | None:
        """Wait for every commit `commit_async` started; returns the newest log entry (None if none was in
        flight)."""
        self._raise_failed()
        entry = None
        while self._inflight:
            entry = self._collect_oldest()
        return entry

    def _collect_oldest(self) -> dict[str, Any]:
        try:
            entry = self._inflight[0].result()
        except BaseException as exc:
            # the newer commits in flight fail too (each waits for the one before it) and remove their files
            for later in list(self._inflight)[1:]:
                try:
                    later.result()
                except BaseException:  # noqa: BLE001 - reported as this failure
                    pass
            self._inflight.clear()
            self._failed = exc
            raise
        self._inflight.popleft()
        self._apply_entry(entry)
        self.completed.append(entry)
        return entry

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise StagingError(f"an earlier staging commit to {self.out_dir} failed ({self._failed}); nothing "
                               f"after commit {self.state.commit} (committed_lsn "
                               f"{format_lsn(self.state.committed_lsn)}) was committed") from self._failed

    def _apply_entry(self, entry: dict[str, Any]) -> None:
        self.state._apply(entry)
        snapshot = entry.get("snapshot")
        if snapshot is not None:
            for table in snapshot.get("tables", {}):
                self._hwm[table] = _max_key(self._hwm.get(table), self.state.high_water[table])

    def _group_table(self, g: _Group) -> tuple[pa.Table, bool]:
        """The buffered batches of one schema version as one table in the stored form, and whether its chunks are
        to be combined before they are encoded."""
        first = g.batches[0]
        if any(_needs_store(f.type) for f in first.schema):
            batches = [store_batch(b) for b in g.batches]
        else:
            batches = g.batches
        # small batches as one chunk: encoding thousands of small chunks costs the Parquet writer about twice as
        # much (measured on 500,000 rows in batches of ~40-80 rows: 0.74 s chunked, 0.21 s to combine + 0.19 s to
        # encode). Large batches (a huge transaction's) are encoded as they are: combining would hold a second copy
        # of the file's data while it is written.
        table = pa.Table.from_batches(batches).replace_schema_metadata(_file_metadata(g.schema))
        return table, g.rows < _COMBINE_MAX_MEAN_ROWS * len(batches)

    def _write_parts(self, table: pa.Table, combine: bool, sv: SchemaVersion, number: int, created: list[Path],
                     dirs: set[Path]) -> list[dict[str, Any]]:
        """One table schema version's rows of commit `number` as part files (several, encoded side by side, when
        there are many rows; see PART_MIN_ROWS), each combined into one chunk first with `combine` and with its own
        choice of dictionary columns; their log entry records, in row order."""
        rel_dir = f"{table_folder_name(sv.namespace, sv.name)}/v{sv.schema_version}"
        ranges = _row_ranges(table.num_rows, ENCODE_THREADS)

        def write(offset: int, length: int, part: int | None) -> dict[str, Any]:
            piece = table if part is None else table.slice(offset, length)
            if combine:
                piece = piece.combine_chunks()
            lsns, seqs = piece.column("_commit_lsn"), piece.column("_seq")
            first, last = (lsns[0].as_py(), seqs[0].as_py()), (lsns[-1].as_py(), seqs[-1].as_py())
            counts = {item["values"]: item["counts"]
                      for item in pc.value_counts(piece.column("_change_type")).to_pylist()}
            data = self._encode_parquet(piece)
            name = part_name(first[0], last[0], number, part)
            self._put(rel_dir, name, data, created, dirs)
            return {"path": f"{rel_dir}/{name}", "table": sv.table, "relid": sv.relid,
                    "schema_version": sv.schema_version, "first_commit_lsn": first[0], "last_commit_lsn": last[0],
                    "first_seq": first[1], "last_seq": last[1], "rows": piece.num_rows, "bytes": data.size,
                    "change_counts": counts}

        if len(ranges) == 1:
            return [write(0, table.num_rows, None)]
        _ensure_dir(self.out_dir, rel_dir)
        if self._encoders is None:
            self._encoders = ThreadPoolExecutor(max_workers=ENCODE_THREADS, thread_name_prefix="spockwire-encode")
        futures = [self._encoders.submit(write, offset, length, part)
                   for part, (offset, length) in enumerate(ranges, 1)]
        wait(futures)     # all of them end before a failure is raised: the undo then finds every file
        return [f.result() for f in futures]

    def _write_sealed(self, sealed: _Sealed, before: Any = None) -> dict[str, Any]:
        """Write one sealed commit: the files, durably, then -- once the commit `before` (a Future, the previous
        commit in flight) has its log entry -- the log entry (the commit point). Changes nothing in the writer's
        memory, so it can run on a background thread; on failure (its own, or `before`'s) removes what it
        wrote."""
        number, previous, new_lsn = sealed.number, sealed.previous, sealed.new_lsn
        created: list[Path] = []
        dirs: set[Path] = set()
        log_final: Path | None = None
        step = "writing the Parquet files"
        try:
            files = list(sealed.pending_files)
            for g in sealed.groups:
                table, combine = self._group_table(g)
                files += self._write_parts(table, combine, g.schema, number, created, dirs)
                del table
            messages = []
            if sealed.messages:
                ms = sealed.messages
                positions = [m.commit_lsn if m.commit_lsn is not None else m.lsn for m in ms]
                tx = [(m.commit_lsn, m.seq or 0) for m in ms if m.transactional and m.commit_lsn is not None]
                ntx = [m.lsn for m in ms if not (m.transactional and m.commit_lsn is not None)]
                data = self._encode_parquet(_messages_table(ms))
                name = part_name(min(positions), max(positions), number)
                self._put(MESSAGES_DIR, name, data, created, dirs)
                messages.append({
                    "path": f"{MESSAGES_DIR}/{name}", "rows": len(ms), "bytes": data.size,
                    "first_lsn": min(m.lsn for m in ms), "last_lsn": max(m.lsn for m in ms),
                    "last_commit_lsn": max(tx)[0] if tx else None, "last_seq": max(tx)[1] if tx else None,
                    "last_nontransactional_lsn": max(ntx) if ntx else None,
                })
            step = "syncing the folders"
            for folder in sorted(dirs):
                _fsync_dir(folder)
            if before is not None:
                step = f"waiting for commit {number - 1}"
                before.result()   # its log entry first: the log has no gaps
            entry = {
                "format": FORMAT_VERSION, "commit": number, "committed_lsn": new_lsn,
                "committed_lsn_text": format_lsn(new_lsn), "previous_committed_lsn": previous,
                "protocol": self.protocol, "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                **({"source": self.source.to_json()} if self.source is not None else {}),
                "files": files, "truncates": sealed.truncates, "messages": messages,
                "relations": [sv.to_json() for sv in sealed.new_versions],
                **({"snapshot": sealed.snapshot} if sealed.snapshot is not None else {}),
                **({"timeline": sealed.timeline} if sealed.timeline is not None else {}),
            }
            step = "writing the log entry"
            raw = (json.dumps(entry, indent=1, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
            log_dir = _log_dir(self.out_dir)
            tmp = log_dir / f".{log_name(number)}.tmp"
            created.append(tmp)
            _write_durable(tmp, raw)
            log_final = log_dir / log_name(number)
            os.replace(tmp, log_final)
            step = "syncing the log folder"
            _fsync_dir(log_dir)
        except Exception as exc:
            self._undo(created, log_final)
            if isinstance(exc, StagingError):
                raise
            raise StagingError(
                f"staging commit {number} to {self.out_dir} failed while {step}: {_why(exc)}; nothing was "
                f"committed (the log still ends at commit {number - 1}, committed_lsn "
                f"{format_lsn(previous)})") from exc
        return entry

    def _undo(self, created: list[Path], log_final: Path | None) -> None:
        """Best effort: take back a failed commit (the log entry first, then its files)."""
        if log_final is not None:
            try:
                log_final.unlink()
                _fsync_dir(log_final.parent)
            except OSError:
                pass
        for path in reversed(created):
            try:
                path.unlink()
            except OSError:
                pass

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._lock is None:
            raise StagingError(f"StagingWriter for {self.out_dir} is closed")

    @property
    def closed(self) -> bool:
        return self._lock is None

    def close(self) -> None:
        """Release the folder. Buffered, uncommitted events are dropped (they were never acknowledged). A commit
        `commit_async` started is finished first (its failure is not raised here: it was never acknowledged)."""
        if self._lock is not None:
            try:
                if self._inflight:
                    try:
                        self.wait()
                    except BaseException:  # noqa: BLE001 - not committed, not acknowledged; the files are gone
                        pass
                for pool in (self._executor, self._encoders):
                    if pool is not None:
                        pool.shutdown(wait=True)
                self._executor = self._encoders = None
            finally:
                self._lock.release()
                self._lock = None
                self._reset_buffer()

    def __enter__(self) -> "StagingWriter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._lock is None else "open"
        return (f"<StagingWriter {state} {self.out_dir} commit={self.state.commit} "
                f"committed_lsn={format_lsn(self.state.committed_lsn)} buffered_rows={self._rows}>")
