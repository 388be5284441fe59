"""Whole-table reads into Arrow: spockwire.read_table against its peers and the raw COPY floor, side by side.

    python -m pytest benchmarks/bench_snapshot.py -o python_files='bench_*.py' --benchmark-only

One table of SPOCKWIRE_BENCH_SNAPSHOT_ROWS rows (default 1,000,000) and 7 columns (bigint, int, text,
numeric(12,2), timestamptz, float8, bool) on one throwaway PostgreSQL 15 server, read into a pyarrow Table by:

* ``raw_copy``: ``COPY t TO STDOUT (FORMAT binary)`` moved from the server into this process with libpq and not
  decoded (spockwire's CopyDataPump alone): the floor every COPY-based reader stands on;
* ``spockwire_w1`` / ``spockwire_w2``: ``spockwire.read_table(dsn, "t", workers=1|2)`` (C implementation);
* ``adbc``: the ADBC PostgreSQL driver (``adbc-driver-postgresql``: COPY binary to Arrow in C++),
  ``cursor.fetch_arrow_table()``;
* ``connectorx_p1`` / ``connectorx_p2``: ``connectorx.read_sql(..., return_type="arrow")`` with 1 and 2
  partitions on the bigint column.

The readers run SPOCKWIRE_BENCH_ROUNDS times (default 3) in rotating order, so that the machine's other load
falls on all of them alike; ``extra_info`` holds rows/s of each reader's fastest round (load only ever slows a
round down) and its ratios to raw_copy and adbc measured in the same run (benchmarks/report.py prints them). A
peer whose package is missing fails its benchmark: the comparison is the point of this file.
"""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

import spockwire
from spockwire.connection.session import pinned_connect
from spockwire.connection.stream import load_pump
from spockwire.testing import PostgresCluster

ROWS = int(os.environ.get("SPOCKWIRE_BENCH_SNAPSHOT_ROWS", "1000000"))
ROUNDS = int(os.environ.get("SPOCKWIRE_BENCH_ROUNDS", "3"))
GROUP = f"snapshot read: {ROWS:,} rows x 7 columns (bigint, int, text, numeric(12,2), timestamptz, float8, bool)"
RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def table():
    with PostgresCluster({"shared_buffers": "512MB", "max_wal_size": "4GB"}) as pg:
        db = pg.create_database("bench_snapshot")
        pg.execute("CREATE TABLE t (a bigint, b int, c text, d numeric(12,2), e timestamptz, f float8, g bool)",
                   dbname=db)
        pg.execute(f"INSERT INTO t SELECT i, (i * 7) % 1000000, 'customer ' || (i % 9973), (i % 100000) / 100.0, "
                   f"timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', i / 7.0, i % 3 = 0 "
                   f"FROM generate_series(1, {ROWS}) i", dbname=db)
        pg.execute("VACUUM (FREEZE, ANALYZE) t", dbname=db)
        pg.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm", dbname=db)
        pg.execute("SELECT pg_prewarm('t')", dbname=db)
        yield pg, db


def _uri(pg, db) -> str:
    return f"postgresql://{pg.user}@{pg.host}:{pg.port}/{db}"


def _raw_copy(pg, db) -> int:
    conn = pinned_connect(pg.dsn(dbname=db))
    conn.autocommit = True
    pump = load_pump("c").CopyDataPump(conn.pgconn_ptr, max_batch_bytes=1 << 20)
    try:
        pump.start("COPY t TO STDOUT (FORMAT binary)")
        while True:
            pump.read(1.0)
            if pump.finished:
                break
        return pump.rows - 1   # one CopyData message per row (the first also holds the header), and the trailer
    finally:
        pump.detach()
        conn.close()


def _spockwire(workers: int):
    def run(pg, db) -> int:
        result = spockwire.read_table(pg.dsn(dbname=db), "t", workers=workers)
        assert isinstance(result, pa.Table)
        return result.num_rows
    return run


def _adbc(pg, db) -> int:
    import adbc_driver_postgresql.dbapi as adbc

    with adbc.connect(_uri(pg, db)) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM t")
            return cur.fetch_arrow_table().num_rows


def _connectorx(partitions: int):
    def run(pg, db) -> int:
        import connectorx as cx

        kwargs = {"partition_on": "a", "partition_num": partitions} if partitions > 1 else {}
        return cx.read_sql(_uri(pg, db), "SELECT * FROM t", return_type="arrow", **kwargs).num_rows
    return run


READERS = {
    "raw_copy": _raw_copy,
    "spockwire_w1": _spockwire(1),
    "spockwire_w2": _spockwire(2),
    "adbc": _adbc,
    "connectorx_p1": _connectorx(1),
    "connectorx_p2": _connectorx(2),
}


@pytest.fixture(scope="module")
def interleaved(table, request):
    """Every reader ROUNDS times in rotating order, so that the machine's other load falls on all of them alike;
    the best seconds of each. A reader that fails (a peer's package missing) fails its own benchmark."""
    pg, db = table
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOCKWIRE_IMPL", "c")
    best: dict[str, float | BaseException] = {}
    names = list(READERS)
    try:
        for _warm in names:
            try:
                READERS[_warm](pg, db)
            except Exception as exc:  # noqa: BLE001 - reported by the reader's benchmark
                best[_warm] = exc
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if isinstance(best.get(name), BaseException):
                    continue
                t0 = time.perf_counter()
                rows = READERS[name](pg, db)
                took = time.perf_counter() - t0
                assert rows == ROWS, (name, rows)
                best[name] = min(best.get(name, took), took)
    finally:
        mp.undo()
    return best


@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("name", list(READERS))
def test_read(benchmark, table, interleaved, name, monkeypatch) -> None:
    pg, db = table
    monkeypatch.setenv("SPOCKWIRE_IMPL", "c")
    if isinstance(interleaved.get(name), BaseException):
        raise interleaved[name]
    rows = benchmark.pedantic(READERS[name], args=(pg, db), rounds=1, iterations=1)
    assert rows == ROWS
    seconds = interleaved[name]
    benchmark.extra_info.update({"label": name, "rows": ROWS, "rows_per_s": round(ROWS / seconds),
                                 "seconds": seconds, "snapshot_reader": name})
    for peer in ("raw_copy", "adbc"):
        other = interleaved.get(peer)
        if isinstance(other, float):
            benchmark.extra_info[f"ratio_to_{peer}"] = round(other / seconds, 3)
    RESULTS[name] = ROWS / seconds


def test_ratios() -> None:
    """The run's ratios, printed for the log (benchmarks/report.py computes the same from the JSON)."""
    for name, rps in sorted(RESULTS.items(), key=lambda kv: -kv[1]):
        peers = ", ".join(f"{rps / RESULTS[p]:.2f}x {p}" for p in ("raw_copy", "adbc") if p in RESULTS)
        print(f"{name:16s} {rps:12,.0f} rows/s  {peers}")
