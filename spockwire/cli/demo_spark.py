"""`spockwire demo` with the Spark pipeline (the default): tables that already hold rows, writes running, the
``spockwire`` Spark source streaming the changes with a checkpoint, `apply_changes` keeping a Delta table per
source table, then every Delta table checked against its source table and a report.

The pipeline is :mod:`spockwire.spark.job`, the same code a production job runs.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from typing import Any, TextIO

from ..connection import create_slot
from ..spark.environment import check_java
from ..testing import PostgresCluster
from .common import CliError, format_lsn, human_bytes
from .demo_source import SCHEMA, TABLES, comparable, find_server, require_client


# the rows the tables hold before the pipeline starts
INITIAL = [
    "INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', (g * 13.37)::numeric(12,2), "
    "jsonb_build_object('tier', g % 3, 'tags', jsonb_build_array('a', g)), now() FROM generate_series(1, 2000) g",
    "INSERT INTO orders SELECT g, 1 + g % 2000, (g * 1.25)::numeric(12,2), now() - g * interval '1 minute', "
    "ARRAY['new', 'o' || g], CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 400) END "
    "FROM generate_series(1, 20000) g",
]

# the writes that run while the pipeline streams
WRITES = [
    # updates that leave the TOASTed note unchanged, deletes
    "UPDATE orders SET total = total + 1 WHERE id % 100 = 0",
    "UPDATE customers SET balance = balance - 5, updated_at = now() WHERE id % 7 = 0",
    "DELETE FROM orders WHERE id % 13 = 0",
    # a primary-key change
    "UPDATE customers SET id = id + 100000 WHERE id % 500 = 0",
    # a transaction larger than logical_decoding_work_mem: streamed while in progress
    "INSERT INTO events (kind, payload) SELECT 'bulk', jsonb_build_object('n', g) FROM generate_series(1, {rows}) g",
]
SMALL_TRANSACTIONS = 300


def _small_writes(conn: Any, rng: random.Random, count: int) -> None:
    """Many small transactions: new orders, price changes, a new TOASTed note now and then, deletes."""
    with conn.cursor() as cur:
        for i in range(count):
            oid = 100_000 + i
            cur.execute("INSERT INTO orders VALUES (%s, %s, %s, now(), ARRAY['live'], %s)",
                        (oid, rng.randint(1, 2000), rng.randint(100, 99_999) / 100,
                         "n" * 3000 if i % 10 == 0 else None))
            cur.execute("UPDATE orders SET total = total * 2 WHERE id = %s", (rng.randint(1, 20_000),))
            if i % 3 == 0:
                cur.execute("UPDATE customers SET email = %s WHERE id = %s", (f"new{i}@example.com",
                                                                             rng.randint(1, 2000)))
            if i % 5 == 0:
                cur.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, 20_000),))
            if i % 7 == 0:
                cur.execute("INSERT INTO events (kind, payload) VALUES ('live', %s)", (f'{{"i": {i}}}',))
            conn.commit()
            time.sleep(0.01)


def _table_rows(pg: Any, db: str, table: str) -> tuple[list[str], list[tuple]]:
    conn = pg.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            return [d[0] for d in cur.description], cur.fetchall()
    finally:
        conn.close()


def _delta_rows(path: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_table().to_pylist()


def _check(pg: Any, db: str, table: str, keys: tuple[str, ...], path: str) -> tuple[int, int, bool]:
    names, rows = _table_rows(pg, db, table)
    source = {tuple(r[names.index(k)] for k in keys): {n: comparable(v) for n, v in zip(names, r)} for r in rows}
    delta = {}
    for r in _delta_rows(path):
        delta[tuple(r[k] for k in keys)] = {n: comparable(r.get(n)) for n in names}
    return len(source), len(delta), source == delta


def _snapshot_supported() -> bool:
    """Whether the Spark source reads an initial snapshot (``startingPosition`` ``snapshot``)."""
    from ..spark import datasource

    return "snapshot" in getattr(datasource, "STARTING_POSITIONS", ())


def run_spark(cfg: argparse.Namespace, out: TextIO) -> int:
    require_client()
    try:
        import deltalake  # noqa: F401
        import pyspark
    except ImportError as exc:
        raise CliError(f"the Spark pipeline needs pyspark and deltalake (pip install spockwire[demo]), or run "
                       f"`spockwire demo --no-spark`: {exc}") from None
    from ..spark.job import BatchReport, JobConfig, flush_lsn, spark_session, start, target_path, wait_caught_up

    check_java()   # before the server starts: without Java there is no Spark
    # Spark's Python workers run this interpreter, the one this spockwire and its dependencies are installed in
    os.environ["PYSPARK_PYTHON"] = sys.executable
    bindir, server = find_server()
    work = cfg.out or tempfile.mkdtemp(prefix="spockwire-demo-")
    snapshot = _snapshot_supported()
    out.write(f"spockwire demo: starting a throwaway cluster of {server}\n")
    out.flush()
    with PostgresCluster({"logical_decoding_work_mem": "64kB"}, bindir=bindir) as pg:
        db = pg.create_database("demo")
        dsn = pg.dsn(dbname=db)
        pg.execute(SCHEMA, dbname=db)
        if not snapshot:
            # without an initial snapshot the existing rows must come as changes: the slot comes first
            create_slot(dsn, "demo_slot", "pgoutput")
        t0 = time.monotonic()
        for sql in INITIAL:
            pg.execute(sql, dbname=db)
        initial = {t: pg.query(f"SELECT count(*) FROM {t}", dbname=db)[0][0] for t in TABLES}
        out.write("source tables hold " + ", ".join(f"{t.split('.')[1]} {n:,}" for t, n in initial.items())
                  + f" rows ({time.monotonic() - t0:.1f}s)"
                  + ("; they arrive by the source's initial snapshot\n" if snapshot else
                     "; they arrive as changes (this Spark source has no initial snapshot)\n"))
        t0 = time.monotonic()
        out.write(f"starting Spark {pyspark.__version__} ({cfg.master}) ...\n")
        out.flush()
        spark = spark_session(cfg.master, app="spockwire-demo", impl=cfg.impl)
        out.write(f"Spark ready in {time.monotonic() - t0:.1f}s\n")
        job = JobConfig(dsn=dsn, slot="demo_slot", publication=["demo_pub"], tables=TABLES,
                        target=os.path.join(work, "delta"), checkpoint=os.path.join(work, "checkpoint"),
                        starting_position="snapshot" if snapshot else None, create_slot=snapshot,
                        max_changes_per_batch=50_000)
        lock = threading.Lock()
        totals = {t: 0 for t in TABLES}
        snapshot_totals = {t: 0 for t in TABLES}
        batches: list[BatchReport] = []
        marks: dict[str, float] = {}
        snapshot_rows = [0]
        lags: list[float] = []

        def on_batch(b: BatchReport) -> None:
            with lock:
                now = time.monotonic()
                batches.append(b)
                for t, n in b.rows.items():
                    totals[t] += n
                for t, n in b.snapshot_by_table.items():
                    snapshot_totals[t] += n
                if b.snapshot_rows:
                    snapshot_rows[0] += b.snapshot_rows
                    marks.setdefault("snapshot_start", now - b.seconds)
                    marks["snapshot_end"] = now
                elif sum(b.rows.values()):
                    marks.setdefault("changes_start", now - b.seconds)
                    marks["changes_end"] = now
                lag = max(flush_lsn(dsn) - (b.end_lsn or 0), 0)
                kind = f"snapshot rows {b.snapshot_rows:,}, " if b.snapshot_rows else ""
                delay = (f"; commit-to-Delta lag p50 {b.lag_p50:.1f}s p95 {b.lag_p95:.1f}s"
                         if b.lag_p50 is not None else "")
                if b.lag_p95 is not None:
                    lags.append(b.lag_p95)
                out.write(f"  batch {b.batch_id:>3}: {sum(b.rows.values()):>7,} rows ({kind}"
                          + ", ".join(f"{t.split('.')[1]} {n:,}" for t, n in b.rows.items() if n)
                          + f") applied in {b.seconds:.1f}s{delay}; WAL behind {human_bytes(lag)}\n")
                out.flush()

        query = start(spark, job, on_batch)
        out.write(f"streaming query started: checkpoint {job.checkpoint}, Delta tables in {job.target}\n")
        out.flush()
        # the writes start once the query planned its first micro-batch (the slot and its snapshot exist)
        deadline = time.monotonic() + 600
        while not os.path.exists(os.path.join(job.checkpoint, "offsets", "0")):
            if query.exception() is not None:
                raise CliError(f"the streaming query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise CliError("the streaming query planned no micro-batch within 600 s")
            time.sleep(0.05)
        conn = pg.connect(db)
        conn.autocommit = True
        t_writes = time.monotonic()
        try:
            for sql in WRITES:
                pg.execute(sql.format(rows=cfg.rows), dbname=db)
            conn.autocommit = False
            _small_writes(conn, random.Random(1), SMALL_TRANSACTIONS)
        finally:
            conn.close()
        writes_s = time.monotonic() - t_writes
        out.write(f"writes done while streaming: {len(WRITES)} statements (updates leaving TOAST unchanged, deletes, "
                  f"a key change, a streamed {cfg.rows:,}-row transaction) and {SMALL_TRANSACTIONS} small "
                  f"transactions in {writes_s:.1f}s\n")
        out.flush()
        target = flush_lsn(dsn)
        t_done = time.monotonic()
        try:
            wait_caught_up(query, target, timeout=600)
        finally:
            query.stop()
        caught_up_s = time.monotonic() - t_done
        slot_lsn = pg.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = "
                            "'demo_slot'", dbname=db)[0][0]
        changes = sum(totals.values()) - snapshot_rows[0]
        if snapshot_rows[0]:
            took = marks["snapshot_end"] - marks["snapshot_start"]
            out.write(f"snapshot: {snapshot_rows[0]:,} rows in {took:.1f}s ({snapshot_rows[0] / max(took, 1e-9):,.0f} "
                      "rows/s, read by Spark tasks under the slot's exported snapshot and applied to Delta)\n")
        took = marks.get("changes_end", 0.0) - marks.get("changes_start", 0.0)
        out.write(f"changes: {changes:,} rows in {len(batches)} micro-batches, {changes / max(took, 1e-9):,.0f} "
                  f"rows/s applied to Delta; caught up {caught_up_s:.1f}s after the last write (lag then 0 bytes: "
                  f"applied up to {format_lsn(target)}); slot confirmed at {format_lsn(int(slot_lsn))}\n")
        if lags:
            out.write(f"commit-to-Delta lag of the changes: worst batch p95 {max(lags):.1f}s\n")
        failures = 0
        out.write(f"  {'table':<18} {'snapshot':>8} {'changes':>8} {'source rows':>11} {'delta rows':>10}  check\n")
        for table, keys in TABLES.items():
            n_source, n_delta, same = _check(pg, db, table, keys, target_path(job.target, table))
            failures += not same
            out.write(f"  {table:<18} {snapshot_totals[table]:>8,} {totals[table] - snapshot_totals[table]:>8,} "
                      f"{n_source:>11,} {n_delta:>10,}  "
                      f"{'Delta table equals the source table' if same else 'MISMATCH'}\n")
        spark.stop()
    if failures:
        raise CliError(f"{failures} Delta table(s) did not match their source table")
    out.write(f"demo: every table matches its source, on {server}\n")
    return 0
