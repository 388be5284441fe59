"""The inputs of a resolution (spockwire.spark.resolve): the plan of an apply, the stored state and the result
types, and the batch and the stored rows of its keys turned into ranked events (steps 1 and 2 of the resolution),
with the row references the output is gathered from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Plan", "Stored", "Resolution", "make_plan", "scd2_columns", "DEFAULT_SEQUENCE", "OP", "UPSERT", "DELETE",
           "VERSION"]

#: the default ordering of changes: commit LSN, then position in the transaction
DEFAULT_SEQUENCE = ("_commit_lsn", "_seq")


#: the column of a resolution that says what to do with each row
OP = "_sw_op"


UPSERT, DELETE, VERSION = "upsert", "delete", "version"


_TRUNCATE = "truncate"


_NO = -1   # "none" in rank and row-reference arrays


def scd2_columns(sequence_by: Sequence[str] | str = DEFAULT_SEQUENCE) -> tuple[list[str], list[str]]:
    """The validity columns of an SCD 2 table: (start columns, end columns). Each sequence column ``c`` gives
    ``_start_<c>`` / ``_end_<c>`` (leading underscores dropped), then ``_start_commit_ts`` / ``_end_commit_ts``
    (the commit time): with the default sequence ``_start_commit_lsn, _start_seq, _start_commit_ts`` and the same
    with ``_end_``. A name already taken (by the commit time, or by an earlier sequence column) gets a leading
    underscore back, one at a time, until it is free: ``("_commit_ts", "_seq")`` gives ``_start__commit_ts,
    _start_seq, _start_commit_ts``."""
    seq = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    taken = {"commit_ts"}
    stems = []
    for c in seq:
        stem = c.lstrip("_")
        while stem in taken:
            stem = "_" + stem
        taken.add(stem)
        stems.append(stem)
    return ([f"_start_{s}" for s in stems] + ["_start_commit_ts"],
            [f"_end_{s}" for s in stems] + ["_end_commit_ts"])


@dataclass
class Plan:
    """The columns of one apply: keys, the batch's other table columns, the sequence, the SCD type."""

    keys: list[str]
    values: list[str]
    seq: list[str]
    scd: int
    has_ts: bool
    has_toast: bool

    @property
    def start_cols(self) -> list[str]:
        return scd2_columns(self.seq)[0]

    @property
    def end_cols(self) -> list[str]:
        return scd2_columns(self.seq)[1]

    def bookkeeping(self) -> list[str]:
        """Columns the target holds besides the table's: SCD 1 the sequence (those not table columns), SCD 2 the
        validity columns."""
        if self.scd == 2:
            return self.start_cols + self.end_cols
        return [c for c in self.seq if c not in self.keys and c not in self.values]


def make_plan(columns: Sequence[str], keys: Sequence[str], sequence_by: Sequence[str] | str, scd: int,
              value_columns: Sequence[str]) -> Plan:
    """Check the apply's arguments against the change columns; `keys` are the key columns found (or given)."""
    if scd not in (1, 2):
        raise ValueError(f"stored_as_scd_type must be 1 or 2, not {scd!r}")
    seq = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    if not seq:
        raise ValueError("sequence_by needs at least one column")
    missing = [c for c in seq if c not in columns]
    if missing:
        raise ValueError(f"sequence_by columns {missing} are not columns of the change DataFrame")
    twice = sorted({c for c in seq if seq.count(c) > 1})
    if twice:
        raise ValueError(f"sequence_by names {', '.join(twice)} more than once")
    if not keys:
        raise ValueError("apply_changes needs the key columns: pass keys=[...] (the spockwire source marks the "
                         "table's replica-identity columns, but this DataFrame has no such marks), or keys=[] for a "
                         "table without a key")
    missing = [k for k in keys if k not in columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the change DataFrame")
    if "_change_type" not in columns:
        raise ValueError("the change DataFrame has no _change_type column")
    values = [c for c in value_columns if c not in keys]
    if scd == 2:
        start, end = scd2_columns(seq)
        clash = [c for c in list(keys) + values if c in start + end]
        if clash:
            raise ValueError(f"the table's columns {clash} have the names of SCD 2 validity columns "
                             f"({', '.join(start + end)}): rename them in the changes")
    return Plan(list(keys), values, seq, scd, "_commit_ts" in columns, "_unchanged_toast" in columns)


@dataclass
class Stored:
    """What the target holds for the touched keys.

    `rows`: SCD 1 the table's columns and the sequence columns (NULL sequence: a plain table's row, older than any
    change); SCD 2 the table's columns and the validity columns. `tombstones`: the keys' remembered deletes (keys,
    sequence columns, ``_commit_ts``). `truncates`: every stored truncate, ``(sequence tuple, commit time)``.
    `collected`: the position before which the target's tombstones and truncates were collected (no change before
    it may arrive any more), or None."""

    rows: pa.Table | None = None
    tombstones: pa.Table | None = None
    truncates: list[tuple[tuple, Any]] = field(default_factory=list)
    collected: tuple | None = None


@dataclass
class Resolution:
    """The rows to write (changed ones only) and what the batch held.

    `rows`: SCD 1 the table's columns, the sequence columns and `OP` (``upsert``: the key's row; ``delete``: the
    key ends, the row holds its end's sequence); SCD 2 the table's columns, the validity columns and `OP`
    (``version``: a version to insert or update, by key and start; ``delete``: a delete to remember, its sequence in
    the start columns)."""

    rows: pa.Table
    truncates: list[tuple[tuple, Any]]       # the batch's truncates, in sequence order
    keys_touched: int = 0
    fresh_keys: int = 0
    sequential_keys: int = 0                 # keys resolved one at a time (late changes, TOAST across key changes)


# ---------------------------------------------------------------------------------------------------------------
# ranks

def _same_as_previous(col: Any) -> np.ndarray:
    """Row i equals row i - 1 (NULL equals NULL, NaN equals NaN: one key, as in PostgreSQL), for rows 1..n-1."""
    n = len(col)
    a, b = col.slice(1, n - 1), col.slice(0, n - 1)
    eq = pc.fill_null(pc.equal(a, b), False)
    both = pc.and_(pc.is_null(a), pc.is_null(b))
    if pa.types.is_floating(col.type):
        both = pc.or_(both, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return np.asarray(pc.or_(eq, both).to_numpy(zero_copy_only=False), dtype=bool)


def _dense_rank(parts: Sequence[pa.Table]) -> tuple[list[np.ndarray], pa.Table, np.ndarray]:
    """Dense ranks of the rows of `parts` (tables of the same columns and types) in lexicographic order, NULL
    first; equal rows share a rank. Returns the ranks per part, the distinct rows in rank order and, for each rank,
    the row (in the concatenation of `parts`) that stands for it."""
    sizes = [p.num_rows for p in parts]
    both = pa.concat_tables(parts).combine_chunks()
    n = both.num_rows
    if n == 0:
        return [np.zeros(0, np.int64) for _ in parts], both, np.zeros(0, np.int64)
    packed = _packed_integers(both)
    if packed is not None:
        return _split(_rank_packed(both, *packed), sizes)
    order = pc.sort_indices(both, options=pc.SortOptions([(c, "ascending", "at_start") for c in both.column_names])
                            ).to_numpy()
    ordered = both.take(order)
    new = np.ones(n, dtype=bool)
    if n > 1:
        same = np.ones(n - 1, dtype=bool)
        for col in ordered.columns:
            same &= _same_as_previous(col)
        new[1:] = ~same
    rank_sorted = np.cumsum(new) - 1
    ranks = np.empty(n, np.int64)
    ranks[order] = rank_sorted
    return _split((ranks, ordered.filter(pa.array(new)), order[new]), sizes)


def _split(ranked: tuple[np.ndarray, pa.Table, np.ndarray], sizes: Sequence[int]
           ) -> tuple[list[np.ndarray], pa.Table, np.ndarray]:
    ranks, distinct, first = ranked
    out = []
    at = 0
    for s in sizes:
        out.append(ranks[at:at + s])
        at += s
    return out, distinct, first


def _integer_backed(t: pa.DataType) -> bool:
    """Whether values of `t` order as their int64 (a position's LSN and sequence, most keys)."""
    return (pa.types.is_integer(t) and t.bit_width <= 64) or pa.types.is_timestamp(t) or pa.types.is_date(t) \
        or pa.types.is_time(t) or pa.types.is_duration(t)


def _packed_integers(table: pa.Table) -> tuple[np.ndarray, list[tuple[int, int]]] | None:
    """The rows of `table` as one int64 each that sorts as the rows do, when every column is integer-backed, holds
    no NULL and the columns' ranges fit in 63 bits together (e.g. an LSN and a sequence within a batch); with each
    column's (minimum, span) to unpack them. None otherwise: the general ranking (a sort of the table) applies."""
    packed: np.ndarray | None = None
    ranges: list[tuple[int, int]] = []
    room = 1
    for col in table.columns:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if not _integer_backed(arr.type) or arr.null_count:
            return None
        if pa.types.is_unsigned_integer(arr.type) and arr.type.bit_width == 64:
            if len(arr) and pc.max(arr).as_py() >= 1 << 63:
                return None
        v = _as_int64(arr).to_numpy()
        lo, hi = int(v.min()), int(v.max())
        span = hi - lo + 1
        room *= span
        if room >= 1 << 62:
            return None
        shifted = v - lo
        packed = shifted if packed is None else packed * span + shifted
        ranges.append((lo, span))
    return packed, ranges


def _as_int64(arr: pa.Array) -> pa.Array:
    if pa.types.is_integer(arr.type):
        return arr.cast(pa.int64())
    return arr.view(pa.int64()) if arr.type.bit_width == 64 else arr.view(pa.int32()).cast(pa.int64())


def _from_int64(arr: pa.Array, t: pa.DataType) -> pa.Array:
    if pa.types.is_integer(t):
        return arr.cast(t)
    return arr.view(t) if t.bit_width == 64 else arr.cast(pa.int32()).view(t)


def _rank_packed(table: pa.Table, packed: np.ndarray, ranges: list[tuple[int, int]]
                 ) -> tuple[np.ndarray, pa.Table, np.ndarray]:
    """_dense_rank of integer rows packed into one int64 each (_packed_integers): one sort of a numpy array."""
    distinct, first, ranks = np.unique(packed, return_index=True, return_inverse=True)
    cols = []
    rest = distinct
    parts: list[np.ndarray] = []
    for lo, span in reversed(ranges):
        parts.append(rest % span + lo)
        rest = rest // span
    for f, values in zip(table.schema, reversed(parts)):
        cols.append(_from_int64(pa.array(values, pa.int64()), f.type))
    return ranks.reshape(-1).astype(np.int64, copy=False), pa.table(cols, schema=table.schema), first


def _cast_table(t: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.table([t.column(f.name).cast(f.type) for f in schema], schema=schema)


@dataclass
# ---------------------------------------------------------------------------------------------------------------
# the batch as events

class _Events:
    table: pa.Table                 # the batch's rows that are events (no truncates, no absorbed preimages)
    op: np.ndarray                  # 0 upsert, 1 delete
    carried: dict[str, np.ndarray]  # column -> rows whose value is carried from the previous version


def _truncates(changes: pa.Table, plan: Plan) -> tuple[pa.Table, list[tuple[tuple, Any]]]:
    ct = changes.column("_change_type")
    is_tr = pc.fill_null(pc.equal(ct, _TRUNCATE), False)
    if not pc.any(is_tr).as_py():
        return changes, []
    rows = changes.filter(is_tr)
    seq = [rows.column(c).to_pylist() for c in plan.seq]
    ts = rows.column("_commit_ts").to_pylist() if plan.has_ts else [None] * rows.num_rows
    found: dict[tuple, Any] = {}
    for i in range(rows.num_rows):
        found.setdefault(tuple(s[i] for s in seq), ts[i])
    at = np.flatnonzero(is_tr.to_numpy(zero_copy_only=False))
    if at[-1] == len(at) - 1:       # the truncates lead the batch (a snapshot's): the rest without a copy
        rest = changes.slice(len(at))
    else:
        rest = changes.filter(pc.invert(is_tr))
    return rest, sorted(found.items(), key=lambda t: _sk(t[0]))


def _events(changes: pa.Table, plan: Plan, table_cols: Sequence[str]) -> _Events:
    """The batch's change rows as upserts and deletes. A preimage matters only when the key changed (the postimage
    that follows it, at the next `_seq` of the same commit, has another key): then it is a delete of the old key."""
    ct = changes.column("_change_type")
    pre = np.asarray(pc.fill_null(pc.equal(ct, "update_preimage"), False).to_numpy(zero_copy_only=False))
    keep = np.ones(len(pre), dtype=bool)
    if pre.any() and {"_commit_lsn", "_seq"} <= set(changes.column_names):
        # in (commit, seq) order, a row repeated (a duplicate of the same change) counts once; then the row
        # after each preimage is its postimage when at the next seq
        order = pc.sort_indices(changes, sort_keys=[("_commit_lsn", "ascending"), ("_seq", "ascending")]).to_numpy()
        lsn, seq, kinds = (changes.column(c).take(order) for c in ("_commit_lsn", "_seq", "_change_type"))
        if len(order) > 1:
            repeat = _same_as_previous(lsn) & _same_as_previous(seq) & _same_as_previous(kinds)
            for k in plan.keys:
                repeat &= _same_as_previous(changes.column(k).take(order))
            if repeat.any():
                keep[order[1:][repeat]] = False
                order = order[np.concatenate([[True], ~repeat])]
                lsn, seq, kinds = (changes.column(c).take(order) for c in ("_commit_lsn", "_seq", "_change_type"))
        n = len(order)
        if n > 1:
            follows = pc.and_(pc.fill_null(pc.equal(lsn.slice(1), lsn.slice(0, n - 1)), False),
                              pc.fill_null(pc.equal(seq.slice(1), pc.add(seq.slice(0, n - 1), 1)), False))
            follows = pc.and_(follows, pc.fill_null(pc.equal(kinds.slice(1), "update_postimage"), False))
            same = np.asarray(follows.to_numpy(zero_copy_only=False)) & pre[order[:-1]]
            for k in plan.keys:
                same &= _same_as_previous(changes.column(k).take(order))
            keep[order[:-1][same]] = False
    else:
        keep = ~pre      # no (commit, seq) to pair a preimage with its postimage: preimages are left out
    rows = changes.filter(pa.array(keep)) if not keep.all() else changes
    kinds = rows.column("_change_type")
    op = np.asarray(pc.fill_null(pc.is_in(kinds, pa.array(["delete", "update_preimage"])), False)
                    .to_numpy(zero_copy_only=False)).astype(np.int8)
    n = rows.num_rows
    carried: dict[str, np.ndarray] = {}
    if plan.has_toast and n:
        toast = rows.column("_unchanged_toast").combine_chunks()
        if toast.null_count < n:
            flat = pc.list_flatten(toast)
            if len(flat):
                parents = pc.list_parent_indices(toast).to_numpy()
                names = flat.to_numpy(zero_copy_only=False)
                for name in set(names.tolist()):
                    if name is None:
                        continue
                    mask = np.zeros(n, dtype=bool)
                    mask[parents[names == name]] = True
                    carried[name] = mask
    have = set(rows.column_names)
    for c in table_cols:
        if c not in have and c not in plan.keys:
            carried[c] = np.ones(n, dtype=bool)   # a column the batch does not have: its value is carried
    return _Events(rows, op, carried)


def _sk(pos: tuple) -> tuple:
    """A sort key for a sequence tuple: a NULL (a plain table's row, which has no sequence yet) first."""
    return tuple((x is not None, x) for x in pos)


# ---------------------------------------------------------------------------------------------------------------
# the batch and the stored state, ranked

class _Frame:
    """Everything as integers: positions and keys as ranks, rows as indices into the value sources (the batch's
    event rows 0 .. n-1, then the stored rows)."""

    def __init__(self, ev: _Events, stored: Stored, batch_truncates: list, plan: Plan) -> None:
        self.plan = plan
        self.ev = ev
        seq = plan.seq
        et = ev.table
        seq_schema = pa.schema([pa.field(c, et.schema.field(c).type) for c in seq])
        ts_type = pa.timestamp("us", tz="UTC")
        rows = stored.rows if stored.rows is not None and stored.rows.num_rows else None
        tombs = stored.tombstones if stored.tombstones is not None and stored.tombstones.num_rows else None
        self.rows, self.tombs = rows, tombs
        # positions: events, stored starts (SCD 1: the sequence), stored ends (SCD 2), tombstones, truncates
        pos_parts = [_cast_table(et.select(seq), seq_schema)]
        ts_parts = [et.column("_commit_ts").cast(ts_type) if plan.has_ts else pa.nulls(et.num_rows, ts_type)]
        if rows is not None:
            n = rows.num_rows
            if plan.scd == 1:
                starts = pa.table([rows.column(c) if c in rows.column_names else pa.nulls(n) for c in seq],
                                  names=seq)
                ts_parts.append(pa.nulls(n, ts_type))
            else:
                starts = pa.table([rows.column(c) for c in plan.start_cols[:-1]], names=seq)
                ts_parts.append(rows.column(plan.start_cols[-1]).cast(ts_type))
            pos_parts.append(_cast_table(starts, seq_schema))
            if plan.scd == 2:
                ends = pa.table([rows.column(c) for c in plan.end_cols[:-1]], names=seq)
                pos_parts.append(_cast_table(ends, seq_schema))
                ts_parts.append(rows.column(plan.end_cols[-1]).cast(ts_type))
        if tombs is not None:
            pos_parts.append(_cast_table(tombs.select(seq), seq_schema))
            ts_parts.append(tombs.column("_commit_ts").cast(ts_type))
        truncs = list(stored.truncates) + list(batch_truncates)
        if truncs:
            pos_parts.append(pa.table([pa.array([p[i] for p, _ in truncs], seq_schema.field(c).type)
                                       for i, c in enumerate(seq)], schema=seq_schema))
            ts_parts.append(pa.array([t for _, t in truncs], ts_type))
        ranks, self.positions, _first = _dense_rank(pos_parts)
        self.pos_ts = _ts_by_rank(ranks, ts_parts, len(self.positions))
        it = iter(ranks)
        self.ev_pos = next(it)
        self.st_pos = self.st_end = self.tb_pos = None
        if rows is not None:
            self.st_pos = next(it)
            if plan.scd == 2:
                ends_rank = next(it)
                open_ = rows.column(plan.end_cols[0]).is_null().to_numpy(zero_copy_only=False)
                self.st_end = np.where(open_, _NO, ends_rank)
        if tombs is not None:
            self.tb_pos = next(it)
        tr_ranks = next(it) if truncs else np.zeros(0, np.int64)
        self.stored_tr = tr_ranks[:len(stored.truncates)]
        self.batch_tr = tr_ranks[len(stored.truncates):]
        # keys
        key_schema = pa.schema([pa.field(k, et.schema.field(k).type) for k in plan.keys])
        key_parts = [_cast_table(et.select(plan.keys), key_schema)]
        if rows is not None:
            key_parts.append(_cast_table(rows.select(plan.keys), key_schema))
        if tombs is not None:
            key_parts.append(_cast_table(tombs.select(plan.keys), key_schema))
        kranks, distinct, _kfirst = _dense_rank(key_parts)
        kit = iter(kranks)
        self.ev_key = next(kit)
        self.st_key = next(kit) if rows is not None else None
        self.tb_key = next(kit) if tombs is not None else None
        self.n_keys = distinct.num_rows
        self.moves_found: list[tuple[int, int, int, int]] | None = None


def _ts_by_rank(ranks: list[np.ndarray], ts_parts: list[Any], n: int) -> pa.Array:
    """A position's commit time: that of any row holding it (they agree); NULL where none has one."""
    ts = pa.concat_arrays([a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in ts_parts])
    flat = np.concatenate(ranks) if ranks else np.zeros(0, np.int64)
    pick = np.full(n, _NO, np.int64)
    valid = np.nonzero(ts.is_valid().to_numpy(zero_copy_only=False))[0]
    pick[flat[valid]] = valid
    return _take_or_null(ts, pick)


def _take_or_null(arr: Any, idx: np.ndarray) -> pa.Array:
    """arr.take(idx), -1 giving NULL."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    mask = idx == _NO
    if len(arr) == 0 or mask.all():
        return pa.nulls(len(idx), arr.type)
    taken = arr.take(pa.array(np.where(mask, 0, idx), pa.int64()))
    if mask.any():
        taken = pc.if_else(pa.array(~mask), taken, pa.nulls(len(idx), arr.type))
    return taken


def _group_bounds(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and stop (exclusive) of each run of equal values in a sorted array."""
    n = len(sorted_keys)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    brk = np.nonzero(sorted_keys[1:] != sorted_keys[:-1])[0] + 1
    return np.concatenate([[0], brk]), np.concatenate([brk, [n]])


@dataclass
# ---------------------------------------------------------------------------------------------------------------
# output rows as references

class _Refs:
    """Output rows: the row holding the key, the row the values come from, per carried column the row its value
    comes from, positions as ranks, and the operation (0 upsert / version, 1 delete). Rows index the events, then
    the stored rows; -1 is NULL."""

    key_row: list[np.ndarray] = field(default_factory=list)
    value_row: list[np.ndarray] = field(default_factory=list)
    carried: list[dict[str, np.ndarray]] = field(default_factory=list)
    start: list[np.ndarray] = field(default_factory=list)
    end: list[np.ndarray] = field(default_factory=list)
    op: list[np.ndarray] = field(default_factory=list)
    fresh: int = 0
    sequential: int = 0

    def add(self, key_row: np.ndarray, value_row: np.ndarray, carried: dict[str, np.ndarray], start: np.ndarray,
            end: np.ndarray | None, op: np.ndarray) -> None:
        self.key_row.append(key_row)
        self.value_row.append(value_row)
        self.carried.append(carried)
        self.start.append(start)
        self.end.append(end if end is not None else np.full(len(start), _NO, np.int64))
        self.op.append(op.astype(np.int8))
