"""Sustained ingest: a slot streamed into the Parquet staging layout, beside the stream it reads and the server's
own decode rate.

    python -m pytest benchmarks/bench_ingest.py -o python_files='bench_*.py'
    python -m benchmarks.bench_ingest [--rounds 5] [--json benchmarks/results/ingest_vs_stream.json]

Workload: 500,000 rows (500 transactions × 1,000) into a 7-column table (bigint, int, numeric(12,2), timestamptz,
text, jsonb, uuid) on a throwaway PostgreSQL 15, written once behind a template slot. Each round copies the
template slot twice (pg_copy_logical_replication_slot: the same start, the same changes) and runs, one right after
the other on the same transport:

* `stream`: ``connect()`` with typed Arrow batches (C decoder), every ChangeBatch's record batch taken, until the
  500,000th row is handed out;
* `ingest`: the ingest worker (C decoder, Parquet with the default compression, fsync before every
  acknowledgement) from its copy until it is idle, timed to the last staging commit that wrote files.

Both are timed from the start of the connection; the ratio ingest / stream is the median of the rounds' ratios
(each round's pair shares the machine's conditions), the rates are the medians of each side. `server_decode`
counts pg_logical_slot_peek_binary_changes on the server.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import pytest

from spockwire.connection import connect, create_publication, create_slot
from spockwire.ingest.staging import StagingState, read_log
from spockwire.ingest.worker import IngestConfig, IngestWorker
from spockwire.model import ChangeBatch
from spockwire.testing import PostgresCluster

ROWS = int(os.environ.get("SPOCKWIRE_BENCH_INGEST_ROWS", "500000"))
ROUNDS = int(os.environ.get("SPOCKWIRE_BENCH_INGEST_ROUNDS", "3"))
#: the worker's --flush-seconds: the last commit comes at most this long after the last row, and the ingest side is
#: timed to it (2 s, as before, would add up to 2 s of waiting to a run of a few seconds)
FLUSH_SECONDS = float(os.environ.get("SPOCKWIRE_BENCH_INGEST_FLUSH_SECONDS", "0.5"))
PER_TXN = 1000
TEMPLATE = "bench_template"
RESULTS: dict[str, float] = {}


class Workload:
    """The cluster, the written rows and the template slot in front of them."""

    def __init__(self, pg: PostgresCluster, dsn: str, db: str) -> None:
        self.pg, self.dsn, self.db = pg, dsn, db
        self._n = 0

    def copy_slot(self) -> str:
        self._n += 1
        name = f"bench_copy_{self._n}"
        self.pg.query("SELECT slot_name FROM pg_copy_logical_replication_slot(%s, %s)", (TEMPLATE, name),
                      dbname=self.db)
        return name

    def drop_slot(self, name: str) -> None:
        for _ in range(100):     # the walsender of a closed stream ends a moment later
            if self.pg.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND NOT active",
                             (name,), dbname=self.db)[0][0]:
                self.pg.execute("SELECT pg_drop_replication_slot(%s)", (name,), dbname=self.db)
                return
            time.sleep(0.1)


def start_workload(pg: PostgresCluster) -> Workload:
    db = pg.create_database("ingestbench")
    pg.execute("CREATE TABLE orders (id bigint PRIMARY KEY, qty int, price numeric(12,2), at timestamptz, "
               "note text, attrs jsonb, ref uuid)", dbname=db)
    dsn = pg.dsn(dbname=db)
    create_publication(dsn, "pub")
    create_slot(dsn, TEMPLATE, "pgoutput")
    conn = pg.connect(db)
    conn.autocommit = True
    with conn.cursor() as cur:
        for lo in range(0, ROWS, PER_TXN):
            cur.execute("INSERT INTO orders SELECT g, g %% 100, (g * 0.37)::numeric(12,2), now(), "
                        "'order note ' || g, jsonb_build_object('k', g, 'tags', jsonb_build_array('a', 'b')), "
                        "md5(g::text)::uuid FROM generate_series(%s, %s) g", (lo, lo + PER_TXN - 1))
    conn.close()
    return Workload(pg, dsn, db)


def stream_rate(w: Workload, transport: str) -> float:
    """Rows/s of ``connect()`` handing out typed Arrow batches, from the connection to the last row."""
    slot = w.copy_slot()
    started = time.perf_counter()
    stream = connect(w.dsn, slot=slot, publication="pub", transport=transport)
    rows = 0
    try:
        while rows < ROWS:
            for event in stream.read(timeout=0.5):
                if isinstance(event, ChangeBatch):
                    rows += event.to_arrow().num_rows
        elapsed = time.perf_counter() - started
    finally:
        stream.close()
        w.drop_slot(slot)
    return ROWS / elapsed


def ingest_rate(w: Workload, transport: str, **config: Any) -> dict[str, float]:
    """Rows/s of the ingest worker, from its start to the last staging commit that wrote files."""
    slot = w.copy_slot()
    out = tempfile.mkdtemp(prefix="spockwire-bench-ingest-")
    try:
        worker = IngestWorker(IngestConfig(dsn=w.dsn, slot=slot, out=out, publication=["pub"], idle_exit=10.0,
                                           flush_seconds=FLUSH_SECONDS, progress=False, transport=transport, **config))
        started = time.time()
        worker.run()
        # timed to the last staging commit that wrote files, not the idle wait (the server may pause for seconds
        # while it decodes a backlog, and the SQL transport's first call sends nothing until it decoded it all)
        last = max(_dt.datetime.fromisoformat(e["created_at"]).timestamp() for e in read_log(out) if e["files"])
        state = StagingState.load(out)
        rows = sum(f.rows for fs in state.files.values() for f in fs)
        parquet = sum(f.bytes for fs in state.files.values() for f in fs)
        assert rows == ROWS, f"{rows} rows staged, {ROWS} written"
        return {"rows_per_s": ROWS / (last - started), "parquet_bytes": parquet, "commits": len(read_log(out))}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        w.drop_slot(slot)


def paired_rounds(w: Workload, transport: str, rounds: int) -> dict[str, Any]:
    """`rounds` pairs (stream, then ingest); medians of the rates and of the per-round ratios."""
    pairs = []
    for _ in range(rounds):
        load = os.getloadavg()[0]
        s = stream_rate(w, transport)
        i = ingest_rate(w, transport)
        pairs.append({"stream_rows_per_s": round(s), "ingest_rows_per_s": round(i["rows_per_s"]),
                      "ratio": round(i["rows_per_s"] / s, 3), "load_1min": round(load, 2),
                      "parquet_bytes": i["parquet_bytes"], "commits": i["commits"]})
    return {
        "transport": transport, "rows": ROWS, "rounds": pairs,
        "stream_rows_per_s": round(statistics.median(p["stream_rows_per_s"] for p in pairs)),
        "ingest_rows_per_s": round(statistics.median(p["ingest_rows_per_s"] for p in pairs)),
        "ratio": round(statistics.median(p["ratio"] for p in pairs), 3),
        "load_1min": [p["load_1min"] for p in pairs],
    }


@pytest.fixture(scope="module")
def workload():
    with PostgresCluster({"logical_decoding_work_mem": "256MB"}) as pg:
        yield start_workload(pg)


def test_server_decode(benchmark, workload):
    benchmark.group = f"ingest {ROWS:,} rows"

    def count():
        return workload.pg.query(f"SELECT count(*) FROM pg_logical_slot_peek_binary_changes('{TEMPLATE}', NULL, "
                                 "NULL, 'proto_version', '1', 'publication_names', 'pub')", dbname=workload.db)[0][0]

    messages = benchmark.pedantic(count, rounds=1, iterations=1)
    RESULTS["server"] = ROWS / benchmark.stats.stats.min
    benchmark.extra_info.update(rows=ROWS, label="server decode (SQL interface, counted on the server)",
                                messages=int(messages))


@pytest.mark.parametrize("transport", ["replication", "sql"])
def test_ingest_worker(benchmark, workload, transport):
    benchmark.group = f"ingest {ROWS:,} rows"
    result = benchmark.pedantic(lambda: paired_rounds(workload, transport, ROUNDS), rounds=1, iterations=1)
    extra = dict(rows=ROWS, label=f"spockwire ingest over {transport} (stream + decode + Parquet + fsync + ack; "
                                  f"connect() alone: {result['stream_rows_per_s']:,} rows/s, ratio "
                                  f"{result['ratio']:.2f}, median of {ROUNDS} pairs)",
                 rows_per_s=result["ingest_rows_per_s"], stream_rows_per_s=result["stream_rows_per_s"],
                 ratio_to_stream=result["ratio"], pairs=result["rounds"])
    if "server" in RESULTS:
        extra["ratio_to_server_decode"] = result["ingest_rows_per_s"] / RESULTS["server"]
    benchmark.extra_info.update(extra)


CODECS = [("none", None, None), ("snappy", "snappy", None), ("lz4", "lz4", None), ("zstd level 1 (default)", "zstd", 1),
          ("zstd level 3", "zstd", 3), ("zstd level 6", "zstd", 6), ("gzip", "gzip", None)]


def compression_costs(w: Workload, rounds: int = 5) -> list[dict[str, Any]]:
    """Parquet encode CPU seconds (median of `rounds`) and size of the workload's rows, one chunk, per codec."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    slot = w.copy_slot()
    stream = connect(w.dsn, slot=slot, publication="pub")
    batches, rows = [], 0
    try:
        while rows < ROWS:
            for event in stream.read(timeout=0.5):
                if isinstance(event, ChangeBatch):
                    batches.append(event.to_arrow())
                    rows += event.num_rows
    finally:
        stream.close()
        w.drop_slot(slot)
    table = pa.Table.from_batches(batches).combine_chunks()
    out = []
    for name, codec, level in CODECS:
        cpu = []
        for _ in range(rounds):
            sink = pa.BufferOutputStream()
            t0 = time.process_time()
            pq.write_table(table, sink, compression=codec, compression_level=level)
            cpu.append(time.process_time() - t0)
        out.append({"codec": name, "bytes": sink.getvalue().size, "encode_cpu_s": round(statistics.median(cpu), 3),
                    "rows_per_cpu_s": round(ROWS / statistics.median(cpu))})
    return out


class _Server:
    """A server given by DSN (its workload written by an earlier `--prepare`), in place of a throwaway cluster."""

    def __init__(self, dsn: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True

    def query(self, sql: str, args: Any = None, dbname: str | None = None) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []

    execute = query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transport", action="append", choices=["replication", "sql"])
    parser.add_argument("--json", help="write the results here as well")
    parser.add_argument("--codecs", action="store_true", help="also measure Parquet encode cost and size per codec")
    parser.add_argument("--dsn", help="use this server's database, prepared by --prepare (to compare two builds "
                                      "on the same server, one round of each at a time)")
    parser.add_argument("--prepare", action="store_true", help="with --dsn: write the workload and the template "
                                                               "slot there, then exit")
    args = parser.parse_args()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if args.dsn:
        server = _Server(args.dsn)
        if args.prepare:
            server.execute("CREATE TABLE orders (id bigint PRIMARY KEY, qty int, price numeric(12,2), "
                           "at timestamptz, note text, attrs jsonb, ref uuid)")
            create_publication(args.dsn, "pub")
            create_slot(args.dsn, TEMPLATE, "pgoutput")
            for lo in range(0, ROWS, PER_TXN):
                server.execute("INSERT INTO orders SELECT g, g %% 100, (g * 0.37)::numeric(12,2), now(), "
                               "'order note ' || g, jsonb_build_object('k', g, 'tags', jsonb_build_array('a', "
                               "'b')), md5(g::text)::uuid FROM generate_series(%s, %s) g", (lo, lo + PER_TXN - 1))
            return
        w = Workload(server, args.dsn, "")  # type: ignore[arg-type]
        w._n = int(time.time() * 1000) % 10_000_000      # slot names of its own beside other runs' leftovers
        version = server.query("SHOW server_version")[0][0]
        results = [paired_rounds(w, t, args.rounds) for t in args.transport or ["replication", "sql"]]
        codecs = compression_costs(w) if args.codecs else None
    else:
        with PostgresCluster({"logical_decoding_work_mem": "256MB"}) as pg:
            w = start_workload(pg)
            version = pg.query("SHOW server_version", dbname=w.db)[0][0]
            results = [paired_rounds(w, t, args.rounds) for t in args.transport or ["replication", "sql"]]
            codecs = compression_costs(w) if args.codecs else None
    report = {"started": started, "server_version": version, "cores": os.cpu_count(), "results": results,
              "flush_seconds": FLUSH_SECONDS,
              **({"codecs": codecs} if codecs else {})}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
