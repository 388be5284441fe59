"""How the Spark side scales with cores: local[1] against local[2], in one run.

    python -m benchmarks.spark_scale [--rows 400000] [--rounds 3] [--out benchmarks/results/spark_scale.json]

Two measurements per master (one SparkSession each, a warm-up round first, best of `--rounds`):

* ``frame_decode``: `decode_frame_file` of a frame file of the benchmark INSERT workload (benchmarks/workloads.py,
  7 typed columns), cut into 4 MiB chunks, decoded by `mapInArrow` tasks, written to Spark's ``noop`` sink;
* ``snapshot``: the ``spockwire`` source with ``startingPosition=snapshot`` on a table of the same size (bigint,
  int, text, numeric(12,2), timestamptz, float8, bool) on a throwaway PostgreSQL: the slot is created with an
  exported snapshot and the table's block ranges (64 of them) are read by Spark tasks under it; the time is the
  sum of the snapshot micro-batches' trigger durations (``noop`` sink, Trigger.AvailableNow).

Spark's fixed costs (task scheduling, Python workers, Arrow transfer to the JVM) are part of both.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHUNK = 4 << 20


def _session(master: str):
    from spockwire.spark.job import spark_session

    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    return spark_session(master, app=f"spockwire-scale-{master}")


def _frame_decode(spark, path: str) -> float:
    from spockwire.spark import decode_frame_file

    t = time.perf_counter()
    decode_frame_file(spark, path, "public.bench_orders", chunk_bytes=CHUNK).write.format("noop").mode(
        "overwrite").save()
    return time.perf_counter() - t


def _snapshot(spark, dsn: str, slot: str, work: str, pages: int) -> tuple[float, int]:
    from spockwire.connection.slots import drop_slot

    query = (spark.readStream.format("spockwire").option("dsn", dsn).option("slot", slot)
             .option("publication", "bench_pub").option("table", "public.bench_table")
             .option("startingPosition", "snapshot").option("snapshotChunkPages", str(pages))
             .option("snapshotChunksPerBatch", "64").load()
             .writeStream.format("noop").option("checkpointLocation", work).trigger(availableNow=True).start())
    query.awaitTermination()
    batches = [p for p in query.recentProgress if "snapshot" in str(p["sources"][0]["endOffset"])]
    seconds = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    rows = sum(p["numInputRows"] for p in batches)
    drop_slot(dsn, slot)
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark_scale.json"))
    args = parser.parse_args()

    from benchmarks.workloads import pgoutput_inserts
    from spockwire.frames import encode_file_header
    from spockwire.testing import PostgresCluster

    tmp = tempfile.mkdtemp(prefix="spockwire-scale-")
    work = pgoutput_inserts(args.rows, 1000)
    frame_path = os.path.join(tmp, "inserts.spwf")
    with open(frame_path, "wb") as f:
        f.write(encode_file_header("pgoutput", slot="bench") + work.body)
    results: dict = {"rows": args.rows, "rounds": args.rounds, "machine": f"{platform.machine()}, "
                     f"{os.cpu_count()} cores", "load_average_at_start": os.getloadavg()[0], "runs": {}}
    with PostgresCluster() as pg:
        db = pg.create_database("bench")
        dsn = pg.dsn(dbname=db)
        pg.execute("CREATE TABLE bench_table (id bigint PRIMARY KEY, n int, label text, amount numeric(12,2), "
                   "at timestamptz, ratio float8, flag bool); CREATE PUBLICATION bench_pub FOR TABLE bench_table",
                   dbname=db)
        pg.execute(f"INSERT INTO bench_table SELECT g, g % 1000, 'label ' || g, g * 0.01, now(), g / 7.0, "
                   f"g % 2 = 0 FROM generate_series(1, {args.rows}) g", dbname=db)
        pg.execute("VACUUM ANALYZE bench_table", dbname=db)
        pages = pg.query("SELECT relpages FROM pg_class WHERE relname = 'bench_table'", dbname=db)[0][0]
        chunk_pages = max(1, -(-int(pages) // 64))
        for master in ("local[1]", "local[2]"):
            spark = _session(master)
            try:
                _frame_decode(spark, frame_path)       # warm-up
                decode = min(_frame_decode(spark, frame_path) for _ in range(args.rounds))
                snaps = []
                for i in range(args.rounds + 1):
                    snaps.append(_snapshot(spark, dsn, f"scale_{master[6]}_{i}", os.path.join(tmp, f"ck{master}{i}"),
                                           chunk_pages))
                best = min(s for s, _n in snaps[1:])
                assert all(n == args.rows + 1 for _s, n in snaps), snaps      # rows + the truncate row
                results["runs"][master] = {
                    "frame_decode_s": round(decode, 3), "frame_decode_rows_per_s": round(args.rows / decode),
                    "snapshot_s": round(best, 3), "snapshot_rows_per_s": round(args.rows / best),
                    "snapshot_chunks": 64}
                print(master, results["runs"][master], flush=True)
            finally:
                spark.stop()
    one, two = results["runs"]["local[1]"], results["runs"]["local[2]"]
    results["speedup"] = {"frame_decode": round(one["frame_decode_s"] / two["frame_decode_s"], 2),
                          "snapshot": round(one["snapshot_s"] / two["snapshot_s"], 2)}
    results["load_average_at_end"] = os.getloadavg()[0]
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["speedup"]))


if __name__ == "__main__":
    main()
