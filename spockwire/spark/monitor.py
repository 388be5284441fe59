"""What `spockwire pipeline` shows while the pipeline job runs: one progress line per micro-batch and Prometheus
metrics (served like `spockwire ingest`'s, see `spockwire.ingest.worker.serve_metrics`).

`PipelineMonitor` is the job's monitor (`spockwire.spark.job.run`): ``on_batch(report)`` after each applied
micro-batch (the foreachBatch thread), ``tick(query)`` between them (the thread that runs the job), where it reads
the snapshot's progress from the query's last progress report and, every `lag_interval` seconds, the slot's lag
from the server.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, TextIO

from ..ingest.worker import metric_lines

__all__ = ["PipelineMetrics", "PipelineMonitor", "progress_line"]


class PipelineMetrics:
    """Counters and gauges of one pipeline run, in the Prometheus text format (`render`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.time()
        self.batches_total = 0
        self.rows_total: dict[str, int] = {}
        self.snapshot_rows_total: dict[str, int] = {}
        self.apply_seconds_total = 0.0
        self.last_batch_seconds = 0.0
        self.last_batch_unix = 0.0
        self.lag_seconds: dict[str, float] = {}      # quantile -> seconds, of the last micro-batch with changes
        self.slot_lag_bytes = -1                     # -1: not read yet
        self.snapshot_chunks_done = 0
        self.snapshot_chunks_total = 0
        self.snapshot_complete = 0

    def record(self, report: Any) -> None:
        """One applied micro-batch (a `spockwire.spark.job.BatchReport`)."""
        with self.lock:
            self.batches_total += 1
            for table, n in report.rows.items():
                self.rows_total[table] = self.rows_total.get(table, 0) + int(n)
            for table, n in report.snapshot_by_table.items():
                self.snapshot_rows_total[table] = self.snapshot_rows_total.get(table, 0) + int(n)
            self.apply_seconds_total += report.seconds
            self.last_batch_seconds = report.seconds
            self.last_batch_unix = time.time()
            if report.lag_p50 is not None:
                self.lag_seconds = {"0.5": round(report.lag_p50, 3), "0.95": round(report.lag_p95, 3)}

    def render(self) -> str:
        with self.lock:
            p = "spockwire_pipeline_"
            lines = metric_lines(p + "rows_total", "counter", "Change rows applied to the Delta tables (snapshot rows "
                                 "included).", by=("table", self.rows_total))
            lines += metric_lines(p + "snapshot_rows_total", "counter", "Rows of the initial snapshot applied.",
                                  by=("table", self.snapshot_rows_total))
            lines += metric_lines(p + "lag_seconds", "gauge", "Commit-to-Delta lag of the last micro-batch with "
                                  "changes (p50, p95; snapshot rows left out).", by=("quantile", self.lag_seconds))
            for name, kind, text, value in (
                    ("batches_total", "counter", "Micro-batches applied.", self.batches_total),
                    ("rows_all_total", "counter", "Change rows applied, all tables.", sum(self.rows_total.values())),
                    ("apply_seconds_total", "counter", "Seconds spent in micro-batches (read, resolve, write).",
                     round(self.apply_seconds_total, 3)),
                    ("last_batch_seconds", "gauge", "Seconds the last micro-batch took.",
                     round(self.last_batch_seconds, 3)),
                    ("last_batch_timestamp_seconds", "gauge", "Unix time the last micro-batch was applied.",
                     round(self.last_batch_unix, 3)),
                    ("slot_lag_bytes", "gauge", "Server WAL position minus the slot's confirmed position (-1: not "
                     "read yet).", self.slot_lag_bytes),
                    ("snapshot_chunks_done", "gauge", "Snapshot chunks (Spark tasks) read so far.",
                     self.snapshot_chunks_done),
                    ("snapshot_chunks_total", "gauge", "Snapshot chunks of the initial snapshot (0: no snapshot "
                     "seen).", self.snapshot_chunks_total),
                    ("snapshot_complete", "gauge", "1 once the initial snapshot is read (or none was asked for "
                     "and changes flow).", self.snapshot_complete),
                    ("uptime_seconds", "gauge", "Seconds since the job started.", round(time.time() - self.started, 1)),
            ):
                lines += metric_lines(p + name, kind, text, value)
            return "\n".join(lines) + "\n"


def progress_line(report: Any) -> str:
    """The progress line of one micro-batch: rows, rows/s and the commit-to-Delta lag of its changes."""
    rows = sum(report.rows.values())
    rate = rows / report.seconds if report.seconds > 0 else 0.0
    text = f"spockwire pipeline: batch {report.batch_id}: {rows:,} rows ({rate:,.0f} rows/s, {report.seconds:.2f} s)"
    if report.snapshot_rows:
        text += f", {report.snapshot_rows:,} of them snapshot rows"
    if report.lag_p50 is not None:
        text += f", lag {report.lag_p50:.2f} s (p95 {report.lag_p95:.2f} s)"
    else:
        text += ", lag -"
    return text


class PipelineMonitor:
    """The pipeline job's monitor: `metrics`, a progress line per micro-batch on `out` (None: none) and the slot's
    lag read over `conninfo` every `lag_interval` seconds."""

    def __init__(self, conninfo: str, slot: str, *, out: TextIO | None = None, lag_interval: float = 5.0) -> None:
        from .slot import ReusedConnection

        self.metrics = PipelineMetrics()
        self.out = out
        self.slot = slot
        self.lag_interval = lag_interval
        self._conn = ReusedConnection(conninfo)
        self._last_lag = -float("inf")
        self._last_progress: Any = None

    def on_batch(self, report: Any) -> None:
        self.metrics.record(report)
        if self.out is not None:
            self.out.write(progress_line(report) + "\n")
            self.out.flush()

    def tick(self, query: Any) -> None:
        progress = query.lastProgress
        stamp = None if progress is None else (progress.get("batchId"), progress.get("timestamp"))
        if stamp is not None and stamp != self._last_progress:
            self._last_progress = stamp
            self._snapshot(progress)
        now = time.monotonic()
        if now - self._last_lag >= self.lag_interval:
            self._last_lag = now
            try:
                self.read_slot_lag()
            except Exception:  # noqa: BLE001 - the figure stays as last read; the job itself reports a lost server
                pass

    def _snapshot(self, progress: Any) -> None:
        sources = progress.get("sources") or []
        end = sources[0].get("endOffset") if sources else None
        if isinstance(end, str):
            end = json.loads(end)
        if not isinstance(end, dict):
            return
        with self.metrics.lock:
            if "snapshot" in end:
                chunks = len(end.get("chunks") or ())
                self.metrics.snapshot_chunks_total = chunks
                self.metrics.snapshot_chunks_done = int(end.get("done", 0))
                self.metrics.snapshot_complete = int(bool(end.get("snapshot")) and end.get("done", 0) >= chunks)
            else:
                self.metrics.snapshot_chunks_done = self.metrics.snapshot_chunks_total
                self.metrics.snapshot_complete = 1

    def read_slot_lag(self) -> int | None:
        """The slot's lag in bytes (also into the metrics); None when the slot does not exist (yet)."""
        def lag(conn: Any) -> int | None:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                            "FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
                row = cur.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        value = self._conn.run(lag)
        if value is not None:
            with self.metrics.lock:
                self.metrics.slot_lag_bytes = max(value, 0)
        return value

    def close(self) -> None:
        self._conn.close()
