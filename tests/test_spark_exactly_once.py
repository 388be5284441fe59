"""Exactly-once under kill -9 of the Spark driver: the pipeline (`python -m spockwire.spark.job`: the spockwire
source, one slot, foreachBatch + apply_changes into a Delta table per source table) runs as a child process in a
process group of its own, while writers keep changing the source tables; the whole group (the Python driver, its
JVM, Spark's Python workers) is killed with SIGKILL at random moments, some right after a micro-batch reached the
Delta tables (before Spark's checkpoint records it), and the same command is started again from the checkpoint.
At the end every Delta table must equal its source table exactly (the oracle is the source tables, read with
psycopg2)."""
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

pytestmark = [pytest.mark.pg, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
KILLS = 10
TABLES = {"public.orders": ("id",), "public.accounts": ("id",)}
DDL = """
CREATE TABLE orders (id int PRIMARY KEY, qty int, price numeric(12,2), note text, tags text[], placed timestamptz);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text, balance numeric(14,2), opened date);
CREATE PUBLICATION pub FOR TABLE orders, accounts;
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
                elif op < 0.95:
                    cur.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                                (rng.randint(-500, 500), rng.randint(1, 3000)))
                else:
                    cur.execute("INSERT INTO accounts SELECT g, 'late', 0, current_date FROM generate_series(%s, %s) g"
                                " ON CONFLICT (id) DO UPDATE SET owner = 'again'", (next_id, next_id + 300))
            conn.commit()
            counter[0] += 1
            time.sleep(rng.uniform(0.0, 0.03))
    finally:
        conn.close()


def _group_alive(pgid: int) -> list[int]:
    """Processes of the process group `pgid` still alive (zombies excluded)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


class Job:
    """The pipeline as a child process in its own process group; its output lines are collected."""

    def __init__(self, db, work: Path, extra: list[str]) -> None:
        cmd = [sys.executable, "-m", "spockwire.spark.job", "--dsn", db.dsn, "--slot", f"{db.name}_s"[:63],
               "--publication", "pub", "--target", str(work / "delta"), "--checkpoint", str(work / "ck"),
               "--master", "local[1]", "--max-changes-per-batch", "400"]
        for table, keys in TABLES.items():
            cmd += ["--table", f"{table}={','.join(keys)}"]
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
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 20
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _group_alive(self.proc.pid)
        assert not left, f"processes of the killed driver's group still alive: {left}"
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


def _delta(path: Path, names: list[str]) -> dict:
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    out = {r[names[0]]: tuple(_norm(r[n]) for n in names) for r in rows}
    assert len(out) == len(rows), "a key is in the Delta table twice"
    return out


def test_kill_9_the_driver_at_random_moments_then_delta_equals_source(pg_db, tmp_path):
    rng = random.Random(int(os.environ.get("SPOCKWIRE_KILL_SEED", "14")))
    pg_db.execute(DDL)
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{pg_db.name}_s"[:63],))
    pg_db.execute("INSERT INTO orders SELECT g, g % 50, g * 1.5, CASE WHEN g % 10 = 0 THEN repeat('t', 3000) END, "
                  "ARRAY['i'], now() FROM generate_series(1, 3000) g")
    pg_db.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 2.25, DATE '2020-01-01' + g "
                  "FROM generate_series(1, 3000) g")
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
            if i % 2:
                # right after the next micro-batch reached the Delta tables: before or while Spark records it
                job.wait_for("batch", 60, after=len(job.lines))
                time.sleep(rng.uniform(0.0, 0.2))
                moment = "right after a batch was applied"
            else:
                time.sleep(rng.uniform(0.0, 4.0))
                moment = "at a random moment"
            job.kill_group()
            kills.append((moment, sum("batch" in line for line in job.lines)))
    finally:
        stop.set()
        writer.join()
    # one last change, so the final run has something to commit after everything else
    pg_db.execute("UPDATE accounts SET owner = 'final' WHERE id = 1")
    final = Job(pg_db, tmp_path, ["--until-caught-up", "--timeout", "300"])
    assert final.proc.wait(400) == 0, (tmp_path / "job.log").read_text()[-3000:]
    final.reader.join(10)
    assert any("caught_up" in line for line in final.lines)
    assert len(kills) == KILLS and sum(b for _, b in kills) > 0, kills
    assert commits[0] > 100, commits
    for table in TABLES:
        source, names = _source(pg_db, table)
        delta = _delta(tmp_path / "delta" / table, names)
        assert len(delta) == len(source)
        assert delta == source, (table, sorted(set(delta.items()) ^ set(source.items()))[:5])
