"""The Spark pipeline job and a standby that lagged: read no further than the standbys confirmed, a divergence
repaired (or stopped at), and a failover slot no standby would hold refused (see tests/test_high_availability.py for
the clusters and the multi-host DSN, tests/test_ha_spark_failover.py for the job's helpers)."""
from __future__ import annotations

import re
import time

import pytest

from spockwire.testing import PostgresCluster
from tests.test_ha_spark_failover import _delta_rows, _end, _start_job, _wait_for_table
from tests.test_high_availability import DIVERGED, _multi_dsn, _ports, _wait_synced, ha_clusters

pytestmark = [pytest.mark.pg, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("on_divergence", ["repair", "stop"])
def test_the_spark_job_stays_behind_its_standby_and_repairs_a_divergence(tmp_path, on_divergence):
    """The job reads a failover slot no further than the standbys the primary's synchronized_standby_slots names
    have confirmed: with its standby cut off, changes wait. Once the setting is emptied the job runs ahead of that
    standby, which is then promoted: the job's query, started again on it, finds that the new timeline left the old
    one before the job's committed position. By default it says so in one line and reads the table again (a
    snapshot on the new primary replaces it), and goes on: its Delta table comes to equal the new primary's, the
    changes only the old primary had gone. With onDivergence=stop it stops with that one line (exit 1), its Delta
    table left as it was. It never goes on silently."""
    ports = _ports(2)
    clusters: list[PostgresCluster] = []
    job = None
    try:
        primary, standby = ha_clusters(ports, clusters)
        dsn = _multi_dsn(ports, "ha")
        target = tmp_path / "delta"
        job = _start_job(dsn, target, tmp_path, *(["--option", "onDivergence=stop"] if on_divergence == "stop" else []))
        job_err = lambda: (tmp_path / "job.err").read_text()[-3000:]  # noqa: E731

        def wait_rows(n: int) -> None:
            _wait_for_table(job, tmp_path, lambda rows: len(rows) >= n, 180, f"{n} rows")

        wait_rows(2000)
        primary.execute("INSERT INTO items SELECT g, 2, 'confirmed' FROM generate_series(2001, 2050) g", dbname="ha")
        wait_rows(2050)
        _wait_synced(primary, standby, "cdc", "ha", consumer=(job, tmp_path / "job.err"))
        # the standby stops receiving WAL: what the primary commits now waits for it
        standby.execute("ALTER SYSTEM SET primary_conninfo = ''")
        standby.execute("SELECT pg_reload_conf()")
        time.sleep(1.0)
        # (about 200 kB of WAL: the new primary's position at the repair stays below what was read past the switch)
        primary.execute("INSERT INTO items SELECT g, 3, 'ahead' || (SELECT string_agg(md5(g::text || i::text), '') "
                        "FROM generate_series(1, 60) i) FROM generate_series(2051, 2150) g; "
                        "UPDATE items SET note = 'ahead' WHERE id <= 10", dbname="ha")
        time.sleep(5.0)                                    # ten triggers
        assert job.poll() is None, job_err()
        assert len(_delta_rows(target / "public.items")) == 2050
        # without the setting nothing holds the job back: it reads what the standby never received
        primary.execute("ALTER SYSTEM RESET synchronized_standby_slots")
        primary.execute("SELECT pg_reload_conf()")
        wait_rows(2150)
        primary.stop(mode="immediate")
        standby.promote()
        if on_divergence == "stop":
            job.wait(240)
            err = (tmp_path / "job.err").read_text()
            assert job.returncode == 1, err[-3000:]
            last = [ln for ln in err.splitlines() if ln.strip()][-1]
            assert re.search(rf"the server \(127\.0\.0\.1:{ports[1]}\) {DIVERGED}", last), err[-3000:]
            assert len(_delta_rows(target / "public.items")) == 2150           # left as it was, not continued
            return
        standby.execute("INSERT INTO items SELECT g, 4, 'new timeline' FROM generate_series(2041, 2080) g "
                        "ON CONFLICT (id) DO UPDATE SET v = 4; DELETE FROM items WHERE id = 5", dbname="ha")
        want = {r[0]: (r[1], r[2]) for r in standby.query("SELECT id, v, note FROM items", dbname="ha")}
        assert len(want) == 2079
        _wait_for_table(job, tmp_path, lambda rows: rows == want, 240, "the new primary's table")
        # and changes after the repair flow as before
        standby.execute("UPDATE items SET note = 'after' WHERE id = 1", dbname="ha")
        want[1] = (want[1][0], "after")
        _wait_for_table(job, tmp_path, lambda rows: rows == want, 120, "the change after the repair")
        job.send_signal(15)
        job.wait(180)
        err = (tmp_path / "job.err").read_text()
        assert job.returncode == 0, err[-3000:]
        # the new primary has no standby: said once the slot is back as a failover slot
        assert "slot 'cdc' would not survive a failover" in err.split("reading the tables again")[-1], err[-3000:]
        assert len(re.findall(rf"spockwire: the server \(127\.0\.0\.1:{ports[1]}\) {DIVERGED}.*; reading the tables "
                              r"again \(a snapshot at [0-9A-F]+/[0-9A-F]+ on timeline 2 replaces them\)", err)) == 1, \
            err[-3000:]
    finally:
        _end(job, clusters)


@pytest.mark.timeout(300)
def test_the_spark_job_refuses_a_failover_slot_no_standby_would_hold(tmp_path):
    """`spockwire pipeline --failover-slot --require-failover-safety` on a primary without a standby and without
    synchronized_standby_slots: once the slot is a failover slot the job stops with the FailoverUnsafe line (exit
    1), naming what is missing; without --require-failover-safety it is a warning and the job goes on."""
    from tests.test_high_availability import _primary

    ports = _ports(1)
    primary = _primary(ports[0])
    job = None
    try:
        primary.execute("CREATE DATABASE ha")
        primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note text); "
                        "INSERT INTO items VALUES (1, 1, 'a'); CREATE PUBLICATION pub FOR TABLE items", dbname="ha")
        dsn = _multi_dsn(ports, "ha")
        job = _start_job(dsn, tmp_path / "delta", tmp_path, "--require-failover-safety")
        job.wait(240)
        err = (tmp_path / "job.err").read_text()
        assert job.returncode == 1, err[-3000:]
        last = [ln for ln in err.splitlines() if ln.strip()][-1]
        assert re.search(r"FailoverUnsafe: slot 'cdc' would not survive a failover: .*synchronized_standby_slots is "
                         r"empty", last), err[-3000:]
        assert _delta_rows(tmp_path / "delta" / "public.items") == {1: (1, "a")}     # the snapshot came first
    finally:
        _end(job, [primary])
