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

The plan, the stored state and steps 1-2 are in resolve_frame.py, step 4 in resolve_sequential.py, the rest here;
every public name is importable from this module.

Values never become Python objects on the vectorised path, and only the control columns do on the sequential one:
every value Arrow holds (an infinite timestamp, a huge decimal) goes through unchanged.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .resolve_frame import (DEFAULT_SEQUENCE, DELETE, OP, UPSERT, VERSION, _NO, Plan, Resolution, Stored, _Events,
                            _Frame, _Refs, _as_int64, _events, _group_bounds, _integer_backed, _sk, _take_or_null,
                            _truncates, make_plan, scd2_columns)
from .resolve_sequential import _moved_keys, _sequential

__all__ = ["Plan", "Stored", "Resolution", "make_plan", "resolve", "scd2_columns", "first_position",
           "DEFAULT_SEQUENCE", "OP", "UPSERT", "DELETE", "VERSION"]


# ---------------------------------------------------------------------------------------------------------------
# resolve

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
    parts = _key_parts(changes, ev, plan, stored, batch_truncates)
    if parts is not None:
        return _resolve_parts(parts, plan, stored, table_cols, out_types or {})
    return _resolve_events(ev, plan, stored, batch_truncates, table_cols, out_types or {})


def _resolve_events(ev: _Events, plan: Plan, stored: Stored, batch_truncates: list, table_cols: Sequence[str],
                    out_types: dict[str, pa.DataType]) -> Resolution:
    fr = _Frame(ev, stored, batch_truncates, plan)
    refs = _Refs()
    touched = int(np.count_nonzero(np.bincount(fr.ev_key, minlength=fr.n_keys))) if len(fr.ev_key) else 0
    if len(fr.ev_key):
        (_resolve_scd1 if plan.scd == 1 else _resolve_scd2)(fr, refs)
    rows = _gather(fr, refs, table_cols, out_types)
    return Resolution(rows, batch_truncates, touched, refs.fresh, refs.sequential)


# ---------------------------------------------------------------------------------------------------------------
# large batches: the keys in parts, resolved side by side

#: a batch of at least this many changes is resolved in parts by key (when it can be: _key_parts)
PARALLEL_CHANGES = 200_000
#: the most parts (threads) a batch is split into
MAX_PARTS = 4


def resolve_parts() -> int:
    """How many parts a large batch is resolved in: the cores this process may run on (SPOCKWIRE_RESOLVE_THREADS
    overrides; 1 resolves every batch whole)."""
    setting = os.environ.get("SPOCKWIRE_RESOLVE_THREADS")
    if setting:
        return max(1, int(setting))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_PARTS, cores))


def _key_parts(changes: pa.Table, ev: _Events, plan: Plan, stored: Stored, batch_truncates: list
               ) -> list[tuple[_Events, Stored]] | None:
    """The batch's events and the stored state split by key into parts that resolve independently, or None to
    resolve it whole. Every key's changes and stored rows land in one part (by the key's integer value modulo
    the parts), so each part is a batch of its own against the same truncates. Only a large batch of a table with
    one integer-backed key, without truncates or key changes (a preimage: its old and new keys may fall in two
    parts), is split."""
    n = resolve_parts()
    if n < 2 or ev.table.num_rows < PARALLEL_CHANGES or len(plan.keys) != 1 or batch_truncates:
        return None
    key = plan.keys[0]
    if pc.any(pc.equal(changes.column("_change_type"), "update_preimage")).as_py():
        return None
    columns = [ev.table.column(key)] + [t.column(key) for t in (stored.rows, stored.tombstones)
                                          if t is not None and t.num_rows]
    if any(not _integer_backed(c.type) or c.null_count or c.type == pa.uint64() for c in columns):
        return None                     # (an unsigned 64-bit value need not fit the int64 the parts are cut by)
    ev_part, *stored_parts = [_part_of(c, n) for c in columns]
    rows = stored.rows if stored.rows is not None and stored.rows.num_rows else None
    tombs = stored.tombstones if stored.tombstones is not None and stored.tombstones.num_rows else None
    row_part = stored_parts.pop(0) if rows is not None else None
    tomb_part = stored_parts.pop(0) if tombs is not None else None
    out = []
    for i in range(n):
        mine = ev_part == i
        if not mine.any():
            continue
        events = _Events(ev.table.filter(pa.array(mine)), ev.op[mine], {c: m[mine] for c, m in ev.carried.items()})
        out.append((events, Stored(_rows_of(rows, row_part, i), _rows_of(tombs, tomb_part, i), stored.truncates,
                                   stored.collected)))
    return out


def _part_of(col: Any, n: int) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return _as_int64(arr).to_numpy() % n


def _rows_of(table: pa.Table | None, part: np.ndarray | None, i: int) -> pa.Table | None:
    return None if table is None or part is None else table.filter(pa.array(part == i))


def _resolve_parts(parts: list[tuple[_Events, Stored]], plan: Plan, stored: Stored, table_cols: Sequence[str],
                   out_types: dict[str, pa.DataType]) -> Resolution:
    """Each part resolved in a thread of its own (the sorts, ranks and gathers run in numpy and Arrow, outside the
    interpreter's lock), their rows concatenated."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="spockwire-resolve") as pool:
        done = list(pool.map(lambda part: _resolve_events(part[0], plan, part[1], [], table_cols, out_types),
                             parts))
    rows = [r.rows for r in done]
    schema = rows[0].schema
    if any(not r.schema.equals(schema) for r in rows[1:]):
        rows = [r.cast(schema) if r.num_rows else schema.empty_table() for r in rows]
    return Resolution(pa.concat_tables(rows), [], sum(r.keys_touched for r in done), sum(r.fresh_keys for r in done),
                      sum(r.sequential_keys for r in done))


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
    if not _each_key_once(t.select(plan.keys)):
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


def _each_key_once(keys: pa.Table) -> bool:
    """No two rows of `keys` hold the same key (NULLs equal, as in a grouping). A snapshot's rows come in key order
    as a rule: an integer key without NULLs is checked for that first, in one pass (then sorted)."""
    if keys.num_columns > 1:
        return keys.group_by(keys.column_names).aggregate([]).num_rows == keys.num_rows
    col = keys.column(0)
    if col.null_count > 1:
        return False
    if col.null_count == 0 and pa.types.is_integer(col.type):
        values = col.to_numpy()
        if (values[1:] > values[:-1]).all():
            return True
        values = np.sort(values)
        return not (values[1:] == values[:-1]).any()
    return pc.count_distinct(col, mode="all").as_py() == keys.num_rows


def _repeat(text: str, n: int) -> pa.Array:
    return pa.array([text], pa.string()).take(pa.array(np.zeros(n, np.int32)))


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


def first_position(t: pa.Table, seq: Sequence[str] = DEFAULT_SEQUENCE) -> tuple | None:
    """The smallest sequence tuple of `t`'s rows (None when it has none, or a sequence value is NULL)."""
    return _first_position(t, seq) if t.num_rows else None


def _first_position(t: pa.Table, seq: Sequence[str]) -> tuple | None:
    """The smallest sequence tuple of `t` (None when a sequence value is NULL)."""
    rows = t.select(list(seq))
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
# the vectorised path

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
    if len(rows) < 2:
        return rows
    key, pos = fr.ev_key[rows], fr.ev_pos[rows]
    width = int(pos.max()) + 1
    if (int(key.max()) + 1) * width < 1 << 62:
        # ranks packed into one int64 each: one unstable sort, then of each repeated (key, position) its first row
        packed = key * width + pos
        at = np.argsort(packed)
        packed, order = packed[at], rows[at]
        new = np.concatenate([[True], packed[1:] != packed[:-1]])
        return order if new.all() else np.minimum.reduceat(order, np.flatnonzero(new))
    order = rows[np.lexsort((pos, key))]
    k, p = fr.ev_key[order], fr.ev_pos[order]
    dup = np.concatenate([[False], (k[1:] == k[:-1]) & (p[1:] == p[:-1])])
    return order[~dup]


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
    # stale: every change of the key is at a position the target already holds for it (looked up only for the
    # keys that are not fresh: a fresh key is not stale)
    width = len(fr.positions) + 1
    seen = np.zeros(len(order), dtype=bool)
    maybe = np.repeat(~fresh, ge - gs)
    if maybe.any():
        o = order[maybe]
        seen[maybe] = np.isin(fr.ev_key[o] * width + fr.ev_pos[o], _held_positions(fr, width))
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
