"""The typed-values dataset (tests/test_typed_values.py), as a fixture registered once for the whole run
(tests/conftest.py lists this module in pytest_plugins): the modules that read it -- tests/test_typed_values.py and
tests/test_json_protocol.py -- share one dataset per server in each test process, instead of each making its own
(with the same slot names) in the same cluster."""
from __future__ import annotations

import pytest

from spockwire.values import PostgresTypeCatalog
from tests.pg_fixtures import SERVERS, PgDatabase
from tests.test_typed_values import (CASES, ERROR_CASES, PGL_BASE, PGL_BINARY, PGL_INTERNAL, PGOUTPUT_BINARY,
                                     PGOUTPUT_TEXT, SCHEMA, TEXT_SESSIONS, Dataset, _accepts_xml, _flatten,
                                     _insert_sql, _q, server_expected)


@pytest.fixture(scope="session", params=["pg15", "pg18"])
def dataset(request) -> Dataset:
    """The dataset on PostgreSQL 15 (pgoutput and pglogical streams) and on 18 (pgoutput streams only: no
    pglogical there; the pglogical tests take the 15 one alone)."""
    cluster = request.getfixturevalue(SERVERS[request.param])
    with_pglogical = request.param == "pg15"
    db = PgDatabase(cluster, cluster.create_database(cluster.new_database_name("typed_values")))
    db.execute(SCHEMA)
    for case in CASES:
        db.execute(f"CREATE TABLE t_{case.name} (id int PRIMARY KEY, v {case.sqltype})")
    for name, (sqltype, _value, _msg) in ERROR_CASES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v {sqltype})")
        db.execute(f"CREATE PUBLICATION pub_{name} FOR TABLE {name}")
    db.execute("CREATE PUBLICATION pub_main FOR TABLE " + ", ".join(f"t_{c.name}" for c in CASES))
    if with_pglogical:
        db.execute("CREATE EXTENSION pglogical")
        db.execute("SELECT pglogical.create_node(node_name := 'tv', dsn := %s)", (db.dsn,))
        for rset in ("tv_all", "tv_fixed"):
            db.execute("SELECT pglogical.create_replication_set(%s)", (rset,))
        for case in CASES:
            for rset in case.sets:
                db.execute("SELECT pglogical.replication_set_add_table(%s, %s::regclass)",
                           (f"tv_{rset}", f"t_{case.name}"))
    for slot, plugin in (("tv_text", "pgoutput"), ("tv_binary", "pgoutput"), ("tv_pgl", "pglogical_output")):
        if plugin == "pgoutput" or with_pglogical:
            db.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))

    # the embedded PostgreSQL 18 is built without libxml: xml values cannot be written there (only NULL)
    has_xml = _accepts_xml(db)
    for case in CASES:
        values = case.values if has_xml or case.sqltype.rstrip("[]") != "xml" else ()
        db.execute(_insert_sql(f"t_{case.name}", values))
    for name, (_sqltype, value, _msg) in ERROR_CASES.items():
        db.execute(_insert_sql(name, (value,)))

    data = Dataset(db)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            def peek(slot: str, options: dict[str, str]) -> list[tuple[int, bytes]]:
                cur.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                            "VARIADIC %s::text[])", (slot, _flatten(options)))
                return [(int(hi, 16) << 32 | int(lo, 16), bytes(d))
                        for (hi, lo), d in ((lsn.split("/"), d) for lsn, d in cur.fetchall())]
            for tz, bytea_output in TEXT_SESSIONS:
                cur.execute(f"SET TimeZone = {_q(tz)}; SET bytea_output = {_q(bytea_output)}")
                data.streams[f"text_{tz}_{bytea_output}"] = ("pgoutput", peek("tv_text", PGOUTPUT_TEXT))
            cur.execute("RESET TimeZone; RESET bytea_output")
            data.streams["binary"] = ("pgoutput", peek("tv_binary", PGOUTPUT_BINARY))
            for name in ERROR_CASES:
                for fmt, options in (("text", PGOUTPUT_TEXT), ("binary", PGOUTPUT_BINARY)):
                    data.streams[f"{name}_{fmt}"] = ("pgoutput", peek(f"tv_{fmt}",
                                                                      dict(options, publication_names=f"pub_{name}")))
            if with_pglogical:
                data.streams["pgl_text"] = ("pglogical", peek("tv_pgl", PGL_BASE))
                data.streams["pgl_binary"] = ("pglogical", peek("tv_pgl", PGL_BINARY))
                data.streams["pgl_internal_fixed"] = ("pglogical", peek("tv_pgl", dict(
                    PGL_INTERNAL, **{"pglogical.replication_set_names": "tv_fixed"})))
                data.streams["pgl_internal_all"] = ("pglogical", peek("tv_pgl", PGL_INTERNAL))
            data.expected.update(server_expected(cur, CASES))
    finally:
        conn.close()
    data.catalog = PostgresTypeCatalog(db.dsn)
    yield data
    data.catalog.close()
