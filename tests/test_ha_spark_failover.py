"""The Spark pipeline job through five promotions of a physical standby with a writer running, and through
terminated backends and restarts (see tests/test_high_availability.py for the clusters and the multi-host DSN;
tests/test_ha_spark_divergence.py for a standby that lagged)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from spockwire.testing import PostgresCluster
from tests.test_high_availability import (ROOT, ROUNDS, Writer, _as_standby_of, _multi_dsn, _ports, _wait_synced,
                                          ha_clusters, new_standby)

pytestmark = [pytest.mark.pg, pytest.mark.slow]


def _delta_rows(path: Path) -> dict:
    import deltalake

    if not (path / "_delta_log").exists():
        return {}
    return {r["id"]: (r["v"], r["note"]) for r in deltalake.DeltaTable(str(path)).to_pyarrow_table(
        columns=["id", "v", "note"]).to_pylist()}


def _wait_for_table(job: subprocess.Popen, tmp_path: Path, check: Callable[[dict], bool], timeout: float,
                    what: str = "the Delta table") -> None:
    """Until `check` holds for the job's Delta table ``public.items`` ({id: (v, note)}), the job still running."""
    deadline = time.monotonic() + timeout
    while not check(_delta_rows(tmp_path / "delta" / "public.items")):
        assert job.poll() is None, (tmp_path / "job.err").read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what} did not come: {(tmp_path / 'job.err').read_text()[-2000:]}"
        time.sleep(0.5)


def _end(job: subprocess.Popen | None, clusters: list[PostgresCluster]) -> None:
    """A test's end: the job killed if it still runs, the clusters stopped."""
    if job is not None and job.poll() is None:
        job.kill()
    for c in clusters:
        c.stop()


def _start_job(dsn: str, target: Path, tmp_path: Path, *more: str) -> subprocess.Popen:
    """`spockwire pipeline --failover-slot` of ``items`` on `dsn` (snapshot, then changes), its output in files
    (a full pipe would stall it)."""
    return subprocess.Popen([sys.executable, "-m", "spockwire", "pipeline", "--dsn", dsn, "--slot", "cdc",
                             "--publication", "pub", "--table", "public.items", "--create-slot", "--failover-slot",
                             "--starting-position", "snapshot", "--target", str(target), "--checkpoint",
                             str(tmp_path / "ck"), "--trigger-seconds", "0.5", "--no-maintenance", *more],
                            cwd=ROOT, stdout=open(tmp_path / "job.out", "w"), stderr=open(tmp_path / "job.err", "w"))


@pytest.mark.timeout(900)
def test_the_spark_job_survives_five_promotions_with_a_writer_running(tmp_path):
    """`spockwire pipeline --failover-slot` on a multi-host DSN (snapshot, then changes) while a writer runs;
    five times the primary is stopped at once and its standby promoted; the first old primary comes back as a
    standby, first in the host list, and is never read from. The job goes on by itself (its query
    started again from the checkpoint once the new primary answers, each time said in a JSON line), and its Delta
    table equals the last primary's table."""
    ports = _ports(ROUNDS + 2)
    clusters: list[PostgresCluster] = []
    job = None
    try:
        primary, standby = ha_clusters(ports, clusters)
        dsn = _multi_dsn(ports, "ha")
        target = tmp_path / "delta"
        job = _start_job(dsn, target, tmp_path)
        job_err = lambda: (tmp_path / "job.err").read_text()[-3000:]  # noqa: E731 - (files: a full pipe stalls it)
        _wait_for_table(job, tmp_path, lambda rows: len(rows) >= 2000, 300, "the snapshot")
        writer = Writer(dsn, 11)
        writer.start()
        try:
            for r in range(ROUNDS):
                _wait_synced(primary, standby, "cdc", "ha", consumer=(job, tmp_path / "job.err"))
                time.sleep(random.Random(r).uniform(0.5, 2.0))
                assert job.poll() is None, job_err()
                primary.stop(mode="immediate") if r else primary._shutdown("immediate")
                standby.promote()
                if not r:      # the old primary comes back as a standby (read-only): never read from
                    _as_standby_of(primary, standby)
                primary, standby = standby, new_standby(standby, r, ports, clusters)
            time.sleep(2.0)
        finally:
            writer.stop.set()
            writer.join(30)
        assert writer.commits > 100 and writer.failures >= ROUNDS, (writer.commits, writer.failures)
        want = {r[0]: (r[1], r[2]) for r in primary.query("SELECT id, v, note FROM items", dbname="ha")}
        _wait_for_table(job, tmp_path, lambda rows: rows == want, 300, "the last primary's table")
        job.send_signal(15)
        job.wait(180)
        out, err = (tmp_path / "job.out").read_text(), (tmp_path / "job.err").read_text()
        assert job.returncode == 0, err[-3000:]
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert any(line.get("stopped") for line in lines)
        # a promotion while a micro-batch ran failed its query, which started again once the new primary answered
        reconnects = [line for line in lines if line.get("reconnect")]
        assert reconnects and all(line["port"] in ports[1:] for line in reconnects), lines[-20:]
        assert err.count("the source database went away") == len(reconnects)
        assert _delta_rows(target / "public.items") == want
    finally:
        _end(job, clusters)


@pytest.mark.timeout(600)
def test_the_spark_job_stays_exact_through_terminated_backends_and_restarts(tmp_path):
    """With a writer running, the job's server backends are terminated (pg_terminate_backend) and the primary is
    restarted (immediate shutdown), each in the middle of the stream, twice: the job goes on by itself and its
    Delta table equals the source."""
    from tests.test_high_availability import _primary

    ports = _ports(1)
    primary = _primary(ports[0])
    job = None
    try:
        primary.execute("CREATE DATABASE ha")
        primary.execute("CREATE TABLE items (id int PRIMARY KEY, v int, note text); "
                        "INSERT INTO items SELECT g, g % 13, 'start' FROM generate_series(1, 2000) g; "
                        "CREATE PUBLICATION pub FOR TABLE items", dbname="ha")
        dsn = _multi_dsn(ports, "ha")
        target = tmp_path / "delta"
        job = _start_job(dsn, target, tmp_path)
        job_err = lambda: (tmp_path / "job.err").read_text()[-3000:]  # noqa: E731
        _wait_for_table(job, tmp_path, lambda rows: len(rows) >= 2000, 240, "the snapshot")
        writer = Writer(dsn, 17)
        writer.start()
        terminated = 0
        try:
            for r in range(2):
                time.sleep(random.Random(r).uniform(1.0, 2.0))
                terminated += primary.query(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'ha' AND "
                    "application_name LIKE 'spockwire%%' AND pid <> pg_backend_pid()", dbname="ha")[0][0]
                time.sleep(random.Random(r).uniform(1.0, 2.0))
                assert job.poll() is None, job_err()
                primary.restart(mode="immediate")
            time.sleep(2.0)
        finally:
            writer.stop.set()
            writer.join(30)
        assert terminated >= 2 and writer.commits > 100, (terminated, writer.commits)
        want = {r[0]: (r[1], r[2]) for r in primary.query("SELECT id, v, note FROM items", dbname="ha")}
        _wait_for_table(job, tmp_path, lambda rows: rows == want, 240, "the source's table")
        job.send_signal(15)
        job.wait(180)
        assert job.returncode == 0, job_err()
    finally:
        _end(job, [primary])
