"""A real client: pgbench (`pgbench -i`, then `pgbench -c 4 -T 30`) writes while the pipeline job streams its
publication, with migrations in the middle of the run (a column added with a default to pgbench_accounts, a
widening of pgbench_tellers' balance); once pgbench is done and the job has caught up, every Delta table equals its
source table, every row and every column. pgbench_history has no key: it lands row for row (spark/keyless.py)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from spockwire.spark.job import JobConfig, flush_lsn, start, target_path, wait_caught_up
from tests.spark_session import spark_session
from tests.test_spark_schema_changes import _delta, _source
from tests.test_spark_source import _slot

pytestmark = pytest.mark.pg

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _pgbench(db, *args: str, **kw) -> subprocess.Popen:
    cluster = db.cluster
    env = {**os.environ, "PGHOST": cluster.host, "PGPORT": str(cluster.port), "PGUSER": cluster.user,
           "PGDATABASE": db.name}
    lib = os.path.join(os.path.dirname(cluster.bindir), "lib")
    if os.path.isdir(lib):              # the embedded server's client programs find its libpq there
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH")) if p)
    return subprocess.Popen([os.path.join(cluster.bindir, "pgbench"), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.timeout(600)
def test_pgbench_writes_while_the_job_streams_and_tables_migrate(spark, pg_db, tmp_path):
    init = _pgbench(pg_db, "-i", "-s", "1", "-q")
    assert init.wait(120) == 0, init.stdout.read()
    pg_db.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"], tables={},
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.5, create_slot=True)
    reports = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        bench = _pgbench(pg_db, "-c", "4", "-T", "30", "-n")
        try:
            time.sleep(10)
            pg_db.execute("ALTER TABLE pgbench_accounts ADD COLUMN note text NOT NULL DEFAULT 'opened'")
            time.sleep(5)
            pg_db.execute("ALTER TABLE pgbench_tellers ALTER COLUMN tbalance TYPE bigint")
        finally:
            out = bench.communicate(timeout=120)[0]
        assert bench.returncode == 0, out
        transactions = int(next(ln for ln in out.splitlines() if "number of transactions actually processed" in ln)
                           .split(":")[1].split("/")[0])
        assert transactions > 100
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
    finally:
        query.stop()
    for table in TABLES:
        names, want = _source(pg_db, table)
        have, got = _delta(target_path(cfg.target, f"public.{table}"), names)
        assert have == names, table
        assert got == want, f"{table} differs from its source"
    rereads = {t for r in reports for t in r.reread}
    assert rereads == {"public.pgbench_accounts", "public.pgbench_tellers"}
    assert sum(sum(r.rows.values()) for r in reports) > transactions     # every transaction's changes streamed
