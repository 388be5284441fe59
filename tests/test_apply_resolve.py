"""The Arrow resolution behind `apply_changes` (spockwire.spark.resolve, applied to an Arrow-held target) against
the plain-Python replay of tests/apply_oracle.py: random histories with TOAST chains, key changes, updates with a
preimage of their own key, deletes, truncates; replayed, out-of-order and duplicated batches; SCD 1 and SCD 2;
integer, string and composite keys holding NULL; the default position (_commit_lsn, _seq) and a position column of
another type. No Spark: the same code runs on the driver of a Spark job.

Many histories go through one table at once: each history has keys of its own (the key starts with the history,
`h`), its own batch boundaries, its own order of applying them and its own share of TOAST values and same-key
preimages; the histories of one example share the table's key and position columns and their truncates (a
truncate ends every key of the table). Each history is then checked alone against the oracle."""
from __future__ import annotations

import datetime as dt
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spockwire.spark.arrow_target import ArrowTarget, collected_position, keys_in
from spockwire.errors import StaleChangesError
from spockwire.spark.resolve import DEFAULT_SEQUENCE, Stored, first_position, make_plan, resolve, scd2_columns
from tests.apply_oracle import COLUMNS, T0, replay_scd1, replay_scd2, workload

SCHEMA = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                    ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), ("h", pa.int32()),
                    ("id", pa.int32()), ("name", pa.string()), ("doc", pa.string())])
TABLE = ["h", *COLUMNS]
HISTORIES_PER_EXAMPLE = 100
EXAMPLES = 100          # 10,000 histories per SCD type, each batched and ordered its own way
#: how a history's batches are applied (ORDERS: any; IN_STREAM_ORDER: as a stream may bring them again)
ORDERS = ("in order", "replayed", "out of order", "duplicated rows")
IN_STREAM_ORDER = ("in order", "replayed")
#: the table's key: (h, id) integers; (h, id) with id text, one id NULL; (h, ks, kn), text and integer, both with
#: NULLs (id is then a value column, one-to-one with (ks, kn))
KEY_KINDS = ("integers", "text with NULL", "composite with NULL")
#: the table's position: the default, or one text column ordered as (_commit_lsn, _seq)
SEQUENCES = (DEFAULT_SEQUENCE, ("pos",))


def to_arrow(rows: list[dict], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)


def apply_all(batches: list[list[dict]], scd: int, keys=("h", "id"), crash: bool = False, collect: bool = False,
              schema: pa.Schema = SCHEMA, table: list[str] = TABLE, sequence=DEFAULT_SEQUENCE
              ) -> tuple[ArrowTarget, list]:
    """Apply the batches in turn; `crash`: each batch first fails between its state write and its table write
    (the state holds its deletes and truncates, the table not), then is applied again; `collect`: after each
    batch, the state before its first change is collected (the pipeline job's rule: only the current batch can
    come again)."""
    plan = make_plan(schema.names, list(keys), sequence, scd, table)
    target = ArrowTarget(plan)
    resolutions = []
    for rows in batches:
        batch = to_arrow(rows, schema)
        if crash:
            target.apply_state(resolve(batch, plan, target.stored(batch.select(list(keys))), table))
        res = resolve(batch, plan, target.stored(batch.select(list(keys))), table)
        target.apply(res, table)
        resolutions.append(res)
        if collect:
            target.collect(first_position(batch, sequence))
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


def same_key_preimages(txs: list[list[dict]], rnd: random.Random, share: float) -> list[list[dict]]:
    """The transactions with a `share` of their updates (those that keep their key) preceded by a preimage of the
    same key, as PostgreSQL sends them for a table of REPLICA IDENTITY FULL; `_seq` numbered again."""
    out = []
    for rows in txs:
        new: list[dict] = []
        for i, r in enumerate(rows):
            paired = i > 0 and rows[i - 1]["_change_type"] == "update_preimage"
            if r["_change_type"] == "update_postimage" and not paired and rnd.random() < share:
                new.append({**r, "_change_type": "update_preimage", "_unchanged_toast": None, "name": None,
                            "doc": None})
            new.append(dict(r))
        for seq, r in enumerate(new):
            r["_seq"] = seq
        out.append(new)
    return out


def position_text(lsn: int, seq: int) -> str:
    """The text position of SEQUENCES: ordered as (lsn, seq)."""
    return f"{lsn:09d}.{seq:06d}"


def composite_key(i: int | None) -> tuple:
    """(ks, kn) of the id `i` (KEY_KINDS' composite key: one-to-one, NULL in either column for some ids)."""
    if i is None:
        return None, None
    return None if i % 3 == 0 else f"s{i % 3}", None if i // 3 == 1 else i // 3


def keyed(rows: list[dict], key_kind: str, sequence) -> list[dict]:
    """The rows with the key columns of `key_kind` and the position columns of `sequence` (see KEY_KINDS)."""
    out = []
    for r in rows:
        r = dict(r)
        i = r["id"]
        if key_kind == "text with NULL" and i is not None:
            r["id"] = None if i == 1 else f"key {i:03d}"
        elif key_kind == "composite with NULL":
            r["ks"], r["kn"] = composite_key(i)
        if sequence == ("pos",):
            r["pos"] = position_text(r["_commit_lsn"], r["_seq"])
        out.append(r)
    return out


def table_of(key_kind: str, sequence) -> tuple[pa.Schema, tuple, list[str]]:
    """The change schema, the key and the table columns of a key kind and position."""
    schema, keys, table = SCHEMA, ("h", "id"), list(TABLE)
    if key_kind == "text with NULL":
        schema = schema.set(schema.get_field_index("id"), pa.field("id", pa.string()))
    elif key_kind == "composite with NULL":
        schema = schema.append(pa.field("ks", pa.string())).append(pa.field("kn", pa.int64()))
        keys, table = ("h", "ks", "kn"), table + ["ks", "kn"]
    if sequence == ("pos",):
        schema = schema.append(pa.field("pos", pa.string()))
    return schema, keys, table


def shuffled(batches: list[list[dict]], rnd: random.Random) -> list[int]:
    """A random order of the batches (indices) in which a batch carrying an unchanged TOAST value of a key comes
    after every earlier batch touching that key (or, for a key change, the old key), and a key change carrying one
    before every later batch touching the old key: apply.py resolves such a value from the version before it when
    it is applied, which must then be there (its documented limit; SCD 1 keeps a key's latest version only). Any
    other batch may come before earlier ones: later updates, deletes and truncates first, TOAST chains among them."""
    touched = [{r["id"] for r in rows if r["_change_type"] != "truncate"} for rows in batches]
    carried: list[set] = []
    moved_from: list[set] = []
    for rows in batches:
        carried.append(set())
        moved_from.append(set())
        for i, r in enumerate(rows):
            if r["_change_type"] == "update_postimage" and r.get("_unchanged_toast"):
                carried[-1].add(r["id"])
                if i > 0 and rows[i - 1]["_change_type"] == "update_preimage":
                    moved_from[-1].add(rows[i - 1]["id"])
    n = len(batches)
    needs = [{i for i in range(j) if (carried[j] | moved_from[j]) & touched[i]} |
             {i for i in range(j) if moved_from[i] & touched[j]} for j in range(n)]
    order: list[int] = []
    left = list(range(n))
    while left:
        j = rnd.choice([j for j in left if needs[j] <= set(order)])
        order.append(j)
        left.remove(j)
    return order


def schedule(txs: list[list[dict]], rnd: random.Random, how: str, most: int) -> list[list[dict]]:
    """One history's batches as they are applied: its transactions 1 to `most` at a time (the size drawn per
    history), `how` (ORDERS): in order, each once or twice (as Spark retries a micro-batch), out of order, or each
    holding some of its rows twice."""
    size = rnd.randint(1, most)
    batches = [sum(txs[i:i + size], []) for i in range(0, len(txs), size)]
    if how == "replayed":
        return [b for b in batches for _ in range(rnd.randint(1, 2))]
    if how == "out of order":
        return [batches[i] for i in shuffled(batches, rnd)]
    if how == "duplicated rows":
        return [b + rnd.sample(b, k=len(b) // 3) for b in batches]
    return batches


def toast_before_earlier_changes(batches: list[list[dict]]) -> bool:
    """Whether a batch carrying an unchanged TOAST value is applied before a batch of earlier changes."""
    first = [min((r["_commit_lsn"], r["_seq"]) for r in rows) for rows in batches]
    toast = [any(r.get("_unchanged_toast") for r in rows) for rows in batches]
    return any(toast[i] and first[i] > first[j] for i in range(len(batches)) for j in range(i + 1, len(batches)))


def side_by_side(schedules: list[list[list[dict]]]) -> list[list[dict]]:
    """The batches of one table: the i-th holds every history's i-th batch."""
    return [sum((s[i] for s in schedules if i < len(s)), []) for i in range(max(map(len, schedules)))]


def utc(v):
    return v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v


def expected_versions(rows: list[dict], sequence=DEFAULT_SEQUENCE) -> Counter:
    """The oracle's SCD 2 versions of `rows`, their start and end in the columns of `sequence`."""
    out: Counter = Counter()
    for v in replay_scd2(rows):
        values, (slsn, sseq, sts), (elsn, eseq, ets) = v[:len(COLUMNS)], v[-6:-3], v[-3:]
        if sequence == ("pos",):
            start = (position_text(slsn, sseq), sts)
            end = (position_text(elsn, eseq) if elsn is not None else None, ets)
        else:
            start, end = (slsn, sseq, sts), (elsn, eseq, ets)
        out[tuple(utc(x) for x in (*values, *start, *end))] += 1
    return out


def by_history(target: ArrowTarget, scd: int) -> dict[int, Counter]:
    """Per history, its rows: SCD 1 (id, name, doc), SCD 2 those and the validity columns (a multiset: a row
    twice counts twice)."""
    rows = target.table.to_pylist() if target.table is not None else []
    start, end = scd2_columns(target.plan.seq)
    cols = COLUMNS if scd == 1 else (*COLUMNS, *start, *end)
    out: dict[int, Counter] = {}
    for r in rows:
        out.setdefault(r["h"], Counter())[tuple(utc(r[c]) for c in cols)] += 1
    return out


def expected_rows(rows: list[dict], scd: int, sequence=DEFAULT_SEQUENCE) -> Counter:
    """The oracle's rows of one history, as by_history gives them."""
    if scd == 1:
        return Counter(replay_scd1(rows).values())
    return expected_versions(rows, sequence)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**32 - 1), transactions=st.integers(2, 24), most=st.integers(1, 8),
       keys=st.integers(1, 12), truncates=st.lists(st.integers(1, 23), max_size=3),
       mode=st.sampled_from(["mixed orders", "replayed and collected",
                             "retried after a crash between the state and the table"]),
       key_kind=st.sampled_from(KEY_KINDS), sequence=st.sampled_from(SEQUENCES))
def test_resolution_equals_the_replay_of_10000_histories(seed, transactions, most, keys, truncates, mode, key_kind,
                                                         sequence):
    """Mixed orders: each history in order, replayed, out of order (with TOAST values too) or with duplicated
    rows; replayed and collected: each history in order or replayed, the state collected after every batch (the
    replay of the current batch is still possible, and must still be resolved right); retried: the same, each
    batch failing once between the state and the table."""
    rnd = random.Random(seed)
    truncate_at = frozenset(t for t in truncates if t < transactions)
    histories = [workload(rnd.getrandbits(32), transactions, toast=rnd.random() < 0.6, keys=rnd.randint(1, keys),
                          truncate_at=truncate_at) for _ in range(HISTORIES_PER_EXAMPLE)]
    histories = [same_key_preimages(txs, rnd, rnd.choice((0, 0.3))) for txs in histories]
    _one_table(histories)
    histories = [[keyed(rows, key_kind, sequence) for rows in txs] for txs in histories]
    hows = [rnd.choice(ORDERS if mode == "mixed orders" else IN_STREAM_ORDER) for _ in histories]
    combined = side_by_side([schedule(txs, rnd, how, most) for txs, how in zip(histories, hows)])
    schema, key, table = table_of(key_kind, sequence)
    collect = mode != "mixed orders"
    for scd in (1, 2):
        target, _ = apply_all(combined, scd, key, crash=mode.startswith("retried"), collect=collect, schema=schema,
                              table=table, sequence=sequence)
        first = to_arrow(combined[0], schema)
        collected = collected_position(target.state, target.plan)
        if collected is not None and first_position(first, sequence) < collected:
            # a batch from before the collected position cannot arrive from a stream any more: refused
            with pytest.raises(StaleChangesError):
                resolve(first, target.plan, target.stored(first.select(list(key))), table)
        got = by_history(target, scd)
        for h, txs in enumerate(histories):
            expected = expected_rows(sum(txs, []), scd, sequence)
            assert got.get(h, Counter()) == expected, (h, hows[h], mode, key_kind, sequence)


def test_out_of_order_histories_apply_toast_values_before_earlier_changes():
    """A check of the test above: a history out of order applies batches carrying unchanged TOAST values before
    batches of earlier changes (its order is not sorted back)."""
    rnd = random.Random(11)
    hits = sum(toast_before_earlier_changes(schedule(workload(rnd.getrandbits(32), 16, keys=4), rnd, "out of order", 3))
               for _ in range(200))
    assert hits >= 40, hits


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


@pytest.mark.parametrize("seed", range(12))
def test_a_large_batch_resolved_in_parts_by_key_equals_it_resolved_whole(seed, monkeypatch):
    """A batch above resolve.PARALLEL_CHANGES (here: every batch) of a table with one integer key is resolved in
    parts by key, side by side; the same histories as above (TOAST values, deletes, truncates, mixed orders, so
    late changes and tombstones), their key changes left out (a batch holding one is resolved whole), give the
    same rows batch by batch and the same table and state as the batches resolved whole."""
    import spockwire.spark.resolve as resolution

    rnd = random.Random(seed)
    transactions = rnd.randint(8, 20)
    truncate_at = frozenset({transactions - 2})     # batches before it resolve in parts, later ones against it
    histories = [workload(rnd.getrandbits(32), transactions, toast=rnd.random() < 0.6, keys=rnd.randint(1, 12),
                          truncate_at=truncate_at) for _ in range(40)]
    _one_table(histories)
    for txs in histories:
        for rows in txs:
            rows[:] = [{**r, "k": None if r["id"] is None else r["h"] * 100 + r["id"]} for r in rows
                       if r["_change_type"] != "update_preimage"]
    combined = side_by_side([schedule(txs, rnd, rnd.choice(ORDERS), 4) for txs in histories])
    schema = SCHEMA.append(pa.field("k", pa.int64()))
    table = ["k", *TABLE]
    parts: list[int] = []
    split = resolution._resolve_parts

    def counted(p, *a):
        parts.append(len(p))
        return split(p, *a)

    monkeypatch.setattr(resolution, "_resolve_parts", counted)
    for scd in (1, 2):
        parts.clear()
        monkeypatch.setenv("SPOCKWIRE_RESOLVE_THREADS", "1")
        whole, whole_res = apply_all(combined, scd, ("k",), schema=schema, table=table)
        assert not parts
        monkeypatch.setenv("SPOCKWIRE_RESOLVE_THREADS", "3")
        monkeypatch.setattr(resolution, "PARALLEL_CHANGES", 1)
        split_target, split_res = apply_all(combined, scd, ("k",), schema=schema, table=table)
        monkeypatch.setattr(resolution, "PARALLEL_CHANGES", 200_000)
        assert parts and max(parts) > 1, parts
        order = [("k", "ascending")] + [(c, "ascending") for c in whole.plan.bookkeeping() if c != "_op"]
        for a, b in zip(whole_res, split_res):
            assert b.rows.sort_by(order).equals(a.rows.sort_by(order))
            assert (b.keys_touched, b.fresh_keys, b.sequential_keys) == (a.keys_touched, a.fresh_keys,
                                                                         a.sequential_keys)
        assert split_target.table.sort_by(order).equals(whole.table.sort_by(order))
        assert (split_target.state is None) == (whole.state is None)
        if whole.state is not None:
            assert split_target.state.num_rows == whole.state.num_rows


def test_a_large_batch_keyed_beyond_int64_is_resolved_whole(monkeypatch):
    """An unsigned 64-bit key above int64's range cannot be cut into parts by its int64 value: such a batch is
    resolved whole (not refused)."""
    import spockwire.spark.resolve as resolution

    monkeypatch.setattr(resolution, "PARALLEL_CHANGES", 1)
    monkeypatch.setenv("SPOCKWIRE_RESOLVE_THREADS", "2")
    n = 10
    keys = pa.array([2**63 + i for i in range(n)], pa.uint64())
    batch = pa.table({"_change_type": pa.array(["update_postimage"] * n),
                      "_commit_lsn": pa.array(np.arange(n) + 100, pa.int64()), "_seq": pa.array(np.zeros(n, np.int64)),
                      "_commit_ts": pa.array(np.arange(n), pa.timestamp("us", "UTC")), "id": keys,
                      "v": pa.array(np.arange(n))})
    stored = pa.table({"id": keys, "v": pa.array(np.zeros(n, np.int64)), "_commit_lsn": pa.array(np.ones(n, np.int64)),
                       "_seq": pa.array(np.zeros(n, np.int64))})
    plan = make_plan(batch.column_names, ["id"], DEFAULT_SEQUENCE, 1, ["id", "v"])
    res = resolve(batch, plan, Stored(rows=stored), ["id", "v"])
    assert res.rows.sort_by("id").column("v").to_pylist() == list(range(n))


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
