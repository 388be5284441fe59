"""`spockwire snapshot`: read tables to Parquet / Arrow files, or ask a running ingest for a table's snapshot.

One-off: ``spockwire snapshot --dsn DSN --table public.orders --out orders.parquet`` reads the table under one
consistent snapshot (``--workers N`` connections sharing it) into a Parquet file (``.arrow`` / ``.feather``: an
Arrow IPC file), a batch at a time.

Incremental: ``spockwire snapshot --staging OUT --table public.late`` leaves a request for the ingest worker
streaming into the staging folder OUT; the worker reads the table under a snapshot of its own and stages its rows
as snapshot rows, deduplicated against the stream (docs/staging.md, "Snapshot rows"). ``--wait`` waits until the
snapshot is staged.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .common import CliError
from .config import Setting, add_settings, positive_int, resolve

NAME = "snapshot"
HELP = "read tables under one snapshot to Parquet/Arrow, or request a table's snapshot from a running ingest"

DSN = Setting("dsn", "libpq connection string of the database to read (one-off reads)", metavar="DSN")
TABLE = Setting("table", "schema.table to read; repeat the flag or separate with commas", metavar="SCHEMA.TABLE",
                repeat=True, required=True)
OUT = Setting("out", "one-off: the file to write (.parquet, or .arrow / .feather for an Arrow IPC file); with "
              "several tables a folder that gets one <schema.table>.parquet each", metavar="PATH", short="-o")
STAGING = Setting("staging", "incremental: the staging folder of a running `spockwire ingest`; the worker stages "
                  "the tables' rows as snapshot rows deduplicated against its stream", metavar="DIR")
WORKERS = Setting("workers", "connections reading each table (block ranges of one snapshot)", type=positive_int,
                  default=1, metavar="N")
TYPES = Setting("types", "column values: typed (Arrow types from the column's PostgreSQL type) or raw",
                choices=("typed", "raw"), default="typed")
WAIT = Setting("wait", "incremental: wait until the worker has staged the snapshot", is_flag=True, default=False)
TIMEOUT = Setting("timeout", "incremental --wait: give up after this many seconds", type=float, default=3600.0,
                  metavar="SECONDS")
SETTINGS = (DSN, TABLE, OUT, STAGING, WORKERS, TYPES, WAIT, TIMEOUT)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". Give --dsn and --out for a one-off read, "
                              "--staging for a snapshot staged by a running ingest worker.")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def _tables(value: Any) -> list[str]:
    names = [t.strip() for t in str(value or "").split(",") if t.strip()]
    if not names:
        raise CliError("--table names no table")
    return names


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    tables = _tables(cfg.table)
    if cfg.staging:
        if cfg.out or cfg.dsn:
            raise CliError("--staging asks a running ingest worker (which knows its DSN); do not give --dsn/--out")
        return _incremental(cfg, tables, out)
    if not cfg.dsn or not cfg.out:
        raise CliError("a one-off read needs --dsn and --out (or --staging for a running ingest)")
    return _one_off(cfg, tables, out)


def _incremental(cfg: Any, tables: list[str], out: TextIO) -> int:
    from ..ingest.staging import read_log
    from ..snapshot.incremental import request_snapshot

    staging = Path(cfg.staging)
    if not (staging / "_spockwire" / "log").is_dir():
        raise CliError(f"{staging} is not a staging folder (no _spockwire/log)")
    before = len(read_log(staging))
    request = request_snapshot(staging, tables)
    out.write(f"requested a snapshot of {', '.join(tables)} from the worker of {staging}\n")
    if not cfg.wait:
        return 0
    deadline = time.monotonic() + cfg.timeout
    while request.exists():              # the worker removes the request once it has acted on it
        if time.monotonic() > deadline:
            raise CliError(f"the worker did not take the request within {cfg.timeout:g} s (is `spockwire ingest` "
                           f"running on {staging}?)")
        time.sleep(0.2)
    done: dict[str, int] = {}
    for entry in read_log(staging)[before:]:
        record = entry.get("snapshot") or {}
        for table, rows in record.get("tables", {}).items():
            # a table read in chunks has one record per chunk
            done[table] = done.get(table, 0) + rows if record.get("kind") == "chunk" else rows
    for table in tables:
        if table in done:
            out.write(f"  {table}: {done[table]:,} rows staged as snapshot rows\n")
        else:
            out.write(f"  {table}: not snapshotted (already staged, or not replicated: see the worker's log)\n")
    return 0


def _one_off(cfg: Any, tables: list[str], out: TextIO) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spockwire

    target = Path(cfg.out)
    if len(tables) > 1:
        target.mkdir(parents=True, exist_ok=True)
        paths = [target / f"{t}.parquet" for t in tables]
    else:
        paths = [target]
    started = time.perf_counter()
    total = 0
    snapshot = None
    holder = None
    if len(tables) > 1:
        # one snapshot for all tables: a transaction that exports it stays open while they are read
        import psycopg2

        from ..connection.session import pinned_kwargs

        holder = psycopg2.connect(cfg.dsn, **pinned_kwargs(cfg.dsn))
        cur = holder.cursor()
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute("SELECT pg_export_snapshot()")
        snapshot = cur.fetchone()[0]
    try:
        for table, path in zip(tables, paths):
            rows = 0
            writer: Any = None
            arrow = path.suffix.lower() in (".arrow", ".feather", ".ipc")
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                for batch in spockwire.iter_table_batches(cfg.dsn, table, workers=cfg.workers, snapshot=snapshot,
                                                          types=cfg.types):
                    batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
                    for rb in batches:
                        if writer is None:
                            writer = (pa.ipc.new_file(str(tmp), rb.schema) if arrow
                                      else pq.ParquetWriter(str(tmp), rb.schema, compression="zstd"))
                        writer.write_batch(rb)
                        rows += rb.num_rows
                if writer is None:
                    raise CliError(f"{table}: the reader returned no batch (not even an empty one)")
                writer.close()
                writer = None
                tmp.replace(path)
            finally:
                if writer is not None:
                    writer.close()
                if tmp.exists():
                    tmp.unlink()
            total += rows
            out.write(f"  {table}: {rows:,} rows -> {path}\n")
    finally:
        if holder is not None:
            holder.close()
    elapsed = time.perf_counter() - started
    out.write(f"read {total:,} rows from {len(tables)} table(s) in {elapsed:.2f} s "
              f"({total / max(elapsed, 1e-9):,.0f} rows/s)\n")
    return 0
