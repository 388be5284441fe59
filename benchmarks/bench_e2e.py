"""End-to-end from one live slot: the measurements of bench_connection.py plus psycopg2 with a no-op callback.

bench_connection.py measures, on one slot of 1,000 transactions x 1,000 rows, the server's own decode rate
(``pg_logical_slot_peek_binary_changes`` counted on the server), spockwire's streams (Cython and pure-Python batch
pump) and psycopg2 feeding spockwire one message per callback. This module runs those same tests on the same slot
(they are imported, so pytest collects them here with this module's one cluster) and adds the floor of any
psycopg2-based consumer: ``consume_stream`` with a callback that only counts the messages.

    python -m pytest benchmarks/bench_e2e.py -o python_files='bench_*.py'

scripts/bench.sh runs this module instead of bench_connection.py, so the streams are not measured twice.
``extra_info`` (set by bench_connection's helper) holds rows/s, messages/s, the client's CPU use in cores
(user + sys seconds per wall second) and the ratio to the server's decode rate.
"""
from __future__ import annotations

import time

# pytest runs a module's tests in the order their names enter it: the server's decode rate first, as the
# streams' ratio_to_server_decode needs it
from benchmarks.bench_connection import test_server_decode  # noqa: F401, I001
from benchmarks.bench_connection import test_pg_recvlogical, test_pgoutput_decoder  # noqa: F401, I001
from benchmarks.bench_connection import test_stream, test_sql_transport, test_psycopg2_callback  # noqa: F401, I001
from benchmarks.bench_connection import ROWS, _cpu, _median, _record, workload  # noqa: F401, I001 - this module's slot


def test_psycopg2_noop_callback(benchmark, workload):  # noqa: F811 - the imported fixture
    import psycopg2
    import psycopg2.extras

    pg, dsn, _db, messages = workload

    def run():
        conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
        cur = conn.cursor()
        cur.start_replication(slot_name="bench", decode=False,
                              options={"proto_version": "1", "publication_names": "pub"})
        seen = [0]

        def consume(msg):
            seen[0] += 1
            if seen[0] >= messages:
                raise psycopg2.extras.StopReplication()

        c0, t0 = _cpu(), time.perf_counter()
        try:
            cur.consume_stream(consume)
        except psycopg2.extras.StopReplication:
            pass
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        conn.close()  # nothing acknowledged: the next round streams the same changes again
        return seen[0], wall, cpu

    n, wall, cpu = _median(benchmark, run)
    assert n == messages
    _record(benchmark, "psycopg2_noop_callback", ROWS, n, wall, cpu, pg)
