"""Distributed decode of a frame file on Spark: local[1] against local[2].

    python -m pytest benchmarks/bench_spark.py -o python_files='bench_*.py' --benchmark-only

The frame file holds the benchmark INSERT workload (benchmarks/workloads.py: 7 typed columns, 1,000-row
transactions; SPOCKWIRE_BENCH_SPARK_ROWS rows, default 400,000). `decode_frame_file` cuts it into chunks of
about 4 MiB (at transaction boundaries, each with the relation metadata it needs) and decodes them with
`mapInArrow`; the result is written to Spark's `noop` sink so that every row is decoded and converted to Spark
types. One SparkSession per master; `extra_info` has rows/s and the chunk count. Spark's fixed costs (task
scheduling, Python worker start, Arrow transfer to the JVM) are part of the measurement.
"""
from __future__ import annotations

import os
import pathlib

import pytest

from benchmarks.workloads import pgoutput_inserts
from spockwire.frames import encode_file_header

ROWS = int(os.environ.get("SPOCKWIRE_BENCH_SPARK_ROWS", "400000"))
CHUNK = 4 << 20
ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def frame_file(tmp_path_factory):
    work = pgoutput_inserts(ROWS, 1000)
    path = tmp_path_factory.mktemp("spark-bench") / "inserts.spwf"
    path.write_bytes(encode_file_header("pgoutput", slot="bench") + work.body)
    return str(path), work


def _session(master: str):
    from pyspark.sql import SparkSession

    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])
    spark = (SparkSession.builder.master(master).appName(f"spockwire-bench-{master}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.mark.parametrize("master", ["local[1]", "local[2]"])
def test_distributed_decode(benchmark, frame_file, master):
    from spockwire.spark import decode_frame_file
    from spockwire.spark.distributed import plan_chunks

    path, work = frame_file
    spark = _session(master)
    try:
        _header, chunks, _scan = plan_chunks(path, CHUNK)

        def run():
            df = decode_frame_file(spark, path, "public.bench_orders", chunk_bytes=CHUNK)
            df.write.format("noop").mode("overwrite").save()

        run()  # warm-up: Python workers started, extension imported
        benchmark.pedantic(run, rounds=3, iterations=1)
        benchmark.extra_info.update({
            "rows": work.rows, "chunks": len(chunks), "master": master,
            "rows_per_s": round(work.rows / benchmark.stats.stats.mean),
            "payload_mb": round(work.payload_bytes / 1e6, 1),
        })
    finally:
        spark.stop()
