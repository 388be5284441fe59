"""The ``spockwire`` source with ``startingPosition`` ``snapshot``: tables that hold rows before the slot exists,
read by Spark tasks that import the slot's exported snapshot (several block ranges per table), then the changes,
with writes running the whole time; applied, the result equals the source table (the oracle: the table itself)."""
from __future__ import annotations

import random
import threading
import time

import pytest

from spockwire.spark import apply_changes
from tests.spark_session import spark_session
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
