"""The DDL capture (spockwire.connection.ddl_capture, `spockwire ddl-capture`) against live servers: installed
and removed by the command (idempotent; a role that is no superuser gets one line), each ALTER TABLE writes one
transactional message in its own transaction with the table's columns after it, their key flags, missing values,
defaults, and whether the statement rewrote the table; pgoutput delivers it through the spockwire decoder."""
from __future__ import annotations

import subprocess
import sys

import pytest

from spockwire.connection.ddl_capture import PREFIX, installed, parse_message

pytestmark = [pytest.mark.pg, pytest.mark.pg_servers("pg15", "pg18")]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spockwire", "ddl-capture", *args], capture_output=True, text=True,
                          timeout=120)


def _installed(db) -> bool:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            return installed(cur)
    finally:
        conn.close()


def test_the_command_installs_and_removes_the_capture(pg_db):
    assert not _installed(pg_db)
    for _ in range(2):               # installing twice is the same as once
        done = _cli("--dsn", pg_db.dsn)
        assert done.returncode == 0, done.stderr
        assert _installed(pg_db)
    role = f"{pg_db.name}_app"[:63]
    pg_db.execute(f'CREATE ROLE "{role}" LOGIN')
    refused = _cli("--dsn", pg_db.cluster.dsn(dbname=pg_db.name, user=role), "--uninstall")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "superuser" in refused.stderr
    done = _cli("--dsn", pg_db.dsn, "--uninstall")
    assert done.returncode == 0, done.stderr
    assert not _installed(pg_db)


def test_each_alter_table_writes_its_outcome_where_it_happened(pg_db):
    import spockwire
    from spockwire.model import LogicalMessage

    from spockwire.connection.ddl_capture import install

    install(pg_db.dsn)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, s text)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = f"{pg_db.name}_ddl"[:63]
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    statements = ["ALTER TABLE t ADD COLUMN a text",
                  "ALTER TABLE t ADD COLUMN b text DEFAULT 'x'",
                  "ALTER TABLE t ADD COLUMN u uuid DEFAULT gen_random_uuid()",
                  "ALTER TABLE t RENAME COLUMN s TO label",
                  "ALTER TABLE t ALTER COLUMN v TYPE bigint",
                  "ALTER TABLE t DROP COLUMN a",
                  "ALTER TABLE t REPLICA IDENTITY FULL",
                  "CREATE INDEX ON t (v)"]
    for sql in statements:
        pg_db.execute(sql)
    rows = pg_db.query("SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                       "'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')", (slot,))
    dec = spockwire.Decoder(protocol="pgoutput")
    from spockwire.connection.slots import parse_lsn

    for lsn, data in rows:
        dec.feed(bytes(data), lsn=parse_lsn(lsn))
    messages = [e for e in dec.drain() if isinstance(e, LogicalMessage) and e.prefix == PREFIX]
    assert len(messages) == 7                           # one per ALTER TABLE, none for CREATE INDEX
    assert all(m.transactional for m in messages)
    assert len({m.commit_lsn for m in messages}) == 7   # each in its own statement's transaction
    got = [parse_message(m.content) for m in messages]
    assert all(g["table"] == "public.t" for g in got)
    names = [[c[0] for c in g["columns"]] for g in got]
    assert names == [["id", "v", "s", "a"], ["id", "v", "s", "a", "b"], ["id", "v", "s", "a", "b", "u"],
                     ["id", "v", "label", "a", "b", "u"], ["id", "v", "label", "a", "b", "u"],
                     ["id", "v", "label", "b", "u"], ["id", "v", "label", "b", "u"]]
    assert [g["rewritten"] for g in got] == [False, False, True, False, True, False, False]
    a, b = got[1]["columns"][3:]
    assert a[4:] == [False, False, False]               # no default: every existing row is NULL
    assert b[4] is True                                 # a constant default: kept as the rows' missing value
    u = got[2]["columns"][5]
    assert u[5] is True and got[2]["columns"][4][4] is False   # the rewrite wrote b's value into every row
    assert [c[3] for c in got[0]["columns"]] == [True, False, False, False]
    assert all(c[3] for c in got[-1]["columns"])        # REPLICA IDENTITY FULL: every column is a key column
    assert got[4]["columns"][1][1] == 20                # v is a bigint (type OID 20) after the type change
