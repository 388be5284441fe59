"""The files of a staging commit, for the writer in staging.py: which columns a Parquet file dictionary-encodes and
keeps statistics of, the key-value metadata of a part file, the file of snapshot rows written as they are read, the
messages table, and the buffered and sealed forms of a commit (docs/staging.md).
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model import LogicalMessage, Relation
from .staging_log import MESSAGES_SCHEMA, SchemaVersion, _fsync_dir, _max_key, part_name
from .stored_types import store_batch

__all__ = ["dictionary_columns", "statistics_columns"]

_TS = pa.timestamp("us", tz="UTC")
_U64 = pa.uint64()


#: change columns of a few values per file: always dictionary-encoded
_DICTIONARY_ALWAYS = frozenset(("_change_type", "_origin", "_unchanged_toast"))
#: rows sampled (spread over the data) to decide whether a column gets a dictionary
_DICTIONARY_SAMPLE = 4096


def dictionary_columns(data: pa.Table | pa.RecordBatch) -> list[str]:
    """The columns to dictionary-encode: the change columns that hold a few values per file, dictionary-typed
    columns (enums), and every other non-nested column with at most one distinct value in eight among about
    `_DICTIONARY_SAMPLE` rows spread over `data`.

    A column of mostly distinct values gains nothing from a dictionary: the Parquet writer hashes values into one
    until it outgrows its page limit and then writes plain pages anyway. Measured on the ingest benchmark's
    500,000 rows (7 columns, zstd): 0.142 s and 11.6 MB with a dictionary for every column, 0.109 s and 10.7 MB
    with the columns this picks (the transaction columns, `qty`, `at`); the sample costs 4 ms.
    """
    rows = data.num_rows
    if rows == 0:
        return [f.name for f in data.schema]
    step = max(rows // _DICTIONARY_SAMPLE, 1)
    names = []
    for i, field in enumerate(data.schema):
        if field.name in _DICTIONARY_ALWAYS or pa.types.is_dictionary(field.type):
            names.append(field.name)
        elif not pa.types.is_nested(field.type):
            sample = _every_nth(data.column(i), step)
            try:
                distinct = pc.count_distinct(sample, mode="all").as_py()
            except pa.ArrowNotImplementedError:
                distinct = 0   # a type the kernel does not count: the writer's default, a dictionary
            if distinct * 8 <= len(sample):
                names.append(field.name)
    return names


def statistics_columns(schema: pa.Schema) -> list[str]:
    """The columns whose Parquet min/max statistics are written: every column but text, binary and nested ones.

    In a change file rows come in commit order, so a text or binary column's range (truncated, for long values)
    prunes nothing unless the values grow with the commits, while computing it is the dearest statistic: without
    those columns the ingest benchmark's 500,000 rows encode in 0.113 CPU s instead of 0.124-0.136. The change
    columns (`_commit_lsn`, `_seq`, `_commit_ts`, `_xid`) and numeric, temporal and decimal columns keep theirs.
    """
    return [f.name for f in schema
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_binary(f.type)
                    or pa.types.is_large_binary(f.type) or pa.types.is_fixed_size_binary(f.type)
                    or pa.types.is_binary_view(f.type) or pa.types.is_string_view(f.type)
                    or pa.types.is_nested(f.type))]


def _every_nth(column: pa.Array | pa.ChunkedArray, step: int) -> pa.ChunkedArray:
    """Rows 0, step, 2 * step, ... of `column`, taken chunk by chunk (a chunked array's own `take` joins its chunks
    into one copy of the column first)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts, offset = [], 0   # offset: the next sampled row, from the start of the current chunk
    for chunk in chunks:
        if offset < len(chunk):
            parts.append(chunk.take(pa.array(range(offset, len(chunk), step), pa.int64())))
        offset = (offset - len(chunk)) % step
    return pa.chunked_array(parts, column.type)


class _Group:
    """Buffered batches of one table schema version."""

    __slots__ = ("schema", "batches", "rows", "nbytes")

    def __init__(self, schema: SchemaVersion) -> None:
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self.nbytes = 0


def _batch_bounds(rb: pa.RecordBatch) -> tuple[tuple[int, int], tuple[int, int]]:
    """The lowest and highest (`_commit_lsn`, `_seq`) of a non-empty batch: its first and last rows, since the
    rows of a decoder batch are in (`_commit_lsn`, `_seq`) order (docs/architecture.md)."""
    lsn = rb.column(1)
    seq = rb.column(4)
    n = rb.num_rows - 1
    return (lsn[0].as_py(), seq[0].as_py()), (lsn[n].as_py(), seq[n].as_py())


def _drop_staged(rb: pa.RecordBatch, floor: int, hwm: tuple[int, int] | None) -> pa.RecordBatch:
    """Keep the rows with `_commit_lsn` >= floor and (`_commit_lsn`, `_seq`) above the high-water mark."""
    if rb.num_rows == 0:
        return rb
    (lo, lo_seq), (hi, hi_seq) = _batch_bounds(rb)
    if lo >= floor and (hwm is None or (lo, lo_seq) > hwm):
        return rb
    if hi < floor or (hwm is not None and (hi, hi_seq) <= hwm):
        return rb.slice(0, 0)
    lsn = rb.column("_commit_lsn")
    mask = pc.greater_equal(lsn, pa.scalar(floor, _U64))
    if hwm is not None:
        h_lsn = pa.scalar(hwm[0], _U64)
        above = pc.or_(pc.greater(lsn, h_lsn),
                       pc.and_(pc.equal(lsn, h_lsn), pc.greater(rb.column("_seq"), pa.scalar(hwm[1], pa.int64()))))
        mask = pc.and_(mask, above)
    return rb.filter(mask)


class _SnapshotFile:
    """One Parquet file of snapshot rows being written (as `.<name>.tmp`), then made durable and renamed."""

    def __init__(self, sv: SchemaVersion, folder: Path, lsn: int, number: int, compression: str) -> None:
        self.sv = sv
        self.tmp = folder / f".{part_name(lsn, lsn, number)}.tmp"
        self.final = folder / part_name(lsn, lsn, number)
        self.compression = None if compression == "none" else compression
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.rows = 0
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        self.done = False

    def write(self, rb: pa.RecordBatch) -> None:
        stored = store_batch(rb.replace_schema_metadata(_file_metadata(self.sv)))
        if self.writer is None:
            self.schema = stored.schema
            self.writer = pq.ParquetWriter(str(self.tmp), self.schema, compression=self.compression,
                                           use_dictionary=dictionary_columns(stored))
        elif stored.schema != self.schema:       # same version: the same Arrow types, field details may differ
            stored = pa.RecordBatch.from_arrays(stored.columns, schema=self.schema)
        self.writer.write_batch(stored)
        lo, hi = _batch_bounds(rb)
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = _max_key(self.last, hi)
        self.rows += rb.num_rows

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        fd = os.open(self.tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def publish(self) -> None:
        """Rename to the final name (still not data until a log entry names it)."""
        os.replace(self.tmp, self.final)
        _fsync_dir(self.final.parent)
        self.done = True

    def discard(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - the file is removed anyway
                pass
            self.writer = None
        for path in (self.tmp, self.final) if self.done else (self.tmp,):
            try:
                path.unlink()
            except OSError:
                pass


def _messages_table(ms: list[LogicalMessage]) -> pa.Table:
    return pa.table([
        pa.array([m.prefix for m in ms], pa.string()),
        pa.array([m.content for m in ms], pa.binary()),
        pa.array([m.transactional for m in ms], pa.bool_()),
        pa.array([m.lsn for m in ms], pa.uint64()),
        pa.array([m.xid for m in ms], pa.uint32()),
        pa.array([m.commit_lsn for m in ms], pa.uint64()),
        pa.array([m.commit_ts for m in ms], _TS),
        pa.array([m.seq for m in ms], pa.int64()),
        pa.array([m.origin for m in ms], pa.string()),
    ], schema=MESSAGES_SCHEMA)


class _Sealed:
    """One staging commit taken out of the buffer: what `_write_sealed` writes."""

    __slots__ = ("number", "previous", "new_lsn", "groups", "truncates", "messages", "new_versions",
                 "pending_files", "snapshot", "timeline")

    def __init__(self, number: int, previous: int, new_lsn: int, groups: list[_Group], truncates: list[Any],
                 messages: list[LogicalMessage], new_versions: list[SchemaVersion], pending_files: list[Any],
                 snapshot: dict[str, Any] | None) -> None:
        self.number = number
        self.previous = previous
        self.new_lsn = new_lsn
        self.groups = groups
        self.truncates = truncates
        self.messages = messages
        self.new_versions = new_versions
        self.pending_files = pending_files
        self.snapshot = snapshot
        self.timeline: int | None = None


def _schema_version_of(relation: Relation, schema: pa.Schema, version: int) -> SchemaVersion:
    n_change = len(schema) - len(relation.columns)
    cols = tuple((c.name, c.type_oid, c.type_modifier, bool(c.is_key), str(schema.field(n_change + i).type))
                 for i, c in enumerate(relation.columns))
    return SchemaVersion(relation.qualified_name, relation.namespace, relation.name, relation.relid, version,
                         relation.replica_identity, cols)


def _file_metadata(sv: SchemaVersion) -> dict[bytes, bytes]:
    return {
        b"spockwire.table": sv.table.encode("utf-8", "surrogateescape"),
        b"spockwire.relid": str(sv.relid).encode(),
        b"spockwire.schema_version": str(sv.schema_version).encode(),
    }


def _iso(ts: _dt.datetime | None) -> str | None:
    return None if ts is None else ts.isoformat()
