"""Renumbering `_seq` after subtransaction aborts in streamed transactions.

`_seq` numbers a transaction's changes in order as they are decoded. A streamed transaction receives the changes
of a subtransaction that is later rolled back and numbers them too; a non-streamed delivery of the same
transaction never sees them. So that (`_commit_lsn`, `_seq`) is the same however the server delivers a
transaction — the deduplication key of every sink — the numbers of dropped changes are removed at commit: each kept
change moves down by the count of dropped changes numbered before it, leaving 0..n-1.

Decoders record, per subtransaction, the runs of numbers its changes took (a run closes when the next change
belongs to another subtransaction); that costs nothing per row.
"""
from __future__ import annotations

import bisect
from typing import Iterable

import numpy as np
import pyarrow as pa

__all__ = ["SeqRenumber"]


class SeqRenumber:
    """Maps an original `_seq` to its number once the given (start, stop) runs are removed."""

    def __init__(self, removed_runs: Iterable[tuple[int, int]]) -> None:
        runs = sorted((int(a), int(b)) for a, b in removed_runs if b > a)
        self.starts = [a for a, _ in runs]
        self.before: list[int] = []       # numbers removed before each run
        total = 0
        for a, b in runs:
            self.before.append(total)
            total += b - a
        self.ends = [b for _, b in runs]
        self.total = total

    def __bool__(self) -> bool:
        return self.total > 0

    def scalar(self, seq: int) -> int:
        k = bisect.bisect_right(self.starts, seq) - 1
        if k < 0:
            return seq
        return seq - self.before[k] - min(seq, self.ends[k]) + self.starts[k]

    def array(self, seqs: pa.Array) -> pa.Array:
        values = seqs.to_numpy(zero_copy_only=False).astype(np.int64)
        starts = np.asarray(self.starts, dtype=np.int64)
        ends = np.asarray(self.ends, dtype=np.int64)
        before = np.asarray(self.before, dtype=np.int64)
        k = np.searchsorted(starts, values, side="right") - 1
        inside = k >= 0
        kk = np.where(inside, k, 0)
        shift = np.where(inside, before[kk] + np.minimum(values, ends[kk]) - starts[kk], 0)
        return pa.array(values - shift, pa.int64())

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A record batch with its `_seq` column (index 4) renumbered."""
        if not self or batch.num_rows == 0:
            return batch
        return batch.set_column(4, batch.schema.field(4), self.array(batch.column(4)))
