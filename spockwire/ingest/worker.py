"""The ingest worker: a replication slot streamed into the Parquet staging layout, nothing lost, nothing doubled.

Loop: read the committed events of one batch of frames, add them to the StagingWriter; when a flush is due (rows,
bytes or age), hand the buffer to the writer thread, which commits the staging (Parquet files and folders fsynced,
then the log entry written atomically) while the stream goes on being decoded; only once that commit is durable is
the slot acknowledged up to the LSN its log entry records. A huge transaction is written in several
staging commits that keep the previous LSN, so memory stays bounded and nothing is acknowledged early.

After a crash at any point, the next start removes the files no log entry names, resumes the slot from the log's
LSN, and the writer drops re-delivered changes by (`_commit_lsn`, `_seq`): every committed change is staged
exactly once.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

from ..connection.errors import TimelineDiverged
from ..errors import SpockwireError
from ..model import ChangeBatch
from .source import read_source
from .staging import StagingWriter

__all__ = ["IngestConfig", "IngestWorker", "Metrics", "IngestError", "ProgressLine", "serve_metrics", "metric_lines"]

log = logging.getLogger("spockwire.ingest")

#: a backlog is committed when the stream catches up once at least 1 / BACKLOG_FRACTION of --flush-rows was
#: handed out since it was last caught up, however fast it was read (else only after --flush-seconds behind)
BACKLOG_FRACTION = 64


class IngestError(SpockwireError):
    """The worker cannot start or go on (bad DSN, missing slot or publication, permissions, staging errors)."""


@dataclass
class IngestConfig:
    """Everything `spockwire ingest` needs; see `spockwire ingest --help` for each setting."""

    dsn: str
    slot: str
    out: str
    plugin: str = "pgoutput"
    publication: Any = None
    replication_sets: Any = None
    create_slot: bool = False
    binary: bool = False
    streaming: bool = False
    two_phase: bool = False
    messages: bool = False
    types: str = "typed"
    type_catalog: bool = True             # column types the stream does not carry, read from the catalog over `dsn`
    numeric: str = "decimal"
    column_types: dict[str, str] = field(default_factory=dict)   # "schema.table.column" -> "text" | "raw"
    on_unrepresentable: str = "text"
    compression: str = "zstd"
    flush_rows: int = 1_000_000
    flush_bytes: int = 128 << 20
    flush_seconds: float = 5.0
    spill_bytes: int = 256 << 20
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"       # "0.0.0.0": every interface
    progress: bool | None = None          # None: when the output is a terminal
    max_runtime: float | None = None      # stop by itself after this many seconds (tests, batch jobs)
    idle_exit: float | None = None        # stop by itself after this many seconds in which nothing arrived
    lag_interval: float = 5.0
    impl: str | None = None               # "c" | "python"; default: the one `import spockwire` selected
    transport: str = "replication"        # "replication" (low latency) | "sql" (catch-up throughput)
    heartbeat_interval: float | None = None  # write a heartbeat message this often (servers that write nothing)
    snapshot: str | None = None           # "initial" | "never"; None: "initial" when this run creates the slot
    snapshot_workers: int = 1             # connections reading the snapshot (tables and block ranges)
    snapshot_check_interval: float = 10.0  # look for tables added to the publication this often (0: never)
    snapshot_chunk_rows: int = 10_000     # rows per chunk of a table snapshotted while the stream goes on
    failover_slot: bool = False           # a failover slot (PostgreSQL 17+), checked to survive a promotion
    require_failover_safety: bool = False  # refuse to run while no standby would hold the slot
    on_divergence: str = "repair"         # a promoted standby never had staged changes: "repair" | "stop"
    extra: dict[str, Any] = field(default_factory=dict)


class Metrics:
    """Counters and gauges of one worker, served in the Prometheus text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows_total: dict[str, int] = {}
        self.bytes_written_total = 0
        self.commits_total = 0
        self.commits_by_reason: dict[str, int] = {}
        self.events_total = 0
        self.acked_lsn = 0
        self.lag_bytes = 0
        self.last_commit_unix = 0.0
        self.started = time.time()
        self.reconnects = 0
        self.errors_total = 0
        self.snapshot: Any = None          # SnapshotProgress while / after an initial snapshot

    def record_commit(self, entry: dict[str, Any], reason: str | None = None) -> None:
        with self.lock:
            self.commits_total += 1
            if reason is not None:
                self.commits_by_reason[reason] = self.commits_by_reason.get(reason, 0) + 1
            for f in entry.get("files", []):
                self.rows_total[f["table"]] = self.rows_total.get(f["table"], 0) + int(f["rows"])
                self.bytes_written_total += int(f["bytes"])
            for m in entry.get("messages", []):
                self.bytes_written_total += int(m["bytes"])
            self.last_commit_unix = time.time()

    def render(self) -> str:
        with self.lock:
            lines = metric_lines("spockwire_rows_staged_total", "counter",
                                 "Change rows written to the staging layout.", by=("table", self.rows_total))
            lines += metric_lines("spockwire_staging_commits_by_reason_total", "counter", "Staging commits by what "
                                  "made them: size, age, caught_up, lsn, stop, snapshot.",
                                  by=("reason", self.commits_by_reason))
            gauges = [
                ("spockwire_rows_staged_all_total", "counter", "Change rows written to the staging layout, all "
                 "tables.", sum(self.rows_total.values())),
                ("spockwire_bytes_written_total", "counter", "Parquet bytes written.", self.bytes_written_total),
                ("spockwire_staging_commits_total", "counter", "Staging commits (log entries).", self.commits_total),
                ("spockwire_events_total", "counter", "Decoded events received.", self.events_total),
                ("spockwire_reconnects_total", "counter", "Replication reconnects.", self.reconnects),
                ("spockwire_acked_lsn", "gauge", "LSN acknowledged to the server.", self.acked_lsn),
                ("spockwire_last_commit_timestamp_seconds", "gauge", "Unix time of the last staging commit.",
                 self.last_commit_unix),
                ("spockwire_lag_bytes", "gauge", "Server WAL position minus the acknowledged LSN.", self.lag_bytes),
                ("spockwire_uptime_seconds", "gauge", "Seconds since the worker started.", time.time() - self.started),
            ]
            snap = self.snapshot
            if snap is not None:
                eta = snap.eta_seconds()
                gauges += [
                    ("spockwire_snapshot_rows_total", "counter", "Snapshot rows read.", snap.rows),
                    ("spockwire_snapshot_rows_estimated", "gauge", "Rows of the snapshot's tables by pg_class "
                     "estimates.", snap.estimated_rows),
                    ("spockwire_snapshot_tables_done", "gauge", "Snapshot tables read completely.", snap.tables_done),
                    ("spockwire_snapshot_tables_total", "gauge", "Tables the snapshot reads.", snap.tables_total),
                    ("spockwire_snapshot_eta_seconds", "gauge", "Estimated seconds until the snapshot is read "
                     "(-1: unknown).", -1 if eta is None else round(eta, 1)),
                ]
            for name, kind, help_text, value in gauges:
                lines += metric_lines(name, kind, help_text, value)
            return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_lines(name: str, kind: str, help_text: str, value: Any = None, *,
                 by: tuple[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One metric in the Prometheus text format: its HELP and TYPE lines and its sample, or with `by` = (label,
    {label value: value}) one sample per label value."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    if by is None:
        return lines + [f"{name} {value}"]
    label, values = by
    return lines + [f'{name}{{{label}="{_label(str(k))}"}} {v}' for k, v in sorted(values.items())]


def serve_metrics(metrics: Any, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve `/metrics` (`metrics.render()`: a Metrics, or the pipeline's) on a background thread; returns the
    server (call `.shutdown()` to stop)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            if self.path.rstrip("/") not in ("/metrics", ""):
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="spockwire-metrics", daemon=True).start()
    return server


def _format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class ProgressLine:
    """The live progress line on `out`.

    On a terminal the line is redrawn in place: carriage return, erase to the end of the line (``ESC [K``), the
    text cut to the terminal's width (a wrapped line could not be redrawn; the final line, which stays, is written
    whole), so a shorter line never leaves pieces of a longer one. Log records written while it is shown erase it
    first (`clear`, called by the filter that `attach` installs on the log handlers); the next update draws it
    again. Elsewhere (a file, a pipe) each
    update is one whole line, at most one per `interval` seconds.
    """

    def __init__(self, out: TextIO, *, terminal: bool | None = None, interval: float = 5.0) -> None:
        self.out = out
        self.terminal = _isatty(out) if terminal is None else terminal
        self.interval = 0.2 if self.terminal else interval
        self.shown = False
        self._last = -float("inf")
        self._lock = threading.Lock()
        self._attached: list[logging.Handler] = []

    def _width(self) -> int:
        try:
            return max(os.get_terminal_size(self.out.fileno()).columns - 1, 20)
        except (AttributeError, OSError, ValueError):
            return 79

    def update(self, text: str, *, final: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not final and now - self._last < self.interval:
                return
            self._last = now
            if self.terminal:
                # the final line stays (never redrawn): whole, even if it wraps
                self.out.write("\r\x1b[K" + (text + "\n" if final else text[:self._width()]))
                self.shown = not final
            else:
                self.out.write(text + "\n")
            self.out.flush()

    def clear(self) -> None:
        with self._lock:
            if self.shown:
                self.out.write("\r\x1b[K")
                self.out.flush()
                self.shown = False
                self._last = -float("inf")   # draw it again at the next update

    def attach(self, logger: logging.Logger) -> None:
        """Erase the line before every record the handlers of `logger` (and its ancestors) write."""
        current: logging.Logger | None = logger
        while current is not None:
            for handler in current.handlers:
                handler.addFilter(self._filter)
                self._attached.append(handler)
            current = current.parent if current.propagate else None

    def detach(self) -> None:
        for handler in self._attached:
            handler.removeFilter(self._filter)
        self._attached.clear()

    def _filter(self, record: logging.LogRecord) -> bool:
        self.clear()
        return True


class _Stopped(Exception):
    """The worker was asked to stop while it read a snapshot."""


def _write_durably(path: Path, text: str) -> None:
    from .staging_log import _fsync_dir, _write_durable

    tmp = path.parent / f".{path.name}.tmp"
    _write_durable(tmp, text.encode())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove_durably(path: Path) -> None:
    from .staging_log import _fsync_dir

    try:
        path.unlink()
    except FileNotFoundError:
        return
    _fsync_dir(path.parent)


def _drop_when_inactive(dsn: str, slot: str, drop_slot: Any, slot_info: Any, timeout: float = 60.0) -> None:
    """Drop `slot` once no connection uses it (the walsender of a killed worker ends when the server notices)."""
    deadline = time.monotonic() + timeout
    while True:
        info = slot_info(dsn, slot)
        if info is None:
            return
        if not info.active:
            try:
                drop_slot(dsn, slot)
                return
            except Exception as exc:  # noqa: BLE001 - it became active again in between: retry until the deadline
                if time.monotonic() > deadline:
                    raise IngestError(f"cannot drop slot {slot!r} of an unfinished snapshot: {exc}") from exc
        elif time.monotonic() > deadline:
            raise IngestError(f"slot {slot!r} of an unfinished snapshot is still in use (pid {info.active_pid})")
        time.sleep(0.1)


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


class IngestWorker:
    """Runs one slot into one staging folder. `run()` returns when stopped (signal, `stop()`, limits)."""

    def __init__(self, config: IngestConfig, *, connect: Callable[..., Any] | None = None,
                 out: TextIO | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        self._stop = threading.Event()
        self._connect = connect
        self._out = out if out is not None else sys.stderr
        self._progress = config.progress if config.progress is not None else _isatty(self._out)
        self.progress_line = ProgressLine(self._out, interval=config.lag_interval) if self._progress else None
        self.start_lsn = 0
        self._last_lag_check = 0.0
        self._last_commit = time.monotonic()
        #: when the stream was first seen behind the server since it was last caught up (None: caught up)
        self._behind_since: float | None = None
        self._backlog_read = False  # a backlog was read to its end: commit once its events are handed out
        self._rows_when_caught_up = 0  # rows handed out when the stream was last caught up
        #: since when a commit inside a drain left the log's LSN behind the events handed to the writer
        self._lsn_owed_since: float | None = None
        #: why each commit in flight was made, by commit number (logged when it is durable)
        self._reasons: dict[int, str] = {}
        self.stream: Any = None
        self.writer: StagingWriter | None = None
        self.type_catalog: Any = None
        self.incremental: Any = None
        self._watermarks = False              # the stream carries the watermarks of chunked snapshots
        #: the decoder module and the process's buffer pool limit before the worker lowered it (restored by run())
        self._pool_before: tuple[Any, int] | None = None

    @property
    def protocol(self) -> str:
        """The wire protocol of the configured plugin (what the staging records)."""
        return {"pgoutput": "pgoutput", "pglogical": "pglogical", "pglogical_output": "pglogical",
                "spock": "spock", "spock_output": "spock"}.get(self.config.plugin, self.config.plugin)

    def stop(self, *_: Any) -> None:
        """Ask the worker to finish: it flushes, acknowledges what it wrote and returns from `run()`."""
        self._stop.set()

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        cfg = self.config
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self.stop)
        metrics_server = serve_metrics(self.metrics, cfg.metrics_port, cfg.metrics_host) \
            if cfg.metrics_port is not None else None
        if self.progress_line is not None:
            self.progress_line.attach(log)
        try:
            repaired: set[tuple[int, int]] = set()
            while True:
                try:
                    return self._run()
                except TimelineDiverged as exc:
                    # the staging holds changes the new primary never had: read every table again
                    # (ingest/divergence.py), then stream on from there -- once per divergence
                    if cfg.on_divergence != "repair" or (exc.timeline, exc.switch_point) in repaired:
                        raise
                    repaired.add((exc.timeline, exc.switch_point))
                    log.warning("%s; reading the tables again", exc)
                    from .divergence import repair_divergence

                    repair_divergence(self, exc)
        finally:
            if self._pool_before is not None:
                impl, limit = self._pool_before
                impl.set_buffer_pool_bytes(limit)
                self._pool_before = None
            if self.progress_line is not None:
                self.progress_line.clear()
                self.progress_line.detach()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()

    def _open_stream(self, start_lsn: int) -> Any:
        cfg = self.config
        if self._connect is None:
            from ..connection import connect
        else:
            connect = self._connect
        import importlib

        from ..wire import load_implementation

        impl = load_implementation() if cfg.impl is None else importlib.import_module(
            "spockwire.wire._decoder" if cfg.impl == "c" else "spockwire.wire._decoder_py")

        if self.type_catalog is None and cfg.type_catalog and cfg.types != "raw":
            from ..values.catalog import PostgresTypeCatalog
            self.type_catalog = PostgresTypeCatalog(cfg.dsn, strict=False)

        # released column buffers kept for reuse count against the worker's memory: an eighth of what an open
        # transaction may hold before it spills, and never more than the process's limit. The limit is the
        # process's: run() puts the one it found back when it returns.
        limit = impl.set_buffer_pool_bytes(0)
        if self._pool_before is None:
            self._pool_before = (impl, limit)
        impl.set_buffer_pool_bytes(min(self._pool_before[1], cfg.spill_bytes // 8))

        def factory(protocol: str) -> Any:
            return impl.Decoder(protocol, types=cfg.types, numeric=cfg.numeric, spill_bytes=cfg.spill_bytes,
                                type_catalog=self.type_catalog, column_types=cfg.column_types,
                                on_unrepresentable=cfg.on_unrepresentable)

        kwargs: dict[str, Any] = dict(slot=cfg.slot, plugin=cfg.plugin, create_slot=cfg.create_slot,
                                      start_lsn=start_lsn, binary=cfg.binary, decoder_factory=factory,
                                      transport=cfg.transport, **cfg.extra)
        if cfg.failover_slot:
            kwargs.update(failover=True, require_failover_safety=cfg.require_failover_safety)
        if self.writer is not None and self.writer.state.timeline is not None:
            kwargs["start_timeline"] = self.writer.state.timeline     # the staged position's timeline
        if cfg.heartbeat_interval is not None:
            kwargs["heartbeat_interval"] = cfg.heartbeat_interval
        if cfg.plugin == "pgoutput":
            # watermarks of chunked snapshots arrive as messages (only those the user asked for are staged)
            kwargs.update(publication=cfg.publication, streaming=cfg.streaming, two_phase=cfg.two_phase,
                          messages=cfg.messages or self._watermarks)
        else:
            kwargs.update(replication_sets=cfg.replication_sets)
        try:
            return connect(cfg.dsn, **kwargs)
        except SpockwireError:
            raise
        except Exception as exc:  # noqa: BLE001 - the driver's errors become one clear message
            raise IngestError(f"cannot start streaming slot {cfg.slot!r}: {exc}".strip()) from exc

    def _run(self) -> int:
        cfg = self.config
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        protocol = self.protocol
        # the folder must hold this source's changes only (refused with both named otherwise)
        source = read_source(cfg.dsn, slot=cfg.slot, plugin=cfg.plugin, publication=cfg.publication,
                             replication_sets=cfg.replication_sets, connect_kwargs=cfg.extra.get("connect_kwargs"))
        writer = StagingWriter(cfg.out, protocol, compression=cfg.compression, max_rows=cfg.flush_rows,
                               max_bytes=cfg.flush_bytes, max_age=cfg.flush_seconds, source=source)
        self.writer = writer
        try:
            self._initial_snapshot(writer)
        except BaseException:
            writer.close()
            raise
        if self._stop.is_set():
            writer.close()
            return 0
        resume = writer.committed_lsn
        log.info(json.dumps({"event": "start", "slot": cfg.slot, "plugin": cfg.plugin, "out": cfg.out,
                             # null: nothing staged yet, the stream starts at the slot's confirmed position
                             "resume_lsn": _format_lsn(resume) if resume else None}))
        # (a divergence's repair is a snapshot too, but not one that asks for the snapshots of later tables)
        incremental_wanted = any(r.get("kind") != "repair" for r in writer.state.snapshots) and \
            cfg.snapshot != "never"
        # pgoutput (PostgreSQL 14 or later) forwards logical messages; pglogical and spock get a watermark table
        self._watermarks = incremental_wanted and (cfg.plugin != "pgoutput" or self._server_version() >= 140000)
        stream = None
        try:
            stream = self._open_stream(resume)
            self.stream = stream
            read_on = self._check_timeline(stream, writer.state.timeline)
        except BaseException:
            if stream is not None:
                stream.close()
            writer.close()
            raise
        self._start_position(resume)
        incremental = None
        if incremental_wanted:
            from ..snapshot.incremental import IncrementalSnapshots

            # tables that join later get a snapshot of their own (docs/snapshot.md, "Tables that join later")
            watermarks = "message" if cfg.plugin == "pgoutput" else "table"
            incremental = self.incremental = IncrementalSnapshots(self, cfg.snapshot_check_interval,
                                                                  chunked=self._watermarks,
                                                                  chunk_rows=cfg.snapshot_chunk_rows,
                                                                  watermarks=watermarks)
        started = time.monotonic()
        last_activity = time.monotonic()
        received = self._messages_received()
        reconnects = getattr(stream, "reconnects", 0)
        rows_seen = 0
        try:
            while not self._stop.is_set():
                events = stream.read(timeout=0.5)
                if getattr(stream, "timeline", read_on) != read_on:     # a reconnect reached a promoted standby
                    read_on = self._check_timeline(stream, read_on)
                now = time.monotonic()
                # idle means nothing arrived: a large transaction that is still coming has no events yet
                before, received = received, self._messages_received()
                # a reconnect (however long it took) starts a new wait: what was not yet received is still coming
                was, reconnects = reconnects, getattr(stream, "reconnects", 0)
                if events or received != before or reconnects != was or (incremental is not None
                                                                        and incremental.busy):
                    last_activity = now
                if incremental is not None:
                    events = incremental.order(events)
                last = len(events) - 1
                cut_inside = False
                for i, event in enumerate(events):
                    if incremental is not None and not incremental.before(event):
                        continue
                    writer.add(event)
                    if isinstance(event, ChangeBatch):
                        rows_seen += event.num_rows
                    if i < last and (writer.buffered_bytes >= cfg.flush_bytes
                                     or writer.buffered_rows >= cfg.flush_rows):
                        # inside a large drain: write what is buffered, keep the log's LSN where it was
                        self._commit(writer.sealed_lsn, reason="size")
                        cut_inside = True
                if incremental is not None:
                    incremental.poll()
                with self.metrics.lock:
                    self.metrics.events_total += len(events)
                    self.metrics.reconnects = getattr(stream, "reconnects", 0)
                # every event read is added: a commit now records the LSN that covers them all. At the rows or
                # bytes limit it waits for the writer thread if needed (memory stays bounded); by the age of what
                # is buffered it does not: while the writer thread is busy with the previous commit, the events
                # stay buffered for the next one (group commit). With nothing buffered, the LSN still moves on
                # (transactions of unpublished tables) once per flush interval.
                # A commit inside this drain kept the old LSN: the next commit that records the new one is tried at
                # once and, while the writer thread is busy, at every read after, without waiting -- unless the LSN
                # has been left behind for --flush-seconds (a stream of large drains would otherwise keep it, and
                # the slot, behind). At the end of a backlog (see `_backlog_done`) the commit waits its turn.
                if cut_inside and self._lsn_owed_since is None:
                    self._lsn_owed_since = now
                owed = self._lsn_owed_since is not None and stream.delivered_lsn > writer.sealed_lsn
                backlog_done = self._backlog_done(stream, now, rows_seen) and (
                    writer.buffered_rows > 0 or writer.buffered_bytes > 0 or stream.delivered_lsn > writer.sealed_lsn)
                reason, block = None, True
                if writer.buffered_bytes >= cfg.flush_bytes or writer.buffered_rows >= cfg.flush_rows:
                    reason = "size"
                elif backlog_done:
                    reason = "caught_up"
                elif owed:
                    reason, block = "lsn", now - self._lsn_owed_since >= cfg.flush_seconds
                elif writer.should_flush() or (stream.delivered_lsn > writer.sealed_lsn
                                               and now - self._last_commit >= cfg.flush_seconds):
                    reason, block = "age", False
                if reason is not None:
                    self._commit(stream.delivered_lsn, block=block, reason=reason)
                else:
                    self._collect()
                self._report(rows_seen, started)
                if cfg.max_runtime is not None and now - started >= cfg.max_runtime:
                    break
                if cfg.idle_exit is not None and now - last_activity >= cfg.idle_exit:
                    break
            self._commit(stream.delivered_lsn, reason="stop")
            self._collect(wait=True)
            self._report(rows_seen, started, final=True)
            log.info(json.dumps({"event": "stop", "acked_lsn": _format_lsn(writer.committed_lsn),
                                 "rows": rows_seen}))
            return 0
        finally:
            try:
                if incremental is not None:
                    incremental.close()
                stream.close()
            finally:
                writer.close()
                if self.type_catalog is not None:
                    self.type_catalog.close()

    def _check_timeline(self, stream: Any, read_on: int | None) -> int | None:
        """The stream reached a server on another timeline than the one what the writer holds was read on: the
        stream checked its own acknowledged position, but the staging may hold more (a commit that became durable
        after the connection broke, rows staged ahead of the log's LSN, events still buffered). TimelineDiverged
        when the new timeline's history left `read_on` before the newest of them; returns the stream's timeline."""
        now = getattr(stream, "timeline", None)
        if read_on is None or now is None or now == read_on:
            return now if now is not None else read_on
        from ..connection.failover import check_position

        self.writer.wait()
        check_position(self.config.dsn, self.writer.newest_lsn, read_on, now, self.config.extra.get("connect_kwargs"))
        return now

    # ------------------------------------------------------------------ initial snapshot
    def _snapshot_wanted(self) -> bool:
        cfg = self.config
        if cfg.snapshot not in (None, "initial", "never"):
            raise IngestError(f"snapshot must be 'initial' or 'never', got {cfg.snapshot!r}")
        return cfg.snapshot == "initial" or (cfg.snapshot is None and cfg.create_slot)

    def _initial_snapshot(self, writer: StagingWriter) -> None:
        """Create the slot with an exported snapshot and stage every replicated table's rows at its consistent
        point, unless the folder already holds a snapshot (or a stream staged without one).

        Crash safety (docs/staging.md, "Snapshot rows"): the snapshot's files are published by one staging
        commit. A marker written before the slot is created says a snapshot is under way; a worker that finds the
        marker and no snapshot in the log drops the slot (nothing was ever streamed from it or acknowledged) and
        starts again with a new slot and a new snapshot: the exported snapshot died with the crashed worker's
        connection, and the old slot's consistent point cannot be matched by any other snapshot.
        """
        cfg = self.config
        if not self._snapshot_wanted():
            return
        from ..connection.slots import drop_slot, slot_info
        from ..snapshot.initial import (SnapshotError, SnapshotProgress, create_slot_with_snapshot,
                                        replicated_tables, stage_initial_snapshot)

        marker = Path(cfg.out) / "_spockwire" / "snapshot-pending.json"
        if writer.state.snapshots:
            _remove_durably(marker)
            return
        if writer.committed_lsn:
            if cfg.snapshot == "initial":
                raise IngestError(f"staging folder {cfg.out} holds changes streamed without an initial snapshot; "
                                  "a snapshot now would not match them (use a new folder, or --snapshot never)")
            return
        existing = slot_info(cfg.dsn, cfg.slot)
        if marker.exists():
            try:
                pending = json.loads(marker.read_text())
            except (OSError, ValueError):
                pending = {}
            if pending.get("slot") not in (None, cfg.slot):
                raise IngestError(f"staging folder {cfg.out} holds an unfinished snapshot of slot "
                                  f"{pending.get('slot')!r}, not {cfg.slot!r}")
            if existing is not None:
                log.info(json.dumps({"event": "snapshot_discarded", "slot": cfg.slot,
                                     "reason": "an earlier snapshot did not finish; its slot is dropped and "
                                               "created again with a new snapshot"}))
                _drop_when_inactive(cfg.dsn, cfg.slot, drop_slot, slot_info)
                existing = None
        if existing is not None:
            if cfg.snapshot == "initial":
                raise IngestError(f"replication slot {cfg.slot!r} already exists: an initial snapshot needs a "
                                  "slot created with it (drop the slot, or use --snapshot never)")
            return
        _write_durably(marker, json.dumps({"slot": cfg.slot, "plugin": cfg.plugin,
                                           "started_at": time.time()}) + "\n")
        progress = SnapshotProgress()
        self.metrics.snapshot = progress

        def on_progress(p: Any) -> None:
            if self._stop.is_set():
                raise _Stopped()
            if self.progress_line is not None:
                self.progress_line.update(p.line())

        try:
            with create_slot_with_snapshot(cfg.dsn, cfg.slot, cfg.plugin, two_phase=cfg.two_phase,
                                           connect_kwargs=cfg.extra.get("connect_kwargs")) as exported:
                tables = replicated_tables(cfg.dsn, cfg.plugin, publication=cfg.publication,
                                           replication_sets=cfg.replication_sets, snapshot=exported.name,
                                           connect_kwargs=cfg.extra.get("connect_kwargs"))
                log.info(json.dumps({"event": "snapshot_start", "slot": cfg.slot,
                                     "consistent_point": exported.consistent_point_text,
                                     "tables": [t.name for t in tables],
                                     "estimated_rows": sum(max(t.estimated_rows, 0) for t in tables)}))
                entry = stage_initial_snapshot(writer, cfg.dsn, exported, tables, workers=cfg.snapshot_workers,
                                               types=cfg.types, progress=progress, on_progress=on_progress,
                                               connect_kwargs=cfg.extra.get("connect_kwargs"))
        except _Stopped:
            log.info(json.dumps({"event": "snapshot_stopped", "slot": cfg.slot}))
            return
        except SnapshotError as exc:
            raise IngestError(str(exc)) from exc
        if entry is not None:
            self.metrics.record_commit(entry, "snapshot")
        _remove_durably(marker)
        if self.progress_line is not None:
            self.progress_line.update(progress.line(), final=True)
        log.info(json.dumps({"event": "snapshot_done", "commit": entry["commit"] if entry else None,
                             "consistent_point": entry["committed_lsn_text"] if entry else None,
                             "tables": progress.tables_done, "rows": progress.rows}))

    def _server_version(self) -> int:
        """server_version_num of the source (0 when it cannot be read)."""
        try:
            from ..connection.session import pinned_connect

            conn = pinned_connect(self.config.dsn, **dict(self.config.extra.get("connect_kwargs") or {}))
            try:
                with conn.cursor() as cur:
                    cur.execute("SHOW server_version_num")
                    return int(cur.fetchone()[0])
            finally:
                conn.close()
        except Exception as exc:  # noqa: BLE001 - then no watermarks: tables that join later are read whole
            log.debug("cannot read the server version: %s", exc)
            return 0

    def _backlog_done(self, stream: Any, now: float, rows_seen: int) -> bool:
        """True once per backlog, at the read where the stream catches up after having been behind the server for
        at least --flush-seconds, or after having handed out at least 1/`BACKLOG_FRACTION` of --flush-rows since
        it was last caught up (`behind_since`: the walsender had not yet reached the end of the WAL, or the SQL
        transport's call had not read to it; `caught_up`: it has, and every event received was handed out). A
        trickle is neither behind that long nor that large, so it keeps the --flush-seconds rhythm; the end of a
        backlog is committed at once instead of waiting for the age limit, however fast it was read (one SQL
        call may hand out a whole backlog in the read that also finds the stream caught up)."""
        behind = getattr(stream, "behind_since", None)
        if behind is not None:
            self._behind_since = behind
            return False
        # the server has nothing more; events received may still wait to be handed out (the next read has them)
        since, self._behind_since = self._behind_since, None
        cfg = self.config
        large = (rows_seen - self._rows_when_caught_up) * BACKLOG_FRACTION >= cfg.flush_rows
        self._backlog_read = self._backlog_read or large or (since is not None
                                                             and now - since >= cfg.flush_seconds)
        if not getattr(stream, "caught_up", False):
            return False
        self._rows_when_caught_up = rows_seen
        done, self._backlog_read = self._backlog_read, False
        return done

    def _messages_received(self) -> int:
        """Messages the stream has received so far (0 for a stream that does not count them)."""
        stats = getattr(self.stream, "stats", None)
        return int(stats().get("messages", 0)) if stats is not None else 0

    def _commit(self, lsn: int, *, block: bool = True, reason: str = "size") -> None:
        """Hand everything buffered to the background writer as the next staging commit, recording `lsn`.

        The writer thread encodes, compresses, writes and fsyncs it while the stream goes on being read and
        decoded. A commit at a size limit first waits for the one in flight (back-pressure: memory holds at most
        one commit being written and one buffer). Other commits with `block` (the end of a backlog, an LSN owed
        too long, stopping) go beside the one in flight (two at most: staging.MAX_COMMITS_IN_FLIGHT), so the last
        rows of a backlog are encoded while the previous commit finishes; without `block`, a busy writer means
        the events stay buffered and go into the next commit (group commit). Acknowledgement happens in
        `_collect`, after the log entry is durable. `reason` (size, age, caught_up, lsn, stop) is logged with the
        commit."""
        writer = self.writer
        self._collect(wait=reason == "size")
        if writer.busy and not block:
            return
        writer.timeline = getattr(self.stream, "timeline", None)   # the timeline `lsn` was read on
        if writer.commit_async(lsn):
            self._reasons[writer.sealed_commit] = reason
        self._last_commit = time.monotonic()
        if lsn >= self.stream.delivered_lsn:
            self._lsn_owed_since = None
        self._collect()

    def _collect(self, *, wait: bool = False) -> None:
        """Take the commits the writer thread made durable (raising its error, if it met one), then acknowledge
        the slot up to the newest durable log entry -- never further."""
        writer = self.writer
        if wait:
            writer.wait()
        else:
            writer.poll()
        entries, writer.completed = writer.completed, []
        for entry in entries:
            reason = self._reasons.pop(entry["commit"], None)
            self.metrics.record_commit(entry, reason)
            log.info(json.dumps({"event": "staged", "commit": entry["commit"], "reason": reason,
                                 "committed_lsn": entry["committed_lsn_text"],
                                 "files": len(entry["files"]), "rows": sum(f["rows"] for f in entry["files"])}))
        if entries or wait:
            # acknowledge only what the newest durable log entry covers; while behind, with the next status update
            # (forced, the SQL transport would advance the slot now: a fast-forward pass over the WAL on the server
            # while the reading waits)
            acked = self.stream.ack(min(writer.committed_lsn, self.stream.delivered_lsn),
                                    send=getattr(self.stream, "behind_since", None) is None)
            with self.metrics.lock:
                self.metrics.acked_lsn = max(acked, self.start_lsn)

    def _start_position(self, resume: int) -> None:
        """Where the stream starts: the staging log's position, or the slot's confirmed position when that is
        later (the server starts there). The acknowledged-LSN and lag figures start from it, not from 0/0."""
        cfg = self.config
        start, lag = resume, None
        try:
            from ..connection.slots import slot_info

            info = slot_info(cfg.dsn, cfg.slot)
        except Exception as exc:  # noqa: BLE001 - the figures then start from the staging log alone
            log.debug("cannot read slot %s: %s", cfg.slot, exc)
            info = None
        if info is not None:
            start = max(resume, info.confirmed_flush_lsn)
            if info.lag_bytes is not None:
                lag = max(info.lag_bytes - (start - info.confirmed_flush_lsn), 0)
        self.start_lsn = start
        with self.metrics.lock:
            self.metrics.acked_lsn = max(self.metrics.acked_lsn, start)
            if lag is not None:
                self.metrics.lag_bytes = lag

    def _report(self, rows: int, started: float, final: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_lag_check >= self.config.lag_interval or final:
            self._last_lag_check = now
            stats = self.stream.stats() if hasattr(self.stream, "stats") else {}
            wal_end = int(stats.get("wal_end") or 0)
            if wal_end:   # 0: no keepalive seen yet, the figure from the start position stays
                with self.metrics.lock:
                    self.metrics.lag_bytes = max(wal_end - self.metrics.acked_lsn, 0)
        if self.progress_line is None:
            return
        elapsed = max(now - started, 1e-9)
        m = self.metrics
        with m.lock:
            line = (f"spockwire ingest: {rows:,} rows ({rows / elapsed:,.0f}/s), "
                    f"{m.bytes_written_total / elapsed / 1e6:.1f} MB/s written, {len(m.rows_total)} tables, "
                    f"acked {_format_lsn(m.acked_lsn)}, lag {m.lag_bytes:,} B")
        self.progress_line.update(line, final=final)
