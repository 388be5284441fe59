"""The Spark pipeline: one slot's changes for several tables, each applied to a Delta table, exactly-once.

    python -m spockwire.spark.job --dsn "host=db dbname=shop user=cdc" --slot lake --publication lake_pub \\
        --table public.orders=id --table public.customers=id --target /lake/tables --checkpoint /lake/_ck

One streaming query reads the slot (the ``spockwire`` source, multi-table layout); every micro-batch is read
once (``localCheckpoint``) and applied with :func:`spockwire.spark.apply_changes` to one Delta table per source
table, ``<target>/<schema>.<table>``. The query's checkpoint and the idempotence of ``apply_changes`` make it
exactly-once: a batch that was applied but not yet committed to the checkpoint when the driver died is read again
from the same LSN range and applied again, which leaves the tables as they were. Killing the driver (even with
SIGKILL) and starting the same command again therefore neither loses nor repeats a change.

`spockwire demo` runs this pipeline in its own process; the kill -9 test (tests/test_spark_exactly_once.py)
runs it as a child process and kills it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = ["JobConfig", "BatchReport", "spark_session", "target_path", "start", "wait_caught_up", "main"]


@dataclass
class JobConfig:
    """What the pipeline reads and where it writes."""

    dsn: str
    slot: str
    publication: Sequence[str]
    tables: Mapping[str, Sequence[str] | None]   # "schema.table" -> key columns (None: the replica identity)
    target: str                                   # folder of the Delta tables
    checkpoint: str                               # the streaming query's checkpoint folder
    starting_position: str | None = None         # the source's startingPosition option ("snapshot")
    max_changes_per_batch: int | None = None
    trigger_seconds: float = 0.5
    create_slot: bool = False
    extra_options: Mapping[str, str] = field(default_factory=dict)
    history: bool = False                         # also an SCD 2 table per source table (<table>_history)


@dataclass
class BatchReport:
    """What one applied micro-batch held."""

    batch_id: int
    rows: dict[str, int]
    seconds: float
    end_lsn: int | None = None       # the last commit LSN among its changes
    snapshot_rows: int = 0           # rows of the initial snapshot among them
    snapshot_by_table: dict[str, int] = field(default_factory=dict)


def target_path(target: str, table: str, history: bool = False) -> str:
    """The Delta table of a source table: ``<target>/<schema>.<table>`` (SCD 1), ``<target>/<schema>.<table>_history``
    (SCD 2)."""
    name = table if "." in table else f"public.{table}"
    return os.path.join(target, name + ("_history" if history else ""))


def spark_session(master: str = "local[2]", app: str = "spockwire-pipeline", impl: str | None = None) -> Any:
    """A local SparkSession set up for the pipeline: small shuffles, no UI, UTC, quiet logs.

    Spark's Python workers run this interpreter and decode with `impl` (default: the implementation this process
    selected)."""
    from pyspark.sql import SparkSession

    import spockwire

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = master[len("local["):-1] if master.startswith("local[") else "2"
    parallel = "2" if cores in ("*", "") else cores
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.executorEnv.SPOCKWIRE_IMPL", impl or spockwire.__impl__)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", parallel)
             .config("spark.default.parallelism", parallel)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.adaptive.enabled", "false")
             .config("spark.sql.streaming.pollingDelay", "10ms")
             # a Python process the JVM starts may take long to connect back on a busy machine (the default is 15 s)
             .config("spark.python.authenticate.socketTimeout", "120s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import spockwire.spark

    spockwire.spark.register(spark)
    return spark


def _reader(spark: Any, cfg: JobConfig) -> Any:
    reader = (spark.readStream.format("spockwire").option("dsn", cfg.dsn).option("slot", cfg.slot)
              .option("plugin", "pgoutput").option("publication", ",".join(cfg.publication))
              .option("tables", ",".join(cfg.tables)))
    if cfg.starting_position:
        reader = reader.option("startingPosition", cfg.starting_position)
    if cfg.max_changes_per_batch:
        reader = reader.option("maxChangesPerBatch", str(cfg.max_changes_per_batch))
    if cfg.create_slot:
        reader = reader.option("createSlot", "true")
    for k, v in cfg.extra_options.items():
        reader = reader.option(k, v)
    return reader.load()


def apply_batch(cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None = None
                ) -> Callable[[Any, int], None]:
    """The foreachBatch function: the micro-batch, read once, applied to each table's Delta table."""
    from pyspark.sql import functions as F

    from .apply import apply_changes, select_table

    def run(df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        batch = df.localCheckpoint(eager=True)
        timings = {"read": time.monotonic() - t0}
        snapshot_row = (F.col("_change_type") == "insert") & F.col("_xid").isNull()
        found = batch.groupBy("_table").agg(F.count(F.lit(1)).alias("n"), F.max("_commit_lsn").alias("lsn"),
                                            F.count(F.when(snapshot_row, 1)).alias("snap")).collect()
        counts = {r["_table"]: r["n"] for r in found}
        snapshot_rows = {r["_table"]: int(r["snap"]) for r in found}
        last = max((r["lsn"] for r in found if r["lsn"] is not None), default=None)

        def one(table: str, history: bool) -> None:
            path = target_path(cfg.target, table, history)
            if not counts.get(table) and os.path.exists(os.path.join(path, "_delta_log")):
                return
            t1 = time.monotonic()
            keys = cfg.tables[table]
            apply_changes(select_table(batch, table), path, format="delta", keys=list(keys) if keys else None,
                          stored_as_scd_type=2 if history else 1)
            timings[table + ("_history" if history else "")] = time.monotonic() - t1

        # the tables are independent: their Spark jobs run side by side (the driver's planning and the
        # delta-rs commits overlap the executors' work)
        work = [(t, h) for t in cfg.tables for h in ((False, True) if cfg.history else (False,))]
        with ThreadPoolExecutor(max_workers=min(4, len(work))) as pool:
            for done in [pool.submit(one, t, h) for t, h in work]:
                done.result()
        if os.environ.get("SPOCKWIRE_JOB_TIMINGS"):
            print("timings", {k: round(v, 2) for k, v in timings.items()}, file=sys.stderr, flush=True)
        if on_batch is not None:
            on_batch(BatchReport(batch_id, {t: int(counts.get(t, 0)) for t in cfg.tables}, time.monotonic() - t0,
                                 last, sum(snapshot_rows.values()),
                                 {t: snapshot_rows.get(t, 0) for t in cfg.tables}))

    return run


def start(spark: Any, cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None = None) -> Any:
    """Start the streaming query (from its checkpoint, when there is one)."""
    return (_reader(spark, cfg).writeStream.foreachBatch(apply_batch(cfg, on_batch))
            .option("checkpointLocation", cfg.checkpoint).queryName(f"spockwire_{cfg.slot}")
            .trigger(processingTime=f"{int(cfg.trigger_seconds * 1000)} milliseconds").start())


def end_lsn(progress: Any) -> int | None:
    """The end offset (an LSN) of the last completed micro-batch in a query progress report."""
    from ..connection.slots import parse_lsn

    sources = (progress or {}).get("sources") or []
    end = sources[0].get("endOffset") if sources else None
    if not end:
        return None
    if isinstance(end, str):
        end = json.loads(end)
    lsn = end.get("lsn") if isinstance(end, dict) else None
    return parse_lsn(lsn) if lsn else None


def flush_lsn(dsn: str) -> int:
    from .slot import _connect, current_flush_lsn

    with _connect(dsn) as conn, conn.cursor() as cur:
        return current_flush_lsn(cur)


def wait_caught_up(query: Any, target_lsn: int, timeout: float = 600.0,
                   tick: Callable[[], None] | None = None) -> None:
    """Until the query has applied every change committed before `target_lsn` (a flush LSN read after the
    writes of interest committed)."""
    deadline = time.monotonic() + timeout
    while True:
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        end = end_lsn(query.lastProgress)
        if end is not None and end >= target_lsn and not query.status["isDataAvailable"]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the query did not catch up within {timeout:.0f}s (last progress: "
                               f"{query.lastProgress})")
        if tick is not None:
            tick()
        time.sleep(0.2)


def _parse_table(text: str) -> tuple[str, tuple[str, ...] | None]:
    name, _, keys = text.partition("=")
    name = name.strip()
    if "." not in name:
        name = f"public.{name}"
    return name, tuple(k.strip() for k in keys.split(",") if k.strip()) or None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spockwire.spark.job", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE[=KEY,...]",
                   help="a source table and its key columns (default: its replica identity); repeatable")
    p.add_argument("--target", required=True, help="folder of the Delta tables")
    p.add_argument("--checkpoint", required=True, help="the streaming query's checkpoint folder")
    p.add_argument("--starting-position", default=None, help="the source's startingPosition (snapshot)")
    p.add_argument("--max-changes-per-batch", type=int, default=None)
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any other option of the spockwire source (snapshotChunkPages=64, ...); repeatable")
    p.add_argument("--history", action="store_true",
                   help="also keep an SCD 2 table per source table (<target>/<schema>.<table>_history)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--until-caught-up", action="store_true",
                   help="stop once every change committed before the job started is applied")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    cfg = JobConfig(dsn=args.dsn, slot=args.slot, publication=[s for s in args.publication.split(",") if s],
                    tables=dict(_parse_table(t) for t in args.table), target=args.target,
                    checkpoint=args.checkpoint, starting_position=args.starting_position,
                    max_changes_per_batch=args.max_changes_per_batch,
                    extra_options=dict(o.split("=", 1) for o in args.option), history=args.history)
    spark = spark_session(args.master, app="spockwire-job")
    lock = threading.Lock()

    def report(b: BatchReport) -> None:
        with lock:
            print(json.dumps({"batch": b.batch_id, "rows": b.rows, "snapshot_rows": b.snapshot_rows,
                              "seconds": round(b.seconds, 3)}), flush=True)

    target = flush_lsn(cfg.dsn) if args.until_caught_up else None
    query = start(spark, cfg, report)
    print(json.dumps({"started": True, "pid": os.getpid()}), flush=True)
    try:
        if target is not None:
            wait_caught_up(query, target, timeout=args.timeout)
            print(json.dumps({"caught_up": True}), flush=True)
        else:
            query.awaitTermination()
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
