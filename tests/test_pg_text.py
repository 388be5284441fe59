"""spockwire.export.pg_text renders typed Arrow values as PostgreSQL prints them (``value::text``): checked against
a live server for random and edge-case floats (float4 and float8), numerics, strings that need quoting in an
array, booleans, dates and timestamps (±infinity and BC included), and one-dimensional arrays of each."""
from __future__ import annotations

import math
import os
import random
import struct
from decimal import Decimal

import pyarrow as pa
import pytest

from spockwire.export.pg_text import NotRenderable, float_text, pg_text

pytestmark = pytest.mark.pg

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 1e-4, 9.99e-5, 1e-5, 123456789012345.0, 1e15, 999999999999999.9, 1e16,
               1e20, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, 3.141592653589793, 100.0, 1234.5,
               float("nan"), float("inf"), float("-inf")]
STRINGS = ["", "a", "a b", "NULL", "null", "x,y", '"q"', "back\\slash", "{br}", "tab\there", "ünï", " lead", "é é"]


def _server(pg_db, sql: str, params) -> list:
    conn = pg_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def _random_floats(rng: random.Random, n: int, single: bool) -> list[float]:
    out = []
    while len(out) < n:
        if single:
            v = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        else:
            v = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if v == v and abs(v) != float("inf"):
            out.append(v)
        out.append(rng.uniform(-1e6, 1e6))
        out.append(round(rng.uniform(-1000, 1000), rng.randint(0, 6)))
    return out[:n]


@pytest.mark.parametrize("single", [False, True], ids=["float8", "float4"])
def test_floats_print_as_postgres_prints_them(pg_db, single):
    rng = random.Random(7)
    values = EDGE_FLOATS + _random_floats(rng, int(os.environ.get("SPOCKWIRE_FLOAT_CASES", "3000")), single)
    if single:
        values = [struct.unpack("<f", struct.pack("<f", v))[0] for v in values if not 3.4e38 <= abs(v) < math.inf]
    kind = "float4" if single else "float8"
    # repr reads back as the same double, and a float4's double reads back as the same float4
    want = _server(pg_db, f"SELECT v::{kind}::text FROM unnest(%s::float8[]) WITH ORDINALITY u(v, i) ORDER BY i",
                   ([repr(v) for v in values],))
    got = [float_text(v, single) for v in values]
    assert [(v, g, w) for v, g, w in zip(values, got, want) if g != w] == []
    arrow = pg_text(pa.array([values[:50], None, []], pa.list_(pa.float32() if single else pa.float64())))
    literal = "{" + ",".join(repr(v) for v in values[:50]) + "}"
    assert arrow.to_pylist() == _server(pg_db, f"SELECT %s::{kind}[]::text", (literal,)) + [None, "{}"]


def test_scalars_and_arrays_print_as_postgres_prints_them(pg_db):
    rng = random.Random(3)
    decimals = [Decimal(rng.randint(-10**12, 10**12)).scaleb(-4) for _ in range(200)] + [Decimal("0.0000"),
                                                                                        Decimal("-0.0001")]
    arr = pa.array(decimals, pa.decimal128(18, 4))
    assert pg_text(arr).to_pylist() == _server(
        pg_db, "SELECT v::numeric(18,4)::text FROM unnest(%s::numeric[]) WITH ORDINALITY u(v, i) ORDER BY i",
        (decimals,))
    ints = [rng.randint(-2**63, 2**63 - 1) for _ in range(50)]
    lists = [ints[i:i + 5] for i in range(0, 50, 5)] + [None, [], [None, 1]]
    want = _server(pg_db, "SELECT v::text FROM unnest(%s::text[]) WITH ORDINALITY u(v, i) ORDER BY i",
                   (["{" + ",".join("NULL" if x is None else str(x) for x in lst) + "}" if lst is not None else None
                     for lst in lists],))
    want = [None if w is None else _server(pg_db, "SELECT %s::int8[]::text", (w,))[0] for w in want]
    assert pg_text(pa.array(lists, pa.list_(pa.int64()))).to_pylist() == want
    texts = [STRINGS[i:i + 4] + [None] for i in range(len(STRINGS))] + [[]]
    for row in texts:
        assert pg_text(pa.array([row], pa.list_(pa.string()))).to_pylist() == \
            _server(pg_db, "SELECT coalesce(%s::text[], '{}')::text", (row or None,))
    assert pg_text(pa.array([[True, None, False]], pa.list_(pa.bool_()))).to_pylist() == \
        _server(pg_db, "SELECT ARRAY[true, NULL, false]::text", None)


def test_dates_and_timestamps_print_as_postgres_prints_them(pg_db):
    days = _server(pg_db, "SELECT d - DATE '1970-01-01' FROM unnest(ARRAY['4714-11-24 BC', '0044-03-15 BC', "
                          "'0001-01-01', '2024-02-29', '9999-12-31', '10000-01-01', '5874897-12-30']::date[]) d", None)
    want = _server(pg_db, "SELECT (DATE '1970-01-01' + n)::text FROM unnest(%s::int[]) WITH ORDINALITY u(n, i) "
                          "ORDER BY i", (days,))
    dates = pa.array(days + [2**31 - 1, -2**31], pa.int32()).cast(pa.date32())
    assert pg_text(dates).to_pylist() == want + ["infinity", "-infinity"]
    conn = pg_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute("SELECT (extract(epoch FROM t) * 1000000)::int8, t::text, t::timestamp::text FROM unnest("
                        "ARRAY['0044-03-15 12:00:01.5 BC', '2024-02-29 23:59:59.999999', '1970-01-01', "
                        "'10000-01-01 00:00:00.25']::timestamptz[]) t")
            rows = cur.fetchall()
    finally:
        conn.close()
    micros = [r[0] for r in rows]
    assert pg_text(pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))).to_pylist() == [r[1] for r in rows]
    assert pg_text(pa.array([micros], pa.list_(pa.int64())).cast(pa.list_(pa.timestamp("us")))).to_pylist() == \
        [_server(pg_db, "SELECT %s::timestamp[]::text", ("{" + ",".join(f'"{r[2]}"' for r in rows) + "}",))[0]]


def test_other_types_are_not_rendered():
    with pytest.raises(NotRenderable, match="month_day_nano"):
        pg_text(pa.array([[(1, 2, 3)]], pa.list_(pa.month_day_nano_interval())))
