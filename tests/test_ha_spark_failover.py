"""The Spark pipeline job through five promotions of a physical standby, with a writer running (see
tests/test_high_availability.py for the clusters and the multi-host DSN)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spockwire.testing import PostgresCluster
from tests.test_high_availability import ROOT, ROUNDS, Writer, _multi_dsn, _ports, _wait_synced, ha_clusters, new_standby

pytestmark = [pytest.mark.pg, pytest.mark.slow]


def _delta_rows(path: Path) -> dict:
    import deltalake

    if not (path / "_delta_log").exists():
        return {}
    return {r["id"]: (r["v"], r["note"]) for r in deltalake.DeltaTable(str(path)).to_pyarrow_table(
        columns=["id", "v", "note"]).to_pylist()}


@pytest.mark.timeout(900)
def test_the_spark_job_survives_five_promotions_with_a_writer_running(tmp_path):
    """`spockwire pipeline --failover-slot` on a multi-host DSN (snapshot, then changes) while a writer runs;
    five times the primary is stopped at once and its standby promoted. The job goes on by itself (its query
    started again from the checkpoint once the new primary answers, each time said in a JSON line), and its Delta
    table equals the last primary's table."""
    ports = _ports(ROUNDS + 2)
    clusters: list[PostgresCluster] = []
    job = None
    try:
        primary, standby = ha_clusters(ports, clusters)
        dsn = _multi_dsn(ports, "ha")
        target = tmp_path / "delta"
        job = subprocess.Popen([sys.executable, "-m", "spockwire", "pipeline", "--dsn", dsn, "--slot", "cdc",
                                "--publication", "pub", "--table", "public.items", "--create-slot", "--failover-slot",
                                "--starting-position", "snapshot", "--target", str(target), "--checkpoint",
                                str(tmp_path / "ck"), "--trigger-seconds", "0.5", "--no-maintenance"],
                               cwd=ROOT, stdout=open(tmp_path / "job.out", "w"), stderr=open(tmp_path / "job.err", "w"))
        job_err = lambda: (tmp_path / "job.err").read_text()[-3000:]  # noqa: E731 - (files: a full pipe stalls it)
        deadline = time.monotonic() + 300
        while len(_delta_rows(target / "public.items")) < 2000:
            assert job.poll() is None and time.monotonic() < deadline, job_err()
            time.sleep(0.5)
        writer = Writer(dsn, 11)
        writer.start()
        try:
            for r in range(ROUNDS):
                _wait_synced(primary, standby, "cdc", "ha", consumer=(job, tmp_path / "job.err"))
                time.sleep(random.Random(r).uniform(0.5, 2.0))
                assert job.poll() is None, job_err()
                primary.stop(mode="immediate")
                standby.promote()
                primary, standby = standby, new_standby(standby, r, ports, clusters)
            time.sleep(2.0)
        finally:
            writer.stop.set()
            writer.join(30)
        assert writer.commits > 100 and writer.failures >= ROUNDS, (writer.commits, writer.failures)
        want = {r[0]: (r[1], r[2]) for r in primary.query("SELECT id, v, note FROM items", dbname="ha")}
        deadline = time.monotonic() + 300
        while _delta_rows(target / "public.items") != want:
            assert job.poll() is None, job_err()
            assert time.monotonic() < deadline, "the Delta table did not come to equal the last primary's table"
            time.sleep(1.0)
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
        if job is not None and job.poll() is None:
            job.kill()
        for c in clusters:
            c.stop()
