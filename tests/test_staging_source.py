"""A staging folder records its source and refuses changes from another one.

The ingest worker reads the source from the server (system identifier, database) and its settings (slot, plugin,
publications); every log entry carries it. Pointed at another database, another slot or other publications, the
worker stops with one line naming both sources, stages nothing and acknowledges nothing. A folder written before
sources were recorded takes the source of the first worker that writes to it. The oracle for the recorded
identity is the server's own `pg_control_system()` and `current_database()`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spockwire.connection import create_publication, create_slot
from spockwire.ingest import StagingWriter, read_log
from spockwire.ingest.source import StagingSource, read_source
from spockwire.ingest.staging import StagingError, StagingState
from spockwire.ingest.worker import IngestConfig, IngestWorker
from tests.pg_fixtures import PgDatabase

ROOT = Path(__file__).resolve().parent.parent


def _database(pg_cluster, name: str, *slots: str) -> PgDatabase:
    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name(name)))
    db.execute(f"CREATE TABLE {name}_t (id int PRIMARY KEY, v text)")
    create_publication(db.dsn, "pub")
    db.execute("CREATE PUBLICATION pub2 FOR ALL TABLES")
    for slot in slots:
        create_slot(db.dsn, slot, "pgoutput")
    return db


def _run(db: PgDatabase, slot: str, out: Path, publication: list[str] | None = None) -> int:
    return IngestWorker(IngestConfig(dsn=db.dsn, slot=slot, out=str(out), publication=publication or ["pub"],
                                     idle_exit=0.8, flush_seconds=0.2, progress=False)).run()


def _confirmed(db: PgDatabase, slot: str) -> str:
    return db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0]


def test_the_log_records_the_source_and_another_source_is_refused(pg_cluster, tmp_path):
    a = _database(pg_cluster, "src_a", "src_a_slot", "src_a_other")
    b = _database(pg_cluster, "src_b", "src_b_slot")
    a.execute("INSERT INTO src_a_t SELECT g, 'a' FROM generate_series(1, 50) g")
    b.execute("INSERT INTO src_b_t SELECT g, 'b' FROM generate_series(1, 50) g")
    out = tmp_path / "staging"
    assert _run(a, "src_a_slot", out) == 0

    system = a.query("SELECT system_identifier::text FROM pg_control_system()")[0][0]
    recorded = {"system_identifier": system, "database": a.name, "slot": "src_a_slot", "plugin": "pgoutput",
                "publications": ["pub"]}
    entries = read_log(out)
    assert entries and all(e["source"] == recorded for e in entries)
    assert StagingState.load(out).source == StagingSource.from_json(recorded)

    # another database, another slot of the same database, other publications: refused, nothing staged or acked
    before_b, before_other = _confirmed(b, "src_b_slot"), _confirmed(a, "src_a_other")
    cases = [(b, "src_b_slot", ["pub"], f"database '{b.name}' slot 'src_b_slot'"),
             (a, "src_a_other", ["pub"], f"database '{a.name}' slot 'src_a_other'"),
             (a, "src_a_slot", ["pub", "pub2"], f"database '{a.name}' slot 'src_a_slot' plugin pgoutput "
                                                 "publications pub,pub2")]
    for db, slot, pubs, other in cases:
        with pytest.raises(StagingError) as info:
            _run(db, slot, out, pubs)
        message = str(info.value)
        assert "\n" not in message
        assert f"holds changes from system {system} database '{a.name}' slot 'src_a_slot' plugin pgoutput " \
               f"publications pub; refusing to add changes from system {system} {other}" in message, message
    assert read_log(out) == entries
    assert StagingState.load(out).tables == ["public.src_a_t"]
    assert _confirmed(b, "src_b_slot") == before_b and _confirmed(a, "src_a_other") == before_other

    # the command line: exit status 1 and the one-line error
    done = subprocess.run([sys.executable, "-m", "spockwire", "ingest", "--dsn", b.dsn, "--slot", "src_b_slot",
                           "--publication", "pub", "--out", str(out), "--idle-exit", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("spockwire ingest: error: staging folder") and f"database '{b.name}'" in last, last
    assert "Traceback" not in done.stderr

    # the same source again (publication list in another order / form) goes on
    a.execute("INSERT INTO src_a_t VALUES (51, 'a')")
    assert IngestWorker(IngestConfig(dsn=a.dsn, slot="src_a_slot", out=str(out), publication="pub",
                                     idle_exit=0.8, flush_seconds=0.2, progress=False)).run() == 0
    assert len(read_log(out)) > len(entries)


def test_a_folder_without_a_source_record_takes_the_first_workers_source(pg_db, tmp_path):
    pg_db.execute("CREATE TABLE old_t (id int PRIMARY KEY)")
    create_publication(pg_db.dsn, "pub")
    slot = f"{pg_db.name}_s"
    create_slot(pg_db.dsn, slot, "pgoutput")
    out = tmp_path / "staging"
    with StagingWriter(out, "pgoutput") as writer:                 # as written before sources were recorded
        writer.commit(1)
    assert "source" not in read_log(out)[0] and StagingState.load(out).source is None
    pg_db.execute("INSERT INTO old_t VALUES (1)")
    assert IngestWorker(IngestConfig(dsn=pg_db.dsn, slot=slot, out=str(out), publication=["pub"], idle_exit=0.8,
                                     flush_seconds=0.2, progress=False)).run() == 0
    source = StagingState.load(out).source
    assert source == read_source(pg_db.dsn, slot=slot, plugin="pgoutput", publication="pub")
    assert source.database == pg_db.name and source.slot == slot


def test_another_server_is_refused(tmp_path):
    """Two sources that differ only in the server's system identifier (a restored copy of the database on another
    server has the same database and slot names)."""
    one = StagingSource.of("7312", "shop", "cdc", "pgoutput", ["pub"])
    two = StagingSource.of("7313", "shop", "cdc", "pgoutput", "pub")
    with StagingWriter(tmp_path, "pgoutput", source=one) as writer:
        writer.commit(1)
    with StagingWriter(tmp_path, "pgoutput", source=StagingSource.of("7312", "shop", "cdc", "pgoutput", "pub")) as w:
        w.commit(2)
    with pytest.raises(StagingError, match="holds changes from system 7312 database 'shop' .* refusing to add "
                                           "changes from system 7313 database 'shop'"):
        StagingWriter(tmp_path, "pgoutput", source=two)
    pgl = StagingSource.of("7312", "shop", "cdc", "pglogical", None)
    assert pgl.to_json() == {"system_identifier": "7312", "database": "shop", "slot": "cdc",
                             "plugin": "pglogical_output", "replication_sets": ["default"]}
