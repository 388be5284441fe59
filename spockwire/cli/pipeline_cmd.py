"""`spockwire pipeline`: the Spark pipeline job (`spockwire.spark.job`): one slot's changes applied to one Delta table
per source table, exactly once, with a progress line per micro-batch and Prometheus metrics.

SIGTERM or SIGINT: the micro-batch being applied is finished and committed to the checkpoint, then the job stops
(exit status 0); the next run goes on from the checkpoint. A second signal ends the process at once (exit status
128 + the signal's number), which loses nothing either: the next run applies again what was not committed.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..spark.maintenance import (DEFAULT_SMALL_FILES, DEFAULT_VACUUM_RETENTION_HOURS, MaintenanceOptions,
                                 count_option, retention_option)
from ..spark.signals import stop_on_signals
from .common import IMPL
from .config import CONFIG, ConfigError, Setting, add_settings, positive_int, resolve
from .ingest_cmd import LOG_FORMAT, METRICS_HOST, METRICS_PORT, configure_logging
from .stream_settings import CREATE_SLOT, SLOT, names

NAME = "pipeline"
HELP = "apply a slot's changes to Delta tables with Spark, exactly once (the pipeline job)"

log = logging.getLogger("spockwire.pipeline")

DSN = Setting("dsn", "libpq connection string of the source database, reachable from the driver and the executors; "
              "without the password (see --password-file)", required=True, metavar="DSN")
PUBLICATION = Setting("publication", "publication name(s), comma-separated", required=True, metavar="NAMES")
TABLE = Setting("table", "a source table and its key columns (default: its replica identity), or a name pattern "
                "(public.*); repeat the flag, or separate tables with ';'. None: every table of the publications, "
                "and those that join them later", metavar="SCHEMA.TABLE[=KEY,...]", repeat=True, separator=";")
EXCLUDE_TABLE = Setting("exclude_table", "leave out the tables this name pattern matches (audit.*); repeat the flag, "
                        "or separate patterns with ';'", metavar="PATTERN", repeat=True, separator=";")
TARGET = Setting("target", "folder of the Delta tables (<target>/<schema>.<table>)", required=True, metavar="DIR")
CHECKPOINT = Setting("checkpoint", "the streaming query's checkpoint folder", required=True, metavar="DIR")
PASSWORD = Setting("password", "the database password (environment or config file only, never a flag; or "
                   "--password-file, PGPASSFILE, PGPASSWORD)", env_only=True)
PASSWORD_FILE = Setting("password_file", "file whose first line is the database password", metavar="FILE")
STARTING_POSITION = Setting("starting_position", "snapshot: the tables' rows first, then their changes; slot: "
                            "changes from the slot's position", choices=("slot", "snapshot"), default="slot")
MAX_CHANGES_PER_BATCH = Setting("max_changes_per_batch", "about this many changes per micro-batch",
                                type=positive_int, metavar="N")
TRIGGER_SECONDS = Setting("trigger_seconds", "start a micro-batch at most this often", type=float, default=0.5,
                          metavar="SECONDS")
OPTION = Setting("option", "any other option of the spockwire source (snapshotChunkPages=64, ...); repeat the "
                 "flag, or separate with ';'", metavar="NAME=VALUE", repeat=True, separator=";")
HISTORY = Setting("history", "also keep an SCD 2 table per source table (<target>/<schema>.<table>_history)",
                  is_flag=True, default=False)
MASTER = Setting("master", "Spark master", default="local[2]", metavar="URL")
SPARK_CONF = Setting("spark_conf", "a Spark setting (spark.eventLog.enabled=true, ...); repeat the flag, or "
                     "separate with ';'", metavar="KEY=VALUE", repeat=True, separator=";")
UNTIL_CAUGHT_UP = Setting("until_caught_up", "stop once every change committed before the job started is applied",
                          is_flag=True, default=False)
TIMEOUT = Setting("timeout", "--until-caught-up: fail when not caught up within this many seconds", type=float,
                  default=600.0, metavar="SECONDS")
PROGRESS = Setting("progress", "one line per micro-batch on stderr: rows, rows/s, commit-to-Delta lag",
                   is_flag=True, default=True)
OPTIMIZE_EVERY = Setting("optimize_every", "OPTIMIZE a table every N micro-batches that wrote it (0: by "
                         "--optimize-small-files)", type=count_option, default=0, metavar="N")
OPTIMIZE_SMALL_FILES = Setting("optimize_small_files", "OPTIMIZE a table once it has K data files under half the "
                               "target file size (0: never)", type=count_option, default=DEFAULT_SMALL_FILES, metavar="K")
OPTIMIZE_MODE = Setting("optimize_mode", "zorder: rewrite Z-ordered by the key (for key-range pruning); compact: bin "
                        "small files only", choices=("zorder", "compact"), default="zorder")
VACUUM_RETENTION_HOURS = Setting("vacuum_retention_hours", "after an OPTIMIZE, VACUUM files older than H hours that "
                                 "no version references (off: no VACUUM)", type=retention_option,
                                 default=DEFAULT_VACUUM_RETENTION_HOURS, metavar="H")
MAINTENANCE = Setting("maintenance", "state collection, OPTIMIZE and VACUUM after micro-batches (--no-maintenance: "
                      "none)", is_flag=True, default=True)
FAILOVER_SLOT = Setting("failover_slot", "make the slot a failover slot (PostgreSQL 17+: created so, or switched "
                        "over; docs/high-availability.md)", is_flag=True, default=False)
REQUIRE_FAILOVER_SAFETY = Setting("require_failover_safety", "with --failover-slot: fail (exit 1) while no standby "
                                  "would hold the slot after a failover, instead of a warning (checked once the "
                                  "slot is a failover slot, and after each promotion)", is_flag=True, default=False)
RECONNECT_TIMEOUT = Setting("reconnect_timeout", "when the source database goes away (a restart, a failover), wait "
                            "this long for a primary to answer through the dsn (a multi-host dsn finds a promoted "
                            "standby) and go on from the checkpoint", type=float, default=300.0, metavar="SECONDS")
TAKE_OVER = Setting("take_over", "write Delta tables another streaming query writes (another job, or this one with "
                    "a new checkpoint), making this job their writer: only once the other one is stopped",
                    is_flag=True, default=False)
SETTINGS = (CONFIG, IMPL, DSN, PASSWORD, PASSWORD_FILE, SLOT, PUBLICATION, CREATE_SLOT, FAILOVER_SLOT,
            REQUIRE_FAILOVER_SAFETY, RECONNECT_TIMEOUT, TAKE_OVER, TABLE, EXCLUDE_TABLE, TARGET,
            CHECKPOINT, STARTING_POSITION, MAX_CHANGES_PER_BATCH, TRIGGER_SECONDS, OPTION, HISTORY, MASTER, SPARK_CONF,
            UNTIL_CAUGHT_UP, TIMEOUT, OPTIMIZE_EVERY, OPTIMIZE_SMALL_FILES, OPTIMIZE_MODE, VACUUM_RETENTION_HOURS,
            MAINTENANCE, METRICS_PORT, METRICS_HOST, PROGRESS, LOG_FORMAT)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". SIGINT/SIGTERM: finish the micro-batch being "
                              "applied, then exit 0; run it again to go on from the checkpoint "
                              "(see docs/spark-service.md, \"Stopping\").")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def _pairs(value: str | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (value or "").split(";"):
        if not item.strip():
            continue
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{what}: expected NAME=VALUE, got {item.strip()!r}")
        out[key.strip()] = val.strip()
    return out


def _password(cfg: Any) -> str | None:
    if cfg.password and cfg.password_file:
        raise ConfigError("give the password either as password (environment or config file) or as --password-file, "
                          "not both")
    if cfg.password_file:
        try:
            text = Path(cfg.password_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the password file {cfg.password_file}: {exc.strerror or exc}") from None
        lines = text.splitlines()
        if not lines or not lines[0]:
            raise ConfigError(f"the password file {cfg.password_file} is empty")
        return lines[0]
    return cfg.password or None


def job_config(cfg: Any) -> Any:
    """The JobConfig of resolved settings."""
    from ..spark.job import JobConfig, _parse_table

    options = _pairs(cfg.option, "--option")
    if any(k.lower() == "password" for k in options):
        raise ConfigError("--option: give the password as password (environment or config file) or "
                          "--password-file, not as a source option on the command line")
    tables = dict(_parse_table(t) for t in (cfg.table or "").split(";") if t.strip())
    exclude = [t.strip() for t in (cfg.exclude_table or "").split(";") if t.strip()]
    return JobConfig(dsn=cfg.dsn, slot=cfg.slot, publication=names(cfg.publication) or [], tables=tables,
                     exclude=exclude,
                     target=cfg.target, checkpoint=cfg.checkpoint,
                     starting_position=None if cfg.starting_position == "slot" else cfg.starting_position,
                     max_changes_per_batch=cfg.max_changes_per_batch, trigger_seconds=cfg.trigger_seconds,
                     create_slot=cfg.create_slot, extra_options=options, history=cfg.history,
                     failover_slot=cfg.failover_slot, reconnect_timeout=cfg.reconnect_timeout,
                     require_failover_safety=cfg.require_failover_safety,
                     take_over=cfg.take_over,
                     password=_password(cfg),
                     maintenance=MaintenanceOptions(optimize_every=cfg.optimize_every,
                                                    small_files=cfg.optimize_small_files,
                                                    zorder=cfg.optimize_mode == "zorder",
                                                    vacuum_retention_hours=cfg.vacuum_retention_hours)
                     if cfg.maintenance else None)


def run(args: argparse.Namespace) -> int:
    cfg = resolve(args, NAME)
    configure_logging(cfg.log_format)
    job_cfg = job_config(cfg)
    spark_conf = _pairs(cfg.spark_conf, "--spark-conf")
    if cfg.impl:
        spark_conf.setdefault("spark.executorEnv.SPOCKWIRE_IMPL", cfg.impl)

    from ..ingest.worker import serve_metrics
    from ..spark import job
    from ..spark.monitor import PipelineMonitor

    monitor = PipelineMonitor(job.conninfo(job_cfg), job_cfg.slot, out=sys.stderr if cfg.progress else None)
    server = serve_metrics(monitor.metrics, cfg.metrics_port, cfg.metrics_host) \
        if cfg.metrics_port is not None else None
    try:
        with stop_on_signals() as stop:
            return job.run(job_cfg, master=cfg.master, until_caught_up=cfg.until_caught_up, timeout=cfg.timeout,
                           spark_conf=spark_conf, monitor=monitor, stop=stop)
    finally:
        monitor.close()
        if server is not None:
            server.shutdown()
            server.server_close()
