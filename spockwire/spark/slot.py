"""Reading a replication slot through the SQL interface, by LSN range, replayably.

Offsets are LSNs. The range ``[start, end)`` holds the transactions whose commit LSN is at or after `start` and
before `end`. :func:`read_range` peeks the slot (``pg_logical_slot_peek_binary_changes(slot, end, ...)``, which
does not move it), decodes what comes back and keeps exactly the transactions of the range, so reading a range
twice gives the same rows. :func:`advance_slot` moves the slot (``pg_replication_slot_advance``) once the rows of
everything before an LSN are durable downstream: after ``advance_slot(end)`` the server may forget them.

This module needs no Spark: the Spark data source calls it on the driver (planning) and on executors (reading).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..connection.ddl_capture import PREFIX as DDL_PREFIX, parse_message
from ..connection.errors import ConnectionLost
from ..connection.options import native_options, pgoutput_options, plugin_protocol
from ..connection.slots import SLOT_PLUGIN, create_slot_errors, format_lsn, parse_lsn
from ..connection.stream import load_pump
from ..errors import SpockwireError
from ..model import ChangeBatch, LogicalMessage, Truncate, epoch_micros
from . import schema as S

__all__ = ["SlotSpec", "SlotAheadError", "make_decoder", "read_range", "advance_slot", "slot_position",
           "plan_end", "Plan", "ReusedConnection", "pooled_connection", "decoder_types_supported",
           "IDLE_ADVANCE_BYTES", "IDLE_ADVANCE_SECONDS", "PLAN_WINDOW_BYTES", "SPLIT_WAL_BYTES", "split_range",
           "drop_stale_range_copies",
           "with_password", "refuse_password_in_dsn"]

#: rows fetched from the server per round trip while reading a range (kept for the signature; the read is a COPY)
FETCH_ROWS = 2000
#: frame records handed to the decoder at a time while reading a range
COPY_BATCH_BYTES = 4 << 20
#: WAL without output for the stream after which an empty range moves the slot on (one WAL segment)
IDLE_ADVANCE_BYTES = 16 << 20
#: ... or after this many seconds of plannings that found only WAL without output (a quiet server)
IDLE_ADVANCE_SECONDS = 10.0


def with_password(dsn: str, password: str | None) -> str:
    """The libpq connection string to connect with: `dsn` plus `password` (kept apart until the connection is
    made, so that the password never shows where the dsn does)."""
    if not password:
        return dsn
    from psycopg2.extensions import make_dsn

    return make_dsn(dsn, password=password)


def refuse_password_in_dsn(dsn: str, where: str = "the dsn option",
                           instead: str = "the source's password option (redacted by Spark)") -> None:
    """Raise ValueError when `dsn` holds a password (``password=...`` or ``postgresql://user:secret@...``): a
    dsn is shown in query plans and logs, a password has paths of its own (the source's `password` option, which
    Spark redacts, PGPASSFILE or PGPASSWORD). The message never repeats the dsn."""
    from psycopg2 import ProgrammingError
    from psycopg2.extensions import parse_dsn

    try:
        keys = parse_dsn(dsn)
    except ProgrammingError:    # not parsable: libpq's error would quote a piece of it
        keys = {"password": "password" in dsn.lower()}
    if keys.get("password"):
        raise ValueError(f"{where} holds a password: remove it from the connection string and give it with "
                         f"{instead}, a password file (PGPASSFILE) or PGPASSWORD")


class SlotAheadError(SpockwireError):
    """The slot was advanced past the start of a range still to be read: its changes are gone upstream."""


@dataclass(frozen=True)
class SlotSpec:
    """Where and how to read: connection, slot, plugin and the plugin options that shape the stream."""

    dsn: str
    slot: str
    plugin: str = "pgoutput"
    publication: tuple[str, ...] = ()
    replication_sets: tuple[str, ...] = ()
    binary: bool = False
    proto_version: int | None = None
    types: str = "auto"
    extra_options: Mapping[str, str] = field(default_factory=dict)
    column_types: Mapping[str, str] = field(default_factory=dict)   # decoder column_types overrides
    on_unrepresentable: str = "text"
    password: str | None = field(default=None, repr=False)   # kept out of `dsn`: see with_password

    @property
    def conninfo(self) -> str:
        """What to connect with: `dsn` and the password."""
        return with_password(self.dsn, self.password)

    @property
    def protocol(self) -> str:
        return plugin_protocol(self.plugin)

    def plugin_options(self, server_version_num: int, server_encoding: str | None = None) -> dict[str, str]:
        """The options passed to the output plugin (variadic text pairs of the SQL interface).

        `server_encoding`: the database's encoding (pglogical/spock send text in it, see `native_options`)."""
        if self.protocol == "pgoutput":
            if not self.publication:
                raise ValueError("plugin pgoutput needs the publication option")
            opts = pgoutput_options(server_version_num, list(self.publication), proto_version=self.proto_version,
                                    binary=self.binary)
        else:
            opts = native_options(self.plugin, server_version_num,
                                  replication_sets=list(self.replication_sets) or None, binary=self.binary,
                                  encoding=server_encoding)
        opts.update({str(k): str(v) for k, v in self.extra_options.items()})
        return opts


def decoder_types_supported() -> bool:
    """Whether the loaded decoder has the typed-values option (`types=`)."""
    import spockwire

    try:
        spockwire.Decoder("pgoutput", types="raw")
    except TypeError:
        return False
    return True


def make_decoder(protocol: str, types: str = "auto", catalog: Any = None, column_types: Any = None,
                 on_unrepresentable: str = "text") -> Any:
    """A Decoder for `protocol`; typed values when the decoder has them (``types`` = auto | typed | raw).

    ``auto`` asks for typed values and falls back to raw columns on a decoder without the option; ``typed``
    insists; ``raw`` keeps PostgreSQL's text (or binary) form. `column_types` and `on_unrepresentable` are the
    decoder's options of the same names (the data source options columnTypes and onUnrepresentable).
    """
    import spockwire

    extra: dict[str, Any] = {}
    if column_types:
        extra["column_types"] = dict(column_types)
    if on_unrepresentable != "text":
        extra["on_unrepresentable"] = on_unrepresentable

    def new(**kwargs: Any) -> Any:
        return spockwire.Decoder(protocol, **kwargs, **extra)

    if types not in ("auto", "typed", "raw"):
        raise ValueError(f"types must be auto, typed or raw, not {types!r}")
    if types == "raw":
        if decoder_types_supported():
            return new(types="raw")
        return new()
    attempts: list[dict[str, Any]] = []
    if catalog is not None:
        attempts.append({"types": "typed", "type_catalog": catalog})
    attempts.append({"types": "typed"})
    for kwargs in attempts:
        try:
            return new(**kwargs)
        except TypeError:
            continue
    if types == "typed":
        raise ValueError("types=typed was asked for, but this spockwire decoder has no typed-values option")
    return new()


@contextlib.contextmanager
def _connect(dsn: str, autocommit: bool = True) -> Iterator[Any]:
    conn = _open(dsn, autocommit)
    try:
        yield conn
    finally:
        conn.close()


def _open(dsn: str, autocommit: bool = True) -> Any:
    from ..connection.session import pinned_connect

    conn = pinned_connect(dsn, application_name="spockwire-spark")
    conn.autocommit = autocommit
    return conn


def _broken(exc: BaseException) -> bool:
    """Whether `exc` says the connection itself is gone (rather than a statement failed)."""
    import psycopg2

    return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))


class ReusedConnection:
    """One connection kept across calls (the stream reader's planning on the driver; an executor's reads of one
    dsn): opened at the first use, and again after it broke. Idle between calls, it holds no slot: a backend holds
    the slot only while one of the slot functions runs."""

    def __init__(self, dsn: str, autocommit: bool = True) -> None:
        self.dsn = dsn
        self.autocommit = autocommit
        self._conn: Any = None
        self.opened = 0          # connections opened so far (tests: reuse across micro-batches)
        self.last_used = 0.0
        self.busy = False        # handed out by pooled_connection

    def __getstate__(self) -> dict[str, Any]:     # a reader pickled to the executors takes no connection along
        return {**self.__dict__, "_conn": None, "busy": False}

    def get(self) -> tuple[Any, bool]:
        """(connection, whether it was used before): a used one may have broken while idle."""
        import time

        self.last_used = time.monotonic()
        if self._conn is not None and not self._conn.closed:
            return self._conn, True
        self._conn = _open(self.dsn, self.autocommit)
        self.opened += 1
        return self._conn, False

    def run(self, call: Callable[[Any], Any]) -> Any:
        """`call(connection)`; once more on a new connection when a used one turns out to be broken (`call` must
        be safe to repeat: planning and advancing are)."""
        conn, reused = self.get()
        try:
            return call(conn)
        except Exception as exc:
            if not _broken(exc):
                raise
            self.close()
            if not reused:
                raise
        conn, _ = self.get()
        try:
            return call(conn)
        except Exception as exc:
            if _broken(exc):
                self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


#: connections an executor process keeps for its reads, one per dsn, at most this many dsns (least recently used
#: closed first); one idle longer than POOL_IDLE_SECONDS is closed when the next read starts
POOL_SIZE = 4
POOL_IDLE_SECONDS = 300.0
_POOL: dict[str, ReusedConnection] = {}
_POOL_LOCK = threading.Lock()


@contextlib.contextmanager
def pooled_connection(dsn: str) -> Iterator[ReusedConnection]:
    """This process's connection for reading ranges of `dsn` (Spark reuses its Python workers across tasks);
    a connection of its own, closed at the end, while that one is in use."""
    import time

    with _POOL_LOCK:
        now = time.monotonic()
        for key, held in list(_POOL.items()):
            if key != dsn and now - held.last_used > POOL_IDLE_SECONDS and not held.busy:
                held.close()
                del _POOL[key]
        reused = _POOL.pop(dsn, None) or ReusedConnection(dsn, autocommit=False)
        _POOL[dsn] = reused                  # most recently used last
        for key in [k for k, held in _POOL.items() if k != dsn and not held.busy][:max(0, len(_POOL) - POOL_SIZE)]:
            _POOL.pop(key).close()
        own = reused.busy
        if own:
            reused = ReusedConnection(dsn, autocommit=False)
        reused.busy = True
    try:
        yield reused
    finally:
        reused.busy = False
        if own:
            reused.close()


def _variadic(opts: Mapping[str, str]) -> list[str]:
    flat: list[str] = []
    for k, v in opts.items():
        flat += [k, v]
    return flat


def slot_position(cur: Any, slot: str) -> tuple[int, str] | None:
    """(confirmed_flush_lsn, plugin) of a logical slot, or None when it does not exist."""
    cur.execute("SELECT confirmed_flush_lsn::text, plugin FROM pg_replication_slots "
                "WHERE slot_name = %s AND slot_type = 'logical'", (slot,))
    row = cur.fetchone()
    if row is None:
        return None
    return parse_lsn(row[0]), row[1]


#: how long a reader waits for a slot another backend still holds (the backend of a killed driver keeps it until
#: the server notices the client is gone)
SLOT_BUSY_WAIT = 120.0


def _wait_released(cur: Any, spec: SlotSpec, timeout: float | None = None) -> None:
    """Wait until no backend holds the slot: after a driver was killed mid-read, its server backend keeps the slot
    active until it notices the client is gone (at its next write to the socket). Raises the server's own error
    (by acquiring the slot) when it stays held."""
    import time

    deadline = time.monotonic() + (SLOT_BUSY_WAIT if timeout is None else timeout)
    while time.monotonic() < deadline:
        cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (spec.slot,))
        row = cur.fetchone()
        if row is None or row[0] is None:
            return
        time.sleep(0.1)


def _require_slot(cur: Any, spec: SlotSpec) -> int:
    pos = slot_position(cur, spec.slot)
    if pos is None:
        raise ValueError(f"replication slot {spec.slot!r} does not exist (create it, or set createSlot=true)")
    confirmed, plugin = pos
    want = SLOT_PLUGIN.get(spec.plugin, spec.plugin)
    if plugin != want and not want.startswith(plugin):
        raise ValueError(f"replication slot {spec.slot!r} uses the output plugin {plugin!r}, not {want!r}")
    return confirmed


def ensure_slot(spec: SlotSpec, failover: bool = False) -> int:
    """Create the slot if missing (`failover`: a failover slot, PostgreSQL 17+); return its confirmed position."""
    with _connect(spec.conninfo) as conn, conn.cursor() as cur:
        pos = slot_position(cur, spec.slot)
        if pos is None:
            library = SLOT_PLUGIN.get(spec.plugin, spec.plugin)
            if failover:
                from ..connection.slots import require_failover_version

                require_failover_version(conn.server_version)
            with create_slot_errors(conn, library):
                cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, false, false"
                            + (", true)" if failover else ")"), (spec.slot, library))
                return parse_lsn(cur.fetchone()[0])
        return _require_slot(cur, spec)


def make_failover_slot(spec: SlotSpec, conn: Any) -> bool:
    """Switch the slot to a failover slot unless it is one (PostgreSQL 17+); False when it is busy now (a reader
    holds it: try again later)."""
    import psycopg2

    from ..connection.slots import require_failover_version, set_failover_slot

    require_failover_version(conn.server_version)
    with conn.cursor() as cur:
        cur.execute("SELECT failover, active FROM pg_replication_slots WHERE slot_name = %s", (spec.slot,))
        row = cur.fetchone()
    if row is None or row[0]:
        return True
    if row[1]:
        return False
    try:
        set_failover_slot(spec.conninfo, spec.slot)
    except psycopg2.errors.ObjectInUse:
        return False
    return True


#: writes out every WAL record inserted before it, and nothing a stream receives: a transaction with an id and a
#: WAL record of its own commits synchronously (locally: a synchronous standby that is down must not hold it up);
#: its record is a non-transactional logical message, which pgoutput passes on only with its `messages` option
#: and spock only with its own prefix, and the transaction has no change, so no plugin sends it
_FLUSH_WAL = ("BEGIN; SET LOCAL synchronous_commit = local; SELECT txid_current(); "
              "SELECT pg_logical_emit_message(false, 'spockwire', ''); COMMIT")


def decodable_wal_end(cur: Any) -> int:
    """Where the server's WAL ends for a peek: a position every WAL record before which is written out, and at the
    end of a record, so that a peek up to it does not wait.

    The flush LSN alone is not that. The server writes WAL out a page at a time as transactions commit; a record
    that commits nothing (a page's pruning, a snapshot of the running transactions, a non-transactional message)
    stays in a page not yet written until the next commit (or until the WAL writer writes the page by itself,
    seconds later), and the flush LSN can fall inside such a record, at the page boundary. A peek up to a point
    inside a record waits until the record's end is written: 0.7-3.5 s in 9 of 53 reads of a 500,000-change
    backlog on a quiet server (the backlog's pages pruned by a read of the table). So when WAL was inserted beyond the flush LSN, a transaction
    that writes all of it out is committed (`_FLUSH_WAL`), and the insert LSN read before it (the end of the last
    record then) is the answer. `cur`: a cursor of a connection in autocommit mode."""
    cur.execute("SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text")
    insert, flush = (parse_lsn(v) for v in cur.fetchone())
    if insert <= flush:
        return flush
    cur.execute(_FLUSH_WAL)
    return insert


_STANDBY_BOUND = """
SELECT s.failover, current_setting('synchronized_standby_slots', true),
       (SELECT array_agg(p.slot_name || '=' || coalesce(p.restart_lsn::text, ''))
          FROM pg_replication_slots p
         WHERE p.slot_type = 'physical'
           AND p.slot_name = ANY(string_to_array(replace(current_setting('synchronized_standby_slots', true),
                                                         ' ', ''), ',')))
  FROM pg_replication_slots s WHERE s.slot_name = %s"""


_WARNED_MISSING: set[tuple[str, ...]] = set()


def standby_bound(cur: Any, slot: str) -> int | None:
    """Where a failover slot may be read to: the WAL every physical standby slot the primary's
    ``synchronized_standby_slots`` names has confirmed (the position its standby flushed), as PostgreSQL's own
    senders wait for before they send a change. None when there is no such bound (not a failover slot, the setting
    empty, PostgreSQL before 17); a named slot that does not exist or holds no position bounds it at 0, with one
    warning (the server itself then holds every advance and read of the slot back)."""
    if cur.connection.server_version < 170000:
        return None
    cur.execute(_STANDBY_BOUND, (slot,))
    row = cur.fetchone()
    if row is None or not row[0] or not (row[1] or "").strip():
        return None
    names = [n.strip() for n in row[1].split(",") if n.strip()]
    found = dict(item.split("=", 1) for item in row[2] or [])
    missing = [n for n in names if not found.get(n)]
    if missing:
        if tuple(missing) not in _WARNED_MISSING:
            _WARNED_MISSING.add(tuple(missing))
            logging.getLogger("spockwire.spark").warning(
                "slot %s: synchronized_standby_slots names %s, which the primary has no physical slot with a "
                "position for: no change is read until it has (as PostgreSQL's own senders wait)", slot,
                ", ".join(missing))
        return 0
    return min(parse_lsn(found[n]) for n in names)


def advance_slot(spec: SlotSpec, lsn: int, connection: ReusedConnection | None = None) -> int:
    """Move the slot forward to `lsn` (never backward); return its new confirmed position. `connection`: the
    connection to use (kept by the caller); a new one otherwise."""
    def advance(conn: Any) -> int:
        with conn.cursor() as cur:
            return _advance(cur, spec, lsn)

    if connection is not None:
        return connection.run(advance)
    with _connect(spec.conninfo) as conn:
        return advance(conn)


def _advance(cur: Any, spec: SlotSpec, lsn: int) -> int:
    confirmed = _require_slot(cur, spec)
    if lsn > confirmed:
        _wait_released(cur, spec)
        cur.execute("SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                    (spec.slot, format_lsn(lsn)))
        confirmed = parse_lsn(cur.fetchone()[0])
    return confirmed


def _peek_sql(spec: SlotSpec, select: str) -> str:
    return (f"SELECT {select} FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            f"VARIADIC %s::text[])")


#: the WAL the planning of a micro-batch peeks for output (the part of a range the server decodes twice: for the
#: planning and again for the executor's read)
PLAN_WINDOW_BYTES = 1 << 20
#: when that window has no output: how far one planning looks for the first transaction with output (decoded by the
#: planning only: an empty range is not read again)
PLAN_SCAN_BYTES = 64 << 20
#: maxChangesPerBatch: the planning's sample is this fraction of the count (WAL bytes per message estimated from it)
PLAN_SAMPLE_FRACTION = 10
#: the fewest WAL bytes an estimate takes per plugin message (a WAL record's header alone is 24 bytes)
MIN_BYTES_PER_MESSAGE = 24


@dataclass(frozen=True)
class Plan:
    """The end chosen for the next range and what the planning saw.

    `messages`: the plugin messages the planning's peek counted (a sample, not the range's count); `empty`: the
    peek saw the whole range and it holds no output for the stream (no task needs to read it); `estimated`: the
    end comes from maxChangesPerBatch's estimate of WAL bytes per message."""

    end: int
    flush: int
    messages: int
    empty: bool = False
    estimated: bool = False


@dataclass(frozen=True)
class _Sample:
    """What one bounded peek saw: its plugin messages, the LSN of its first one and the end of its last commit."""

    count: int
    first: int
    last: int
    complete: bool      # fewer messages than asked for: the peek saw everything up to its `upto`


def _peek_sample(cur: Any, spec: SlotSpec, opts: Mapping[str, str], upto: int, nchanges: int) -> _Sample | None:
    """Peek the slot up to `upto`, stopping after the transaction that reaches `nchanges` messages; None when
    nothing came out. The peek returns whole transactions, so the last row is a commit."""
    cur.execute(_peek_sql(spec, "count(*), min(lsn)::text, max(lsn)::text"),
                (spec.slot, format_lsn(upto), nchanges, _variadic(opts)))
    count, first, last = cur.fetchone()
    if not count:
        return None
    return _Sample(int(count), parse_lsn(first), parse_lsn(last), int(count) < nchanges)


def plan_end(spec: SlotSpec, start: int, *, max_messages: int | None = None, max_wal_bytes: int | None = None,
             until: int | None = None, idle_advance_bytes: int | None = None,
             connection: ReusedConnection | None = None) -> Plan:
    """Choose the end of the range that starts at `start` (the end of everything already durable downstream).

    The slot is first advanced to `start` (the caller guarantees everything before it is durable). The range's
    bound is the server's flush LSN, `until` (Trigger.AvailableNow) and ``start + max_wal_bytes``, whichever comes
    first. To know whether anything in it has output for the stream, and how dense that output is, the planning
    peeks only a window of PLAN_WINDOW_BYTES from `start` (``upto_nchanges``: it stops after the first transaction
    with output, or after a tenth of `max_messages`): the executor that reads the range decodes it again, so the
    server decodes each range once plus at most that window.

    * output in the window: `end` is the bound; with `max_messages`, about that many messages: the WAL bytes per
      message are estimated from the sample (``(end of its last commit - start) / its messages``) and `end` is
      ``start + max_messages * that`` (Spark needs a batch's end before any executor reads it, and an exact count
      would need the server to decode the range; whole transactions only). When the sample already reached
      `max_messages`, `end` is the end of the transaction that reached it.
    * no output in the window but WAL beyond it: the planning looks up to PLAN_SCAN_BYTES further for the first
      transaction with output; the range before it (or the WAL scanned, when none) is an empty range
      (`Plan.empty`) that moves the slot on.
    * no output up to the bound: `end` is `start` (no new range) -- unless more than `idle_advance_bytes` (default
      IDLE_ADVANCE_BYTES) of WAL went by, or the bound is max_wal_bytes', when an empty range moves the slot on,
      so the server can recycle that WAL. ``idle_advance_bytes=0``: any WAL without output up to the bound is an
      empty range (the stream reader's choice after a range that ended short of the flush).

    `connection`: the connection to plan over (kept by the caller across micro-batches); a new one otherwise.
    """
    if idle_advance_bytes is None:
        idle_advance_bytes = IDLE_ADVANCE_BYTES

    def plan(conn: Any) -> Plan:
        with conn.cursor() as cur:
            return _plan(conn, cur, spec, start, max_messages, max_wal_bytes, until, idle_advance_bytes)

    if connection is not None:
        return connection.run(plan)
    with _connect(spec.conninfo) as conn:
        return plan(conn)


def _plan(conn: Any, cur: Any, spec: SlotSpec, start: int, max_messages: int | None, max_wal_bytes: int | None,
          until: int | None, idle_advance_bytes: int) -> Plan:
    drop_stale_range_copies(cur, spec.slot)     # every earlier batch is committed: no read runs
    standby = standby_bound(cur, spec.slot)     # (before the advance, which the server holds back for it too)
    _advance(cur, spec, start)
    flush = decodable_wal_end(cur)
    upto = flush
    if until is not None:
        upto = min(upto, until)
    if standby is not None:         # never ahead of the standbys a failover would promote
        upto = min(upto, standby)
    if max_wal_bytes:
        upto = min(upto, start + max(1, int(max_wal_bytes)))
    if upto <= start:
        return Plan(start, flush, 0)
    wanted = max(1, int(max_messages)) if max_messages else None
    nchanges = -(-wanted // PLAN_SAMPLE_FRACTION) if wanted else 1
    opts = spec.plugin_options(conn.server_version, conn.get_parameter_status("server_encoding"))
    _wait_released(cur, spec)
    window = min(upto, start + PLAN_WINDOW_BYTES)
    sample = _peek_sample(cur, spec, opts, window, nchanges)
    if sample is None and window < upto:
        # nothing for the stream in the window: find the first transaction with output further on
        window = min(upto, start + max(PLAN_SCAN_BYTES, idle_advance_bytes))
        sample = _peek_sample(cur, spec, opts, window, 1)
        if sample is None and window < upto:
            return Plan(window, flush, 0, empty=True)
        if sample is not None and sample.first > start:
            return Plan(sample.first, flush, 0, empty=True)   # nothing commits before its first message
    if sample is None:
        bounded = upto < flush and (until is None or upto < until)   # max_wal_bytes cut the range
        if bounded or upto - start >= idle_advance_bytes:
            return Plan(upto, flush, 0, empty=True)
        return Plan(start, flush, 0)
    if wanted is None:
        return Plan(upto, flush, sample.count)
    if sample.count >= wanted:
        return Plan(max(start, sample.last), flush, sample.count)
    if sample.complete and window >= upto:
        return Plan(upto, flush, sample.count)                  # everything up to the bound was in the sample
    per_message = max(MIN_BYTES_PER_MESSAGE, (sample.last - start) / sample.count)
    end = max(sample.last, min(upto, start + int(wanted * per_message)))
    return Plan(end, flush, sample.count, estimated=True)


def _truncate_batch(event: Truncate, table: str) -> pa.RecordBatch:
    from ..export.arrow import change_fields, repeated

    fields = change_fields()
    micros = None if event.commit_ts is None else epoch_micros(event.commit_ts)
    # from buffers: a Python list through pa.array would import pandas into the worker (export.arrow.repeated)
    arrays = [repeated("truncate", 1, pa.string()), repeated(event.commit_lsn, 1, pa.uint64()),
              repeated(micros, 1, pa.timestamp("us", tz="UTC")), repeated(event.xid, 1, pa.uint32()),
              repeated(event.seq, 1, pa.int64()), repeated(event.origin, 1, pa.string()),
              pa.nulls(1, pa.list_(pa.string()))]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata={b"spockwire.relation":
                                                                                 table.encode()}))


def _ddl_table(content: bytes) -> str | None:
    try:
        return str(parse_message(content)["table"])
    except (ValueError, KeyError, TypeError):
        return None          # not a message of the capture's format: nothing of it reaches a table


def _ddl_batch(event: LogicalMessage, table: str) -> pa.RecordBatch:
    """A captured ALTER TABLE (connection/ddl_capture.py) as one row of change columns, ``_change_type`` ``ddl``,
    at its place in the table's changes; the statement's outcome (the table's columns after it) in the schema
    metadata (:data:`spockwire.spark.schema.DDL_METADATA`). No transaction id: it is no change of a row."""
    from ..export.arrow import change_fields, repeated

    arrays = [repeated("ddl", 1, pa.string()), repeated(event.commit_lsn, 1, pa.uint64()),
              repeated(0, 1, pa.timestamp("us", tz="UTC")), pa.nulls(1, pa.uint32()),
              repeated(event.seq, 1, pa.int64()), pa.nulls(1, pa.string()), pa.nulls(1, pa.list_(pa.string()))]
    meta = {b"spockwire.relation": table.encode(), S.DDL_METADATA: bytes(event.content)}
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(change_fields(), metadata=meta))


def column_description(relation: Any) -> bytes:
    """The relation's columns as JSON: name, type OID, type modifier and key flag of each (what tells a schema
    change that the Arrow types alone do not show: a type of the same Arrow type, a new key)."""
    import json

    return json.dumps([[c.name, c.type_oid, c.type_modifier, bool(c.is_key)] for c in relation.columns],
                      separators=(",", ":")).encode()


def described(batch: pa.RecordBatch, relation: Any) -> pa.RecordBatch:
    """`batch` with its relation's column description in its schema metadata (no data copied)."""
    meta = dict(batch.schema.metadata or {})
    meta[S.COLUMNS_METADATA] = column_description(relation)
    return batch.replace_schema_metadata(meta)


def select_events(events: Sequence[Any], tables: Sequence[str] | None, start: int, end: int | None
                  ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """(table, record batch) for the rows and truncates of `tables` committed in ``[start, end)``.

    A truncate comes out as a one-row batch of change columns only, with ``_change_type`` = ``truncate``.
    """
    wanted = None if tables is None else set(tables)
    for event in events:
        if isinstance(event, ChangeBatch):
            name = event.relation.qualified_name
            if wanted is not None and name not in wanted:
                continue
            batch = event.to_arrow()
            lsn = batch.column(1)
            lo = pc.min(lsn).as_py()
            hi = pc.max(lsn).as_py()
            if lo is None or hi < start or (end is not None and lo >= end):
                continue
            if lo < start or (end is not None and hi >= end):
                keep = pc.greater_equal(lsn, pa.scalar(start, pa.uint64()))
                if end is not None:
                    keep = pc.and_(keep, pc.less(lsn, pa.scalar(end, pa.uint64())))
                batch = batch.filter(keep)
                if batch.num_rows == 0:
                    continue
            yield name, described(batch, event.relation)
        elif isinstance(event, Truncate):
            if event.commit_lsn < start or (end is not None and event.commit_lsn >= end):
                continue
            for rel in event.relations:
                if wanted is None or rel.qualified_name in wanted:
                    yield rel.qualified_name, _truncate_batch(event, rel.qualified_name)
        elif isinstance(event, LogicalMessage) and event.prefix == DDL_PREFIX and event.commit_lsn is not None:
            if event.commit_lsn < start or (end is not None and event.commit_lsn >= end):
                continue
            table = _ddl_table(event.content)
            if table is not None and (wanted is None or table in wanted):
                yield table, _ddl_batch(event, table)


def read_range(spec: SlotSpec, start: int, end: int, tables: Sequence[str] | None = None, *,
               catalog: Any = None, fetch_rows: int = FETCH_ROWS,
               from_copy: bool = False) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Decode the slot's transactions committed in ``[start, end)``; yield (table, record batch) in commit order.

    Replayable: the slot is only peeked. Raises SlotAheadError when the slot was already advanced beyond
    `start` (those changes can no longer be read). Reads over this process's connection for the dsn
    (`pooled_connection`: Spark reuses its Python workers, so the micro-batches of a stream share one), opened
    again when it broke while idle.

    `from_copy`: peek a copy of the slot advanced to `start` instead (the second half of a split range, see
    `split_range`), dropped at the end; the slot itself when no more slots can be created.
    """
    if end <= start:
        return
    if from_copy:
        with _range_copy(spec, start) as copy:
            yield from read_range(copy, start, end, tables, catalog=catalog, fetch_rows=fetch_rows)
        return
    protocol = spec.protocol
    if catalog is None and spec.types != "raw":
        catalog = _catalog(spec.conninfo)
    decoder = make_decoder(protocol, spec.types, catalog, spec.column_types, spec.on_unrepresentable)
    with pooled_connection(spec.conninfo) as held:
        conn, opts = held.run(lambda conn: _prepare_read(conn, spec, start))
        # the peek's rows come as a binary COPY that the pump turns into frame records for the decoder (psycopg2's
        # row-by-row bytea conversion cost more than the server's decoding)
        pump = load_pump().CopyPump(conn.pgconn_ptr, max_batch_bytes=COPY_BATCH_BYTES)
        try:
            with conn.cursor() as cur:
                query = cur.mogrify(f"COPY ({_peek_sql(spec, 'lsn, data')}) TO STDOUT (FORMAT binary)",
                                    (spec.slot, format_lsn(end), None, _variadic(opts)))
            pump.start(query)
            while pump.active:
                data = pump.read(1.0)
                if data:
                    decoder.feed_frames(data)
                    yield from select_events(decoder.drain(), tables, start, end)
            conn.rollback()
        except BaseException as exc:       # GeneratorExit included: the connection goes back without a COPY or a
            broken = _broken(exc) or isinstance(exc, ConnectionLost)      # transaction running
            if not broken and pump.active:
                broken = not pump.cancel()
            if broken:
                held.close()
            else:
                try:
                    conn.rollback()
                except Exception:  # noqa: BLE001 - not reusable then
                    held.close()
            raise
        finally:
            pump.detach()
    yield from select_events(decoder.drain(), tables, start, end)


def _prepare_read(conn: Any, spec: SlotSpec, start: int) -> tuple[Any, dict[str, str]]:
    """Check that the slot has not passed `start` and wait until no other backend holds it; (conn, plugin
    options). Leaves no transaction open when it fails."""
    try:
        with conn.cursor() as cur:
            confirmed = _require_slot(cur, spec)
            if confirmed > start:
                raise SlotAheadError(
                    f"replication slot {spec.slot!r} is at {format_lsn(confirmed)}, past the start "
                    f"{format_lsn(start)} of the range to read: the changes in between are no longer available "
                    "(was the slot advanced by another consumer, or the checkpoint restored from an older copy?)")
            opts = spec.plugin_options(conn.server_version, conn.get_parameter_status("server_encoding"))
            _wait_released(cur, spec)
    except Exception as exc:
        if not _broken(exc):
            conn.rollback()
        raise
    return conn, opts


#: a range over at least this much WAL is read as two partitions side by side (the data source option
#: splitWalBytes; 0: never)
SPLIT_WAL_BYTES = 16 << 20
#: in the name of a slot's temporary copies (``<slot>_swspk_<random>``) that the second halves of split ranges read
RANGE_COPY_INFIX = "_swspk_"


def split_range(start: int, end: int, split_bytes: int = SPLIT_WAL_BYTES) -> list[tuple[int, int, bool]]:
    """The reads of the range ``[start, end)``: (start, end, from_copy) each.

    A range over at least `split_bytes` of WAL is two halves decoded side by side by two server backends, as the
    SQL transport splits a backlog (spockwire/connection/sql.py): the first on the slot, peeked up to the middle
    (its call decodes exactly the WAL records that start before it); the second on a copy of the slot advanced to
    the middle (it skips exactly the transactions whose commit record starts before it). Each read keeps the
    transactions whose commit LSN falls in its half, so every transaction comes out once. The second backend also
    reads the first half again, without decoding its output, to reach the middle.
    """
    if not split_bytes or end - start < split_bytes:
        return [(start, end, False)]
    middle = start + (end - start) // 2
    return [(start, middle, False), (middle, end, True)]


def _copy_prefix(slot: str) -> str:
    return f"{slot[:40]}{RANGE_COPY_INFIX}"


@contextlib.contextmanager
def _range_copy(spec: SlotSpec, start: int) -> Iterator[SlotSpec]:
    """A copy of the slot advanced to `start` (a persistent slot: the reading backend is not the one that makes
    it), dropped at the end; stale ones (a task that died) go at the next planning (`drop_stale_range_copies`).
    Without room for another slot (max_replication_slots), the slot itself."""
    import dataclasses
    import secrets

    import psycopg2

    name = _copy_prefix(spec.slot) + secrets.token_hex(4)
    with _connect(spec.conninfo) as conn, conn.cursor() as cur:
        _require_slot(cur, spec)
        try:
            cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, false)", (spec.slot, name))
        except psycopg2.Error as exc:
            if getattr(exc, "pgcode", None) != "53400":
                raise
            name = ""                    # no free slot: read the slot itself (it decodes the whole range)
        if name:
            try:
                cur.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (name, format_lsn(start)))
            except BaseException:
                _drop_copy(cur, name)
                raise
    if not name:
        yield spec
        return
    try:
        yield dataclasses.replace(spec, slot=name)
    finally:
        with _connect(spec.conninfo) as conn, conn.cursor() as cur:
            _drop_copy(cur, name)


def _drop_copy(cur: Any, name: str) -> None:
    import psycopg2

    try:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (name,))
    except psycopg2.Error:
        pass                             # still held for a moment: the next planning drops it


def drop_stale_range_copies(cur: Any, slot: str) -> list[str]:
    """Drop the copies of `slot` that no backend holds (left by a task that died before dropping its own); the
    names dropped. Called while no read of the slot runs (a micro-batch's planning)."""
    prefix = _copy_prefix(slot)
    cur.execute("SELECT slot_name FROM pg_replication_slots WHERE active_pid IS NULL AND left(slot_name, %s) = %s",
                (len(prefix), prefix))
    names = [name for (name,) in cur.fetchall()]
    for name in names:
        _drop_copy(cur, name)
    return names


def _catalog(dsn: str) -> Any:
    try:
        from ..values import PostgresTypeCatalog
    except ImportError:  # pragma: no cover - typed values not installed
        return None
    return PostgresTypeCatalog(dsn)
