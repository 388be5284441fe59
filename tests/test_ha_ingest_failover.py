"""The ingest worker through five promotions of a physical standby, with a writer running (see
tests/test_high_availability.py for the clusters and the multi-host DSN)."""
from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from spockwire.ingest.replay import replay_table
from spockwire.ingest.staging import StagingState
from spockwire.testing import PostgresCluster
from tests.test_high_availability import (DIVERGED, ROUNDS, Writer, _as_standby_of, _ingest, _multi_dsn, _ports,
                                          _wait_synced, ha_clusters, new_standby)

pytestmark = [pytest.mark.pg, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_ingest_survives_five_promotions_with_a_writer_running(tmp_path):
    """`spockwire ingest --failover-slot` on a multi-host DSN while a writer runs; five times the primary is killed
    (immediate shutdown) and its standby promoted, a new standby made from the new primary, and the new primary's
    walsender terminated once the stream is back. The first old primary comes back as a standby, ahead of the
    others in the host list, and is never read from. The staging equals the last primary's table, every log entry
    records the timeline it was read on, and the worker reported each reconnect."""
    ports = _ports(ROUNDS + 2)
    clusters: list[PostgresCluster] = []
    try:
        primary, standby = ha_clusters(ports, clusters)
        dsn = _multi_dsn(ports, "ha")
        out = tmp_path / "staging"
        proc = _ingest(dsn, "cdc", out, "--create-slot", "--failover-slot", "--idle-exit", "20")
        writer = Writer(dsn, 7)
        writer.start()
        try:
            for r in range(ROUNDS):
                _wait_synced(primary, standby, "cdc", "ha", consumer=(proc, f"{out}.log"))
                time.sleep(random.Random(r).uniform(0.5, 2.0))
                assert proc.poll() is None, Path(f"{out}.log").read_text()[-3000:]
                primary.stop(mode="immediate") if r else primary._shutdown("immediate")
                standby.promote()
                if not r:      # the old primary comes back as a standby (read-only): never read from
                    _as_standby_of(primary, standby)
                follower = new_standby(standby, r, ports, clusters)
                # a walsender terminated in the middle of the stream: a reconnect as any other
                standby.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name "
                                "<> 'standby'")
                primary, standby = standby, follower
            time.sleep(2.0)
        finally:
            writer.stop.set()
            writer.join(30)
        proc.wait(300)
        err = Path(f"{out}.log").read_text()
        assert proc.returncode == 0, err[-4000:]
        assert writer.commits > 100 and writer.failures >= ROUNDS, (writer.commits, writer.failures)
        replayed = replay_table(out, "public.items", ("id",))
        source = {(r[0],): r for r in primary.query("SELECT id, v, note FROM items", dbname="ha")}
        assert replayed.keys() == source.keys()
        assert all((replayed[k]["v"], replayed[k]["note"]) == (v, note) for k, (_i, v, note) in source.items())
        state = StagingState.load(out)
        # (the initial snapshot's entry comes before the stream: no timeline)
        timelines = [e["timeline"] for e in state.entries if e.get("timeline") is not None]
        assert timelines[0] == 1 and timelines[-1] == ROUNDS + 1 and timelines == sorted(timelines), timelines
        assert state.entries[0].get("snapshot") and len(timelines) == len(state.entries) - 1
        assert err.count("replication connection lost") >= ROUNDS, err[-3000:]      # each reconnect is said
    finally:
        for c in clusters:
            c.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("on_divergence", ["repair", "stop"])
def test_ingest_repairs_what_a_lagging_standby_never_had(tmp_path, on_divergence):
    """Without synchronized_standby_slots the worker stages changes its standby (cut off) never receives; the standby
    is promoted. By default the worker says so in one line and repairs the staging: one commit truncates every
    replicated table and stages its rows read on the new primary, past everything staged, and the stream goes on
    from there on the new timeline. The staging then equals the new primary's table, the changes only the old
    primary had gone. With --on-divergence stop it exits 1 with that one line, staging nothing more."""
    ports = _ports(2)
    clusters: list[PostgresCluster] = []
    try:
        primary, standby = ha_clusters(ports, clusters)
        primary.execute("ALTER SYSTEM RESET synchronized_standby_slots")
        primary.execute("SELECT pg_reload_conf()")
        dsn = _multi_dsn(ports, "ha")
        out = tmp_path / "staging"
        log = Path(f"{out}.log")
        proc = _ingest(dsn, "cdc", out, "--create-slot", "--failover-slot", "--idle-exit", "15",
                       "--on-divergence", on_divergence)

        def staged_until(check: object) -> dict:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    rows = replay_table(out, "public.items", ("id",))
                except Exception:  # noqa: BLE001 - nothing staged yet
                    rows = {}
                if check(rows):
                    return rows
                time.sleep(0.3)

        primary.execute("INSERT INTO items SELECT g, 2, 'confirmed' FROM generate_series(2001, 2050) g", dbname="ha")
        staged_until(lambda rows: len(rows) == 2050)
        _wait_synced(primary, standby, "cdc", "ha", consumer=(proc, log))
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")       # it lags from here on
        standby.execute("SELECT pg_reload_conf()")
        time.sleep(1.0)
        # (about 200 kB of WAL: the new primary's position at the repair stays below what was read past the switch)
        primary.execute("INSERT INTO items SELECT g, 3, 'ahead' || (SELECT string_agg(md5(g::text || i::text), '') "
                        "FROM generate_series(1, 60) i) FROM generate_series(2051, 2150) g; "
                        "UPDATE items SET note = 'ahead' WHERE id <= 10; DELETE FROM items WHERE id = 20", dbname="ha")
        staged_until(lambda rows: len(rows) == 2149 and rows[(1,)]["note"] == "ahead")
        primary.stop(mode="immediate")
        standby.promote()
        if on_divergence == "stop":
            proc.wait(180)
            err = log.read_text()
            assert proc.returncode == 1, err[-3000:]
            assert re.search(DIVERGED, [ln for ln in err.splitlines() if ln.strip()][-1]), err[-3000:]
            assert len(replay_table(out, "public.items", ("id",))) == 2149       # as it was, nothing more staged
            return
        standby.execute("INSERT INTO items SELECT g, 4, 'new timeline' FROM generate_series(2041, 2080) g "
                        "ON CONFLICT (id) DO UPDATE SET v = 4; DELETE FROM items WHERE id = 5", dbname="ha")
        source = {(r[0],): (r[1], r[2]) for r in standby.query("SELECT id, v, note FROM items", dbname="ha")}
        assert len(source) == 2079
        staged_until(lambda rows: {k: (r["v"], r["note"]) for k, r in rows.items()} == source)
        proc.wait(180)
        err = log.read_text()
        assert proc.returncode == 0, err[-3000:]
        assert len(re.findall(DIVERGED + r".*; reading the tables again", err)) == 1, err[-3000:]
        state = StagingState.load(out)
        repairs = [e for e in state.entries if (e.get("snapshot") or {}).get("kind") == "repair"]
        assert len(repairs) == 1 and repairs[0]["timeline"] == 2, repairs
        meta = repairs[0]["snapshot"]
        assert meta["from_timeline"] == 1 and meta["switch_point"] < meta["replaced_up_to"] < meta["consistent_point"]
        # the new primary's rows at the snapshot: before its own writes, or after them (a slower reconnect)
        assert meta["tables"] in ({"public.items": 2050}, {"public.items": 2079}), meta
        after = [e for e in state.entries if e["commit"] > repairs[0]["commit"]]
        assert after and all(e.get("timeline") == 2 for e in after)
    finally:
        for c in clusters:
            c.stop()
