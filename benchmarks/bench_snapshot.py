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

``extra_info`` holds rows/s of the fastest round (other load only ever slows a round down) and, once the run has
them, the ratio of each reader to raw_copy and to adbc (benchmarks/report.py prints the table). A peer whose
package is missing fails its benchmark: the comparison is the point of this file. SPOCKWIRE_BENCH_ROUNDS sets
the rounds (default 3).
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


def _measure(benchmark, name: str, run, check_rows: bool = True) -> None:
    times = []

    def once():
        t0 = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - t0)
        if check_rows:
            assert rows == ROWS, (name, rows)
        return rows

    benchmark.pedantic(once, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    best = min(times)
    RESULTS[name] = ROWS / best
    benchmark.group = GROUP
    benchmark.extra_info.update({"label": name, "rows": ROWS, "rows_per_s": round(ROWS / best),
                                 "seconds": best, "snapshot_reader": name})
    for peer in ("raw_copy", "adbc"):
        if peer in RESULTS and peer != name:
            benchmark.extra_info[f"ratio_to_{peer}"] = round(RESULTS[name] / RESULTS[peer], 3)


def test_raw_copy(benchmark, table) -> None:
    pg, db = table
    pumps = load_pump("c")

    def run():
        conn = pinned_connect(pg.dsn(dbname=db))
        conn.autocommit = True
        pump = pumps.CopyDataPump(conn.pgconn_ptr, max_batch_bytes=1 << 20)
        pump.start("COPY t TO STDOUT (FORMAT binary)")
        nbytes = 0
        while True:
            nbytes += len(pump.read(1.0))
            if pump.finished:
                break
        messages = pump.rows
        pump.detach()
        conn.close()
        return messages - 1   # one CopyData message per row, and the trailer's

    _measure(benchmark, "raw_copy", run)


def test_adbc(benchmark, table) -> None:
    pg, db = table
    import adbc_driver_postgresql.dbapi as adbc

    def run():
        with adbc.connect(_uri(pg, db)) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM t")
                result = cur.fetch_arrow_table()
        return result.num_rows

    _measure(benchmark, "adbc", run)


@pytest.mark.parametrize("workers", [1, 2])
def test_spockwire(benchmark, table, workers, monkeypatch) -> None:
    pg, db = table
    monkeypatch.setenv("SPOCKWIRE_IMPL", "c")

    def run():
        result = spockwire.read_table(pg.dsn(dbname=db), "t", workers=workers)
        assert isinstance(result, pa.Table)
        return result.num_rows

    _measure(benchmark, f"spockwire_w{workers}", run)


@pytest.mark.parametrize("partitions", [1, 2])
def test_connectorx(benchmark, table, partitions) -> None:
    pg, db = table
    import connectorx as cx

    def run():
        kwargs = {"partition_on": "a", "partition_num": partitions} if partitions > 1 else {}
        result = cx.read_sql(_uri(pg, db), "SELECT * FROM t", return_type="arrow", **kwargs)
        return result.num_rows

    _measure(benchmark, f"connectorx_p{partitions}", run)


def test_ratios(table) -> None:
    """The run's ratios, printed for the log (the report computes the same from the JSON)."""
    if "raw_copy" in RESULTS:
        for name, rps in sorted(RESULTS.items(), key=lambda kv: -kv[1]):
            peers = ", ".join(f"{rps / RESULTS[p]:.2f}x {p}" for p in ("raw_copy", "adbc") if p in RESULTS)
            print(f"{name:16s} {rps:12,.0f} rows/s  {peers}")
