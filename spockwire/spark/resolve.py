"""Resolving a batch of changes against a target's stored state, per key, in Arrow: the core of `apply_changes`.

No Spark here: the input is an Arrow table of change rows (the change columns and the table's columns), the
stored state of the keys it touches, and the result is an Arrow table of the rows the target must write. The rules
are those of :mod:`spockwire.spark.apply` (changes take effect in sequence order per key; unchanged TOASTed values
carried from the previous version; a key change ends the old key; truncates end every key; re-applied and
out-of-order changes take part only where they belong in the sequence).

How it runs:

1. Positions (the sequence columns) and keys become dense integer ranks (one sort each), so everything after is
   integer work in numpy, whatever the columns' types.
2. Each touched key is *stale* (every change already applied: nothing to write), *fresh* (every change after
   everything stored for the key -- the normal case of a stream applied in order) or *mixed* (a late change
   between stored ones).
3. Fresh keys are resolved by vectorised passes over the changes sorted by (key, position): the last change per
   key (SCD 1) or every version with the next change as its end (SCD 2); unchanged TOASTed values by a forward
   fill within each key.
4. Mixed keys -- rare: replays interleaved with new changes, out-of-order batches -- and TOAST values carried
   across a key change are resolved one key at a time by :func:`_fold`, the sequential definition.
5. One gather per output column builds the result from the batch's and the stored rows.

Values never become Python objects on the vectorised path, and only the control columns do on the sequential one:
every value Arrow holds (an infinite timestamp, a huge decimal) goes through unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Plan", "Stored", "Resolution", "make_plan", "resolve", "scd2_columns", "first_position", "DEFAULT_SEQUENCE",
           "OP", "UPSERT", "DELETE", "VERSION"]

#: the default ordering of changes: commit LSN, then position in the transaction
DEFAULT_SEQUENCE = ("_commit_lsn", "_seq")
#: the column of a resolution that says what to do with each row
OP = "_sw_op"
UPSERT, DELETE, VERSION = "upsert", "delete", "version"
_TRUNCATE = "truncate"
_NO = -1   # "none" in rank and row-reference arrays


def scd2_columns(sequence_by: Sequence[str] = DEFAULT_SEQUENCE) -> tuple[list[str], list[str]]:
    """The validity columns of an SCD 2 table: (start columns, end columns). Each sequence column ``c`` gives
    ``_start_<c>`` / ``_end_<c>`` (leading underscores dropped), then ``_start_commit_ts`` / ``_end_commit_ts``:
    with the default sequence ``_start_commit_lsn, _start_seq, _start_commit_ts`` and the same with ``_end_``."""
    start = [f"_start_{c.lstrip('_')}" for c in sequence_by] + ["_start_commit_ts"]
    end = [f"_end_{c.lstrip('_')}" for c in sequence_by] + ["_end_commit_ts"]
    return start, end


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
    if not keys:
        raise ValueError("apply_changes needs the key columns: pass keys=[...] (the spockwire source marks the "
                         "table's replica-identity columns, but this DataFrame has no such marks)")
    missing = [k for k in keys if k not in columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the change DataFrame")
    if "_change_type" not in columns:
        raise ValueError("the change DataFrame has no _change_type column")
    values = [c for c in value_columns if c not in keys]
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
    """Row i equals row i - 1 (NULL equals NULL), for rows 1..n-1."""
    n = len(col)
    a, b = col.slice(1, n - 1), col.slice(0, n - 1)
    eq = pc.fill_null(pc.equal(a, b), False)
    both = pc.and_(pc.is_null(a), pc.is_null(b))
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
    out = []
    at = 0
    for s in sizes:
        out.append(ranks[at:at + s])
        at += s
    return out, ordered.filter(pa.array(new)), order[new]


def _cast_table(t: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.table([t.column(f.name).cast(f.type) for f in schema], schema=schema)


# ---------------------------------------------------------------------------------------------------------------
# the batch as events

@dataclass
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
    return changes.filter(pc.invert(is_tr)), sorted(found.items(), key=lambda t: _sk(t[0]))


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
# resolve

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


def resolve(changes: pa.Table, plan: Plan, stored: Stored, table_cols: Sequence[str],
            out_types: dict[str, pa.DataType] | None = None) -> Resolution:
    """The rows the target must write after `changes` (see the module docstring).

    `table_cols`: the table's columns after this batch; `out_types`: the type of each table column in the target
    (default: the batch's, then the stored rows')."""
    if stored.collected is not None:
        _check_not_collected(changes, plan, stored.collected)
    changes, batch_truncates = _truncates(changes, plan)
    ev = _events(changes, plan, table_cols)
    appended = _appended(ev, plan, stored, batch_truncates, table_cols, out_types or {})
    if appended is not None:
        return Resolution(appended, batch_truncates, ev.table.num_rows, ev.table.num_rows, 0)
    fr = _Frame(ev, stored, batch_truncates, plan)
    refs = _Refs()
    touched = int(np.count_nonzero(np.bincount(fr.ev_key, minlength=fr.n_keys))) if len(fr.ev_key) else 0
    if len(fr.ev_key):
        (_resolve_scd1 if plan.scd == 1 else _resolve_scd2)(fr, refs)
    rows = _gather(fr, refs, table_cols, out_types or {})
    return Resolution(rows, batch_truncates, touched, refs.fresh, refs.sequential)


def _check_not_collected(changes: pa.Table, plan: Plan, collected: tuple) -> None:
    """Changes before the target's collected position would be resolved without the tombstones and truncates that
    decided their keys (a deleted key could come back): refused."""
    from ..errors import StaleChangesError

    if changes.num_rows == 0:
        return
    first = _first_position(changes, plan.seq)
    if first is None or _sk(first) < _sk(collected):
        raise StaleChangesError(
            f"changes at {dict(zip(plan.seq, first)) if first else 'a NULL position'} are older than the target's "
            f"collected state ({dict(zip(plan.seq, collected))}): its tombstones and truncates before that position "
            f"were removed on the promise that no such change could arrive any more (collect_state)")


def _appended(ev: _Events, plan: Plan, stored: Stored, batch_truncates: list, table_cols: Sequence[str],
              out_types: dict[str, pa.DataType]) -> pa.Table | None:
    """The batch's rows as they are, when it only inserts new keys (a snapshot, an insert-only stream): every
    change an insert of a key the target does not hold, each key once, every truncate before the first change.
    None when the batch is not like that."""
    t = ev.table
    n = t.num_rows
    if n == 0 or ev.carried or ev.op.any():
        return None
    if not pc.all(pc.equal(t.column("_change_type"), "insert")).as_py():
        return None
    for part in (stored.rows, stored.tombstones):
        if part is not None and part.num_rows:
            return None
    truncs = list(stored.truncates) + list(batch_truncates)
    if truncs:
        first = _first_position(t, plan.seq)
        if first is None or any(_sk(p) >= _sk(first) for p, _ts in truncs):
            return None
    keys = t.select(plan.keys)
    if len(plan.keys) == 1:
        distinct = pc.count_distinct(keys.column(0), mode="all").as_py()
        if distinct != n or (keys.column(0).null_count > 1):
            return None
    elif keys.group_by(plan.keys).aggregate([]).num_rows != n:
        return None
    cols = {}
    for c in table_cols:
        typ = out_types.get(c)
        if c in t.column_names:
            col = t.column(c)
            cols[c] = col.cast(typ) if typ is not None and typ != col.type else col
        else:
            cols[c] = pa.nulls(n, typ or pa.null())
    if plan.scd == 1:
        for c in plan.seq:
            cols.setdefault(c, t.column(c))
        op = UPSERT
    else:
        for c, s in zip(plan.start_cols[:-1], plan.seq):
            cols[c] = t.column(s)
        ts_type = pa.timestamp("us", tz="UTC")
        cols[plan.start_cols[-1]] = t.column("_commit_ts").cast(ts_type) if plan.has_ts else pa.nulls(n, ts_type)
        for c, s in zip(plan.end_cols[:-1], plan.seq):
            cols[c] = pa.nulls(n, t.schema.field(s).type)
        cols[plan.end_cols[-1]] = pa.nulls(n, ts_type)
        op = VERSION
    cols[OP] = _repeat(op, n)
    return pa.table(cols)


def _repeat(text: str, n: int) -> pa.Array:
    return pa.array([text], pa.string()).take(pa.array(np.zeros(n, np.int32)))


def first_position(t: pa.Table, seq: Sequence[str] = DEFAULT_SEQUENCE) -> tuple | None:
    """The smallest sequence tuple of `t`'s rows (None when it has none, or a sequence value is NULL)."""
    return _first_position(t, seq) if t.num_rows else None


def _first_position(t: pa.Table, seq: Sequence[str]) -> tuple | None:
    """The smallest sequence tuple of `t` (None when a sequence value is NULL)."""
    rows = t
    out = []
    for c in seq:
        col = rows.column(c)
        if col.null_count:
            return None
        lo = pc.min(col)
        out.append(lo.as_py())
        rows = rows.filter(pc.equal(col, lo))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# output rows as references

@dataclass
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


def _prior(fr: _Frame, cut: int) -> tuple[np.ndarray, np.ndarray]:
    """Per key: the last stored position (row, end or remembered delete), and the stored row alive before the
    batch (SCD 1 the key's row, SCD 2 its open version; not at or before `cut`, a truncate; -1: none)."""
    nk = fr.n_keys
    last = np.full(nk, _NO, np.int64)
    alive_row = np.full(nk, _NO, np.int64)
    if fr.st_key is not None:
        np.maximum.at(last, fr.st_key, fr.st_pos)
        if fr.st_end is not None:
            np.maximum.at(last, fr.st_key, fr.st_end)
        open_ = fr.st_end == _NO if fr.st_end is not None else np.ones(len(fr.st_key), dtype=bool)
        cand = np.nonzero(open_ & (fr.st_pos > cut))[0]
        best = np.full(nk, _NO, np.int64)
        np.maximum.at(best, fr.st_key[cand], fr.st_pos[cand])
        hit = cand[fr.st_pos[cand] == best[fr.st_key[cand]]]
        alive_row[fr.st_key[hit]] = hit
    if fr.tb_key is not None:
        tomb = np.full(nk, _NO, np.int64)
        np.maximum.at(tomb, fr.tb_key, fr.tb_pos)
        np.maximum(last, tomb, out=last)
        has = np.nonzero(alive_row != _NO)[0]
        if len(has):
            ended = tomb[has] > fr.st_pos[alive_row[has]]
            alive_row[has[ended]] = _NO
    return last, alive_row


def _sorted_events(fr: _Frame, keep: np.ndarray) -> np.ndarray:
    """The kept event rows sorted by (key, position), a repeated position of a key dropped (the first counts)."""
    rows = np.nonzero(keep)[0]
    order = rows[np.lexsort((fr.ev_pos[rows], fr.ev_key[rows]))]
    if len(order) > 1:
        k, p = fr.ev_key[order], fr.ev_pos[order]
        dup = np.concatenate([[False], (k[1:] == k[:-1]) & (p[1:] == p[:-1])])
        order = order[~dup]
    return order


def _carried_sources(key: np.ndarray, src: np.ndarray, op: np.ndarray, carries: dict[str, np.ndarray],
                     alive_row: np.ndarray, n_events: int) -> dict[str, np.ndarray]:
    """For a sequence of rows sorted by (key, position) -- `src` their event rows (-1: a truncate), `op` 0 upsert
    1 delete -- per carried column the row each row's value comes from: its own, or for an upsert that carries the
    column, the last earlier row of the key that set it (its own after a delete or truncate), or the key's alive
    stored row when nothing earlier in the batch decided it."""
    n = len(src)
    out: dict[str, np.ndarray] = {}
    if n == 0:
        return out
    starts, stops = _group_bounds(key)
    gstart = np.repeat(starts, stops - starts)
    idx = np.arange(n)
    is_ev = src != _NO
    is_del = op == 1
    for col, mask in carries.items():
        m = np.zeros(n, dtype=bool)
        m[is_ev] = mask[src[is_ev]]
        m &= ~is_del
        res = src.copy()
        if m.any():
            last = np.maximum.accumulate(np.where(~m, idx, _NO))
            prev = np.concatenate([[_NO], last[:-1]])
            earlier = m & (prev >= gstart)
            p = prev[earlier]
            res[earlier] = np.where(is_del[p], src[earlier], src[p])
            first = m & (prev < gstart)
            stored = alive_row[key[first]]
            res[first] = np.where(stored != _NO, n_events + stored, src[first])
        out[col] = np.where(is_del, _NO, res)
    return out


def _resolve_scd1(fr: _Frame, refs: _Refs) -> None:
    cut = max(int(fr.stored_tr.max()) if len(fr.stored_tr) else _NO,
              int(fr.batch_tr.max()) if len(fr.batch_tr) else _NO)
    order = _sorted_events(fr, fr.ev_pos > cut)   # changes at or before the last truncate went with it
    if len(order) == 0:
        return
    last, alive_row = _prior(fr, cut)
    keys_sorted = fr.ev_key[order]
    gs, ge = _group_bounds(keys_sorted)
    gkey = keys_sorted[gs]
    pos_sorted = fr.ev_pos[order]
    # stale: every change at or before what is stored -- unless the key's row is older than its remembered delete
    # (the state was written, the table not: a batch retried after failing between the two), which the
    # sequential fold settles
    stale = (pos_sorted[ge - 1] <= last[gkey]) & ~_row_behind_tombstone(fr)[gkey]
    fresh = pos_sorted[gs] > last[gkey]
    moved = _moved_keys(fr)
    if len(moved):
        fresh &= ~np.isin(gkey, moved)
    mixed = ~stale & ~fresh
    fg = np.nonzero(fresh)[0]
    refs.fresh = len(fg)
    if len(fg):
        # the last change of the key decides; its carried values from earlier changes or the stored row
        sel = order[np.repeat(fresh, ge - gs)]
        carried = _carried_sources(fr.ev_key[sel], sel, fr.ev.op[sel], fr.ev.carried, alive_row,
                                   fr.ev.table.num_rows)
        _s, stops = _group_bounds(fr.ev_key[sel])
        at = stops - 1
        lastrow = sel[at]
        op = fr.ev.op[lastrow]
        refs.add(lastrow, np.where(op == 0, lastrow, _NO), {c: v[at] for c, v in carried.items()},
                 fr.ev_pos[lastrow], None, op)
    mg = np.nonzero(mixed)[0]
    if len(mg):
        refs.sequential = len(mg)
        _sequential(fr, refs, gkey[mg], order, gs, ge, gkey)


def _resolve_scd2(fr: _Frame, refs: _Refs) -> None:
    t_stored = int(fr.stored_tr.max()) if len(fr.stored_tr) else _NO
    order = _sorted_events(fr, np.ones(len(fr.ev_pos), dtype=bool))
    last, alive_row = _prior(fr, t_stored)
    keys_sorted = fr.ev_key[order]
    gs, ge = _group_bounds(keys_sorted)
    gkey = keys_sorted[gs]
    prior = np.maximum(last[gkey], t_stored)
    fresh = fr.ev_pos[order][gs] > prior
    if len(fr.batch_tr):
        fresh &= int(fr.batch_tr.min()) > prior
    # stale: every change of the key is at a position the target already holds for it
    width = len(fr.positions) + 1
    seen = np.isin(fr.ev_key[order] * width + fr.ev_pos[order], _held_positions(fr, width))
    stale = np.logical_and.reduceat(seen, gs) & ~fresh
    moved = _moved_keys(fr)
    if len(moved):
        hit = np.isin(gkey, moved)
        fresh &= ~hit
        stale &= ~hit
    mixed = ~stale & ~fresh
    fg = np.nonzero(fresh)[0]
    refs.fresh = len(fg)
    if len(fg):
        _scd2_fresh(fr, refs, order[np.repeat(fresh, ge - gs)], gkey[fg], alive_row)
    mg = np.nonzero(mixed)[0]
    if len(mg):
        refs.sequential = len(mg)
        _sequential(fr, refs, gkey[mg], order, gs, ge, gkey)


def _row_behind_tombstone(fr: _Frame) -> np.ndarray:
    """Per key: it has a stored row older than its latest remembered delete (SCD 1)."""
    behind = np.zeros(fr.n_keys, dtype=bool)
    if fr.st_key is None or fr.tb_key is None:
        return behind
    row = np.full(fr.n_keys, _NO, np.int64)
    np.maximum.at(row, fr.st_key, fr.st_pos)
    tomb = np.full(fr.n_keys, _NO, np.int64)
    np.maximum.at(tomb, fr.tb_key, fr.tb_pos)
    return (row != _NO) & (tomb > row)


def _held_positions(fr: _Frame, width: int) -> np.ndarray:
    """(key, position) pairs the table holds (versions' starts and ends), as key * width + position. Remembered
    deletes do not count: the state is written before the table, so a delete remembered there may still be
    missing from the table (a batch retried after failing between the two)."""
    parts = [np.zeros(0, np.int64)]
    if fr.st_key is not None:
        parts.append(fr.st_key * width + fr.st_pos)
        ends = fr.st_end != _NO
        parts.append(fr.st_key[ends] * width + fr.st_end[ends])
    return np.concatenate(parts)


def _scd2_fresh(fr: _Frame, refs: _Refs, sel: np.ndarray, gkey: np.ndarray, alive_row: np.ndarray) -> None:
    """Fresh keys, SCD 2: each upsert is a version ending at the key's next change; the batch's truncates end
    every version alive at them; the stored open version ends at the key's first change."""
    ne = fr.ev.table.num_rows
    key, pos, op, src = fr.ev_key[sel], fr.ev_pos[sel], fr.ev.op[sel].astype(np.int8), sel.copy()
    if len(fr.batch_tr):
        # each truncate as a delete of every one of these keys (at a change's position it comes first, and the
        # change is then a repeat)
        nt = len(fr.batch_tr)
        key = np.concatenate([key, np.repeat(gkey, nt)])
        pos = np.concatenate([pos, np.tile(fr.batch_tr, len(gkey))])
        op = np.concatenate([op, np.ones(nt * len(gkey), np.int8)])
        src = np.concatenate([src, np.full(nt * len(gkey), _NO, np.int64)])
        prio = np.concatenate([np.ones(len(sel), np.int8), np.zeros(nt * len(gkey), np.int8)])
        o = np.lexsort((prio, pos, key))
        key, pos, op, src = key[o], pos[o], op[o], src[o]
        dup = np.concatenate([[False], (key[1:] == key[:-1]) & (pos[1:] == pos[:-1])])
        key, pos, op, src = key[~dup], pos[~dup], op[~dup], src[~dup]
    starts, stops = _group_bounds(key)
    last_of_key = np.zeros(len(key), dtype=bool)
    last_of_key[stops - 1] = True
    end = np.where(last_of_key, _NO, np.concatenate([pos[1:], [_NO]]))
    carried = _carried_sources(key, src, op, fr.ev.carried, alive_row, ne)
    up = np.nonzero((op == 0) & (src != _NO))[0]
    refs.add(src[up], src[up], {c: v[up] for c, v in carried.items()}, pos[up], end[up], np.zeros(len(up)))
    dels = np.nonzero((op == 1) & (src != _NO))[0]
    refs.add(src[dels], np.full(len(dels), _NO, np.int64), {}, pos[dels], None, np.ones(len(dels)))
    st = alive_row[key[starts]]
    has = st != _NO
    if has.any():
        rows = st[has]
        refs.add(ne + rows, ne + rows, {}, fr.st_pos[rows], pos[starts][has], np.zeros(len(rows)))


# ---------------------------------------------------------------------------------------------------------------
# the sequential path

def _moves(fr: _Frame) -> list[tuple[int, int, int, int]]:
    """Key changes whose postimage carries a column: (old key, new key, preimage position, postimage row), in
    position order."""
    if fr.moves_found is not None:
        return fr.moves_found
    t = fr.ev.table
    found: list[tuple[int, int, int, int]] = []
    carrying = np.zeros(t.num_rows, dtype=bool)
    for mask in fr.ev.carried.values():
        carrying |= mask
    if carrying.any() and {"_commit_lsn", "_seq"} <= set(t.column_names):
        kinds = t.column("_change_type").to_numpy(zero_copy_only=False)
        pre_rows = np.nonzero(kinds == "update_preimage")[0]
        if len(pre_rows):
            lsn = t.column("_commit_lsn").to_numpy(zero_copy_only=False)
            seq = t.column("_seq").to_numpy(zero_copy_only=False)
            post = {(lsn[i], seq[i]): i for i in np.nonzero((kinds == "update_postimage") & carrying)[0]}
            for i in pre_rows:
                j = post.get((lsn[i], seq[i] + 1))
                if j is not None and fr.ev_key[j] != fr.ev_key[i]:
                    found.append((int(fr.ev_key[i]), int(fr.ev_key[j]), int(fr.ev_pos[i]), int(j)))
    found.sort(key=lambda m: m[2])
    fr.moves_found = found
    return found


def _moved_keys(fr: _Frame) -> np.ndarray:
    """Keys of key changes whose postimage carries TOAST values, old and new (resolved sequentially)."""
    if not fr.ev.carried:
        return np.zeros(0, np.int64)
    return np.array(sorted({k for m in _moves(fr) for k in m[:2]}), np.int64)


def _sequential(fr: _Frame, refs: _Refs, keys: np.ndarray, order: np.ndarray, gs: np.ndarray, ge: np.ndarray,
                gkey: np.ndarray) -> None:
    """Resolve `keys` one at a time with :func:`_fold`. Values carried across a key change are filled first, in
    sequence order, from the old key's state just before it."""
    plan = fr.plan
    group_of = {int(k): g for g, k in enumerate(gkey)}
    stored_of: dict[int, list[int]] = {}
    if fr.st_key is not None:
        for i in np.nonzero(np.isin(fr.st_key, keys))[0]:
            stored_of.setdefault(int(fr.st_key[i]), []).append(int(i))
    tombs_of: dict[int, list[int]] = {}
    if fr.tb_key is not None:
        for i in np.nonzero(np.isin(fr.tb_key, keys))[0]:
            tombs_of.setdefault(int(fr.tb_key[i]), []).append(int(i))
    truncates = sorted(int(p) for p in np.concatenate([fr.stored_tr, fr.batch_tr]))
    columns = list(fr.ev.carried)

    def events_of(k: int) -> list[int]:
        g = group_of.get(k)
        return [] if g is None else [int(i) for i in order[gs[g]:ge[g]]]

    fixed: dict[int, dict[str, int]] = {}
    for old, _new, pre_pos, post_row in _moves(fr):
        recs = _records(fr, events_of(old), stored_of.get(old, []), tombs_of.get(old, []), fixed, columns,
                        before=pre_pos)
        state = _fold(recs, [p for p in truncates if p < pre_pos], 1)
        if state and state[0]["op"] == 0:
            values, base = state[0]["values"], state[0]["base"]
            fixed[post_row] = {c: (values.get(c, base) if fr.ev.carried[c][post_row] else post_row)
                               for c in columns}
    for k in keys:
        k = int(k)
        recs = _records(fr, events_of(k), stored_of.get(k, []), tombs_of.get(k, []), fixed, columns)
        key_row = next(r["row"] for r in recs if r["row"] != _NO)
        for row in _fold(recs, truncates, plan.scd):
            if row["changed"]:
                base = row["base"]
                refs.add(np.array([key_row]), np.array([base]),
                         {c: np.array([row["values"].get(c, base)]) for c in columns},
                         np.array([row["start"]]), np.array([row["end"]]), np.array([row["op"]]))


def _records(fr: _Frame, ev_rows: list[int], st_rows: list[int], tb_rows: list[int],
             fixed: dict[int, dict[str, int]], columns: list[str], before: int | None = None) -> list[dict]:
    """A key's timeline entries for :func:`_fold`: stored versions (kind 0), remembered deletes (kind 1) and the
    batch's changes (kind 2) -- positions as ranks, values as row references; only those before `before`."""
    ne = fr.ev.table.num_rows
    limit = np.iinfo(np.int64).max if before is None else before
    recs: list[dict] = []
    for i in st_rows:
        if fr.st_pos[i] < limit:
            end = int(fr.st_end[i]) if fr.st_end is not None else _NO
            recs.append({"kind": 0, "pos": int(fr.st_pos[i]), "row": ne + i, "end": end if end < limit else _NO})
    for i in tb_rows:
        if fr.tb_pos[i] < limit:
            recs.append({"kind": 1, "pos": int(fr.tb_pos[i]), "row": _NO})
    for i in ev_rows:
        if fr.ev_pos[i] < limit:
            recs.append({"kind": 2, "pos": int(fr.ev_pos[i]), "row": i, "op": int(fr.ev.op[i]),
                         "fixed": fixed.get(i),
                         "carry": tuple(c for c in columns if fr.ev.carried[c][i])})
    return recs


def _fold(records: list[dict], truncates: Sequence[int], scd: int) -> list[dict]:
    """The rows to store for one key, by replaying its timeline in position order: the definition the vectorised
    passes follow. Entries at the same position count once (the stored one first: a re-applied change).

    Returns dicts: ``op`` (0 upsert / version, 1 delete), ``start``, ``end`` (position ranks, -1 none), ``base``
    (the row the values come from), ``values`` (carried column -> row), ``changed`` (differs from the target)."""
    timeline: list[tuple[int, int, int, dict]] = []
    stored_starts = set()
    stored_tomb = _NO
    for r in records:
        if r["kind"] == 0:
            timeline.append((r["pos"], 0, 0, r))
            stored_starts.add(r["pos"])
        elif r["kind"] == 1:
            timeline.append((r["pos"], 0, 1, r))
            stored_tomb = max(stored_tomb, r["pos"])
        else:
            timeline.append((r["pos"], 1, r["op"], r))
    ended = {"kind": 3, "row": _NO}
    if scd == 2:
        for r in records:
            if r["kind"] == 0 and r["end"] != _NO and r["end"] not in stored_starts:
                timeline.append((r["end"], 0, 1, ended))
    for p in truncates:
        timeline.append((p, 0, 1, ended))
    timeline.sort(key=lambda t: (t[0], t[1]))
    versions: list[dict] = []
    new_deletes: list[int] = []
    alive: dict | None = None
    last_pos = None
    last_delete = None
    for pos, prio, op, r in timeline:
        if pos == last_pos:
            continue
        last_pos = pos
        if op == 0:
            row = r["row"]
            if r.get("fixed") is not None:
                values = dict(r["fixed"])
            else:
                values = {c: (alive["values"].get(c, alive["base"]) if alive is not None else row)
                          for c in r.get("carry", ())}
            if alive is not None:
                alive["end"] = pos
            alive = {"start": pos, "base": row, "values": values, "end": _NO, "stored": r if prio == 0 else None}
            versions.append(alive)
        else:
            if alive is not None:
                alive["end"] = pos
            alive = None
            last_delete = pos
            if prio == 1:
                new_deletes.append(pos)
    if scd == 1:
        if alive is not None:
            return [{"op": 0, "start": alive["start"], "end": _NO, "base": alive["base"], "values": alive["values"],
                     "changed": alive["stored"] is None}]
        if last_delete is not None:
            return [{"op": 1, "start": last_delete, "end": _NO, "base": _NO, "values": {},
                     "changed": bool(stored_starts) or stored_tomb != last_delete}]
        return []
    out = [{"op": 0, "start": v["start"], "end": v["end"], "base": v["base"], "values": v["values"],
            "changed": v["stored"] is None or v["stored"]["end"] != v["end"]} for v in versions]
    out += [{"op": 1, "start": p, "end": _NO, "base": _NO, "values": {}, "changed": True} for p in new_deletes]
    return out


# ---------------------------------------------------------------------------------------------------------------
# gather

def _gather(fr: _Frame, refs: _Refs, table_cols: Sequence[str], out_types: dict[str, pa.DataType]) -> pa.Table:
    """The output table: one take per column from the batch's and the stored rows, positions from their ranks."""
    plan = fr.plan
    et, rows = fr.ev.table, fr.rows

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    key_row, value_row, start, end = cat(refs.key_row), cat(refs.value_row), cat(refs.start), cat(refs.end)
    op = cat(refs.op)

    def source(col: str) -> pa.Array:
        ev_col = et.column(col) if col in et.column_names else None
        st_col = rows.column(col) if rows is not None and col in rows.column_names else None
        t = out_types.get(col) or (ev_col.type if ev_col is not None else st_col.type if st_col is not None
                                   else pa.null())
        parts = [ev_col.cast(t) if ev_col is not None else pa.nulls(et.num_rows, t)]
        if rows is not None:
            parts.append(st_col.cast(t) if st_col is not None else pa.nulls(rows.num_rows, t))
        return pa.concat_arrays([p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts])

    columns: dict[str, pa.Array] = {}
    for c in table_cols:
        if c in plan.keys:
            columns[c] = _take_or_null(source(c), key_row)
            continue
        idx = value_row
        if any(c in part for part in refs.carried):
            idx = cat([part.get(c, vr) for part, vr in zip(refs.carried, refs.value_row)])
        columns[c] = _take_or_null(source(c), idx)
    pos_cols = plan.seq if plan.scd == 1 else plan.start_cols[:-1]
    for i, c in enumerate(pos_cols):
        columns[c] = _take_or_null(fr.positions.column(i), start)
    if plan.scd == 2:
        columns[plan.start_cols[-1]] = _take_or_null(fr.pos_ts, start)
        for i, c in enumerate(plan.end_cols[:-1]):
            columns[c] = _take_or_null(fr.positions.column(i), end)
        columns[plan.end_cols[-1]] = _take_or_null(fr.pos_ts, end)
    names = list(table_cols) + [c for c in (plan.seq if plan.scd == 1 else plan.start_cols + plan.end_cols)
                                if c not in table_cols]
    kinds = pc.take(pa.array([UPSERT if plan.scd == 1 else VERSION, DELETE]), pa.array(op, pa.int64()))
    return pa.Table.from_arrays([columns[c] for c in names] + [kinds], names=names + [OP])
