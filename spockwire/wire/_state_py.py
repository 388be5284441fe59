"""What a decoder keeps between messages (twin of spockwire/wire/_state.pxi): an open transaction (_Txn), the markers
and kinds the decoder's parts share (the .pyx keeps them in its header), and small helpers of names and positions."""
from __future__ import annotations

from .renumber import SeqRenumber
from .spill import SpillFile
from ._builder_py import _Builder


PROTOCOLS = ("pgoutput", "pglogical", "spock")
_PGOUTPUT, _PGLOGICAL, _SPOCK = 0, 1, 2

INSERT, UPDATE_PRE, UPDATE_POST, DELETE = 0, 1, 2, 3

#: rows in one batch at most (a batch is closed and a new one started beyond it)
DEFAULT_BATCH_ROWS = 1 << 18


class _BatchFull(Exception):
    """Internal: the row message must start a new batch (see Decoder._row_message)."""


class _Unrepresentable(Exception):
    """Internal: a valid value its column's Arrow type cannot hold; the column switches to text."""

    def __init__(self, column: int) -> None:
        self.column = column


UNREPRESENTABLE_CHOICES = ("text", "error")


# transaction kinds
_PLAIN, _STREAM, _PREPARED = 0, 1, 2

# "what came just before" markers for ORIGIN / LAST-COMMIT placement rules
_AFTER_NOTHING, _AFTER_BEGIN, _AFTER_ORIGIN = 0, 1, 2


class _Txn:
    """An open transaction: plain (rows go to the shared builders), streamed or prepared (rows kept apart)."""

    __slots__ = ("kind", "xid", "final_lsn", "commit_ts", "origin", "seq", "pending", "builders", "aborted",
                 "floor", "gid", "spill", "mem", "runs", "run_sub", "run_start")

    def __init__(self, kind: int, xid: int, final_lsn: int, commit_ts: int, floor: int) -> None:
        self.kind = kind
        self.xid = xid
        self.final_lsn = final_lsn
        self.commit_ts = commit_ts
        self.origin: str | None = None
        self.seq = 0
        # pending events in order: ("rows", builder, start, stop) | ("truncate", ...) | ("message", ...)
        self.pending: list[tuple] = []
        self.builders: dict[int, _Builder] = {}   # id(relation) -> builder, for streamed/prepared transactions
        self.aborted: set[int] = set()
        self.floor = floor
        self.gid: str | None = None
        self.spill: SpillFile | None = None   # closed batches written to disk past the decoder's spill_bytes
        self.mem = 0                          # estimated bytes of closed batches still in memory
        self.runs: dict[int, list[tuple[int, int]]] = {}   # streamed: subxid -> runs of _seq its changes took
        self.run_sub = 0
        self.run_start = 0

    def advance(self, sub: int, n: int) -> None:
        """`n` changes of subtransaction `sub` took the next numbers."""
        if self.kind == _STREAM and sub != self.run_sub:
            self.close_run()
            self.run_sub = sub
        self.seq += n

    def close_run(self) -> None:
        if self.seq > self.run_start:
            self.runs.setdefault(self.run_sub, []).append((self.run_start, self.seq))
        self.run_start = self.seq

    def renumbering(self) -> SeqRenumber | None:
        if not self.aborted:
            return None
        self.close_run()
        return SeqRenumber(run for sub in self.aborted for run in self.runs.get(sub, ()))


def _lsn(v: int) -> str:
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
