"""The `spockwire` Spark data source against real PostgreSQL 15 and 18 servers and a real local Spark.

Streaming queries read a live slot while a workload runs; the applied result must equal the PostgreSQL table
row by row, and a query stopped mid-way and restarted from its checkpoint must neither lose nor repeat a change.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
from pathlib import Path
import random
import threading
import time
import uuid

import pytest

from spockwire.connection.slots import format_lsn, parse_lsn
from spockwire.spark import apply_changes, select_table
from spockwire.spark.slot import SlotAheadError, SlotSpec, plan_end
from tests.spark_session import spark_session

pytestmark = pytest.mark.pg

ORDERS_DDL = """
CREATE TABLE orders (
    id int PRIMARY KEY,
    qty int,
    price numeric(12,2),
    note text,
    tags text[],
    placed timestamptz
);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
"""
COLUMNS = ("id", "qty", "price", "note", "tags", "placed")


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _slot(db, name: str = "s1") -> str:
    """Slots are cluster-wide: name them after the test's own database."""
    return f"{db.name}_{name}"[:63]


def _setup_orders(db, publication: str = "pub", extra_slots: tuple[str, ...] = ()) -> dict:
    db.execute(ORDERS_DDL)
    db.execute(f"CREATE PUBLICATION {publication} FOR TABLE orders")
    for name in ("s1", *extra_slots):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_slot(db, name),))
    return dict(dsn=db.dsn, slot=_slot(db), plugin="pgoutput", publication=publication, table="public.orders")


def _workload(db, rng: random.Random, txns: int, start_id: int = 1, pause: float = 0.0) -> None:
    """Inserts, updates (some of a TOASTed column, some leaving it unchanged), NULLs, key changes, deletes."""
    conn = db.connect(autocommit=False)
    try:
        cur = conn.cursor()
        next_id = start_id
        for _ in range(txns):
            for _ in range(rng.randint(1, 6)):
                op = rng.random()
                if op < 0.45:
                    note = "x" * 4000 + str(next_id) if rng.random() < 0.3 else f"n{next_id}"
                    cur.execute("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                                (next_id, rng.randint(0, 100), decimal.Decimal(rng.randint(0, 10**6)) / 100,
                                 note, ["a", "b'c", None] if rng.random() < 0.5 else [],
                                 dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
                                 + dt.timedelta(microseconds=rng.randint(0, 10**12))))
                    next_id += 1
                elif op < 0.7:
                    cur.execute("UPDATE orders SET qty = qty + 1, price = CASE WHEN qty %% 3 = 0 THEN NULL "
                                "ELSE price END WHERE id = %s", (rng.randint(start_id, next_id),))
                elif op < 0.8:
                    cur.execute("UPDATE orders SET note = repeat('y', 3000) || %s WHERE id = %s",
                                (str(rng.random()), rng.randint(start_id, next_id)))
                elif op < 0.85:
                    cur.execute("UPDATE orders SET id = id + 1000000 WHERE id = %s AND id < 1000000",
                                (rng.randint(start_id, next_id),))
                else:
                    cur.execute("DELETE FROM orders WHERE id = %s", (rng.randint(start_id, next_id),))
            conn.commit()
            if pause:
                time.sleep(pause)
    finally:
        conn.close()


def _norm(value):
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, list):
        return tuple(value)
    return value


def _pg_rows(db) -> list[tuple]:
    return sorted(tuple(_norm(v) for v in r) for r in db.query(f"SELECT {', '.join(COLUMNS)} FROM orders"))


def _spark_rows(df) -> list[tuple]:
    return sorted(tuple(_norm(v) for v in r) for r in df.select(*COLUMNS).collect())


def _flush_lsn(db) -> int:
    return parse_lsn(db.query("SELECT pg_current_wal_flush_lsn()::text")[0][0])


def _slot_lsn(db, slot: str) -> int:
    return parse_lsn(db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                              (slot,))[0][0])


def _end_lsn(progress) -> int | None:
    """The end offset (an LSN) of the source in a query progress report."""
    end = progress and progress["sources"][0].get("endOffset")
    if not end:
        return None
    if isinstance(end, str):
        end = json.loads(end)
    return parse_lsn(end["lsn"])


def _wait_caught_up(query, db, slot: str, timeout: float = 120) -> None:
    """Until the query has read (and the slot moved to) everything committed so far."""
    target = _flush_lsn(db)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise query.exception()
        end = _end_lsn(query.lastProgress)
        if end is not None and end >= target and not query.status["isDataAvailable"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"query did not catch up with {target:X} (last progress: {query.lastProgress})")


# ------------------------------------------------------------------------------------------------------- types

def _assert_workers_decode_with_the_selected_implementation(spark) -> None:
    """Spark's Python workers import spockwire with the environment the JVM started with, the driver's: they
    select the implementation the driver selected (SPOCKWIRE_IMPL)."""
    import spockwire

    expected = spockwire.__impl__
    seen = set(spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("spockwire").__impl__).collect())
    assert seen == {expected}


def test_the_source_with_the_pure_python_decoder():
    """The typed-values and unchanged-TOAST tests again, with the pure-Python twin decoding in Spark's workers.
    The workers take the implementation from the environment the session's JVM started with (the session lives
    as long as the test process), so these run in a child pytest with SPOCKWIRE_IMPL=python and a session of
    their own."""
    root = Path(__file__).resolve().parents[1]
    tests = ["tests/test_spark_source.py::test_schema_and_typed_values_survive[pg15]",
             "tests/test_spark_source.py::test_null_versus_unchanged_toast"]
    env = dict(os.environ, SPOCKWIRE_IMPL="python")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *tests], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.pg_servers("pg15", "pg18")
def test_schema_and_typed_values_survive(spark, pg_db):
    pg_db.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg_db.execute("""CREATE TABLE typed (
        id bigint PRIMARY KEY, small smallint, flag boolean, ratio float8, amount numeric(20,4), big numeric,
        label varchar(20), at timestamptz, local_at timestamp, day date, doc jsonb, uid uuid, blob bytea,
        ints int4[], amounts numeric(10,2)[], words text[], feeling mood, gen int GENERATED ALWAYS AS (id * 2) STORED)""")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE typed")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_slot(pg_db),))
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    pg_db.execute("""INSERT INTO typed (id, small, flag, ratio, amount, big, label, at, local_at, day, doc, uid, blob,
                     ints, amounts, words, feeling) VALUES
        (1, -3, true, 0.25, 12345.6789, 123456789012345678901234567890.5, 'héllo',
         '2024-02-29 12:34:56.789012+02', '2024-02-29 12:34:56.789012', '2024-02-29', '{"a": [1, 2]}', %s,
         '\\x00ff', ARRAY[1, NULL, 3], ARRAY[1.50, -2.25]::numeric(10,2)[], ARRAY['x', NULL, 'y,z'], 'happy'),
        (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
                  (str(u),))
    _assert_workers_decode_with_the_selected_implementation(spark)
    df = (spark.read.format("spockwire").option("dsn", pg_db.dsn).option("slot", _slot(pg_db))
          .option("publication", "pub").option("table", "public.typed").load())
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["_commit_lsn"] == "bigint" and types["_xid"] == "bigint"
    assert types["_commit_ts"] == "timestamp" and types["_unchanged_toast"] == "array<string>"
    assert types["id"] == "bigint" and types["small"] == "smallint" and types["flag"] == "boolean"
    assert types["amount"] == "decimal(20,4)" and types["at"] == "timestamp" and types["local_at"] == "timestamp_ntz"
    assert types["day"] == "date" and types["ints"] == "array<int>" and types["amounts"] == "array<decimal(10,2)>"
    assert types["words"] == "array<string>" and types["feeling"] == "string" and types["uid"] == "binary"
    assert "gen" not in types  # pgoutput does not send generated columns
    assert [f.name for f in df.schema.fields if f.metadata.get("spockwire.key")] == ["id"]
    rows = {r["id"]: r for r in df.collect()}
    one = rows[1]
    assert one["_change_type"] == "insert" and one["_commit_lsn"] > 0
    assert one["amount"] == decimal.Decimal("12345.6789")
    assert one["big"] == "123456789012345678901234567890.5"   # numeric without typmod keeps its exact text
    assert one["at"] == dt.datetime(2024, 2, 29, 10, 34, 56, 789012)  # UTC session time zone
    assert one["local_at"] == dt.datetime(2024, 2, 29, 12, 34, 56, 789012)
    assert one["day"] == dt.date(2024, 2, 29) and one["label"] == "héllo" and one["flag"] is True
    assert one["ints"] == [1, None, 3] and one["amounts"] == [decimal.Decimal("1.50"), decimal.Decimal("-2.25")]
    assert one["words"] == ["x", None, "y,z"] and one["feeling"] == "happy" and one["uid"] == u.bytes
    assert bytes(one["blob"]) == b"\x00\xff" and one["ratio"] == 0.25 and one["small"] == -3
    two = rows[2]
    assert all(two[c] is None for c in ("small", "amount", "at", "ints", "words", "feeling"))
    assert two["_unchanged_toast"] is None


@pytest.mark.parametrize("binary", ["false", "true"])
def test_types_kept_as_text_are_the_servers_text_in_both_formats(spark, pg_db, binary):
    pg_db.execute("CREATE TYPE pair AS (a int, b text)")
    pg_db.execute("CREATE TABLE net (id int PRIMARY KEY, addr inet, r int4range, p pair, m money, bits varbit)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE net")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_slot(pg_db),))
    pg_db.execute("INSERT INTO net VALUES (1, '192.168.0.1/24', '[1,10)', ROW(1, 'x y'), 1234.56, B'1011')")
    df = (spark.read.format("spockwire").option("dsn", pg_db.dsn).option("slot", _slot(pg_db))
          .option("publication", "pub").option("table", "public.net").option("binary", binary).load())
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert [types[c] for c in ("addr", "r", "p", "m", "bits")] == ["string"] * 5
    (row,) = df.collect()
    assert (row["addr"], row["r"], row["p"], row["m"], row["bits"]) == \
        ("192.168.0.1/24", "[1,10)", '(1,"x y")', "$1,234.56", "1011")


def test_null_versus_unchanged_toast(spark, pg_db):
    _assert_workers_decode_with_the_selected_implementation(spark)
    opts = _setup_orders(pg_db)
    big = "t" * 10000
    pg_db.execute("INSERT INTO orders VALUES (1, 1, 1.00, %s, '{}', now()), (2, 2, 2.00, %s, '{}', now())",
                  (big, big))
    pg_db.execute("UPDATE orders SET qty = 10 WHERE id = 1")            # note unchanged: not sent
    pg_db.execute("UPDATE orders SET qty = 20, note = NULL WHERE id = 2")  # note really NULL
    df = spark.read.format("spockwire").options(**opts).load()
    posts = {r["id"]: r for r in df.filter("_change_type = 'update_postimage'").collect()}
    assert posts[1]["_unchanged_toast"] == ["note"] and posts[1]["note"] is None
    assert posts[2]["_unchanged_toast"] is None and posts[2]["note"] is None
    applied = apply_changes(df, None, format="memory")
    assert _spark_rows(applied) == _pg_rows(pg_db)
    assert {r["id"]: r["note"] for r in applied.collect()} == {1: big, 2: None}


# --------------------------------------------------------------------------------------------------- streaming

@pytest.mark.pg_servers("pg15", "pg18")
def test_stream_live_workload_into_memory_sink_equals_table(spark, pg_db, tmp_path):
    opts = _setup_orders(pg_db)
    rng = random.Random(7)
    _workload(pg_db, rng, 20)                                   # before the query starts
    query = (spark.readStream.format("spockwire").options(**opts).load()
             .writeStream.format("memory").queryName("live_orders").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="500 milliseconds")
             .start())
    try:
        writer = threading.Thread(target=_workload, args=(pg_db, random.Random(8), 60, 5000))
        writer.start()
        writer.join()
        _wait_caught_up(query, pg_db, _slot(pg_db))
    finally:
        query.stop()
    changes = spark.table("live_orders")
    assert changes.count() > 100
    dup = changes.groupBy("_commit_lsn", "_seq").count().filter("count > 1").count()
    assert dup == 0
    assert _spark_rows(apply_changes(changes, None, format="memory")) == _pg_rows(pg_db)
    # the slot moved only as far as the committed batches
    assert _slot_lsn(pg_db, _slot(pg_db)) <= _flush_lsn(pg_db)


@pytest.mark.pg_servers("pg15", "pg18")
def test_stream_stop_and_restart_loses_and_repeats_nothing(spark, pg_db, tmp_path):
    # slot "oracle" is never read by the stream: a batch read of it afterwards is the expected change set
    opts = _setup_orders(pg_db, extra_slots=("oracle",))
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def start():
        return (spark.readStream.format("spockwire").options(**opts).option("maxChangesPerBatch", "40").load()
                .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
                .trigger(processingTime="200 milliseconds").start())

    _workload(pg_db, random.Random(1), 30)
    query = start()
    writer = threading.Thread(target=_workload, args=(pg_db, random.Random(2), 40, 5000, 0.1))
    writer.start()
    deadline = time.monotonic() + 90
    while not any(p["numInputRows"] for p in query.recentProgress) and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()                          # mid-way: the workload is still running
    first_end = _end_lsn(query.lastProgress)
    writer.join()
    _workload(pg_db, random.Random(3), 20, 9000)   # while no query runs
    # then WAL without output (as other databases of a shared server write): the restarted query's last micro-batch
    # with output may end short of it, and the query must still reach the flush LSN
    pg_db.execute("CREATE TABLE other (id int, pad text)")
    pg_db.execute("INSERT INTO other SELECT g, repeat('p', 200) FROM generate_series(1, 400) g")    # ~100 kB
    query = start()
    try:
        _wait_caught_up(query, pg_db, _slot(pg_db))
        batches = query.recentProgress
    finally:
        query.stop()
    assert first_end is not None and first_end < _flush_lsn(pg_db)
    assert any(p["numInputRows"] > 0 for p in batches)  # the restarted query read on from its checkpoint
    got = spark.read.parquet(out)
    expected = (spark.read.format("spockwire").options(**{**opts, "slot": _slot(pg_db, "oracle")}).load())
    assert got.groupBy("_commit_lsn", "_seq").count().filter("count > 1").count() == 0
    key = ["_commit_lsn", "_seq", "_change_type", "id"]
    assert sorted(map(tuple, got.select(*key).collect())) == sorted(map(tuple, expected.select(*key).collect()))
    assert _spark_rows(apply_changes(got, None, format="memory", keys=["id"])) == _pg_rows(pg_db)


def test_batch_limits_and_available_now(spark, pg_db, tmp_path):
    opts = _setup_orders(pg_db)
    _workload(pg_db, random.Random(5), 25)
    total = spark.read.format("spockwire").options(**opts).load().count()
    query = (spark.readStream.format("spockwire").options(**opts).option("maxChangesPerBatch", "30").load()
             .writeStream.format("memory").queryName("limited_orders")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == total == spark.table("limited_orders").count()
    assert len(sizes) >= 3 and max(sizes) < total
    # a WAL byte limit also splits the range; whole transactions only
    spec = SlotSpec(dsn=pg_db.dsn, slot=_slot(pg_db), publication=("pub",))
    start = _slot_lsn(pg_db, _slot(pg_db))
    assert start >= _end_lsn(query.lastProgress)
    pg_db.execute("INSERT INTO orders SELECT g, g FROM generate_series(100000, 100200) g")
    plan = plan_end(spec, start, max_wal_bytes=4096)
    assert start < plan.end <= start + 4096


def test_multi_table_layout_with_truncate(spark, pg_db):
    pg_db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    pg_db.execute("CREATE TABLE b (k text PRIMARY KEY, n numeric(6,1))")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE a, b")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_slot(pg_db),))
    pg_db.execute("INSERT INTO a VALUES (1, 'one'), (2, 'two')")
    pg_db.execute("INSERT INTO b VALUES ('x', 1.5)")
    pg_db.execute("TRUNCATE a")
    pg_db.execute("INSERT INTO a VALUES (3, 'three')")
    pg_db.execute("UPDATE b SET n = 2.5 WHERE k = 'x'")
    df = (spark.read.format("spockwire").option("dsn", pg_db.dsn).option("slot", _slot(pg_db))
          .option("publication", "pub").option("tables", "public.a, public.b").load())
    assert df.columns[-3:] == ["_table", "public_a", "public_b"]
    assert dict(df.groupBy("_table").count().collect()) == {"public.a": 4, "public.b": 2}
    a = select_table(df, "public.a")
    assert [r["_change_type"] for r in a.orderBy("_commit_lsn", "_seq").collect()] == \
        ["insert", "insert", "truncate", "insert"]
    applied = apply_changes(a, None, format="memory", keys=["id"])
    assert sorted(map(tuple, applied.select("id", "v").collect())) == [(3, "three")]
    b = apply_changes(select_table(df, "b"), None, format="memory", keys=["k"])
    assert [tuple(r) for r in b.select("k", "n").collect()] == [("x", decimal.Decimal("2.5"))]


def test_reading_past_an_advanced_slot_is_refused(spark, pg_db):
    opts = _setup_orders(pg_db)
    start = _slot_lsn(pg_db, _slot(pg_db))
    pg_db.execute("INSERT INTO orders (id) VALUES (1)")
    pg_db.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", (_slot(pg_db),))
    df = spark.read.format("spockwire").options(**opts).option("startingLsn", format_lsn(start)).load()
    with pytest.raises(Exception, match="past the start"):
        df.collect()
    from spockwire.spark.slot import read_range
    with pytest.raises(SlotAheadError):
        list(read_range(SlotSpec(dsn=pg_db.dsn, slot=_slot(pg_db), publication=("pub",)), start, _flush_lsn(pg_db)))


# ------------------------------------------------------------------------------------------- micro-batch planning

def _uniform_backlog(db, txns: int, rows: int = 2, start_id: int = 1) -> None:
    """`txns` transactions of `rows` small inserts each (begin, `rows` inserts, commit: rows + 2 messages)."""
    conn = db.connect(autocommit=False)
    try:
        cur = conn.cursor()
        for t in range(txns):
            first = start_id + t * rows
            cur.execute("INSERT INTO orders (id, qty, note) SELECT g, g %% 7, 'n' || g FROM generate_series(%s, %s) g",
                        (first, first + rows - 1))
            conn.commit()
    finally:
        conn.close()


def _slot_stats(db, slot: str) -> tuple[int, int]:
    """(total_txns, total_bytes) the slot decoded so far, peeks included (pg_stat_replication_slots, PG 14+)."""
    (txns, size), = db.query("SELECT total_txns, total_bytes FROM pg_stat_replication_slots WHERE slot_name = %s",
                             (slot,))
    return int(txns), int(size)


def _sessions(db) -> int:
    """Sessions established to the database so far (pg_stat_database, PG 14+; a session that ended is counted)."""
    return int(db.query("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")[0][0])


def _available_now(spark, opts: dict, name: str, ck: str, **options: str) -> list[dict]:
    """Run the stream with Trigger.AvailableNow into a memory table; its progress reports of micro-batches with
    an offset range (empty ones included)."""
    reader = spark.readStream.format("spockwire").options(**opts)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("memory").queryName(name).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise query.exception()
    return [p for p in query.recentProgress if _end_lsn(p) is not None]


def _spans(batches: list[dict], first_start: int) -> list[int]:
    """The WAL bytes each micro-batch covered (the first starts at `first_start`: its progress names no start)."""
    ends = [_end_lsn(p) for p in batches]
    return [end - start for start, end in zip([first_start, *ends], ends)]


def _assert_exactly_the_oracles_rows(spark, db, opts: dict, name: str) -> None:
    """The memory table `name` holds every change the untouched slot "oracle" holds, each once."""
    got = spark.table(name)
    expected = spark.read.format("spockwire").options(**{**opts, "slot": _slot(db, "oracle")}).load()
    key = ["_commit_lsn", "_seq", "_change_type", "id"]
    assert got.groupBy("_commit_lsn", "_seq").count().filter("count > 1").count() == 0
    assert sorted(map(tuple, got.select(*key).collect())) == sorted(map(tuple, expected.select(*key).collect()))


def test_max_wal_bytes_alone_bounds_the_micro_batches(spark, pg_db, tmp_path):
    """maxWalBytesPerBatch without maxChangesPerBatch: a backlog is read in several micro-batches, each over at most
    that much WAL, every change exactly once."""
    opts = _setup_orders(pg_db, extra_slots=("oracle",))
    _uniform_backlog(pg_db, 300)
    start = _slot_lsn(pg_db, _slot(pg_db))
    backlog = _flush_lsn(pg_db) - start
    bound = 16 << 10
    assert backlog > 4 * bound, backlog
    batches = _available_now(spark, opts, "wal_bounded", str(tmp_path / "ck"), maxWalBytesPerBatch=str(bound))
    spans = _spans(batches, start)
    assert len([p for p in batches if p["numInputRows"]]) >= backlog // bound, spans
    assert all(0 < span <= bound for span in spans), spans
    assert sum(p["numInputRows"] for p in batches) == 600
    _assert_exactly_the_oracles_rows(spark, pg_db, opts, "wal_bounded")


def test_max_changes_splits_a_backlog_decoded_once_over_reused_connections(spark, pg_db, tmp_path):
    """maxChangesPerBatch splits a backlog into micro-batches of about that many messages; the server decodes the
    backlog about once over the whole run (the planning peeks only a sample at each batch's start, which the
    executor decodes again), not twice; and the micro-batches share connections (the driver's one, each Python
    worker's one) instead of opening new ones."""
    opts = _setup_orders(pg_db, extra_slots=("oracle",))
    txns, rows = 400, 2
    _uniform_backlog(pg_db, txns, rows)
    decoded_before = _slot_stats(pg_db, _slot(pg_db))[0]
    sessions_before = _sessions(pg_db)
    wanted = 100                      # messages: about 25 transactions of 4 (begin, 2 inserts, commit)
    batches = _available_now(spark, opts, "count_bounded", str(tmp_path / "ck"), maxChangesPerBatch=str(wanted))
    sizes = [p["numInputRows"] for p in batches if p["numInputRows"]]
    assert sum(sizes) == txns * rows
    per_batch = wanted * rows // (rows + 2)          # the rows of about `wanted` messages
    assert len(sizes) >= txns * rows // per_batch // 2, sizes
    assert all(s <= 3 * per_batch for s in sizes), sizes
    assert all(s >= per_batch // 3 for s in sizes[:-1]), sizes
    deadline = time.monotonic() + 30
    while (decoded := _slot_stats(pg_db, _slot(pg_db))[0] - decoded_before) < txns and time.monotonic() < deadline:
        time.sleep(0.2)                # the stats of the last read's backend may land a moment later
    # each planning's sample is about a tenth of its batch (plus the transaction that reaches it), decoded twice
    assert txns <= decoded <= txns * 1.25 + len(batches), (decoded, len(batches))
    # the driver plans and commits over one connection; each Python worker reads over one of its own (a new
    # connection for each planning, read and commit would be three a micro-batch)
    sessions = _sessions(pg_db) - sessions_before
    assert len(batches) >= 12 and sessions <= 10, (sessions, len(batches))
    _assert_exactly_the_oracles_rows(spark, pg_db, opts, "count_bounded")


def test_planning_and_reads_reuse_their_connections_and_reconnect(pg_db):
    """The driver's planning connection and a process's reading connection are kept across calls, opened again
    when their backend went away, and a read abandoned mid-way leaves its connection without a transaction (and
    the slot free)."""
    from spockwire.spark.slot import ReusedConnection, pooled_connection, read_range

    opts = _setup_orders(pg_db)
    spec = SlotSpec(dsn=pg_db.dsn, slot=opts["slot"], publication=("pub",))
    start = _slot_lsn(pg_db, opts["slot"])
    _uniform_backlog(pg_db, 30, rows=100)
    end = _flush_lsn(pg_db)

    def terminate(pid: int) -> None:
        pg_db.query("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while pg_db.query("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def rows() -> list[tuple]:
        return [(b.column(0)[i].as_py(), b.column(4)[i].as_py()) for _t, b in read_range(spec, start, end)
                for i in range(b.num_rows)]

    def reading_pid() -> int:
        with pooled_connection(pg_db.dsn) as held:
            return held.get()[0].get_backend_pid()

    expected = rows()
    assert len(expected) == 3000
    pid = reading_pid()
    assert rows() == expected and reading_pid() == pid            # the same backend read again
    terminate(pid)
    assert rows() == expected and reading_pid() != pid            # a new one after it went away
    partial = read_range(spec, start, end)
    next(partial)
    partial.close()                                               # abandoned mid-way
    with pooled_connection(pg_db.dsn) as held:
        conn = held.get()[0]
        assert conn.info.transaction_status == 0                  # psycopg2 TRANSACTION_STATUS_IDLE
    assert pg_db.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                       (opts["slot"],))[0][0] is None
    assert rows() == expected

    planner = ReusedConnection(pg_db.dsn)
    try:
        plans = [plan_end(spec, start, connection=planner)]
        pid = planner.get()[0].get_backend_pid()
        plans.append(plan_end(spec, start, connection=planner))
        assert planner.opened == 1
        terminate(pid)
        plans.append(plan_end(spec, start, connection=planner))
        assert planner.opened == 2
        assert all(p.end >= end and p.messages > 0 and not p.empty for p in plans), plans
    finally:
        planner.close()


def test_planning_moves_over_wal_without_output_in_empty_ranges(pg_db):
    """WAL of tables outside the publication: the planning peeks a 1 MiB window, then looks further for the first
    transaction with output; the WAL before it becomes an empty range (nothing to read), and the next planning
    starts at that transaction. A little such WAL and nothing else makes no range at all. (The empty range may end
    past the flush LSN read before the transaction: the server writes WAL of its own in between, autovacuum's
    ANALYZE of the table just filled among it.)"""
    from spockwire.spark.slot import PLAN_WINDOW_BYTES, read_range

    opts = _setup_orders(pg_db)
    pg_db.execute("CREATE TABLE other (id int, pad text)")
    spec = SlotSpec(dsn=pg_db.dsn, slot=opts["slot"], publication=("pub",))
    start = _slot_lsn(pg_db, opts["slot"])
    pg_db.execute("INSERT INTO other SELECT g, repeat('p', 100) FROM generate_series(1, 100) g")    # ~15 kB
    idle = plan_end(spec, start)
    assert (idle.end, idle.messages, idle.empty) == (start, 0, False)       # no micro-batch for that
    pg_db.execute("INSERT INTO other SELECT g, repeat('p', 200) FROM generate_series(1, 20000) g")  # ~5 MB
    before = _flush_lsn(pg_db)
    assert before - start > 2 * PLAN_WINDOW_BYTES
    pg_db.execute("INSERT INTO orders (id, qty) VALUES (1, 1)")
    after = _flush_lsn(pg_db)
    skip = plan_end(spec, start)
    assert skip.empty and start + PLAN_WINDOW_BYTES < skip.end < after, (skip, before, after)
    assert list(read_range(spec, start, skip.end)) == []                    # indeed nothing in it
    found = plan_end(spec, skip.end)
    assert not found.empty and found.messages > 0 and found.end >= after
    batches = [b for _t, b in read_range(spec, skip.end, found.end)]
    assert [b.column(0).to_pylist() for b in batches] == [["insert"]]


@pytest.mark.pg_servers("pg15", "pg18")
def test_a_range_never_ends_inside_a_wal_record_not_yet_written_out(pg_db):
    """The server writes WAL out as transactions commit, a page at a time: a record that commits nothing (here a
    non-transactional logical message over several pages) is written out only up to its last full page, and the
    flush LSN falls inside it. A peek up to that point would wait until the record is written out: at the next
    commit, or when the WAL writer writes the partial page by itself (up to seconds later). The planning's bound
    is past the record instead, with all of it written out (an empty transaction commits for that): the range is
    read without waiting (a statement timeout would cut a wait short and fail the read) and holds the
    transaction before the message."""
    from spockwire.spark.slot import read_range

    opts = _setup_orders(pg_db)
    patient = pg_db.cluster.dsn(pg_db.name, options="-c statement_timeout=20s")
    spec = SlotSpec(dsn=patient, slot=opts["slot"], publication=("pub",))
    start = _slot_lsn(pg_db, opts["slot"])
    pg_db.execute("INSERT INTO orders (id, qty) VALUES (1, 1)")
    for _attempt in range(5):
        message_end = parse_lsn(pg_db.query(
            "SELECT pg_logical_emit_message(false, 'spockwire-test', repeat('x', 40000))::text")[0][0])
        deadline = time.monotonic() + 30
        while _flush_lsn(pg_db) <= message_end - 40000:      # the WAL writer writes the message's full pages out
            assert time.monotonic() < deadline, "the server did not write out the message's first pages"
            time.sleep(0.05)
        inside = _flush_lsn(pg_db)
        if inside < message_end:
            break           # else another test's commit (the cluster is shared) wrote it all out: once more
    assert inside < message_end, "the message was written out whole five times"
    plan = plan_end(spec, start)
    assert plan.end >= message_end and _flush_lsn(pg_db) >= plan.end, (plan, inside, message_end)
    batches = [b for _t, b in read_range(spec, start, plan.end)]
    assert [b.column(0).to_pylist() for b in batches] == [["insert"]]


def _cut_short_of_the_flush(db, extra_slots: tuple[str, ...] = ()) -> tuple[dict, SlotSpec, int, int]:
    """A transaction for the stream, then ~500 kB of WAL without output (a table outside the publication):
    maxChangesPerBatch=40 estimates the first range's end from the transaction alone (about 7 times its WAL),
    short of the flush LSN. (opts, spec, the slot's position, the estimated end)."""
    opts = _setup_orders(db, extra_slots=extra_slots)
    db.execute("CREATE TABLE other (id int, pad text)")
    spec = SlotSpec(dsn=db.dsn, slot=opts["slot"], publication=("pub",))
    db.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", (opts["slot"],))
    start = _slot_lsn(db, opts["slot"])                 # after the DDL: the sample's WAL is the transaction's
    db.execute("INSERT INTO orders (id, qty) SELECT g, g FROM generate_series(1, 3) g")
    db.execute("INSERT INTO other SELECT g, repeat('p', 200) FROM generate_series(1, 2000) g")
    cut = plan_end(spec, start, max_messages=40)
    assert cut.estimated and start < cut.end < _flush_lsn(db), cut
    return opts, spec, start, cut.end


@pytest.mark.pg_servers("pg15", "pg18")
def test_a_range_cut_short_of_the_flush_is_followed_by_an_empty_one(pg_db):
    """maxChangesPerBatch's estimate ends a range short of the flush LSN, with only WAL without output after it:
    the stream reader's next planning moves over that WAL in one empty range (else the query stays short of the
    flush, and the slot holds that WAL, until idleAdvanceBytes of WAL went by). A reader of a restarted query, which
    does not know how its checkpoint's last range ended, does the same. From the flush, a little WAL without output
    makes no range, as before, until idleAdvanceSeconds of plannings found nothing else: then one empty range."""
    import dataclasses

    from spockwire.spark.source_reader import SpockwireStreamReader

    opts, spec, start, cut = _cut_short_of_the_flush(pg_db, extra_slots=("restart",))
    options = {**opts, "maxChangesPerBatch": "40"}
    again = dataclasses.replace(spec, slot=_slot(pg_db, "restart"))     # untouched so far: at `start` or before

    def offset(lsn: int) -> dict:
        return {"lsn": format_lsn(lsn), "timeline": 1}     # (an offset records the server's timeline with its LSN)

    reader = SpockwireStreamReader(spec, None, {**options, "idleAdvanceSeconds": "1"})
    restarted = SpockwireStreamReader(again, None, {**options, "slot": again.slot})
    try:
        assert reader.latestOffset(offset(start), None) == offset(cut)
        assert len(reader.partitions(offset(start), offset(cut))) == 1
        reader.commit(offset(cut))
        flush = _flush_lsn(pg_db)
        end = parse_lsn(reader.latestOffset(offset(cut), None)["lsn"])
        assert end >= flush
        assert reader.partitions(offset(cut), offset(end)) == []          # empty: nothing to read
        reader.commit(offset(end))
        assert _slot_lsn(pg_db, opts["slot"]) == end
        pg_db.execute("INSERT INTO other VALUES (0, 'p')")
        assert reader.latestOffset(offset(end), None) == offset(end)      # idle: no micro-batch
        time.sleep(1.2)            # ... until idleAdvanceSeconds of plannings found only WAL without output
        quiet = parse_lsn(reader.latestOffset(offset(end), None)["lsn"])
        assert quiet > end and reader.partitions(offset(end), offset(quiet)) == []
        # a restarted query's reader, from a checkpoint whose last range ended at the cut (the slot moved there)
        restarted.commit(offset(cut))
        assert _slot_lsn(pg_db, again.slot) == cut
        # plan_end itself, from there, sees no output and below idleAdvanceBytes makes no range
        assert plan_end(again, cut, max_messages=40).end == cut
        flush = _flush_lsn(pg_db)              # before planning: the server's own WAL (autovacuum) may follow
        assert parse_lsn(restarted.latestOffset(offset(cut), None)["lsn"]) >= flush
    finally:
        reader.stop()
        restarted.stop()


def test_stream_cut_short_by_an_estimate_catches_up_with_the_flush(spark, pg_db, tmp_path):
    """The same through Spark: a query with maxChangesPerBatch reaches the flush LSN although its micro-batch with
    the last output ended short of it, before WAL without output (what `_wait_caught_up` waits for: WAL that other
    databases of a shared server write after the workload's last transaction must not leave a query short of it)."""
    opts, _spec, _start, _cut = _cut_short_of_the_flush(pg_db)
    query = (spark.readStream.format("spockwire").options(**opts).option("maxChangesPerBatch", "40").load()
             .writeStream.format("memory").queryName("cut_short").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        _wait_caught_up(query, pg_db, _slot(pg_db), timeout=60)
    finally:
        query.stop()
    assert sorted(r["id"] for r in spark.table("cut_short").collect()) == [1, 2, 3]


def test_a_large_range_is_read_as_two_halves_side_by_side(spark, pg_db, tmp_path):
    """A range over at least 16 MiB of WAL is read as two partitions, the second from a copy of the slot advanced
    to the middle: the rows equal the unsplit read, each once; the copies are dropped at the end, and one left by
    a task that died is dropped by the next planning."""
    from spockwire.spark.slot import SPLIT_WAL_BYTES, read_range

    opts = _setup_orders(pg_db, extra_slots=("oracle",))
    start = _slot_lsn(pg_db, opts["slot"])
    for lo in range(0, 18_000, 3_000):            # several transactions on both sides of the middle
        pg_db.execute("INSERT INTO orders (id, qty, note) SELECT g, g %% 7, repeat('n', 1100) || g "
                      "FROM generate_series(%s, %s) g", (lo + 1, lo + 3_000))
    pg_db.execute("UPDATE orders SET qty = qty + 1 WHERE id % 100 = 0")
    end = _flush_lsn(pg_db)
    assert end - start >= SPLIT_WAL_BYTES, end - start

    def copies() -> list[str]:
        return [name for (name,) in pg_db.query("SELECT slot_name FROM pg_replication_slots "
                                                "WHERE slot_name LIKE %s", (opts["slot"][:40] + "_swspk_%",))]

    key = ["_commit_lsn", "_seq", "_change_type", "id", "qty"]
    df = spark.read.format("spockwire").options(**opts).option("endingLsn", format_lsn(end)).load()
    assert df.rdd.getNumPartitions() == 2
    split = sorted(map(tuple, df.select(*key).collect()))
    assert copies() == []
    whole = (spark.read.format("spockwire").options(**opts).option("endingLsn", format_lsn(end))
             .option("splitWalBytes", "0").load())
    assert whole.rdd.getNumPartitions() == 1
    assert split == sorted(map(tuple, whole.select(*key).collect()))
    assert len(split) == 18_000 + 180 and len(set((r[0], r[1]) for r in split)) == len(split)
    # the second half alone, from a copy: exactly the transactions committed in it
    middle = start + (end - start) // 2
    spec = SlotSpec(dsn=pg_db.dsn, slot=opts["slot"], publication=("pub",))
    tail: set[tuple[int, int]] = set()
    seen_copies: list = []
    for _t, b in read_range(spec, middle, end, from_copy=True):
        if not seen_copies:                        # while it reads: the copy, at the middle
            seen_copies = pg_db.query("SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots "
                                      "WHERE slot_name LIKE %s", (opts["slot"][:40] + "_swspk_%",))
        tail |= {(b.column(1)[i].as_py(), b.column(4)[i].as_py()) for i in range(b.num_rows)}
    assert [parse_lsn(lsn) for _name, lsn in seen_copies] == [middle]
    assert tail == {(r[0], r[1]) for r in split if r[0] >= middle} and tail
    assert _slot_lsn(pg_db, opts["slot"]) == start and copies() == []
    # a copy left behind by a task that died: dropped by the next planning (here: of a batch read)
    pg_db.query("SELECT pg_copy_logical_replication_slot(%s, %s, false)",
                (opts["slot"], opts["slot"][:40] + "_swspk_deadbeef"))
    assert copies() == [opts["slot"][:40] + "_swspk_deadbeef"]
    spark.read.format("spockwire").options(**opts).option("endingLsn", format_lsn(start)).load().collect()
    assert copies() == []
    # a stream's micro-batch over the whole backlog is split too, and reads the same rows
    query = (spark.readStream.format("spockwire").options(**opts).load().writeStream.format("memory")
             .queryName("split_stream").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300) and query.exception() is None
    assert sorted(map(tuple, spark.table("split_stream").select(*key).collect())) == split
    assert copies() == []


def test_the_smaller_of_the_two_bounds_wins(pg_db):
    """maxWalBytesPerBatch and maxChangesPerBatch together: whichever bound is smaller ends the range."""
    opts = _setup_orders(pg_db)
    spec = SlotSpec(dsn=pg_db.dsn, slot=opts["slot"], publication=("pub",))
    start = _slot_lsn(pg_db, opts["slot"])
    _uniform_backlog(pg_db, 400)                 # 4 messages a transaction
    flush = _flush_lsn(pg_db)
    per_txn = (flush - start) / 400
    by_bytes = plan_end(spec, start, max_messages=100_000, max_wal_bytes=8192)
    assert by_bytes.end == start + 8192 and not by_bytes.estimated
    by_count = plan_end(spec, start, max_messages=200, max_wal_bytes=1 << 30)
    assert by_count.estimated and by_count.end < flush
    # about 50 transactions: the estimate comes from a sample of the same kind of transactions
    assert 25 * per_txn <= by_count.end - start <= 100 * per_txn, (by_count, per_txn)
