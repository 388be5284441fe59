"""Internal-format ('i') values from the real plugins, negotiated the way Spock's own subscriber does
(`connect(..., binary="internal")`: every binary.* parameter, matching the server), in both implementations and
checked against the server's own values: the type table of tests/test_typed_values.py, TOASTed text compressed with
pglz and with LZ4 (the 'i' bytes checked to really be compressed datums of that method), a frame file captured by
`spockwire capture --internal` decoded again, jsonb, tsvector, tsquery, jsonpath and aclitem against the server's
::text (the clear error for an aclitem without a catalog), and pglogical 2 on PostgreSQL 15 with the same
negotiation.
"""
from __future__ import annotations

import struct
from typing import Any

import pytest

import spockwire
from spockwire.errors import ProtocolError
from tests.pg_fixtures import PgDatabase
from tests.test_connection_pg import collect, row_count
from tests.test_spock_live import Tap, create_slots, sdb, spock_connect  # noqa: F401  (sdb: fixture)

pytestmark = pytest.mark.pg

#: the type table's types that arrive as 'i' under internal negotiation (the others as 'b' or 't')
INTERNAL_TYPES = {"bool", "int2", "int4", "int8", "oid", "float4", "float8", "numeric", "text", "varchar", "char",
                  "bytea", "date", "timestamp", "timestamptz", "time", "timetz", "interval", "uuid", "json", "xml",
                  "inet", "cidr", "macaddr", "macaddr8", "money", "bit", "varbit", "path", "polygon", "circle",
                  "pg_lsn", "xid", "xid8", "cid", "tid", "pg_snapshot", "txid_snapshot", "\"char\"", "jsonb",
                  "tsvector", "tsquery", "jsonpath"}


def _internal_values(payloads: list[bytes], proto: int = 5) -> list[bytes]:
    """The 'i' datums of the insert messages among `payloads` (one-column tables after an int4 key)."""
    out = []
    for p in payloads:
        body = p[8:] if proto == 5 and p[:1] != b"S" else p
        if body[:1] != b"I":
            continue
        pos = 1 + 1 + 4 + 1 + 1          # 'I', flags, relid, 'N', 'T'
        (natts,) = struct.unpack_from(">H", body, pos)
        pos += 2
        for _ in range(natts):
            kind = body[pos:pos + 1]
            pos += 1
            if kind in (b"n", b"u"):
                continue
            (n,) = struct.unpack_from(">I", body, pos)
            pos += 4
            if kind == b"i":
                out.append(body[pos:pos + n])
            pos += n
    return out


def _kinds_by_table(payloads: list[bytes], proto: int = 5) -> dict[str, set[str]]:
    """Table name -> the value kinds its inserts' last column arrived in."""
    names: dict[int, str] = {}
    kinds: dict[str, set[str]] = {}
    for p in payloads:
        body = p[8:] if proto == 5 and p[:1] != b"S" else p
        if body[:1] == b"R":
            (relid,) = struct.unpack_from(">I", body, 2)
            nsp = body[6]
            names[relid] = body[8 + nsp:8 + nsp + body[7 + nsp] - 1].decode()
        elif body[:1] == b"I":
            (relid,) = struct.unpack_from(">I", body, 2)
            pos = 10
            (natts,) = struct.unpack_from(">H", body, pos - 2)
            kind = ""
            for _ in range(natts):
                kind = chr(body[pos])
                pos += 1
                if kind not in "nu":
                    pos += 4 + struct.unpack_from(">I", body, pos)[0]
            if kind not in "nu":
                kinds.setdefault(names[relid], set()).add(kind)
    return kinds


def _compression(datum: bytes) -> str | None:
    """'pglz' or 'lz4' for a little-endian 4-byte-header compressed varlena, else None."""
    if len(datum) < 8 or datum[0] & 0x03 != 0x02:
        return None
    (tcinfo,) = struct.unpack_from("<I", datum, 4)
    return {0: "pglz", 1: "lz4"}[tcinfo >> 30]


# ------------------------------------------------------------------------------------------------------------------
# Spock 6 on PostgreSQL 18

def test_spock_internal_type_table(sdb, impl):
    """Every type of the type table, streamed as Spock's own subscriber asks for it, equals the server's values;
    the startup message says internal datums were negotiated."""
    from tests import test_typed_values as TV

    sdb.execute(TV.SCHEMA)
    cases = list(TV.CASES)
    for case in cases:
        sdb.execute(f"CREATE TABLE t_{case.name} (id int PRIMARY KEY, v {case.sqltype})")
        sdb.execute("SELECT spock.repset_add_table('default', %s)", (f"t_{case.name}",))
    create_slots(sdb)
    has_xml = TV._accepts_xml(sdb)
    for case in cases:
        values = case.values if has_xml or case.sqltype.rstrip("[]") != "xml" else ()
        sdb.execute(TV._insert_sql(f"t_{case.name}", values))
    total = sum(len(c.values if has_xml or c.sqltype.rstrip("[]") != "xml" else ()) + 1 for c in cases)
    taps: list = []
    with spock_connect(sdb, impl, binary="internal", reconnect=False, tap=taps) as stream:
        events = collect(stream, lambda evs: row_count(evs) >= total)
        params = stream.startup_params
        sent = stream.options
    assert params["binary.internal_basetypes"] == "t" and params["binary.binary_basetypes"] == "t"
    for key in ("binary.want_internal_basetypes", "binary.want_binary_basetypes", "binary.basetypes_major_version",
                "binary.bigendian", "binary.sizeof_datum", "binary.sizeof_int", "binary.sizeof_long",
                "binary.float4_byval", "binary.float8_byval", "binary.integer_datetimes"):
        assert key in sent, key
    payloads = [p for t in taps for p in t.payloads]
    datums = _internal_values(payloads)
    assert any(d[:1] and d[0] & 0x01 for d in datums)          # short (1-byte header) varlena datums arrived
    kinds = _kinds_by_table(payloads)
    internal = {name[2:] for name, k in kinds.items() if k == {"i"}}
    # base types below 16384 without an element type come as 'i'; name, point, line, lseg and box have one
    # (they are subscriptable), arrays, domains, enums, ranges and composites are not base types
    assert internal == {c.name for c in cases if c.sqltype.split("(")[0] in INTERNAL_TYPES and not c.array
                        and (has_xml or c.sqltype != "xml")}, internal
    conn = sdb.connect()
    try:
        with conn.cursor() as cur:
            expected = TV.server_expected(cur, cases)
    finally:
        conn.close()
    TV.assert_events_match_server(events, cases, expected, "internal")


@pytest.mark.parametrize("method", ["pglz"])
def test_spock_internal_toasted_text_is_decompressed(sdb, impl, method):
    """TOASTed text arrives as its compressed internal datum (inline: compressed but small enough to stay in the
    row; out of line: the value reassembled from the TOAST table), an incompressible one as a 4-byte-header datum;
    all decode to the server's text. (The embedded PostgreSQL 18 is built without lz4: LZ4 datums are checked on
    PostgreSQL 15 with pglogical below.)"""
    sdb.execute(f"CREATE TABLE big (id int PRIMARY KEY, v text COMPRESSION {method}, b bytea COMPRESSION "
                f"{method}, n numeric)")
    sdb.execute("SELECT spock.repset_add_table('default', 'big')")
    create_slots(sdb)
    sdb.execute("INSERT INTO big VALUES "
                "(1, repeat('spock internal ', 300), decode(repeat('00ff10', 1000), 'hex'), 1.5), "
                "(2, repeat(md5('x') || 'ünïcödé ✓', 2000), decode(repeat('0102030405', 2000), 'hex'), "
                "repeat('9', 900)::numeric / 7), "
                "(3, (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g) || repeat('z', 3000), "
                "'\\x00', -0.000001), "
                "(4, 'short', '\\xdeadbeef', 'NaN')")
    sdb.execute("UPDATE big SET n = 2 WHERE id IN (1, 3)")   # row 3's out-of-line v unchanged: 'u'; row 1's inline
    stored = dict(sdb.query("SELECT id, pg_column_compression(v) FROM big"))
    assert stored[1] == stored[2] == method and stored[3] is None     # row 3: md5 hex does not compress
    taps: list = []
    with spock_connect(sdb, impl, binary="internal", reconnect=False, tap=taps) as stream:
        events = collect(stream, lambda evs: row_count(evs) >= 6)
    datums = _internal_values([p for t in taps for p in t.payloads])
    methods = [_compression(d) for d in datums]
    assert methods.count(method) >= 4 and set(methods) <= {method, None}, methods
    assert any(d[0] & 0x03 == 0 and len(d) > 10000 for d in datums)   # an uncompressed 4-byte-header datum
    rows = [r for ev in events if hasattr(ev, "to_arrow") for r in ev.to_pylist()]
    inserts = {r["id"]: r for r in rows if r["_change_type"] == "insert"}
    server = {i: (v, bytes(b), n) for i, v, b, n in sdb.query("SELECT id, v, b, n::text FROM big")}
    updates = {r["id"]: r for r in rows if r["_change_type"] == "update_postimage"}
    assert set(inserts) == set(server) and set(updates) == {1, 3}
    for ident, (v, b, n) in server.items():
        assert (inserts[ident]["v"], inserts[ident]["b"]) == (v, b), ident
        assert updates.get(ident, inserts[ident])["n"] == n, ident
    assert updates[3]["_unchanged_toast"] == ["v"] and updates[3]["n"] == "2"
    assert updates[1]["_unchanged_toast"] is None and (updates[1]["v"], updates[1]["b"]) == server[1][:2]


def test_spock_internal_capture_file_decodes(sdb, impl, tmp_path):
    """`spockwire capture --internal` records a stream negotiated like Spock's own subscriber; the frame file
    decodes (both implementations) to the server's values, compressed datums included."""
    from spockwire.cli import main as cli_main
    from spockwire.frames import read_frame_file

    sdb.execute("CREATE TABLE cap (id int PRIMARY KEY, v text, n numeric(12,3), i interval, t timetz)")
    sdb.execute("SELECT spock.repset_add_table('default', 'cap')")
    create_slots(sdb)
    sdb.execute("INSERT INTO cap SELECT g, repeat('abc' || g, 1000 * (g % 2)) || g, g * 1.125, "
                "make_interval(days => g, secs => g * 0.5), '10:11:12.5+05:30'::timetz FROM generate_series(1, 6) g")
    out = tmp_path / "internal.spwf"
    rc = cli_main(["capture", "--dsn", sdb.dsn, "--slot", f"{sdb.name}_spock", "--plugin", "spock",
                   "--replication-sets", "default", "--internal", "--out", str(out), "--idle-exit", "2"])
    assert rc == 0
    header, body = read_frame_file(out)
    assert header["options"]["binary"] == "internal"
    frames = list(_iter(bytes(body)))
    assert any(_compression(d) == "pglz" for d in _internal_values([p for _lsn, p in frames]))
    from spockwire.values import PostgresTypeCatalog
    catalog = PostgresTypeCatalog(sdb.dsn)
    try:
        dec = impl.Decoder(protocol="spock", type_catalog=catalog)
        dec.feed_frames(bytes(body))
        rows = [r for ev in dec.drain() if hasattr(ev, "to_arrow") for r in ev.to_pylist()]
    finally:
        catalog.close()
    server = sdb.query("SELECT id, v, n::text, i::text, t::text FROM cap ORDER BY id")
    from decimal import Decimal
    got = [(r["id"], r["v"], str(r["n"]), r["t"]) for r in sorted(rows, key=lambda r: r["id"])]
    assert got == [(i, v, str(Decimal(n)), t) for i, v, n, _iv, t in server]
    assert [r["i"] for r in sorted(rows, key=lambda r: r["id"])] == \
        [(0, g, g * 500_000_000) for g in range(1, 7)]


def _iter(body: bytes):
    from spockwire.frames import iter_frames
    return iter_frames(body)


# jsonb, tsvector, tsquery, jsonpath and aclitem: their own layouts (spockwire.values.internal_types)

#: rows of the layout table: SQL of doc jsonb, vec tsvector, q tsquery, path jsonpath, acl aclitem ({r1} and {r2}
#: in acl: roles made per database)
LAYOUT_ROWS = [
    (r"""'{"a": {"b": [1, {"c": null}], "d": "x\"\u0001"}, "e": [[]], "f": {}, "ü ✓": true}'""",
     "'a:1A b:2,3B c:4C,5D d'", "'!a & (b | c) <-> d <2> e:* & f:AB | g:*C'",
     """'$.a[*] ? (@.b > 1 && @.c like_regex "^x" flag "i").type()'""", "'{r1}=r*w/{r2}'"),
    ("'{}'", "''", "''", "'strict $.**{2 to last}'", "'=arwdDxt/{r1}'"),
    ("'[]'", "to_tsvector('english', 'The quick brown foxes jumped over the lazy dogs')",
     "to_tsquery('english', 'quick & !(foxes | dogs) <-> jumped')", "'$[last - 1, 1 to 3]'", "'{r2}=U*C/{r1}'"),
    ("""'"scalar"'""", "setweight('x:1 y:2'::tsvector, 'A')", "'x <-> y <-> z'", """'$"v" + 1.5 * -$.a'""", "NULL"),
    ("'1.50'", r"""$$'it''s':1 \\b:16383$$""", "'a:* | !b'", """'$.datetime("yyyy").size()'""", "NULL"),
    ("'null'", "NULL", "'!!a'", """'exists($.a) || $.b starts with "x"'""", "NULL"),
    ("'false'", "NULL", "'(a | b) <3> (c & d)'", "'true'", "NULL"),
    ("jsonb_build_array(1e-16383::numeric, ('-' || repeat('9', 1000) || '.' || repeat('9', 16383))::numeric, "
     "('1' || repeat('0', 131000))::numeric, 0, -0.0, 'NaN'::numeric::text)", "NULL", "NULL", "NULL", "NULL"),
    # TOASTed: compressible (stored compressed, inline and out of line) and incompressible (out of line, plain)
    ("(SELECT jsonb_agg(jsonb_build_object('k', g, 'v', repeat('x', 20))) FROM generate_series(1, 150) g)",
     "(SELECT string_agg('w' || g || ':' || g, ' ')::tsvector FROM generate_series(1, 400) g)", "NULL", "NULL",
     "NULL"),
    ("(SELECT jsonb_object_agg('key' || g, jsonb_build_array(g, g * 0.5, 'text ' || g)) "
     "FROM generate_series(1, 6000) g)", "NULL", "NULL", "NULL", "NULL"),
    ("(SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 800) g)", "NULL", "NULL", "NULL", "NULL"),
]
LAYOUT_COLUMNS = ("doc", "vec", "q", "path", "acl")


def _layout_table(db: PgDatabase, compression: str) -> dict[str, str]:
    """The layout table (doc compressed with `compression`) and two roles; returns their names for LAYOUT_ROWS."""
    r1, r2 = f"{db.name}_r1", f"{db.name} r2"
    db.execute(f'CREATE ROLE "{r1}"')
    db.execute(f'CREATE ROLE "{r2}"')
    db.execute(f"CREATE TABLE lay (id int PRIMARY KEY, doc jsonb COMPRESSION {compression}, vec tsvector, "
               "q tsquery, path jsonpath, acl aclitem)")
    return {"r1": r1, "r2": f'"{r2}"'}


def _layout_rows(db: PgDatabase, roles: dict[str, str]) -> dict[int, tuple]:
    """The rows inserted (id -> the server's texts of them), then one update leaving the largest doc unchanged."""
    for k, row in enumerate(LAYOUT_ROWS, start=1):
        values = [*row[:-1], row[-1].format(**roles)]
        db.execute(f"INSERT INTO lay VALUES ({k}, {', '.join(values)})")
    texts = {r[0]: r[1:] for r in db.query("SELECT id, doc::text, vec::text, q::text, path::text, acl::text "
                                           "FROM lay")}
    db.execute("UPDATE lay SET q = 'updated' WHERE id = 10")
    return texts


def _check_layouts(events: list, server: dict[int, tuple], datums: list[bytes], method: str) -> None:
    rows = [r for ev in events if hasattr(ev, "to_arrow") for r in ev.to_pylist()]
    inserts = {r["id"]: r for r in rows if r["_change_type"] == "insert"}
    assert set(inserts) == set(server)
    for ident, expected in server.items():
        assert tuple(inserts[ident][c] for c in LAYOUT_COLUMNS) == expected, ident
    (update,) = [r for r in rows if r["_change_type"] == "update_postimage"]
    assert update["_unchanged_toast"] == ["doc"] and update["q"] == "'updated'"
    assert method in {_compression(d) for d in datums}
    if method == "pglz":   # pglz stores the md5 array as it is (LZ4 still finds its repeated entries worth it)
        assert any(d[0] & 0x03 == 0 and len(d) > 20000 for d in datums)


def test_spock_internal_layouts(sdb, impl):
    """jsonb (nested, empty, scalars at top level, numbers at numeric's limits, TOASTed compressed and not),
    tsvector with positions and weights, tsquery with every operator, jsonpath and aclitem, streamed as Spock's own
    subscriber asks for them, equal the server's ::text."""
    roles = _layout_table(sdb, "pglz")
    sdb.execute("SELECT spock.repset_add_table('default', 'lay')")
    create_slots(sdb)
    server = _layout_rows(sdb, roles)
    taps: list = []
    with spock_connect(sdb, impl, binary="internal", reconnect=False, tap=taps) as stream:
        events = collect(stream, lambda evs: row_count(evs) >= len(LAYOUT_ROWS) + 1)
    _check_layouts(events, server, _internal_values([p for t in taps for p in t.payloads]), "pglz")


def test_spock_internal_aclitem_without_catalog_is_a_clear_error(sdb, impl):
    """Spock names every column's type, but an aclitem's text needs role names: without a catalog, a clear error
    naming the column and what to attach."""
    sdb.execute("CREATE TABLE acl (id int PRIMARY KEY, a aclitem)")
    sdb.execute("SELECT spock.repset_add_table('default', 'acl')")
    create_slots(sdb)
    sdb.execute("INSERT INTO acl VALUES (1, '=r/postgres')")
    with spockwire.connect(sdb.dsn, plugin="spock", slot=f"{sdb.name}_spock", replication_sets="default",
                           binary="internal", reconnect=False,
                           decoder_factory=lambda protocol: impl.Decoder(protocol=protocol)) as stream:
        with pytest.raises(ProtocolError) as info:
            collect(stream, lambda evs: row_count(evs) >= 1, timeout=15)
    err = info.value
    assert err.column_name == "a" and err.column == 1 and err.offset is not None
    assert "value of type aclitem names its roles by OID" in str(err) and "PostgresTypeCatalog" in str(err)


# ------------------------------------------------------------------------------------------------------------------
# pglogical 2 on PostgreSQL 15

def _pglogical_internal(pg_cluster: Any, impl: Any, name: str, tables: Any, workload: Any, rows: int) -> tuple:
    """A database with a pglogical node: `tables(db)` (adding them to the default set), the slot, `workload(db)`,
    then the stream read with binary="internal" until `rows` rows arrived. Returns (startup parameters, events,
    what the workload returned, the 'i' datums)."""
    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name(name)))
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'n1', dsn := %s)", (db.dsn,))
    tables(db)
    slot = f"{db.name}_pgl"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pglogical_output')", (slot,))
    expected = workload(db)
    taps: list = []

    from spockwire.values import PostgresTypeCatalog
    catalog = PostgresTypeCatalog(db.dsn, strict=False)

    def factory(protocol: str) -> Any:
        taps.append(Tap(impl.Decoder(protocol=protocol, type_catalog=catalog)))
        return taps[-1]

    try:
        with spockwire.connect(db.dsn, slot=slot, plugin="pglogical", binary="internal", decoder_factory=factory,
                               reconnect=False) as stream:
            events = collect(stream, lambda evs: row_count(evs) >= rows)
            params = stream.startup_params
    finally:
        catalog.close()
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return params, events, expected, _internal_values([p for t in taps for p in t.payloads], proto=1)


def test_pglogical_internal_negotiation(pg_cluster, impl):
    """pglogical_output negotiates internal datums the same way; TOASTed text (pglz and lz4) decodes."""
    def tables(db: PgDatabase) -> None:
        db.execute("CREATE TABLE t (id int PRIMARY KEY, a text, b text COMPRESSION lz4, n numeric, d interval)")
        db.execute("SELECT pglogical.replication_set_add_table('default', 't')")

    def workload(db: PgDatabase) -> list:
        db.execute("INSERT INTO t SELECT g, repeat('pglz ' || g, 500 * g), repeat('lz4 ' || g, 700 * g), g / 3.0, "
                   "make_interval(months => g, hours => g) FROM generate_series(1, 4) g")
        return db.query("SELECT id, a, b, n::text FROM t ORDER BY id")

    params, events, server, datums = _pglogical_internal(pg_cluster, impl, "pgl_internal", tables, workload, 4)
    assert params["binary.internal_basetypes"] == "t"
    assert {"pglz", "lz4"} <= {_compression(d) for d in datums}
    rows = sorted((r for ev in events if hasattr(ev, "to_arrow") for r in ev.to_pylist()), key=lambda r: r["id"])
    assert [(r["id"], r["a"], r["b"], r["n"]) for r in rows] == [tuple(s) for s in server]
    assert [r["d"] for r in rows] == [(g, 0, g * 3_600_000_000_000) for g in range(1, 5)]


def test_pglogical_internal_layouts(pg_cluster, impl):
    """The layout table through pglogical_output on PostgreSQL 15 (doc compressed with LZ4 there)."""
    roles: dict[str, str] = {}

    def tables(db: PgDatabase) -> None:
        roles.update(_layout_table(db, "lz4"))
        db.execute("SELECT pglogical.replication_set_add_table('default', 'lay')")

    _params, events, server, datums = _pglogical_internal(pg_cluster, impl, "pgl_layouts", tables,
                                                          lambda db: _layout_rows(db, roles), len(LAYOUT_ROWS) + 1)
    _check_layouts(events, server, datums, "lz4")
