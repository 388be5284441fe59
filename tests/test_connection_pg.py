"""Live replication streams against real PostgreSQL 15 and 18 servers, checked against an oracle slot.

Each test creates its slots (ours and an oracle slot: wal2json on PostgreSQL 15, test_decoding on 18, which has no
wal2json) before running a workload, so both see exactly the same transactions; the decoded stream must equal what
the oracle reports for them. pglogical tests run on PostgreSQL 15 only (pglogical is not in the 18 server).
"""
from __future__ import annotations

import json
import struct
import sys
import threading
import time
from typing import Iterator

import pytest

from spockwire.connection import (ServerError, connect, create_publication, create_slot, list_slots,
                                  slot_info)
from spockwire.connection.slots import drop_slot
from spockwire.connection.options import pgoutput_max_proto
from spockwire.testing import PostgresCluster
from tests.live_oracle import oracle_items, ours
from tests.pg_fixtures import drop_inactive_slots

pytestmark = [pytest.mark.pg, pytest.mark.pg_servers("pg15", "pg18")]

PUMPS = ["c", "python"]


@pytest.fixture
def slot(pg_db) -> Iterator[str]:
    """A slot name no other test uses (slots are cluster-wide); the test's slots are dropped afterwards, since
    the session cluster has a limited number of them."""
    yield "s_" + "_".join(pg_db.name.rsplit("_", 2)[-2:])
    drop_inactive_slots(pg_db)

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text, flag bool, n bigint);
CREATE TABLE b (id int PRIMARY KEY, payload text, note text);
CREATE TABLE full_t (id int PRIMARY KEY, v text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
ALTER TABLE b ALTER COLUMN payload SET STORAGE EXTERNAL;
"""

# many tables interleaved in one transaction, REPLICA IDENTITY FULL, key changes, unchanged TOAST, schema change
WORKLOAD = [
    """INSERT INTO a SELECT g, 'a' || g, g % 2 = 0, g * 1000000000::bigint FROM generate_series(1, 40) g;
       INSERT INTO b SELECT g, 'p' || g, NULL FROM generate_series(1, 10) g;
       INSERT INTO full_t SELECT g, 'f' || g FROM generate_series(1, 10) g""",
    "BEGIN; " + "; ".join(f"INSERT INTO a VALUES ({100 + i}, 'x{i}', NULL, NULL); "
                          f"INSERT INTO b VALUES ({100 + i}, 'y{i}', 'n'); "
                          f"INSERT INTO full_t VALUES ({100 + i}, NULL)" for i in range(10)) + "; COMMIT",
    """UPDATE a SET v = v || '!' WHERE id <= 5;
       UPDATE a SET id = id + 1000 WHERE id BETWEEN 6 AND 8;
       UPDATE full_t SET v = 'changed' WHERE id <= 3;
       DELETE FROM full_t WHERE id BETWEEN 4 AND 6;
       DELETE FROM a WHERE id BETWEEN 9 AND 11""",
    "INSERT INTO b VALUES (999, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 600) g), 'big')",
    "UPDATE b SET note = 'toast unchanged' WHERE id = 999",
    "ALTER TABLE a ADD COLUMN extra text DEFAULT 'd'",
    "INSERT INTO a (id, v, extra) VALUES (5000, 'after alter', 'e'); UPDATE a SET extra = 'z' WHERE id = 1",
]


# ------------------------------------------------------------------------------------------------------------------
# helpers

def column_types(db) -> dict[tuple[str, str], dict[str, str]]:
    rows = db.query("""SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, NULL)
                         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                         JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped""")
    out: dict[tuple[str, str], dict[str, str]] = {}
    for nsp, rel, att, typ in rows:
        out.setdefault((nsp, rel), {})[att] = typ
    return out


def oracle_text(value):
    if isinstance(value, bool):
        return "t" if value else "f"
    if value is None:
        return None
    return str(value)


def oracle_plugin(db) -> str:
    """wal2json where the server has it (PostgreSQL 15 here), else test_decoding."""
    return "wal2json" if db.major == 15 else "test_decoding"


def oracle(db, slot: str, full_tables=("public.full_t",)) -> tuple[list, list]:
    (plugin,) = db.query("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0]
    if plugin == "test_decoding":
        return oracle_items(db, slot, full_tables)
    rows = db.query("SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, 'format-version', '2', "
                    "'include-transaction', 'false', 'include-types', 'false')", (slot,))
    items, messages = [], []
    for (data,) in rows:
        d = json.loads(data)
        action = d["action"]
        if action == "M":
            messages.append((d["transactional"], d["prefix"], d["content"]))
            continue
        table = f"{d['schema']}.{d['table']}"
        if d["schema"] != "public":
            continue
        if action == "T":
            items.append(("T", table))
            continue
        if action == "U" and table in full_tables and "identity" in d:
            old = {c["name"]: oracle_text(c["value"]) for c in d["identity"]}
            items.append(("U-old", table, tuple(sorted((k, v) for k, v in old.items() if v is not None))))
        cols = d["identity"] if action == "D" else d["columns"]
        vals = {c["name"]: oracle_text(c["value"]) for c in cols}
        if action == "D":
            vals = {k: v for k, v in vals.items() if v is not None}
        items.append((action, table, tuple(sorted(vals.items()))))
    return items, sorted(messages)


def collect(stream, done, timeout: float = 30.0) -> list:
    """Read events until done(events) holds (then a short extra read) or the timeout passes."""
    events: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += stream.read(0.2)
        if done(events):
            events += stream.read(0.2)
            return events
    raise AssertionError(f"timed out after {timeout} s with {len(events)} events")


def row_count(events) -> int:
    return sum(ev.num_rows for ev in events if hasattr(ev, "num_rows"))


def setup_pgoutput(db, slot: str, *, two_phase: bool = False):
    db.execute(SCHEMA)
    create_publication(db.dsn, "pub")
    create_slot(db.dsn, slot, "pgoutput", two_phase=two_phase)
    db.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot + "_oracle", oracle_plugin(db)))


def run(db, statements) -> None:
    for sql in statements:
        db.execute(sql)


def assert_matches_oracle(db, stream, oracle_slot: str, *, with_messages: bool = False,
                          full_tables=("public.full_t",)) -> list:
    expected, expected_msgs = oracle(db, oracle_slot, full_tables)
    types = column_types(db)
    events = collect(stream, lambda evs: len(ours(evs, types)[0]) >= len(expected)
                     and (not with_messages or len(ours(evs, types)[1]) >= len(expected_msgs)))
    got, got_msgs = ours(events, types)
    assert got == expected
    if with_messages:
        assert got_msgs == expected_msgs
    return events


# ------------------------------------------------------------------------------------------------------------------
# pgoutput

@pytest.mark.parametrize("pump", PUMPS)
def test_pgoutput_proto1_text_matches_wal2json(pg_db, pump, slot):
    setup_pgoutput(pg_db, slot)
    with connect(pg_db.dsn, slot=slot, publication="pub", proto_version=1, pump=pump) as stream:
        assert stream.impl == pump
        assert stream.options == {"proto_version": "1", "publication_names": '"pub"'}
        run(pg_db, WORKLOAD + ["TRUNCATE full_t"])
        events = assert_matches_oracle(pg_db, stream, slot + "_oracle")
        # key change: the preimage carries the old key
        pre = [r for ev in events if hasattr(ev, "to_arrow") and ev.relation.name == "a"
               for r in ev.to_arrow().to_pylist() if r["_change_type"] == "update_preimage"]
        assert sorted(int(r["id"]) for r in pre) == [6, 7, 8]
        # schema change mid-stream: a second version of the relation with the new column
        versions = {ev.relation.version: ev.relation.column_names for ev in events
                    if hasattr(ev, "relation") and getattr(ev.relation, "name", None) == "a"}
        assert versions[max(versions)][-1] == "extra" and "extra" not in versions[min(versions)]
        toast = [r for ev in events if hasattr(ev, "to_arrow") and ev.relation.name == "b"
                 for r in ev.to_arrow().to_pylist() if r["_unchanged_toast"]]
        assert [(int(r["id"]), r["_unchanged_toast"], r["note"]) for r in toast] == [(999, ["payload"], "toast unchanged")]
        stream.ack(send=True)
        acked = stream.acked_lsn
        assert acked == stream.delivered_lsn > 0
    info = slot_info(pg_db.dsn, slot)
    assert info is not None and info.confirmed_flush_lsn == acked and not info.active


class TapDecoder:
    """Wraps a decoder and records the message types it was fed."""

    def __init__(self, inner):
        self.inner = inner
        self.types: list[str] = []

    def feed_frames(self, data, partial_ok=False):
        pos = 0
        while pos < len(data):
            n = struct.unpack_from(">I", data, pos)[0]
            self.types.append(chr(data[pos + 12]))
            pos += 12 + n
        return self.inner.feed_frames(data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_pgoutput_proto2_binary_streaming(pg_db, slot):
    setup_pgoutput(pg_db, slot)
    taps = []

    def factory(protocol):
        from spockwire.wire import load_implementation
        taps.append(TapDecoder(load_implementation().Decoder(protocol)))
        return taps[-1]

    with connect(pg_db.dsn, slot=slot, publication="pub", proto_version=2, binary=True, streaming=True,
                 decoder_factory=factory) as stream:
        # PostgreSQL 16+ takes on/off/parallel; 15 a boolean
        assert stream.options["streaming"] == ("true" if pg_db.major < 16 else "on")
        assert stream.options["binary"] == "true"
        big = pg_db.connect()
        big.autocommit = False
        with big.cursor() as cur:
            # larger than logical_decoding_work_mem (64kB): streamed while in progress
            cur.execute("INSERT INTO a SELECT g, repeat('v', 50) || g, true, g FROM generate_series(1, 3000) g")
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO b SELECT g, 'rolled back', NULL FROM generate_series(1, 2000) g")
            cur.execute("ROLLBACK TO SAVEPOINT s1")
            # another transaction commits while the big one is open
            pg_db.execute("INSERT INTO full_t VALUES (77, 'concurrent')")
            cur.execute("SAVEPOINT s2")
            cur.execute("UPDATE a SET v = 'sub' WHERE id <= 100")
            cur.execute("RELEASE SAVEPOINT s2")
            cur.execute("INSERT INTO b SELECT g, 'kept', NULL FROM generate_series(1, 1500) g")
        big.commit()
        big.close()
        events = assert_matches_oracle(pg_db, stream, slot + "_oracle")
        assert not any(r == "rolled back" for ev in events if hasattr(ev, "to_arrow") and ev.relation.name == "b"
                       for r in ev.to_arrow().column("payload").to_pylist())
        kinds = set(taps[0].types)
        assert {"S", "E", "c"} <= kinds, kinds  # it really was streamed
        assert "A" in kinds  # the rolled-back subtransaction


def test_pgoutput_proto3_two_phase(pg_db, slot):
    setup_pgoutput(pg_db, slot, two_phase=True)
    with connect(pg_db.dsn, slot=slot, publication="pub", two_phase=True) as stream:
        assert stream.options["proto_version"] == str(pgoutput_max_proto(pg_db.cluster.server_version_num))
        assert stream.options["two_phase"] == "true"
        run(pg_db, ["BEGIN; INSERT INTO a VALUES (1, 'committed prepared'); PREPARE TRANSACTION 'g1'",
                    "COMMIT PREPARED 'g1'",
                    "BEGIN; INSERT INTO a VALUES (2, 'rolled back prepared'); PREPARE TRANSACTION 'g2'",
                    "ROLLBACK PREPARED 'g2'",
                    "INSERT INTO a VALUES (3, 'plain')",
                    "BEGIN; INSERT INTO a VALUES (4, 'still prepared'); PREPARE TRANSACTION 'g3'"])
        events = collect(stream, lambda evs: row_count(evs) >= 2)
        events += stream.read(1.0)
        types = column_types(pg_db)
        got, _ = ours(events, types)
        assert [dict(g[2])["v"] for g in got] == ["committed prepared", "plain"]
        pg_db.execute("COMMIT PREPARED 'g3'")
        events = collect(stream, lambda evs: row_count(evs) >= 1)
        assert [r["v"] for ev in events for r in ev.to_arrow().to_pylist()] == ["still prepared"]
        expected, _ = oracle(pg_db, slot + "_oracle")
        assert [dict(e[2])["v"] for e in expected] == ["committed prepared", "plain", "still prepared"]


def test_pgoutput_messages_truncate_origin(pg_db, slot):
    setup_pgoutput(pg_db, slot)
    pg_db.execute("SELECT pg_replication_origin_create('upstream_a')")
    with connect(pg_db.dsn, slot=slot, publication=["pub"], messages=True) as stream:
        run(pg_db, ["INSERT INTO a VALUES (1, 'one'), (2, 'two')",
                    "BEGIN; SELECT pg_logical_emit_message(true, 'app', 'in txn'); INSERT INTO a VALUES (3); COMMIT",
                    "SELECT pg_logical_emit_message(false, 'app', 'outside')",
                    "TRUNCATE a, full_t",
                    "SELECT pg_replication_origin_session_setup('upstream_a'); "
                    "INSERT INTO b VALUES (1, 'from elsewhere')"])
        events = assert_matches_oracle(pg_db, stream, slot + "_oracle", with_messages=True)
        origins = {r["_origin"] for ev in events if hasattr(ev, "to_arrow") and ev.relation.name == "b"
                   for r in ev.to_arrow().to_pylist()}
        assert origins == {"upstream_a"}
        truncs = [ev for ev in events if hasattr(ev, "restart_identity")]
        assert len(truncs) == 1 and {r.name for r in truncs[0].relations} == {"a", "full_t"}


# ------------------------------------------------------------------------------------------------------------------
# pglogical

def setup_pglogical(db, slot: str) -> None:
    db.execute(SCHEMA)
    # pglogical only takes tables with a replica-identity index into a set that replicates UPDATE/DELETE
    db.execute("ALTER TABLE full_t REPLICA IDENTITY DEFAULT")
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (db.dsn,))
    db.execute("SELECT pglogical.replication_set_add_all_tables('default', ARRAY['public'])")
    create_slot(db.dsn, slot, "pglogical")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot + "_oracle",))


@pytest.mark.pg_servers("pg15")
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_pglogical_matches_wal2json(pg_db, binary, slot):
    setup_pglogical(pg_db, slot)
    with connect(pg_db.dsn, slot=slot, plugin="pglogical", binary=binary) as stream:
        run(pg_db, WORKLOAD)
        assert_matches_oracle(pg_db, stream, slot + "_oracle", full_tables=())
        assert stream.proto_version == 1
        assert stream.startup_params["binary.binary_basetypes"] == ("t" if binary else "f")
        assert stream.startup_params["binary.internal_basetypes"] == "f"
        assert stream.options["pglogical.replication_set_names"] == "default"


# ------------------------------------------------------------------------------------------------------------------
# refusals, helpers

def test_server_errors_are_not_retried(pg_db, slot):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(ServerError) as info:
        connect(pg_db.dsn, slot="missing", publication="pub")
    assert info.value.sqlstate == "42704"
    create_slot(pg_db.dsn, slot, "pgoutput")
    with connect(pg_db.dsn, slot=slot, publication="does_not_exist") as stream:
        pg_db.execute("INSERT INTO t VALUES (1)")
        if pg_db.major < 18:
            with pytest.raises(ServerError, match="does_not_exist"):
                for _ in range(50):
                    stream.read(0.2)
        else:
            # PostgreSQL 18 skips a publication that does not exist (with a WARNING in the server log) and
            # publishes from the moment it is created
            assert [ev for _ in range(5) for ev in stream.read(0.2)] == []
            pg_db.execute("CREATE PUBLICATION does_not_exist FOR TABLE t")
            pg_db.execute("INSERT INTO t VALUES (2)")
            events = collect(stream, lambda evs: row_count(evs) >= 1)
            assert [int(r["id"]) for ev in events for r in ev.to_arrow().to_pylist()] == [2]
        assert stream.reconnects == 0


def test_slot_helpers_report_lag(pg_db, slot):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub", ["public.t"])
    assert create_publication(pg_db.dsn, "pub", ["public.t"]) is False
    first = create_slot(pg_db.dsn, slot, "pgoutput")
    assert create_slot(pg_db.dsn, slot, "pgoutput") == first
    with pytest.raises(ValueError, match="plugin"):
        create_slot(pg_db.dsn, slot, "pglogical")
    pg_db.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
    (info,) = list_slots(pg_db.dsn, database=pg_db.name)
    assert info.name == slot and info.lag_bytes > 100_000 and not info.active
    with connect(pg_db.dsn, slot=slot, publication="pub") as stream:
        collect(stream, lambda evs: row_count(evs) >= 1000)
        stream.ack(send=True)
        deadline = time.monotonic() + 10
        while slot_info(pg_db.dsn, slot).lag_bytes > 50_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert slot_info(pg_db.dsn, slot).lag_bytes < 50_000
    assert drop_slot(pg_db.dsn, slot) is True
    assert drop_slot(pg_db.dsn, slot) is False
    assert list_slots(pg_db.dsn, database=pg_db.name) == []


# ------------------------------------------------------------------------------------------------------------------
# kill the server mid-stream

@pytest.mark.parametrize("major, transport, impl",
                         [(15, "replication", "c"), (15, "sql", "c"), (18, "replication", "c"),
                          (15, "replication", "python")],
                         ids=["pg15-replication", "pg15-sql", "pg18-replication", "pg15-replication-python"])
def test_resume_after_server_crash(major, transport, impl, monkeypatch):
    monkeypatch.setenv("SPOCKWIRE_IMPL", impl)   # the pump and the decoder of every (re)connect
    with PostgresCluster(durable=True, major=major) as pg:
        db = pg.create_database("crash")
        pg.execute("CREATE TABLE t (id int PRIMARY KEY, batch int)", dbname="crash")
        dsn = pg.dsn(dbname="crash")
        create_publication(dsn, "pub")
        create_slot(dsn, "crashslot", "pgoutput")

        def txns(lo, hi):
            conn = pg.connect("crash")
            with conn.cursor() as cur:
                for i in range(lo, hi):
                    cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(%s, %s) g", (i, i * 10, i * 10 + 9))
            conn.close()

        txns(0, 200)
        persisted: list[tuple[int, int, int]] = []
        # sql: every call that finds a backlog is a split (both cursor slots outlive the crash; the stream after
        # it drops them once their backends are gone)
        with connect(dsn, slot="crashslot", publication="pub", max_backoff=0.5, reconnect_timeout=120,
                     transport=transport, sql_batch_changes=5000, sql_split_bytes=1) as stream:
            assert stream.impl == impl
            deadline = time.monotonic() + 60
            while len(persisted) < 1000 and time.monotonic() < deadline:
                for ev in stream.read(0.5):
                    persisted += [(r["_commit_lsn"], r["_seq"], int(r["id"])) for r in ev.to_arrow().to_pylist()]
            stream.ack(send=True)
            acked = stream.acked_lsn
            assert all(lsn < acked for lsn, _, _ in persisted)
            pg.kill()
            restarter = threading.Timer(1.0, pg.restart)  # same port: the dsn stays valid
            restarter.start()
            after: list[tuple[int, int, int]] = []
            try:
                deadline = time.monotonic() + 90
                while stream.reconnects == 0 and time.monotonic() < deadline:
                    after += [(r["_commit_lsn"], r["_seq"], int(r["id"]))
                              for ev in stream.read(0.5) for r in ev.to_arrow().to_pylist()]
            finally:
                restarter.join()
            assert stream.reconnects >= 1
            assert sys.modules[type(stream.decoder).__module__].IMPLEMENTATION == impl   # the new connection's
            txns(200, 300)
            deadline = time.monotonic() + 60
            while len({i for _, _, i in persisted + after}) < 3000 and time.monotonic() < deadline:
                after += [(r["_commit_lsn"], r["_seq"], int(r["id"]))
                          for ev in stream.read(0.5) for r in ev.to_arrow().to_pylist()]
        ids = {i for _, _, i in persisted + after}
        assert ids == set(range(3000))
        # nothing at or before the acknowledged position is delivered again; later changes may repeat,
        # with the same (_commit_lsn, _seq), so a sink can drop them
        resumed = [x for x in after if x[0] >= acked]
        assert all(lsn >= acked for lsn, _, _ in after)
        by_key: dict[tuple[int, int], int] = {}
        for lsn, seq, i in resumed:
            assert by_key.setdefault((lsn, seq), i) == i
        assert db == "crash"


# ------------------------------------------------------------------------------------------------------------------
# clean close: the last acknowledgement survives a close while the server is still sending

def backlog_of_text_rows(db, slot: str, transactions: int) -> None:
    """Table t (id, v text), publication pub, a pgoutput slot, then `transactions` transactions of 1,000 rows."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(db.dsn, "pub")
    create_slot(db.dsn, slot, "pgoutput")
    conn = db.connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        for i in range(transactions):
            cur.execute("INSERT INTO t SELECT g, repeat('v', 40) || g FROM generate_series(%s, %s) g",
                        (i * 1000, i * 1000 + 999))
    conn.close()


@pytest.mark.parametrize("transport", ["replication", "sql"])
@pytest.mark.parametrize("pump", PUMPS)
def test_close_mid_stream_keeps_the_acknowledgement(pg_db, pump, transport, slot, monkeypatch):
    monkeypatch.setenv("SPOCKWIRE_IMPL", pump)   # the decoder too, not only the pump
    backlog_of_text_rows(pg_db, slot, 300)
    previous = slot_info(pg_db.dsn, slot).confirmed_flush_lsn
    for _ in range(5):
        stream = connect(pg_db.dsn, slot=slot, publication="pub", pump=pump, max_batch_bytes=64 << 10,
                         transport=transport, sql_batch_changes=20_000)
        assert stream.impl == pump
        try:
            rows = 0
            while rows < 3000:
                rows += row_count(stream.read(1.0))
            assert sys.modules[type(stream.decoder).__module__].IMPLEMENTATION == pump
            # not sent: close() reports it, while the server still has plenty to send (sql: the call still runs)
            stream.ack()
            acked = stream.acked_lsn
        finally:
            stream.close()
        if transport == "sql":
            # the cursor slot (temporary or pipelined) is gone with the stream
            assert pg_db.query("SELECT count(*) FROM pg_replication_slots "
                               "WHERE temporary OR strpos(slot_name, '_swsql') > 0")[0][0] == 0
        assert acked > previous
        info = slot_info(pg_db.dsn, slot)
        assert info.confirmed_flush_lsn == acked
        deadline = time.monotonic() + 10
        while slot_info(pg_db.dsn, slot).active and time.monotonic() < deadline:
            time.sleep(0.02)
        previous = acked


# ------------------------------------------------------------------------------------------------------------------
# the SQL transport: same events as the replication protocol, same acknowledgement rules

def read_all(stream, expected_rows: int, timeout: float = 30.0) -> list:
    events = collect(stream, lambda evs: row_count(evs) >= expected_rows, timeout)
    assert row_count(events) == expected_rows
    return events


def both_transports(db, slot: str, plugin: str, **kwargs) -> tuple[list, list]:
    """The events of the same workload read from two slots created together: replication and sql."""
    types = column_types(db)
    expected, _ = oracle(db, slot + "_oracle", full_tables=kwargs.pop("full_tables", ("public.full_t",)))
    splits = kwargs.pop("splits", False)
    got = []
    for transport, name in (("replication", slot), ("sql", slot + "_sql")):
        with connect(db.dsn, slot=name, plugin=plugin, transport=transport, **kwargs) as stream:
            events = collect(stream, lambda evs: len(ours(evs, types)[0]) >= len(expected))
            got.append(ours(events, types)[0])
            assert stream.transport == transport
            if transport == "sql":
                calls = stream.stats()["calls"]
                assert (stream.stats()["splits"] > 0) == splits
    return got[0], got[1], calls


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_sql_transport_pgoutput_matches_replication(pg_db, binary, slot):
    setup_pgoutput(pg_db, slot)
    create_slot(pg_db.dsn, slot + "_sql", "pgoutput")
    run(pg_db, WORKLOAD + ["TRUNCATE full_t"])
    replication, sql, _calls = both_transports(pg_db, slot, "pgoutput", publication="pub", binary=binary)
    assert sql == replication
    assert len(sql) > 100


@pytest.mark.parametrize("batch", [4_000_000, 7], ids=["one-call-halves", "head-in-several-calls"])
def test_sql_transport_split_matches_replication(pg_db, batch, slot):
    """Every call a split (sql_split_bytes=1): the head up to the middle LSN, the tail from there decoded side
    by side; with 7 changes per call the head needs several calls to reach the middle. The same events as the
    replication protocol, every transaction once."""
    setup_pgoutput(pg_db, slot)
    create_slot(pg_db.dsn, slot + "_sql", "pgoutput")
    run(pg_db, WORKLOAD + ["TRUNCATE full_t"])
    replication, sql, _calls = both_transports(pg_db, slot, "pgoutput", publication="pub", sql_split_bytes=1,
                                               sql_batch_changes=batch, splits=True)
    assert sql == replication
    assert len(sql) > 100


@pytest.mark.pg_servers("pg15")
def test_sql_transport_pglogical_matches_replication(pg_db, slot):
    setup_pglogical(pg_db, slot)
    create_slot(pg_db.dsn, slot + "_sql", "pglogical")
    run(pg_db, WORKLOAD)
    # several calls: pglogical starts each with its startup message
    replication, sql, calls = both_transports(pg_db, slot, "pglogical", binary=True, full_tables=(),
                                              sql_batch_changes=50, sql_split_bytes=1, splits=True)
    assert sql == replication
    assert calls > 3


@pytest.mark.parametrize("pump", PUMPS)
def test_sql_transport_streaming_two_phase(pg_db, pump, slot):
    setup_pgoutput(pg_db, slot, two_phase=True)
    with connect(pg_db.dsn, slot=slot, publication="pub", two_phase=True, streaming=True, binary=True,
                 transport="sql", pump=pump, read_timeout=0.2) as stream:
        assert stream.impl == pump
        run(pg_db, ["BEGIN; INSERT INTO a VALUES (1, 'committed prepared'); PREPARE TRANSACTION 'g1'",
                    "COMMIT PREPARED 'g1'",
                    "BEGIN; INSERT INTO a VALUES (4, 'still prepared'); PREPARE TRANSACTION 'g3'",
                    # larger than logical_decoding_work_mem while g3 waits
                    "INSERT INTO b SELECT g, repeat('v', 50) || g, NULL FROM generate_series(1, 3000) g"])
        events = read_all(stream, 3001)
        assert [r["v"] for ev in events if ev.relation.name == "a" for r in ev.to_arrow().to_pylist()] == [
            "committed prepared"]
        for _ in range(3):
            assert stream.read(0.3) == []  # later calls: the prepared transaction stays open, nothing repeats
        stream.ack()
        pg_db.execute("COMMIT PREPARED 'g3'")  # decoded by an earlier call, released by this one
        events = read_all(stream, 1)
        assert [r["v"] for ev in events for r in ev.to_arrow().to_pylist()] == ["still prepared"]
        assert stream.stats()["calls"] >= 3


@pytest.mark.parametrize("order", ["prepare-in-head", "both-in-head"])
def test_sql_transport_split_two_phase(pg_db, order, slot):
    """Prepared transactions across a split: PREPARE before the middle and COMMIT PREPARED after it (or both
    before), two-phase decoding on. The same events as the replication protocol: the prepared transaction once
    at PREPARE, then its COMMIT PREPARED, never replayed whole by the tail."""
    setup_pgoutput(pg_db, slot, two_phase=True)
    create_slot(pg_db.dsn, slot + "_sql", "pgoutput", two_phase=True)
    before, after = (3000, 500) if order == "prepare-in-head" else (500, 3000)
    run(pg_db, ["BEGIN; INSERT INTO a VALUES (1, 'prepared'); PREPARE TRANSACTION 'g1'",
                f"INSERT INTO b SELECT g, repeat('v', 50) || g, NULL FROM generate_series(1, {before}) g",
                "COMMIT PREPARED 'g1'",
                f"INSERT INTO b SELECT g, repeat('w', 50) || g, NULL FROM generate_series({before} + 1, "
                f"{before + after}) g"])
    got = []
    for transport, name in (("replication", slot), ("sql", slot + "_sql")):
        with connect(pg_db.dsn, slot=name, publication="pub", two_phase=True, transport=transport,
                     sql_split_bytes=1, read_timeout=0.2) as stream:
            events = read_all(stream, 1 + before + after)
            got.append([(ev.relation.name, r["_commit_lsn"], r["_seq"], int(r["id"]))
                        for ev in events for r in ev.to_arrow().to_pylist()])
            assert stream.read(0.3) == []
            if transport == "sql":
                assert stream.stats()["splits"] >= 1
    assert got[1] == got[0]
    assert [x[3] for x in got[0] if x[0] == "a"] == [1]   # the prepared row, once


@pytest.mark.parametrize("pump", PUMPS)
def test_sql_transport_ack_semantics(pg_db, pump, slot):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub")
    start = create_slot(pg_db.dsn, slot, "pgoutput").confirmed_flush_lsn
    conn = pg_db.connect()
    conn.autocommit = True
    with conn.cursor() as cur:
        for i in range(40):
            cur.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s, %s) g", (i * 100, i * 100 + 99))
    kwargs = dict(slot=slot, publication="pub", transport="sql", pump=pump, sql_batch_changes=500,
                  status_interval=0.05)
    with connect(pg_db.dsn, **kwargs) as stream:
        rows = []
        while len(rows) < 4000:
            for ev in stream.read(1.0):
                rows += [(r["_commit_lsn"], int(r["id"])) for r in ev.to_arrow().to_pylist()]
            # nothing acknowledged: the slot stays where it was, however many calls read ahead
            assert slot_info(pg_db.dsn, slot).confirmed_flush_lsn == start
        assert stream.stats()["calls"] >= 8
        # the pipelined calls hand out every row once, in commit order (the source table is the oracle)
        assert sorted(i for _, i in rows) == list(range(4000))
        assert [lsn for lsn, _ in rows] == sorted(lsn for lsn, _ in rows)
        commits = sorted({lsn for lsn, _ in rows})
        middle = commits[len(commits) // 2]  # acknowledge up to (not including) this transaction
        stream.ack(middle, send=True)
        assert slot_info(pg_db.dsn, slot).confirmed_flush_lsn == middle
        stream.read(0.2)
        assert slot_info(pg_db.dsn, slot).confirmed_flush_lsn == middle  # status_interval passed: no move
    info = slot_info(pg_db.dsn, slot)
    assert info.confirmed_flush_lsn == middle and not info.active
    # the cursor slot (temporary or pipelined) is gone with the stream
    assert pg_db.query("SELECT count(*) FROM pg_replication_slots "
                       "WHERE temporary OR strpos(slot_name, '_swsql') > 0")[0][0] == 0
    # everything not acknowledged comes again, nothing acknowledged does
    with connect(pg_db.dsn, **kwargs) as stream:
        again = [(r["_commit_lsn"], int(r["id"])) for ev in read_all(stream, 2000)
                 for r in ev.to_arrow().to_pylist()]
        assert stream.read(0.3) == []
    assert sorted(again) == sorted(x for x in rows if x[0] >= middle)


@pytest.mark.parametrize("pump", PUMPS)
def test_sql_transport_split_hands_out_every_row_once(pg_db, pump, slot):
    """A backlog over `sql_split_bytes` is read as a split; the rows, their order and their (_commit_lsn, _seq)
    are those of the same slot read call after call, and both cursor slots are gone at close."""
    backlog_of_text_rows(pg_db, slot, 60)
    runs = {}
    for split_bytes in (1 << 20, 0):
        # nothing acknowledged: each stream reads the whole backlog
        with connect(pg_db.dsn, slot=slot, publication="pub", transport="sql", pump=pump,
                     sql_batch_changes=20_000, sql_split_bytes=split_bytes) as stream:
            rows = [(r["_commit_lsn"], r["_seq"], int(r["id"])) for ev in read_all(stream, 60_000)
                    for r in ev.to_arrow().to_pylist()]
            assert stream.read(0.3) == []
            stats = stream.stats()
        assert (stats["splits"] >= 1) == (split_bytes > 0)
        assert stats["calls"] >= 4   # the head reaches the middle in two calls (20,000 changes each)
        runs[split_bytes] = rows
        assert pg_db.query("SELECT count(*) FROM pg_replication_slots "
                           "WHERE temporary OR strpos(slot_name, '_swsql') > 0")[0][0] == 0
    assert runs[1 << 20] == runs[0]
    assert sorted(i for _, _, i in runs[0]) == list(range(60_000))


@pytest.mark.parametrize("transport", ["replication", "sql"])
@pytest.mark.parametrize("pump", PUMPS)
def test_caught_up_once_the_server_has_sent_everything(pg_db, pump, transport, slot):
    """`caught_up` is False until the transport knows the server has nothing more (no keepalive yet, no call
    finished), and True once everything was read: a replication read ends at the walsender's keepalive after the
    last transaction instead of waiting out its timeout; the SQL transport knows at the end of the call that
    read to the end of the WAL."""
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub")
    create_slot(pg_db.dsn, slot, "pgoutput")
    for i in range(20):
        pg_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s, %s) g", (i * 1000, i * 1000 + 999))
    with connect(pg_db.dsn, slot=slot, publication="pub", transport=transport, pump=pump) as stream:
        assert not stream.caught_up and stream.behind_since is not None
        rows, deadline = 0, time.monotonic() + 60
        while rows < 20_000:
            assert time.monotonic() < deadline
            rows += sum(ev.num_rows for ev in stream.read(1.0) if hasattr(ev, "num_rows"))
        assert rows == 20_000
        started = time.monotonic()
        while not stream.caught_up:
            assert stream.read(10.0) == []
            assert time.monotonic() - started < 5.0, "the read waited for its timeout"
        assert stream.behind_since is None
        pg_db.execute("INSERT INTO t VALUES (-1, 'later')")
        while True:   # a new transaction: behind until it was read, then caught up again
            events = stream.read(2.0)
            if any(hasattr(ev, "num_rows") for ev in events):
                break
            assert time.monotonic() - started < 30
        started = time.monotonic()
        while not stream.caught_up:
            assert stream.read(10.0) == []
            assert time.monotonic() - started < 5.0, "the read waited for its timeout"


def test_sql_transport_reads_without_splitting_when_no_slot_is_free():
    """With max_replication_slots taken by the slot and the cursor slot, the split's second copy cannot be made
    (SQLSTATE 53400): the stream reads the backlog call after call instead, every row once."""
    with PostgresCluster({"max_replication_slots": 2}, major=15) as pg:
        db = pg.create_database("slots")
        pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", dbname=db)
        dsn = pg.dsn(dbname=db)
        create_publication(dsn, "pub")
        create_slot(dsn, "only", "pgoutput")
        for lo in range(1, 5001, 500):
            pg.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s, %s) g", (lo, lo + 499), dbname=db)
        with connect(dsn, slot="only", publication="pub", transport="sql", sql_split_bytes=1,
                     sql_batch_changes=1000) as stream:
            rows = [int(r["id"]) for ev in read_all(stream, 5000) for r in ev.to_arrow().to_pylist()]
            assert stream.stats()["splits"] == 0 and stream.stats()["calls"] >= 5
        assert rows == list(range(1, 5001))
        assert pg.scalar("SELECT count(*) FROM pg_replication_slots", dbname=db) == 1


@pytest.mark.parametrize("split_bytes", [0, 1], ids=["calls", "split"])
def test_sql_transport_drops_cursor_slot_of_dead_client(pg_db, slot, split_bytes):
    """A client that dies mid-stream leaves its pipelined cursor slot (an ordinary slot; after a split, the
    tail's copy under the other name); the next stream on the same slot drops it once its backend is gone, and
    still reads everything not acknowledged."""
    import psycopg2

    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub")
    create_slot(pg_db.dsn, slot, "pgoutput")
    pg_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 300) g")
    stream = connect(pg_db.dsn, slot=slot, publication="pub", transport="sql", sql_batch_changes=100,
                     sql_split_bytes=split_bytes)
    read_all(stream, 300)
    splits = stream.stats()["splits"]
    assert (splits > 0) == bool(split_bytes)
    cursor = stream._source.cursor_slot
    # each split hands the reading on to the tail's slot, under the other of the two names: after an odd number
    # of splits the stream reads from the split name, after an even number from the pipelined one again
    assert ("_swsqls_" in cursor) == (splits % 2 == 1)
    pids = [c.get_backend_pid() for c in stream._source.conns]
    # the client dies: its backends are terminated without close()
    killer = psycopg2.connect(pg_db.dsn)
    killer.autocommit = True
    with killer.cursor() as cur:
        for pid in pids:
            cur.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    killer.close()
    stream.close()  # finds its connections gone: the cursor slot stays behind
    assert pg_db.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (cursor,))[0][0] == 1
    with connect(pg_db.dsn, slot=slot, publication="pub", transport="sql") as again:
        assert row_count(read_all(again, 300)) == 300
        assert pg_db.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (cursor,))[0][0] == 0


@pytest.mark.parametrize("transport", ["replication", "sql"])
def test_a_slot_another_backend_holds_is_waited_for_then_a_clear_error(pg_db, slot, transport):
    """The first connection to a slot another backend still holds (as the backend of a killed client does until the
    server notices) waits for it to be released; a slot held for longer than the wait is the server's error with
    what it means."""
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub")
    create_slot(pg_db.dsn, slot, "pgoutput")
    pg_db.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
    holder = connect(pg_db.dsn, slot=slot, publication="pub")     # a walsender holds the slot while it streams
    started = time.monotonic()
    with pytest.raises(ServerError, match=r'replication slot "[^"]+" is active for PID \d+ \(still after waiting '
                                          r'1 s: another client is using the slot\)'):
        connect(pg_db.dsn, slot=slot, publication="pub", transport=transport, reconnect_timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 10
    threading.Timer(1.0, holder.close).start()      # the holder goes while the next one waits
    with connect(pg_db.dsn, slot=slot, publication="pub", transport=transport, reconnect_timeout=30.0) as again:
        assert row_count(read_all(again, 10)) == 10
