"""How a large micro-batch's apply scales with cores: local mode against a 2-worker standalone cluster, the
resolution whole against in parts, in one run.

    python -m benchmarks.apply_scale [--rows 1000000] [--changes 2000000] [--rounds 2]
                                     [--out benchmarks/results/apply_scale.json]

One throwaway PostgreSQL 15 (bench_pipeline's table: bigint key, int, text, numeric(12,2), timestamptz, float8,
bool) of `--rows` rows is snapshotted into Delta by the pipeline job; then a backlog of `--changes` changes
(bench_pipeline's: transactions of 600 updates spread over the table, 200 deletes, 200 inserts) is applied by the
job from copies of its slot, checkpoint and tables, once per configuration and round:

* the master: ``local[1]`` (one task slot), ``local[2]`` (two), or a standalone cluster of two workers of one core
  each (``spockwire.testing.SparkCluster``: executors in JVMs of their own), which read the micro-batch's range as
  two halves side by side (``splitWalBytes=1``);
* the resolution: whole (``SPOCKWIRE_RESOLVE_THREADS=1``) or in parts by key on the driver's cores (the default).

Each run's one micro-batch is taken apart from the job's timings (``SPOCKWIRE_JOB_TIMINGS``): ``read`` (the Spark
job: the tasks decode the range and write Arrow files), then on the driver ``stored`` (the touched keys' stored
rows: every file of the table here), ``resolve`` and ``write`` (the new files and the commit); and from its
lines the time from the query's start to the batch's Delta commit. Every run's table is checked against the
source. The medians per configuration go to `--out` and to stdout as a table.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

CONFIGS = [("local[1]", "whole"), ("local[1]", "parts"), ("local[2]", "whole"), ("local[2]", "parts"),
           ("cluster 2x1", "whole"), ("cluster 2x1", "parts")]
STEPS = ("read", "stored", "resolve", "write")


def _timings(log: str) -> dict[str, float]:
    """The job's timings line of its one micro-batch with rows of t (the last such line of its log)."""
    found: dict[str, float] = {}
    with open(log) as fh:
        for line in fh:
            if line.startswith("timings ") and "'public.t'" in line:
                found = ast.literal_eval(line[len("timings "):].strip())
    return {step: found.get("read" if step == "read" else f"public.t.{step}", 0.0) for step in STEPS}


def _cluster_args(cluster: Any, root: str) -> list[str]:
    conf = {"spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "1g",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0", "spark.executorEnv.PYTHONPATH": root}
    args = ["--master", cluster.master_url]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ["SPOCKWIRE_BENCH_PIPELINE_ROWS"] = str(args.rows)
    os.environ["SPOCKWIRE_JOB_TIMINGS"] = "1"
    from benchmarks import bench_pipeline as bp
    from spockwire.testing import PostgresCluster, SparkCluster

    work = tempfile.mkdtemp(prefix="spockwire-apply-scale-")
    runs: list[dict] = []
    try:
        with PostgresCluster({"shared_buffers": "512MB", "max_wal_size": "8GB",
                              "logical_decoding_work_mem": "64MB"}, major=15) as pg, \
                SparkCluster(workers=2, cores=1, memory="1500m") as cluster:
            db = pg.create_database("apply_scale")
            pg.execute(bp.TABLE_SQL.format(name="t"), dbname=db)
            pg.execute(bp.ROWS_SQL.format(name="t", rows=args.rows), dbname=db)
            pg.execute("VACUUM (FREEZE, ANALYZE) t", dbname=db)
            pg.execute(bp.CHANGES_SQL, dbname=db)
            pg.execute("CREATE PUBLICATION pub FOR TABLE t", dbname=db)
            pl = bp.Pipeline(pg, db, work)
            base = bp.Job(pl, "base", "t", slot="s_base").run()
            assert bp.check_equal(pl.dsn, "t", base.path()) == args.rows
            pl.next_txn = 0
            write_s = pl.changes(args.changes)
            print(f"backlog of {args.changes:,} changes written in {write_s:.1f} s", file=sys.stderr)
            n = 0
            for rnd in range(args.rounds):
                for master, resolution in CONFIGS:
                    name = f"run{n}"
                    n += 1
                    pg.query(f"SELECT pg_copy_logical_replication_slot('s_base', 's_{name}')", dbname=db)
                    shutil.copytree(os.path.join(work, "base"), os.path.join(work, name))
                    job = bp.Job(pl, name, "t", slot=f"s_{name}")
                    at = job.cmd.index("--master")
                    del job.cmd[at:at + 2]
                    job.cmd += _cluster_args(cluster, bp.ROOT) + ["--option", "splitWalBytes=1"] \
                        if master.startswith("cluster") else ["--master", master]
                    os.environ["SPOCKWIRE_RESOLVE_THREADS"] = "1" if resolution == "whole" else ""
                    job.run()
                    assert job.rows() == args.changes, (name, job.rows())
                    bp.check_equal(pl.dsn, "t", job.path())
                    batch = [r for _t, r in job.batches() if int(r.get("rows", {}).get("public.t", 0))]
                    timing = job.timing()
                    ready_to_done = round(timing["done"] - timing["ready"], 3) if timing["done"] else None
                    runs.append({"round": rnd, "master": master, "resolution": resolution,
                                 "batch_seconds": round(sum(float(r["seconds"]) for r in batch), 3),
                                 "micro_batches": len(batch), "ready_to_done_s": ready_to_done,
                                 **{f"{k}_s": round(v, 3) for k, v in _timings(job.log).items()}})
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
                    bp._drop_slot(pl, f"s_{name}")
                    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    finally:
        os.environ.pop("SPOCKWIRE_RESOLVE_THREADS", None)
        shutil.rmtree(work, ignore_errors=True)
    summary = []
    for master, resolution in CONFIGS:
        mine = [r for r in runs if (r["master"], r["resolution"]) == (master, resolution)]
        row = {"master": master, "resolution": resolution, "runs": len(mine)}
        for key in ["batch_seconds", "ready_to_done_s"] + [f"{s}_s" for s in STEPS]:
            row[key] = round(statistics.median(r[key] for r in mine), 3)
        row["apply_s"] = round(row["stored_s"] + row["resolve_s"] + row["write_s"], 3)
        summary.append(row)
    result = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": args.rows,
              "changes": args.changes, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "load_average": os.getloadavg(), "summary": summary, "runs": runs}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    print("| master | resolution | ready to done s | micro-batch s | read s | stored s | resolve s | write s | "
          "apply s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in summary:
        print(f"| {r['master']} | {r['resolution']} | {r['ready_to_done_s']} | {r['batch_seconds']} | {r['read_s']} | "
              f"{r['stored_s']} | {r['resolve_s']} | {r['write_s']} | {r['apply_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
