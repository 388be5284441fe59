"""Replication slot and publication helpers (plain SQL over an ordinary connection).

Every function takes a libpq connection string or an open psycopg2 connection (used as is, in autocommit).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from .errors import FailoverNotSupported
from .options import plugin_protocol

__all__ = ["SlotInfo", "create_slot", "set_failover_slot", "drop_slot", "list_slots", "slot_info", "create_publication",
           "drop_publication", "format_lsn", "parse_lsn"]

#: the first PostgreSQL release with failover slots
FAILOVER_MIN_VERSION = 170000

#: Output plugin library for each plugin name a user may give.
SLOT_PLUGIN = {"pgoutput": "pgoutput", "pglogical": "pglogical_output", "pglogical_output": "pglogical_output",
               "spock": "spock_output", "spock_output": "spock_output"}


def format_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL prints it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | int | None) -> int:
    """``'16/B374D848'`` (or an int, or None = 0) as an int."""
    if text is None:
        return 0
    if isinstance(text, int):
        return text
    hi, sep, lo = str(text).partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass(frozen=True)
class SlotInfo:
    """One logical replication slot and how far behind it is.

    `lag_bytes` is the WAL written since the slot's confirmed flush position (what a consumer has not
    acknowledged); `retained_bytes` is the WAL the server keeps for the slot (since its restart_lsn).
    """

    name: str
    plugin: str
    database: str
    active: bool
    active_pid: int | None
    temporary: bool
    two_phase: bool
    restart_lsn: int
    confirmed_flush_lsn: int
    lag_bytes: int | None
    retained_bytes: int | None
    #: PostgreSQL 17+: a failover slot (copied to standbys that synchronize slots), and a standby's copy of one
    failover: bool = False
    synced: bool = False


@contextmanager
def _connection(conn_or_dsn: Any) -> Iterator[Any]:
    if isinstance(conn_or_dsn, str):
        from .session import pinned_connect

        conn = pinned_connect(conn_or_dsn)
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()
    else:
        yield conn_or_dsn


def _slot_plugin(plugin: str) -> str:
    plugin_protocol(plugin)  # validates the name
    return SLOT_PLUGIN[plugin]


_SLOT_QUERY = """
SELECT slot_name, plugin, database, active, active_pid, temporary, two_phase,
       restart_lsn::text, confirmed_flush_lsn::text,
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) END,
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) END,
       coalesce((to_jsonb(s) ->> 'failover')::bool, false), coalesce((to_jsonb(s) ->> 'synced')::bool, false)
  FROM pg_replication_slots s
 WHERE slot_type = 'logical'
"""


def _row_to_info(row: tuple) -> SlotInfo:
    return SlotInfo(name=row[0], plugin=row[1], database=row[2], active=bool(row[3]), active_pid=row[4],
                    temporary=bool(row[5]), two_phase=bool(row[6]), restart_lsn=parse_lsn(row[7]),
                    confirmed_flush_lsn=parse_lsn(row[8]),
                    lag_bytes=None if row[9] is None else int(row[9]),
                    retained_bytes=None if row[10] is None else int(row[10]),
                    failover=bool(row[11]), synced=bool(row[12]))


def list_slots(conn_or_dsn: Any, *, database: str | None = None) -> list[SlotInfo]:
    """The logical slots of the cluster (of one database if given), with their lag in bytes."""
    with _connection(conn_or_dsn) as conn, conn.cursor() as cur:
        if database is None:
            cur.execute(_SLOT_QUERY + " ORDER BY slot_name")
        else:
            cur.execute(_SLOT_QUERY + " AND database = %s ORDER BY slot_name", (database,))
        return [_row_to_info(r) for r in cur.fetchall()]


def slot_info(conn_or_dsn: Any, slot: str) -> SlotInfo | None:
    """One slot by name, or None."""
    with _connection(conn_or_dsn) as conn, conn.cursor() as cur:
        cur.execute(_SLOT_QUERY + " AND slot_name = %s", (slot,))
        row = cur.fetchone()
        return None if row is None else _row_to_info(row)


def create_slot(conn_or_dsn: Any, slot: str, plugin: str = "pgoutput", *, two_phase: bool = False,
                temporary: bool = False, if_missing: bool = True, failover: bool = False) -> SlotInfo:
    """Create a logical slot in the connection's database unless it exists; return it.

    `failover` (PostgreSQL 17+; FailoverNotSupported before): a failover slot, which standbys that synchronize
    slots keep a copy of; an existing slot that is not one is switched over (it must be idle). An existing slot
    with another output plugin is an error (its stream would not decode as asked).
    """
    library = _slot_plugin(plugin)
    with _connection(conn_or_dsn) as conn:
        if failover:
            require_failover_version(conn.server_version)
        existing = slot_info(conn, slot)
        if existing is not None:
            if not if_missing:
                raise ValueError(f"replication slot {slot!r} already exists")
            if existing.plugin != library and not (library.startswith(existing.plugin)):
                raise ValueError(f"replication slot {slot!r} exists with plugin {existing.plugin!r}, "
                                 f"not {library!r}")
            if failover and not existing.failover:
                # (a connection given: its parameters, without a password: the server must accept it otherwise)
                set_failover_slot(conn_or_dsn if isinstance(conn_or_dsn, str) else conn.dsn, slot)
                existing = slot_info(conn, slot)
                assert existing is not None
            return existing
        with create_slot_errors(conn, library), conn.cursor() as cur:
            if failover:
                cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, %s, %s, true)",
                            (slot, library, temporary, two_phase))
            else:
                cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, %s, %s)",
                            (slot, library, temporary, two_phase))
        info = slot_info(conn, slot)
        assert info is not None
        return info


def require_failover_version(server_version_num: int) -> None:
    """FailoverNotSupported below PostgreSQL 17."""
    if server_version_num < FAILOVER_MIN_VERSION:
        major = server_version_num // 10000
        raise FailoverNotSupported(f"failover slots need PostgreSQL 17 or later; this server is PostgreSQL {major} "
                                   "(leave out the failover slot option, and recreate the slot after a failover)")


def set_failover(repl_cur: Any, slot: str, server_version_num: int) -> None:
    """Switch an idle slot to a failover slot (ALTER_REPLICATION_SLOT), over a replication connection's cursor."""
    require_failover_version(server_version_num)
    repl_cur.execute('ALTER_REPLICATION_SLOT "%s" (FAILOVER true)' % slot.replace('"', '""'))


def set_failover_slot(dsn: str, slot: str) -> None:
    """Make an existing, idle slot a failover slot (``ALTER_REPLICATION_SLOT``, over a replication connection to
    `dsn`; PostgreSQL 17+)."""
    import psycopg2
    import psycopg2.extras

    from .session import pinned_kwargs

    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            **pinned_kwargs(dsn))
    try:
        set_failover(conn.cursor(), slot, conn.server_version)
    finally:
        conn.close()


@contextmanager
def create_slot_errors(conn: Any, library: str) -> Iterator[None]:
    """Creating a slot over `conn`: a server whose output_plugin_libraries leaves `library` out is a one-line
    PluginNotAllowed naming the setting and the line to add (errors.plugin_not_allowed)."""
    from .errors import plugin_not_allowed

    try:
        yield
    except Exception as exc:
        refused = plugin_not_allowed(exc, library, _setting(conn, "output_plugin_libraries"))
        if refused is None:
            raise
        raise refused from None


def _setting(conn: Any, name: str) -> str | None:
    """A server setting's value read after a failed statement (None when it cannot be read)."""
    try:
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,))
            row = cur.fetchone()
        return None if row is None else row[0]
    except Exception:
        return None


def drop_slot(conn_or_dsn: Any, slot: str, *, if_exists: bool = True) -> bool:
    """Drop a slot; True if it existed. An active slot (a stream still reads it) is an error."""
    with _connection(conn_or_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        if cur.fetchone() is None:
            if not if_exists:
                raise ValueError(f"replication slot {slot!r} does not exist")
            return False
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        return True


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def create_publication(conn_or_dsn: Any, name: str, tables: Iterable[str] | None = None, *,
                       if_missing: bool = True) -> bool:
    """Create a publication FOR ALL TABLES (or for `tables`, names as ``schema.table`` or ``table``).

    Returns True when it was created, False when it already existed.
    """
    if tables is None:
        target = "FOR ALL TABLES"
    else:
        parts = []
        for t in tables:
            parts.append(".".join(_ident(p) for p in t.split(".", 1)))
        if not parts:
            raise ValueError("tables must name at least one table (or be None for all tables)")
        target = "FOR TABLE " + ", ".join(parts)
    with _connection(conn_or_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
        if cur.fetchone() is not None:
            if not if_missing:
                raise ValueError(f"publication {name!r} already exists")
            return False
        cur.execute(f"CREATE PUBLICATION {_ident(name)} {target}")
        return True


def drop_publication(conn_or_dsn: Any, name: str, *, if_exists: bool = True) -> None:
    with _connection(conn_or_dsn) as conn, conn.cursor() as cur:
        cur.execute(f"DROP PUBLICATION {'IF EXISTS ' if if_exists else ''}{_ident(name)}")
