"""A real Spock output plugin (spock_output, native protocol 5) on PostgreSQL 18, read with both pumps and
decoders and checked against test_decoding on a second slot of the same database."""
from __future__ import annotations

import pytest

import spockwire
from spockwire.connection.slots import drop_slot
from tests.live_oracle import oracle_items
from tests.test_connection_pg import collect, column_types, ours

pytestmark = pytest.mark.pg


@pytest.mark.parametrize("pump", ["c", "python"])
def test_spock_protocol_5_matches_test_decoding(spock_cluster, impl, pump):
    db = spock_cluster.create_database()
    dsn = spock_cluster.dsn(dbname=db)
    slot, oracle_slot = f"{db}_spock", f"{db}_oracle"

    class Db:  # the shape the oracle helpers read
        major = 18

        @staticmethod
        def query(sql, params=None):
            return spock_cluster.query(sql, params, dbname=db)

    spock_cluster.execute("CREATE EXTENSION spock", dbname=db)
    spock_cluster.execute("SELECT spock.node_create(node_name := 'n1', dsn := %s)", (dsn,), dbname=db)
    spock_cluster.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(8,2), flag bool)", dbname=db)
    spock_cluster.execute("SELECT spock.repset_add_table('default', 't')", dbname=db)
    spock_cluster.execute("SELECT pg_create_logical_replication_slot(%s, 'spock_output')", (slot,), dbname=db)
    spock_cluster.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (oracle_slot,),
                          dbname=db)
    try:
        with spockwire.connect(dsn, slot=slot, plugin="spock", replication_sets="default", pump=pump,
                               decoder_factory=lambda protocol: impl.Decoder(protocol)) as stream:
            for sql in ("INSERT INTO t SELECT g, 'v' || g, g / 3.0, g % 2 = 0 FROM generate_series(1, 50) g",
                        "UPDATE t SET v = 'changed', flag = NULL WHERE id <= 10",
                        "DELETE FROM t WHERE id > 45",
                        "BEGIN; INSERT INTO t VALUES (100, 'in txn', 1.5, true); UPDATE t SET n = 0 WHERE id = 1; "
                        "COMMIT"):
                spock_cluster.execute(sql, dbname=db)
            expected, _ = oracle_items(Db, oracle_slot, ())
            types = column_types(Db)
            events = collect(stream, lambda evs: len(ours(evs, types)[0]) >= len(expected))
            assert stream.proto_version == 5
            assert stream.startup_params.get("proto_version") == "5"
            assert ours(events, types)[0] == expected
            assert len(expected) == 50 + 10 + 5 + 2
    finally:
        for name in (slot, oracle_slot):
            drop_slot(dsn, name)
