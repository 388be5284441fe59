"""The Spark pipeline: one slot's changes for several tables, each applied to a Delta table, exactly-once.

    python -m spockwire.spark.job --dsn "host=db dbname=shop user=cdc" --slot lake --publication lake_pub \\
        --table public.orders=id --table public.customers=id --target /lake/tables --checkpoint /lake/_ck

One streaming query reads the slot (the ``spockwire`` source, multi-table layout); every micro-batch is one Spark
job whose tasks hand the decoded changes over as Arrow files (the source's ``stagingPath``), read on the driver and
applied with :func:`spockwire.spark.apply_changes` to one
Delta table per source table, ``<target>/<schema>.<table>`` (resolved per key in Arrow, written through
delta-rs: an append for new keys, a MERGE otherwise). The query's checkpoint and the idempotence of
``apply_changes`` make it exactly-once: a batch that was applied but not yet committed to the checkpoint when the
driver died is read again from the same LSN range and applied again, which leaves the tables as they were (each
table's commit also records the batch, so a table that holds it skips it). Killing the driver (even with
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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .maintenance import (DEFAULT_SMALL_FILES, DEFAULT_VACUUM_RETENTION_HOURS, MIN_VACUUM_RETENTION_HOURS,
                          Maintenance, MaintenanceOptions)

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
    # after a micro-batch: state collection, OPTIMIZE, VACUUM of the tables it wrote (None: none)
    maintenance: MaintenanceOptions | None = field(default_factory=MaintenanceOptions)


@dataclass
class BatchReport:
    """What one applied micro-batch held."""

    batch_id: int
    rows: dict[str, int]
    seconds: float
    end_lsn: int | None = None       # the last commit LSN among its changes
    snapshot_rows: int = 0           # rows of the initial snapshot among them
    snapshot_by_table: dict[str, int] = field(default_factory=dict)
    lag_p50: float | None = None     # commit-to-Delta lag of its changes (seconds; snapshot rows left out)
    lag_p95: float | None = None
    read_seconds: float = 0.0        # reading the micro-batch into the driver (the source's read, Spark's job)
    maintenance: dict[str, dict] = field(default_factory=dict)   # per Delta table: maintenance.Maintenance's report


def staging_path(cfg: JobConfig) -> str:
    """Where the source's tasks hand each micro-batch over (Arrow files): inside the query's checkpoint."""
    return cfg.checkpoint.rstrip("/") + "/spockwire-batches"


def report_line(b: BatchReport) -> dict:
    """The job's JSON line for one micro-batch."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {"batch": b.batch_id, "rows": b.rows, "snapshot_rows": b.snapshot_rows, "seconds": r(b.seconds),
            "read_seconds": r(b.read_seconds), "lag_p50": r(b.lag_p50), "lag_p95": r(b.lag_p95),
            **({"maintenance": b.maintenance} if b.maintenance else {})}


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
    reader = reader.option("stagingPath", staging_path(cfg))
    for k, v in cfg.extra_options.items():
        reader = reader.option(k, v)
    return reader.load()


def apply_batch(cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None = None,
                query_id: Callable[[], str] | None = None) -> Callable[[Any, int], None]:
    """The foreachBatch function: the micro-batch's one Spark job (the source's tasks decode and write each table's
    changes as Arrow files: batch_files.py), each table's changes read on the driver, resolved and written to its
    Delta table(s) through delta-rs, the tables side by side.

    Each table's commit carries the idempotence token (``spockwire-<query id>``, batch id): a micro-batch replayed
    after the driver died between the Delta commit and Spark's checkpoint is skipped by the tables that hold it
    (and would change nothing anyway: `apply_changes` is idempotent per key)."""
    from .apply import apply_changes
    from .resolve import first_position

    keys = table_keys(cfg)
    maintenance = Maintenance(cfg.maintenance) if cfg.maintenance is not None else None

    def run(df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        batch = _MicroBatch.read(df)
        timings = {"read": time.monotonic() - t0}
        token = (f"spockwire-{query_id()}", int(batch_id)) if query_id is not None else None
        commit_ts: list[Any] = []
        maintained: dict[str, dict] = {}

        def one(table: str) -> None:
            changes = batch.changes(table)
            if changes is None:
                return
            commit_ts.append(_change_times(changes))
            for history in ((False, True) if cfg.history else (False,)):
                path = target_path(cfg.target, table, history)
                t1 = time.monotonic()
                apply_changes(changes, path, format="delta", engine="delta-rs", keys=keys[table],
                              stored_as_scd_type=2 if history else 1, idempotence=token)
                timings[table + ("_history" if history else "")] = time.monotonic() - t1
                if maintenance is not None:   # spark/maintenance.py: every earlier micro-batch is committed
                    maintained[os.path.basename(path)] = maintenance.after_batch(path, keys[table],
                                                                                 first_position(changes))

        # the tables are independent: their resolution and delta-rs writes run side by side
        with ThreadPoolExecutor(max_workers=min(4, len(cfg.tables))) as pool:
            for done in [pool.submit(one, t) for t in cfg.tables]:
                done.result()
        lag = _lag(commit_ts, time.time())
        batch.done()
        if os.environ.get("SPOCKWIRE_JOB_TIMINGS"):
            print("timings", {k: round(v, 2) for k, v in timings.items()}, file=sys.stderr, flush=True)
        if on_batch is not None:
            on_batch(BatchReport(batch_id, {t: int(batch.rows.get(t, 0)) for t in cfg.tables},
                                 time.monotonic() - t0, batch.last_lsn, sum(batch.snapshot.values()),
                                 {t: batch.snapshot.get(t, 0) for t in cfg.tables}, lag[0], lag[1],
                                 timings["read"], maintained))

    return run


class _MicroBatch:
    """A micro-batch on the driver: Arrow files written by the source's tasks (stagingPath), or the DataFrame's
    rows read into Arrow."""

    def __init__(self, files: dict[str, list[str]] | None, rows_table: Any, rows: dict[str, int],
                 snapshot: dict[str, int], last_lsn: int | None) -> None:
        self.files = files
        self.rows_table = rows_table
        self.rows = rows
        self.snapshot = snapshot
        self.last_lsn = last_lsn

    @classmethod
    def read(cls, df: Any) -> "_MicroBatch":
        import pyarrow.compute as pc

        from .batch_files import MANIFEST_ARROW

        table = df.toArrow()            # the micro-batch's one Spark job
        if table.schema.names == MANIFEST_ARROW.names:
            files: dict[str, list[str]] = {}
            rows: dict[str, int] = {}
            snap: dict[str, int] = {}
            for r in table.to_pylist():
                files.setdefault(r["_table"], []).append(r["path"])
                rows[r["_table"]] = rows.get(r["_table"], 0) + r["rows"]
                snap[r["_table"]] = snap.get(r["_table"], 0) + r["snapshot_rows"]
            last = pc.max(table.column("last_lsn")).as_py() if table.num_rows else None
            return cls(files, None, rows, snap, last)
        s = _summary(table)
        return cls(None, table, s.rows, s.snapshot, s.last_lsn)

    def changes(self, table: str) -> Any:
        """One table's changes (change columns + the table's columns), or None when the batch has none."""
        from .apply import select_table_arrow
        from .batch_files import read_files

        if self.files is not None:
            return read_files(self.files[table]) if table in self.files else None
        if not self.rows.get(table):
            return None
        return select_table_arrow(self.rows_table, table)

    def done(self) -> None:
        """The batch is applied: its files go."""
        from .batch_files import delete_files

        if self.files:
            delete_files([p for paths in self.files.values() for p in paths])


@dataclass
class _Summary:
    rows: dict[str, int]
    snapshot: dict[str, int]
    last_lsn: int | None


def _summary(batch: Any) -> _Summary:
    """Rows per table, snapshot rows per table, and the last commit LSN of a micro-batch (Arrow)."""
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return _Summary({}, {}, None)
    snapshot = pc.and_(pc.equal(batch.column("_change_type"), "insert"), pc.is_null(batch.column("_xid")))
    counts = batch.select(["_table"]).append_column("snap", pc.cast(snapshot, "int64")).group_by("_table") \
        .aggregate([([], "count_all"), ("snap", "sum")]).to_pylist()
    last = pc.max(batch.column("_commit_lsn")).as_py()
    return _Summary({r["_table"]: r["count_all"] for r in counts}, {r["_table"]: int(r["snap_sum"]) for r in counts},
                    last)


def _change_times(changes: Any) -> Any:
    """The commit times of a table's changes (snapshot rows, whose commit time is the snapshot's, left out)."""
    import pyarrow.compute as pc

    keep = pc.or_(pc.not_equal(changes.column("_change_type"), "insert"), pc.is_valid(changes.column("_xid")))
    return pc.cast(changes.column("_commit_ts").filter(keep).drop_null(), "int64")


def _lag(times: list[Any], now: float) -> tuple[float | None, float | None]:
    """p50 and p95 of the commit-to-Delta lag (now - `_commit_ts`) of a micro-batch's changes, in seconds."""
    import numpy as np

    micros = [t.to_numpy() for t in times if len(t)]
    if not micros:
        return None, None
    ages = now - np.concatenate(micros) / 1e6
    return float(np.percentile(ages, 50)), float(np.percentile(ages, 95))


def table_keys(cfg: JobConfig) -> dict[str, list[str]]:
    """Each table's key columns: the job's ``--table NAME=KEY``, else the table's replica identity read from the
    server. A table with neither is an error here, before the query starts."""
    from .schema import read_table_relation
    from .slot import _connect

    out: dict[str, list[str]] = {t: list(k) for t, k in cfg.tables.items() if k}
    missing = [t for t in cfg.tables if t not in out]
    if missing:
        with _connect(cfg.dsn) as conn, conn.cursor() as cur:
            for table in missing:
                keys = [c.name for c in read_table_relation(cur, table).columns if c.is_key]
                if not keys:
                    raise ValueError(f"{table} has no key: its replica identity names no column (REPLICA IDENTITY "
                                     f"FULL or NOTHING, or no primary key); give one with --table {table}=COLUMN[,...]")
                out[table] = keys
    return out


def start(spark: Any, cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None = None) -> Any:
    """Start the streaming query (from its checkpoint, when there is one)."""
    started = threading.Event()
    holder: dict[str, str] = {}

    def query_id() -> str:
        # the query's id is kept in its checkpoint: a replayed batch has the same one, a new checkpoint a new one
        if not started.wait(120):
            raise RuntimeError("the streaming query did not report its id")
        return holder["id"]

    from .batch_files import clear

    clear(staging_path(cfg))         # files of a batch in flight when an earlier run stopped
    query = (_reader(spark, cfg).writeStream.foreachBatch(apply_batch(cfg, on_batch, query_id))
             .option("checkpointLocation", cfg.checkpoint).queryName(f"spockwire_{cfg.slot}")
             .trigger(processingTime=f"{int(cfg.trigger_seconds * 1000)} milliseconds").start())
    holder["id"] = str(query.id)
    started.set()
    return query


def end_lsn(progress: Any) -> int | None:
    """The end offset (an LSN) of the last completed micro-batch in a query progress report; None while the
    initial snapshot is still being read (its offsets hold the slot's consistent point from the first batch on)."""
    from ..connection.slots import parse_lsn

    sources = (progress or {}).get("sources") or []
    end = sources[0].get("endOffset") if sources else None
    if not end:
        return None
    if isinstance(end, str):
        end = json.loads(end)
    if not isinstance(end, dict):
        return None
    if "snapshot" in end and int(end.get("done", 0)) < len(end.get("chunks") or ()):
        return None
    lsn = end.get("lsn")
    return parse_lsn(lsn) if lsn else None


def flush_lsn(dsn: str) -> int:
    from .slot import _connect, current_flush_lsn

    with _connect(dsn) as conn, conn.cursor() as cur:
        return current_flush_lsn(cur)


def wait_caught_up(query: Any, target_lsn: int, timeout: float = 600.0,
                   tick: Callable[[], None] | None = None, slot_lsn: Callable[[], int | None] | None = None
                   ) -> None:
    """Until the query has applied every change committed before `target_lsn` (a flush LSN read after the
    writes of interest committed). `slot_lsn`: the slot's confirmed position (it moves only once a micro-batch
    is committed), for a query that has nothing to read at all and so reports no offset."""
    deadline = time.monotonic() + timeout
    while True:
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        end = end_lsn(query.lastProgress)
        if end is not None and end >= target_lsn and not query.status["isDataAvailable"]:
            return
        if slot_lsn is not None and not query.status["isDataAvailable"] and not query.status["isTriggerActive"]:
            confirmed = slot_lsn()
            if confirmed is not None and confirmed >= target_lsn and end_lsn(query.lastProgress) is None \
                    and _no_data_read(query):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the query did not catch up within {timeout:.0f}s (last progress: "
                               f"{query.lastProgress})")
        if tick is not None:
            tick()
        time.sleep(0.2)


def _no_data_read(query: Any) -> bool:
    """The query has not read a row since it started (every progress report, if any, without input)."""
    return all(not p.get("numInputRows") for p in (query.recentProgress or []))


def _slot_lsn(cfg: JobConfig) -> Callable[[], int | None]:
    def read() -> int | None:
        from .slot import _connect, slot_position

        with _connect(cfg.dsn) as conn, conn.cursor() as cur:
            pos = slot_position(cur, cfg.slot)
        return pos[0] if pos else None

    return read


def _parse_table(text: str) -> tuple[str, tuple[str, ...] | None]:
    name, _, keys = text.partition("=")
    name = name.strip()
    if "." not in name:
        name = f"public.{name}"
    return name, tuple(k.strip() for k in keys.split(",") if k.strip()) or None


def _count(text: str) -> int:
    """--optimize-every / --optimize-small-files: 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more)")
    return n


def _retention(text: str) -> float | None:
    """--vacuum-retention-hours: whole hours, at least the minimum, or off."""
    if text.strip().lower() == "off":
        return None
    try:
        hours = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of hours (or off)") from None
    if hours < MIN_VACUUM_RETENTION_HOURS:
        raise argparse.ArgumentTypeError(f"{hours} is below the minimum of {MIN_VACUUM_RETENTION_HOURS:g} hour(s): "
                                         f"readers of recent versions would fail")
    return float(hours)


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
    p.add_argument("--optimize-every", type=_count, default=0, metavar="N",
                   help="OPTIMIZE a table every N micro-batches that wrote it (default 0: by --optimize-small-files)")
    p.add_argument("--optimize-small-files", type=_count, default=DEFAULT_SMALL_FILES, metavar="K",
                   help=f"OPTIMIZE a table once it has K data files under half the target file size (default "
                        f"{DEFAULT_SMALL_FILES}; 0: never)")
    p.add_argument("--optimize-mode", choices=("zorder", "compact"), default="zorder",
                   help="zorder (default): rewrite the table Z-ordered by its key, for key-range file pruning; "
                        "compact: bin small files only")
    p.add_argument("--vacuum-retention-hours", type=_retention, default=DEFAULT_VACUUM_RETENTION_HOURS, metavar="H",
                   help=f"after an OPTIMIZE, VACUUM files older than H hours that no version references (default "
                        f"{DEFAULT_VACUUM_RETENTION_HOURS:g}; at least {MIN_VACUUM_RETENTION_HOURS:g}; off: no VACUUM)")
    p.add_argument("--no-maintenance", action="store_true",
                   help="no state collection, OPTIMIZE or VACUUM")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--until-caught-up", action="store_true",
                   help="stop once every change committed before the job started is applied")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    cfg = JobConfig(dsn=args.dsn, slot=args.slot, publication=[s for s in args.publication.split(",") if s],
                    tables=dict(_parse_table(t) for t in args.table), target=args.target,
                    checkpoint=args.checkpoint, starting_position=args.starting_position,
                    max_changes_per_batch=args.max_changes_per_batch,
                    extra_options=dict(o.split("=", 1) for o in args.option), history=args.history,
                    maintenance=None if args.no_maintenance else MaintenanceOptions(
                        optimize_every=args.optimize_every, small_files=args.optimize_small_files,
                        zorder=args.optimize_mode == "zorder", vacuum_retention_hours=args.vacuum_retention_hours))
    spark = spark_session(args.master, app="spockwire-job")
    lock = threading.Lock()

    def report(b: BatchReport) -> None:
        with lock:
            print(json.dumps(report_line(b)), flush=True)

    target = flush_lsn(cfg.dsn) if args.until_caught_up else None
    query = start(spark, cfg, report)
    print(json.dumps({"started": True, "pid": os.getpid()}), flush=True)
    try:
        if target is not None:
            wait_caught_up(query, target, timeout=args.timeout,
                           slot_lsn=None if cfg.starting_position == "snapshot" else _slot_lsn(cfg))
            print(json.dumps({"caught_up": True}), flush=True)
        else:
            query.awaitTermination()
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
