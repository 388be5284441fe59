"""What PostgreSQL 16 to 18 added to the pgoutput stream, read live from a PostgreSQL 18 server with both decoder
implementations (and their pumps), checked against test_decoding on a second slot of the same database.

* protocol 4 with ``streaming 'parallel'``: a stream abort ('A') carries the abort LSN and timestamp;
* two-phase together with streaming: stream prepare ('p'), COMMIT PREPARED ('K'), ROLLBACK PREPARED ('r');
* ``origin 'none'`` (``forward_origins=False``) against ``'any'``, with a write made through a replication origin
  session so that 'O' carries a real origin name;
* ``publish_generated_columns = stored`` (18): stored generated columns travel in the stream, virtual ones never.
"""
from __future__ import annotations

import struct

import pytest

from spockwire.connection import StartupRejected, connect, create_publication, create_slot
from tests.live_oracle import oracle_items
from tests.live_oracle import ours
from tests.test_connection_pg import collect, column_types, row_count, slot  # noqa: F401 - slot: fixture

pytestmark = [pytest.mark.pg, pytest.mark.pg_servers("pg18")]

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text, flag bool);
CREATE TABLE b (id int PRIMARY KEY, payload text);
"""


class Tap:
    """Wraps a decoder and keeps (message type, payload) of every frame it is fed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.frames: list[tuple[str, bytes]] = []

    def feed_frames(self, data, partial_ok=False):
        view = bytes(data)
        pos = 0
        while pos + 12 <= len(view):
            n = struct.unpack_from(">I", view, pos)[0]
            if pos + 12 + n > len(view):
                break
            payload = view[pos + 12:pos + 12 + n]
            self.frames.append((chr(payload[0]), payload))
            pos += 12 + n
        return self.inner.feed_frames(data, partial_ok=partial_ok)

    def kinds(self) -> set[str]:
        return {k for k, _ in self.frames}

    def __getattr__(self, name):
        return getattr(self.inner, name)


def tapped(impl, taps: list):
    def factory(protocol):
        taps.append(Tap(impl.Decoder(protocol)))
        return taps[-1]
    return factory


def setup(db, slot: str, *, two_phase: bool = False) -> None:
    db.execute(SCHEMA)
    create_publication(db.dsn, "pub")
    create_slot(db.dsn, slot, "pgoutput", two_phase=two_phase)
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot + "_oracle",))


def server_clock_us(db) -> int:
    """The server's clock now, in microseconds since 2000-01-01 (PostgreSQL's timestamp epoch)."""
    return int(db.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")[0][0]) - PG_EPOCH_US


def wal_lsn(db) -> int:
    return int(db.query("SELECT pg_current_wal_lsn() - '0/0'")[0][0])


def matching(db, stream, oracle_slot: str, *options: str) -> list:
    """Read until the stream has as many row changes as the oracle; the two must be equal."""
    expected, _ = oracle_items(db, oracle_slot, (), *options)
    types = column_types(db)
    events = collect(stream, lambda evs: len(ours(evs, types)[0]) >= len(expected))
    assert ours(events, types)[0] == expected
    return events


def big_transaction(db, statements: list[str], end: str) -> None:
    conn = db.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
            cur.execute(end)
        conn.commit()
    finally:
        conn.close()


def test_parallel_streaming_abort_carries_lsn_and_time(pg_db, impl, slot):
    setup(pg_db, slot)
    taps: list[Tap] = []
    before_lsn, before_us = wal_lsn(pg_db), server_clock_us(pg_db)
    with connect(pg_db.dsn, slot=slot, publication="pub", streaming="parallel", pump=impl.IMPLEMENTATION,
                 decoder_factory=tapped(impl, taps)) as stream:
        assert stream.impl == impl.IMPLEMENTATION
        assert stream.options["proto_version"] == "4" and stream.options["streaming"] == "parallel"
        # larger than logical_decoding_work_mem (64kB): streamed while in progress; a rolled-back subtransaction
        big_transaction(pg_db, [
            "INSERT INTO a SELECT g, repeat('v', 50) || g, g % 3 = 0 FROM generate_series(1, 3000) g",
            "SAVEPOINT s1",
            "INSERT INTO b SELECT g, repeat('r', 60) FROM generate_series(1, 2000) g",
            "ROLLBACK TO SAVEPOINT s1",
            "INSERT INTO b SELECT g, 'kept' || g FROM generate_series(1, 1500) g",
        ], "SELECT 1")
        # streamed, then rolled back as a whole. Rolled back only once a block of it was sent: PostgreSQL 17+ drops
        # the changes of a transaction that has already aborted when it reaches the memory limit, unsent.
        early: list = []
        conn = pg_db.connect(autocommit=False)
        try:  # an open transaction left behind would hold back every later slot creation on the cluster
            with conn.cursor() as cur:
                cur.execute("INSERT INTO b SELECT g, repeat('x', 60) FROM generate_series(5001, 8000) g")
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                xid = struct.pack(">I", cur.fetchone()[0] & 0xFFFFFFFF)
                for _ in range(150):
                    if any(k == "S" and p[1:5] == xid for k, p in taps[-1].frames):
                        break
                    early += stream.read(0.2)
                else:
                    raise AssertionError("the open transaction was never streamed")
        finally:
            conn.rollback()
            conn.close()
        pg_db.execute("INSERT INTO a VALUES (100000, 'after', NULL)")
        after_lsn, after_us = wal_lsn(pg_db), server_clock_us(pg_db)
        expected, _ = oracle_items(pg_db, slot + "_oracle", ())
        types = column_types(pg_db)
        events = early + collect(stream, lambda evs: len(ours(early + evs, types)[0]) >= len(expected))
        assert ours(events, types)[0] == expected
        assert row_count(events) == 3000 + 1500 + 1
    tap = taps[0]
    assert {"S", "E", "c", "A"} <= tap.kinds(), tap.kinds()
    aborts = [payload for kind, payload in tap.frames if kind == "A"]
    whole = sub = 0
    for payload in aborts:
        # protocol 4 with parallel streaming: type, xid, subxid, abort LSN, abort timestamp
        assert len(payload) == 25, payload
        xid, subxid, abort_lsn, abort_ts = struct.unpack(">IIQq", payload[1:])
        assert before_lsn < abort_lsn <= after_lsn
        assert before_us <= abort_ts <= after_us
        if xid == subxid:
            whole += 1
        else:
            sub += 1
    assert whole == 1 and sub == 1


def test_two_phase_with_parallel_streaming(pg_db, impl, slot):
    setup(pg_db, slot, two_phase=True)
    taps: list[Tap] = []
    with connect(pg_db.dsn, slot=slot, publication="pub", streaming="parallel", two_phase=True,
                 pump=impl.IMPLEMENTATION, decoder_factory=tapped(impl, taps)) as stream:
        assert stream.options["two_phase"] == "true" and stream.options["streaming"] == "parallel"
        big_transaction(pg_db, ["INSERT INTO a SELECT g, repeat('p', 50) || g, true FROM generate_series(1, 3000) g"],
                        "PREPARE TRANSACTION 'big_commit'")
        pg_db.execute("COMMIT PREPARED 'big_commit'")
        big_transaction(pg_db, ["INSERT INTO b SELECT g, repeat('q', 60) FROM generate_series(1, 3000) g"],
                        "PREPARE TRANSACTION 'big_rollback'")
        pg_db.execute("ROLLBACK PREPARED 'big_rollback'")
        pg_db.execute("INSERT INTO a VALUES (100000, 'plain', false)")
        events = matching(pg_db, stream, slot + "_oracle")
        assert row_count(events) == 3001
        assert not any(ev.relation.name == "b" for ev in events if hasattr(ev, "relation"))
    kinds = taps[0].kinds()
    assert {"S", "E", "p", "K", "r"} <= kinds, kinds  # streamed, prepared while streamed, then resolved


def test_origin_none_leaves_out_replicated_changes(pg_db, impl, slot):
    setup(pg_db, slot)
    create_slot(pg_db.dsn, slot + "_local", "pgoutput")
    origin = "up_" + slot  # origins are cluster-wide
    pg_db.execute("SELECT pg_replication_origin_create(%s)", (origin,))
    common = dict(publication="pub", pump=impl.IMPLEMENTATION, decoder_factory=lambda p: impl.Decoder(p))
    with connect(pg_db.dsn, slot=slot, **common) as every, \
            connect(pg_db.dsn, slot=slot + "_local", forward_origins=False, binary=True, **common) as local:
        assert "origin" not in every.options  # the server's default: 'any'
        assert local.options["origin"] == "none"
        pg_db.execute("INSERT INTO a VALUES (1, 'local', true)")
        pg_db.execute("SELECT pg_replication_origin_session_setup(%s); "
                      "INSERT INTO a VALUES (2, 'replicated', false); INSERT INTO b VALUES (2, 'replicated')",
                      (origin,))
        pg_db.execute("INSERT INTO a VALUES (3, 'local again', NULL)")
        all_events = matching(pg_db, every, slot + "_oracle")
        local_events = matching(pg_db, local, slot + "_oracle", "only-local", "1")
    origins = {(ev.relation.name, int(r["id"])): r["_origin"] for ev in all_events if hasattr(ev, "to_arrow")
               for r in ev.to_arrow().to_pylist()}
    assert origins == {("a", 1): None, ("a", 2): origin, ("b", 2): origin, ("a", 3): None}
    local_rows = [(ev.relation.name, int(r["id"]), r["_origin"]) for ev in local_events if hasattr(ev, "to_arrow")
                  for r in ev.to_arrow().to_pylist()]
    assert local_rows == [("a", 1, None), ("a", 3, None)]


@pytest.mark.pg_servers("pg15")
def test_origin_filter_needs_postgresql_16(pg_db, slot):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    create_publication(pg_db.dsn, "pub")
    create_slot(pg_db.dsn, slot, "pgoutput")
    with pytest.raises(StartupRejected, match="origin= needs PostgreSQL 16 or later"):
        connect(pg_db.dsn, slot=slot, publication="pub", forward_origins=False)


def test_publish_generated_columns_stored(pg_db, impl, slot):
    pg_db.execute("""CREATE TABLE g (id int PRIMARY KEY, a int,
                                     s int GENERATED ALWAYS AS (a * 2) STORED,
                                     v int GENERATED ALWAYS AS (a * 3) VIRTUAL,
                                     t text GENERATED ALWAYS AS ('#' || a) STORED)""")
    pg_db.execute("CREATE PUBLICATION pub_gen FOR TABLE g WITH (publish_generated_columns = stored)")
    pg_db.execute("CREATE PUBLICATION pub_plain FOR TABLE g")
    create_slot(pg_db.dsn, slot, "pgoutput")
    create_slot(pg_db.dsn, slot + "_plain", "pgoutput")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot + "_oracle",))
    # what the catalog says: which columns are stored generated, which virtual
    gen = dict(pg_db.query("SELECT attname, attgenerated FROM pg_attribute WHERE attrelid = 'g'::regclass "
                           "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"))
    assert gen == {"id": "", "a": "", "s": "s", "v": "v", "t": "s"}
    common = dict(pump=impl.IMPLEMENTATION, decoder_factory=lambda p: impl.Decoder(p))
    with connect(pg_db.dsn, slot=slot, publication="pub_gen", binary=True, **common) as with_gen, \
            connect(pg_db.dsn, slot=slot + "_plain", publication="pub_plain", **common) as plain:
        pg_db.execute("INSERT INTO g (id, a) VALUES (1, 10), (2, 20), (3, NULL)")
        pg_db.execute("UPDATE g SET a = a + 1 WHERE id = 1")
        pg_db.execute("DELETE FROM g WHERE id = 2")
        expected, _ = oracle_items(pg_db, slot + "_oracle", ())
        types = column_types(pg_db)
        gen_events = collect(with_gen, lambda evs: len(ours(evs, types)[0]) >= len(expected))
        plain_events = collect(plain, lambda evs: len(ours(evs, types)[0]) >= len(expected))
    stored = [name for name, kind in gen.items() if kind != "v"]
    ordinary = [name for name, kind in gen.items() if kind == ""]
    for events, columns in ((gen_events, stored), (plain_events, ordinary)):
        assert {tuple(ev.relation.column_names) for ev in events if hasattr(ev, "relation")} == {tuple(columns)}
        # test_decoding prints every column (virtual ones as null): keep the published ones (old keys: the key)
        want = [(kind, table, tuple((k, v) for k, v in cols if k in columns)) for kind, table, cols in expected]
        assert ours(events, types)[0] == want
    values = [(int(r["id"]), r["s"], r["t"]) for ev in gen_events if hasattr(ev, "to_arrow")
              for r in ev.to_arrow().to_pylist() if r["_change_type"] != "delete"]
    assert values == [(1, 20, "#10"), (2, 40, "#20"), (3, None, None), (1, 22, "#11")]
