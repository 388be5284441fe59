"""The Arrow resolution behind `apply_changes` (spockwire.spark.resolve, applied to an Arrow-held target) against
the plain-Python replay of tests/apply_oracle.py: random histories with TOAST chains, key changes, deletes,
truncates, replayed batches and out-of-order batches, SCD 1 and SCD 2. No Spark: the same code runs on the
driver of a Spark job.

Many histories go through one table at once: each history has keys of its own (the key is (history, id)), and the
histories of one example share their truncates (a truncate ends every key of the table), their batch boundaries
and the order the batches are applied in. Each history is then checked alone against the oracle."""
from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spockwire.spark.arrow_target import ArrowTarget, keys_in
from spockwire.errors import StaleChangesError
from spockwire.spark.resolve import DEFAULT_SEQUENCE, Stored, first_position, make_plan, resolve, scd2_columns
from tests.apply_oracle import COLUMNS, T0, replay_scd1, replay_scd2, workload

SCHEMA = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                    ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), ("h", pa.int32()),
                    ("id", pa.int32()), ("name", pa.string()), ("doc", pa.string())])
TABLE = ["h", *COLUMNS]
HISTORIES_PER_EXAMPLE = 100
EXAMPLES = 100          # 10,000 histories per SCD type


def to_arrow(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in SCHEMA} for r in rows], schema=SCHEMA)


def apply_all(batches: list[list[dict]], scd: int, keys=("h", "id"), crash: bool = False, collect: bool = False
              ) -> tuple[ArrowTarget, list]:
    """Apply the batches in turn; `crash`: each batch first fails between its state write and its table write
    (the state holds its deletes and truncates, the table not), then is applied again; `collect`: after each
    batch, the state before its first change is collected (the pipeline job's rule: only the current batch can
    come again)."""
    plan = make_plan(SCHEMA.names, list(keys), DEFAULT_SEQUENCE, scd, TABLE)
    target = ArrowTarget(plan)
    resolutions = []
    for rows in batches:
        batch = to_arrow(rows)
        if crash:
            target.apply_state(resolve(batch, plan, target.stored(batch.select(list(keys))), TABLE))
        res = resolve(batch, plan, target.stored(batch.select(list(keys))), TABLE)
        target.apply(res, TABLE)
        resolutions.append(res)
        if collect:
            target.collect(first_position(batch))
    return target, resolutions


def _one_table(histories: list[list[list[dict]]]) -> None:
    """Make the histories' transactions one transaction each: history h's rows follow those of the histories
    before it (its `_seq` shifted, its order kept), so every change of a transaction has a position of its own;
    the truncates (alone in their transactions, at the same place in every history) stay shared. The key column
    `h` names the history."""
    for t in range(len(histories[0])):
        offset = 0
        for h, txs in enumerate(histories):
            rows = [r for r in txs[t] if r["_change_type"] != "truncate"]
            for r in rows:
                r["h"] = h
                r["_seq"] += offset
            offset += len(rows)


def utc(v):
    return v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v


def by_history(target: ArrowTarget, scd: int) -> dict[int, object]:
    rows = target.table.to_pylist() if target.table is not None else []
    out: dict[int, object] = {}
    if scd == 1:
        for r in rows:
            out.setdefault(r["h"], {})[r["id"]] = tuple(r[c] for c in COLUMNS)
    else:
        start, end = scd2_columns()
        for r in rows:
            out.setdefault(r["h"], set()).add(tuple(utc(r[c]) for c in (*COLUMNS, *start, *end)))
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**32 - 1), transactions=st.integers(2, 24), batch=st.integers(1, 8),
       toast=st.booleans(), keys=st.integers(1, 12), truncates=st.lists(st.integers(1, 23), max_size=3),
       mode=st.sampled_from(["in order", "replayed", "out of order", "duplicated rows",
                             "retried after a crash between the state and the table"]))
def test_resolution_equals_the_replay_of_10000_histories(seed, transactions, batch, toast, keys, truncates, mode):
    rnd = random.Random(seed)
    truncate_at = frozenset(t for t in truncates if t < transactions)
    histories = [workload(rnd.getrandbits(32), transactions, toast=toast, keys=rnd.randint(1, keys),
                          truncate_at=truncate_at) for _ in range(HISTORIES_PER_EXAMPLE)]
    _one_table(histories)
    histories = [[sum(txs[i:i + batch], []) for i in range(0, transactions, batch)] for txs in histories]
    order = list(range(len(histories[0])))
    if mode == "replayed":          # each batch once or twice, as Spark retries a micro-batch
        order = [i for i in order for _ in range(rnd.randint(1, 2))]
    elif mode == "out of order":    # later changes before earlier ones (without TOAST values: see apply.py)
        rnd.shuffle(order)
        if toast:
            order = sorted(order)
    combined = [sum((hist[i] for hist in histories), []) for i in order]
    if mode == "duplicated rows":   # a batch holding some of its rows twice
        combined = [rows + rnd.sample(rows, k=len(rows) // 3) for rows in combined]
    kinds = {r["_change_type"] for rows in combined for r in rows}
    # replayed batches and crashes with the state collected after every batch (the replay of the current batch
    # is still possible, and must still be resolved right); in order and duplicated rows without
    collect = mode == "replayed" or mode.startswith("retried")
    for scd in (1, 2):
        target, _ = apply_all(combined, scd, crash=mode.startswith("retried"), collect=collect)
        if collect and target.state is not None and order[-1] != order[0]:
            # a batch from before the collected position cannot arrive from a stream any more: refused
            first = to_arrow(combined[0])
            with pytest.raises(StaleChangesError):
                resolve(first, target.plan, target.stored(first.select(["h", "id"])), TABLE)
        got = by_history(target, scd)
        for h, hist in enumerate(histories):
            everything = sum(hist, [])
            if scd == 1:
                expected = replay_scd1(everything)
                assert got.get(h, {}) == expected, (h, mode, kinds)
            else:
                expected = {tuple(utc(v) for v in t) for t in replay_scd2(everything)}
                assert got.get(h, set()) == expected, (h, mode, kinds)


def test_the_histories_reach_every_path():
    """The random histories above take both resolution paths and every kind of change (a check of the test)."""
    rnd = random.Random(5)
    fresh = sequential = 0
    kinds = set()
    state_rows = {False: 0, True: 0}
    for i in range(20):
        txs = workload(rnd.getrandbits(32), 16, keys=4, truncate_at=frozenset({9}))
        _one_table([txs])
        batches = [sum(txs[i:i + 3], []) for i in range(0, 16, 3)]
        kinds |= {r["_change_type"] for rows in batches for r in rows}
        replayed = [b for b in batches for _ in range(2)]
        for scd in (1, 2):
            _, resolutions = apply_all(replayed, scd)
            fresh += sum(r.fresh_keys for r in resolutions)
            sequential += sum(r.sequential_keys for r in resolutions)
            if i < 5:   # the collection removes state rows (a collected target keeps its mark and the last batch's)
                for collect in (False, True):
                    target, _ = apply_all(replayed, scd, collect=collect)
                    state_rows[collect] += target.state.num_rows if target.state is not None else 0
    assert kinds == {"insert", "update_preimage", "update_postimage", "delete", "truncate"}
    assert fresh > 100 and sequential > 20
    assert state_rows[True] < state_rows[False] / 2, state_rows


def _bulk(n: int, kind: str = "insert", lsn: int = 10, first_id: int = 0) -> pa.Table:
    ids = np.arange(first_id, first_id + n, dtype=np.int32)
    return pa.table({"_change_type": pa.array([kind] * n), "_commit_lsn": pa.array(np.full(n, lsn, np.int64)),
                     "_commit_ts": pa.array([T0] * n, pa.timestamp("us", tz="UTC")), "_xid": pa.nulls(n, pa.int64()),
                     "_seq": pa.array(np.arange(n, dtype=np.int64)), "_origin": pa.nulls(n, pa.string()),
                     "_unchanged_toast": pa.nulls(n, pa.list_(pa.string())), "h": pa.array(np.zeros(n, np.int32)),
                     "id": pa.array(ids), "name": pa.array([f"n{i}" for i in ids]), "doc": pa.nulls(n, pa.string())},
                    schema=SCHEMA)


@pytest.mark.parametrize("scd", [1, 2])
def test_a_batch_of_new_keys_is_written_as_it_is(scd):
    """Inserts of keys the target does not hold, each key once, after every truncate: the rows as they came, in
    their order (what a snapshot and an insert-only stream are; Delta appends them)."""
    plan = make_plan(SCHEMA.names, ["id"], DEFAULT_SEQUENCE, scd, TABLE)
    batch = _bulk(1000)
    res = resolve(batch, plan, Stored(truncates=[((5, 0), T0)]), TABLE)
    assert res.rows.column("id").to_pylist() == list(range(1000))
    assert res.fresh_keys == 1000 and res.sequential_keys == 0
    # keys out of order are each still there once: the same (a key order is checked first, then every key)
    backwards = batch.take(pa.array(np.arange(999, -1, -1)))
    assert resolve(backwards, plan, Stored(), TABLE).rows.column("id").to_pylist() == list(range(999, -1, -1))
    # a key twice, or a truncate after the first change: resolved the ordinary way, with the same rules
    twice = pa.concat_tables([batch, _bulk(1, lsn=11)])
    res = resolve(twice, plan, Stored(), TABLE)
    key0 = res.rows.filter(pa.compute.equal(res.rows.column("id"), 0)).to_pylist()
    if scd == 1:
        assert res.rows.num_rows == 1000 and key0[0]["_commit_lsn"] == 11
    else:
        assert res.rows.num_rows == 1001 and sorted(r["_start_commit_lsn"] for r in key0) == [10, 11]


def test_late_changes_between_stored_ones_are_resolved_one_key_at_a_time():
    """A key whose stored row is newer than some of the batch's changes and older than others: the sequential
    path, which keeps the newest; a key whose changes are all older than its stored row: nothing to write."""
    plan = make_plan(SCHEMA.names, ["id"], DEFAULT_SEQUENCE, 1, TABLE)
    target = ArrowTarget(plan)
    first = _bulk(3, lsn=20)
    target.apply(resolve(first, plan, target.stored(first.select(["id"])), TABLE), TABLE)
    late = pa.concat_tables([_bulk(1, "update_postimage", lsn=15),               # older than key 0's row
                             _bulk(2, "update_postimage", lsn=15, first_id=1).slice(1),   # key 2: older
                             _bulk(1, "update_postimage", lsn=25, first_id=2)])  # key 2: newer
    res = resolve(late, plan, target.stored(late.select(["id"])), TABLE)
    assert res.sequential_keys == 1 and res.fresh_keys == 0
    assert [(r["id"], r["_commit_lsn"]) for r in res.rows.to_pylist()] == [(2, 25)]


@settings(max_examples=300, deadline=None)
@given(stored=st.lists(st.one_of(st.none(), st.integers(-5, 40)), max_size=60),
       wanted=st.lists(st.one_of(st.none(), st.integers(-5, 40)), max_size=60),
       typ=st.sampled_from([pa.int32(), pa.int64(), pa.uint8()]), chunks=st.integers(1, 3))
def test_rows_whose_key_is_wanted_as_a_set_says(stored, wanted, typ, chunks):
    """keys_in: the rows of a table whose key is among another table's keys, NULL matching NULL; integer keys
    without NULLs by a binary search, the others by Arrow's hash set, with the same answers."""
    if typ == pa.uint8():
        stored = [None if v is None else abs(v) for v in stored]
        wanted = [None if v is None else abs(v) for v in wanted]
    step = max(1, -(-len(stored) // chunks))
    column = pa.chunked_array([pa.array(stored[i:i + step], typ) for i in range(0, len(stored), step)] or
                              [pa.array([], typ)])
    table = pa.table({"id": column})
    want = set(wanted)
    expected = [v in want for v in stored]
    got = keys_in(table, ["id"], pa.table({"id": pa.array(wanted, pa.int64())}))
    assert got.dtype == bool and got.tolist() == expected
