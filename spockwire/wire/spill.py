"""Spilling the rows of large open transactions to disk.

A transaction's rows are only released at its commit. Rows of an open transaction that are no longer being
appended to (closed batches) stay in memory until then — unless the transaction holds more than the decoder's
`spill_bytes`: then its closed batches are written to a temporary Arrow IPC file and come back, one batch at a
time, only when the consumer asks for them (`ChangeBatch.to_arrow()` after `drain()`). The file is removed when
the last batch that refers to it is gone; on POSIX systems it has no name (it lives as long as its open
descriptor), so a killed process leaves nothing behind. Both decoder implementations use this module, so spilling
never changes what comes out, only where it waits.
"""
from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..export.arrow import CHANGE_COLUMNS
from ..model import ChangeBatch, Relation
from .views import from_plain, to_plain

__all__ = ["SpillFile", "SpilledRows", "SpilledChangeBatch", "DEFAULT_SPILL_BYTES", "MAX_BATCH_BYTES",
           "batch_bytes_limit", "row_bytes_estimate"]

#: a transaction's closed batches kept in memory at most (bytes, estimated) before they go to disk
DEFAULT_SPILL_BYTES = 256 << 20
#: value bytes in one batch at most, whatever the spill limit (batch_bytes_limit): per value, the larger of its wire
#: bytes and the bytes it adds to a variable-length column (binary numeric decoded to text can expand ten thousand
#: fold). A message whose values would take a column past Arrow's 32-bit offsets (OFFSET_LIMIT) with the rows
#: already in the batch starts a new one.
MAX_BATCH_BYTES = 1 << 30


def batch_bytes_limit(spill_bytes: int) -> int:
    """The size at which a builder is sealed: a quarter of `spill_bytes` (at least 1 MiB, at most MAX_BATCH_BYTES).

    Only sealed rows of an open transaction count towards `spill_bytes` and go to disk, so a builder that grew
    without this limit would hold a large transaction's rows in memory past the spill limit, and each spilled
    batch would come back from disk whole: both would be up to `batch_rows` rows, hundreds of MB for wide rows."""
    return min(MAX_BATCH_BYTES, max(spill_bytes // 4, 1 << 20))

_SUBXID = "_subxid"
_MARKS = "_marks_"     # + column index: which values of an untyped binary column did not arrive as text
_TS_TYPE = pa.timestamp("us", tz="UTC")


def row_bytes_estimate(value_bytes: int, total_rows: int, rows: int) -> int:
    """Memory of `rows` rows of a builder holding `value_bytes` value bytes in `total_rows` rows."""
    if total_rows <= 0:
        return 0
    return value_bytes * rows // total_rows + 48 * rows


class SpillFile:
    """One transaction's spill file: Arrow IPC streams written one after another, read back by offset."""

    def __init__(self, directory: str | None) -> None:
        # POSIX: a file without a name (O_TMPFILE where the file system has it, else unlinked at once), kept only by
        # the open descriptor, so its space is freed however the process ends (kill -9 included)
        self._file = tempfile.TemporaryFile(mode="w+b", prefix="spockwire-spill-", suffix=".arrows", dir=directory)
        self._lock = threading.Lock()

    def append(self, batch: pa.RecordBatch) -> tuple[int, int]:
        with self._lock:
            self._file.seek(0, os.SEEK_END)
            offset = self._file.tell()
            with pa.ipc.new_stream(self._file, batch.schema) as writer:
                writer.write_batch(batch)
            self._file.flush()
            return offset, self._file.tell() - offset

    def read(self, offset: int, length: int) -> pa.RecordBatch:
        with self._lock:
            self._file.seek(offset)
            data = self._file.read(length)
        return pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class SpilledRows:
    """One closed batch of an open transaction, on disk: where it is, how many rows each subtransaction has, and
    for its untyped binary columns which values did not arrive as text (`raw_marks`, column index -> one bool a
    row): without the rows of aborted subtransactions such a column may be text after all."""

    __slots__ = ("spill", "offset", "length", "relation", "num_rows", "subxid_counts", "marked_columns",
                 "view_columns")

    def __init__(self, spill: SpillFile, batch: pa.RecordBatch, subxids: list[int], relation: Relation,
                 raw_marks: dict[int, list[bool]] | None = None) -> None:
        counts: dict[int, int] = {}
        for s in subxids:
            counts[s] = counts.get(s, 0) + 1
        # view columns (strings="view") are written as string / binary: IPC would write every input buffer they
        # point into whole; they are views again when read back
        batch, self.view_columns = to_plain(batch)
        stored = batch.append_column(_SUBXID, pa.array(subxids, pa.uint32()))
        self.marked_columns = sorted(raw_marks or ())
        for c in self.marked_columns:
            stored = stored.append_column(f"{_MARKS}{c}", pa.array(raw_marks[c], pa.bool_()))
        self.offset, self.length = spill.append(stored)
        self.spill = spill
        self.relation = relation
        self.num_rows = batch.num_rows
        self.subxid_counts = counts

    def rows_after(self, aborted: set[int] | frozenset[int]) -> int:
        return self.num_rows - sum(n for s, n in self.subxid_counts.items() if s in aborted)


class SpilledChangeBatch(ChangeBatch):
    """A committed batch whose rows wait on disk until `to_arrow()` reads them (once; not cached)."""

    __slots__ = ("_spilled", "_aborted", "_commit_lsn", "_commit_ts_us", "_num_rows", "_renumber")

    def __init__(self, spilled: SpilledRows, aborted: set[int], commit_lsn: int | None,
                 commit_ts_unix_us: int | None, renumber: Any = None) -> None:
        self._renumber = renumber
        super().__init__(spilled.relation, None)
        self._spilled = spilled
        self._aborted = frozenset(aborted)
        self._commit_lsn = commit_lsn
        self._commit_ts_us = commit_ts_unix_us
        self._num_rows = spilled.rows_after(self._aborted)

    @property
    def num_rows(self) -> int:
        return self._num_rows

    def __len__(self) -> int:
        return self._num_rows

    def to_arrow(self) -> pa.RecordBatch:
        s = self._spilled
        batch = s.spill.read(s.offset, s.length)
        if self._aborted:
            keep = pc.invert(pc.is_in(batch.column(_SUBXID), value_set=pa.array(sorted(self._aborted), pa.uint32())))
            batch = batch.filter(keep)
            for c in s.marked_columns:
                # as in memory: an untyped column is binary only when one of the kept values was not text
                if not pc.any(batch.column(f"{_MARKS}{c}")).as_py():
                    pos = len(CHANGE_COLUMNS) + c     # the table's columns follow the change columns
                    batch = batch.set_column(pos, batch.schema.field(pos).with_type(pa.string()),
                                             batch.column(pos).cast(pa.string()))
        batch = batch.drop_columns([_SUBXID, *(f"{_MARKS}{c}" for c in s.marked_columns)])
        batch = from_plain(batch, s.view_columns)
        if self._renumber:
            batch = self._renumber.batch(batch)
        n = batch.num_rows
        if self._commit_lsn is not None:
            batch = batch.set_column(1, batch.schema.field(1), pa.repeat(pa.scalar(self._commit_lsn, pa.uint64()), n))
            batch = batch.set_column(2, batch.schema.field(2),
                                     pa.repeat(pa.scalar(self._commit_ts_us, pa.int64()), n).view(_TS_TYPE))
        return batch


def spill_item(spill: SpillFile | None, directory: str | None, batch: ChangeBatch | None, subxids: list[int],
               relation: Relation, raw_marks: dict[int, list[bool]] | None = None
               ) -> tuple[SpillFile, SpilledRows | None]:
    """Write one closed batch of an open transaction to its spill file (created on first use)."""
    if spill is None:
        spill = SpillFile(directory)
    if batch is None or batch.num_rows == 0:
        return spill, None
    return spill, SpilledRows(spill, batch.to_arrow(), subxids, relation, raw_marks)


def released_batch(item: SpilledRows, aborted: set[int], commit_lsn: int | None,
                   commit_ts_unix_us: int | None, renumber: Any = None) -> Any:
    """The event for a spilled batch at commit, or None when every row belonged to aborted subtransactions."""
    batch = SpilledChangeBatch(item, aborted, commit_lsn, commit_ts_unix_us, renumber)
    return batch if batch.num_rows else None
