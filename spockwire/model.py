"""Public value objects shared by both decoder implementations.

`Relation` and `Column` describe a table as the upstream announced it; `ChangeBatch`, `Truncate` and
`LogicalMessage` are the committed events `Decoder.drain()` returns.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .python_objects import numpy_view, to_pandas, to_pylist

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

__all__ = [
    "Column", "Relation", "ChangeBatch", "Truncate", "LogicalMessage", "CHANGE_TYPES", "PG_EPOCH_OFFSET_US",
    "pg_timestamp_to_datetime", "epoch_micros", "Event", "SNAPSHOT_SEQ_BASE",
]

#: `_change_type` values, indexed by the code the decoders store per row (Delta change-data-feed names).
CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")

#: Microseconds between 1970-01-01 and 2000-01-01 (PostgreSQL's epoch): add to a wire timestamp to get Unix µs.
PG_EPOCH_OFFSET_US = 946_684_800_000_000

#: `_seq` of a table's first snapshot row (row i: SNAPSHOT_SEQ_BASE + i, that is -2^63 + i): below every streamed
#: change's `_seq` (a transaction numbers its changes from 0), so no change shares a (`_commit_lsn`, `_seq`) with a
#: snapshot row (docs/staging.md).
SNAPSHOT_SEQ_BASE = -(1 << 63)

_UNIX_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def pg_timestamp_to_datetime(pg_us: int) -> _dt.datetime:
    """A wire timestamp (signed µs since 2000-01-01 UTC) as an aware UTC datetime."""
    return _UNIX_EPOCH + _dt.timedelta(microseconds=pg_us + PG_EPOCH_OFFSET_US)


def epoch_micros(ts: _dt.datetime) -> int:
    """An aware datetime as whole µs since 1970-01-01 UTC (the value of an Arrow ``timestamp("us", tz)``)."""
    return (ts - _UNIX_EPOCH) // _dt.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Column:
    """One replicated column: its name, type (None when the protocol carries none) and key membership."""

    name: str
    type_oid: int | None
    type_modifier: int | None
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """A table as described by one Relation ('R') message.

    `version` starts at 1 for the first description of a relation id seen by a decoder and grows by one each
    time the upstream describes it again (after DDL); rows are always decoded with the version that preceded them.
    """

    relid: int
    namespace: str
    name: str
    columns: tuple[Column, ...]
    replica_identity: str | None
    version: int

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


class ChangeBatch:
    """Committed row changes of one relation version, as an Arrow record batch."""

    __slots__ = ("relation", "_record_batch")

    def __init__(self, relation: Relation, record_batch: "pyarrow.RecordBatch") -> None:
        self.relation = relation
        self._record_batch = record_batch

    @property
    def num_rows(self) -> int:
        return self._record_batch.num_rows

    def to_arrow(self) -> "pyarrow.RecordBatch":
        """The batch as a `pyarrow.RecordBatch` (change columns first, then the table's columns)."""
        return self._record_batch

    def to_pylist(self) -> list[dict[str, Any]]:
        """Rows as dicts of Python values: Decimal, datetime, date, time, uuid.UUID, intervals as
        (months, days, nanoseconds), lists, str, bytes; ±infinity dates and timestamps as `spockwire.INFINITY` /
        `spockwire.NEG_INFINITY`; finite values outside Python's range (BC, after 9999, 24:00:00) as PostgreSQL's
        text."""
        return to_pylist(self.to_arrow())

    def to_pandas(self, **kwargs: Any) -> Any:
        """The batch as a pandas DataFrame (`pyarrow.RecordBatch.to_pandas` options apply; ±infinity and values
        pandas cannot hold exactly give an object column of the `to_pylist` values, see README "Types")."""
        return to_pandas(self.to_arrow(), **kwargs)

    def column_numpy(self, name: str) -> Any:
        """A zero-copy numpy view of a fixed-width column without NULLs."""
        return numpy_view(self.to_arrow(), name)

    def __len__(self) -> int:
        return self._record_batch.num_rows

    def __repr__(self) -> str:
        return f"<ChangeBatch {self.relation.qualified_name} v{self.relation.version} rows={self.num_rows}>"


@dataclass(frozen=True, slots=True)
class Truncate:
    """A committed TRUNCATE of one or more relations."""

    relations: tuple[Relation, ...]
    cascade: bool
    restart_identity: bool
    commit_lsn: int
    commit_ts: _dt.datetime
    xid: int
    seq: int
    origin: str | None


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A `pg_logical_emit_message` message (or a spock sync event).

    Transactional messages come out with their transaction (`commit_lsn`, `commit_ts`, `seq` set);
    non-transactional ones come out at once and have those set to None.
    """

    prefix: str
    content: bytes
    transactional: bool
    lsn: int
    xid: int | None
    commit_lsn: int | None
    commit_ts: _dt.datetime | None
    seq: int | None
    origin: str | None


Event = Any  # ChangeBatch | Truncate | LogicalMessage
