"""`apply_changes` into a Delta table (delta-rs) that grows: the time per micro-batch must not grow with it.

    python -m benchmarks.bench_apply [--rounds 10] [--changes 10000] [--grow 100000] [--master local[2]]

Each round first grows the target by `--grow` rows (appended with delta-rs directly, not measured: the table
grows as it would over a long-running stream), then applies one measured micro-batch of `--changes` changes:
50% inserts of new keys, 40% updates of keys among the newest 50,000 (half of them with `doc` as an unchanged
TOASTed value, which the apply must take from the stored row), 10% deletes of such keys. With the defaults the
table grows from 100,000 to 1,000,000 rows. Printed per round: table rows before the batch, data files in the
table and files read for the batch's keys, stored rows read, apply seconds.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import random
import shutil
import sys
import tempfile
import time

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
SCHEMA = ("_change_type string, _commit_lsn long, _commit_ts timestamp, _xid long, _seq long, _origin string, "
          "_unchanged_toast array<string>, id long, name string, qty int, doc string")
DOC = "x" * 200


def _session(master: str):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])
    spark = (SparkSession.builder.master(master).appName("spockwire-bench-apply")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _grow(path: str, first: int, n: int, lsn: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    ids = pa.array(range(first, first + n), pa.int64())
    table = pa.table({"id": ids, "name": pa.array([f"n{i}" for i in range(first, first + n)]),
                      "qty": pa.array([i % 1000 for i in range(n)], pa.int32()),
                      "doc": pa.array([DOC] * n), "_commit_lsn": pa.array([lsn] * n, pa.int64()),
                      "_seq": pa.array(range(n), pa.int64())})
    write_deltalake(path, table, mode="append")


def _batch(rnd: random.Random, next_id: int, alive_hot: list[int], n: int, lsn: int, ts: dt.datetime) -> list:
    rows = []
    inserts, updates = n // 2, n * 4 // 10
    deletes = n - inserts - updates
    touched = rnd.sample(alive_hot, updates + deletes)
    for i in range(inserts):
        k = next_id + i
        rows.append(("insert", lsn, ts, 1, len(rows), None, None, k, f"i{k}", 1, DOC))
    for k in touched[:updates]:
        if rnd.random() < 0.5:
            rows.append(("update_postimage", lsn, ts, 1, len(rows), None, ["doc"], k, f"u{k}", 2, None))
        else:
            rows.append(("update_postimage", lsn, ts, 1, len(rows), None, None, k, f"u{k}", 2, "new"))
    for k in touched[updates:]:
        rows.append(("delete", lsn, ts, 1, len(rows), None, None, k, None, None, None))
    return rows, touched[updates:]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--grow", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    from deltalake import DeltaTable

    from spockwire.spark.apply import apply_changes

    spark = _session(args.master)
    work = tempfile.mkdtemp(prefix="spockwire-bench-apply-")
    path = os.path.join(work, "orders")
    rnd = random.Random(1)
    next_id, lsn = 0, 1000
    deleted: set[int] = set()
    results = []
    try:
        print(f"{'round':>5} {'rows before':>12} {'files':>6} {'read':>5} {'stored rows':>11} {'apply s':>8}")
        for r in range(args.rounds):
            _grow(path, next_id, args.grow, lsn)
            next_id += args.grow
            lsn += 1
            hot = [k for k in range(max(0, next_id - 50_000), next_id) if k not in deleted]
            rows, gone = _batch(rnd, next_id, hot, args.changes, lsn,
                                dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=r))
            deleted.update(gone)
            next_id += args.changes // 2
            lsn += 1
            df = spark.createDataFrame(rows, SCHEMA)
            df.localCheckpoint(eager=True)
            before = DeltaTable(path).count() if hasattr(DeltaTable, "count") else None
            start = time.perf_counter()
            metrics = apply_changes(df, path, format="delta", keys=["id"], engine="delta-rs")
            took = time.perf_counter() - start
            results.append({"round": r, "rows_before": before, "files": metrics.files_in_table,
                            "files_read": metrics.files_read, "stored_rows_read": metrics.stored_rows_read,
                            "seconds": took})
            print(f"{r:>5} {before:>12,} {metrics.files_in_table:>6} {metrics.files_read:>5} "
                  f"{metrics.stored_rows_read:>11,} {took:>8.2f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return results


if __name__ == "__main__":
    main()
