"""Sustained ingest: a slot streamed into the Parquet staging layout, beside the server's own decode rate.

    python -m pytest benchmarks/bench_ingest.py -o python_files='bench_*.py'

Workload: 500,000 rows (500 transactions × 1,000) into a 7-column table (bigint, int, numeric(12,2), timestamptz,
text, jsonb, uuid). `server_decode` counts pg_logical_slot_peek_binary_changes on the server; `ingest` runs the
ingest worker (C decoder, zstd Parquet, fsync before every acknowledgement) from the same slot until it is idle.
extra_info carries rows/s, Parquet MB/s and the ratio to the server's decode rate.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import tempfile
import time

import pytest

from spockwire.connection import create_publication, create_slot
from spockwire.ingest.staging import StagingState, read_log
from spockwire.ingest.worker import IngestConfig, IngestWorker
from spockwire.testing import PostgresCluster

ROWS = int(os.environ.get("SPOCKWIRE_BENCH_INGEST_ROWS", "500000"))
PER_TXN = 1000
RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def slot_with_workload():
    with PostgresCluster({"logical_decoding_work_mem": "256MB"}) as pg:
        db = pg.create_database("ingestbench")
        pg.execute("CREATE TABLE orders (id bigint PRIMARY KEY, qty int, price numeric(12,2), at timestamptz, "
                   "note text, attrs jsonb, ref uuid)", dbname=db)
        dsn = pg.dsn(dbname=db)
        create_publication(dsn, "pub")
        for name in ("bench", "bench_replication", "bench_sql"):
            create_slot(dsn, name, "pgoutput")
        conn = pg.connect(db)
        conn.autocommit = True
        with conn.cursor() as cur:
            for lo in range(0, ROWS, PER_TXN):
                cur.execute("INSERT INTO orders SELECT g, g %% 100, (g * 0.37)::numeric(12,2), now(), "
                            "'order note ' || g, jsonb_build_object('k', g, 'tags', jsonb_build_array('a', 'b')), "
                            "md5(g::text)::uuid FROM generate_series(%s, %s) g", (lo, lo + PER_TXN - 1))
        conn.close()
        yield pg, dsn, db


def test_server_decode(benchmark, slot_with_workload):
    pg, dsn, db = slot_with_workload
    benchmark.group = f"ingest {ROWS:,} rows"

    def count():
        return pg.query("SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, "
                        "'proto_version', '1', 'publication_names', 'pub')", dbname=db)[0][0]

    messages = benchmark.pedantic(count, rounds=1, iterations=1)
    RESULTS["server"] = ROWS / benchmark.stats.stats.min
    benchmark.extra_info.update(rows=ROWS, label="server decode (SQL interface, counted on the server)",
                                messages=int(messages))


@pytest.mark.parametrize("transport", ["replication", "sql"])
def test_ingest_worker(benchmark, slot_with_workload, transport):
    pg, dsn, db = slot_with_workload
    benchmark.group = f"ingest {ROWS:,} rows"
    out = tempfile.mkdtemp(prefix="spockwire-bench-ingest-")
    started = {}

    def ingest():
        shutil.rmtree(out, ignore_errors=True)
        worker = IngestWorker(IngestConfig(dsn=dsn, slot=f"bench_{transport}", out=out, publication=["pub"], idle_exit=5.0,
                                           flush_seconds=2.0, progress=False, transport=transport))
        started["t"] = time.time()
        worker.run()
        return worker

    worker = benchmark.pedantic(ingest, rounds=1, iterations=1)
    # timed to the last staging commit that wrote files, not the idle wait (the idle window is long: the server
    # may pause for seconds while it decodes a backlog, and the SQL transport's first call sends nothing until it
    # has decoded it all)
    state = StagingState.load(out)
    last_files = max(_dt.datetime.fromisoformat(e["created_at"]).timestamp() for e in read_log(out) if e["files"])
    busy = last_files - started["t"]
    rows = sum(f.rows for fs in state.files.values() for f in fs)
    parquet = sum(f.bytes for fs in state.files.values() for f in fs)
    assert rows == ROWS
    extra = dict(rows=ROWS, label=f"spockwire ingest over {transport} (stream + decode + Parquet + fsync + ack)",
                 rows_per_s=ROWS / busy, parquet_mb_per_s=parquet / busy / 1e6, parquet_bytes=parquet)
    if "server" in RESULTS:
        extra["ratio_to_server_decode"] = (ROWS / busy) / RESULTS["server"]
    benchmark.extra_info.update(extra)
    shutil.rmtree(out, ignore_errors=True)
