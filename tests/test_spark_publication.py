"""Whole publications through the pipeline job, against a live server: with no table named, the job lands every
table of its publications (name patterns and exclusions applied); a table added to the publication later is read
whole and streamed from then on without a restart, whether or not it changed since; a table removed from the
publication or dropped keeps its Delta table, and the job says so once."""
from __future__ import annotations

import time

import pytest

from spockwire.spark.job import JobConfig, flush_lsn, publication_tables, resolve_tables, start, target_path, \
    wait_caught_up
from tests.spark_session import spark_session
from tests.test_spark_schema_changes import _delta, _source
from tests.test_spark_source import _slot

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _equal(db, cfg, table: str) -> None:
    names, want = _source(db, table)
    have, got = _delta(target_path(cfg.target, f"public.{table}"), names)
    assert have == names and got == want, table


def _wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_job_takes_the_whole_publication_and_follows_it(spark, pg_db, tmp_path, capfd):
    for t in ("a", "b", "tmp_scratch", "c", "d"):
        pg_db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        pg_db.execute(f"INSERT INTO {t} SELECT g, '{t}' || g FROM generate_series(1, 25) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE a, b, tmp_scratch")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"], tables={}, exclude=["public.tmp_*"],
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.2, create_slot=True)
    resolved = resolve_tables(cfg)
    assert resolved.follow and list(resolved.tables) == ["public.a", "public.b"]
    assert publication_tables(resolved) == ["public.a", "public.b"]
    reports = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        _equal(pg_db, cfg, "a")
        _equal(pg_db, cfg, "b")
        assert not (tmp_path / "delta" / "public.tmp_scratch").exists()
        # c joins without a change of its own; d joins and changes at once
        pg_db.execute("ALTER PUBLICATION pub ADD TABLE c")
        pg_db.execute("UPDATE a SET v = 'x' WHERE id = 1")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        _wait_until(lambda: (tmp_path / "delta" / "public.c").exists())
        _equal(pg_db, cfg, "c")
        pg_db.execute("ALTER PUBLICATION pub ADD TABLE d")
        pg_db.execute("UPDATE d SET v = 'changed' WHERE id < 5")
        pg_db.execute("INSERT INTO c VALUES (100, 'new')")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        _equal(pg_db, cfg, "c")
        _equal(pg_db, cfg, "d")
        pg_db.execute("ALTER PUBLICATION pub DROP TABLE b")
        pg_db.execute("UPDATE b SET v = 'not landed'")
        pg_db.execute("CREATE TABLE nokey (v text)")
        pg_db.execute("ALTER PUBLICATION pub ADD TABLE nokey")
        pg_db.execute("INSERT INTO nokey VALUES ('x')")
        pg_db.execute("UPDATE a SET v = 'y' WHERE id = 2")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        said = []
        _wait_until(lambda: said.append(capfd.readouterr().err) or
                    ("public.b is no longer in the publication" in "".join(said) and
                     "public.nokey has no key" in "".join(said)))
        assert "".join(said).count("public.nokey has no key") == 1     # said once, as it joined
        _equal(pg_db, cfg, "a")
        _equal(pg_db, cfg, "nokey")                                    # a table without a key lands too
    finally:
        query.stop()
    assert {t for r in reports for t in r.reread} == {"public.c", "public.d", "public.nokey"}   # each read as it joined
