"""Failover: slots that survive a promotion, the checks that say whether this one would, and timelines.

* **Failover slots** (PostgreSQL 17+): a logical slot created with ``failover`` (or switched over with
  ``ALTER_REPLICATION_SLOT ... (FAILOVER true)`` while idle) is copied to standbys that run with
  ``sync_replication_slots = on``. After a promotion the stream resumes from the copy on the new primary.
* **Failover safety**: a standby can hold a usable copy only of what it has received. The primary's
  ``synchronized_standby_slots`` makes logical senders wait for the named physical standby slots, so a consumer
  never runs ahead of them. :func:`failover_safety` reads the slot, that setting and (for a multi-host DSN) the
  standbys' synchronized copies, and says what is missing.
* **Timelines**: a promotion starts a new timeline at the point where the standby's WAL ended. A consumer that
  acknowledged changes past that point (it ran ahead of a lagging standby) holds changes the new primary never
  had. :func:`diverged_at` compares a position, and the timeline it was read on, with the server's timeline
  history; the stream raises :class:`TimelineDiverged` instead of going on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import FailoverNotSupported, FailoverUnsafe, TimelineDiverged
from .slots import FAILOVER_MIN_VERSION, format_lsn, parse_lsn, require_failover_version, set_failover

__all__ = ["FailoverNotSupported", "TimelineDiverged", "FailoverUnsafe", "FailoverSafety", "FAILOVER_MIN_VERSION",
           "identify_system", "timeline_history", "diverged_at", "set_failover", "failover_safety",
           "sql_timeline", "sql_identify_system", "replication_timeline_history", "check_position", "move_wal_past",
           "check_failover_safety", "require_failover_version"]

def identify_system(cur: Any) -> tuple[str, int, int]:
    """(system identifier, timeline, WAL flush position) from IDENTIFY_SYSTEM on a replication connection."""
    cur.execute("IDENTIFY_SYSTEM")
    row = cur.fetchone()
    return str(row[0]), int(row[1]), parse_lsn(row[2])


def timeline_history(cur: Any, timeline: int) -> list[tuple[int, int]]:
    """The history of `timeline` (TIMELINE_HISTORY): (parent timeline, the LSN where it ended) for each earlier
    timeline, oldest first. Timeline 1 has none."""
    if timeline <= 1:
        return []
    cur.execute(f"TIMELINE_HISTORY {int(timeline)}")
    row = cur.fetchone()
    content = row[1]
    if isinstance(content, (bytes, memoryview)):
        content = bytes(content).decode()
    out = []
    for line in str(content).splitlines():
        parts = line.strip().split("\t")
        if len(parts) >= 2 and parts[0].isdigit():
            out.append((int(parts[0]), parse_lsn(parts[1])))
    return out


def sql_timeline(cur: Any) -> int | None:
    """The timeline a primary writes WAL on now, through SQL on an ordinary connection: the first eight hex digits
    of its current WAL file's name (pg_control's checkpoint timeline stays the old one until the first checkpoint
    after a promotion); None on a standby, which has no such file."""
    cur.execute("SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END")
    name = cur.fetchone()[0]
    return None if name is None else int(str(name)[:8], 16)


def sql_identify_system(cur: Any) -> tuple[str | None, int | None]:
    """(system identifier, timeline) through SQL on an ordinary connection (:func:`sql_timeline`). The system
    identifier is None where the role may not call ``pg_control_system()``."""
    timeline = sql_timeline(cur)
    try:
        cur.execute("SELECT system_identifier::text FROM pg_control_system()")
        system = str(cur.fetchone()[0])
    except Exception:  # noqa: BLE001 - a role without the right: the timeline alone is checked
        system = None
    return system, timeline


def replication_timeline_history(dsn: str, timeline: int,
                                 connect_kwargs: Any = None) -> tuple[list[tuple[int, int]], str]:
    """:func:`timeline_history` over a replication connection of its own (the SQL interface has no TIMELINE_HISTORY;
    a role that may read a logical slot may open one), and the host and port it reached, for messages."""
    import psycopg2
    import psycopg2.extras

    from .session import pinned_kwargs

    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection,
                            **pinned_kwargs(dsn, dict(connect_kwargs or {})))
    try:
        return timeline_history(conn.cursor(), timeline), f"{conn.info.host}:{conn.info.port}"
    finally:
        conn.close()


def check_position(dsn: str, position: int, timeline: int, now: int, connect_kwargs: Any = None) -> None:
    """A position read on `timeline`, against a server (`dsn`) now on timeline `now`: TimelineDiverged when the
    server's history left `timeline` before `position` (the changes past that point were never on this server);
    nothing when `now` is `timeline` or its history holds `position`."""
    if now == timeline:
        return
    history, server = replication_timeline_history(dsn, now, connect_kwargs)
    switch = diverged_at(history, timeline, position)
    if switch is not None:
        raise TimelineDiverged(diverged_message(f"the server ({server})", position, timeline, switch, now),
                               acked=position, switch_point=switch, timeline=now)


#: the largest logical message written at a time to move the WAL on
_FILL_BYTES = 8 << 20


def move_wal_past(cur: Any, lsn: int) -> int:
    """Write WAL on the server of `cur` (autocommit) until its insert position is past `lsn`; returns it. A repair
    after a divergence does so before it takes its snapshot: its position is then past every position read on the
    old timeline, so whatever orders changes by position orders the repair after what it replaces."""
    can_switch = True
    while True:
        cur.execute("SELECT pg_current_wal_insert_lsn()::text")
        insert = parse_lsn(cur.fetchone()[0])
        if insert > lsn:
            return insert
        gap = lsn - insert + 1
        if can_switch and gap > _FILL_BYTES:
            # a segment at a time: the switch needs WAL in the segment, which the empty message gives
            try:
                cur.execute("SELECT pg_logical_emit_message(false, 'spockwire', ''), pg_switch_wal()")
                continue
            except Exception:  # noqa: BLE001 - a role without the right to switch: messages only
                can_switch = False
        cur.execute("SELECT pg_logical_emit_message(false, 'spockwire', repeat(' ', %s))",
                    (int(min(gap + 64, _FILL_BYTES)),))


def diverged_at(history: list[tuple[int, int]], timeline: int, position: int) -> int | None:
    """The switch point past which `position`, read on `timeline`, is not in the server's history (None: it is).
    `history` is the server's current timeline's (:func:`timeline_history`); a timeline that is not in it (the
    server's own) has no end."""
    for parent, ended in history:
        if parent == timeline:
            return ended if position > ended else None
    return None


def diverged_message(server: str, acked: int, timeline: int, switch_point: int, now: int) -> str:
    return (f"{server} is on timeline {now}, which left timeline {timeline} at {format_lsn(switch_point)}, but "
            f"changes up to {format_lsn(acked)} of timeline {timeline} were already acknowledged: those past "
            f"{format_lsn(switch_point)} were never on the new primary (a standby that lagged was promoted). The "
            "tables they touched must be read again")


@dataclass
class FailoverSafety:
    """What :func:`failover_safety` found: `safe` when the slot is a failover slot, the primary names physical
    standby slots in ``synchronized_standby_slots`` and one of them is in use, and every standby the DSN names
    that could be read holds a synchronized, usable copy; `problems` says what is not so, one line each."""

    slot_failover: bool = False
    synchronized_standby_slots: list[str] = field(default_factory=list)
    active_standby_slots: list[str] = field(default_factory=list)
    standbys_with_copy: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        return not self.problems

    def line(self, slot: str) -> str:
        return f"slot {slot!r} would not survive a failover: " + "; ".join(self.problems)


def failover_safety(cur: Any, slot: str, standbys: list[tuple[str, Any]] | None = None) -> FailoverSafety:
    """Read the primary (`cur`, an ordinary connection's cursor) and the standbys (`standbys`: (name, cursor))."""
    out = FailoverSafety()
    cur.execute("SELECT current_setting('server_version_num')::int")
    version = int(cur.fetchone()[0])
    if version < FAILOVER_MIN_VERSION:
        out.problems.append(f"PostgreSQL {version // 10000} has no failover slots (17 or later)")
        return out
    cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    row = cur.fetchone()
    out.slot_failover = bool(row and row[0])
    if not out.slot_failover:
        out.problems.append("it is not a failover slot (create it with the failover slot option)")
    cur.execute("SELECT current_setting('synchronized_standby_slots', true)")
    names = [n.strip() for n in (cur.fetchone()[0] or "").split(",") if n.strip()]
    out.synchronized_standby_slots = names
    if not names:
        out.problems.append("the primary's synchronized_standby_slots is empty, so a consumer may run ahead of "
                            "every standby")
    else:
        cur.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical' AND active "
                    "AND slot_name = ANY(%s)", (names,))
        out.active_standby_slots = [r[0] for r in cur.fetchall()]
        if not out.active_standby_slots:
            out.problems.append(f"no standby streams from the slots synchronized_standby_slots names "
                                f"({', '.join(names)})")
    for name, scur in standbys or []:
        scur.execute("SELECT synced AND NOT temporary AND invalidation_reason IS NULL "
                     "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = scur.fetchone()
        if row and row[0]:
            out.standbys_with_copy.append(name)
        else:
            out.problems.append(f"the standby {name} holds no synchronized copy of the slot yet (it needs "
                                "sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name and a "
                                "dbname in primary_conninfo; a new slot's copy is usable once the slot advanced "
                                "past the standby's start)")
    return out


def check_failover_safety(dsn: str, slot: str, *, require: bool = False, connect_kwargs: Any = None) -> FailoverSafety:
    """:func:`failover_safety` for the primary `dsn` leads to, and the standbys among the other hosts it names
    (a multi-host DSN: ``host=a,b``); each host that cannot be reached within 5 s is left out. Logs a warning when
    unsafe; `require`: raises FailoverUnsafe instead."""
    import logging

    import psycopg2
    from psycopg2.extensions import parse_dsn

    from .session import pinned_kwargs

    params = parse_dsn(dsn)
    hosts = [h for h in str(params.get("host", "") or "").split(",") if h]
    ports = [p for p in str(params.get("port", "") or "").split(",") if p]
    standbys: list[tuple[str, Any]] = []
    opened = []
    try:
        if len(hosts) > 1:
            for i, host in enumerate(hosts):
                port = ports[i] if len(ports) == len(hosts) else (ports[0] if ports else "5432")
                one = dict(params, host=host, port=port, target_session_attrs="standby", connect_timeout="5")
                try:
                    conn = psycopg2.connect(**pinned_kwargs("", dict(one, **(connect_kwargs or {}))))
                except psycopg2.Error:
                    continue
                conn.autocommit = True
                opened.append(conn)
                standbys.append((f"{host}:{port}", conn.cursor()))
        primary = dict(params, target_session_attrs="read-write")
        conn = psycopg2.connect(**pinned_kwargs("", dict(primary, **(connect_kwargs or {}))))
        conn.autocommit = True
        opened.append(conn)
        found = failover_safety(conn.cursor(), slot, standbys)
    finally:
        for conn in opened:
            conn.close()
    if not found.safe:
        if require:
            raise FailoverUnsafe(found.line(slot))
        logging.getLogger("spockwire.connection").warning("%s", found.line(slot))
    return found
