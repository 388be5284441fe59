"""Every valid value lands in Delta: ±infinity dates and timestamps, years before 1 AD and after 9999, NaN and
±Infinity floats and numerics, huge TOASTed values, empty arrays and arrays holding NULLs.

* Generated change histories (tests/apply_oracle.py's workload, its values drawn by tests/test_typed_values.py's
  typed generator and decoded by the decoder) go through `apply_changes` into Delta through delta-rs, SCD 1 and 2,
  plain tables (files spockwire writes itself) and change-data-feed tables (delta-rs's MERGE), keyed by an integer
  or by a column of such values; the tables equal the oracle's replay (NaN equal to NaN), before and after the
  state's collection and OPTIMIZE / Z-order; every data file's statistics are readable and bound its values (a
  column they cannot bound has none), and filtered reads on those columns give the oracle's rows.
* A live table holding these values, snapshotted and streamed by the pipeline job with its maintenance, lands
  exactly as PostgreSQL holds it.
"""
from __future__ import annotations

import datetime as dt
import math
import os
import random
import time
from decimal import Decimal
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spockwire.python_objects import to_pylist
from spockwire.spark.apply import apply_changes, target_path
from spockwire.spark.delta_target import STATE_DIR
from spockwire.spark.maintenance import collect_state, optimize
from spockwire.spark.resolve import first_position, scd2_columns
from tests.delta_check import checked_table
from tests.spark_session import spark_session
from tests.apply_oracle import replay_scd1, replay_scd2, ts_of, workload
from tests import pg_send as S
from tests.test_typed_values import (CASE_BY_NAME, SCALAR_TYPES, BinType, Case, _canon, _date_expect, _decode_frames,
                                     _storage, _stream, _ts_expect, array_type, assert_matches_server, numeric_type,
                                     server_expected)

UTC = dt.timezone.utc
EXAMPLES = 40

# ---------------------------------------------------------------------------------------------------------------
# generated histories through apply_changes

#: the typed generator's types a Delta table holds (no time, interval, uuid or oid columns in Delta), those of
#: awkward values first
DELTA_TYPES = ("date", "timestamptz", "float8", "timestamp", "float4", "text", "bytea", "json", "bool", "int2",
               "int4", "int8")
_BY_NAME = {t.name: t for t in SCALAR_TYPES}
KEY_TYPES = ("date", "timestamptz", "float8", "timestamp", "text", "int4")
CHANGE_TYPES = {"_change_type": pa.string(), "_commit_ts": pa.timestamp("us", tz="UTC"), "_xid": pa.int64(),
                "_seq": pa.int64(), "_origin": pa.string(), "_unchanged_toast": pa.list_(pa.string())}

_DAY0 = -S.PG_EPOCH_DAYS                   # 1970-01-01 in PostgreSQL's days (since 2000-01-01)
_YEAR1, _YEAR10000 = _DAY0 - 719_162, _DAY0 + 2_932_897
_US = 86_400_000_000
#: values drawn beside the generator's own, as the values it draws (PostgreSQL's days and microseconds since 2000):
#: ±infinity, the first and last days PostgreSQL holds, both sides of years 1 and 9999, extreme floats, strings
#: past the statistics' prefix and beyond U+FFFF
EDGES = {
    "date": [S.INT32_MIN, S.INT32_MAX, S.DATE_MIN, S.DATE_MAX, _YEAR1 - 1, _YEAR1, _YEAR10000 - 1, _YEAR10000],
    "timestamp": [S.INT64_MIN, S.INT64_MAX, S.TS_MIN, _YEAR1 * _US - 1, _YEAR1 * _US, _YEAR10000 * _US - 1,
                  _YEAR10000 * _US, 1],
    "float8": [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308],
    "float4": [math.nan, math.inf, -math.inf, -0.0, 3.4028234663852886e38],
    "text": ["", "🎉", "a" * 70, "\U0010ffff" * 70, "ü" * 65 + "z"],
    "bytea": [b"", bytes(range(256))],
}
EDGES["timestamptz"] = EDGES["timestamp"]
_ENCODE = {"date": (S.date_send, _date_expect), "timestamp": (S.timestamp_send, _ts_expect),
           "timestamptz": (S.timestamp_send, _ts_expect), "float8": (S.float8_send, lambda v: v),
           "float4": (S.float4_send, lambda v: v), "text": (S.text_send, lambda v: v),
           "bytea": (S.bytea_send, lambda v: v)}


def awkward(t: BinType) -> BinType:
    """The generator's type `t`, its values drawn from the edges above as often as from its own."""
    if t.name not in EDGES:
        return t
    send, expect = _ENCODE[t.name]
    edges = st.sampled_from(EDGES[t.name]).map(lambda v: (send(v), expect(v)))
    return BinType(t.name, t.oid, t.typmod, t.arrow, edges | t.values)


def _delta_array_type(t: BinType) -> bool:
    return t.name[:-2] in DELTA_TYPES or t.name.startswith("numeric")


def _key_identity(value: Any) -> Any:
    """Keys PostgreSQL holds as one: NaN equals NaN, -0 equals 0."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    return value


@st.composite
def typed_history(draw) -> dict:
    """A table (a key column, value columns of awkward types) and the pools its changes take values from."""
    def typed(kind: str) -> BinType:
        if kind == "numeric":
            return draw(numeric_type())
        if kind == "array":
            return draw(array_type().filter(_delta_array_type))
        return awkward(_BY_NAME[kind])

    value_types = [typed(k) for k in draw(st.lists(st.sampled_from(DELTA_TYPES + ("numeric", "array")),
                                                   min_size=1, max_size=4))]
    n_keys = draw(st.integers(1, 10))
    key_type = typed(draw(st.sampled_from(KEY_TYPES + ("numeric",))))
    keys = draw(st.lists(key_type.values, min_size=n_keys, max_size=n_keys, unique_by=lambda v: _key_identity(v[1])))
    pool = draw(st.lists(st.tuples(*[st.none() | t.values for t in value_types]).map(list), min_size=1, max_size=8))
    return {"value_types": value_types, "key_type": key_type, "keys": keys, "n_keys": n_keys, "pool": pool,
            "seed": draw(st.integers(0, 2**32 - 1)), "transactions": draw(st.integers(2, 12)),
            "batch": draw(st.integers(1, 4)), "truncate": draw(st.none() | st.integers(1, 11)),
            "lsn_type": draw(st.sampled_from([pa.int64(), pa.uint64()])),
            "table": draw(st.sampled_from(["plain", "change data feed"])),
            "replayed": draw(st.booleans())}


class History:
    """A generated history as change tables of decoded values, and the oracle's final state in the same values."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        types = spec["value_types"]
        self.values = [f"v{i}" for i in range(len(types))]
        pool = _decode_frames("c", _stream(types, spec["pool"]))
        self.pool = [pool.column(pool.schema.get_field_index(f"c{i}")) for i in range(len(types))]
        self.key = "k"
        keys = _decode_frames("c", _stream([spec["key_type"]], [[v] for v in spec["keys"]]))
        self.key_values = keys.column(keys.schema.get_field_index("c0"))
        self.names: dict[str, int] = {}
        truncate = spec["truncate"]
        txs = workload(spec["seed"], spec["transactions"], keys=spec["n_keys"],
                       truncate_at=frozenset({truncate} if truncate is not None and truncate < spec["transactions"]
                                             else ()))
        self.rows = [r for tx in txs for r in tx]
        self.batches = [sum(txs[i:i + spec["batch"]], []) for i in range(0, len(txs), spec["batch"])]

    def _value(self, text: str | None) -> int | None:
        """A workload's value (a name or doc text) as a row of the pool."""
        if text is None:
            return None
        return self.names.setdefault(text, len(self.names)) % len(self.pool[0])

    def _columns(self, ids: list, names: list, docs: list) -> dict[str, pa.Array]:
        """The table's columns: the key of each id, the first value column from the doc (the one PostgreSQL may
        leave out as unchanged TOAST), the others from the name."""
        key_at = pa.array([None if i is None else i - 1 for i in ids], pa.int64())
        cols = {self.key: self.key_values.take(key_at)}
        for j, col in enumerate(self.pool):
            at = pa.array([self._value(t) for t in (docs if j == 0 else names)], pa.int64())
            cols[self.values[j]] = col.take(at)
        return cols

    def changes(self, rows: list[dict]) -> pa.Table:
        """The change rows of the workload's `rows`, as the decoder gives them (LSNs as the spec's type)."""
        types = dict(CHANGE_TYPES, _commit_lsn=self.spec["lsn_type"])
        cols = {c: pa.array([r[c] for r in rows], types[c]) for c in
                ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin")}
        cols["_unchanged_toast"] = pa.array([None if r["_unchanged_toast"] is None else [self.values[0]]
                                             for r in rows], types["_unchanged_toast"])
        cols.update(self._columns([r["id"] for r in rows], [r["name"] for r in rows], [r["doc"] for r in rows]))
        return pa.table(cols)

    def expected(self, scd: int) -> pa.Table:
        """The oracle's final table in the table's columns (SCD 2: with the validity columns)."""
        if scd == 1:
            final = list(replay_scd1(self.rows).values())
            return pa.table(self._columns([r[0] for r in final], [r[1] for r in final], [r[2] for r in final]))
        final = sorted(replay_scd2(self.rows), key=repr)
        table = self._columns([r[0] for r in final], [r[1] for r in final], [r[2] for r in final])
        start, end = scd2_columns()
        for i, c in enumerate(start + end):
            table[c] = pa.array([r[3 + i] for r in final], pa.timestamp("us", tz="UTC") if i % 3 == 2 else pa.int64())
        return pa.table(table)


def _canonical(table: pa.Table, columns: list[str]) -> list[tuple]:
    """The rows of `table` in `columns`, as comparable values (dates and timestamps as their day and microsecond
    counts, NaN equal to NaN, -0.0 apart from 0.0), sorted."""
    cols = [_canon(_storage(table.column(c).combine_chunks())) for c in columns]
    return sorted((tuple(r) for r in zip(*cols)), key=repr)


def _read(path: str, expected: pa.Table, filters: Any = None) -> pa.Table:
    """The Delta table's rows in the columns and types of `expected`."""
    got = checked_table(path) if filters is None else deltalake.DeltaTable(path).to_pyarrow_table(filters=filters)
    return pa.table([got.column(f.name).cast(f.type) for f in expected.schema], schema=expected.schema)


def assert_stats_bound_the_files(path: str) -> None:
    """Every data file's statistics are readable, and each min/max (where given) bounds the file's values: no
    value below or above it (a timestamp's max to the millisecond), no NaN beside it; each nullCount is the
    file's."""
    table = deltalake.DeltaTable(path)
    adds = pa.table(table.get_add_actions(flatten=True))
    for i in range(adds.num_rows):
        data = pq.read_table(os.path.join(path, adds.column("path")[i].as_py()))
        for c in data.column_names:
            values = data.column(c)
            if f"null_count.{c}" in adds.column_names and adds.column(f"null_count.{c}")[i].is_valid:
                assert adds.column(f"null_count.{c}")[i].as_py() == values.null_count, (path, c)
            if f"min.{c}" not in adds.column_names:
                continue
            lo, hi = adds.column(f"min.{c}")[i], adds.column(f"max.{c}")[i]
            if not (lo.is_valid or hi.is_valid):
                continue
            assert lo.is_valid and hi.is_valid, (path, c)
            if pa.types.is_floating(values.type):
                assert not pc.any(pc.is_nan(values)).as_py(), (path, c, "bounds beside a NaN")
            if pa.types.is_timestamp(values.type):
                # Delta's convention: a timestamp's max may be cut to the millisecond (readers widen it by one)
                values = pc.floor_temporal(values, unit="millisecond")
            assert not pc.any(pc.less(values, lo.cast(values.type))).as_py(), (path, c, lo)
            assert not pc.any(pc.greater(values, hi.cast(values.type))).as_py(), (path, c, hi)


#: per column type, a value to filter by (rows above it: a range the file statistics prune on)
def _pivot(t: pa.DataType) -> Any:
    if pa.types.is_date32(t):
        return dt.date(1970, 1, 1)
    if pa.types.is_timestamp(t):
        return dt.datetime(1970, 1, 1, tzinfo=UTC if t.tz else None)
    if pa.types.is_floating(t):
        return 0.0
    if pa.types.is_integer(t):
        return 0
    if pa.types.is_string(t):
        return "m"
    return None


def assert_filtered_reads(path: str, expected: pa.Table, columns: list[str], compared: list[str]) -> None:
    """Reads filtered on `columns` (a range, and one value the column holds) give the oracle's rows."""
    for c in columns:
        t = expected.schema.field(c).type
        pivot = _pivot(t)
        if pivot is None:
            continue
        want = expected.filter(pc.fill_null(pc.greater(expected.column(c), pa.scalar(pivot).cast(t)), False))
        got = _read(path, expected, filters=[(c, ">", pivot)])
        assert _canonical(got, compared) == _canonical(want, compared), (c, ">", pivot)
        value = _exact_value(expected.column(c))
        if value is not None:
            want = expected.filter(pc.fill_null(pc.equal(expected.column(c), pa.scalar(value).cast(t)), False))
            got = _read(path, expected, filters=[(c, "=", value)])
            assert _canonical(got, compared) == _canonical(want, compared), (c, "=", value)


def _exact_value(col: Any) -> Any:
    """A value of the column that Python holds as it is (not NaN, ±infinity or a year outside 1 to 9999), or
    None."""
    t = col.type
    for v in _storage(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col):
        if v is None or isinstance(v, float) and not math.isfinite(v):
            continue
        if not (pa.types.is_date32(t) or pa.types.is_timestamp(t)):
            return v
        try:
            return pa.scalar(v, pa.int32() if pa.types.is_date32(t) else pa.int64()).cast(t).as_py()
        except (ValueError, OverflowError):
            continue
    return None


def _apply_history(history: History, path: str, scd: int) -> None:
    keys = [history.key]
    for i, rows in enumerate(history.batches):
        batch = history.changes(rows)
        for _ in range(2 if history.spec["replayed"] else 1):
            apply_changes(batch, path, format="delta", engine="delta-rs", keys=keys, stored_as_scd_type=scd)
        if i == 0 and history.spec["table"] == "change data feed":
            # not rewritable by spockwire: its batches are merged by delta-rs
            deltalake.DeltaTable(path).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(typed_history())
def test_awkward_values_land_exactly_through_apply_changes(tmp_path_factory, spec):
    history = History(spec)
    for scd in (1, 2):
        path = str(tmp_path_factory.mktemp(f"scd{scd}"))
        _apply_history(history, path, scd)
        expected = history.expected(scd)
        compared = expected.column_names
        assert _canonical(_read(path, expected), compared) == _canonical(expected, compared)
        # the state's collection (before the last batch's first change) and OPTIMIZE keep every row
        collect_state(path, first_position(history.changes(history.batches[-1])))
        optimize(path, [history.key], zorder=True)
        if os.path.isdir(os.path.join(path, STATE_DIR)):
            optimize(os.path.join(path, STATE_DIR), zorder=False)
            assert_stats_bound_the_files(os.path.join(path, STATE_DIR))
        assert _canonical(_read(path, expected), compared) == _canonical(expected, compared)
        assert_stats_bound_the_files(path)
        assert_filtered_reads(path, expected, [history.key, *history.values], compared)


def _toasted_history() -> list[list[dict]]:
    """Transactions of a table whose values PostgreSQL TOASTs (a 5 MB text `doc`, a 2 MB bytea `name`): inserts,
    updates leaving both unchanged (not sent), a new value, a key change carrying them, a delete, as
    tests/apply_oracle.py's rows."""
    big_text = "é" + "x" * (5 << 20) + "🎉"
    other_text = "y" * (5 << 20)
    big_bytes = bytes(range(256)) * (2 << 12)
    txs: list[list[dict]] = []

    def tx(*changes: tuple) -> None:
        lsn = 100 * (len(txs) + 1)
        txs.append([{"_change_type": kind, "_commit_lsn": lsn, "_commit_ts": ts_of(lsn), "_xid": len(txs) + 1,
                     "_seq": seq, "_origin": None, "_unchanged_toast": toast, "id": rid, "name": name, "doc": doc}
                    for seq, (kind, rid, name, doc, toast) in enumerate(changes)])

    tx(("insert", 1, big_bytes, big_text, None), ("insert", 2, b"", "", None))
    tx(("update_postimage", 1, None, None, ["name", "doc"]), ("update_postimage", 2, big_bytes, other_text, None))
    tx(("update_preimage", 1, None, None, None), ("update_postimage", 3, None, None, ["name", "doc"]),
       ("delete", 2, None, None, None))
    tx(("update_postimage", 3, None, other_text, ["name"]))
    return txs


@pytest.mark.parametrize("scd", [1, 2])
def test_huge_toasted_values_land_and_stay_out_of_the_statistics(tmp_path, scd):
    """5 MB texts and 2 MB byteas, carried as unchanged TOAST across updates and a key change, land exactly; the
    statistics bound the text by a short prefix (the log stays small) and a filtered read on it finds the rows."""
    txs = _toasted_history()
    schema = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                        ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                        ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), ("id", pa.int32()),
                        ("name", pa.binary()), ("doc", pa.string())])
    path = str(tmp_path / "t")
    for rows in txs:
        apply_changes(pa.Table.from_pylist(rows, schema=schema), path, format="delta", engine="delta-rs",
                      keys=["id"], stored_as_scd_type=scd)
    rows = [r for t in txs for r in t]
    table = checked_table(path)
    if scd == 1:
        got = {r["id"]: (r["id"], r["name"], r["doc"]) for r in table.to_pylist()}
        assert got == replay_scd1(rows) and len(got) == 1
    else:
        start, end = scd2_columns()
        got = {tuple(r[c] for c in ("id", "name", "doc", *start, *end)) for r in table.to_pylist()}
        assert got == replay_scd2(rows) and len(got) == 6
    log = os.path.join(path, "_delta_log")
    assert max(os.path.getsize(os.path.join(log, f)) for f in os.listdir(log) if f.endswith(".json")) < 8192
    assert_stats_bound_the_files(path)
    want = sum(1 for r in table.column("doc").to_pylist() if r > "x")
    assert want and deltalake.DeltaTable(path).to_pyarrow_table(filters=[("doc", ">", "x")]).num_rows == want


# ---------------------------------------------------------------------------------------------------------------
# a live table through the pipeline job

#: the typed-values cases (tests/test_typed_values.py) a live table holds, one column each (c_<case>, row i the
#: case's value i), and a 5 MB text and a 2 MB bytea (TOASTed) in row 1
LIVE_CASES = [CASE_BY_NAME[n] for n in ("date", "timestamp", "timestamptz", "float4", "float8", "num", "text",
                                        "bytea", "a_date", "a_float8", "a_int4", "a_timestamp")] + [
    Case("big_text", "text", ("repeat('ü', 2621440)",), pa.string()),
    Case("big_bytea", "bytea", ("decode(repeat('00ff', 1048576), 'hex')",), pa.binary(), "bytes")]
#: the key table `days` (its key a date: ±infinity, BC, after 9999), compared by the key's rank
DAY_CASES = [Case("days_d", "date", (), pa.date32(), "dt"), Case("days_f", "float8", (), pa.float64()),
             Case("days_at", "timestamptz", (), pa.timestamp("us", tz="UTC"), "dt")]


def _live_setup(db) -> None:
    cols = ", ".join(f"c_{c.name} {c.sqltype}" for c in LIVE_CASES)
    db.execute(f"CREATE TABLE vals (id int PRIMARY KEY, n int, {cols})")
    rows = max(len(c.values) for c in LIVE_CASES) + 1              # the last row: every value NULL
    db.execute(f"INSERT INTO vals (id, n) SELECT g, g FROM generate_series(1, {rows}) g")
    stmts = []
    for c in LIVE_CASES:
        for i, value in enumerate(c.values, start=1):
            tz, expr = value if isinstance(value, tuple) else (None, value)
            stmts += [f"SET TimeZone = '{tz}'"] if tz else []
            stmts.append(f"UPDATE vals SET c_{c.name} = {expr} WHERE id = {i}")
            stmts += ["RESET TimeZone"] if tz else []
        db.execute(f"CREATE VIEW t_{c.name} AS SELECT id, c_{c.name} AS v FROM vals")
    db.execute(";\n".join(stmts))
    db.execute("CREATE TABLE days (d date PRIMARY KEY, f float8, at timestamptz)")
    days = CASE_BY_NAME["date"].values
    floats = CASE_BY_NAME["float8"].values
    stamps = [v for v in CASE_BY_NAME["timestamptz"].values if not isinstance(v, tuple)]
    db.execute("INSERT INTO days VALUES " + ", ".join(
        f"({d}, {floats[i % len(floats)]}, {stamps[i % len(stamps)]})" for i, d in enumerate(days)))
    for c in DAY_CASES:
        db.execute(f"CREATE VIEW t_{c.name} AS SELECT rank() OVER (ORDER BY d)::int AS id, "
                   f"{c.name[len('days_'):]} AS v FROM days")
    db.execute("CREATE PUBLICATION pub FOR TABLE vals, days")


def _live_changes(db) -> None:
    """Updates that move the awkward values between rows, one that leaves the TOASTed values unchanged, deletes,
    and key changes of the date-keyed table."""
    rows = max(len(c.values) for c in LIVE_CASES) + 1
    moved = ", ".join(f"c_{c} = (SELECT c_{c} FROM vals o WHERE o.id = vals.id % {rows} + 1)"
                      for c in ("date", "timestamptz", "float8", "num", "a_date", "a_float8"))
    db.execute(f"UPDATE vals SET {moved}")
    db.execute("UPDATE vals SET n = -n WHERE id = 1")                # big_text / big_bytea: unchanged TOAST
    db.execute("UPDATE vals SET c_float4 = 'NaN', c_timestamp = '-infinity' WHERE id IN (2, 5)")
    db.execute("DELETE FROM vals WHERE id IN (3, 7)")
    db.execute("UPDATE days SET f = 'NaN' WHERE d IN ('infinity', '0044-03-15 BC')")
    db.execute("UPDATE days SET at = '-infinity' WHERE d = '10000-01-01'")
    db.execute("DELETE FROM days WHERE d = '-infinity'")
    db.execute("UPDATE days SET d = '5874897-12-30' WHERE d = 'infinity'")
    db.execute("UPDATE days SET d = '-infinity' WHERE d = '4714-11-24 BC'")


def _delta_rows(table: pa.Table, case: Case, column: str, ids: list[int]) -> list[dict]:
    """A Delta column as the decoder's rows give it in Python (spockwire.python_objects: ±infinity as
    spockwire.INFINITY / NEG_INFINITY, dates and timestamps Python cannot hold as PostgreSQL's text)."""
    values = table.column(column).combine_chunks().cast(case.arrow)
    return to_pylist(pa.record_batch([pa.array(ids, pa.int32()), values], names=["id", "v"]))


def assert_lands_as_postgres_holds(db, target: str, changed: bool) -> None:
    """The Delta tables of `vals` and `days` (SCD 1) hold what PostgreSQL holds, value for value; their history
    tables' current versions too, and (`changed`) the changed rows' earlier versions are kept."""
    import psycopg2

    with psycopg2.connect(db.dsn) as conn, conn.cursor() as cur:
        expected = server_expected(cur, LIVE_CASES + DAY_CASES)
    for history in (False, True):
        vals = checked_table(target_path(target, "public.vals", history))
        days = checked_table(target_path(target, "public.days", history))
        if history:
            closed = pc.sum(pc.cast(pc.is_valid(vals.column(scd2_columns()[1][0])), pa.int64())).as_py()
            assert closed >= (len(expected["big_text"]) if changed else 0)
            vals = vals.filter(pc.is_null(vals.column(scd2_columns()[1][0])))
            days = days.filter(pc.is_null(days.column(scd2_columns()[1][0])))
        for c in LIVE_CASES:
            assert_matches_server(c, _delta_rows(vals, c, f"c_{c.name}", vals.column("id").to_pylist()), expected[c.name],
                                  f"vals.c_{c.name} history={history}")
        order = pc.sort_indices(days.column("d").cast(pa.int32()))
        days = days.take(order)
        ranks = list(range(1, days.num_rows + 1))
        for c in DAY_CASES:
            assert_matches_server(c, _delta_rows(days, c, c.name[len("days_"):], ranks), expected[c.name],
                                  f"days.{c.name} history={history}")


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def test_a_live_table_of_awkward_values_lands_exactly_through_snapshot_stream_and_optimize(spark, pg_db, tmp_path):
    """Dates and timestamps at ±infinity, BC and after 9999, NaN and ±Infinity floats and numerics, empty arrays
    and arrays holding NULLs, a 5 MB text and a 2 MB bytea; a table keyed by such dates: snapshotted, then changed
    (values moved between rows, unchanged TOAST, deletes, key changes), through the pipeline job with history and
    an OPTIMIZE (Z-order by the key) after every micro-batch. The Delta tables equal PostgreSQL's, their files'
    statistics bound what they hold, and filtered reads give the right rows."""
    from spockwire.spark.job import JobConfig, flush_lsn, start, wait_caught_up
    from spockwire.spark.maintenance import MaintenanceOptions

    _live_setup(pg_db)
    cfg = JobConfig(dsn=pg_db.dsn, slot=f"{pg_db.name}_values"[:63], publication=["pub"],
                    tables={"public.vals": None, "public.days": None}, target=str(tmp_path / "delta"),
                    checkpoint=str(tmp_path / "ck"), starting_position="snapshot", trigger_seconds=0.2,
                    history=True, maintenance=MaintenanceOptions(optimize_every=1, small_files=0, zorder=True,
                                                                 vacuum_retention_hours=None))
    reports: list = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        assert_lands_as_postgres_holds(pg_db, cfg.target, changed=False)
        _live_changes(pg_db)
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        time.sleep(0.5)   # the last batch's report
    finally:
        query.stop()
    assert_lands_as_postgres_holds(pg_db, cfg.target, changed=True)
    steps = [s for r in reports for s in r.maintenance.values()]
    assert sum("optimized" in s for s in steps) >= 4                 # both tables and histories, after a change
    for table in ("public.vals", "public.days"):
        for history in (False, True):
            path = target_path(cfg.target, table, history)
            assert_stats_bound_the_files(path)
            got = checked_table(path)
            for column, pivot in (("c_date", dt.date(1970, 1, 1)), ("c_float8", 0.0), ("d", dt.date(1970, 1, 1)),
                                  ("at", dt.datetime(1970, 1, 1, tzinfo=UTC))):
                if column in got.column_names:
                    want = pc.sum(pc.cast(pc.fill_null(pc.greater(got.column(column), pa.scalar(pivot).cast(
                        got.schema.field(column).type)), False), pa.int64())).as_py()
                    assert deltalake.DeltaTable(path).to_pyarrow_table(filters=[(column, ">", pivot)]).num_rows \
                        == want, (path, column)
