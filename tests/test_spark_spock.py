"""The `spockwire` Spark source reading a real Spock slot (pgEdge Spock 6's `spock_output` on PostgreSQL 18).

A streaming query with a checkpoint reads the slot while a workload runs (inserts, updates with TOAST changed and
left unchanged, key changes, deletes), is stopped mid-way and restarted from its checkpoint; its output holds every
change once, the same as a batch read of a second Spock slot the stream never touched, and applied it equals the
source table (tests/test_spark_source.py's workload and comparisons, there against pgoutput).
"""
from __future__ import annotations

import random
import threading
import time

import pytest

from spockwire.spark import apply_changes
from tests.test_spark_source import (ORDERS_DDL, _end_lsn, _flush_lsn, _pg_rows, _slot, _slot_lsn, _spark_rows,
                                     _wait_caught_up, _workload, spark)  # noqa: F401 - spark: the fixture
from tests.test_spock_live import sdb  # noqa: F401 - the fixture: a database with spock and its node

pytestmark = pytest.mark.pg


def _setup_spock_orders(db) -> dict:
    db.execute(ORDERS_DDL)
    db.execute("SELECT spock.repset_add_table('default', 'orders')")
    for name in ("s1", "oracle"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'spock_output')", (_slot(db, name),))
    return dict(dsn=db.dsn, slot=_slot(db), plugin="spock_output", replicationSets="default", table="public.orders")


def test_spock_stream_stop_and_restart_and_batch_read(spark, sdb, tmp_path):
    opts = _setup_spock_orders(sdb)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def start():
        return (spark.readStream.format("spockwire").options(**opts).option("maxChangesPerBatch", "200").load()
                .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
                .trigger(processingTime="200 milliseconds").start())

    _workload(sdb, random.Random(1), 30)
    query = start()
    writer = threading.Thread(target=_workload, args=(sdb, random.Random(2), 40, 5000, 0.1))
    writer.start()
    deadline = time.monotonic() + 90
    while not any(p["numInputRows"] for p in query.recentProgress) and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()                          # mid-way: the workload is still running
    first_end = _end_lsn(query.lastProgress)
    writer.join()
    _workload(sdb, random.Random(3), 20, 9000)   # while no query runs
    query = start()
    try:
        _wait_caught_up(query, sdb, _slot(sdb))
        batches = query.recentProgress
    finally:
        query.stop()
    assert first_end is not None and first_end < _flush_lsn(sdb)
    assert any(p["numInputRows"] > 0 for p in batches)  # the restarted query read on from its checkpoint
    assert _slot_lsn(sdb, _slot(sdb)) <= _flush_lsn(sdb)
    got = spark.read.parquet(out)
    # the batch read of the slot the stream never touched: every change, and the slot does not move
    oracle = _slot(sdb, "oracle")
    before = _slot_lsn(sdb, oracle)
    expected = spark.read.format("spockwire").options(**{**opts, "slot": oracle}).load()
    types = {f.name: f.dataType.simpleString() for f in expected.schema.fields}
    assert (types["id"], types["price"], types["tags"], types["placed"]) == \
        ("int", "decimal(12,2)", "array<string>", "timestamp")
    assert got.groupBy("_commit_lsn", "_seq").count().filter("count > 1").count() == 0
    key = ["_commit_lsn", "_seq", "_change_type", "id"]
    expected_keys = sorted(map(tuple, expected.select(*key).collect()))
    assert sorted(map(tuple, got.select(*key).collect())) == expected_keys
    assert {k[2] for k in expected_keys} == {"insert", "update_preimage", "update_postimage", "delete"}
    assert _slot_lsn(sdb, oracle) == before
    # unchanged TOAST arrived as such (apply_changes fills it in from the row's earlier value)
    assert got.filter("array_contains(_unchanged_toast, 'note')").count() > 0
    assert _spark_rows(apply_changes(got, None, format="memory", keys=["id"])) == _pg_rows(sdb)
