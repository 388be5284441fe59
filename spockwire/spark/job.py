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

`spockwire pipeline` is this job as a command (settings file, progress lines, Prometheus metrics, a clean stop on
SIGTERM: spockwire/cli/pipeline_cmd.py, the same `run`). `spockwire demo` runs this pipeline in its own process; the kill -9 test (tests/test_spark_exactly_once.py)
runs it as a child process and kills it.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TextIO

from ..connection.slots import format_lsn
from ..errors import SparkEnvironmentError, SpockwireError
from .apply import target_path
from .environment import WorkerCheck, check_java
from .jvm_archive import driver_java_options
from .maintenance import (DEFAULT_SMALL_FILES, DEFAULT_VACUUM_RETENTION_HOURS, MIN_VACUUM_RETENTION_HOURS,
                          Maintenance, MaintenanceOptions, count_option, retention_option)
from .memory import configure_delta_allocator, release_memory, stop_planning_workers
from .read_ahead import ReadAheadPolicy

__all__ = ["JobConfig", "BatchReport", "JobError", "spark_session", "LOCAL_DRIVER_JAVA_OPTIONS", "target_path", "start",
           "wait_caught_up", "run", "main"]


class JobError(SpockwireError, ValueError):
    """The job cannot start or go on: a password in the dsn, the database refusing the connection, the streaming
    query failing."""


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
    password: str | None = field(default=None, repr=False)   # never part of `dsn`: the source's password option
    # after a micro-batch: state collection, OPTIMIZE, VACUUM of the tables it wrote (None: none)
    maintenance: MaintenanceOptions | None = field(default_factory=MaintenanceOptions)
    # name patterns ("public.*", "sales.order_?") of tables to leave out; with no table named, or a pattern among the
    # tables, the job takes every table of its publications that matches and follows them (publication_tables)
    exclude: Sequence[str] = ()
    follow: bool = False        # set by resolve_tables: tables that join the publications later are landed too
    patterns: Sequence[str] = ()   # set by resolve_tables: the table patterns a joining table must match
    # read the DDL capture's messages (connection/ddl_capture.py): None, read them when the database has it installed
    ddl_capture: bool | None = None
    # high availability (docs/high-availability.md): a failover slot (PostgreSQL 17+), and how long the job tries
    # to reach a primary again (a multi-host dsn finds the promoted one) before it gives up
    failover_slot: bool = False
    require_failover_safety: bool = False   # with failover_slot: fail (not warn) while no standby would hold the slot
    reconnect_timeout: float = 300.0
    # write tables another streaming query owns (spark/ownership.py), recording this one as their writer
    take_over: bool = False


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
    deferred: bool = False           # written while Spark read the next micro-batch (a snapshot's: DeferredWrites)
    reread: dict[str, str] = field(default_factory=dict)   # tables read again (schema change) -> at this LSN
    # tables without a key -> their updates and deletes not applied (no old row sent, or none stored equal to it)
    unapplied: dict[str, int] = field(default_factory=dict)


def staging_path(cfg: JobConfig) -> str:
    """Where the source's tasks hand each micro-batch over (Arrow files): inside the query's checkpoint."""
    return cfg.checkpoint.rstrip("/") + "/spockwire-batches"


def report_line(b: BatchReport) -> dict:
    """The job's JSON line for one micro-batch."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {"batch": b.batch_id, "rows": b.rows, "snapshot_rows": b.snapshot_rows, "seconds": r(b.seconds),
            "read_seconds": r(b.read_seconds), "lag_p50": r(b.lag_p50), "lag_p95": r(b.lag_p95),
            **({"maintenance": b.maintenance} if b.maintenance else {}), **({"deferred": True} if b.deferred else {}),
            **({"reread": b.reread} if b.reread else {}), **({"unapplied": b.unapplied} if b.unapplied else {})}


#: the driver JVM of a local session compiles with its quick compiler only (C1): on a few cores the optimizing
#: compiler's threads take CPU from the pipeline's Python, while the JVM's own work per micro-batch is small
#: (scheduling, checkpoint files). On 2 cores: a 500,000-change micro-batch 2.5 s instead of 2.7-3.1 s, and the job
#: starts 1-2 s sooner. It collects with the serial collector in a 64 MiB young generation: the JVM's few live
#: objects need neither G1's structures nor its larger young generation (the JVM at 357-382 MiB instead of
#: 421-543 MiB at a 5,000,000-change backlog's peak, jobs starting about 1 s sooner; benchmarks/analysis.md)
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmn64m"


def spark_session(master: str = "local[2]", app: str = "spockwire-pipeline", impl: str | None = None,
                  conf: Mapping[str, str] | None = None, remote: str | None = None,
                  check_workers: bool = True) -> Any:
    """A SparkSession set up for the pipeline: small shuffles, no UI, UTC, quiet logs; `conf`: more settings (they
    win), such as a cluster's ``spark.executor.memory``.

    Spark's Python workers run this interpreter (unless ``PYSPARK_PYTHON`` names another: on a cluster, the nodes'
    Python with spockwire) and decode with `impl` (default: the implementation this process selected). Without
    Java 17 it raises SparkEnvironmentError before Spark starts; `register` then checks the workers
    (spockwire.spark.environment; `check_workers` False: the caller does, as the job does with a WorkerCheck).
    `remote` (``sc://host:port``): a Spark Connect session on that server instead
    (its workers run the server's Python; `master`, `impl` and `conf` are the server's settings). Unless `remote`, it
    also sets delta-rs's allocator in this process to give freed memory back (``_RJEM_MALLOC_CONF``, unless the
    environment sets it: spockwire.spark.memory), and on a local master LOCAL_DRIVER_JAVA_OPTIONS with the class
    archive (spockwire.spark.jvm_archive, made on the first start) as the driver JVM's default options
    (``spark.driver.defaultJavaOptions``, which Spark puts before ``spark.driver.extraJavaOptions``) unless `conf`
    sets them."""
    from pyspark.sql import SparkSession

    import spockwire

    if remote:
        from .connect import connect_session

        return connect_session(remote)

    check_java()
    configure_delta_allocator()      # spark/memory.py: before deltalake is loaded in this process
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = master[len("local["):-1] if master.startswith("local[") else "2"
    parallel = "2" if cores in ("*", "") else cores
    builder = SparkSession.builder
    if master.startswith("local") and "spark.driver.defaultJavaOptions" not in (conf or {}):
        # with the class archive of spark/jvm_archive.py (made on the first start): the driver starts sooner
        builder = builder.config("spark.driver.defaultJavaOptions", driver_java_options(LOCAL_DRIVER_JAVA_OPTIONS))
    spark = (builder.master(master).appName(app)
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
             .config(map=dict(conf or {}))      # the caller's settings win
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import spockwire.spark

    spockwire.spark.register(spark, check_workers=check_workers)
    return spark


def _reader(spark: Any, cfg: JobConfig) -> Any:
    reader = (spark.readStream.format("spockwire").option("dsn", cfg.dsn).option("slot", cfg.slot)
              .option("plugin", "pgoutput").option("publication", ",".join(cfg.publication))
              .option("tables", ",".join(cfg.tables)))
    if cfg.password:
        reader = reader.option("password", cfg.password)     # an option Spark redacts (spark.redaction.regex)
    if cfg.starting_position:
        reader = reader.option("startingPosition", cfg.starting_position)
    if cfg.max_changes_per_batch:
        reader = reader.option("maxChangesPerBatch", str(cfg.max_changes_per_batch))
    if cfg.create_slot:
        reader = reader.option("createSlot", "true")
    if cfg.failover_slot:
        reader = reader.option("failoverSlot", "true")
        if cfg.require_failover_safety:
            reader = reader.option("requireFailoverSafety", "true")
    if cfg.follow:
        reader = reader.option("allTables", "true")     # tables that join the publications later come through
    if cfg.ddl_capture:
        reader = reader.option("pluginOption.messages", "true")   # the captured ALTER TABLE statements
    reader = reader.option("stagingPath", staging_path(cfg))
    slots = _task_slots(spark)
    if slots:
        reader = reader.option("snapshotTaskSlots", str(slots))
    for k, v in cfg.extra_options.items():
        reader = reader.option(k, v)
    return reader.load()


def _task_slots(spark: Any) -> int | None:
    """The task slots of the session's cluster (Spark's default parallelism: the cores of a local master, all
    executors' cores on a cluster); None where the session does not say (Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - a Spark Connect session has no SparkContext
        return None


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
    from .ownership import Ownership
    from .schema_changes import Reread, apply_shaped
    from .source_options import options_to_spec

    keys = table_keys(cfg)
    _say_how_tables_land(cfg, keys)
    spec = options_to_spec({"dsn": cfg.dsn, "slot": cfg.slot, "password": cfg.password, **cfg.extra_options})
    maintenance = Maintenance(cfg.maintenance) if cfg.maintenance is not None else None
    kinds = (False, True) if cfg.history else (False,)
    tables = list(cfg.tables)            # grows as tables join the publications (cfg.follow)
    publication = PublicationWatch(cfg) if cfg.follow else None
    diverged: set[str] = set()           # tables without a key said to differ from their source (keyless.divergence)
    owners = Ownership(cfg.take_over)

    def targets() -> list[tuple[str, bool]]:
        return [(t, h) for t in tables for h in kinds]
    ahead = ReadAheadPolicy(cfg.checkpoint)
    deferred = DeferredWrites()

    planned: list[bool] = []             # (picklable: over Spark Connect this function runs in the server)

    def run(df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        # a batch spanning much WAL: its targets' files are read while its Spark job decodes (read_ahead.py)
        started = ahead.start(int(batch_id), [target_path(cfg.target, t, h) for t, h in targets()])
        batch = _MicroBatch.read(df)
        read_s = time.monotonic() - t0
        if not planned:                  # the query is planned and read once: its planning workers idle from here
            planned.append(True)
            stop_planning_workers(df.sparkSession)       # spark/memory.py
        deferred.check()
        if batch.snapshot_more:
            # a snapshot batch with more of the snapshot to come: written while the next one is read (DeferredWrites)
            deferred.submit(lambda: write(batch, int(batch_id), t0, read_s, started, True))
            return
        deferred.wait()
        write(batch, int(batch_id), t0, read_s, started, False)

    def write(batch: "_MicroBatch", batch_id: int, t0: float, read_s: float, started: dict, behind: bool) -> None:
        timings = {"read": read_s}
        token = (f"spockwire-{query_id()}", batch_id) if query_id is not None else None
        commit_ts: list[Any] = []
        maintained: dict[str, dict] = {}
        reread = Reread(spec)            # schema_changes.py: a table described with other columns is read again
        reread_at: dict[str, str] = {}
        unapplied: dict[str, int] = {}

        def read(table: str) -> Any:
            t1 = time.monotonic()
            changes = batch.changes(table)
            timings[table + ".files"] = time.monotonic() - t1
            if changes is not None:
                commit_ts.extend(_change_times(c) for c in changes)
            return changes

        def one(table: str, changes: Any, history: bool) -> None:
            path = target_path(cfg.target, table, history)
            t1 = time.monotonic()
            existed = token is None or owners.check(path, token[0])      # one writer per table (ownership.py)

            def new_keys(k: list[str]) -> list[str]:   # a re-read's replica identity: the key, unless one was named
                if not cfg.tables.get(table) and k:
                    keys[table] = k
                return keys[table]

            done = apply_shaped(path, changes or [], keys[table], 2 if history else 1, token, reread, table,
                                lambda *a, **kw: apply_changes(*a, format="delta", engine="delta-rs", **kw),
                                new_keys, started.get(path), new_table_reread=cfg.follow)
            if not existed:
                owners.claim(path, token[0])
            name = table + ("_history" if history else "")
            timings[name] = time.monotonic() - t1
            for m in done.metrics:
                timings.update({f"{name}.{k}": v for k, v in m.seconds.items()})
            if not history:
                _unapplied(table, done.metrics, unapplied, diverged)
            if done.reread_lsn is not None and table not in reread_at:
                reread_at[table] = format_lsn(done.reread_lsn)
                print(f"spockwire: {table} was described with other columns upstream: read again at "
                      f"{reread_at[table]} (its Delta table now has the source's columns and rows)",
                      file=sys.stderr, flush=True)
            if maintenance is not None and done.metrics:   # spark/maintenance.py: every earlier micro-batch is committed
                maintained[os.path.basename(path)] = maintenance.after_batch(
                    path, keys[table], min((p for p in (first_position(c) for c in changes) if p is not None),
                                           default=None))

        # the targets (each table, and its history table beside it) are independent: their resolution and
        # delta-rs writes run side by side
        joined: list[str] = []
        if publication is not None:
            # tables that joined the publications (read now, as a snapshot would; a table whose first change came
            # before the check saw it too) and those that left them
            seen = publication.check(tables)[0] if not batch.from_snapshot else []
            seen += [t for t in (batch.files or {}) if t not in tables and t not in seen and publication.takes(t)]
            for table in seen:
                tables.append(table)
                keys[table] = publication.keys(table)
                joined.append(table)
            if seen:
                publication.say_how_tables_land({t: keys[t] for t in seen})
        with ThreadPoolExecutor(max_workers=min(4, len(targets()))) as pool:
            changes = dict(zip(tables, pool.map(read, tables)))
            for done in [pool.submit(one, t, changes[t], h) for t, h in targets()
                         if changes[t] is not None or t in joined]:
                done.result()
        ahead.finished(started)
        started.clear()
        lag = _lag(commit_ts, time.time())
        batch.done()
        if os.environ.get("SPOCKWIRE_JOB_TIMINGS"):
            print("timings", {k: round(v, 2) for k, v in timings.items()}, file=sys.stderr, flush=True)
        if on_batch is not None:
            on_batch(BatchReport(batch_id, {t: int(batch.rows.get(t, 0)) for t in tables},
                                 time.monotonic() - t0, batch.last_lsn, sum(batch.snapshot.values()),
                                 {t: batch.snapshot.get(t, 0) for t in tables}, lag[0], lag[1],
                                 timings["read"], maintained, behind, dict(reread_at), dict(unapplied)))

    run.drain = deferred.wait  # type: ignore[attr-defined]   # StopGate.finish: the deferred writes end first
    return run


class PublicationWatch:
    """The tables of a job that follows its publications (``JobConfig.follow``): which joined them since the last
    look and which left them (removed from a publication, or dropped). A table that joins is read whole at its
    next micro-batch (schema_changes.py: a re-read creates its Delta table) and streamed from then on; one that
    leaves keeps its Delta table as it was, and the job says so once."""

    def __init__(self, cfg: JobConfig) -> None:
        from .slot import ReusedConnection

        self.cfg = cfg
        self.conn = ReusedConnection(conninfo(cfg))
        self.gone: set[str] = set()

    def takes(self, table: str) -> bool:
        return _matches(table, self.cfg.patterns or ["*"]) and not _matches(table, self.cfg.exclude)

    def check(self, known: Sequence[str]) -> tuple[list[str], list[str]]:
        def look(conn: Any) -> list[str]:
            with conn.cursor() as cur:
                return publication_tables(self.cfg, cur)

        now = self.conn.run(look)
        joined = [t for t in now if t not in known]
        left = [t for t in known if t not in now and t not in self.gone]
        for table in left:
            self.gone.add(table)
            print(f"spockwire: {table} is no longer in the publication {','.join(self.cfg.publication)} (removed "
                  "from it, or dropped): its Delta table keeps the rows it had, and no later change reaches it",
                  file=sys.stderr, flush=True)
        self.gone -= set(now)
        return joined, left

    def say_how_tables_land(self, keys: Mapping[str, Sequence[str]]) -> None:
        """The start's lines (_say_how_tables_land) for tables that joined."""
        def say(conn: Any) -> None:
            with conn.cursor() as cur:
                _say_how_tables_land(self.cfg, keys, cur)

        self.conn.run(say)

    def keys(self, table: str) -> list[str]:
        """A joining table's key: the job's named key for it, else the one keyless.table_key finds (none: an empty
        list, the table lands as a bag of rows)."""
        from .keyless import table_key

        named = self.cfg.tables.get(table)
        if named:
            return list(named)

        def look(conn: Any) -> list[str]:
            with conn.cursor() as cur:
                return table_key(cur, table)

        return self.conn.run(look)


class DeferredWrites:
    """Snapshot micro-batches written to Delta while Spark reads the next one.

    A snapshot's micro-batch with more of the same snapshot to come (its files' ``snapshot_more``) is handed to one
    background thread, in order, and foreachBatch returns at once: Spark commits it and starts the next micro-batch,
    whose tasks read from the server while the driver writes this one's rows. This is safe for exactly these
    batches: an exported snapshot lives only as long as the driver that holds it, so a driver that dies before such
    a batch reaches Delta takes the snapshot along, and the restarted query reads the whole snapshot again from a
    new one, truncating the tables first (snapshot.py). The snapshot's last micro-batch, and every other one, waits
    for the deferred writes before it is applied, so a snapshot is complete in the checkpoint only once all of it is
    in Delta. A deferred write that fails fails the next micro-batch (the query stops; the next run starts the
    snapshot again); the ones queued after it are not run."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Any] = []
        self._failed: BaseException | None = None

    def submit(self, write: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spockwire-snapshot-write")
        self._pending.append(self._pool.submit(self._guarded, write))

    def _guarded(self, write: Callable[[], None]) -> None:
        if self._failed is not None:
            return                       # after a failure: not written (the query fails, the snapshot starts over)
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - raised to the micro-batch that checks or waits next
            self._failed = exc

    def check(self) -> None:
        """Raise the failure of a deferred write, if one failed."""
        if self._failed is not None:
            raise self._failed

    def wait(self) -> None:
        """Wait for every deferred write; raise the failure, if one failed."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        self.check()


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
        self.file_rows: dict[str, list[int]] = {}     # each file's row count, as its task wrote it
        self.snapshot_more = False       # a snapshot's micro-batch, more of the snapshot to come (DeferredWrites)
        self.from_snapshot = False       # read from the initial snapshot (its files' partitions are snapshot chunks)

    @classmethod
    def read(cls, df: Any) -> "_MicroBatch":
        import pyarrow.compute as pc

        from .batch_files import MANIFEST_ARROW, check_files

        table = df.toArrow()            # the micro-batch's one Spark job
        if table.schema.names == MANIFEST_ARROW.names:
            check_files(table)          # every file there for the driver (a staging folder that is not shared fails)
            files: dict[str, list[str]] = {}
            file_rows: dict[str, list[int]] = {}
            rows: dict[str, int] = {}
            snap: dict[str, int] = {}
            for r in table.to_pylist():
                files.setdefault(r["_table"], []).append(r["path"])
                file_rows.setdefault(r["_table"], []).append(r["rows"])
                rows[r["_table"]] = rows.get(r["_table"], 0) + r["rows"]
                snap[r["_table"]] = snap.get(r["_table"], 0) + r["snapshot_rows"]
            last = pc.max(table.column("last_lsn")).as_py() if table.num_rows else None
            batch = cls(files, None, rows, snap, last)
            batch.file_rows = file_rows
            batch.snapshot_more = table.num_rows > 0 and all(table.column("snapshot_more").to_pylist())
            batch.from_snapshot = any("/snapshot-" in p for p in table.column("path").to_pylist())
            return batch
        s = _summary(table)
        return cls(None, table, s.rows, s.snapshot, s.last_lsn)

    def changes(self, table: str) -> list[Any] | None:
        """One table's changes (change columns + the table's columns) as runs of one shape in stream order
        (schema_changes.segments: the table described again with other columns starts a run), or None when the
        batch has none."""
        from .apply import select_table_arrow
        from .batch_files import read_files
        from .schema_changes import segments

        if self.files is not None:
            if table not in self.files:
                return None
            rows = self.file_rows.get(table) or [None] * len(self.files[table])
            return segments([read_files([p], [n] if n is not None else None)
                             for p, n in zip(self.files[table], rows)])
        if not self.rows.get(table):
            return None
        return [select_table_arrow(self.rows_table, table)]

    def done(self) -> None:
        """The batch is applied: its files go."""
        from .batch_files import delete_files

        if self.files:
            delete_files([p for paths in self.files.values() for p in paths])
        release_memory()                 # spark/memory.py: the next batch starts from what is live


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
    """The commit times of a table's changes (snapshot rows and the snapshot's truncate rows, whose commit time is
    the snapshot's, left out: they have no transaction id)."""
    import pyarrow.compute as pc

    keep = pc.is_valid(changes.column("_xid"))
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
    """Each table's key columns: the job's ``--table NAME=KEY``, else the key its replica identity gives, read
    from the server's catalog at the start (keyless.table_key: the primary key or the replica identity index;
    under FULL or NOTHING the primary key, if any). A table with none maps to an empty list: it lands as a bag of
    rows (spockwire.spark.keyless)."""
    from .keyless import table_key
    from .slot import _connect

    out: dict[str, list[str]] = {t: list(k) for t, k in cfg.tables.items() if k}
    missing = [t for t in cfg.tables if t not in out]
    if missing:
        with _connect(conninfo(cfg)) as conn, conn.cursor() as cur:
            for table in missing:
                out[table] = table_key(cur, table)
    return out


def _say_how_tables_land(cfg: JobConfig, keys: Mapping[str, Sequence[str]], cur: Any = None) -> None:
    """At the start (and as a table joins), one line on stderr per table the job cannot follow exactly
    (keyless.landing_notes): actions its publications leave out, or no key and no old rows."""
    from .keyless import landing_notes
    from .slot import _connect

    if cur is None:
        with _connect(conninfo(cfg)) as conn, conn.cursor() as c:
            _say_how_tables_land(cfg, keys, c)
        return
    for table, key in keys.items():
        for line in landing_notes(cur, table, key, cfg.publication):
            print(line, file=sys.stderr, flush=True)


def _unapplied(table: str, metrics: Sequence[Any], counts: dict[str, int], said: set[str]) -> None:
    """Count a table's changes that could not be applied (a table without a key: ApplyMetrics.unapplied and
    unmatched) into `counts`; the first time, say in one line on stderr that the table no longer equals its
    source and why (keyless.divergence)."""
    from .keyless import divergence

    for m in metrics:
        n = m.unapplied + m.unmatched
        if not n:
            continue
        counts[table] = counts.get(table, 0) + n
        line = divergence(table, m)
        if table not in said and line is not None:
            said.add(table)
            print(line, file=sys.stderr, flush=True)


def _is_pattern(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(name, p if "." in p else f"public.{p}") for p in patterns)


def publication_tables(cfg: JobConfig, cur: Any = None) -> list[str]:
    """The tables of the job's publications ("schema.table"; a partitioned table's leaves as the publication
    publishes them) that its table patterns take and its exclusions leave."""
    from .slot import _connect

    sql = ("SELECT DISTINCT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = ANY(%s) "
           "ORDER BY 1")
    if cur is None:
        with _connect(conninfo(cfg)) as conn, conn.cursor() as c:
            c.execute(sql, (list(cfg.publication),))
            found = [r[0] for r in c.fetchall()]
    else:
        cur.execute(sql, (list(cfg.publication),))
        found = [r[0] for r in cur.fetchall()]
    patterns = cfg.patterns or ["*"]
    return [t for t in found if _matches(t, patterns) and not _matches(t, cfg.exclude)]


def resolve_tables(cfg: JobConfig) -> JobConfig:
    """The job's tables made concrete: with no table named or a name pattern among them, every table of the
    publications that the patterns take (and the exclusions leave), followed as the publications change
    (``follow``); named tables keep their keys. Also whether the database has the DDL capture (``ddl_capture``).
    A configuration resolved already is returned as it is."""
    import dataclasses

    if cfg.ddl_capture is None:
        from ..connection.ddl_capture import installed
        from .slot import _connect

        with _connect(conninfo(cfg)) as conn, conn.cursor() as cur:
            cfg = dataclasses.replace(cfg, ddl_capture=installed(cur))
    if cfg.follow or (cfg.tables and not any(_is_pattern(t) for t in cfg.tables)):
        if cfg.exclude and not cfg.follow:
            return dataclasses.replace(cfg, tables={t: k for t, k in cfg.tables.items()
                                                    if not _matches(t, cfg.exclude)})
        return cfg
    patterns = [t for t in cfg.tables if _is_pattern(t)] or ["*"]
    named = {t: k for t, k in cfg.tables.items() if not _is_pattern(t)}
    follow = dataclasses.replace(cfg, follow=True, patterns=patterns + list(named))
    tables = dict(named)
    for t in publication_tables(follow):
        tables.setdefault(t, None)
    return dataclasses.replace(follow, tables=tables)


def conninfo(cfg: JobConfig) -> str:
    """What the driver connects with: the dsn and the password."""
    from .slot import with_password

    return with_password(cfg.dsn, cfg.password)


def start(spark: Any, cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None = None,
          gate: "StopGate | None" = None, ready: Callable[[], None] | None = None) -> Any:
    """Start the streaming query (from its checkpoint, when there is one). `gate`: lets a stop wait for the
    micro-batch being applied (see `run`); `ready`: called before each micro-batch is applied (it raises to fail
    the query: the worker check)."""
    cfg = resolve_tables(cfg)
    started = threading.Event()
    holder: dict[str, str] = {}

    def query_id() -> str:
        # the query's id is kept in its checkpoint: a replayed batch has the same one, a new checkpoint a new one
        if not started.wait(120):
            raise RuntimeError("the streaming query did not report its id")
        return holder["id"]

    from .batch_files import clear

    clear(staging_path(cfg))         # files of a batch in flight when an earlier run stopped
    connect = _connect_plumbing(spark, cfg, on_batch)
    if connect is None:
        apply = apply_batch(cfg, on_batch, query_id)
        drain = apply.drain              # type: ignore[attr-defined]
        if ready is not None:
            apply = _after(ready, apply)
        function = gate.wrap(apply, drain) if gate is not None else apply
    else:                  # the function runs in the server's Python: no gate (a stop replays the batch in flight)
        function = apply_batch(cfg, *connect[:2])
    writer = (_reader(spark, cfg).writeStream.foreachBatch(function)
              .option("checkpointLocation", cfg.checkpoint).queryName(f"spockwire_{cfg.slot}")
              .trigger(processingTime=f"{int(cfg.trigger_seconds * 1000)} milliseconds"))
    if connect is None:
        query = writer.start()
    else:
        from .connect import start_query

        query = start_query(writer.start)
    holder["id"] = str(query.id)
    started.set()
    if connect is not None and on_batch is not None:
        connect[2](query)
    return query


def _after(ready: Callable[[], None], apply: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    def checked(df: Any, batch_id: int) -> None:
        ready()
        apply(df, batch_id)

    return checked


# --- Spark Connect ----------------------------------------------------------------------------------------------
# Over Spark Connect the foreachBatch function is pickled and runs in a Python process of the server: it learns the
# query's id from the checkpoint, and reports each micro-batch as a file in the checkpoint, which a thread of the
# client hands to `on_batch` (the client must see the checkpoint folder for the reports, as a driver does).

def reports_path(cfg: JobConfig) -> str:
    """Where the micro-batches' reports wait for the client (Spark Connect): inside the query's checkpoint."""
    return cfg.checkpoint.rstrip("/") + "/spockwire-reports"


def _connect_plumbing(spark: Any, cfg: JobConfig, on_batch: Callable[[BatchReport], None] | None
                      ) -> tuple[Any, Any, Callable[[Any], None]] | None:
    """For a Spark Connect session: (the foreachBatch function's reporter, its query id, a function starting the
    client's report thread for the started query); None for a classic session."""
    from .connect import CheckpointQueryId, ReportFiles, is_connect, tail_reports

    if not is_connect(spark):
        return None
    from .batch_files import clear

    folder = reports_path(cfg)
    clear(folder)                    # reports of an earlier run

    def follow(query: Any) -> None:
        assert on_batch is not None
        _REPORTS[id(query)] = tail_reports(folder, lambda: bool(query.isActive), lambda d: BatchReport(**d), on_batch)

    return (ReportFiles(folder) if on_batch is not None else None), CheckpointQueryId(cfg.checkpoint), follow


_REPORTS: dict[int, threading.Thread] = {}


def finish_reports(query: Any, timeout: float = 30.0) -> None:
    """After `query` stopped (Spark Connect): wait until every report its micro-batches left was handed over."""
    thread = _REPORTS.pop(id(query), None)
    if thread is not None:
        thread.join(timeout)
# --- end of Spark Connect ---------------------------------------------------------------------------------------


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
    from .slot import _connect, decodable_wal_end

    with _connect(dsn) as conn, conn.cursor() as cur:
        return decodable_wal_end(cur)


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
    # (the property: a Spark Connect client's progress reports carry the rows per source only)
    return all(not p.numInputRows for p in (query.recentProgress or []))


def _slot_lsn(cfg: JobConfig) -> Callable[[], int | None]:
    def read() -> int | None:
        from .slot import _connect, slot_position

        with _connect(conninfo(cfg)) as conn, conn.cursor() as cur:
            pos = slot_position(cur, cfg.slot)
        return pos[0] if pos else None

    return read


#: in the error of a micro-batch that a stop kept from being applied (it is not committed: the next run applies it)
STOPPING = "not applied: the job is stopping"


class StopGate:
    """How a stop finishes the micro-batch being applied, and no later one.

    `wrap` wraps the foreachBatch function. Once `finish` was called, a micro-batch that starts fails before it
    applies anything (Spark has logged its offsets but does not commit it: the next run reads it again); `finish`
    waits until the micro-batch in flight, if any, is applied (its deferred snapshot writes too: `drain`) and Spark
    has committed it to the checkpoint."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._running = False
        self._applied: int | None = None
        self._drain: Callable[[], None] | None = None

    def wrap(self, apply: Callable[[Any, int], None], drain: Callable[[], None] | None = None
             ) -> Callable[[Any, int], None]:
        self._drain = drain
        def run(df: Any, batch_id: int) -> None:
            with self._cond:
                if self._closed:
                    raise RuntimeError(f"micro-batch {batch_id} {STOPPING}")
                self._running = True
            try:
                apply(df, batch_id)
                self._applied = int(batch_id)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

        return run

    def finish(self, query: Any, commit_timeout: float = 120.0) -> int | None:
        """Close the gate, wait for the micro-batch being applied and for its commit; the last applied batch id."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._running)
            applied = self._applied
        if self._drain is not None:
            self._drain()
        deadline = time.monotonic() + commit_timeout
        # the batch's progress is reported once its commit is in the checkpoint (or the query ended)
        while applied is not None and query.isActive and time.monotonic() < deadline:
            progress = query.lastProgress
            if progress and int(progress["batchId"]) >= applied:
                break
            time.sleep(0.05)
        return applied


class _Stopping(Exception):
    pass


#: how many times a query whose Python worker did not connect back is started again before the job gives up
QUERY_RESTARTS = 3


#: in a query's failure: the source database went away (a restart, a failover) or cannot be reached yet
_CONNECTION_LOST = ("psycopg2.OperationalError", "psycopg2.InterfaceError", "ConnectionLost:",
                    "server closed the connection", "could not connect to server", "Connection refused",
                    "terminating connection due to administrator command", "the database system is shutting down",
                    "the database system is starting up", "the database system is in recovery mode",
                    "connection to server at", "SSL SYSCALL error")


def _connection_lost(query: Any) -> bool:
    """The query failed because its source database could not be reached (a restart, a promotion): starting it
    again from its checkpoint, through the dsn, resumes where it stopped."""
    exc = query.exception()
    text = "" if exc is None else str(exc)
    return any(marker in text for marker in _CONNECTION_LOST)


def _worker_did_not_connect(query: Any) -> bool:
    """The query failed because a Python process Spark started did not connect back within Spark's fixed timeout
    (its streaming source's runner, a worker): a failure of the machine's load, not of the data."""
    from .connect import WORKER_DID_NOT_CONNECT

    exc = query.exception()
    return exc is not None and WORKER_DID_NOT_CONNECT in str(exc)


def _failure(query: Any) -> JobError | None:
    """The query's failure as one line (the Python exception at the bottom of Spark's report), None when it did
    not fail or only refused a micro-batch because the job was stopping."""
    exc = query.exception()
    if exc is None:
        return None
    text = str(exc)
    if STOPPING in text:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    python = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Lost|Diverged|Unsafe): ", ln)]
    return JobError(f"the streaming query failed: {(python or lines or ['?'])[-1]}")


def run(cfg: JobConfig, *, master: str = "local[2]", until_caught_up: bool = False, timeout: float = 600.0,
        spark_conf: Mapping[str, str] | None = None, monitor: Any = None, stop: threading.Event | None = None,
        out: TextIO | None = None, spark: Any = None, remote: str | None = None) -> int:
    """Run the pipeline (`python -m spockwire.spark.job` and `spockwire pipeline`); returns 0 or raises JobError.

    Checks come first, before Spark starts: the dsn holds no password, the database accepts the connection and has
    every table. Then the streaming query runs until `stop` is set (the micro-batch being applied is finished
    and committed first: `StopGate`), until it fails, or -- `until_caught_up` -- until every change committed
    before the start is applied (within `timeout` seconds). One JSON line per micro-batch on `out` (default
    stdout). `monitor`: ``on_batch(report)`` after each micro-batch, ``tick(query)`` between them
    (`spockwire.spark.monitor.PipelineMonitor`: progress lines and Prometheus metrics). `spark`: a session to run
    on (left running at the end; default: a new one, `spark_session`, stopped at the end); `remote`: a Spark
    Connect server to run through instead (``sc://host:port``; a stop then replays the micro-batch in flight)."""
    out = out if out is not None else sys.stdout
    stop = stop if stop is not None else threading.Event()
    own_session = spark is None
    if own_session and not remote:
        try:
            check_java()                              # no Java 17: one line, before anything started
        except SparkEnvironmentError as exc:
            raise JobError(str(exc)) from None
    cfg = _resolved(cfg)
    _check(cfg)
    target = flush_lsn(conninfo(cfg)) if until_caught_up else None
    checking = None
    if own_session:
        if not remote:
            from .warmup import start_apply_warm_up

            start_apply_warm_up()                    # warmup.py: the driver's first apply, beside the JVM's start
        # the workers are checked while the query starts (WorkerCheck), their error raised before any batch ends
        spark = spark_session(master, app="spockwire-job", conf=spark_conf, remote=remote, check_workers=False)
        from .signals import reclaim_signals

        reclaim_signals()            # SIGINT stops as SIGTERM does, not as PySpark's own handler (signals.py)
        if not remote:
            from .warmup import start_planning_warm_up

            start_planning_warm_up(spark)            # warmup.py: beside the worker check and the query's start
            checking = WorkerCheck(spark)
    lock = threading.Lock()

    def report(b: BatchReport) -> None:
        with lock:
            print(json.dumps(report_line(b)), file=out, flush=True)
            if monitor is not None:
                monitor.on_batch(b)

    gate = StopGate()
    if stop.is_set():                    # asked to stop while Spark started
        if own_session:
            spark.stop()
        print(json.dumps({"stopped": True, "last_batch": None}), file=out, flush=True)
        return 0
    try:
        query = start(spark, cfg, report, gate,
                      ready=None if checking is None else functools.partial(_worker_error, checking))
    except BaseException:
        try:
            if checking is not None:
                _worker_error(checking)      # a query that could not start for its workers: their error
        finally:
            if own_session:
                spark.stop()
        raise
    query_started = time.monotonic()
    if checking is not None:
        try:
            _worker_error(checking)
        except JobError:
            query.stop()
            spark.stop()
            raise
    # the query runs while the job waits for the worker check: its first micro-batch may be under way already
    print(json.dumps({"started": True, "pid": os.getpid(),
                      "query_started_s_ago": round(time.monotonic() - query_started, 3)}), file=out, flush=True)

    def tick() -> None:
        if monitor is not None:
            monitor.tick(query)
        if stop.is_set():
            raise _Stopping()

    try:
        restarts = 0
        while True:
            try:
                if target is not None:
                    wait_caught_up(query, target, timeout=timeout, tick=tick,
                                   slot_lsn=None if cfg.starting_position == "snapshot" else _slot_lsn(cfg))
                    # a micro-batch already started is finished and committed (not read again by the next run)
                    gate.finish(query)
                    print(json.dumps({"caught_up": True}), file=out, flush=True)
                else:
                    while query.isActive:
                        tick()
                        stop.wait(0.2)
            except _Stopping:
                applied = gate.finish(query)
                print(json.dumps({"stopped": True, "last_batch": applied}), file=out, flush=True)
            except RuntimeError:
                if query.exception() is None:
                    raise
            if restarts < QUERY_RESTARTS and not stop.is_set() and _worker_did_not_connect(query):
                # nothing of the failed attempt is committed past its checkpoint: starting again is a recovery
                restarts += 1
                print(f"spockwire.spark.job: Spark's Python worker did not connect back in time (a loaded machine); "
                      f"the query starts again from its checkpoint ({restarts} of {QUERY_RESTARTS})",
                      file=sys.stderr, flush=True)
                query.stop()
                query = start(spark, cfg, report, gate)
                continue
            if not stop.is_set() and _connection_lost(query):
                try:
                    query = _reconnect(spark, cfg, query, report, gate, out, stop)
                except _Stopping:
                    print(json.dumps({"stopped": True, "last_batch": None}), file=out, flush=True)
                    break
                continue
            failure = _failure(query)
            if failure is not None:
                raise failure
            break
    finally:
        query.stop()
        finish_reports(query)
        if own_session:
            spark.stop()
    return 0


def _reconnect(spark: Any, cfg: JobConfig, query: Any, report: Callable[[BatchReport], None], gate: "StopGate",
               out: TextIO, stop: threading.Event) -> Any:
    """The query lost its source database: start it again from its checkpoint once a primary answers through the
    dsn (a multi-host dsn with target_session_attrs=read-write finds a promoted standby), with backoff, for at most
    `cfg.reconnect_timeout` seconds; one JSON line (``"reconnect"``) and one stderr line say so."""
    import psycopg2

    from .slot import _connect

    cause = str(_failure(query)).replace("the streaming query failed: ", "", 1)
    query.stop()
    print(f"spockwire.spark.job: the source database went away ({cause}); reconnecting", file=sys.stderr,
          flush=True)
    started = time.monotonic()
    delay = 0.2
    while True:
        try:
            with _connect(conninfo(cfg)) as conn, conn.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery(), inet_server_port()")
                recovery, port = cur.fetchone()
            if not recovery:
                break
        except psycopg2.Error:
            pass
        if stop.is_set():
            raise _Stopping()
        if time.monotonic() - started > cfg.reconnect_timeout:
            raise JobError(f"the streaming query failed: no primary answered within {cfg.reconnect_timeout:g} s "
                           f"after the source database went away ({cause})")
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
    waited = time.monotonic() - started
    print(json.dumps({"reconnect": True, "after_s": round(waited, 3), "port": port}), file=out, flush=True)
    return start(spark, cfg, report, gate)


def _resolved(cfg: JobConfig) -> JobConfig:
    """resolve_tables, its database errors as the job's one line."""
    import psycopg2

    try:
        return resolve_tables(cfg)
    except psycopg2.Error as exc:
        text = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
        raise JobError(f"cannot connect to the source database: {text}") from None


def _worker_error(checking: WorkerCheck) -> None:
    """The worker check's outcome: its SparkEnvironmentError as the job's error (one line, exit status 1)."""
    try:
        checking.result()
    except SparkEnvironmentError as exc:
        raise JobError(str(exc)) from None


def _check(cfg: JobConfig) -> None:
    """What can be found wrong before Spark starts: a password in the dsn, a database that refuses the connection,
    a table it does not have."""
    import psycopg2

    from .slot import _connect, refuse_password_in_dsn

    try:
        refuse_password_in_dsn(cfg.dsn, "the dsn", "the password setting or --password-file of `spockwire "
                               "pipeline`")
    except ValueError as exc:
        raise JobError(str(exc)) from None
    if any(k.lower() == "password" for k in cfg.extra_options):
        raise JobError("a password among the source options: give it as the password setting or --password-file of "
                       "`spockwire pipeline` (JobConfig.password), PGPASSFILE or PGPASSWORD")
    try:
        with _connect(conninfo(cfg)):
            pass
        table_keys(cfg)
    except psycopg2.Error as exc:
        text = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())
        raise JobError(f"cannot connect to the source database: {text}") from None


def _parse_table(text: str) -> tuple[str, tuple[str, ...] | None]:
    name, _, keys = text.partition("=")
    name = name.strip()
    if "." not in name:
        name = f"public.{name}"
    return name, tuple(k.strip() for k in keys.split(",") if k.strip()) or None


def _count(text: str) -> int:
    """--optimize-every / --optimize-small-files: 0 or more."""
    try:
        return count_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _retention(text: str) -> float | None:
    """--vacuum-retention-hours: whole hours, at least the minimum, or off."""
    try:
        return retention_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spockwire.spark.job", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--slot", required=True)
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--table", action="append", default=[], metavar="SCHEMA.TABLE[=KEY,...]",
                   help="a source table and its key columns (default: its replica identity), or a name pattern "
                        "(public.*); repeatable. None: every table of the publications, and those that join them")
    p.add_argument("--exclude-table", action="append", default=[], metavar="PATTERN",
                   help="leave out the tables this name pattern matches (audit.*, public.tmp_?); repeatable")
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
    p.add_argument("--master", default="local[2]", help="local[N], or a cluster's master (spark://host:7077, ...)")
    p.add_argument("--conf", action="append", default=[], metavar="NAME=VALUE",
                   help="a Spark setting (spark.executor.memory=2g, spark.executorEnv.PYTHONPATH=...); repeatable")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                   help="run through a Spark Connect server instead of a local session (--master and --conf are "
                        "then the server's)")
    p.add_argument("--until-caught-up", action="store_true",
                   help="stop once every change committed before the job started is applied")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    cfg = JobConfig(dsn=args.dsn, slot=args.slot, publication=[s for s in args.publication.split(",") if s],
                    tables=dict(_parse_table(t) for t in args.table), exclude=args.exclude_table, target=args.target,
                    checkpoint=args.checkpoint, starting_position=args.starting_position,
                    max_changes_per_batch=args.max_changes_per_batch,
                    extra_options=dict(o.split("=", 1) for o in args.option), history=args.history,
                    maintenance=None if args.no_maintenance else MaintenanceOptions(
                        optimize_every=args.optimize_every, small_files=args.optimize_small_files,
                        zorder=args.optimize_mode == "zorder", vacuum_retention_hours=args.vacuum_retention_hours))
    from .signals import stop_on_signals

    with stop_on_signals() as stop:
        try:
            return run(cfg, master=args.master, spark_conf=dict(c.split("=", 1) for c in args.conf),
                       remote=args.remote, until_caught_up=args.until_caught_up, timeout=args.timeout,
                       stop=stop)
        except JobError as exc:
            print(f"spockwire.spark.job: error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
