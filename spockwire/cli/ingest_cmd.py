"""`spockwire ingest`: stream a replication slot into the Parquet staging layout, durably, exactly once."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ..ingest.worker import IngestConfig, IngestWorker
from .common import COLUMN_TYPE, COMMON_SETTINGS, ON_UNREPRESENTABLE, STAGING_SETTINGS
from .config import Setting, add_settings, parse_size, positive_int, resolve
from .stream_settings import STREAM_SETTINGS, names

NAME = "ingest"
HELP = "stream a slot into the Parquet staging layout (fsynced before the slot is acknowledged)"

FLUSH_SECONDS = Setting("flush_seconds", "commit to staging at least this often while changes arrive",
                        type=float, default=5.0, metavar="SECONDS")
SPILL_BYTES = Setting("spill_bytes", "rows of an open transaction kept in memory at most before they wait on "
                      "disk (e.g. 256MiB)", type=parse_size, default=256 << 20, metavar="SIZE")
METRICS_PORT = Setting("metrics_port", "serve Prometheus metrics on http://HOST:PORT/metrics (HOST: --metrics-host)",
                       type=int, metavar="PORT")
METRICS_HOST = Setting("metrics_host", "address the metrics server listens on (0.0.0.0: every interface)",
                       default="127.0.0.1", metavar="HOST")
PROGRESS = Setting("progress", "live progress line on stderr, redrawn in place on a terminal, one line every "
                   "5 seconds elsewhere", is_flag=True, default_text="on when stderr is a terminal")
LOG_FORMAT = Setting("log_format", "log lines as text or JSON", choices=("text", "json"), default="text")
MAX_RUNTIME = Setting("max_runtime", "stop by itself after this many seconds", type=float, metavar="SECONDS")
IDLE_EXIT = Setting("idle_exit", "stop by itself after this many seconds in which nothing arrived from the "
                    "server", type=float, metavar="SECONDS")
HEARTBEAT_INTERVAL = Setting("heartbeat_interval", "write a heartbeat (a non-transactional logical message, never "
                             "staged) this often, so the slot moves even when the server writes nothing at all",
                             type=float, metavar="SECONDS")
SNAPSHOT = Setting("snapshot", "initial: create the slot with an exported snapshot and stage every replicated "
                   "table's rows (insert rows at the slot's consistent point) before streaming; never: changes only",
                   choices=("initial", "never"), default_text="initial when --create-slot creates the slot")
SNAPSHOT_WORKERS = Setting("snapshot_workers", "connections reading the initial snapshot (tables and block ranges "
                           "of large tables)", type=positive_int, default=1, metavar="N")
SNAPSHOT_CHUNK_ROWS = Setting("snapshot_chunk_rows", "rows per chunk when a table that joins the publication later "
                              "is read while the stream goes on (one chunk in memory at a time)",
                              type=positive_int, default=10_000, metavar="N")
FAILOVER_SLOT = Setting("failover_slot", "make the slot a failover slot (PostgreSQL 17+: created so, or switched "
                        "over), and check at the start and after each reconnect that a standby would hold it "
                        "(docs/high-availability.md)", is_flag=True, default=False)
REQUIRE_FAILOVER_SAFETY = Setting("require_failover_safety", "with --failover-slot: refuse to run (exit 1) while no "
                                  "standby would hold the slot after a failover, instead of a warning",
                                  is_flag=True, default=False)
ON_DIVERGENCE = Setting("on_divergence", "when a promoted standby never had changes already staged (it lagged): "
                        "repair (read every replicated table again into the staging, then stream on) or stop (exit "
                        "1 with one line)", choices=("repair", "stop"), default="repair")
SETTINGS = (*COMMON_SETTINGS, COLUMN_TYPE, ON_UNREPRESENTABLE, *STREAM_SETTINGS, *STAGING_SETTINGS, FLUSH_SECONDS,
            SPILL_BYTES, METRICS_PORT, METRICS_HOST, PROGRESS, LOG_FORMAT, MAX_RUNTIME, IDLE_EXIT, HEARTBEAT_INTERVAL,
            SNAPSHOT, SNAPSHOT_WORKERS, SNAPSHOT_CHUNK_ROWS, FAILOVER_SLOT, REQUIRE_FAILOVER_SAFETY, ON_DIVERGENCE)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". SIGINT/SIGTERM: flush, acknowledge, exit 0. "
                              "After a crash, run it again: it resumes from the staging log and the slot, and "
                              "stages every committed change exactly once (see docs/staging.md).")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def configure_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(logging.Formatter('{"ts": "%(asctime)s", "level": "%(levelname)s", '
                                               '"logger": "%(name)s", "msg": %(message)s}'))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("spockwire")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    cfg = resolve(args, NAME)
    configure_logging(cfg.log_format)
    config = IngestConfig(
        dsn=cfg.dsn, slot=cfg.slot, out=cfg.out, plugin=cfg.plugin, publication=names(cfg.publication),
        replication_sets=names(cfg.replication_sets), create_slot=cfg.create_slot, binary=cfg.binary,
        streaming=cfg.streaming, two_phase=cfg.two_phase, messages=cfg.messages, types=cfg.types or "typed",
        numeric=cfg.numeric or "decimal", column_types=cfg.column_type or {},
        on_unrepresentable=cfg.on_unrepresentable, compression=cfg.compression, flush_rows=cfg.flush_rows,
        flush_bytes=cfg.flush_bytes, flush_seconds=cfg.flush_seconds, spill_bytes=cfg.spill_bytes,
        metrics_port=cfg.metrics_port, metrics_host=cfg.metrics_host, progress=cfg.progress,
        max_runtime=cfg.max_runtime, idle_exit=cfg.idle_exit, impl=cfg.impl, transport=cfg.transport,
        heartbeat_interval=cfg.heartbeat_interval, snapshot=cfg.snapshot, snapshot_workers=cfg.snapshot_workers,
        snapshot_chunk_rows=cfg.snapshot_chunk_rows, failover_slot=cfg.failover_slot,
        require_failover_safety=cfg.require_failover_safety, on_divergence=cfg.on_divergence)
    return IngestWorker(config).run()
