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
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..connection.options import native_options, pgoutput_options, plugin_protocol
from ..connection.slots import SLOT_PLUGIN, format_lsn, parse_lsn
from ..errors import SpockwireError
from ..model import ChangeBatch, Truncate

__all__ = ["SlotSpec", "SlotAheadError", "make_decoder", "read_range", "advance_slot", "slot_position",
           "plan_end", "decoder_types_supported", "IDLE_ADVANCE_BYTES"]

#: rows fetched from the server per round trip while reading a range
FETCH_ROWS = 2000
#: WAL without output for the stream after which an empty range moves the slot on (one WAL segment)
IDLE_ADVANCE_BYTES = 16 << 20


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
    from ..connection.session import pinned_connect

    conn = pinned_connect(dsn, application_name="spockwire-spark")
    conn.autocommit = autocommit
    try:
        yield conn
    finally:
        conn.close()


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


def ensure_slot(spec: SlotSpec) -> int:
    """Create the slot if missing; return its confirmed position."""
    with _connect(spec.dsn) as conn, conn.cursor() as cur:
        pos = slot_position(cur, spec.slot)
        if pos is None:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                        (spec.slot, SLOT_PLUGIN.get(spec.plugin, spec.plugin)))
            return parse_lsn(cur.fetchone()[0])
        return _require_slot(cur, spec)


def current_flush_lsn(cur: Any) -> int:
    cur.execute("SELECT pg_current_wal_flush_lsn()::text")
    return parse_lsn(cur.fetchone()[0])


def advance_slot(spec: SlotSpec, lsn: int) -> int:
    """Move the slot forward to `lsn` (never backward); return its new confirmed position."""
    with _connect(spec.dsn) as conn, conn.cursor() as cur:
        return _advance(cur, spec, lsn)


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


@dataclass(frozen=True)
class Plan:
    """The end chosen for the next range and what the planning saw."""

    end: int
    flush: int
    messages: int


def plan_end(spec: SlotSpec, start: int, *, max_messages: int | None = None, max_wal_bytes: int | None = None,
             until: int | None = None, idle_advance_bytes: int | None = None) -> Plan:
    """Choose the end of the range that starts at `start` (the end of everything already durable downstream).

    The slot is first advanced to `start` (the caller guarantees everything before it is durable), so the peek
    that plans starts exactly there. Then:

    * no limit: `end` is the server's flush LSN when at least one transaction committed in between, else `start`
      (no new range) -- unless more than `idle_advance_bytes` (default IDLE_ADVANCE_BYTES) of WAL went by without
      output for this slot, when an empty range moves the slot on, so the server can recycle that WAL;
    * `max_messages`: a peek with ``upto_nchanges`` stops after the transaction that reaches the count; the range
      ends right after that transaction's commit (whole transactions only, so a range may exceed the count by
      the messages of one transaction);
    * `max_wal_bytes`: the range covers at most that much WAL;
    * `until` (Trigger.AvailableNow): never beyond this LSN.
    """
    if idle_advance_bytes is None:
        idle_advance_bytes = IDLE_ADVANCE_BYTES
    with _connect(spec.dsn) as conn, conn.cursor() as cur:
        _advance(cur, spec, start)
        flush = current_flush_lsn(cur)
        upto = flush
        if until is not None:
            upto = min(upto, until)
        if max_wal_bytes:
            upto = min(upto, start + max_wal_bytes)
        if upto <= start:
            return Plan(start, flush, 0)
        wanted = max(1, int(max_messages)) if max_messages else 1
        opts = spec.plugin_options(conn.server_version, conn.get_parameter_status("server_encoding"))
        _wait_released(cur, spec)
        cur.execute(_peek_sql(spec, "count(*), max(lsn)::text"),
                    (spec.slot, format_lsn(upto), wanted, _variadic(opts)))
        count, last = cur.fetchone()
        count = int(count or 0)
        if count == 0:
            if upto < flush and (until is None or upto < until):
                return Plan(upto, flush, 0)          # WAL without output for us: skip over it
            if upto - start >= idle_advance_bytes:
                return Plan(upto, flush, 0)
            return Plan(start, flush, 0)
        if max_messages and count >= wanted:
            return Plan(max(start, parse_lsn(last)), flush, count)
        return Plan(upto, flush, count)


def _truncate_batch(event: Truncate, table: str) -> pa.RecordBatch:
    from ..export.arrow import change_fields

    fields = change_fields()
    arrays = [pa.array(["truncate"]), pa.array([event.commit_lsn], pa.uint64()),
              pa.array([event.commit_ts], pa.timestamp("us", tz="UTC")), pa.array([event.xid], pa.uint32()),
              pa.array([event.seq], pa.int64()), pa.array([event.origin], pa.string()),
              pa.nulls(1, pa.list_(pa.string()))]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata={b"spockwire.relation":
                                                                                 table.encode()}))


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
            yield name, batch
        elif isinstance(event, Truncate):
            if event.commit_lsn < start or (end is not None and event.commit_lsn >= end):
                continue
            for rel in event.relations:
                if wanted is None or rel.qualified_name in wanted:
                    yield rel.qualified_name, _truncate_batch(event, rel.qualified_name)


def read_range(spec: SlotSpec, start: int, end: int, tables: Sequence[str] | None = None, *,
               catalog: Any = None, fetch_rows: int = FETCH_ROWS) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Decode the slot's transactions committed in ``[start, end)``; yield (table, record batch) in commit order.

    Replayable: the slot is only peeked. Raises SlotAheadError when the slot was already advanced beyond
    `start` (those changes can no longer be read).
    """
    if end <= start:
        return
    protocol = spec.protocol
    if catalog is None and spec.types != "raw":
        catalog = _catalog(spec.dsn)
    decoder = make_decoder(protocol, spec.types, catalog, spec.column_types, spec.on_unrepresentable)
    with _connect(spec.dsn, autocommit=False) as conn:
        with conn.cursor() as cur:
            confirmed = _require_slot(cur, spec)
            if confirmed > start:
                raise SlotAheadError(
                    f"replication slot {spec.slot!r} is at {format_lsn(confirmed)}, past the start "
                    f"{format_lsn(start)} of the range to read: the changes in between are no longer available "
                    "(was the slot advanced by another consumer, or the checkpoint restored from an older copy?)")
            opts = spec.plugin_options(conn.server_version, conn.get_parameter_status("server_encoding"))
            _wait_released(cur, spec)
        with conn.cursor(name="spockwire_peek") as cur:
            cur.itersize = fetch_rows
            cur.execute(_peek_sql(spec, "(lsn - '0/0'::pg_lsn)::int8, data"),
                        (spec.slot, format_lsn(end), None, _variadic(opts)))
            while True:
                rows = cur.fetchmany(fetch_rows)
                if not rows:
                    break
                for lsn, data in rows:
                    decoder.feed(data, lsn)
                yield from select_events(decoder.drain(), tables, start, end)
        conn.rollback()
    yield from select_events(decoder.drain(), tables, start, end)


def _catalog(dsn: str) -> Any:
    try:
        from ..values import PostgresTypeCatalog
    except ImportError:  # pragma: no cover - typed values not installed
        return None
    return PostgresTypeCatalog(dsn)
