"""End-to-end streaming throughput on a 1M-row workload, against the server's own decode rate for the same slot.

    python -m pytest benchmarks/bench_connection.py --benchmark-only

Measurements of the same 1,000 transactions x 1,000 rows (pgoutput proto 1, text):

* ``server_decode``: ``pg_logical_slot_peek_binary_changes`` counted on the server (the ceiling of both
  transports: the server cannot hand out changes faster than it decodes them);
* ``pump_c`` / ``pump_python``: ``spockwire.connection.connect`` (replication transport) with the Cython /
  pure-Python batch pump, rows decoded into Arrow batches;
* ``sql_c`` / ``sql_python``: the same with ``transport="sql"`` (binary COPY of the SQL functions' rows);
* ``psycopg2_callback``: psycopg2's ``consume_stream`` with one Python callback per message feeding the decoder;
* live peers on a fresh copy of the same slot per round: ``pg_recvlogical`` of the server's release (output to
  /dev/null) and ``pgoutput-decoder`` (Rust, PyPI) in its own Python >= 3.12 interpreter (out/peer312, made by
  ``scripts/setup-machine.sh --peer-venv``; SPOCKWIRE_BENCH_PEER_PYTHON points elsewhere). A missing peer fails.

Each runs on PostgreSQL 15 and 18 (SPOCKWIRE_BENCH_SERVERS=15,18). ``extra_info`` holds rows/s, messages/s, the
client's CPU use (user+sys seconds per wall second; a peer process's own) and the ratios to the server's decode
rate and to pg_recvlogical - all from the median round (the one statistic of BENCHMARKS.md). Set
SPOCKWIRE_BENCH_ROWS to change the workload size, SPOCKWIRE_BENCH_ROUNDS the number of rounds (default 3),
SPOCKWIRE_BENCH_SQL_BATCH the SQL transport's changes per call.
"""
from __future__ import annotations

import os
import resource
import time

import pytest

from spockwire.connection import connect, create_publication, create_slot
from spockwire.testing import PostgresCluster

ROWS = int(os.environ.get("SPOCKWIRE_BENCH_ROWS", "1000000"))
PER_TXN = 1000
ROUNDS = int(os.environ.get("SPOCKWIRE_BENCH_ROUNDS", "3"))
#: changes per call of the SQL transport (default: the library's). The backlog is split at its middle LSN and both
#: halves decoded side by side (`sql_split_bytes`), so one call per half overlaps the server's decoding of the
#: tail with the sending of the head.
SQL_BATCH = int(os.environ.get("SPOCKWIRE_BENCH_SQL_BATCH", "4000000"))
RESULTS: dict[str, float] = {}


def _median(benchmark, run):
    """Run `run` (returning a tuple whose wall time is at index 2 of 4, else 1) ROUNDS times; the median round
    (by wall time: the statistic of every table in BENCHMARKS.md)."""
    results = []

    def once():
        results.append(run())
        return results[-1]

    benchmark.pedantic(once, rounds=ROUNDS, iterations=1)
    ordered = sorted(results, key=lambda r: r[2] if len(r) == 4 else r[1])
    return ordered[(len(ordered) - 1) // 2]


SERVERS = [int(v) for v in os.environ.get("SPOCKWIRE_BENCH_SERVERS", "15,18").split(",") if v]


@pytest.fixture(scope="module", params=SERVERS, ids=lambda major: f"pg{major}")
def workload(request):
    with PostgresCluster({"logical_decoding_work_mem": "256MB"}, major=request.param) as pg:
        db = pg.create_database("bench")
        pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n bigint)", dbname=db)
        dsn = pg.dsn(dbname=db)
        create_publication(dsn, "pub")
        create_slot(dsn, "bench", "pgoutput")
        conn = pg.connect(db)
        with conn.cursor() as cur:
            for lo in range(0, ROWS, PER_TXN):
                cur.execute("INSERT INTO t SELECT g, 'value ' || g, g * 7 FROM generate_series(%s, %s) g",
                            (lo, lo + PER_TXN - 1))
        conn.close()
        messages = pg.scalar("SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, "
                             "'proto_version', '1', 'publication_names', 'pub')", dbname=db)
        pg.end_lsn = pg.scalar("SELECT pg_current_wal_lsn()::text", dbname=db)  # for pg_recvlogical --endpos
        pg.version_text = pg.scalar("SHOW server_version", dbname=db)
        yield pg, dsn, db, int(messages)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _record(benchmark, name: str, rows: int, messages: int, wall: float, cpu: float | None, pg=None) -> None:
    major = getattr(pg, "major", 0)
    RESULTS[(major, name)] = rows / wall
    info = {"rows": rows, "messages": messages, "rows_per_s": round(rows / wall), "messages_per_s":
            round(messages / wall), "seconds": round(wall, 3), "server_major": major}
    if pg is not None and getattr(pg, "version_text", None):
        info["server_version"] = pg.version_text
    if cpu is not None:
        info["client_cpu_cores"] = round(cpu / wall, 3)
    if (major, "server_decode") in RESULTS and name != "server_decode":
        info["ratio_to_server_decode"] = round(RESULTS[(major, name)] / RESULTS[(major, "server_decode")], 3)
    if (major, "pg_recvlogical") in RESULTS and name != "pg_recvlogical":
        info["ratio_to_pg_recvlogical"] = round(RESULTS[(major, name)] / RESULTS[(major, "pg_recvlogical")], 3)
    benchmark.extra_info.update(info)


def test_server_decode(benchmark, workload):
    pg, _dsn, db, messages = workload

    def run():
        t0 = time.perf_counter()
        n = pg.scalar("SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, "
                      "'proto_version', '1', 'publication_names', 'pub')", dbname=db)
        return n, time.perf_counter() - t0

    n, wall = _median(benchmark, run)
    _record(benchmark, "server_decode", ROWS, n, wall, None, pg)


def _stream_all(dsn: str, pump: str, transport: str = "replication") -> tuple[int, int, float, float]:
    stream = connect(dsn, slot="bench", publication="pub", proto_version=1, pump=pump, read_timeout=5.0,
                     transport=transport, sql_batch_changes=SQL_BATCH)
    try:
        rows = 0
        c0, t0 = _cpu(), time.perf_counter()
        while rows < ROWS:
            for ev in stream.read():
                ev.to_arrow()
                rows += ev.num_rows
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        return rows, stream.stats()["messages"], wall, cpu
    finally:
        stream.close()  # nothing acknowledged: the next round streams the same changes again


@pytest.mark.parametrize("pump", ["c", "python"])
def test_stream(benchmark, workload, pump):
    pg, dsn, _db, _messages = workload
    rows, messages, wall, cpu = _median(benchmark, lambda: _stream_all(dsn, pump))
    assert rows == ROWS
    _record(benchmark, f"pump_{pump}", rows, messages, wall, cpu, pg)


@pytest.mark.parametrize("pump", ["c", "python"])
def test_sql_transport(benchmark, workload, pump):
    pg, dsn, _db, _messages = workload
    rows, messages, wall, cpu = _median(benchmark, lambda: _stream_all(dsn, pump, "sql"))
    assert rows == ROWS
    _record(benchmark, f"sql_{pump}", rows, messages, wall, cpu, pg)


def test_psycopg2_callback(benchmark, workload):
    import psycopg2
    import psycopg2.extras

    from spockwire.wire import load_implementation

    pg, dsn, _db, messages = workload

    def run():
        conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
        cur = conn.cursor()
        cur.start_replication(slot_name="bench", decode=False,
                              options={"proto_version": "1", "publication_names": "pub"})
        dec = load_implementation().Decoder("pgoutput")
        state = {"rows": 0, "messages": 0}

        def consume(msg):
            dec.feed(msg.payload)
            state["messages"] += 1
            if state["messages"] % 10000 == 0:
                for ev in dec.drain():
                    ev.to_arrow()
                    state["rows"] += ev.num_rows
            if state["messages"] >= messages:
                raise psycopg2.extras.StopReplication()

        c0, t0 = _cpu(), time.perf_counter()
        try:
            cur.consume_stream(consume)
        except psycopg2.extras.StopReplication:
            pass
        for ev in dec.drain():
            state["rows"] += ev.num_rows
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        conn.close()
        return state["rows"], state["messages"], wall, cpu

    rows, n, wall, cpu = _median(benchmark, run)
    assert rows == ROWS
    _record(benchmark, "psycopg2_callback", rows, n, wall, cpu, pg)


# ---------------------------------------------------------------------------------------------------------------
# live peers on the same slot: pg_recvlogical (the server's own client) and pgoutput-decoder (Rust, PyPI)

#: the interpreter that has pgoutput-decoder (its wheel needs Python >= 3.12); scripts/setup-machine.sh makes it
PEER_PYTHON = os.environ.get("SPOCKWIRE_BENCH_PEER_PYTHON",
                             os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                          "out", "peer312", "bin", "python"))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _copy_slot(pg, db: str, name: str) -> str:
    """A fresh copy of the bench slot (same contents): pg_recvlogical confirms what it received when it stops, so
    each peer round reads a copy of its own."""
    pg.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{name}'",
               dbname=db)
    pg.execute(f"SELECT pg_copy_logical_replication_slot('bench', '{name}')", dbname=db)
    return name


def test_pg_recvlogical(benchmark, workload):
    """pg_recvlogical of the server's own release streams the slot to its end (nothing decoded, output to
    /dev/null; it confirms what it received when it stops, so each round reads a fresh copy of the slot)."""
    import shutil
    import subprocess

    pg, dsn, db, messages = workload
    exe = pg.bindir / "pg_recvlogical"
    if not exe.exists():
        found = shutil.which("pg_recvlogical")
        if found is None:
            pytest.fail(f"peer missing: pg_recvlogical (not in {pg.bindir} nor on PATH)")
        exe = found

    def run():
        slot = _copy_slot(pg, db, "bench_peer")
        c0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run([str(exe), "-d", dsn, "--slot", slot, "--start", "--no-loop", "-E", pg.end_lsn,
                               "-o", "proto_version=1", "-o", "publication_names=pub", "-f", "/dev/null",
                               "-F", "0", "-s", "100"], capture_output=True, text=True, timeout=600)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        assert proc.returncode == 0, proc.stderr
        return ROWS, messages, wall, cpu

    rows, n, wall, cpu = _median(benchmark, run)
    _record(benchmark, "pg_recvlogical", rows, n, wall, cpu, pg)


def test_pgoutput_decoder(benchmark, workload):
    """pgoutput-decoder's LogicalReplicationReader (Rust: replication connection and decoding into Python
    message objects with dicts of the row's values) in its own Python >= 3.12 process."""
    import json
    import subprocess

    pg, _dsn, db, messages = workload
    if not os.path.exists(PEER_PYTHON):
        pytest.fail(f"peer missing: no interpreter with pgoutput-decoder at {PEER_PYTHON} "
                    "(scripts/setup-machine.sh makes it; SPOCKWIRE_BENCH_PEER_PYTHON points elsewhere)")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "live_peer_pgoutput_decoder.py")

    def run():
        slot = _copy_slot(pg, db, "bench_peer")
        proc = subprocess.run([PEER_PYTHON, script, pg.host, str(pg.port), pg.user, db, slot, "pub", str(ROWS)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return out["rows"], messages, out["seconds"], out["cpu"]

    rows, n, wall, cpu = _median(benchmark, run)
    assert rows == ROWS
    _record(benchmark, "pgoutput_decoder", rows, n, wall, cpu, pg)
