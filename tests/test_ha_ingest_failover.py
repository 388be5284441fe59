"""The ingest worker through five promotions of a physical standby, with a writer running (see
tests/test_high_availability.py for the clusters and the multi-host DSN)."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from spockwire.ingest.replay import replay_table
from spockwire.ingest.staging import StagingState
from spockwire.testing import PostgresCluster
from tests.test_high_availability import (ROUNDS, Writer, _as_standby_of, _ingest, _multi_dsn, _ports, _wait_synced,
                                          ha_clusters, new_standby)

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
