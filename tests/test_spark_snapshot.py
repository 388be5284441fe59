"""The ``spockwire`` source with ``startingPosition`` ``snapshot``: tables that hold rows before the slot exists,
read by Spark tasks that import the slot's exported snapshot (several block ranges per table), then the changes,
with writes running the whole time; applied, the result equals the source table (the oracle: the table itself)."""
from __future__ import annotations

import random
import threading
import time

import pytest

from spockwire.spark import apply_changes, read_staging
from tests.conftest import load_impl
from tests.spark_session import spark_session
from tests.test_snapshot import KEYED_COLUMNS, RowWriters, _wait, create_keyed, worker_in_thread
from tests.test_snapshot_chunked import chunk_records, source_text
from tests.test_spark_source import _pg_rows, _slot, _spark_rows, _wait_caught_up, _workload, ORDERS_DDL

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _writes(db, stop: threading.Event) -> None:
    rng = random.Random(11)
    start = 50_000
    while not stop.is_set():
        _workload(db, rng, 3, start, pause=0.03)
        start += 20


@pytest.mark.pg_servers("pg15", "pg18")
def test_snapshot_then_changes_with_writes_running(spark, pg_db, tmp_path):
    pg_db.execute(ORDERS_DDL)
    pg_db.execute("CREATE TABLE items (k text PRIMARY KEY, n int)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE orders, items")
    _workload(pg_db, random.Random(3), 400)          # rows (and dead rows) before the slot
    pg_db.execute("INSERT INTO orders SELECT g, g, g, repeat('p', 200), '{}', now() FROM generate_series(900000, "
                  "906000) g")
    pg_db.execute("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, 500) g")
    before = _pg_rows(pg_db)
    slot = _slot(pg_db)
    opts = dict(dsn=pg_db.dsn, slot=slot, plugin="pgoutput", publication="pub", tables="public.orders,public.items",
                startingPosition="snapshot", snapshotChunkPages="8", snapshotChunksPerBatch="3")
    stop = threading.Event()
    writer = threading.Thread(target=_writes, args=(pg_db, stop))
    query = (spark.readStream.format("spockwire").options(**opts).load()
             .writeStream.format("memory").queryName(f"snap_{pg_db.major}").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        # the writes start once the slot exists (the first micro-batch, a part of the snapshot, is planned)
        deadline = time.monotonic() + 300
        while not list((tmp_path / "ck" / "offsets").glob("0")) and time.monotonic() < deadline:
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.05)
        writer.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
                p["numInputRows"] and "snapshot" not in str(p["sources"][0]["endOffset"])
                for p in query.recentProgress):
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.2)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
    try:
        pg_db.execute("UPDATE items SET n = -1 WHERE k = 'k1'")
        _wait_caught_up(query, pg_db, slot)
        snapshot_batches = [p for p in query.recentProgress if "snapshot" in str(p["sources"][0]["endOffset"])
                            and p["numInputRows"]]
    finally:
        query.stop()
    changes = spark.table(f"snap_{pg_db.major}")
    # more than one snapshot micro-batch, one truncate row per table, snapshot rows with a null _xid
    assert len(snapshot_batches) >= 2
    assert changes.filter("_change_type = 'truncate'").count() == 2
    snap = changes.filter("_xid IS NULL AND _change_type = 'insert'")
    assert snap.select("_commit_lsn").distinct().count() == 1
    assert snap.groupBy("_table", "_seq").count().filter("count > 1").count() == 0
    # the snapshot alone is a consistent state: it holds at least the rows no writer touched
    assert snap.filter("_table = 'public.items'").count() == 500
    from spockwire.spark import select_table

    orders = apply_changes(select_table(changes, "public.orders"), None, format="memory", keys=["id"])
    assert _spark_rows(orders) == _pg_rows(pg_db) != before
    items = apply_changes(select_table(changes, "public.items"), None, format="memory", keys=["k"])
    # the table's own columns (an SCD 1 target also keeps each key's last applied _commit_lsn and _seq)
    assert sorted(map(tuple, items.select("k", "n").collect())) == sorted(pg_db.query("SELECT k, n FROM items"))


def test_chunked_snapshot_staging_applied_by_spark_equals_source(spark, pg_db, tmp_path):
    """A table that joins a running ingest is snapshotted in chunks (watermark windows) while writers change it;
    the staging's changes of a key whose chunk was not read yet come before its snapshot row, and a key's chunk
    row may be read after the key was deleted and inserted again. `apply_changes` over the staging (Spark's batch
    read of it) builds tables equal to the sources: upserts in (`_commit_lsn`, `_seq`) order hold."""
    db = pg_db
    create_keyed(db, "items", 500)
    create_keyed(db, "big", 20000)
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, load_impl("c"), out, flush_seconds=0.1, snapshot_check_interval=0,
                                              snapshot_chunk_rows=2000)
    with RowWriters(db.dsn, ["items", "big"], threads=2, key_space=1_000_000) as writers:
        thread.start()
        _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
        db.execute("ALTER PUBLICATION pub ADD TABLE big")
        _wait(lambda: any(r.get("done") for r in chunk_records(out, "public.big")), thread)
        ops = writers.ops
    thread.join(timeout=300)
    assert result == [0] and ops > 50
    assert len(chunk_records(out, "public.big")) >= 5
    for table in ("items", "big"):
        applied = apply_changes(read_staging(spark, str(out), f"public.{table}"), None, format="memory", keys=["id"])
        got = {str(r["id"]): tuple(None if r[c] is None else str(r[c]) for c in KEYED_COLUMNS[1:])
               for r in applied.select(*KEYED_COLUMNS).collect()}
        expected = source_text(db, table)
        assert got == expected, (table, len(got), len(expected),
                                 sorted(set(got.items()) ^ set(expected.items()))[:4])
