"""pytest plugin: one throwaway PostgreSQL 15 cluster for the whole test run.

* ``pg_cluster`` (session): a started :class:`spockwire.testing.PostgresCluster`; stopped and deleted at the end.
* ``pg_db`` (function): a fresh database on that cluster, as a :class:`PgDatabase` (``.name``, ``.dsn``, plus
  ``execute``/``query``/``connect`` shortcuts bound to it). Databases are never dropped (DROP DATABASE can hang
  with pglogical loaded), so every test gets a name nobody used before.

Tests using these fixtures are real-server tests: they always run and fail loudly when PostgreSQL is missing. They
get the ``pg`` marker automatically, so ``-m "not pg"`` can leave them out of a quick run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import pytest

from spockwire.testing import PostgresCluster


@dataclass(frozen=True)
class PgDatabase:
    """A fresh database on the session cluster."""

    cluster: PostgresCluster
    name: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(dbname=self.name)

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
        self.cluster.execute(sql, params, dbname=self.name)

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self.cluster.query(sql, params, dbname=self.name)

    def connect(self, **kwargs: Any) -> Any:
        return self.cluster.connect(self.name, **kwargs)

    def __str__(self) -> str:
        return self.name


PG_FIXTURES = frozenset({"pg_cluster", "pg_db"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the server fixtures with ``pg`` (nothing is skipped)."""
    for item in items:
        if PG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pg)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One running PostgreSQL cluster shared by every test of the run."""
    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_db(pg_cluster: PostgresCluster, request: pytest.FixtureRequest) -> Iterator[PgDatabase]:
    """A database no other test has used, named after the test for easier post-mortems.

    At the end, prepared transactions the test left in it are rolled back: a prepared transaction holds back
    every later logical slot creation on the cluster (it waits for all running transactions to end)."""
    prefix = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:24]
    name = pg_cluster.create_database(pg_cluster.new_database_name(prefix))
    yield PgDatabase(pg_cluster, name)
    if pg_cluster.running:
        for (gid,) in pg_cluster.query("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,),
                                       dbname=name):
            pg_cluster.execute(f"ROLLBACK PREPARED '{gid.replace(chr(39), chr(39) * 2)}'", dbname=name)
