"""Chunked snapshots of tables that join a running ingest (DBLog watermarks): the stream is not paused, the result
is exact, and a killed worker resumes at the next chunk.

Oracle: the source tables themselves (psycopg2, values as PostgreSQL's `::text`), compared with the replay of the
staging (`spockwire.ingest.replay.replay_table`, which applies the changes of a key as upserts and deletes).
"""
from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spockwire.ingest import StagingState
from spockwire.ingest.replay import replay_table
from tests.test_snapshot import (ROOT, RowWriters, _events, _ingest_cmd, _wait, create_keyed, spock_db,  # noqa: F401
                                 staged_rows, worker_in_thread)

COLUMNS = ["id", "v", "n", "big"]


def source_text(db: Any, table: str) -> dict[str, tuple]:
    """{id text: (v, n, big) as text} of the source table."""
    rows = db.query(f"SELECT id::text, v::text, n::text, big::text FROM {table}")
    return {r[0]: tuple(r[1:]) for r in rows}


def replay_text(out: Path, table: str) -> dict[str, tuple]:
    """The staging's replay in the same text form (int and text columns: Python's str is PostgreSQL's text)."""
    contents = replay_table(out, table, ["id"])
    return {str(k[0]): tuple(None if row[c] is None else str(row[c]) for c in COLUMNS[1:])
            for k, row in contents.items()}


def chunk_records(out: Path, table: str) -> list[dict[str, Any]]:
    return [r for r in StagingState.load(out).snapshots if r.get("table") == table and r["kind"] == "chunk"]


def finished_chunks(thread: threading.Thread, result: list[Any], out: Path, table: str, at_least: int
                    ) -> list[dict[str, Any]]:
    """The chunk records of `table` once the worker thread ended with 0: at least `at_least`, numbered without a
    gap or a repeat."""
    thread.join(timeout=300)
    assert result == [0]
    chunks = chunk_records(out, table)
    assert len(chunks) >= at_least and [c["chunk"] for c in chunks] == list(range(len(chunks)))
    return chunks


def items_staged_between(out: Path, chunks: list[dict[str, Any]]) -> int:
    """Staging commits with changes of `items` between the first and the last chunk commit."""
    first, last = chunks[0]["commit"], chunks[-1]["commit"]
    return len([e for e in StagingState.load(out).entries if first < e["commit"] < last
                and any(f["table"] == "public.items" for f in e["files"])])


def test_chunked_snapshot_while_writers_change_the_table_does_not_pause_the_stream(pg_db, tmp_path, impl):
    """`big` (40,000 rows) joins the publication while a writer inserts, update (some leaving a TOAST value
    unchanged), delete and change keys in it and in `items`; its first streamed change starts a snapshot in chunks
    of 2,000 rows. While the chunks are read, `items`' changes are staged in commits between the chunk commits and
    the slot is acknowledged further (the old method read the table whole with the stream paused: one commit, no
    staging in between). The replay of both tables equals the source."""
    db = pg_db
    create_keyed(db, "items", 2000)
    create_keyed(db, "big", 40000)
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, impl, out, flush_seconds=0.1, snapshot_check_interval=0,
                                              snapshot_chunk_rows=2000)
    acked: list[tuple[int, int]] = []          # (chunks staged, slot's confirmed_flush_lsn) while big is read
    with RowWriters(db.dsn, ["items", "big"], threads=2, key_space=1_000_000) as writers:
        thread.start()
        _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
        time.sleep(0.3)
        db.execute("ALTER PUBLICATION pub ADD TABLE big")
        _wait(lambda: any(r.get("table") == "public.big" for r in worker.writer.state.snapshots), thread)
        while not any(r.get("done") for r in chunk_records(out, "public.big")):
            assert thread.is_alive(), "the worker ended early"
            lsn = db.query("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots "
                           "WHERE slot_name = %s", (worker.config.slot,))[0][0]
            acked.append((len(chunk_records(out, "public.big")), int(lsn)))
            time.sleep(0.05)
        ops = writers.ops
        time.sleep(0.5)
    assert ops > 100
    chunks = finished_chunks(thread, result, out, "public.big", 15)
    assert [c["done"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert sum(c["rows_changed_in_stream"] for c in chunks) > 0, "no chunk row was superseded by the stream"
    # rows whose staged version lacked a TOAST value (updated before their chunk was read) were read again
    assert any(c["chunk_kind"] == "refetch" for c in chunks)
    # the stream went on: items' changes were staged by commits between the first and the last chunk commit,
    # and the slot was acknowledged further while chunks were still to come
    state = StagingState.load(out)
    between = items_staged_between(out, chunks)
    assert between >= 3, f"{between} commits staged changes of items while big was read"
    during = [lsn for n, lsn in acked if 0 < n < len(chunks)]
    assert during and max(during) > min(during), "the slot was not acknowledged while big was read"
    # the chunk rows: snapshot rows at their high watermark's position, numbered from -2^63 per chunk
    rows = [r for r in staged_rows(out, "public.big") if r["_xid"] is None]
    assert sum(c["tables"]["public.big"] for c in chunks) == len(rows)
    assert {r["_commit_lsn"] for r in rows} <= {c["consistent_point"] for c in chunks}
    assert all(r["_change_type"] == "insert" for r in rows)
    assert len(state.schemas["public.big"]) == 1, "chunk rows and streamed changes are one schema version"
    # the watermarks were consumed, never staged as messages
    assert not state.message_files
    for table in ("items", "big"):
        assert replay_text(out, f"public.{table}") == source_text(db, table)


@pytest.mark.parametrize("plugin, impl_name", [("pgoutput", "c"), ("pgoutput", "python"), ("pglogical", "c")])
def test_kill9_in_the_middle_of_a_chunked_snapshot_resumes_at_the_next_chunk(pg_db, tmp_path, plugin, impl_name):
    """The worker is killed (SIGKILL) after a few of `late`'s chunks are staged, while writers change it; the
    restarted worker resumes `late` at the chunk after the last staged one (no chunk is read twice, none skipped)
    and the replay equals the source."""
    db = pg_db
    create_keyed(db, "items", 1000)
    create_keyed(db, "late", 30000)
    if plugin == "pglogical":
        _pglogical_provider(db, ["items"])
        join = "SELECT pglogical.replication_set_add_table('default', 'late')"
    else:
        db.execute("CREATE PUBLICATION pub FOR TABLE items")
        join = "ALTER PUBLICATION pub ADD TABLE late"
    out = tmp_path / "staging"
    slot = f"{db.name}_s"
    cmd = _ingest_cmd(db.dsn, slot, out, "--impl", impl_name, "--snapshot-chunk-rows", "1000", "--plugin", plugin)
    with RowWriters(db.dsn, ["items", "late"], threads=2, key_space=1_000_000):
        proc = subprocess.Popen(cmd + ["--idle-exit", "60"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not StagingState.load(out).snapshots:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        db.execute(join)
        while len(chunk_records(out, "public.late")) < 4:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline + 60
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        before = chunk_records(out, "public.late")
        assert not before[-1]["done"]
        done = subprocess.Popen(cmd + ["--idle-exit", "2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(r["done"] for r in chunk_records(out, "public.late")):
            assert done.poll() is None, done.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err.decode()[-3000:]
    assert "snapshot_resumed" in _events(err.decode())
    chunks = chunk_records(out, "public.late")
    assert chunks[:len(before)] == before
    assert [c["chunk"] for c in chunks] == list(range(len(chunks))), "a chunk was read twice or skipped"
    assert chunks[len(before)]["commit"] > before[-1]["commit"]
    for table in ("items", "late"):
        assert replay_text(out, f"public.{table}") == source_text(db, table)


def test_composite_key_partitioned_root_in_chunks_found_by_the_publication_check(pg_db, tmp_path, impl):
    """A partitioned table published through its root, with a two-column key (int, text in mixed case: the
    chunks follow the server's collation order, never Python's), added while ingest runs and found by the periodic
    publication check; a writer changes it (also the text part of keys) while its chunks of 700 rows are read.
    The replay equals the source."""
    import psycopg2

    db = pg_db
    create_keyed(db, "items", 500)
    db.execute("CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b)) PARTITION BY RANGE (a)")
    db.execute("CREATE TABLE pairs_low PARTITION OF pairs FOR VALUES FROM (MINVALUE) TO (50)")
    db.execute("CREATE TABLE pairs_high PARTITION OF pairs FOR VALUES FROM (50) TO (MAXVALUE)")
    db.execute("INSERT INTO pairs SELECT g % 100, CASE WHEN g % 3 = 0 THEN 'Key ' ELSE 'key ' END || g, 'v' || g "
               "FROM generate_series(1, 6000) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE items WITH (publish_via_partition_root = true)")
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, impl, out, flush_seconds=0.1, snapshot_check_interval=0.3,
                                              snapshot_chunk_rows=700)
    stop = threading.Event()

    def write() -> None:
        import random

        rng = random.Random(3)
        conn = psycopg2.connect(db.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        n = 0
        while not stop.is_set():
            n += 1
            a = rng.randrange(100)
            op = rng.random()
            if op < 0.3:
                cur.execute("INSERT INTO pairs VALUES (%s, %s, 'new') ON CONFLICT DO NOTHING", (a, f"new {n}"))
            elif op < 0.6:
                cur.execute("UPDATE pairs SET v = v || '.' WHERE (a, b) = (SELECT a, b FROM pairs WHERE a = %s "
                            "ORDER BY b LIMIT 1)", (a,))
            elif op < 0.8:
                cur.execute("DELETE FROM pairs WHERE (a, b) = (SELECT a, b FROM pairs WHERE a = %s ORDER BY b DESC "
                            "LIMIT 1)", (a,))
            else:                           # a key change across partitions and chunks
                cur.execute("UPDATE pairs SET a = %s, b = 'moved ' || %s WHERE (a, b) = (SELECT a, b FROM pairs "
                            "WHERE a = %s ORDER BY b LIMIT 1)", ((a + 50) % 100, n, a))
        conn.close()

    writer = threading.Thread(target=write, daemon=True)
    thread.start()
    _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
    writer.start()
    db.execute("ALTER PUBLICATION pub ADD TABLE pairs")
    _wait(lambda: any(r["done"] for r in chunk_records(out, "public.pairs")), thread)
    stop.set()
    writer.join(timeout=60)
    thread.join(timeout=300)
    assert result == [0]
    chunks = chunk_records(out, "public.pairs")
    assert len([c for c in chunks if c["chunk_kind"] == "range"]) >= 8
    assert chunks[0]["key_columns"] == ["a", "b"]
    staged = replay_table(out, "public.pairs", ["a", "b"])
    replayed = {(str(a), b): row["v"] for (a, b), row in staged.items()}
    assert replayed == {(r[0], r[1]): r[2] for r in db.query("SELECT a::text, b, v FROM pairs")}


def _pglogical_provider(db: Any, tables: list[str]) -> None:
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (db.dsn,))
    for t in tables:
        db.execute("SELECT pglogical.replication_set_add_table('default', %s)", (t,))


def _chunked_through_the_watermark_table(db: Any, tmp_path: Path, impl: Any, plugin: str, add_table: str) -> None:
    create_keyed(db, "items", 2000)
    create_keyed(db, "big", 16000)
    db.execute(add_table, ("items",))
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, impl, out, plugin=plugin, flush_seconds=0.1,
                                              snapshot_check_interval=0, snapshot_chunk_rows=1000)
    with RowWriters(db.dsn, ["items", "big"], threads=2, key_space=1_000_000) as writers:
        thread.start()
        _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
        time.sleep(0.3)
        db.execute(add_table, ("big",))
        _wait(lambda: any(r.get("done") for r in chunk_records(out, "public.big")), thread)
        ops = writers.ops
        time.sleep(0.5)
    assert ops > 50
    chunks = finished_chunks(thread, result, out, "public.big", 12)
    state = StagingState.load(out)
    between = items_staged_between(out, chunks)
    assert between >= 3, f"{between} commits staged changes of items while big was read"
    # the watermark rows were taken by the worker: never staged, never snapshotted
    assert "public.spockwire_watermark" not in state.files and "public.spockwire_watermark" not in state.schemas
    assert not any("public.spockwire_watermark" in r.get("tables", {}) for r in state.snapshots)
    marks = db.query("SELECT slot, mark FROM public.spockwire_watermark")
    assert [m[0] for m in marks] == [worker.config.slot] and marks[0][1].endswith(":high")
    for table in ("items", "big"):
        assert replay_text(out, f"public.{table}") == source_text(db, table)


def test_pglogical_chunked_snapshot_through_the_watermark_table(pg_db, tmp_path, impl):
    """pglogical forwards no logical messages: the watermarks are rows of public.spockwire_watermark, which the
    worker creates and adds to the replication set. `big` (16,000 rows) joins the set while writers change it and
    `items`: it is read in chunks while items' changes keep being staged, no watermark row is staged, and the
    replay of both tables equals the source."""
    _pglogical_provider(pg_db, [])
    _chunked_through_the_watermark_table(pg_db, tmp_path, impl, "pglogical",
                                         "SELECT pglogical.replication_set_add_table('default', %s)")


def test_spock_chunked_snapshot_through_the_watermark_table(spock_db, tmp_path, impl):
    """The same on the Spock cluster (PostgreSQL 18, spock_output): the table is added with spock.repset_add_table."""
    _chunked_through_the_watermark_table(spock_db, tmp_path, impl, "spock",
                                         "SELECT spock.repset_add_table('default', %s)")


def test_pglogical_without_a_usable_watermark_table_reads_the_table_whole(pg_db, tmp_path, impl_name="c"):
    """A table of the watermark table's name that is not the worker's (other columns) cannot hold watermarks: the
    worker says so and reads the joining table whole, with the stream paused; the result is exact all the same."""
    import spockwire.wire._decoder as impl

    db = pg_db
    create_keyed(db, "items", 1000)
    create_keyed(db, "big", 5000)
    db.execute("CREATE TABLE public.spockwire_watermark (id int PRIMARY KEY)")
    _pglogical_provider(db, ["items"])
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, impl, out, plugin="pglogical", flush_seconds=0.1,
                                              snapshot_check_interval=0, snapshot_chunk_rows=1000)
    with RowWriters(db.dsn, ["items", "big"], threads=1, key_space=100_000):
        thread.start()
        _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
        db.execute("SELECT pglogical.replication_set_add_table('default', 'big')")
        _wait(lambda: any("public.big" in r.get("tables", {}) for r in worker.writer.state.snapshots), thread)
        time.sleep(0.5)
    thread.join(timeout=300)
    assert result == [0]
    state = StagingState.load(out)
    kinds = [r["kind"] for r in state.snapshots if "public.big" in r.get("tables", {}) or r.get("table") == "public.big"]
    assert kinds == ["incremental"]
    assert worker.incremental.chunked.unavailable() is not None
    for table in ("items", "big"):
        assert replay_text(out, f"public.{table}") == source_text(db, table)
