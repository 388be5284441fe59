"""One writer per Delta table (spark/ownership.py): a second job -- its own slot and checkpoint -- pointed at the
tables of a running one is refused before it writes anything, with one line naming the owner; with take_over it
becomes their writer, and the first job is refused from then on."""
from __future__ import annotations

import time

import deltalake
import pytest

from spockwire.spark.job import JobConfig, flush_lsn, start, target_path, wait_caught_up
from spockwire.spark.ownership import OWNER_PROPERTY
from tests.spark_session import spark_session

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _failed(query, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not query.isActive, "the query kept running"
    return str(query.exception())


def test_a_second_job_on_the_same_tables_is_refused_unless_it_takes_them_over(spark, pg_db, tmp_path):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'a' FROM "
                  "generate_series(1, 100) g; CREATE PUBLICATION pub FOR TABLE t")

    def cfg(name: str, **kw) -> JobConfig:
        return JobConfig(dsn=pg_db.dsn, slot=f"{pg_db.name}_{name}"[:63], publication=["pub"],
                         tables={"public.t": None}, target=str(tmp_path / "delta"),
                         checkpoint=str(tmp_path / f"ck_{name}"), starting_position="snapshot", trigger_seconds=0.3,
                         create_slot=True, history=True, **kw)

    first = start(spark, cfg("a"))
    try:
        wait_caught_up(first, flush_lsn(pg_db.dsn), timeout=300)
        owner = f"spockwire-{first.id}"
        for history in (False, True):
            table = deltalake.DeltaTable(target_path(str(tmp_path / "delta"), "public.t", history))
            assert table.metadata().configuration[OWNER_PROPERTY] == owner
        before = deltalake.DeltaTable(target_path(str(tmp_path / "delta"), "public.t")).version()
        second = start(spark, cfg("b"))
        text = _failed(second)
        assert "is written by another streaming query" in text and owner in text and "--take-over" in text, text
        assert deltalake.DeltaTable(target_path(str(tmp_path / "delta"), "public.t")).version() == before
        pg_db.execute("UPDATE t SET v = 'b' WHERE id = 1")
        wait_caught_up(first, flush_lsn(pg_db.dsn), timeout=300)       # the owner goes on
    finally:
        first.stop()
    third = start(spark, cfg("c", take_over=True))
    try:
        wait_caught_up(third, flush_lsn(pg_db.dsn), timeout=300)
        table = deltalake.DeltaTable(target_path(str(tmp_path / "delta"), "public.t"))
        assert table.metadata().configuration[OWNER_PROPERTY] == f"spockwire-{third.id}"
        assert sorted(r["v"] for r in table.to_pyarrow_table().to_pylist()).count("b") == 1
    finally:
        third.stop()
    again = start(spark, cfg("a"))              # the first job, from its own checkpoint: no longer the owner
    pg_db.execute("UPDATE t SET v = 'c' WHERE id = 2")
    assert "is written by another streaming query" in _failed(again)
