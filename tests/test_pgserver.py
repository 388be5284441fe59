"""The throwaway PostgreSQL cluster used by the real-server tests."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg2
import pytest

from spockwire.testing import PostgresCluster, PostgresNotFound
from spockwire.testing.pgbinaries import (_world_readable_copy, cache_dir, embedded_bindir, find_bindir,
                                          find_embedded_pginstall, server_major)
from spockwire.testing.pgserver import _conf_value


def test_cluster_accepts_connections(pg_cluster: PostgresCluster) -> None:
    assert pg_cluster.running
    assert pg_cluster.scalar("SELECT 1") == 1
    assert pg_cluster.server_version_num >= 150000
    conn = psycopg2.connect(pg_cluster.dsn())
    try:
        assert conn.get_dsn_parameters()["host"] == "127.0.0.1"
        assert int(conn.get_dsn_parameters()["port"]) == pg_cluster.port
    finally:
        conn.close()


def test_settings(pg_cluster: PostgresCluster) -> None:
    show = {name: pg_cluster.scalar(f"SHOW {name}") for name in (
        "wal_level", "max_replication_slots", "max_wal_senders", "max_prepared_transactions",
        "shared_preload_libraries", "track_commit_timestamp", "logical_decoding_work_mem", "listen_addresses",
        "fsync", "TimeZone")}
    assert show["wal_level"] == "logical"
    assert int(show["max_replication_slots"]) >= 32
    assert int(show["max_wal_senders"]) >= 32
    assert int(show["max_prepared_transactions"]) >= 16
    assert "pglogical" in show["shared_preload_libraries"]
    assert show["track_commit_timestamp"] == "on"
    assert show["logical_decoding_work_mem"] == "64kB"
    assert show["listen_addresses"] == "127.0.0.1"
    assert show["fsync"] == "off"
    assert show["TimeZone"] == "UTC"
    if pg_cluster.server_knows_setting("output_plugin_libraries"):
        libs = pg_cluster.scalar("SHOW output_plugin_libraries")
        for plugin in ("pgoutput", "test_decoding", "pglogical_output", "wal2json"):
            assert plugin in libs


def test_pg_db_is_fresh_and_empty(pg_db) -> None:  # type: ignore[no-untyped-def]
    assert pg_db.query("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace") == [(0,)]
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    assert pg_db.query("SELECT current_database()") == [(pg_db.name,)]
    assert f"dbname={pg_db.name}" in pg_db.dsn


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding", "pglogical_output", "wal2json"])
def test_logical_slots_can_be_created(pg_db, plugin: str) -> None:  # type: ignore[no-untyped-def]
    if plugin.startswith("pglogical"):
        pg_db.execute("CREATE EXTENSION pglogical")
    slot = f"s_{plugin}"
    rows = pg_db.query("SELECT slot_name, lsn FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    assert rows[0][0] == slot
    assert pg_db.query("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(plugin,)]
    pg_db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_wal2json_and_test_decoding_decode(pg_db) -> None:  # type: ignore[no-untyped-def]
    pg_db.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    pg_db.execute("SELECT pg_create_logical_replication_slot('wj', 'wal2json')")
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'x')")
    td = [r[0] for r in pg_db.query("SELECT data FROM pg_logical_slot_peek_changes('td', NULL, NULL)")]
    assert "table public.t: INSERT: id[integer]:1 v[text]:'x'" in td
    wj = [r[0] for r in pg_db.query(
        "SELECT data FROM pg_logical_slot_peek_changes('wj', NULL, NULL, 'format-version', '2')")]
    assert any('"action":"I"' in line and '"table":"t"' in line for line in wj)
    pg_db.execute("SELECT pg_drop_replication_slot('td'); SELECT pg_drop_replication_slot('wj')")


def test_own_cluster_lifecycle_kill_restart_stop() -> None:
    pg = PostgresCluster(durable=True, settings={"logical_decoding_work_mem": "1MB"})
    with pg:
        assert pg.scalar("SHOW fsync") == "on"
        assert pg.scalar("SHOW logical_decoding_work_mem") == "1MB"
        db = pg.create_database()
        pg.execute("CREATE TABLE t (a int); INSERT INTO t VALUES (42)", dbname=db)
        port, tmpdir = pg.port, pg.tmpdir
        assert tmpdir is not None and tmpdir.exists()
        pg.kill()
        assert not pg.running
        with pytest.raises(psycopg2.OperationalError):
            psycopg2.connect(pg.dsn(db, connect_timeout=2))
        pg.restart()  # crash recovery
        assert pg.port == port
        assert pg.query("SELECT a FROM t", dbname=db) == [(42,)]
        pg.restart()
        assert pg.scalar("SELECT count(*) FROM t", dbname=db) == 1
    assert not pg.running
    assert not tmpdir.exists()
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2")


def test_create_database_validates_name(pg_cluster: PostgresCluster) -> None:
    with pytest.raises(ValueError):
        pg_cluster.create_database('bad"name')
    assert pg_cluster.new_database_name("x") != pg_cluster.new_database_name("x")


def test_missing_binaries_message(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SPOCKWIRE_PG_BINDIR", str(tmp_path))
    with pytest.raises(PostgresNotFound, match="SPOCKWIRE_PG_BINDIR"):
        find_bindir()
    monkeypatch.delenv("SPOCKWIRE_PG_BINDIR")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PostgresNotFound, match="apt-get install postgresql-15 postgresql-15-pglogical"):
        find_bindir(root=tmp_path)


def test_conf_value_quoting() -> None:
    assert _conf_value(True) == "on"
    assert _conf_value(32) == "32"
    assert _conf_value("it's") == "'it''s'"


def test_postgresql_18_from_the_wheel(pg18_cluster: PostgresCluster) -> None:
    assert pg18_cluster.major == 18
    assert 180000 <= pg18_cluster.server_version_num < 190000
    assert pg18_cluster.has_library("pgoutput") and pg18_cluster.has_library("test_decoding")
    # no pglogical in that server: nothing is preloaded by default
    assert "shared_preload_libraries" not in pg18_cluster.settings
    assert pg18_cluster.scalar("SHOW wal_level") == "logical"
    pginstall = find_embedded_pginstall()
    assert pginstall is not None
    # the postgres OS user runs it: in place when it can reach the wheel, else from the cache copy
    assert pg18_cluster.bindir == pginstall / "bin" or cache_dir() in pg18_cluster.bindir.parents
    assert embedded_bindir().parent.name == "pginstall"


def test_major_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    fifteen = find_bindir(major=15)
    assert server_major(fifteen) == 15
    monkeypatch.setenv("SPOCKWIRE_PG18_BINDIR", str(fifteen))
    with pytest.raises(PostgresNotFound, match="holds PostgreSQL 15, not 18"):
        PostgresCluster(major=18)


def test_world_readable_copy_is_made_once_even_when_raced(monkeypatch: pytest.MonkeyPatch) -> None:
    pginstall = find_embedded_pginstall()
    assert pginstall is not None
    cache = Path(tempfile.mkdtemp(prefix="spockwire-cache-test-"))
    try:
        os.chmod(cache, 0o755)
        monkeypatch.setenv("SPOCKWIRE_PG_CACHE", str(cache))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first, second = pool.map(lambda _: _world_readable_copy(pginstall), range(2))
        assert first == second and first.parent.parent.parent == cache
        assert [p.name for p in cache.iterdir()] == [first.parent.parent.name]  # no temporary folder left
        assert server_major(first / "bin") == 18
        # the client programs find the wheel's libpq beside the copy, as in the wheel
        out = subprocess.run([str(first / "bin" / "pg_recvlogical"), "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and "18" in out.stdout
        again = _world_readable_copy(pginstall)
        assert again == first
    finally:
        shutil.rmtree(cache)
