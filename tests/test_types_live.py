"""Every builtin type on live streams opened with spockwire.connect() and no type code of the user's own.

One table holds a column of every builtin type with a send format (and arrays, a composite, ranges, a domain, an
enum). It is streamed through pgoutput (text and binary) and pglogical (text and binary). connect() attaches a
catalog read over the same DSN by itself, so the pglogical streams (which carry no types) are typed too. All four
streams, with both decoder implementations, must give the same Arrow schema and the same values, and every
column that comes out as a string must hold exactly the server's output-function text of the value (read with
the session settings spockwire pins).
"""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from spockwire.connection import connect, create_publication, create_slot
from spockwire.connection.slots import drop_slot

pytestmark = pytest.mark.pg

COLUMNS = [  # (name, type, value of row 1, value of row 2)
    ("c_bool", "bool", "true", "false"), ("c_int2", "int2", "-32768", "7"), ("c_int4", "int4", "42", "-1"),
    ("c_int8", "int8", "9223372036854775807", "0"), ("c_oid", "oid", "4294967295", "0"),
    ("c_float4", "float4", "'1.5e-7'", "'-Infinity'"), ("c_float8", "float8", "'0.1'", "'NaN'"),
    ("c_num", "numeric(10,2)", "12345678.91", "-0.01"), ("c_numt", "numeric", "'1e-20'", "'NaN'"),
    ("c_text", "text", "'x \"y\" {z}'", "''"), ("c_varchar", "varchar(9)", "'ab'", "'ü'"),
    ("c_bpchar", "char(3)", "'a'", "'xyz'"), ("c_name", "name", "'pg_class'", "'n'"),
    ("c_char", '"char"', "'q'", "'\\303'"), ("c_bytea", "bytea", "'\\x00ff'", "''"),
    ("c_json", "json", "'{\"a\": [1, 2.50]}'", "'null'"), ("c_jsonb", "jsonb", "'{\"b\": 1, \"a\": 2}'", "'[]'"),
    ("c_xml", "xml", "'<a>x</a>'", "'<b/>'"), ("c_uuid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                                                   "'00000000-0000-0000-0000-000000000000'"),
    ("c_date", "date", "'0044-03-15 BC'", "'infinity'"), ("c_time", "time", "'24:00:00'", "'12:00:00.5'"),
    ("c_timetz", "timetz", "'04:05:06.5+05:30'", "'00:00:00-03:00:15'"),
    ("c_ts", "timestamp", "'2020-02-29 12:34:56.789'", "'-infinity'"),
    ("c_tstz", "timestamptz", "'2020-02-29 12:34:56.789+02'", "'1800-01-01 00:00:00+00'"),
    ("c_interval", "interval", "'1 year -2 days 00:00:01.5'", "'-178000000 years'"),
    ("c_inet", "inet", "'192.168.0.1/24'", "'::ffff:1.2.3.4'"), ("c_cidr", "cidr", "'10/8'", "'2001:db8::/32'"),
    ("c_macaddr", "macaddr", "'08:00:2b:01:02:03'", "'ff:ff:ff:ff:ff:ff'"),
    ("c_macaddr8", "macaddr8", "'08:00:2b:01:02:03:04:05'", "'00:00:00:00:00:00:00:00'"),
    ("c_money", "money", "'1234.56'", "'-1'"), ("c_bit", "bit(4)", "B'1011'", "B'0000'"),
    ("c_varbit", "varbit", "B'101100111'", "B''"), ("c_xid", "xid", "'12345'", "'0'"),
    ("c_xid8", "xid8", "'18446744073709551615'", "'3'"), ("c_cid", "cid", "'7'", "'0'"),
    ("c_tid", "tid", "'(1,2)'", "'(4294967295,65535)'"), ("c_lsn", "pg_lsn", "'16/B374D848'", "'0/0'"),
    ("c_point", "point", "'(1.5,-2)'", "'(0.1,1e300)'"), ("c_line", "line", "'{1,-1,0}'", "'{0.5,2,-3.25}'"),
    ("c_lseg", "lseg", "'[(1,2),(3,4)]'", "'[(0,0),(0,0)]'"), ("c_box", "box", "'(3,4),(1,2)'", "'(0,0),(0,0)'"),
    ("c_path", "path", "'[(1,2),(3,4)]'", "'((0,0),(1,1),(2,0))'"),
    ("c_polygon", "polygon", "'((0,0),(1,1),(2,0))'", "'((0,0))'"),
    ("c_circle", "circle", "'<(1,2),3>'", "'<(0,0),0.5>'"),
    ("c_tsvector", "tsvector", "'a:1A b:2,3'", "''"), ("c_tsquery", "tsquery", "'(a | b) & !c'", "'x:*'"),
    ("c_jsonpath", "jsonpath", "'$.a[*] ? (@ > 1)'", "'$'"),
    ("c_snapshot", "pg_snapshot", "'10:20:10,14,15'", "'1:1:'"),
    ("c_txid_snapshot", "txid_snapshot", "'10:20:'", "'5:9:6'"),
    ("c_int4range", "int4range", "'[1,10)'", "'empty'"), ("c_int8range", "int8range", "'(,5]'", "'(,)'"),
    ("c_numrange", "numrange", "'[1.5,2.50]'", "'(,0)'"),
    ("c_tsrange", "tsrange", "'[2020-01-01 00:00:00,2020-01-02 00:00:00)'", "'(,infinity]'"),
    ("c_tstzrange", "tstzrange", "'[2020-01-01 00:00:00+05,)'", "'empty'"),
    ("c_daterange", "daterange", "'[2020-01-01,2020-02-01)'", "'(,)'"),
    ("c_int4multirange", "int4multirange", "'{[1,3),[5,7)}'", "'{}'"),
    ("c_datemultirange", "datemultirange", "'{[2020-01-01,2020-02-01)}'", "'{}'"),
    ("c_a_int4", "int4[]", "'{1,NULL,3}'", "'{}'"), ("c_a_text", "text[]", "'{\"a b\",NULL,\"\"}'", "'{x}'"),
    ("c_a_inet", "inet[]", "'{1.2.3.4,::1}'", "'[0:1]={10.0.0.1/8,NULL}'"),
    ("c_a2_int4range", "int4range[]", "'{{\"[1,2)\",empty},{NULL,\"(,3)\"}}'", "'{}'"),
    ("c_a_money", "money[]", "'{1.5,-2}'", "'{}'"), ("c_a_box", "box[]", "'{(3,4),(1,2);(1,1),(0,0)}'", "'{}'"),
    ("c_comp", "comp", "ROW(1, 'x y', 'ok', '10.0.0.1', '[1,2)')", "ROW(NULL, '', 'sad', NULL, 'empty')"),
    ("c_a_comp", "comp[]", "ARRAY[ROW(1, 'a,b', 'sad', '::1', '(,)')::comp, NULL]", "'{}'"),
    ("c_mood", "mood", "'ok'", "'it''s {x}'"), ("c_a_mood", "mood[]", "'{ok,NULL,sad}'", "'{}'"),
    ("c_posint", "posint", "5", "2147483647"), ("c_addr", "addr", "'10.1.2.3/16'", "'::2'"),
    ("c_floatrange", "floatrange", "'[1.5,2)'", "'empty'"),
]

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'it''s {x}');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN addr AS inet;
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TYPE comp AS (a int, b text, m mood, i addr, r int4range);
"""

# a text-format stream carries the output function's text under the walsender's settings: the same ones spockwire
# pins for the connections it decodes from (the slot readers below run in a session set the same way)
PINNED = ("SET DateStyle = ISO; SET IntervalStyle = postgres; SET extra_float_digits = 3; SET TimeZone = 'UTC'; "
          "SET bytea_output = hex; SET lc_monetary = 'C'")

STREAMS = [("pgoutput", False), ("pgoutput", True), ("pglogical", False), ("pglogical", True)]


def _slot(plugin: str, binary: bool) -> str:
    return f"types_{plugin}_{'b' if binary else 't'}"


@pytest.fixture(scope="module")
def db(pg_cluster):
    from tests.pg_fixtures import PgDatabase

    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name("types_live")))
    db.execute(SCHEMA)
    db.execute("CREATE TABLE everything (id int PRIMARY KEY, "
               + ", ".join(f"{name} {typ}" for name, typ, _a, _b in COLUMNS) + ")")
    create_publication(db.dsn, "pub_types", ["everything"])
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'types', dsn := %s)", (db.dsn,))
    db.execute("SELECT pglogical.replication_set_add_table('default', 'everything')")
    for plugin, binary in STREAMS:
        create_slot(db.dsn, _slot(plugin, binary), plugin)
    for ident, pick in ((1, 2), (2, 3)):
        db.execute(f"INSERT INTO everything VALUES ({ident}, " + ", ".join(c[pick] for c in COLUMNS) + ")")
    db.execute("INSERT INTO everything (id) VALUES (3)")
    yield db
    for plugin, binary in STREAMS:
        try:
            drop_slot(db.dsn, _slot(plugin, binary))
        except Exception:  # noqa: BLE001 - a slot still held by a stream that did not close
            pass


@pytest.fixture(scope="module")
def server_text(db) -> dict[str, list]:
    """Column -> the output function's text of rows 1..3, read with the pinned settings."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(PINNED)
            out = {}
            for name, typ, _a, _b in COLUMNS:
                cur.execute("SELECT typoutput::regproc::text FROM pg_type WHERE oid = %s::regtype", (typ,))
                fn = cur.fetchone()[0]
                cur.execute(f"SELECT {fn}({name})::text FROM everything ORDER BY id")
                out[name] = [r[0] for r in cur.fetchall()]
        return out
    finally:
        conn.close()


def _read(db, plugin: str, binary: bool) -> pa.Table:
    kwargs = {"publication": "pub_types"} if plugin == "pgoutput" else {}
    batches = []
    with connect(db.dsn, slot=_slot(plugin, binary), plugin=plugin, binary=binary, **kwargs) as stream:
        assert stream.type_catalog is not None
        deadline = time.monotonic() + 30
        rows = 0
        while rows < 3 and time.monotonic() < deadline:
            for ev in stream.read(0.5):
                if hasattr(ev, "to_arrow"):
                    batches.append(ev.to_arrow())
                    rows += ev.num_rows
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.select(["id"] + [c[0] for c in COLUMNS]).sort_by("id")


@pytest.fixture(scope="module")
def decoded(db) -> dict[tuple[str, str, bool], pa.Table]:
    out = {}
    mp = pytest.MonkeyPatch()
    try:
        for impl in ("c", "python"):
            mp.setenv("SPOCKWIRE_IMPL", impl)
            for plugin, binary in STREAMS:
                out[(impl, plugin, binary)] = _read(db, plugin, binary)
    finally:
        mp.undo()
    return out


def test_every_stream_gives_the_same_types_and_values(decoded) -> None:
    reference = decoded[("c", "pgoutput", False)]
    for key, table in decoded.items():
        assert table.schema == reference.schema, key
        for name in reference.column_names:
            a, b = table.column(name), reference.column(name)
            assert a.equals(b) or a.to_pylist() == b.to_pylist() or str(a.to_pylist()) == str(b.to_pylist()), \
                (key, name, a.to_pylist(), b.to_pylist())


def test_strings_are_the_servers_text(decoded, server_text) -> None:
    reference = decoded[("c", "pgoutput", True)]
    strings = [c[0] for c in COLUMNS if reference.schema.field(c[0]).type == pa.string()]
    # every type without an Arrow kind of its own is among them
    for name in ("c_inet", "c_money", "c_bit", "c_int4range", "c_comp", "c_a_comp", "c_addr", "c_floatrange",
                 "c_a_inet", "c_a2_int4range", "c_tsquery", "c_tid"):
        assert name in strings, name
    for key, table in decoded.items():
        for name in strings:
            if name == "c_numt":
                continue   # numeric without typmod: its own documented text rules, checked in test_typed_values
            assert table.column(name).to_pylist() == server_text[name], (key, name)


def test_domains_and_enums_are_typed_without_user_code(decoded) -> None:
    for key, table in decoded.items():
        assert table.schema.field("c_posint").type == pa.int32(), key
        assert table.column("c_posint").to_pylist() == [5, 2147483647, None], key
        assert table.schema.field("c_mood").type == pa.dictionary(pa.int32(), pa.string()), key
        assert table.column("c_mood").to_pylist() == ["ok", "it's {x}", None], key
        assert table.schema.field("c_a_mood").type == pa.list_(pa.dictionary(pa.int32(), pa.string())), key
        assert table.schema.field("c_int8").type == pa.int64(), key


def test_the_catalog_can_be_turned_off(db) -> None:
    with connect(db.dsn, slot=_slot("pglogical", True), plugin="pglogical", binary=True,
                 type_catalog=None) as stream:
        assert stream.type_catalog is None
        deadline = time.monotonic() + 30
        batches: list[pa.RecordBatch] = []
        while sum(b.num_rows for b in batches) < 3 and time.monotonic() < deadline:
            batches += [ev.to_arrow() for ev in stream.read(0.5) if hasattr(ev, "to_arrow")]
    # pglogical names no types: without a catalog the columns stay as they arrived (binary send bytes here)
    assert all(b.schema.field("c_int4").type == pa.binary() for b in batches)
    values = [v for b in batches for v in b.column("c_int4").to_pylist()]
    assert values == [b"\x00\x00\x00\x2a", b"\xff\xff\xff\xff", None]


# ---------------------------------------------------------------------------------------------------------------
# offline: a capture decoded without the database gives exactly the live values

def _capture(db, plugin: str, binary: bool, out) -> None:
    from spockwire.cli import main

    args = ["capture", "--dsn", db.dsn, "--slot", _slot(plugin, binary), "--plugin", plugin, "--out", str(out),
            "--idle-exit", "1"]
    if plugin == "pgoutput":
        args += ["--publication", "pub_types"]
    if binary:
        args.append("--binary")
    assert main(args) == 0


def _decode_offline(path, impl: str, header_catalog: bool = True) -> pa.Table:
    from spockwire.cli.common import decoder_for, decoder_module
    from spockwire.frames import read_frame_file

    header, body = read_frame_file(path)
    if not header_catalog:
        header = {k: v for k, v in header.items() if k != "type_catalog"}
    dec = decoder_for(decoder_module(impl), header)
    dec.feed_frames(body)
    batches = [ev.to_arrow() for ev in dec.drain() if hasattr(ev, "to_arrow")]
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.select(["id"] + [c[0] for c in COLUMNS]).sort_by("id")


@pytest.fixture(scope="module")
def captures(db, decoded, tmp_path_factory) -> dict[tuple[str, bool], object]:
    """Each stream captured with `spockwire capture` (after `decoded` read it live: the slots did not move)."""
    folder = tmp_path_factory.mktemp("captures")
    out = {}
    for plugin, binary in STREAMS:
        out[(plugin, binary)] = folder / f"{plugin}_{'b' if binary else 't'}.spwf"
        _capture(db, plugin, binary, out[(plugin, binary)])
    return out


@pytest.mark.parametrize("impl", ["c", "python"])
def test_a_capture_decoded_offline_equals_the_live_stream(captures, decoded, impl) -> None:
    """The capture's header records the catalog the live stream asked (pglogical's column types, the composite's
    fields, the enum, the domains, the user range, arrays of them): decoded away from the database, in either
    implementation, every stream gives the live stream's schema and values."""
    from spockwire.frames import read_frame_file

    for (plugin, binary), path in captures.items():
        live = decoded[(impl, plugin, binary)]
        offline = _decode_offline(path, impl)
        assert offline.schema == live.schema, (plugin, binary)
        for name in live.column_names:
            a, b = offline.column(name), live.column(name)
            assert a.equals(b) or str(a.to_pylist()) == str(b.to_pylist()), (plugin, binary, name)   # NaN
        recorded = read_frame_file(path)[0]["type_catalog"]
        names = {t["name"] for t in recorded["types"]}
        assert {"mood", "_mood", "comp", "_comp", "posint", "addr", "floatrange"} <= names, names
        comp = next(t for t in recorded["types"] if t["name"] == "comp")
        assert len(comp["fields"]) == 5
        mood = next(t for t in recorded["types"] if t["name"] == "mood")
        assert mood["labels"] == ["sad", "ok", "it's {x}"]
        assert ("public.everything" in recorded["tables"]) == (plugin != "pgoutput")


def test_without_the_recorded_catalog_user_types_stay_as_they_arrived(captures, decoded) -> None:
    """What the recorded catalog changes: the same binary captures decoded without it lose the user types
    (pgoutput: the composite stays send bytes; pglogical: every column does)."""
    offline = _decode_offline(captures[("pgoutput", True)], "c", header_catalog=False)
    for name in ("c_comp", "c_a_comp", "c_mood", "c_a_mood", "c_floatrange"):
        assert offline.schema.field(name).type == pa.binary(), name
    offline = _decode_offline(captures[("pglogical", True)], "python", header_catalog=False)
    assert offline.schema.field("c_int4").type == pa.binary()


@pytest.mark.spark
def test_spark_decodes_a_capture_with_its_recorded_catalog(captures, decoded) -> None:
    """decode_frame_file (the parallel decode on executors) types the capture with its recorded catalog too:
    the pglogical stream, which names no types, gives the live values."""
    from spockwire.spark import decode_frame_file
    from tests.spark_session import spark_session

    live = decoded[("c", "pglogical", True)]
    df = decode_frame_file(spark_session(), str(captures[("pglogical", True)]), "public.everything")
    rows = sorted(df.select("id", "c_int8", "c_num", "c_comp", "c_a_comp", "c_mood", "c_posint", "c_floatrange")
                  .collect())
    assert [r["c_int8"] for r in rows] == live.column("c_int8").to_pylist()
    assert [r["c_num"] for r in rows] == live.column("c_num").to_pylist()
    for name in ("c_comp", "c_a_comp", "c_mood", "c_posint", "c_floatrange"):
        assert [r[name] for r in rows] == live.column(name).to_pylist(), name
