"""spockwire through Spark Connect: the data sources, ``foreachBatch`` with ``apply_changes`` and the pipeline job
from a ``SparkSession.builder.remote("sc://127.0.0.1:<port>")`` client of the Connect server the pyspark wheel
ships (one server for the module, spockwire.testing.spark_connect). The data source registration, the
``foreachBatch`` functions (run in the server's Python workers) and the checkpointed queries all go over Connect.

Exactly-once on restart: each ``foreachBatch`` also records the micro-batch's change positions (``_commit_lsn``,
``_seq``) in a file named by the batch id (a replayed batch overwrites its own file); after the client is stopped
and a new client restarts the query from its checkpoint, the files hold every change of the source exactly once,
and the Delta table equals the source."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import spockwire
from spockwire.connection.slots import parse_lsn
from spockwire.spark.connect import start_query
from spockwire.testing.spark_connect import SparkConnectServer
from tests.delta_check import checked_table
from tests.test_spark_source import COLUMNS, _norm, _pg_rows, _setup_orders, _slot, _workload

pytestmark = [pytest.mark.pg, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    paths = [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    server = SparkConnectServer(env={"PYTHONPATH": os.pathsep.join(paths)},
                                conf={"spark.executorEnv.SPOCKWIRE_IMPL": spockwire.__impl__},
                                log=tmp_path_factory.mktemp("connect") / "server.log")
    server.start()
    yield server
    server.cleanup()


def _client(server):
    from spockwire.spark.connect import connect_session

    spark = connect_session(server.url)
    assert type(spark).__module__.startswith("pyspark.sql.connect")
    return spark


def _audited_apply(audit: str, target: str, keys: list[str]):
    """A foreachBatch function: the batch's positions into ``<audit>/<batch id>.parquet``, its changes applied."""
    def apply(batch, batch_id: int) -> None:
        import pyarrow.parquet as pq_

        import spockwire.spark as sws

        changes = batch.toArrow()              # one Spark job, over Connect from the server's Python worker
        os.makedirs(audit, exist_ok=True)
        pq_.write_table(changes.select(["_commit_lsn", "_seq"]), f"{audit}/{batch_id:06d}.parquet")
        sws.apply_changes(changes, target, format="delta", engine="delta-rs", keys=keys)

    return apply


def _audit(audit: Path) -> list[tuple[int, int]]:
    rows = []
    for f in sorted(audit.glob("*.parquet")):
        t = pq.read_table(f)
        rows += zip(t.column("_commit_lsn").to_pylist(), t.column("_seq").to_pylist())
    return rows


def _delta_rows(path: str, columns) -> list[tuple]:
    rows = checked_table(path).select(list(columns)).to_pylist()
    return sorted(tuple(_norm(r[c]) for c in columns) for r in rows)


def _wait_for_rows(query, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(p.numInputRows for p in query.recentProgress):   # (Connect: the sources' sum)
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, query.lastProgress
        time.sleep(0.1)


def test_live_slot_over_connect_exactly_once_after_the_client_stops(connect_server, pg_db, tmp_path):
    """The slot source and foreachBatch + apply_changes over Connect; the client goes away mid-stream (its session
    closed: the server stops the session's query wherever it is), a new client restarts the query from the
    checkpoint."""
    opts = _setup_orders(pg_db, extra_slots=("oracle",))
    audit, target, ck = tmp_path / "audit", str(tmp_path / "orders"), str(tmp_path / "ck")
    _workload(pg_db, random.Random(11), 25)

    def start(spark):
        return start_query(spark.readStream.format("spockwire").options(**opts).option("maxChangesPerBatch", "40")
                           .load().writeStream.foreachBatch(_audited_apply(str(audit), target, ["id"]))
                           .option("checkpointLocation", ck).trigger(processingTime="200 milliseconds").start)

    spark = _client(connect_server)
    query = start(spark)
    _wait_for_rows(query)
    spark.stop()                       # the client is gone, and with its session the query
    _workload(pg_db, random.Random(12), 20, start_id=5000)
    spark = _client(connect_server)
    try:
        query = start(spark)           # the same checkpoint
        target_lsn = parse_lsn(pg_db.query("SELECT pg_current_wal_flush_lsn()::text")[0][0])
        from spockwire.spark.job import wait_caught_up

        wait_caught_up(query, target_lsn, timeout=180)
        query.stop()
        oracle = (spark.read.format("spockwire").options(**{**opts, "slot": _slot(pg_db, "oracle")}).load()
                  .select("_commit_lsn", "_seq").toArrow())
    finally:
        spark.stop()
    seen = _audit(audit)
    assert len(seen) == len(set(seen)), "a change was delivered in two micro-batches"
    assert sorted(seen) == sorted(zip(oracle.column(0).to_pylist(), oracle.column(1).to_pylist()))
    assert len(list(audit.glob("*.parquet"))) >= 3
    assert _delta_rows(target, COLUMNS) == _pg_rows(pg_db)


def test_staging_stream_and_frames_over_connect_exactly_once_on_restart(connect_server, pg_db, tmp_path):
    """The staging source (and a frame file decoded by decode_frame_file) over Connect; the query is stopped after
    its first micro-batch and restarted from its checkpoint by a new client once more commits are staged."""
    from spockwire.frames import FrameWriter
    from spockwire.ingest import StagingWriter
    import spockwire.spark as sws

    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, amount numeric(10,2))")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = _slot(pg_db)
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    out, frames = tmp_path / "staging", tmp_path / "cap.spwf"
    writer = FrameWriter(str(frames), "pgoutput", options={"proto_version": "1", "publication_names": "pub"})

    def stage(*statements: str) -> None:
        for sql in statements:
            pg_db.execute(sql)
        rows = pg_db.query("SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                           "'proto_version', '1', 'publication_names', 'pub')", (slot,))
        dec = spockwire.Decoder("pgoutput")
        for lsn, data in rows:
            dec.feed(bytes(data))
            writer.write(parse_lsn(lsn), bytes(data))
        with StagingWriter(out, protocol="pgoutput") as staging:
            staging.add_all(dec.drain())
            staging.commit(dec.committed_lsn)

    stage("INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 60) g")
    stage("UPDATE t SET v = 'u' || id WHERE id % 3 = 0", "UPDATE t SET id = 1000 WHERE id = 7",
          "DELETE FROM t WHERE id BETWEEN 20 AND 25")
    audit, target, ck = tmp_path / "audit", str(tmp_path / "t"), str(tmp_path / "ck")

    def start(spark, **trigger):
        return start_query(sws.read_staging_stream(spark, str(out), "public.t", maxCommitsPerBatch=1)
                           .writeStream.foreachBatch(_audited_apply(str(audit), target, ["id"]))
                           .option("checkpointLocation", ck).trigger(**trigger).start)

    spark = _client(connect_server)
    query = start(spark, processingTime="1 hour")      # one micro-batch, then the client stops it
    _wait_for_rows(query)
    query.stop()
    spark.stop()
    assert len(_audit(audit)) == 60
    stage("TRUNCATE t", "INSERT INTO t SELECT g, 'w' || g, g FROM generate_series(100, 130) g",
          "UPDATE t SET amount = NULL WHERE id = 101")
    writer.close()
    spark = _client(connect_server)
    try:
        query = start(spark, availableNow=True)
        query.awaitTermination(180)
        assert query.exception() is None
        batches = [json.loads(p["sources"][0]["endOffset"])["commit"] if isinstance(p["sources"][0]["endOffset"], str)
                   else p["sources"][0]["endOffset"]["commit"] for p in query.recentProgress if p.numInputRows]
        staged = sws.read_staging(spark, str(out), "public.t").select("_commit_lsn", "_seq").toArrow()
        decoded = sws.decode_frame_file(spark, str(frames), "public.t", chunk_bytes=4096).toArrow()
    finally:
        spark.stop()
    assert batches == [2, 3]                           # on from the checkpoint: the first commit not again
    seen = _audit(audit)
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(zip(staged.column(0).to_pylist(), staged.column(1).to_pylist()))
    expected = sorted(pg_db.query("SELECT id, v, amount FROM t"))
    assert _delta_rows(target, ("id", "v", "amount")) == expected
    # the frame file's chunks decoded on the server give the same changes as the staging
    assert sorted(zip(decoded.column("_commit_lsn").to_pylist(), decoded.column("_seq").to_pylist())) == \
        sorted(seen)


@pytest.mark.timeout(900)    # two runs of the job (each a Python start, a Connect client and a query start)
def test_the_job_with_a_connect_remote(connect_server, pg_db, tmp_path):
    """`python -m spockwire.spark.job --remote sc://...`: the snapshot and then changes of two tables, one SCD 1 and
    one SCD 2 Delta table each; run twice (more changes between), each run until caught up; the micro-batch
    report lines reach the client."""
    from spockwire.spark.job import target_path

    pg_db.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int, price numeric(12,2), note text, tags text[], "
                  "placed timestamptz)")
    pg_db.execute("ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL")
    pg_db.execute("CREATE TABLE items (k text PRIMARY KEY, n int)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE orders, items")
    _workload(pg_db, random.Random(21), 60)
    pg_db.execute("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, 200) g")
    cmd = [sys.executable, "-m", "spockwire.spark.job", "--remote", connect_server.url, "--dsn", pg_db.dsn,
           "--slot", _slot(pg_db, "job"), "--publication", "pub", "--table", "public.orders",
           "--table", "public.items=k", "--target", str(tmp_path / "delta"), "--checkpoint", str(tmp_path / "ck"),
           "--starting-position", "snapshot", "--option", "snapshotChunkPages=1", "--history",
           "--until-caught-up", "--timeout", "300"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def run() -> list[dict]:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    first = run()
    assert {"caught_up": True} in first
    assert sum(line.get("snapshot_rows", 0) for line in first) == len(_pg_rows(pg_db)) + 200
    _workload(pg_db, random.Random(22), 40, start_id=5000)
    pg_db.execute("UPDATE items SET n = -n WHERE n % 5 = 0")
    pg_db.execute("DELETE FROM items WHERE n % 7 = 0")
    second = run()
    assert {"caught_up": True} in second
    assert any(sum(line["rows"].values()) and not line["snapshot_rows"] for line in second if "batch" in line)
    assert not any(line.get("snapshot_rows") for line in second)       # on from the checkpoint
    target = str(tmp_path / "delta")
    assert _delta_rows(target_path(target, "public.orders"), COLUMNS) == _pg_rows(pg_db)
    items = sorted(pg_db.query("SELECT k, n FROM items"))
    assert _delta_rows(target_path(target, "public.items"), ("k", "n")) == items
    history = checked_table(target_path(target, "public.items", history=True)).to_pylist()
    assert sorted((r["k"], r["n"]) for r in history if r["_end_commit_lsn"] is None) == items
    assert len(history) == 200 + 40       # every snapshot row, and one more version per negated row


# ------------------------------------------------------------------------------------------------------ AUTO CDC

def test_autocdc_mapping_of_a_dataframe_over_connect(connect_server):
    """`autocdc_changes` on a DataFrame (mapInArrow, run by the server's Python) gives the rows the Arrow mapping
    gives (tests/test_autocdc.py checks those against the apply_changes oracle), and what it cannot map fails the
    query with its message."""
    from pyspark.errors import PySparkException

    from spockwire.spark import autocdc_changes
    from tests.test_autocdc import changes_table, full_preimages, history

    rows = [r for s in range(20) for r in history(s, full_preimages(s, toast=True))]
    table = changes_table(rows)
    truncated = changes_table([r for s in range(20) for r in history(s, truncates=True)])
    spark = _client(connect_server)
    try:
        df = spark.createDataFrame(table).repartition(3, "_commit_lsn").sortWithinPartitions("_commit_lsn", "_seq")
        got = autocdc_changes(df, ["h", "id"], replica_identity_full=True).toArrow()
        with pytest.raises(PySparkException, match="SPOCKWIRE_UNCHANGED_TOAST"):
            autocdc_changes(df, ["h", "id"]).toArrow()
        with pytest.raises(PySparkException, match="SPOCKWIRE_TRUNCATE"):
            autocdc_changes(spark.createDataFrame(truncated).coalesce(1), ["h", "id"]).toArrow()
    finally:
        spark.stop()
    expected = autocdc_changes(table, ["h", "id"], replica_identity_full=True)
    order = [("_commit_lsn", "ascending"), ("_seq", "ascending")]
    assert got.sort_by(order).to_pylist() == expected.sort_by(order).to_pylist()
    assert got.num_rows < table.num_rows       # the same-key preimages are gone
