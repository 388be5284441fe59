"""Reading a Delta target's files while the micro-batch that will need them is still being decoded.

A micro-batch spanning much WAL touches keys in most files of a table of moderate size, and `read_keys` then reads
those files whole. The pipeline job (job.py) starts that read in a background thread as the batch begins, so that
it runs beside the batch's Spark job (whose tasks mostly wait on the server's decoding) instead of after it. How
much WAL a batch spans is in the query's checkpoint: Spark writes the batch's end offset there before it runs it.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Sequence

import pyarrow as pa

from ..connection.slots import parse_lsn
from .delta_rewrite import FILE_COLUMN, file_sizes, rewritable
from .delta_target import open_delta

__all__ = ["ReadAhead", "ReadAheadPolicy", "batch_wal_bytes", "READ_AHEAD_MAX_BYTES", "READ_AHEAD_WAL_BYTES"]

#: a read-ahead reads a table only up to this many bytes of data files (its rows are held through the batch)
READ_AHEAD_MAX_BYTES = 256 << 20


class ReadAhead:
    """A Delta table's data files read whole in a background thread, each row with its file, while a micro-batch
    that will touch most of them is still being decoded (the pipeline job starts one for a batch spanning much
    WAL). `read_keys` uses the rows when the table is still at the version read and the batch's candidate files are
    the files read; otherwise it reads as usual and this read was only wasted work. Tables that are not rewritable
    or larger than READ_AHEAD_MAX_BYTES are not read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._got: tuple[int, list[str], pa.Table] | None = None
        self.used: bool | None = None        #: whether read_keys used the rows (None: not asked)
        self._thread = threading.Thread(target=self._read, name="spockwire-read-ahead", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            dt = open_delta(self.path)
            if dt is None or not rewritable(dt):
                return
            sizes = file_sizes(dt)
            if sum(sizes.values()) > READ_AHEAD_MAX_BYTES:
                return
            ds = dt.to_pyarrow_dataset()
            if not set(ds.files) <= set(sizes):
                return
            self._got = (dt.version(), list(ds.files), ds.to_table(columns=ds.schema.names + [FILE_COLUMN]))
        except Exception:  # noqa: BLE001 - an optimisation only: read_keys reads the files itself then
            self._got = None

    def rows_for(self, dt: Any, files: Sequence[str]) -> pa.Table | None:
        """The rows read, each with its file (an index into `files`), if `dt` is still at the version read and
        `files` are the files read, in that order; None otherwise. The rows are handed over once."""
        self._thread.join()
        got, self._got = self._got, None
        self.used = got is not None and got[0] == dt.version() and got[1] == list(files)
        return got[2] if self.used else None


#: a micro-batch spanning at least this much WAL starts read-aheads of its targets (about 100,000 changes of a
#: narrow table)
READ_AHEAD_WAL_BYTES = 16 << 20
#: after a read-ahead the batch could not use (its keys were in some files only, or the table changed), the next
#: this many large batches of that target read as usual
SKIP_AFTER_MISS = 8


def batch_wal_bytes(checkpoint: str, batch_id: int) -> int | None:
    """The WAL a streaming micro-batch of the ``spockwire`` source spans: its end offset less the one before, from
    the query's checkpoint (``offsets/<batch id>``). None for a snapshot batch, the first batch, a batch after a
    snapshot not yet taken, or a checkpoint that is not a local folder."""
    if "://" in checkpoint or batch_id < 1:
        return None
    ends = []
    for b in (batch_id - 1, batch_id):
        try:
            with open(os.path.join(checkpoint, "offsets", str(b)), encoding="utf-8") as fh:
                offset = json.loads(fh.read().rstrip("\n").rsplit("\n", 1)[-1])
        except (OSError, ValueError):
            return None
        if not isinstance(offset, dict) or "lsn" not in offset:
            return None
        ends.append((parse_lsn(offset["lsn"]), "snapshot" in offset))
    (start, _), (end, snapshot) = ends
    # a stream's first batch after its snapshot starts where the snapshot's slot was created (its offset's LSN)
    if snapshot or start == 0:
        return None
    return end - start


class ReadAheadPolicy:
    """Which targets of a micro-batch to read ahead: all of them when the batch spans READ_AHEAD_WAL_BYTES or more,
    except a target whose last read-ahead went unused (for its next SKIP_AFTER_MISS large batches)."""

    def __init__(self, checkpoint: str, wal_bytes: int = READ_AHEAD_WAL_BYTES) -> None:
        self.checkpoint = checkpoint
        self.wal_bytes = wal_bytes
        self._skip: dict[str, int] = {}

    def start(self, batch_id: int, paths: Sequence[str]) -> dict[str, ReadAhead]:
        span = batch_wal_bytes(self.checkpoint, batch_id)
        if span is None or span < self.wal_bytes:
            return {}
        started = {}
        for path in paths:
            if self._skip.get(path, 0) > 0:
                self._skip[path] -= 1
            else:
                started[path] = ReadAhead(path)
        return started

    def finished(self, started: dict[str, ReadAhead]) -> None:
        """After the batch: targets whose read-ahead went unused skip the next large batches."""
        for path, ahead in started.items():
            if not ahead.used:
                self._skip[path] = SKIP_AFTER_MISS
