"""A live logical-replication stream: psycopg2 sets it up, a batch pump reads it, the Decoder decodes it.

Two transports deliver the same events: ``"replication"`` (a walsender connection, START_REPLICATION, status
updates; the default) and ``"sql"`` (an ordinary connection reading the slot through the SQL functions, see
`spockwire.connection.sql`).

See docs/connection.md for the delivery and acknowledgement rules. In short: events are handed out in commit
order; `ack()` confirms that everything handed out so far is persisted; only confirmed positions are ever sent
to the server as flushed, never past the decoder's `committed_lsn`; after a reconnect the server resends
everything after the last confirmed position (at-least-once), and `(_commit_lsn, _seq)` identifies duplicates.

What the stream does while the consumer is between reads (status updates, keepalives, heartbeats, an idle slot
following the server) is in `spockwire.connection.stream_idle`.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from types import ModuleType, TracebackType
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

from .._implementation import choose
from .errors import ConnectionLost, ReplicationError, ServerError, StartupRejected, classify
from .options import check_startup, native_options, parse_startup_message, pgoutput_options, plugin_protocol
from .slots import create_slot as _create_slot
from .slots import format_lsn, parse_lsn
from .session import pinned_kwargs
from .sql import SqlSource, advance_slot, sql_options
from .stream_idle import BetweenReads, is_heartbeat

__all__ = ["ReplicationStream", "load_pump", "connect"]

log = logging.getLogger("spockwire.connection")

_FRAME_HEAD = struct.Struct(">IQ")
_RETRYABLE_ON_RECONNECT = ("55006",)  # object in use: the old walsender still holds the slot
TRANSPORTS = ("replication", "sql")
#: how long close() waits for the server to end the stream (or a running SQL call) before it just disconnects
CLOSE_TIMEOUT = 5.0
#: how long the first connection waits for a slot another backend holds: the backend of a client that was killed
#: keeps the slot until the server notices the client is gone (at once when idle; a backend decoding a large
#: transaction notices at its next write)
SLOT_BUSY_WAIT = 60.0


def load_pump(choice: str | None = None) -> ModuleType:
    """The batch pump: the Cython one (``c``) or the pure-Python twin (``python``).

    Follows ``SPOCKWIRE_IMPL`` like the decoder (default: C when it imports). Asking for C - explicitly or with
    ``SPOCKWIRE_REQUIRE_EXT=1`` - when it cannot be imported is an ImportError that says why.
    """
    return choose("spockwire.connection._pump", "spockwire.connection._pump_py", "replication pump",
                  "Build it with `python setup.py build_ext --inplace` (needs libpq-dev)", choice)


def _default_decoder_factory(protocol: str, type_catalog: Any = None, proto_format: str = "native",
                             **options: Any) -> Any:
    from ..wire import load_implementation
    from ..wire.json_protocol import json_decoder_or_native

    return json_decoder_or_native(load_implementation(), protocol, proto_format, type_catalog=type_catalog, **options)


def _auto_catalog(dsn: str) -> Any:
    from ..values.catalog import PostgresTypeCatalog

    return PostgresTypeCatalog(dsn, strict=False)


def _server_unavailable(exc: BaseException) -> bool:
    """A connection attempt refused because the server is starting, stopping, recovering or not listening.

    psycopg2 reports these connection-time FATALs without a SQLSTATE; while reconnecting they are waited out (up
    to the reconnect timeout), since a restarting server says exactly this for a while."""
    import psycopg2

    if not isinstance(exc, psycopg2.OperationalError):
        return False
    code = getattr(exc, "pgcode", None)
    if code is not None:
        return code.startswith(("57P", "08"))
    text = str(exc)
    return any(marker in text for marker in ("starting up", "shutting down", "in recovery mode", "Connection refused",
                                             "not yet accepting connections",
                                             "could not connect", "server closed the connection",
                                             "terminating connection"))


class ReplicationStream(BetweenReads):
    """Committed change events from one logical replication slot, with acknowledgement and resume.

    Build it with :func:`connect`. Iterate it for events (``ChangeBatch`` | ``Truncate`` | ``LogicalMessage``), or
    call :meth:`read` for the events of one batch of frames. Call :meth:`ack` once the events handed out so far are
    persisted. :meth:`close` (or the ``with`` block) reports the last acknowledged position, ends the stream
    cleanly and disconnects.
    """

    def __init__(self, dsn: str, *, slot: str, plugin: str = "pgoutput", publication: Any = None,
                 replication_sets: Any = None, create_slot: bool = False, start_lsn: int | str | None = None,
                 binary: bool | str = False, streaming: bool | str = False, two_phase: bool = False,
                 messages: bool = False, proto_version: int | None = None, forward_origins: bool = True,
                 extra_options: Mapping[str, str] | None = None, status_interval: float = 10.0,
                 reconnect: bool = True, reconnect_timeout: float | None = 300.0, max_backoff: float = 5.0,
                 max_batch_bytes: int = 4 << 20, read_timeout: float = 1.0, pump: str | ModuleType | None = None,
                 decoder_factory: Callable[[str], Any] | None = None,
                 connect_kwargs: Mapping[str, Any] | None = None, transport: str = "replication",
                 sql_batch_changes: int = 4_000_000, type_catalog: Any = "auto",
                 heartbeat_interval: float | None = None, sql_split_bytes: int = 16 << 20,
                 proto_format: str = "native", failover: bool = False, require_failover_safety: bool = False,
                 start_timeline: int | None = None) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be 'replication' or 'sql', not {transport!r}")
        if sql_batch_changes < 1:
            raise ValueError("sql_batch_changes must be at least 1")
        if sql_split_bytes < 0:
            raise ValueError("sql_split_bytes must be 0 (never split) or more")
        self.transport = transport
        self.sql_batch_changes = int(sql_batch_changes)
        self.sql_split_bytes = int(sql_split_bytes)
        self.dsn = dsn
        self.slot = slot
        self.plugin = plugin
        self.protocol = plugin_protocol(plugin)
        if self.protocol == "pgoutput":
            if publication is None:
                raise ValueError("plugin='pgoutput' needs publication=<name or list of names>")
            if replication_sets is not None:
                raise ValueError("replication_sets= is for pglogical/spock; pgoutput takes publication=")
            if binary not in (True, False):
                raise ValueError(f"pgoutput takes binary=True or False, not {binary!r} (internal datums are a "
                                 "pglogical/spock option)")
        else:
            if publication is not None:
                raise ValueError(f"publication= is for pgoutput; {plugin} takes replication_sets=")
            if streaming or two_phase or messages:
                raise StartupRejected(f"{plugin} streams have no streaming, two_phase or messages options")
            if binary not in (True, False, "internal"):
                raise ValueError(f"binary must be True, False or 'internal', not {binary!r}")
            if proto_version is not None and self.protocol != "spock":
                raise StartupRejected(f"{plugin} streams have no proto_version option (protocol 1 only)")
        # -- the JSON protocol (spockwire.wire.json_protocol): pglogical and spock only, values as JSON text
        if proto_format not in ("native", "json"):
            raise ValueError(f"proto_format must be 'native' or 'json', not {proto_format!r}")
        if proto_format == "json" and (self.protocol == "pgoutput" or binary):
            raise ValueError("proto_format='json' is for plugin='pglogical' or 'spock', with binary=False")
        self.proto_format = proto_format
        self._want = dict(publication=publication, replication_sets=replication_sets, binary=binary,
                          streaming=streaming, two_phase=two_phase, messages=messages, proto_version=proto_version,
                          forward_origins=forward_origins, extra=dict(extra_options or {}))
        self.binary = binary
        self.create_slot = create_slot
        #: a failover slot (PostgreSQL 17+): created so, or switched over at the first connect
        self.failover = bool(failover)
        self.require_failover_safety = bool(require_failover_safety)
        #: the timeline the acknowledged position was read on (None: not known yet; the server's at connect)
        self.timeline: int | None = start_timeline
        self.system_identifier: str | None = None
        self._failover_checked = False
        self.status_interval = float(status_interval)
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be a positive number of seconds (or None)")
        self.heartbeat_interval = None if heartbeat_interval is None else float(heartbeat_interval)
        self._beat_conn: Any = None
        self._last_beat = 0.0
        #: a batch of this connection failed to decode: its content was never handed out, so never move past it
        self._undecoded = False
        self.reconnect = reconnect
        self.reconnect_timeout = reconnect_timeout
        self.max_backoff = max_backoff
        self.max_batch_bytes = max_batch_bytes
        self.read_timeout = read_timeout
        self._pump_module = pump if isinstance(pump, ModuleType) else load_pump(pump)
        # column types the stream does not carry (pglogical/spock send none; enums, composites): read through `dsn`
        self._own_catalog = type_catalog == "auto" and decoder_factory is None
        self.type_catalog = _auto_catalog(dsn) if self._own_catalog else \
            (None if type_catalog == "auto" else type_catalog)
        self._decoder_factory = decoder_factory or (
            lambda p: _default_decoder_factory(p, self.type_catalog, self.proto_format))
        self._connect_kwargs = dict(connect_kwargs or {})
        #: options sent with START_REPLICATION (filled at the first connect: they depend on the server version)
        self.options: dict[str, str] = {}
        self.server_version_num = 0
        #: the database's encoding (pglogical/spock send text in it; pgoutput converts to the pinned UTF8)
        self.server_encoding = "UTF8"
        #: negotiated protocol version (pgoutput: the one asked for; pglogical/spock: from the startup message)
        self.proto_version: int | None = None
        self.startup_params: dict[str, str] = {}
        self._start_lsn = parse_lsn(start_lsn)
        self._acked = self._start_lsn
        self._delivered = self._start_lsn
        self._conn: Any = None
        self._pump: Any = None
        self._source: SqlSource | None = None
        self.decoder: Any = None
        self._startup_checked = False
        self._closed = False
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        #: what the status thread decoded between two reads of the consumer (replication only):
        #: (events, committed LSN) the next read hands out first; an error it met, raised by the next read
        self._pending: tuple[list[Any], int] | None = None
        self._pending_error: BaseException | None = None
        self._totals = {"messages": 0, "bytes": 0, "keepalives": 0, "status_sent": 0, "batches": 0, "calls": 0,
                        "splits": 0}
        self._batches = 0
        self._write_lsn = 0
        self._wal_end = 0
        self._behind_since: float | None = None

    # ---------------------------------------------------------------------------------------------- positions
    @property
    def acked_lsn(self) -> int:
        """The last position the consumer confirmed (what the server is told is flushed)."""
        return self._acked

    @property
    def delivered_lsn(self) -> int:
        """The position covering every event handed out so far (what `ack()` without argument confirms)."""
        return self._delivered

    @property
    def committed_lsn(self) -> int:
        """The decoder's committed LSN (may be ahead of `delivered_lsn` while events wait to be handed out)."""
        return self.decoder.committed_lsn if self.decoder is not None else self._delivered

    @property
    def caught_up(self) -> bool:
        """True when, as far as the transport can tell, the server has nothing more for this stream right now
        (`behind_since` is None) and everything received was handed out. False while unknown (no keepalive yet, a
        SQL call running)."""
        if self._pending is not None or self.decoder is None or (self._pump is None and self._source is None):
            return False
        return self.behind_since is None

    @property
    def behind_since(self) -> float | None:
        """`time.monotonic()` since when the server has had more for this stream than it received, or None when it
        has not (decoded events may still wait to be handed out): the walsender's latest keepalive covers every
        message received (it reached the end of the WAL and waits for more), or the SQL transport's last call read
        to the end of the WAL. Replication: from the check that first found it behind; SQL: from the start of the
        call that found the backlog."""
        pump, source = self._pump, self._source
        if source is not None:
            return source.behind_since
        if pump is None or 0 < pump.keepalive_end >= pump.write_lsn:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = time.monotonic()
        return self._behind_since

    @property
    def connected(self) -> bool:
        """True while a connection is open (False between a broken connection and the reconnect)."""
        return self._pump is not None or self._source is not None

    @property
    def impl(self) -> str:
        """"c" or "python": which pump reads the connection."""
        return self._pump_module.IMPLEMENTATION

    def stats(self) -> dict[str, int]:
        """Counters over the stream's life: messages, payload bytes, batches, keepalives, status updates (sql:
        slot advances), calls (sql), reconnects; positions: ``write_lsn`` (highest received), ``wal_end`` (the
        server's WAL end as last seen), ``acked_lsn``, ``delivered_lsn``."""
        out = dict(self._totals)
        pump, source = self._pump, self._source
        if pump is not None:
            for key in ("messages", "bytes", "keepalives", "status_sent"):
                out[key] += getattr(pump, key)
            out["batches"] += self._batches
            self._write_lsn = max(self._write_lsn, pump.write_lsn)
            self._wal_end = max(self._wal_end, pump.wal_end)
        elif source is not None:
            for key, value in source.counters().items():
                out[key] += value
            self._write_lsn = max(self._write_lsn, source.write_lsn)
            self._wal_end = max(self._wal_end, source.wal_end)
        out["write_lsn"] = self._write_lsn
        out["wal_end"] = self._wal_end
        out["reconnects"] = self.reconnects
        out["acked_lsn"] = self._acked
        out["delivered_lsn"] = self._delivered
        return out

    def ack(self, lsn: int | str | None = None, *, send: bool = False) -> int:
        """Confirm that everything handed out up to `lsn` (default: all of it) is persisted.

        The position is reported to the server with the next status update (at once with ``send=True``). An `lsn`
        beyond what was handed out is a ValueError: it would confirm changes the consumer has not seen. Returns the
        acknowledged position.
        """
        target = self._delivered if lsn is None else parse_lsn(lsn)
        if target > self._delivered:
            raise ValueError(f"cannot acknowledge {format_lsn(target)}: only changes up to "
                             f"{format_lsn(self._delivered)} were handed out")
        if target > self._acked:
            self._acked = target
            pump = self._pump if self._pump is not None else self._source
            if pump is not None:
                pump.flush_lsn = target
            if not send and self._lock.acquire(blocking=False):
                try:
                    self._settle_idle()  # a running read settles it itself when it ends
                finally:
                    self._lock.release()
        if send:
            with self._lock:
                try:
                    self._settle_idle()
                    if self._pump is not None:
                        self._pump.send_status()
                    elif self._source is not None:
                        self._source.request_advance()  # now, or when the running call ends
                except ConnectionLost:
                    pass  # the next read reconnects; the position is kept
                except Exception as exc:  # noqa: BLE001 - a broken SQL connection: same as above
                    if not isinstance(self._connect_error(exc), ConnectionLost):
                        raise
        return self._acked

    # ---------------------------------------------------------------------------------------------- lifecycle
    def open(self) -> "ReplicationStream":
        """Connect and start streaming (done by `connect()`; reconnects call it again)."""
        if self._closed:
            raise ReplicationError("the stream is closed")
        if not self.connected:
            self._open_first()
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name=f"spockwire-status-{self.slot}",
                                               daemon=True)
            self._heartbeat.start()
        return self

    def _build_options(self, server_version_num: int) -> dict[str, str]:
        w = self._want
        if self.protocol == "pgoutput":
            opts = pgoutput_options(server_version_num, w["publication"], proto_version=w["proto_version"],
                                    binary=w["binary"], streaming=w["streaming"], two_phase=w["two_phase"],
                                    messages=w["messages"], origin=None if w["forward_origins"] else "none")
            self.proto_version = int(opts["proto_version"])
            opts.update(w["extra"])
            return opts
        return native_options(self.plugin, server_version_num, replication_sets=w["replication_sets"],
                              forward_origins=w["forward_origins"], binary=w["binary"], extra=w["extra"],
                              encoding=self.server_encoding, proto_version=w["proto_version"],
                              proto_format=self.proto_format)

    def _open_first(self) -> None:
        """The first connection: a slot still held by another backend ("object in use") is waited for, at most
        SLOT_BUSY_WAIT seconds (or `reconnect_timeout`, if shorter, or not at all without `reconnect`); then the
        server's error is raised."""
        timeout = SLOT_BUSY_WAIT if self.reconnect_timeout is None else self.reconnect_timeout
        wait = min(SLOT_BUSY_WAIT, timeout) if self.reconnect else 0.0
        deadline = time.monotonic() + wait
        waited = False
        while True:
            try:
                self._open_once()
                return
            except Exception as exc:  # noqa: BLE001 - only "object in use" is waited for
                err = self._connect_error(exc)
                if getattr(err, "sqlstate", None) not in _RETRYABLE_ON_RECONNECT or time.monotonic() >= deadline:
                    if waited:
                        raise ServerError(f"{str(err).strip()} (still after waiting {wait:.0f} s: another client "
                                          f"is using the slot)") from exc
                    raise
                if not waited:
                    log.info("slot %s: %s; waiting up to %.0f s for the server to release it (a client that ended "
                             "holds it until the server notices)", self.slot, str(err).strip(), wait)
                    waited = True
                self._teardown()
                time.sleep(0.2)

    def _open_once(self) -> None:
        if self.transport == "sql":
            self._open_sql()
            return
        import psycopg2
        import psycopg2.extras

        conn = psycopg2.connect(self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                **pinned_kwargs(self.dsn, self._connect_kwargs))
        try:
            self.server_version_num = conn.server_version
            self.server_encoding = conn.get_parameter_status("server_encoding") or "UTF8"
            if not self.options:
                self.options = self._build_options(self.server_version_num)
            cur = conn.cursor()
            from .failover import identify_system, timeline_history

            system, timeline, _flush = identify_system(cur)
            self._check_timeline(system, timeline, _host_of(conn), lambda t: timeline_history(cur, t))
            if self.create_slot or (self.failover and not self._failover_checked):
                _create_slot(self.dsn, self.slot, self.plugin, two_phase=bool(self._want["two_phase"]),
                             failover=self.failover)
                self.create_slot = False
            self._check_failover_safety()
            start = max(self._acked, self._start_lsn)
            cur.start_replication(slot_name=self.slot, decode=False, start_lsn=start, options=self.options)
            pump = self._pump_module.FramePump(conn.pgconn_ptr, status_interval=self.status_interval,
                                               max_batch_bytes=self.max_batch_bytes, flush_lsn=self._acked)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._pump = pump
        self.decoder = self._decoder_factory(self.protocol)
        self._undecoded = False
        self._startup_checked = self.protocol == "pgoutput"
        log.info("streaming slot %s (%s) from %s", self.slot, self.plugin,
                 format_lsn(start) if start else "its confirmed position")

    def _check_timeline(self, system: str | None, timeline: int | None, server: str,
                        history: Callable[[int], list[tuple[int, int]]]) -> None:
        """The server's system identifier and timeline at a connection (IDENTIFY_SYSTEM on the replication
        transport, SQL on the other): another cluster than before is an error; a new timeline whose history
        (`history(timeline)`) leaves the old one before the acknowledged position is TimelineDiverged (the changes
        past the switch point were never on this server); otherwise positions from now on are on its timeline."""
        from .failover import TimelineDiverged, diverged_at, diverged_message

        if system is not None and self.system_identifier is not None and system != self.system_identifier:
            raise ServerError(f"the server is another cluster (system identifier {system}, not "
                              f"{self.system_identifier}): the DSN leads to a server that is not a copy of the "
                              "one this stream read")
        self.system_identifier = system if system is not None else self.system_identifier
        if timeline is None:          # (a standby read over SQL: no timeline to compare)
            return
        if self.timeline is not None and timeline != self.timeline:
            switch = diverged_at(history(timeline), self.timeline, self._acked)
            if switch is not None:
                raise TimelineDiverged(diverged_message(f"the server ({server})", self._acked, self.timeline,
                                                        switch, timeline),
                                       acked=self._acked, switch_point=switch, timeline=timeline)
            log.warning("slot %s: the server is on timeline %d (was %d): a standby was promoted; the acknowledged "
                        "%s is in its history", self.slot, timeline, self.timeline, format_lsn(self._acked))
        self.timeline = timeline

    def _check_failover_safety(self) -> None:
        """With a failover slot: whether it would survive a failover (connection.failover.check_failover_safety),
        at the first connect and after each reconnect; FailoverUnsafe when required, else a warning."""
        if not self.failover:
            return
        from .failover import check_failover_safety

        self._failover_checked = True
        check_failover_safety(self.dsn, self.slot, require=self.require_failover_safety,
                              connect_kwargs=self._connect_kwargs)

    def _open_sql(self) -> None:
        import psycopg2

        conn = psycopg2.connect(self.dsn, **pinned_kwargs(self.dsn, self._connect_kwargs))
        second = None
        try:
            conn.autocommit = True
            self.server_version_num = conn.server_version
            self.server_encoding = conn.get_parameter_status("server_encoding") or "UTF8"
            if not self.options:
                self.options = self._build_options(self.server_version_num)
            from .failover import replication_timeline_history, sql_identify_system

            with conn.cursor() as cur:
                system, timeline = sql_identify_system(cur)
            self._check_timeline(system, timeline, _host_of(conn), lambda t: replication_timeline_history(
                self.dsn, t, self._connect_kwargs)[0])
            if self.create_slot or (self.failover and not self._failover_checked):
                _create_slot(conn, self.slot, self.plugin, two_phase=bool(self._want["two_phase"]),
                             failover=self.failover)
                self.create_slot = False
            self._check_failover_safety()
            # a second connection pipelines the calls (the server decodes the next while this one's rows are sent)
            second = psycopg2.connect(self.dsn, **pinned_kwargs(self.dsn, self._connect_kwargs))
            second.autocommit = True
            source = SqlSource(conn, self._pump_module, slot=self.slot, options=sql_options(self.options),
                               batch_changes=self.sql_batch_changes, max_batch_bytes=self.max_batch_bytes,
                               start_lsn=self._start_lsn, flush_lsn=self._acked,
                               status_interval=self.status_interval, max_idle_wait=self.read_timeout,
                               second_conn=second, split_bytes=self.sql_split_bytes)
        except BaseException:
            conn.close()
            if second is not None:
                second.close()
            raise
        self._conn = conn
        self._source = source
        self.decoder = self._decoder_factory(self.protocol)
        self._undecoded = False
        self._startup_checked = self.protocol == "pgoutput"
        log.info("reading slot %s (%s) over SQL from %s", self.slot, self.plugin, format_lsn(source.start_position))

    def _teardown(self) -> None:
        pump, source, conn = self._pump, self._source, self._conn
        self._pump = self._source = self._conn = None
        self._pending, self._pending_error = None, None  # not handed out: the next session sends them again
        if pump is not None:
            for key in ("messages", "bytes", "keepalives", "status_sent"):
                self._totals[key] += getattr(pump, key)
            self._totals["batches"] += self._batches
            self._batches = 0
            self._write_lsn = max(self._write_lsn, pump.write_lsn)
            self._wal_end = max(self._wal_end, pump.wal_end)
            pump.detach()
        if source is not None:
            for key, value in source.counters().items():
                self._totals[key] += value
            self._write_lsn = max(self._write_lsn, source.write_lsn)
            self._wal_end = max(self._wal_end, source.wal_end)
            source.detach()
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - the connection is broken already
                pass

    def close(self) -> None:
        """Report the last acknowledged position, end the stream cleanly, disconnect, stop the status thread.

        Replication: a last status update, then CopyDone; what the server still sends is read and dropped until
        it ends the copy too (at most CLOSE_TIMEOUT s), so the update cannot be lost to a connection reset.
        SQL: a running call is cancelled, the slot is advanced to the acknowledged position and the temporary
        cursor slot is dropped. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            if self._pump is not None:
                if not self._pump.finish(CLOSE_TIMEOUT):
                    log.info("slot %s: the server did not end the stream within %s s; disconnecting",
                             self.slot, CLOSE_TIMEOUT)
            elif self._source is not None:
                self._close_sql(self._source)
            self._teardown()
        if self._own_catalog:
            self.type_catalog.close()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=5)
        self._close_beat()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "ReplicationStream":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _close_sql(self, source: SqlSource) -> None:
        acked = self._acked
        try:
            if not source.busy or source.stop(CLOSE_TIMEOUT):
                advanced = source.advance_now()
                source.drop_cursor_slot()
                if advanced:
                    return
        except Exception as exc:  # noqa: BLE001 - the connection is unusable: fall back below
            log.debug("slot %s: final advance on the stream's connection failed: %s", self.slot, exc)
        if acked > source.real_confirmed:
            # the connection cannot take the query: a fresh one moves the slot (the cursor slot goes with the old)
            self._teardown()
            if not advance_slot(self.dsn, self.slot, acked, self._connect_kwargs, timeout=CLOSE_TIMEOUT):
                log.warning("slot %s: could not advance to the acknowledged %s at close", self.slot,
                            format_lsn(acked))

    # ---------------------------------------------------------------------------------------------- reading
    def _reconnect(self, cause: ReplicationError) -> None:
        deadline = None if self.reconnect_timeout is None else time.monotonic() + self.reconnect_timeout
        delay = 0.05
        last: BaseException = cause
        self._teardown()
        log.warning("replication connection lost (%s); resuming from %s", cause, format_lsn(self._acked))
        while not self._closed:
            if deadline is not None and time.monotonic() > deadline:
                raise ConnectionLost(f"could not reconnect within {self.reconnect_timeout} s: {last}") from last
            time.sleep(delay)
            delay = min(delay * 2, self.max_backoff)
            try:
                self._open_once()
            except Exception as exc:  # noqa: BLE001 - sorted below
                err = self._connect_error(exc)
                if not isinstance(err, ConnectionLost) and not _server_unavailable(exc):
                    raise err from exc
                last = err
                continue
            self.reconnects += 1
            # everything handed out but not acknowledged will come again
            self._delivered = self._acked
            return
        raise ReplicationError("the stream was closed while reconnecting")

    @staticmethod
    def _connect_error(exc: BaseException) -> BaseException:
        """ConnectionLost when reconnecting may help, ServerError for a server's refusal, else `exc` itself."""
        import psycopg2

        if isinstance(exc, psycopg2.Error):
            code = getattr(exc, "pgcode", None)
            if code in _RETRYABLE_ON_RECONNECT:
                return ConnectionLost(str(exc).strip(), sqlstate=code)
            if code is not None or isinstance(exc, psycopg2.OperationalError):
                return classify(str(exc), code)
        if isinstance(exc, OSError):
            return ConnectionLost(f"{type(exc).__name__}: {exc}")
        return exc

    def _check_startup(self, data: bytes) -> None:
        """Validate the native startup message (the first frame of every session) before any row is decoded."""
        if len(data) < 12:
            return
        length, _lsn = _FRAME_HEAD.unpack_from(data, 0)
        payload = memoryview(data)[12:12 + length]
        if self.proto_format == "json":
            from ..wire.json_protocol import parse_json_startup_message

            params = parse_json_startup_message(payload)
        else:
            params = parse_startup_message(payload)
        basetypes = int(self.options["binary.basetypes_major_version"]) if self.binary else None
        self.proto_version = check_startup(self.protocol, params, binary_asked=bool(self.binary),
                                           basetypes_major=basetypes,
                                           encoding=self.options.get("expected_encoding"),
                                           internal_asked=self.binary == "internal")
        self.startup_params = params
        self._startup_checked = True

    def _fetch(self, timeout: float) -> tuple[list[Any], int]:
        """One batch: pump, decode, drain. Returns (events, committed LSN after them)."""
        if self._closed:
            raise ReplicationError("the stream is closed")
        with self._lock:
            if not self.connected:
                self._reconnect(ConnectionLost("not connected"))
            try:
                self._settle_idle()
                if self._pending is not None:
                    pending, self._pending = self._pending, None
                    return pending
                if self._pending_error is not None:
                    error, self._pending_error = self._pending_error, None
                    raise error
                if self._source is not None:
                    data = self._source.read(timeout)
                else:
                    data = self._pump.read(timeout)
            except ConnectionLost as exc:
                if not self.reconnect:
                    raise
                self._reconnect(exc)
                return [], self._delivered
            except ServerError:
                raise
            except Exception as exc:  # noqa: BLE001 - psycopg2 errors of the SQL transport's own queries
                err = self._connect_error(exc)
                if err is exc:
                    raise
                if isinstance(err, ConnectionLost) and self.reconnect:
                    self._reconnect(err)
                    return [], self._delivered
                raise err from exc
            if not data:
                return [], self.decoder.committed_lsn
            return self._decode(data)

    def _decode(self, data: bytes) -> tuple[list[Any], int]:
        """Decode one batch of frames and drain the decoder (lock held). Returns (events, committed LSN)."""
        self._batches += 1
        try:
            if not self._startup_checked:
                self._check_startup(data)
            self.decoder.feed_frames(data)
            events = self.decoder.drain()
            if events:
                events = [e for e in events if not is_heartbeat(e)]
        except BaseException:
            self._undecoded = True
            if self._pump is not None:
                self._pump.idle = False
            if self._source is not None:
                # the cursor slot has moved past these rows: read them again from the acknowledged position
                self._teardown()
            raise
        return events, self.decoder.committed_lsn

    def read(self, timeout: float | None = None) -> list[Any]:
        """The committed events decoded from the next batch of frames (waits up to `timeout` s; may be empty).

        All returned events count as handed out: `ack()` afterwards confirms all of them.
        """
        events, lsn = self._fetch(self.read_timeout if timeout is None else timeout)
        self._advance(events, lsn)
        return events

    def _advance(self, events: list[Any], lsn: int) -> None:
        if lsn <= self._delivered:
            return
        if not events and self._acked == self._delivered:
            # nothing new to persist and everything before was confirmed: move on over the empty stretch
            self._delivered = lsn
            self.ack(lsn)
        else:
            self._delivered = lsn

    def __iter__(self) -> Iterator[Any]:
        return self.events()

    def events(self, idle_timeout: float | None = None) -> Iterator[Any]:
        """Events one by one (blocking); stops after `idle_timeout` s without any, or when the stream closes.

        `delivered_lsn` moves when the last event of each decoded batch is handed out, so `ack()` called while
        consuming never confirms an event that has not been handed out yet.
        """
        idle_since = time.monotonic()
        while not self._closed:
            events, lsn = self._fetch(self.read_timeout)
            if not events:
                self._advance(events, lsn)
                if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                    return
                continue
            last = len(events) - 1
            for i, event in enumerate(events):
                if i == last:
                    self._advance(events, lsn)
                yield event
            idle_since = time.monotonic()

    def record_batches(self, idle_timeout: float | None = None) -> Iterator[Any]:
        """The row changes only, as ``pyarrow.RecordBatch`` (truncates and messages are skipped)."""
        for event in self.events(idle_timeout):
            if hasattr(event, "to_arrow"):
                yield event.to_arrow()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("streaming" if self.connected else "disconnected")
        return (f"<ReplicationStream {state} slot={self.slot!r} plugin={self.plugin} transport={self.transport} "
                f"impl={self.impl} acked={format_lsn(self._acked)}>")


#: the Decoder's own defaults of the options `connect` passes on
_DECODER_DEFAULTS: dict[str, Any] = dict(column_types=None, on_unrepresentable="text", types="typed", numeric="decimal")


def _host_of(conn: Any) -> str:
    """The host and port a connection reached (for messages; of a multi-host DSN, the one it connected to)."""
    try:
        return f"{conn.info.host}:{conn.info.port}"
    except Exception:  # noqa: BLE001
        return "?:?"


def connect(dsn: str, *, slot: str, plugin: str = "pgoutput", publication: str | Sequence[str] | None = None,
            replication_sets: str | Sequence[str] | None = None, create_slot: bool = False,
            start_lsn: int | str | None = None, binary: bool | Literal["internal"] = False,
            streaming: bool | str = False, two_phase: bool = False, messages: bool = False,
            proto_version: int | None = None,
            forward_origins: bool = True, extra_options: Mapping[str, str] | None = None,
            status_interval: float = 10.0, reconnect: bool = True, reconnect_timeout: float | None = 300.0,
            max_backoff: float = 5.0, max_batch_bytes: int = 4 << 20, read_timeout: float = 1.0,
            pump: str | ModuleType | None = None, decoder_factory: Callable[[str], Any] | None = None,
            connect_kwargs: Mapping[str, Any] | None = None,
            transport: Literal["replication", "sql"] = "replication",
            sql_batch_changes: int = 4_000_000, type_catalog: Any = "auto", heartbeat_interval: float | None = None,
            sql_split_bytes: int = 16 << 20, proto_format: Literal["native", "json"] = "native",
            failover: bool = False, require_failover_safety: bool = False, start_timeline: int | None = None,
            types: Literal["typed", "raw"] = "typed",
            numeric: Literal["decimal", "text"] = "decimal",
            on_unrepresentable: Literal["text", "error"] = "text",
            column_types: Mapping[str, Literal["text", "raw"]] | None = None) -> ReplicationStream:
    """Open a replication stream on `slot` and return it, streaming. See :class:`ReplicationStream`.

    * `plugin`: "pgoutput", "pglogical" (``pglogical_output``) or "spock" (``spock_output``).
    * `publication` (pgoutput; a name or a list) or `replication_sets` (pglogical/spock; default "default").
    * `create_slot`: create the slot first when it does not exist.
    * `start_lsn`: resume position (int or ``"X/Y"``); the server starts at its confirmed position if later.
    * pgoutput only: `binary`, `streaming` (transactions larger than logical_decoding_work_mem arrive while in
      progress), `two_phase` (prepared transactions), `messages` (pg_logical_emit_message), `proto_version`
      (default: the highest the server speaks).
    * pglogical/spock: `binary` (send/recv format; ``"internal"``: internal datums where the server sends them,
      negotiated like Spock's own subscriber), `forward_origins` (default True). With pgoutput,
      ``forward_origins=False`` sends ``origin 'none'`` (PostgreSQL 16+): changes replicated from elsewhere (those
      with a replication origin) are left out.
    * `transport`: "replication" (default: walsender connection, low latency, keepalives) or "sql" (an ordinary
      connection reading the slot with the SQL functions: catch-up throughput; `sql_batch_changes` = changes per
      call, default 4,000,000; `sql_split_bytes`: a backlog of at least this much WAL, default 16 MiB, is decoded
      as two halves side by side by two server backends, 0: never). The events and the acknowledgement rules are
      the same.
    * `proto_format` (pglogical/spock): "native" (default) or "json", the plugins' JSON protocol (a diagnostics
      format; decoded into the same events, with the change columns it does not carry left null:
      docs/connection.md, "The JSON protocol").
    * `extra_options`: more START_REPLICATION options, sent as given.
    * tuning: `status_interval` (10 s; sql: how often acknowledged positions move the slot), `reconnect` (True),
      `reconnect_timeout` (300 s; None: forever), `max_backoff` (5 s), `max_batch_bytes` (4 MiB), `read_timeout`
      (1 s; sql: the longest pause between polls when idle), `pump` ("c" | "python"; default: as the decoder),
      `connect_kwargs` (passed to psycopg2.connect).
    * `heartbeat_interval`: write a heartbeat (a non-transactional logical message) this often, so the slot moves
      even when the server writes nothing at all (default None: never).
    * `decoder_factory`: ``factory(protocol) -> Decoder`` to build the decoder yourself.
    * `type_catalog`: where column types the stream does not carry come from (pglogical/spock send none; enums,
      composites and user ranges are named only by the catalog). Default "auto": a PostgresTypeCatalog read over
      `dsn` (one extra ordinary connection, opened at the first relation that needs it); None: no catalog
      (pglogical columns then stay untyped); or any TypeCatalog. Ignored with a `decoder_factory`.
    * decoder options (not with a `decoder_factory`): `types` ("typed" | "raw"), `numeric` ("decimal" | "text"),
      `on_unrepresentable` ("text" | "error"), `column_types` ({"schema.table.column": "text" | "raw"}) -- see
      spockwire.Decoder.
    * high availability (docs/high-availability.md): `failover` makes the slot a failover slot (PostgreSQL 17+:
      created so, or an idle one switched over), and checks at the start and after each reconnect that a standby
      would hold it (a warning; `require_failover_safety`: FailoverUnsafe). Give a multi-host `dsn` (``host=a,b
      target_session_attrs=read-write``) to reconnect to whichever is the primary. `start_timeline`: the timeline
      `start_lsn` was read on (``stream.timeline``, persisted with the position): a server whose history left that
      timeline before `start_lsn` raises TimelineDiverged, at the start or after a reconnect.
    """
    given = dict(column_types=column_types, on_unrepresentable=on_unrepresentable, types=types, numeric=numeric)
    options = {k: v for k, v in given.items() if v != _DECODER_DEFAULTS[k]}
    if options and decoder_factory is not None:
        raise ValueError(f"{', '.join(options)} cannot be combined with a decoder_factory (pass them to it)")
    stream = ReplicationStream(dsn, slot=slot, plugin=plugin, publication=publication,
                               replication_sets=replication_sets, create_slot=create_slot, start_lsn=start_lsn,
                               binary=binary, streaming=streaming, two_phase=two_phase, messages=messages,
                               proto_version=proto_version, forward_origins=forward_origins,
                               extra_options=extra_options, status_interval=status_interval, reconnect=reconnect,
                               reconnect_timeout=reconnect_timeout, max_backoff=max_backoff,
                               max_batch_bytes=max_batch_bytes, read_timeout=read_timeout, pump=pump,
                               decoder_factory=decoder_factory, connect_kwargs=connect_kwargs, transport=transport,
                               sql_batch_changes=sql_batch_changes, type_catalog=type_catalog,
                               heartbeat_interval=heartbeat_interval, sql_split_bytes=sql_split_bytes,
                               proto_format=proto_format, failover=failover,
                               require_failover_safety=require_failover_safety, start_timeline=start_timeline)
    if options:
        stream._decoder_factory = lambda p: _default_decoder_factory(p, stream.type_catalog, proto_format,
                                                                     **options)
    try:
        stream._open_first()
    except Exception as exc:
        stream.close()
        err = stream._connect_error(exc)
        if err is exc:
            raise
        raise err from exc
    stream.open()
    return stream
