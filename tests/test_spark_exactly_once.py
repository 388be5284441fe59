"""Exactly-once under kill -9 of the Spark driver: the pipeline (`python -m spockwire.spark.job`: the spockwire
source starting with the initial snapshot, one slot, foreachBatch + apply_changes into an SCD 1 and an SCD 2
Delta table per source table) runs as a child process in a process group of its own, while writers keep changing
the source tables. The group (the Python driver and its JVM) is killed with SIGKILL at random moments -- during the
snapshot, which then starts over, and during streaming; some right after a micro-batch reached the Delta tables,
before Spark's checkpoint records it -- every process of the driver must be gone, and the same command is started
again from the checkpoint. At the end every SCD 1 table, and the current rows of every SCD 2 table, must equal the
source table exactly (the oracle is the source tables, read with psycopg2). `events` has no key (REPLICA IDENTITY
FULL, equal rows): a replayed micro-batch must add none of its inserts twice, and it must equal its source as a
bag of rows."""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.delta_check import checked_table

pytestmark = [pytest.mark.pg, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
KILLS = 10
SNAPSHOT_KILLS = 3       # the first kills land during the snapshot (which starts over each time)
TABLES = {"public.orders": ("id",), "public.accounts": ("id",), "public.events": ()}
DDL = """
CREATE TABLE orders (id int PRIMARY KEY, qty int, price numeric(12,2), note text, tags text[], placed timestamptz);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text, balance numeric(14,2), opened date);
CREATE TABLE events (kind text, n int, at date);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE orders, accounts, events;
"""


def _writer(db, rng: random.Random, stop: threading.Event, counter: list[int]) -> None:
    """Small transactions on both tables until `stop`: inserts (some TOASTed), updates (some leaving the TOASTed
    note unchanged), NULLs, key changes, deletes, and now and then a larger transaction."""
    conn = db.connect(autocommit=False)
    try:
        cur = conn.cursor()
        next_id = 100_000
        while not stop.is_set():
            for _ in range(rng.randint(1, 5)):
                op = rng.random()
                oid = rng.randint(1, next_id)
                if op < 0.35:
                    note = "x" * 3000 + str(next_id) if rng.random() < 0.3 else f"n{next_id}"
                    cur.execute("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, now()) ON CONFLICT (id) DO NOTHING",
                                (next_id, rng.randint(0, 100), decimal.Decimal(rng.randint(0, 10**6)) / 100, note,
                                 ["a", None] if rng.random() < 0.5 else []))
                    next_id += 1
                elif op < 0.6:
                    cur.execute("UPDATE orders SET qty = qty + 1, price = CASE WHEN qty %% 3 = 0 THEN NULL "
                                "ELSE price END WHERE id = %s", (oid,))
                elif op < 0.65:
                    cur.execute("UPDATE orders SET note = repeat('y', 2500) || %s WHERE id = %s",
                                (str(rng.random()), oid))
                elif op < 0.7:
                    cur.execute("UPDATE orders SET id = id + 1000000 WHERE id = %s AND id < 1000000", (oid,))
                elif op < 0.8:
                    cur.execute("DELETE FROM orders WHERE id = %s", (oid,))
                elif op < 0.84:       # a table without a key: equal rows, one of them changed or deleted
                    cur.execute("INSERT INTO events VALUES ('e', %s, DATE '2024-01-01'), ('e', %s, NULL)",
                                (oid % 7, oid % 7))
                elif op < 0.87:
                    cur.execute("UPDATE events SET n = n + 1 WHERE ctid = (SELECT min(ctid) FROM events WHERE n = %s)",
                                (oid % 7,))
                elif op < 0.89:
                    cur.execute("DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE n = %s)",
                                (oid % 7,))
                elif op < 0.95:
                    cur.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                                (rng.randint(-500, 500), rng.randint(1, 3000)))
                else:
                    cur.execute("INSERT INTO accounts SELECT g, 'late', 0, current_date FROM generate_series(%s, %s) g"
                                " ON CONFLICT (id) DO UPDATE SET owner = 'again'", (next_id, next_id + 50))
            conn.commit()
            counter[0] += 1
            time.sleep(rng.uniform(0.02, 0.08))
    finally:
        conn.close()


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process (zombies included)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry)] = (int(fields[1]), int(fields[2]), fields[0])
    return found


def _descendants(pid: int) -> set[int]:
    procs = _processes()
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _pgid, _state) in procs.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids: set[int], pgid: int) -> list[int]:
    """Of `pids` and the members of process group `pgid`, those still running (zombies excluded)."""
    return sorted(p for p, (_ppid, group, state) in _processes().items()
                  if (p in pids or group == pgid) and state != "Z")


class Job:
    """The pipeline as a child process in its own process group; its output lines are collected."""

    def __init__(self, db, work: Path, extra: list[str], history: bool = True, tables: dict | None = None) -> None:
        cmd = [sys.executable, "-m", "spockwire.spark.job", "--dsn", db.dsn, "--slot", f"{db.name}_s"[:63],
               "--publication", "pub", "--target", str(work / "delta"), "--checkpoint", str(work / "ck"),
               "--master", "local[1]", "--max-changes-per-batch", "400", "--starting-position", "snapshot",
               "--option", "snapshotChunkPages=4", "--option", "snapshotChunksPerBatch=1",
               "--optimize-every", "5"] + \
            (["--history"] if history else [])      # maintenance (state collection, Z-order) often: some kills land in it
        for table, keys in (TABLES if tables is None else tables).items():   # {}: the whole publication
            cmd += ["--table", f"{table}={','.join(keys)}" if keys else table]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.log = open(work / "job.log", "ab")
        self.proc = subprocess.Popen(cmd + extra, stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=ROOT,
                                     start_new_session=True)
        self.lines: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                self.lines.append(json.loads(raw))
            except ValueError:
                continue

    def wait_for(self, key: str, timeout: float, after: int = 0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(key in line for line in self.lines[after:]):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def kill_group(self) -> None:
        """SIGKILL to the driver's process group (the Python driver and its JVM); Spark's Python worker daemons
        (which put themselves in groups of their own) must follow their JVM by themselves."""
        family = _descendants(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while _alive(family, self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _alive(family, self.proc.pid)
        assert not left, f"processes of the killed driver still alive: {left}"
        self.reader.join(10)
        self.log.close()


def _norm(value):
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, list):
        return tuple(value)
    return value


def _source(db, table: str) -> dict:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            return {r[0]: tuple(_norm(v) for v in r) for r in cur.fetchall()}, names
    finally:
        conn.close()


def _delta(path: Path, names: list[str], current_only: bool = False) -> dict:
    rows = checked_table(path).to_pylist()
    if current_only:    # SCD 2: the open-ended versions
        rows = [r for r in rows if r["_end_commit_lsn"] is None]
    out = {r[names[0]]: tuple(_norm(r[n]) for n in names) for r in rows}
    assert len(out) == len(rows), "a key is in the Delta table twice"
    return out


def _source_bag(db, table: str) -> tuple[list, list[str]]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            return sorted((tuple(_norm(v) for v in r) for r in cur.fetchall()), key=repr), \
                [d[0] for d in cur.description]
    finally:
        conn.close()


def _delta_bag(path: Path, names: list[str], current_only: bool = False) -> list:
    rows = checked_table(path).to_pylist()
    if current_only:
        rows = [r for r in rows if r["_end_commit_lsn"] is None]
    return sorted((tuple(_norm(r[n]) for n in names) for r in rows), key=repr)


def assert_tables_equal(db, folder: Path, suffixes: tuple[str, ...]) -> None:
    """Every table of TABLES equals its source: the keyed ones row for row by key, the keyless one as a bag (a
    history table: its current rows)."""
    for table, keys in TABLES.items():
        for suffix in suffixes:
            path = folder / (table + suffix)
            if not keys:
                source, names = _source_bag(db, table)
                assert len(source) > 100 and _delta_bag(path, names, bool(suffix)) == source, table + suffix
                continue
            source, names = _source(db, table)
            delta = _delta(path, names, current_only=bool(suffix))
            assert len(delta) == len(source), table + suffix
            assert delta == source, (table + suffix, sorted(set(delta.items()) ^ set(source.items()))[:5])


@pytest.mark.timeout(1800)   # eleven Spark starts: a few minutes on a quiet machine, far more on a busy one
def test_kill_9_the_driver_at_random_moments_then_delta_equals_source(pg_db, tmp_path):
    rng = random.Random(int(os.environ.get("SPOCKWIRE_KILL_SEED", "14")))
    pg_db.execute(DDL)
    pg_db.execute("INSERT INTO orders SELECT g, g % 50, g * 1.5, CASE WHEN g % 10 = 0 THEN repeat('t', 3000) END, "
                  "ARRAY['i'], now() FROM generate_series(1, 3000) g")
    pg_db.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 2.25, DATE '2020-01-01' + g "
                  "FROM generate_series(1, 3000) g")
    pg_db.execute("INSERT INTO events SELECT 's', g % 7, NULL FROM generate_series(1, 200) g")
    stop = threading.Event()
    commits = [0]
    writer = threading.Thread(target=_writer, args=(pg_db, random.Random(rng.random()), stop, commits))
    writer.start()
    kills = []
    try:
        for i in range(KILLS):
            job = Job(pg_db, tmp_path, [])
            assert job.wait_for("started", 300), (tmp_path / "job.log").read_text()[-3000:]
            # every run applies at least one micro-batch before it dies, so the campaign moves on
            assert job.wait_for("batch", 300), (tmp_path / "job.log").read_text()[-3000:]
            if i < SNAPSHOT_KILLS:
                # (a restarted run first replays the interrupted batch of the dead snapshot as empty; the snapshot,
                # a dozen micro-batches of one small chunk each, is still being read when the kill comes)
                while not any(line.get("snapshot_rows") for line in job.lines):
                    assert not any(sum(line.get("rows", {}).values()) and not line["snapshot_rows"]
                                   for line in job.lines), ("the snapshot was complete before the kill", job.lines)
                    assert job.wait_for("batch", 300, after=len(job.lines)), (tmp_path / "job.log").read_text()[-3000:]
                time.sleep(rng.uniform(0.0, 1.5))
                moment = "during the snapshot"
            else:
                # streaming: once the snapshot is through (a batch of changes only)
                while not any(sum(line.get("rows", {}).values()) and not line["snapshot_rows"] for line in job.lines):
                    assert job.wait_for("batch", 300, after=len(job.lines)), (tmp_path / "job.log").read_text()[-3000:]
                if i % 2:
                    # right after the next micro-batch reached the Delta tables: before or while Spark records it
                    job.wait_for("batch", 60, after=len(job.lines))
                    time.sleep(rng.uniform(0.0, 0.2))
                    moment = "right after a batch was applied"
                else:
                    time.sleep(rng.uniform(0.0, 4.0))
                    moment = "at a random moment while streaming"
            job.kill_group()
            applied = [line for line in job.lines if "batch" in line]
            if moment == "during the snapshot":   # no batch of changes alone had come yet
                assert not any(sum(b["rows"].values()) and not b["snapshot_rows"] for b in applied), applied
            kills.append((moment, [(b["batch"], b["snapshot_rows"], sum(b["rows"].values())) for b in applied]))
    finally:
        stop.set()
        writer.join()
    # one last change, so the final run has something to commit after everything else
    pg_db.execute("UPDATE accounts SET owner = 'final' WHERE id = 1")
    # the backlog the killed runs left behind, in micro-batches without a size limit
    final = Job(pg_db, tmp_path, ["--until-caught-up", "--timeout", "900", "--max-changes-per-batch", "0"])
    assert final.proc.wait(1000) == 0, (tmp_path / "job.log").read_text()[-3000:]
    final.reader.join(10)
    assert any("caught_up" in line for line in final.lines)
    assert len(kills) == KILLS and sum(m == "during the snapshot" for m, _ in kills) == SNAPSHOT_KILLS, kills
    assert commits[0] > 100, commits
    assert_tables_equal(pg_db, tmp_path / "delta", ("", "_history"))
