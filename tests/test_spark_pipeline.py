"""The pipeline job (spockwire.spark.job) in this process, on the suite's SparkSession, against a live server: the
snapshot and then changes of two tables land in Delta; every micro-batch is one Spark job (counted from the
query's job group with Spark's status tracker), its Arrow files are gone once it is applied, its commit-to-Delta
lag is reported, each Delta commit carries the batch as a transaction (a replayed batch is skipped), and Spark's
planning processes are stopped once the query has read its first micro-batch."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

from spockwire.spark.job import JobConfig, flush_lsn, staging_path, start, table_keys, target_path, wait_caught_up
from spockwire.spark.memory import PLANNING_WORKER_MODULES, stop_planning_workers
from tests.spark_session import spark_session
from tests.test_spark_source import COLUMNS, ORDERS_DDL, _norm, _pg_rows, _setup_orders, _slot, _workload

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _delta_rows(path: str) -> list[tuple]:
    import deltalake

    rows = deltalake.DeltaTable(path).to_pyarrow_table(columns=list(COLUMNS)).to_pylist()
    return sorted(tuple(_norm(r[c]) for c in COLUMNS) for r in rows)


def _jobs(spark, query) -> int:
    """Spark jobs the streaming query ran so far (its micro-batches run in a job group named by its run id)."""
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId)))


def test_one_spark_job_per_micro_batch_snapshot_then_changes(spark, pg_db, tmp_path):
    pg_db.execute(ORDERS_DDL)
    pg_db.execute("CREATE TABLE items (k text PRIMARY KEY, n int)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE orders, items")
    _workload(pg_db, random.Random(5), 200)
    pg_db.execute("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, 300) g")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"],
                    tables={"public.orders": None, "public.items": ("k",)}, target=str(tmp_path / "delta"),
                    checkpoint=str(tmp_path / "ck"), starting_position="snapshot", trigger_seconds=0.2,
                    extra_options={"snapshotChunkPages": "1", "snapshotChunksPerBatch": "1"}, history=True)
    assert table_keys(cfg) == {"public.orders": ["id"], "public.items": ["k"]}   # orders: its primary key
    reports = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        snapshot_batches = len(reports)
        assert sum(r.snapshot_rows for r in reports) == len(_pg_rows(pg_db)) + 300
        _workload(pg_db, random.Random(6), 150, start_id=10_000)
        pg_db.execute("UPDATE items SET n = n + 1 WHERE n % 7 = 0")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        time.sleep(0.5)   # the last batch's report
        batches = {p["batchId"] for p in query.recentProgress if p["numInputRows"] or p["batchId"] == 0}
        jobs = _jobs(spark, query)
    finally:
        query.stop()
    assert len(reports) > snapshot_batches >= 2
    # in batch order; the snapshot's micro-batches but its last were written while Spark read the next one
    assert [r.batch_id for r in reports] == sorted(r.batch_id for r in reports)
    last_snapshot = max(i for i, r in enumerate(reports) if r.snapshot_rows)
    assert [r.deferred for r in reports] == [i < last_snapshot and sum(r.rows.values()) > 0
                                             for i, r in enumerate(reports)]
    assert sum(r.deferred for r in reports) >= 1
    # one Spark job for every micro-batch that ran (empty ones included), all tables together
    ran = len({p["batchId"] for p in query.recentProgress})
    assert len(batches) <= jobs <= ran, (jobs, ran, batches)
    # the changes' commit-to-Delta lag is reported; snapshot rows do not count
    changed = [r for r in reports[snapshot_batches:] if sum(r.rows.values())]
    assert changed and all(r.lag_p50 is not None and 0 <= r.lag_p50 <= r.lag_p95 < 300 for r in changed)
    assert _delta_rows(target_path(cfg.target, "public.orders")) == _pg_rows(pg_db)
    items = sorted(pg_db.query("SELECT k, n FROM items"))
    import deltalake

    got = deltalake.DeltaTable(target_path(cfg.target, "public.items")).to_pyarrow_table(columns=["k", "n"])
    assert sorted(zip(*got.to_pydict().values())) == items
    history = deltalake.DeltaTable(target_path(cfg.target, "public.items", history=True)).to_pyarrow_table()
    assert history.num_rows > len(items)    # the updated rows' earlier versions are kept
    # every batch's files were deleted once it was applied
    assert not list((tmp_path / "ck" / "spockwire-batches").glob("*.arrow*"))
    assert staging_path(cfg).startswith(cfg.checkpoint)
    # each table commit carries the batch: the idempotence token of the query
    dt = deltalake.DeltaTable(target_path(cfg.target, "public.orders"))
    assert dt.transaction_version(f"spockwire-{query.id}") == max(r.batch_id for r in reports)


def _processes_below() -> dict[int, str]:
    """The command lines of the processes below this one (its JVM, the JVM's Python daemons and their workers)."""
    parent, cmdline = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline[int(pid)] = f.read().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue                    # a process that ended meanwhile
    mine = os.getpid()

    def below(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == mine:
                return True
        return False

    return {p: c for p, c in cmdline.items() if below(p)}


def _spark_python_processes() -> list[str]:
    return [c for c in _processes_below().values() if "python" in c]


def _planning(processes: list[str]) -> set[str]:
    return {m for m in PLANNING_WORKER_MODULES for c in processes if c.rstrip().endswith(" " + m)}


def _wait_for(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def test_the_planning_processes_are_stopped_once_the_query_has_read_its_first_micro_batch(spark, pg_db, tmp_path):
    """Spark keeps a daemon and an idle worker for each kind of planning of a Python data source (creating it,
    planning its read, ...) for as long as the session lives; the job stops them once its query has read its first
    micro-batch, and a later planning starts them again."""
    create, plan = "pyspark.sql.worker.create_data_source", "pyspark.sql.worker.plan_data_source_read"
    opts = _setup_orders(pg_db)
    _workload(pg_db, random.Random(3), 30)

    def read() -> int:
        return spark.read.format("spockwire").options(**opts).load().count()

    changes = read()
    assert changes > 30
    assert _planning(_spark_python_processes()) >= {create, plan}       # idle, beside the session
    assert set(stop_planning_workers(spark)) >= {create, plan}
    assert _wait_for(lambda: not _planning(_spark_python_processes()))
    assert read() == changes                                             # planned again: they start again
    assert _planning(_spark_python_processes()) >= {create, plan}

    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db, "job"), publication=["pub"], tables={"public.orders": None},
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.1)
    reports = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        gone = _wait_for(lambda: not _planning(_spark_python_processes()))
        _workload(pg_db, random.Random(4), 30, start_id=10_000)
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        after = _spark_python_processes()
    finally:
        query.stop()
    assert gone and not _planning(after), after          # not started again by the micro-batches that followed
    assert any(c.rstrip().endswith("pyspark.daemon pyspark.worker") for c in after)   # the decoding workers' daemon
    assert len([r for r in reports if sum(r.rows.values())]) >= 2
    assert _delta_rows(target_path(cfg.target, "public.orders")) == _pg_rows(pg_db)


def _planning_pids(module: str) -> set[int]:
    """The processes below this one that run Spark's planning `module` (its daemon and the workers it forked)."""
    return {p for p, c in _processes_below().items() if c.rstrip().endswith(" " + module)}


def test_the_planning_warm_up_leaves_a_planning_worker_that_the_source_plans_in(spark, pg_db):
    """The job's warm-up (spockwire/spark/warmup.py) plans a read of a source that reads nothing beside the query's
    start: the worker that plans reads is then started, has pyarrow loaded, and the spockwire source's planning
    runs in it (no other one is started)."""
    from spockwire.spark.warmup import start_planning_warm_up

    plan = "pyspark.sql.worker.plan_data_source_read"
    opts = _setup_orders(pg_db)
    _workload(pg_db, random.Random(8), 20)
    stop_planning_workers(spark)
    assert _wait_for(lambda: not _planning_pids(plan))
    warm_up = start_planning_warm_up(spark)
    warm_up.join(120)
    assert not warm_up.is_alive()
    warmed = _planning_pids(plan)
    assert len(warmed) == 2                                    # its daemon and one idle worker
    maps = []
    for pid in warmed:
        with open(f"/proc/{pid}/maps") as f:
            maps.append("libarrow" in f.read())
    assert sorted(maps) == [False, True]                       # the worker imported the stream reader's modules
    changes = spark.read.format("spockwire").options(**opts).load().count()
    assert changes >= 20
    assert _planning_pids(plan) == warmed                      # planned in the warmed worker


def test_each_tables_key_comes_from_its_replica_identity_or_none(pg_db, tmp_path):
    """The key a table lands by: the one named, else the primary key (under FULL too), else the replica identity
    index; a table with none lands without a key (an empty list: spark/keyless.py)."""
    pg_db.execute("CREATE TABLE logs (at timestamptz, line text)")     # no primary key: no replica identity
    pg_db.execute("CREATE TABLE full_pk (id int PRIMARY KEY, v text); ALTER TABLE full_pk REPLICA IDENTITY FULL")
    pg_db.execute("CREATE TABLE by_index (a int NOT NULL, b text NOT NULL, v text); "
                  "CREATE UNIQUE INDEX by_index_ab ON by_index (b, a); "
                  "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab")
    cfg = JobConfig(dsn=pg_db.dsn, slot="x", publication=["p"],
                    tables={"public.logs": None, "public.full_pk": None, "public.by_index": None},
                    target=str(tmp_path), checkpoint=str(tmp_path / "ck"))
    assert table_keys(cfg) == {"public.logs": [], "public.full_pk": ["id"], "public.by_index": ["a", "b"]}   # in column order
    named = JobConfig(**{**cfg.__dict__, "tables": {"public.logs": ("at",)}})
    assert table_keys(named) == {"public.logs": ["at"]}


def test_tables_and_their_state_stay_small_over_16_micro_batches(spark, pg_db, tmp_path):
    """The soak (benchmarks/bench_soak.py) in small: 16 micro-batches of mixed changes (updates, deletes, inserts,
    two truncates) through the job with its maintenance on; the table's data files and the state's rows stay
    bounded, and the table equals the source."""
    import deltalake

    from benchmarks.bench_pipeline import COLUMNS as SOAK_COLUMNS
    from benchmarks.bench_soak import soak_batch, soak_setup
    from spockwire.spark.maintenance import MaintenanceOptions

    soak_setup(pg_db.execute, "t", 2000)
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"], tables={"public.t": ("id",)},
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.1, max_changes_per_batch=60,   # about one transaction per micro-batch
                    maintenance=MaintenanceOptions(optimize_every=5, small_files=3))
    reports = []
    query = start(spark, cfg, reports.append)
    deletes = 0
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        for k in range(16):
            truncate = k in (6, 12)
            soak_batch(pg_db.execute, "t", k, 50, truncate, 500)
            deletes += 0 if truncate else 10
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        time.sleep(0.5)   # the last batch's report
    finally:
        query.stop()
    steps = [r.maintenance["public.t"] for r in reports if "public.t" in r.maintenance]
    assert len(steps) >= 12
    assert sum("optimized" in s for s in steps) >= 3
    assert sum(s.get("state_collected", 0) for s in steps) >= deletes / 2
    # bounded: the files by the small-file threshold, the state by the batches between two collections
    assert max(s["files"] for s in steps) <= 3
    assert max(s["state_files"] for s in steps) <= 3
    assert max(s["state_rows"] for s in steps) <= 3 * 10 + 3, [s["state_rows"] for s in steps]
    got = deltalake.DeltaTable(target_path(cfg.target, "public.t")).to_pyarrow_table(columns=SOAK_COLUMNS)
    source = pg_db.query(f"SELECT {', '.join(SOAK_COLUMNS)} FROM t")
    assert sorted(tuple(_norm(v) for v in r.values()) for r in got.to_pylist()) == \
        sorted(tuple(_norm(v) for v in r) for r in source)


def test_deferred_writes_run_in_order_and_a_failure_fails_the_next_micro_batch():
    """A snapshot's micro-batches written behind the next one's read run one at a time, in the order given; once
    one fails, the ones queued after it are not run, and the failure is raised to the next micro-batch (check) and
    to whatever waits for them (wait: the snapshot's last micro-batch, a stop)."""
    from spockwire.spark.job import DeferredWrites

    done: list[int] = []
    gate = threading.Event()

    def write(n: int, fail: bool = False):
        def run() -> None:
            gate.wait(10)
            if fail:
                raise OSError(f"disk full writing batch {n}")
            done.append(n)
        return run

    deferred = DeferredWrites()
    for n in range(5):
        deferred.submit(write(n))
    deferred.check()                          # nothing failed (nothing ran yet: the writes wait on the gate)
    assert done == []
    gate.set()
    deferred.wait()
    assert done == [0, 1, 2, 3, 4]
    deferred.wait()                           # nothing pending
    gate.clear()
    deferred.submit(write(5, fail=True))
    deferred.submit(write(6))
    gate.set()
    with pytest.raises(OSError, match="disk full writing batch 5"):
        deferred.wait()
    assert done == [0, 1, 2, 3, 4]            # 6 came after the failure: not run
    deferred.submit(write(7))
    with pytest.raises(OSError, match="disk full writing batch 5"):
        deferred.check()
    assert done == [0, 1, 2, 3, 4]
