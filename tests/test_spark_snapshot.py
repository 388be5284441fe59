"""The ``spockwire`` source with ``startingPosition`` ``snapshot``: tables that hold rows before the slot exists,
read by Spark tasks that import the slot's exported snapshot (several block ranges per table), then the changes,
with writes running the whole time; applied, the result equals the source table (the oracle: the table itself)."""
from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from spockwire.spark import apply_changes, read_staging
from spockwire.spark.snapshot import MIN_SLOT_CHUNK_PAGES, page_ranges
from tests.conftest import load_impl
from tests.spark_session import spark_session
from tests.test_snapshot import KEYED_COLUMNS, RowWriters, _wait, create_keyed, worker_in_thread
from tests.test_snapshot_chunked import chunk_records, source_text
from tests.test_spark_source import _pg_rows, _slot, _spark_rows, _wait_caught_up, _workload, ORDERS_DDL

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 200_000), st.integers(1, 8192), st.integers(1, 64))
def test_a_table_is_read_in_equal_ranges_that_fill_the_task_slots(pages, chunk_pages, slots):
    ranges = page_ranges(pages, chunk_pages, slots)
    # every page once, in order; the last range open-ended (pages added since the planning are read too)
    assert ranges[0][0] == 0 and ranges[-1][1] is None
    assert all(stop == nxt for (_f, stop), (nxt, _s) in zip(ranges, ranges[1:]))
    sizes = [stop - first for first, stop in ranges[:-1]] + [max(pages - ranges[-1][0], 0)]
    assert sum(sizes) == pages
    assert max(sizes) - min(sizes) <= 1                      # equal but for rounding
    need = -(-pages // chunk_pages) if pages else 1          # ranges of at most chunk_pages
    if len(ranges) % slots == 0:
        # the fewest that fill the slots: ranges up to 1.5 x chunk_pages, or no more than needed
        assert len(ranges) == need or max(sizes) <= chunk_pages * 3 // 2 + 1
        assert len(ranges) - slots < need
        assert len(ranges) >= need or len(ranges) == need // slots * slots
    else:
        # the slots could not be filled: too few pages for ranges of MIN_SLOT_CHUNK_PAGES
        assert len(ranges) == need
        assert pages < -(-need // slots) * slots * min(MIN_SLOT_CHUNK_PAGES, chunk_pages)
        assert need < slots or pages > need // slots * slots * chunk_pages * 3 // 2


def test_a_table_of_three_ranges_on_two_slots_is_read_in_two():
    assert page_ranges(12_288, 4096, 1) == [(0, 4096), (4096, 8192), (8192, None)]
    assert page_ranges(11_256, 4096, 2) == [(0, 5628), (5628, None)]                 # one round of tasks
    assert page_ranges(12_288, 4096, 2) == [(0, 6144), (6144, None)]
    assert page_ranges(12_289, 4096, 2) == [(0, 3072), (3072, 6144), (6144, 9216), (9216, None)]
    assert page_ranges(4000, 4096, 2) == [(0, 2000), (2000, None)]
    assert page_ranges(20_000, 4096, 4) == [(0, 5000), (5000, 10000), (10000, 15000), (15000, None)]
    assert page_ranges(300, 4096, 2) == [(0, None)]          # ranges of fewer than MIN_SLOT_CHUNK_PAGES pages: one


def test_a_snapshot_task_loads_no_pandas(pg_db, tmp_path):
    """A snapshot task (a block range read under the exported snapshot, written as the micro-batch's Arrow file)
    converts no Python value through `pa.array`, which would load pandas (about 50 MB, and 0.2-0.3 s of the first
    task's time) into each of Spark's Python workers; its file holds the range's rows and the truncate row."""
    import os
    import pickle
    import subprocess
    import sys
    import textwrap

    from spockwire.spark.slot import SlotSpec
    from spockwire.spark.snapshot import SnapshotDriver, initial_offset

    pg_db.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text, ts timestamptz)")
    pg_db.execute("INSERT INTO t SELECT g, 'v' || g, now() FROM generate_series(1, 3000) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    spec = SlotSpec(dsn=pg_db.dsn, slot=_slot(pg_db), publication=("pub",))
    driver = SnapshotDriver(spec, ["public.t"], chunk_pages=4, task_slots=2)
    try:
        end = driver.next_offset(initial_offset())
        chunk = driver.partitions(end)[0]
        code = textwrap.dedent(f"""
            import pickle, sys, traceback

            class ReportPandas:        # where pandas is imported from, for the failure's message
                def find_spec(self, name, path=None, target=None):
                    if name == "pandas":
                        traceback.print_stack(file=sys.stderr)

            sys.meta_path.insert(0, ReportPandas())
            import pyarrow as pa
            from spockwire.spark.batch_files import read_files, write_files
            from spockwire.spark.snapshot import read_chunk
            spec, chunk = pickle.loads(bytes.fromhex({pickle.dumps((spec, chunk)).hex()!r}))
            schema = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.uint64()),
                                ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.uint32()),
                                ("_seq", pa.int64()), ("_origin", pa.string()),
                                ("_unchanged_toast", pa.list_(pa.string())), ("id", pa.int64()), ("v", pa.string()),
                                ("ts", pa.timestamp("us", tz="UTC"))])
            manifest = pa.Table.from_batches(list(write_files({str(tmp_path)!r}, "chunk", read_chunk(
                spec, chunk, ["id", "v", "ts"]), schema, False)))
            rows = read_files(manifest.column("path").to_pylist())
            import spockwire
            assert spockwire.__impl__ == "c", spockwire.__impl__
            print("pandas" in sys.modules)
            print(rows.column("_change_type").value_counts().to_pylist())
            print(rows.column("id").to_pylist()[1:4], rows.column("_xid").null_count == rows.num_rows)
        """)
        # the C implementation, as Spark's workers run it (the pure-Python twin builds its columns with pa.array)
        env = {**os.environ, "SPOCKWIRE_IMPL": "c"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        loaded, counts, head = out.stdout.splitlines()
    finally:
        driver.close()
    assert loaded == "False", out.stderr
    counts = {c["values"]: c["counts"] for c in eval(counts)}
    assert counts["truncate"] == 1 and 0 < counts["insert"] < 3000, counts      # one range of several
    assert head == "[1, 2, 3] True"


@pytest.mark.pg_servers("pg15", "pg18")
def test_wal_without_output_after_a_snapshot_makes_no_empty_micro_batch(pg_db):
    """Once its snapshot is read, the query that created the slot plans the changes from the consistent point as
    from a flush it reached: a little WAL without output after it makes no micro-batch, and the latest offset stays
    the snapshot's own (an offset of another form, even at the same LSN, would be an empty micro-batch right after
    every snapshot). A restarted query, which did not create the slot and cannot know where the flush was, moves
    over that WAL in one empty range, as from any checkpoint's offset."""
    from spockwire.connection.slots import format_lsn, parse_lsn
    from spockwire.spark.slot import SlotSpec
    from spockwire.spark.source_reader import SpockwireStreamReader

    pg_db.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
    pg_db.execute("CREATE TABLE other (id bigint PRIMARY KEY, v text)")
    pg_db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    options = {"dsn": pg_db.dsn, "slot": _slot(pg_db), "publication": "pub", "table": "public.t",
               "startingPosition": "snapshot"}
    spec = SlotSpec(dsn=pg_db.dsn, slot=_slot(pg_db), publication=("pub",))
    reader = SpockwireStreamReader(spec, None, options)
    restarted = None
    try:
        end = reader.latestOffset(reader.initialOffset(), None)
        assert end["snapshot"] and end["done"] == len(end["chunks"]), end        # one micro-batch reads it all
        assert reader.partitions(reader.initialOffset(), end)
        reader.commit(end)
        point = parse_lsn(end["lsn"])
        pg_db.execute("INSERT INTO other VALUES (1, 'not in the publication')")
        assert parse_lsn(pg_db.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]) > point
        assert reader.latestOffset(end, None) == end      # no micro-batch: the snapshot's offset stays the latest
        # a restarted query, from the checkpoint's last offset (the snapshot's, complete)
        restarted = SpockwireStreamReader(spec, None, options)
        after = parse_lsn(restarted.latestOffset(end, None)["lsn"])
        assert after > point
        assert restarted.partitions(end, {"lsn": format_lsn(after)}) == []      # empty: nothing to read
    finally:
        reader.stop()
        if restarted is not None:
            restarted.stop()


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
