"""The pipeline job on a real Spark standalone cluster started from the pyspark wheel (spockwire.testing.spark_cluster:
a master and two workers of one core each, executors in JVMs of their own with their own Python workers).

The job (`python -m spockwire.spark.job --master spark://127.0.0.1:<port>`) runs as a child process while writers
change two tables. Spark's event log says which executor ran each task of each micro-batch: the snapshot's and the
change stream's tasks run on both workers. The driver is killed with SIGKILL twice (during the snapshot, and while
streaming right after a micro-batch was applied), and one worker JVM with its executor is killed while both workers
run a task of a snapshot micro-batch: Spark reruns the lost task on the other worker. At the end every Delta table
equals its source table."""
from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from spockwire.testing.spark_cluster import SparkCluster
from tests.test_spark_exactly_once import DDL, Job, _writer, assert_tables_equal

pytestmark = [pytest.mark.pg, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spark_cluster():
    """One master and two workers of one core each, for the module."""
    with SparkCluster(workers=2, cores=1, memory="1g") as cluster:
        yield cluster


def _cluster_args(cluster: SparkCluster, events: Path) -> list[str]:
    """The job's arguments for the cluster: one executor of one core per worker, the event log on, and the
    executors' Python path the driver's (they import spockwire from where the driver does)."""
    events.mkdir(exist_ok=True)
    conf = {"spark.executor.cores": "1", "spark.cores.max": "2", "spark.executor.memory": "512m",
            "spark.driver.memory": "512m",
            # the first micro-batch waits for both executors
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
            "spark.executorEnv.PYTHONPATH": str(ROOT)}
    args = ["--master", cluster.master_url, "--option", "snapshotChunksPerBatch=2",
            # every range of changes is read as two tasks (two halves, side by side)
            "--option", "splitWalBytes=1"]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    return args


def _tasks(events: Path, cluster: SparkCluster) -> list[dict]:
    """Every task in the event logs of `events`: its application, micro-batch, executor, the worker that executor
    ran on (by the worker web UI its log URLs name) and how it ended."""
    ports = {f":{port}/": i for port, i in cluster.webui_ports.items()}
    found = []
    for log in sorted(p for p in events.iterdir() if p.is_file()):
        executors: dict[str, int | None] = {}
        stage_batch: dict[int, int] = {}
        for line in log.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue          # a killed driver's last line may be cut short
            kind = ev.get("Event")
            if kind == "SparkListenerExecutorAdded":
                urls = " ".join(ev["Executor Info"].get("Log Urls", {}).values())
                executors[ev["Executor ID"]] = next((i for p, i in ports.items() if p in urls), None)
            elif kind == "SparkListenerJobStart":
                batch = (ev.get("Properties") or {}).get("streaming.sql.batchId")
                if batch is not None:
                    for stage in ev["Stage IDs"]:
                        stage_batch[stage] = int(batch)
            elif kind == "SparkListenerTaskEnd":
                info = ev["Task Info"]
                found.append({"app": log.name, "batch": stage_batch.get(ev["Stage ID"]), "stage": ev["Stage ID"],
                              "partition": info["Index"], "attempt": info["Attempt"],
                              "executor": info["Executor ID"], "worker": executors.get(info["Executor ID"]),
                              "reason": ev["Task End Reason"]["Reason"]})
    return found


def _batches(job: Job, kind: str) -> set[int]:
    """The micro-batches of a run that held snapshot rows (`kind` "snapshot") or changes only ("changes")."""
    lines = [line for line in job.lines if "batch" in line]
    if kind == "snapshot":
        return {line["batch"] for line in lines if line["snapshot_rows"]}
    return {line["batch"] for line in lines if sum(line["rows"].values()) and not line["snapshot_rows"]}


def _lock_waiters(db) -> int:
    """Snapshot tasks waiting for a table lock (their COPY's AccessShareLock) on the source tables."""
    return db.query("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND mode = 'AccessShareLock' "
                    "AND relation IN ('orders'::regclass, 'accounts'::regclass)")[0][0]


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(900)
def test_pipeline_on_a_cluster_survives_driver_and_worker_kills(spark_cluster, pg_db, tmp_path):
    cluster = spark_cluster
    pg_db.execute(DDL)
    pg_db.execute("INSERT INTO orders SELECT g, g % 50, g * 1.5, CASE WHEN g % 10 = 0 THEN repeat('t', 3000) END, "
                  "ARRAY['i'], now() FROM generate_series(1, 1200) g")
    pg_db.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 2.25, DATE '2020-01-01' + g "
                  "FROM generate_series(1, 1200) g")
    rng = random.Random(28)
    commits = [0]

    def writing() -> tuple[threading.Thread, threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=_writer, args=(pg_db, random.Random(rng.random()), stop, commits))
        thread.start()
        return thread, stop

    def log_tail() -> str:
        return (tmp_path / "job.log").read_text()[-3000:]

    def wait_batch(job: Job, kind: str) -> None:
        while not _batches(job, kind):
            assert job.wait_for("batch", 300, after=len(job.lines)), log_tail()

    events = tmp_path / "events"
    args = _cluster_args(cluster, events)
    writer, stop = writing()
    try:
        # 1. the driver killed during the snapshot
        run1 = Job(pg_db, tmp_path, args, history=False)
        assert run1.wait_for("started", 300), log_tail()
        wait_batch(run1, "snapshot")
        assert not _batches(run1, "changes")
        run1.kill_group()

        # 2. the snapshot starts over; a worker and its executor are killed while each worker runs one of a
        # micro-batch's snapshot tasks (both held by a lock on the tables), then the driver is killed while
        # streaming, right after a micro-batch was applied
        run2 = Job(pg_db, tmp_path, args, history=False)
        assert run2.wait_for("started", 300), log_tail()
        wait_batch(run2, "snapshot")
        stop.set()
        writer.join()      # (a writer between the lock's two tables could deadlock with it)
        lock = pg_db.connect(autocommit=False)
        try:
            lock.cursor().execute("LOCK TABLE orders, accounts IN ACCESS EXCLUSIVE MODE")
            _wait(lambda: _lock_waiters(pg_db) >= 2, 120, "two snapshot tasks waiting for the lock")
            assert all(cluster.executors(i) for i in range(2))
            cluster.kill_worker(1)
        finally:
            lock.rollback()
            lock.close()
        writer, stop = writing()
        cluster.start_worker(1, wait=False)     # (registers while run 2 goes on)
        wait_batch(run2, "changes")
        assert run2.wait_for("batch", 120, after=len(run2.lines)), log_tail()
        time.sleep(rng.uniform(0.0, 0.2))
        run2.kill_group()
    finally:
        stop.set()
        writer.join()
    pg_db.execute("UPDATE accounts SET owner = 'final' WHERE id = 1")

    # 3. the backlog in one micro-batch (two tasks), on both workers again
    cluster.wait_workers()      # the killed worker declared lost by the master
    run3 = Job(pg_db, tmp_path, args + ["--until-caught-up", "--timeout", "600", "--max-changes-per-batch", "0"],
               history=False)
    assert run3.proc.wait(700) == 0, log_tail()
    run3.reader.join(10)
    assert any("caught_up" in line for line in run3.lines)

    tasks = _tasks(events, cluster)
    apps = sorted({t["app"] for t in tasks})
    assert len(apps) == 3, apps
    by_run = dict(zip(apps, (run1, run2, run3)))
    # the snapshot's tasks ran on both workers (run 1), and so did the change stream's (run 3)
    for app, kind in ((apps[0], "snapshot"), (apps[2], "changes")):
        batches = _batches(by_run[app], kind)
        assert batches
        workers = {t["worker"] for t in tasks if t["app"] == app and t["batch"] in batches}
        assert workers == {0, 1}, (app, kind, workers)
    # the killed worker's task was lost and run again by the other worker
    lost = [t for t in tasks if t["app"] == apps[1] and t["reason"] == "ExecutorLostFailure"]
    assert lost and all(t["worker"] == 1 for t in lost), lost
    for t in lost:      # its partition done by a later attempt, on the other worker
        assert any(o["app"] == t["app"] and o["stage"] == t["stage"] and o["partition"] == t["partition"]
                   and o["attempt"] > t["attempt"] and o["reason"] == "Success" and o["worker"] == 0
                   for o in tasks), (t, tasks)
    assert commits[0] > 20, commits
    assert_tables_equal(pg_db, tmp_path / "delta", ("",))


#: a task of a micro-batch: writes one table's changes (argv: the staging folder, the Arrow schema, the rows) with the
#: source's code and prints its manifest rows
_TASK = """
import json, sys
import pyarrow as pa
from spockwire.spark.batch_files import write_files

target = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(sys.argv[2])))
batch = pa.RecordBatch.from_pylist(json.loads(sys.argv[3]), schema=target)
for manifest in write_files(sys.argv[1], "range-0000000000000064-0000000000000067", iter([("public.t", batch)]),
                            target, False):
    print(json.dumps(manifest.to_pylist()))
"""


def test_a_staging_folder_the_driver_does_not_share_fails_the_batch_it_never_loses_it(tmp_path):
    """A task writes its Arrow file into a staging folder that is a local path on its own machine (here: a process
    with a file system of its own mounted at the folder, as an executor on another host has its own disk): the
    driver does not see the file, and reading the micro-batch is a BatchFileError naming the file, the host that
    wrote it and what to do -- not an empty micro-batch. With the folder shared, the same file is read back."""
    import subprocess
    import sys

    import pyarrow as pa
    from pyspark.sql import types as T

    from spockwire.spark import schema as S
    from spockwire.spark.batch_files import MANIFEST_ARROW, BatchFileError, check_files, read_files, write_files

    staging = tmp_path / "ck" / "spockwire-batches"
    staging.mkdir(parents=True)
    target = S.target_arrow_schema(T.StructType(S.change_schema().fields + [T.StructField("id", T.LongType())]))
    rows = [{"_change_type": "insert", "_commit_lsn": 100 + i, "_xid": 7, "_seq": i, "id": i} for i in range(3)]
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount -t tmpfs spockwire-executor-disk "$0" && exec "$@"', str(staging),
                          sys.executable, "-c", _TASK, str(staging), target.serialize().to_pybytes().hex(),
                          json.dumps(rows)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    local = pa.Table.from_pylist(json.loads(out.stdout), schema=MANIFEST_ARROW)
    assert local["rows"].to_pylist() == [3] and local["host"].to_pylist() == [os.uname().nodename]
    assert not list(staging.iterdir())        # nothing reached the driver's disk
    path = local["path"][0].as_py()
    with pytest.raises(BatchFileError, match=rf"the micro-batch file {path}, written by a task on "
                                             rf"{os.uname().nodename}, is not there for its reader .* must be on "
                                             r"storage the driver and every executor share"):
        check_files(local)
    with pytest.raises(BatchFileError, match="is not there for its reader"):
        read_files([path], [3])

    # the same task's file in a shared folder
    shared = pa.Table.from_batches(list(write_files(str(staging), "range-0000000000000064-0000000000000067",
                                                    iter([("public.t", pa.RecordBatch.from_pylist(rows, target))]),
                                                    target, False)))
    assert shared["path"].to_pylist() == [path]
    check_files(shared)
    assert read_files([path], shared["rows"].to_pylist())["id"].to_pylist() == [0, 1, 2]
    # a file of that name whose rows are not the ones its manifest row counts is refused too
    with pytest.raises(BatchFileError, match=r"holds 3 rows, its task wrote 4"):
        read_files([path], [4])
