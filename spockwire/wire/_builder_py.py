"""The rows of one relation version being built (twin of spockwire/wire/_builder.pxi): Python lists per column,
made into Arrow arrays when the batch closes; and the byte counts that decide when a batch is full."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..export.arrow import finish_batch
from ..model import ChangeBatch, PG_EPOCH_OFFSET_US, Relation
from ..values._convert_py import build_array
from ..values.catalog import (ARRAY, BYTEA, CHAR, ColumnSpec, ENUM, JSON, JSONB, NUMERIC_TEXT, OTHER, PGTEXT, RAW,
                              TEXT, TIMETZ)


# kinds whose text can be longer than the binary or internal form it is made from
_EXPANDING = frozenset((NUMERIC_TEXT, TIMETZ, CHAR))
_VIEW_KINDS = frozenset((TEXT, JSON, JSONB, BYTEA, RAW, OTHER))   # string / binary: views with strings="view"
_VARLEN = frozenset((RAW, OTHER, TEXT, JSON, JSONB, BYTEA, NUMERIC_TEXT, TIMETZ, ENUM, CHAR, PGTEXT))


def _output_bytes(spec: ColumnSpec, value: Any, internal: bool = False) -> int:
    """Bytes a binary or internal value of a kind rendered to text adds to its column (0 for other kinds); an
    internal text, json, jsonb or bytea datum may have been compressed (and jsonb's text is longer than its
    container): its decompressed bytes, the text."""
    if internal and spec.kind in (TEXT, JSON, JSONB):
        return len(value.encode("utf-8"))
    if internal and spec.kind == BYTEA:
        return len(value)
    if spec.kind in _EXPANDING:
        return len(value)                       # these texts are ASCII
    if spec.kind == PGTEXT:
        return len(value.encode("utf-8"))
    if spec.kind == ARRAY and spec.element.kind in _EXPANDING:
        return sum(len(e) for e in value if e is not None)
    return 0


def _column_size(spec: ColumnSpec, values: list[Any]) -> int:
    """What a column's Arrow offsets would have to count: data bytes, or elements and element bytes of a list."""
    if spec.kind == ARRAY:
        elements = sum(len(v) for v in values if v is not None)
        flat = [e for v in values if v is not None for e in v]
        return max(elements, _column_size(spec.element, flat))
    if spec.kind not in _VARLEN:
        return 0
    return sum(len(v.encode("utf-8")) if isinstance(v, str) else len(v) for v in values if v is not None)


class _Builder:
    """Rows of one relation version, column by column (the twin keeps Python lists; C keeps Arrow buffers)."""

    __slots__ = ("relation", "specs", "ncols", "change", "lsn", "ts", "xid", "seq", "origin", "toast", "subxid",
                 "values", "marks", "committed", "nbytes", "msg_mark", "full", "views", "has_views", "pins",
                 "pinned_bytes")

    def __init__(self, relation: Relation, specs: tuple[ColumnSpec, ...], views: bool = False) -> None:
        self.relation = relation
        self.specs = specs
        self.views = views
        self.has_views = views and any(spec.kind in _VIEW_KINDS for spec in specs)
        self.pins: list[Any] = []   # input buffers the views point into (the C decoder's variadic buffers)
        self.pinned_bytes = 0
        self.ncols = len(relation.columns)
        self.change: list[int] = []
        self.lsn: list[int] = []
        self.ts: list[int] = []
        self.xid: list[int] = []
        self.seq: list[int] = []
        self.origin: list[str | None] = []
        self.toast: list[list[int] | None] = []
        self.subxid: list[int] = []
        # per-column lists, made by the first row that passes its checks (init_columns)
        self.values: list[list[Any]] | None = None
        # untyped columns: per row, True when the value did not arrive as UTF-8 text (decides string vs binary)
        self.marks: list[list[bool] | None] | None = None
        self.committed = 0
        self.nbytes = 0
        self.msg_mark = 0       # rows before the row message being decoded
        self.full = False       # closed early: a message's values would not fit with the rows already here

    @property
    def nrows(self) -> int:
        return len(self.change)

    def init_columns(self) -> None:
        self.values = [[] for _ in range(self.ncols)]
        self.marks = [[] if spec.is_raw else None for spec in self.specs]

    def truncate_to(self, n: int) -> None:
        for lst in (self.change, self.lsn, self.ts, self.xid, self.seq, self.origin, self.toast, self.subxid):
            del lst[n:]
        for col in self.values or ():
            del col[n:]
        for marks in self.marks or ():
            if marks is not None:
                del marks[n:]

    def fill_commit(self, start: int, lsn: int, ts: int) -> None:
        for i in range(start, self.nrows):
            self.lsn[i] = lsn
            self.ts[i] = ts

    def raw_marks(self, start: int, stop: int) -> dict[int, list[bool]]:
        """For each untyped column with a value in rows [start, stop) that did not arrive as text: the marks of
        those rows (what the column's type is decided by once rows of aborted subtransactions are dropped)."""
        out = {}
        for c, marks in enumerate(self.marks or ()):
            if marks is not None and any(marks[start:stop]):
                out[c] = marks[start:stop]
        return out

    def take_rows(self, start: int, stop: int, keep: list[bool] | None = None) -> ChangeBatch | None:
        """Rows [start, stop) (optionally filtered) as a ChangeBatch."""
        idx = range(start, stop) if keep is None else [i for i in range(start, stop) if keep[i - start]]
        if len(idx) == 0:
            return None
        pick = (lambda lst: lst[start:stop]) if keep is None else (lambda lst: [lst[i] for i in idx])
        toast_rows = pick(self.toast)
        if any(t is not None for t in toast_rows):
            offsets = [0]
            indices: list[int] = []
            for t in toast_rows:
                if t is not None:
                    indices.extend(t)
                offsets.append(len(indices))
            toast_offsets = pa.array(offsets, pa.int32())
            toast_indices = pa.array(indices, pa.uint16())
            toast_mask = pa.array([t is None for t in toast_rows], pa.bool_())
        else:
            toast_offsets = toast_indices = toast_mask = None
        values = []
        for c in range(self.ncols):
            col = pick(self.values[c])
            marks = self.marks[c]
            if marks is None:
                arr = build_array(self.specs[c], col)
            elif any(pick(marks)):
                arr = pa.array(col, pa.binary())
            else:
                arr = pa.array([None if v is None else v.decode("utf-8") for v in col], pa.string())
            if self.views and self.specs[c].kind in _VIEW_KINDS:
                arr = arr.cast(pa.binary_view() if pa.types.is_binary(arr.type) else pa.string_view())
            values.append(arr)
        batch = finish_batch(
            self.relation,
            pa.array(pick(self.change), pa.int8()),
            pa.array(pick(self.lsn), pa.uint64()),
            pa.array([t + PG_EPOCH_OFFSET_US for t in pick(self.ts)], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")),
            pa.array(pick(self.xid), pa.uint32()),
            pa.array(pick(self.seq), pa.int64()),
            pa.array(pick(self.origin), pa.string()),
            toast_offsets, toast_indices, toast_mask, values)
        return ChangeBatch(self.relation, batch)
