"""The initial snapshot against real servers: a slot created with an exported snapshot, every replicated table read
under it while writers keep changing the tables, then the stream from the consistent point. Snapshot rows plus the
streamed changes, applied in (`_commit_lsn`, `_seq`) order, must equal the source tables exactly (the oracle is the
source tables themselves, read with psycopg2 after the writers stopped).

Covered: pgoutput and pglogical on PostgreSQL 15 and spock_output on the Spock cluster (PostgreSQL 18), both
decoder implementations; inserts, updates, deletes, key changes, large transactions and TOASTed values during the
snapshot; a table without a primary key (REPLICA IDENTITY FULL); partitioned tables with and without
publish_via_partition_root; kill -9 during the snapshot, then a restart that discards it and takes a new one.
"""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from spockwire.ingest import StagingState, read_staging
from spockwire.ingest.worker import IngestConfig, IngestWorker
from spockwire.model import ChangeBatch, Relation
from spockwire.snapshot.initial import SNAPSHOT_SEQ_BASE
from tests.pg_fixtures import PgDatabase, drop_inactive_slots

ROOT = Path(__file__).resolve().parent.parent
_META = ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast")


# ------------------------------------------------------------------------------------------------------------------
# writers and the replay

class Writers:
    """Threads changing the tables until stopped: small inserts, updates (TOAST left unchanged), deletes, key
    changes, and now and then a large transaction. `keyless` tables get inserts, updates and deletes of whole
    rows."""

    def __init__(self, dsn: str, keyed: list[str], keyless: list[str] = (), threads: int = 2, seed: int = 7,
                 key_space: int = 1_000_000) -> None:
        self.dsn = dsn
        self.keyed = list(keyed)
        self.keyless = list(keyless)
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.ops = 0
        self.threads = [threading.Thread(target=self._run, args=(seed + i, key_space * (i + 1)), daemon=True)
                        for i in range(threads)]

    def __enter__(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=60)
        if self.errors:
            raise self.errors[0]

    def _run(self, seed: int, base: int) -> None:
        import psycopg2

        rng = random.Random(seed)
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        ids = [base]                             # this thread's next key (each thread has its own key range)
        try:
            while not self.stop_event.is_set():
                try:
                    self._step(cur, rng, seed, base, ids)
                    self.ops += 1
                except (psycopg2.errors.DeadlockDetected, psycopg2.errors.SerializationFailure):
                    cur.execute("ROLLBACK")      # two large updates crossed: the server chose this one
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)
        finally:
            conn.close()

    def _step(self, cur: Any, rng: random.Random, seed: int, base: int, ids: list[int]) -> None:
        next_id = ids[0]
        op = rng.random()
        table = rng.choice(self.keyed)
        if self.keyless and rng.random() < 0.25:
            self._keyless_step(cur, rng, seed, op)
        elif op < 0.35:
            next_id += 1
            cur.execute(f"INSERT INTO {table} (id, v, n, big) VALUES (%s, %s, %s, %s)",
                        (next_id, f"ins {next_id}", next_id % 1000, "T" * 3000 if next_id % 7 == 0 else None))
        elif op < 0.6:
            cur.execute(f"UPDATE {table} SET v = v || '.', n = n + 1 WHERE id = "
                        f"(SELECT id FROM {table} WHERE id >= %s ORDER BY id LIMIT 1)", (rng.randrange(base),))
        elif op < 0.75:
            cur.execute(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} WHERE id >= %s ORDER BY id "
                        f"LIMIT 1)", (rng.randrange(base),))
        elif op < 0.9:
            next_id += 1
            cur.execute(f"UPDATE {table} SET id = %s WHERE id = (SELECT id FROM {table} WHERE id >= %s "
                        f"AND id < %s ORDER BY id LIMIT 1)", (next_id, rng.randrange(base), base))
        elif op < 0.97:
            cur.execute("BEGIN")
            for _ in range(3):
                next_id += 1
                cur.execute(f"INSERT INTO {table} (id, v, n) VALUES (%s, 'in tx', 1)", (next_id,))
            cur.execute(f"UPDATE {table} SET n = -n WHERE id %% 97 = %s", (rng.randrange(97),))
            cur.execute("COMMIT")
        else:                                                   # a large transaction
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {table} (id, v, n) SELECT g, 'bulk', g %% 10 FROM "
                        f"generate_series(%s, %s) g", (next_id + 1, next_id + 3000))
            next_id += 3000
            cur.execute(f"UPDATE {table} SET v = 'bulk!' WHERE id %% 13 = %s", (rng.randrange(13),))
            cur.execute("COMMIT")
        ids[0] = next_id

    def _keyless_step(self, cur: Any, rng: random.Random, seed: int, op: float) -> None:
        k = rng.choice(self.keyless)
        if op < 0.5:
            cur.execute(f"INSERT INTO {k} VALUES (%s, %s)", (rng.randrange(50), f"w{seed}"))
        elif op < 0.75:
            cur.execute(f"UPDATE {k} SET b = b || '+' WHERE ctid = (SELECT ctid FROM {k} "
                        f"WHERE a = %s LIMIT 1)", (rng.randrange(50),))
        else:
            cur.execute(f"DELETE FROM {k} WHERE ctid = (SELECT ctid FROM {k} WHERE a = %s LIMIT 1)",
                        (rng.randrange(50),))


class RowWriters(Writers):
    """Single-row changes at random keys of the whole table (not only its end), no large transactions: inserts
    (some with a TOAST value), updates that leave the TOAST value unchanged, deletes, and key changes both to keys
    after every existing one and before every existing one, each in its own transaction, now and then three in
    one; `keyless` tables as in Writers."""

    def _step(self, cur: Any, rng: random.Random, seed: int, base: int, ids: list[int]) -> None:
        table = rng.choice(self.keyed)

        def some() -> int:                   # a key of the rows the tables were created with (most still there)
            return rng.randrange(1, 40001)

        op = rng.random()
        if self.keyless and rng.random() < 0.25:
            self._keyless_step(cur, rng, seed, op)
        elif op < 0.3:
            ids[0] += 1
            n = ids[0]
            cur.execute(f"INSERT INTO {table} (id, v, n, big) VALUES (%s, %s, %s, %s)",
                        (n, f"ins {n}", n % 1000, "T" * 3000 if n % 5 == 0 else None))
        elif op < 0.6:
            cur.execute(f"UPDATE {table} SET v = v || '.', n = n + 1 WHERE id = "
                        f"(SELECT id FROM {table} WHERE id >= %s ORDER BY id LIMIT 1)", (some(),))
        elif op < 0.75:
            cur.execute(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} WHERE id >= %s ORDER BY id "
                        f"LIMIT 1)", (some(),))
        elif op < 0.9:
            ids[0] += 1
            target = ids[0] if rng.random() < 0.5 else -ids[0]
            cur.execute(f"UPDATE {table} SET id = %s WHERE id = (SELECT id FROM {table} WHERE id >= %s "
                        f"ORDER BY id LIMIT 1)", (target, some()))
        else:
            cur.execute("BEGIN")
            for _ in range(3):
                cur.execute(f"UPDATE {table} SET n = -n WHERE id = (SELECT id FROM {table} WHERE id >= %s "
                            f"ORDER BY id LIMIT 1)", (some(),))
            cur.execute("COMMIT")


def staged_rows(out: Path, table: str) -> list[dict[str, Any]]:
    """Every staged row of `table`, in (`_commit_lsn`, `_seq`) order, as Python values."""
    tbl = read_staging(out, table)
    rel = Relation(0, *table.split(".", 1), tuple(), None, 0)
    rows = [r for rb in tbl.to_batches() for r in ChangeBatch(rel, rb).to_pylist()]
    rows.sort(key=lambda r: (r["_commit_lsn"], r["_seq"]))
    return rows


def replay(out: Path, tables: list[str], columns: list[str]) -> Counter:
    """The multiset of rows (tuples of `columns`) the staged changes of `tables` leave, applied in
    (`_commit_lsn`, `_seq`) order: an insert adds its row, a delete removes its old row, an update replaces its
    old row (the pre-image, or the row with the same key) with its new one; an unchanged TOAST value keeps the
    old one. Keyless tables must be REPLICA IDENTITY FULL (their deletes and updates carry the whole old row)."""
    state = StagingState.load(out)
    steps = []
    for table in tables:
        if table in state.tables:
            steps += [((r["_commit_lsn"], r["_seq"]), r) for r in staged_rows(out, table)]
        for t in state.truncates:
            assert table not in t["tables"], "the workload does not truncate"
    steps.sort(key=lambda s: s[0])
    keyed = "id" in columns
    rows: dict[Any, tuple] = {}
    bag: Counter = Counter()
    old: tuple | None = None
    for _, r in steps:
        kind = r["_change_type"]
        toast = set(r["_unchanged_toast"] or ())
        if keyed:
            key = r["id"]
            if kind == "update_preimage":
                old = key
                continue
            if kind == "delete":
                assert key in rows, f"delete of a row that is not there: {r}"
                del rows[key]
                continue
            previous = rows.get(old if (kind == "update_postimage" and old is not None) else key)
            if kind == "update_postimage":
                assert previous is not None, f"update of a row that is not there: {r}"
                rows.pop(old if old is not None else key)
            else:
                assert key not in rows, f"insert of a row that is already there: {r}"
            old = None
            rows[key] = tuple(previous[i] if c in toast else r[c] for i, c in enumerate(columns))
        else:
            values = tuple(r[c] for c in columns)
            if kind in ("delete", "update_preimage"):
                assert bag[values] > 0, f"{kind} of a row that is not there: {r}"
                bag[values] -= 1
                if bag[values] == 0:
                    del bag[values]
            else:
                bag[values] += 1
    return Counter(rows.values()) if keyed else bag


def source(db: PgDatabase, table: str, columns: list[str]) -> Counter:
    return Counter(tuple(r) for r in db.query(f"SELECT {', '.join(columns)} FROM {table}"))


KEYED_COLUMNS = ["id", "v", "n", "big"]


def create_keyed(db: PgDatabase, name: str, rows: int, *, partitioned: bool = False) -> None:
    if partitioned:
        db.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text, n int, big text) PARTITION BY RANGE (id)")
        db.execute(f"CREATE TABLE {name}_low PARTITION OF {name} FOR VALUES FROM (MINVALUE) TO (1500000)")
        # a partition whose physical column order differs from the root's
        db.execute(f"CREATE TABLE {name}_high (big text, n int, v text, id bigint NOT NULL)")
        db.execute(f"ALTER TABLE {name} ATTACH PARTITION {name}_high FOR VALUES FROM (1500000) TO (MAXVALUE)")
    else:
        db.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text, n int, big text)")
        db.execute(f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL")
    db.execute(f"INSERT INTO {name} SELECT g, 'row ' || g, g % 1000, CASE WHEN g % 50 = 0 THEN repeat('B', 5000) "
               f"END FROM generate_series(1, {rows}) g")


def worker_in_thread(db: PgDatabase, impl: Any, out: Path, **settings: Any
                     ) -> tuple[IngestWorker, threading.Thread, list[Any]]:
    """An ingest worker of publication `pub` on a new slot `<db>_s` into `out` (no progress line, idle exit after
    2 s), with `settings` and the decoder `impl`; its thread (not started) and the list its result goes to."""
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), publication=["pub"], create_slot=True,
                          idle_exit=2.0, progress=False, impl="c" if impl.__name__.endswith("_decoder") else "python",
                          **settings)
    worker = IngestWorker(config)
    result: list[Any] = []
    return worker, threading.Thread(target=lambda: result.append(worker.run()), daemon=True), result


def run_worker(config: IngestConfig, *, writers: Writers, settle: float = 1.0) -> IngestWorker:
    """Run the worker in a thread while `writers` run; stop the writers once the snapshot is staged (plus
    `settle` seconds of streaming), then let the worker stream until it is idle."""
    worker = IngestWorker(config)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (worker.writer is not None and worker.writer.state.snapshots):
        assert thread.is_alive() or worker.writer is not None, "the worker ended before the snapshot"
        if not thread.is_alive():
            break
        assert time.monotonic() < deadline, "no snapshot staged in time"
        time.sleep(0.05)
    time.sleep(settle)
    writers.stop()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the worker did not stop"
    assert result == [0]
    return worker


# ------------------------------------------------------------------------------------------------------------------
# pgoutput

def test_snapshot_then_stream_equals_source_with_writers_running(pg_db, tmp_path, impl):
    db = pg_db
    create_keyed(db, "items", 30000)
    db.execute("CREATE TABLE bag (a int, b text)")          # no primary key
    db.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
    db.execute("INSERT INTO bag SELECT g % 50, 'x' FROM generate_series(1, 2000) g")
    db.execute("CREATE TABLE empty_one (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    out = tmp_path / "staging"
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), publication=["pub"], create_slot=True,
                          idle_exit=2.0, flush_seconds=0.2, progress=False,
                          impl="c" if impl.__name__.endswith("_decoder") else "python")
    # pg_class estimates for the progress figures, kept as ANALYZE leaves them (autovacuum would re-estimate
    # the tables the writers change while the snapshot is taken)
    for table in ("items", "bag", "empty_one"):
        db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    db.execute("ANALYZE")
    with Writers(db.dsn, ["items"], ["bag"]) as writers:
        time.sleep(0.3)
        worker = run_worker(config, writers=writers)
    assert writers.ops > 50
    state = StagingState.load(out)
    (snap,) = state.snapshots
    assert snap["kind"] == "initial" and snap["commit"] == 1
    assert state.entries[0]["committed_lsn"] == snap["consistent_point"]
    assert set(snap["tables"]) == {"public.items", "public.bag", "public.empty_one"}
    # snapshot rows: insert, consistent point, null xid, numbered from SNAPSHOT_SEQ_BASE, all before any change
    rows = staged_rows(out, "public.items")
    snap_rows = [r for r in rows if r["_xid"] is None]
    assert len(snap_rows) == snap["tables"]["public.items"] > 0
    assert all(r["_change_type"] == "insert" and r["_commit_lsn"] == snap["consistent_point"] for r in snap_rows)
    assert sorted(r["_seq"] for r in snap_rows) == list(range(SNAPSHOT_SEQ_BASE, SNAPSHOT_SEQ_BASE + len(snap_rows)))
    assert rows[:len(snap_rows)] == snap_rows
    assert all(r["_commit_lsn"] >= snap["consistent_point"] for r in rows[len(snap_rows):])
    assert len(rows) > len(snap_rows), "no change was streamed after the snapshot"
    assert replay(out, ["public.items"], KEYED_COLUMNS) == source(db, "items", KEYED_COLUMNS)
    assert replay(out, ["public.bag"], ["a", "b"]) == source(db, "bag", ["a", "b"])
    # the snapshot's relation and Arrow types are the stream's: one schema version holds both
    assert [sv.schema_version for sv in state.schemas["public.items"]] == [1]
    confirmed = db.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                         (config.slot,))[0][0]
    assert int(confirmed) >= state.committed_lsn
    metrics = dict(line.rsplit(" ", 1) for line in worker.metrics.render().splitlines()
                   if line.startswith("spockwire_snapshot"))
    assert int(metrics["spockwire_snapshot_rows_total"]) == sum(snap["tables"].values())
    assert metrics["spockwire_snapshot_tables_done"] == metrics["spockwire_snapshot_tables_total"] == "3"
    assert int(metrics["spockwire_snapshot_rows_estimated"]) == 32000      # 30000 + 2000 + 0 after ANALYZE


@pytest.mark.parametrize("via_root", [True, False], ids=["via_root", "leaves"])
def test_partitioned_tables_with_and_without_publish_via_partition_root(pg_db, tmp_path, via_root):
    db = pg_db
    create_keyed(db, "parted", 20000, partitioned=True)
    db.execute("INSERT INTO parted SELECT g, 'high ' || g, 1, NULL FROM generate_series(1500001, 1510000) g")
    db.execute(f"CREATE PUBLICATION pub FOR TABLE parted WITH (publish_via_partition_root = {str(via_root).lower()})")
    out = tmp_path / "staging"
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), publication=["pub"], create_slot=True,
                          idle_exit=2.0, flush_seconds=0.2, progress=False)
    with Writers(db.dsn, ["parted"], key_space=1_000_000, threads=1) as writers:
        time.sleep(0.2)
        run_worker(config, writers=writers)
    (snap,) = StagingState.load(out).snapshots
    tables = ["public.parted"] if via_root else ["public.parted_low", "public.parted_high"]
    assert sorted(snap["tables"]) == sorted(tables)
    assert sorted(StagingState.load(out).tables) == sorted(tables)
    assert replay(out, tables, KEYED_COLUMNS) == source(db, "parted", KEYED_COLUMNS)


def test_publication_row_filter_and_column_list(pg_db, tmp_path):
    """A publication with a column list and a row filter (PostgreSQL 15): the snapshot reads only the published
    columns of the rows the filter passes, as the stream sends them (an update moving a row across the filter
    arrives as an insert or a delete)."""
    db = pg_db
    create_keyed(db, "items", 20000)
    db.execute("CREATE PUBLICATION pub FOR TABLE items (id, v, n) WHERE (id % 2 = 0)")
    out = tmp_path / "staging"
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), publication=["pub"], create_slot=True,
                          idle_exit=2.0, flush_seconds=0.2, progress=False)
    with Writers(db.dsn, ["items"]) as writers:
        time.sleep(0.2)
        run_worker(config, writers=writers)
    state = StagingState.load(out)
    assert [c[0] for c in state.schemas["public.items"][0].columns] == ["id", "v", "n"]
    assert [sv.schema_version for sv in state.schemas["public.items"]] == [1]
    columns = ["id", "v", "n"]
    expected = Counter(tuple(r) for r in db.query("SELECT id, v, n FROM items WHERE id % 2 = 0"))
    assert replay(out, ["public.items"], columns) == expected


# ------------------------------------------------------------------------------------------------------------------
# pglogical (PostgreSQL 15) and spock (the Spock cluster, PostgreSQL 18)

def test_pglogical_snapshot_then_stream_equals_source(pg_db, tmp_path, impl):
    db = pg_db
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (db.dsn,))
    create_keyed(db, "items", 20000)
    db.execute("CREATE TABLE other (id bigint PRIMARY KEY, v text, n int, big text)")
    db.execute("INSERT INTO other SELECT g, 'o', g, NULL FROM generate_series(1, 500) g")
    db.execute("CREATE TABLE not_replicated (id int PRIMARY KEY)")
    db.execute("INSERT INTO not_replicated VALUES (1)")
    db.execute("SELECT pglogical.replication_set_add_table('default', 'items')")
    db.execute("SELECT pglogical.replication_set_add_table('default', 'other')")
    out = tmp_path / "staging"
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), plugin="pglogical", create_slot=True,
                          idle_exit=2.0, flush_seconds=0.2, progress=False,
                          impl="c" if impl.__name__.endswith("_decoder") else "python")
    with Writers(db.dsn, ["items", "other"]) as writers:
        time.sleep(0.3)
        run_worker(config, writers=writers)
    state = StagingState.load(out)
    (snap,) = state.snapshots
    assert sorted(snap["tables"]) == ["public.items", "public.other"]
    assert [sv.schema_version for sv in state.schemas["public.items"]] == [1]
    for table in ("items", "other"):
        assert replay(out, [f"public.{table}"], KEYED_COLUMNS) == source(db, table, KEYED_COLUMNS)


@pytest.fixture
def spock_db(spock_cluster) -> Iterator[PgDatabase]:
    db = PgDatabase(spock_cluster, spock_cluster.create_database(spock_cluster.new_database_name("spsnap")))
    db.execute("CREATE EXTENSION spock")
    db.execute("SELECT spock.node_create(node_name := 'n1', dsn := %s)", (db.dsn,))
    yield db
    if spock_cluster.running:
        drop_inactive_slots(db)


def test_spock_snapshot_then_stream_equals_source(spock_db, tmp_path, impl):
    db = spock_db
    create_keyed(db, "items", 20000)
    db.execute("SELECT spock.repset_add_table('default', 'items')")
    out = tmp_path / "staging"
    config = IngestConfig(dsn=db.dsn, slot=f"{db.name}_s", out=str(out), plugin="spock", create_slot=True,
                          idle_exit=2.0, flush_seconds=0.2, progress=False,
                          impl="c" if impl.__name__.endswith("_decoder") else "python")
    with Writers(db.dsn, ["items"]) as writers:
        time.sleep(0.3)
        run_worker(config, writers=writers)
    (snap,) = StagingState.load(out).snapshots
    assert list(snap["tables"]) == ["public.items"]
    assert replay(out, ["public.items"], KEYED_COLUMNS) == source(db, "items", KEYED_COLUMNS)


# ------------------------------------------------------------------------------------------------------------------
# kill -9 during the snapshot

def _ingest_cmd(dsn: str, slot: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spockwire", "ingest", "--dsn", dsn, "--slot", slot, "--publication", "pub",
            "--out", str(out), "--create-slot", "--flush-seconds", "0.2", "--log-format", "json", *extra]


def _events(stderr: str) -> list[str]:
    """The "event" names of the worker's JSON log records (--log-format json)."""
    names = []
    for line in stderr.splitlines():
        try:
            msg = json.loads(line)["msg"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(msg, dict) and "event" in msg:
            names.append(msg["event"])
    return names


@pytest.mark.parametrize("impl_name", ["c", "python"])
def test_kill9_during_the_snapshot_then_restart_equals_source(pg_db, tmp_path, impl_name):
    """The worker is killed while it reads the snapshot: after the first table's file is written, while it reads
    the second (a larger table), before the commit that publishes them. Nothing of the snapshot is visible; the
    restart drops the slot, creates it again with a new snapshot, and the result equals the source."""
    db = pg_db
    create_keyed(db, "first", 20000)
    create_keyed(db, "second", 150000)
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    out = tmp_path / "staging"
    slot = f"{db.name}_s"
    with Writers(db.dsn, ["first"]):
        proc = subprocess.Popen(_ingest_cmd(db.dsn, slot, out, "--impl", impl_name, "--idle-exit", "60"),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not list(out.glob("public.first/v*/part-*.parquet")):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no snapshot file written in time"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        state = StagingState.load(out)
        assert state.commit == 0 and not state.snapshots, "a snapshot became visible before it was complete"
        assert (out / "_spockwire" / "snapshot-pending.json").exists()
        first_point = db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,))
        assert first_point, "the slot of the interrupted snapshot exists"
        done = subprocess.Popen(_ingest_cmd(db.dsn, slot, out, "--impl", impl_name, "--idle-exit", "2",
                                            "--progress", "--snapshot-workers", "2"), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not StagingState.load(out).snapshots:
            assert done.poll() is None, done.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err.decode()[-3000:]
    assert "snapshot_discarded" in _events(err.decode())
    # the progress line's last snapshot figures: every table read, the rows counted against pg_class estimates
    final = [line for line in err.decode().splitlines() if line.startswith("spockwire snapshot: ")][-1]
    assert ", 2/2 tables, " in final, final
    state = StagingState.open(out)
    (snap,) = state.snapshots
    assert snap["consistent_point_text"] != first_point[0][0]
    assert not (out / "_spockwire" / "snapshot-pending.json").exists()
    named = state.named_paths()
    on_disk = {p.relative_to(out).as_posix() for p in out.glob("public.*/v*/*.parquet")}
    assert on_disk == named, "the interrupted snapshot's files were removed"
    for table in ("first", "second"):
        assert replay(out, [f"public.{table}"], KEYED_COLUMNS) == source(db, table, KEYED_COLUMNS)


# ------------------------------------------------------------------------------------------------------------------
# tables added to the publication while the worker streams

def test_tables_added_to_the_publication_while_ingest_runs(pg_db, tmp_path, impl):
    """`late` is added to the publication while writers change it (its first streamed change starts its
    snapshot); `idle` is added without any change (the periodic check of the publication finds it); `quiet` is
    added later and requested with `spockwire snapshot --staging OUT --table public.quiet --wait`. These have a
    primary key: they are read in chunks while the stream goes on (tests/test_snapshot_chunked.py). `bare` has no
    key (REPLICA IDENTITY FULL): it is read whole under a temporary slot's exported snapshot, its rows staged at
    that slot's consistent point. All end equal to the source, as does the table replicated from the start."""
    from spockwire.ingest.replay import replay_table

    db = pg_db
    create_keyed(db, "items", 10000)
    create_keyed(db, "late", 20000)
    create_keyed(db, "idle", 1000)
    create_keyed(db, "quiet", 3000)
    db.execute("CREATE TABLE bare (a int, b text)")
    db.execute("ALTER TABLE bare REPLICA IDENTITY FULL")
    db.execute("INSERT INTO bare SELECT g % 50, 'b' || g FROM generate_series(1, 5000) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    out = tmp_path / "staging"
    worker, thread, result = worker_in_thread(db, impl, out, flush_seconds=0.2, snapshot_check_interval=1.0,
                                              snapshot_chunk_rows=8000)

    def records() -> dict[str, list[dict]]:
        found: dict[str, list[dict]] = {}
        for r in worker.writer.state.snapshots:
            for t in r["tables"]:
                found.setdefault(t, []).append(r)
        return found

    def finished() -> set[str]:
        return {t for t, rs in records().items() if rs[-1]["kind"] != "chunk" or rs[-1]["done"]}

    with RowWriters(db.dsn, ["items", "late"], keyless=["bare"], threads=2, key_space=1_000_000):
        thread.start()
        _wait(lambda: worker.writer is not None and len(worker.writer.state.snapshots) == 1, thread)
        time.sleep(0.5)
        db.execute("ALTER PUBLICATION pub ADD TABLE late, idle, bare")
        _wait(lambda: {"public.late", "public.idle", "public.bare"} <= finished(), thread)
        # from here on only the request finds `quiet`: once a poll that started after this change has ended, no
        # check of the publication that began earlier is still running
        worker.incremental.check_interval = 0
        polls = [0]
        first_poll = worker.incremental.poll

        def counted_poll() -> None:
            first_poll()
            polls[0] += 1

        worker.incremental.poll = counted_poll
        _wait(lambda: polls[0] >= 1, thread)
        db.execute("ALTER PUBLICATION pub ADD TABLE quiet")
        asked = subprocess.run([sys.executable, "-m", "spockwire", "snapshot", "--staging", str(out), "--table",
                                "public.quiet", "--wait", "--timeout", "120"], cwd=ROOT, capture_output=True,
                               text=True, timeout=180)
        assert asked.returncode == 0, asked.stderr
        assert "public.quiet: 3,000 rows staged as snapshot rows" in asked.stdout
        time.sleep(1.0)
    thread.join(timeout=300)
    assert result == [0]
    found = records()
    initial = found["public.items"][0]
    assert initial["kind"] == "initial"
    for table in ("late", "idle", "quiet"):
        chunks = found[f"public.{table}"]
        assert {r["kind"] for r in chunks} == {"chunk"} and chunks[-1]["done"]
        assert all(r["consistent_point"] > initial["consistent_point"] for r in chunks)
    assert [r["chunk_kind"] for r in found["public.idle"]] == ["range"]
    assert found["public.idle"][0]["tables"]["public.idle"] == 1000
    assert len([r for r in found["public.late"] if r["chunk_kind"] == "range"]) >= 3
    (bare,) = found["public.bare"]
    assert bare["kind"] == "incremental" and bare["consistent_point"] > initial["consistent_point"]
    rows = staged_rows(out, "public.bare")
    assert all(r["_commit_lsn"] >= bare["consistent_point"] for r in rows)
    assert any(r["_xid"] is not None for r in rows), "no change of the keyless table was streamed after its snapshot"
    assert replay(out, ["public.bare"], ["a", "b"]) == source(db, "bare", ["a", "b"])
    assert replay(out, ["public.items"], KEYED_COLUMNS) == source(db, "items", KEYED_COLUMNS)
    # the tables read in chunks: changes of keys whose chunk was not read yet are staged too (applied as upserts)
    for table in ("late", "idle", "quiet"):
        staged = replay_table(out, f"public.{table}", ["id"])
        assert Counter(tuple(row[c] for c in KEYED_COLUMNS) for row in staged.values()) == \
            source(db, table, KEYED_COLUMNS)
    assert not db.query("SELECT 1 FROM pg_replication_slots WHERE slot_name LIKE %s", (f"{worker.config.slot}_snap%",))


def _wait(condition: Any, thread: threading.Thread, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert thread.is_alive(), "the worker ended early"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------------------------------
# the library flow: create the slot with a snapshot, read it, then stream

def test_library_create_slot_read_snapshot_then_stream(pg_db, tmp_path, impl):
    """What an embedding application does without the ingest worker: snapshot rows as ChangeBatch events from
    `iter_snapshot_changes`, then `spockwire.connect` from the consistent point; both go into a StagingWriter,
    and the replay equals the source."""
    import spockwire
    from spockwire.ingest import StagingWriter
    from spockwire.snapshot.initial import create_slot_with_snapshot, iter_snapshot_changes

    db = pg_db
    create_keyed(db, "items", 20000)
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    out = tmp_path / "staging"
    slot = f"{db.name}_s"
    with StagingWriter(out, "pgoutput") as writer:
        with Writers(db.dsn, ["items"]):
            time.sleep(0.2)
            with create_slot_with_snapshot(db.dsn, slot, "pgoutput") as exported:
                assert exported.open
                batches = list(iter_snapshot_changes(db.dsn, exported, publication="pub"))
            assert not exported.open
            time.sleep(0.5)
        assert {b.relation.qualified_name for b in batches} == {"public.items"}
        assert all(r["_xid"] is None for b in batches for r in b.to_arrow().select(["_xid"]).to_pylist())
        writer.add_all(batches)
        writer.commit(exported.consistent_point)
        with spockwire.connect(db.dsn, slot=slot, publication="pub", start_lsn=exported.consistent_point,
                               decoder_factory=lambda protocol: impl.Decoder(protocol)) as stream:
            for event in stream.events(idle_timeout=2.0):
                writer.add(event)
            writer.commit(stream.delivered_lsn)
    assert replay(out, ["public.items"], KEYED_COLUMNS) == source(db, "items", KEYED_COLUMNS)


# ------------------------------------------------------------------------------------------------------------------
# spockwire snapshot: one-off reads

def test_snapshot_command_one_off_reads_to_parquet_and_arrow(pg_db, tmp_path):
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    db = pg_db
    create_keyed(db, "items", 5000)
    create_keyed(db, "parted", 3000, partitioned=True)
    expected = source(db, "items", KEYED_COLUMNS)
    one = subprocess.run([sys.executable, "-m", "spockwire", "snapshot", "--dsn", db.dsn, "--table", "public.items",
                          "--out", str(tmp_path / "items.parquet"), "--workers", "2"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    assert "public.items: 5,000 rows" in one.stdout
    table = pq.read_table(tmp_path / "items.parquet")
    assert Counter(tuple(r[c] for c in KEYED_COLUMNS) for r in table.to_pylist()) == expected
    both = subprocess.run([sys.executable, "-m", "spockwire", "snapshot", "--dsn", db.dsn, "--table",
                           "public.items,public.parted", "--out", str(tmp_path / "both")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 0, both.stderr
    parted = pq.read_table(tmp_path / "both" / "public.parted.parquet")
    assert Counter(tuple(r[c] for c in KEYED_COLUMNS) for r in parted.to_pylist()) == source(db, "parted",
                                                                                             KEYED_COLUMNS)
    arrow = subprocess.run([sys.executable, "-m", "spockwire", "snapshot", "--dsn", db.dsn, "--table",
                            "public.items", "--out", str(tmp_path / "items.arrow")], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert arrow.returncode == 0, arrow.stderr
    assert feather.read_table(tmp_path / "items.arrow").equals(table)
    missing = subprocess.run([sys.executable, "-m", "spockwire", "snapshot", "--staging", str(tmp_path / "none"),
                              "--table", "public.items"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "is not a staging folder" in missing.stderr
