"""The JSON protocol (proto_format=json) of pglogical 2 on PostgreSQL 15 and Spock 6 on PostgreSQL 18, against
the native protocol read from the same slot position (the same slot peeked in each format), in both
implementations: the type table of tests/test_typed_values.py, TOAST (unchanged values left out), key changes,
no_txinfo (the change columns it cannot fill are null), a live `connect(..., proto_format="json")` stream, a
`spockwire capture` frame file, and malformed messages (the same error in both implementations).
"""
from __future__ import annotations

import io
import json
import re
from typing import Any, Sequence

import pyarrow as pa
import pytest

from spockwire.errors import ProtocolError
from spockwire.wire.json_protocol import JsonDecoder
from tests.conftest import load_impl
from tests.test_connection_pg import collect, row_count
from tests.test_spock_live import sdb  # noqa: F401  (fixture)
from tests.test_typed_values import (CASES, PGL_BASE, SCHEMA, Dataset, _accepts_xml, _insert_sql,  # noqa: F401
                                     _storage)

IMPLS = ("c", "python")
#: fixtures of this module that reach a server dynamically (tests/conftest.py marks the tests using them `pg`)
SERVER_FIXTURES = frozenset({"dataset"})
CHANGE = ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast")

#: a workload for TOAST and key changes (big: an out-of-line value, unchanged in the second update)
TOAST_SCHEMA = ("CREATE TABLE tk (id int PRIMARY KEY, v text, big text, tags text[]);"
                "ALTER TABLE tk ALTER big SET STORAGE EXTERNAL")
TOAST_WORK = ("INSERT INTO tk VALUES (1, 'a', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g),"
              " '{x,\"y z\",NULL}'); INSERT INTO tk VALUES (2, NULL, 'small', '{}')",
              "UPDATE tk SET v = 'b' WHERE id = 1",
              "UPDATE tk SET id = 10, v = 'moved' WHERE id = 1",
              "BEGIN; DELETE FROM tk WHERE id = 2; UPDATE tk SET big = 'now small' WHERE id = 10; COMMIT")


def _peek(db: Any, slot: str, options: dict[str, str]) -> list[tuple[int, bytes]]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                        "VARIADIC %s::text[])", (slot, [x for kv in options.items() for x in kv]))
            return [(int(lsn.split("/")[0], 16) << 32 | int(lsn.split("/")[1], 16), bytes(d))
                    for lsn, d in cur.fetchall()]
    finally:
        conn.close()


def _decode(decoder: Any, frames: Sequence[tuple[int, bytes]]) -> dict[str, pa.Table]:
    for lsn, payload in frames:
        decoder.feed(payload, lsn)
    out: dict[str, list] = {}
    for ev in decoder.drain():
        out.setdefault(ev.relation.name, []).append(ev.to_arrow())
    return {name: pa.Table.from_batches(b).replace_schema_metadata(None) for name, b in out.items()}


def _json(impl: str, protocol: str, catalog: Any, frames: Sequence[tuple[int, bytes]]) -> dict[str, pa.Table]:
    return _decode(JsonDecoder(protocol, implementation=load_impl(impl), type_catalog=catalog), frames)


def _canon(value: Any) -> Any:
    """A value comparable with ==: floats by their repr (NaN equals NaN, -0.0 differs from 0.0)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _json_reading(table: str, column: str, value: Any) -> Any:
    """A native value as the JSON form can express it (docs/protocols.md, "The JSON protocol"): no origin name; a
    json or jsonb value that is JSON null is written like SQL NULL; an array's lower bounds are not written."""
    if column == "_origin":
        return None
    if table in ("t_json", "t_jsonb") and value == "null":
        return None
    if table == "t_a_jsonb" and isinstance(value, list):
        return [None if v == "null" else v for v in value]
    if table == "t_a_inet" and isinstance(value, str) and value.startswith("["):
        return value[value.index("=") + 1:]
    return value


def _same(json_tables: dict[str, pa.Table], native: dict[str, pa.Table], where: str) -> list[str]:
    """Asserts equal tables (types and values) but where the JSON form cannot express a value; returns those."""
    assert set(json_tables) == set(native), where
    differ, gaps = [], []
    for name, table in native.items():
        got = json_tables[name]
        assert got.schema == table.schema, f"{where} {name}"
        for field in table.schema:
            ours = _storage(got.column(field.name).combine_chunks())
            theirs = _storage(table.column(field.name).combine_chunks())
            expressible = [_json_reading(name, field.name, v) for v in theirs]
            if expressible != theirs:
                gaps.append(f"{name}.{field.name}")
            if _canon(ours) != _canon(expressible):
                differ.append(f"{name}.{field.name}: {ours} != {theirs}")
    assert not differ, f"{where}: " + "\n".join(differ)
    return gaps


# ------------------------------------------------------------------------------------------------------------------
# pglogical 2 on PostgreSQL 15

@pytest.mark.parametrize("dataset", ["pg15"], indirect=True)
def test_pglogical_json_type_table_equals_native_text(dataset: Dataset) -> None:
    """Every type of the type table, peeked from the same pglogical slot as JSON and as native text, decodes to the
    same batches (change columns and values) in both implementations; relation ids are not in the JSON form."""
    frames = _peek(dataset.db, "tv_pgl", dict(PGL_BASE, proto_format="json"))
    assert frames[0][1].startswith(b'{"action":"S"')
    native, text = {}, _peek(dataset.db, "tv_pgl", PGL_BASE)
    for impl in IMPLS:
        native[impl] = _decode(load_impl(impl).Decoder("pglogical", type_catalog=dataset.catalog), text)
        got = _json(impl, "pglogical", dataset.catalog, frames)
        assert _same(got, native[impl], f"pglogical json {impl}") == ["t_json.v", "t_jsonb.v", "t_a_jsonb.v",
                                                                      "t_a_inet.v"]
    assert len(native["c"]) == len(CASES)


#: pglogical startup parameters of the TOAST / key-change database (forwarded transactions included)
PGL_DEFAULT = {"startup_params_format": "1", "min_proto_version": "1", "max_proto_version": "1",
               "pglogical.replication_set_names": "default", "pglogical.forward_origins": "all"}


def _pglogical_toast_db(pg_db: Any) -> None:
    """TOAST_WORK, then a transaction replicated from elsewhere (origin `up_<db>`)."""
    pg_db.execute("CREATE EXTENSION pglogical")
    pg_db.execute("SELECT pglogical.create_node(node_name := 'jn', dsn := %s)", (pg_db.dsn,))
    pg_db.execute(TOAST_SCHEMA)
    pg_db.execute("SELECT pglogical.replication_set_add_table('default', 'tk')")
    pg_db.execute("SELECT pg_create_logical_replication_slot('jp', 'pglogical_output')")
    for sql in TOAST_WORK:
        pg_db.execute(sql)
    pg_db.execute("SELECT pg_replication_origin_create(%s)", (f"up_{pg_db.name}",))
    pg_db.execute(f"SELECT pg_replication_origin_session_setup('up_{pg_db.name}'); "
                  "SELECT pg_replication_origin_xact_setup('0/ABCDEF', now()); "
                  "INSERT INTO tk VALUES (3, 'from elsewhere', 'x', NULL)")


def test_pglogical_json_toast_key_changes_and_no_txinfo(pg_db) -> None:
    """An unchanged out-of-line value (left out of the JSON tuple) is `_unchanged_toast` as in the native stream;
    a key change and a delete carry the old key; with no_txinfo the xid, commit LSN and commit time are null (the
    JSON form leaves them out) and everything else is unchanged. A forwarded transaction's `_origin` is null: its
    BEGIN names only the local replication origin's number."""
    from spockwire.values import PostgresTypeCatalog

    _pglogical_toast_db(pg_db)
    base = PGL_DEFAULT
    frames = _peek(pg_db, "jp", dict(base, proto_format="json"))
    # the forwarded transaction: an empty message where the native ORIGIN would be; pglogical's BEGIN has no
    # "origin_id" (built without HAVE_REPLICATION_ORIGINS in its JSON writer)
    assert frames[-3][1] == b"" and frames[-4][1].startswith(b'{"action":"B"') and b"origin" not in frames[-4][1]
    bare = _peek(pg_db, "jp", dict(base, proto_format="json", no_txinfo="t"))
    assert b'"xid"' not in b"".join(p for _l, p in bare)
    catalog = PostgresTypeCatalog(pg_db.dsn)
    text = _peek(pg_db, "jp", base)
    try:
        for impl in IMPLS:
            native = _decode(load_impl(impl).Decoder("pglogical", type_catalog=catalog), text)
            assert _same(_json(impl, "pglogical", catalog, frames), native, f"toast {impl}") == ["tk._origin"]
            rows = native["tk"].to_pylist()
            assert [r["_change_type"] for r in rows] == ["insert", "insert", "update_postimage", "update_preimage",
                                                         "update_postimage", "delete", "update_postimage", "insert"]
            assert [r["_origin"] for r in rows] == [None] * 7 + [f"up_{pg_db.name}"]
            assert rows[2]["_unchanged_toast"] == ["big"] and rows[2]["big"] is None
            assert rows[3]["id"] == 1 and rows[4]["id"] == 10 and rows[4]["tags"] == ["x", "y z", None]
            without = _json(impl, "pglogical", catalog, bare)["tk"]
            for name in ("_xid", "_commit_lsn", "_commit_ts"):
                assert without.column(name).null_count == without.num_rows, name
                assert without.schema.field(name).nullable
            for name in native["tk"].column_names:
                if name not in ("_xid", "_commit_lsn", "_commit_ts", "_origin"):
                    assert without.column(name).equals(native["tk"].column(name)), name
            assert without.column("_origin").null_count == without.num_rows
        # without a catalog: untyped columns of the values' text, as in the native stream
        for impl in IMPLS:
            untyped = _decode(load_impl(impl).Decoder("pglogical"), text)
            assert _same(_json(impl, "pglogical", None, frames), untyped, f"untyped {impl}") == ["tk._origin"]
    finally:
        catalog.close()


def _cli(*argv: str) -> str:
    """Run a `spockwire` command in this process; its standard output."""
    from spockwire.cli import build_parser

    args = build_parser().parse_args(argv)
    out = io.StringIO()
    assert args._run(args, out=out) == 0
    return out.getvalue()


@pytest.mark.parametrize("transport", ["replication", "sql"])
def test_pglogical_connect_and_capture_in_json(pg_db, tmp_path, transport: str) -> None:
    """`connect(..., proto_format="json")` sends the parameter, checks the JSON startup message and hands out the
    batches the native stream gives; `spockwire capture --proto-format json` records that in the frame file's
    header, and `decoder_for` (decode, inspect) reads the file back with the JSON decoder of either
    implementation; `spockwire decode` stages its rows."""
    import spockwire
    from spockwire.cli.common import decoder_for
    from spockwire.frames import read_frame_file
    from spockwire.values import PostgresTypeCatalog

    _pglogical_toast_db(pg_db)
    catalog = PostgresTypeCatalog(pg_db.dsn)
    try:
        native = _decode(load_impl("c").Decoder("pglogical", type_catalog=catalog),
                         _peek(pg_db, "jp", PGL_DEFAULT))["tk"]
    finally:
        catalog.close()
    path = tmp_path / "json.spwf"
    _cli("capture", "--dsn", pg_db.dsn, "--slot", "jp", "--plugin", "pglogical", "--proto-format", "json",
         "--transport", transport, "--idle-exit", "1", "-o", str(path))
    header, body = read_frame_file(path)
    assert header["proto_format"] == "json" and header["protocol"] == "pglogical"
    staged = _cli("decode", str(path), "--out", str(tmp_path / "staging"))
    assert re.search(r"public\.tk\s+8 rows", staged), staged
    listed = [json.loads(line) for line in _cli("inspect", str(path), "--json").splitlines()]
    kinds = [r["name"] for r in listed if r.get("record") == "frame"]
    assert kinds[0] == "startup", kinds
    # the workload's five transactions with rows and the replication origin's creation, which pglogical passes on
    # as BEGIN + COMMIT; another transaction the server decodes without rows (autovacuum's ANALYZE of the table,
    # say) comes the same way, and may come before or in between
    txns: list[list[str]] = []
    for kind in kinds[1:]:
        if kind == "begin":
            txns.append([])
        elif kind != "commit":
            txns[-1].append(kind)
    with_rows = [t for t in txns if {"insert", "update", "delete"} & set(t)]
    assert len(with_rows) == 5 and len(txns) >= 6 and all(t == [] for t in txns if t not in with_rows), kinds
    assert with_rows[0][0] in ("relation", "insert"), kinds   # the first rows come after their relation, or bare
    assert "empty (JSON protocol: in place of origin)" in kinds
    for impl in IMPLS:
        dec = decoder_for(load_impl(impl), header, type_catalog=PostgresTypeCatalog(pg_db.dsn))
        assert isinstance(dec, JsonDecoder)
        dec.feed_frames(body)
        got = pa.Table.from_batches([ev.to_arrow() for ev in dec.drain()]).replace_schema_metadata(None)
        _same({"tk": got}, {"tk": native}, f"capture {impl}")
    with spockwire.connect(pg_db.dsn, slot="jp", plugin="pglogical", proto_format="json", transport=transport,
                           reconnect=False) as stream:
        events = collect(stream, lambda evs: row_count(evs) >= native.num_rows)
        assert stream.options["proto_format"] == "json" and stream.startup_params["no_txinfo"] == "f"
    assert all(ev.relation.relid == 0 and ev.relation.qualified_name == "public.tk" for ev in events)
    got = pa.Table.from_batches([ev.to_arrow() for ev in events]).replace_schema_metadata(None)
    _same({"tk": got}, {"tk": native}, f"connect {transport}")


# ------------------------------------------------------------------------------------------------------------------
# Spock 6 on PostgreSQL 18

SPOCK_BASE = {"startup_params_format": "1", "min_proto_version": "5", "max_proto_version": "5",
              "spock.replication_set_names": "default", "expected_encoding": "UTF8"}


def test_spock_json_type_table_toast_and_keys_equal_native_text(sdb) -> None:
    """Spock's JSON stream (no LSN prefix, an empty message after each BEGIN) decodes to what its native protocol
    5 text stream decodes to, for every type of the type table and the TOAST / key-change workload, in both
    implementations; `_origin` (the local node's name in native O messages, a local transaction here: null in
    both) is null. `connect(..., proto_format="json")` over the replication protocol gives the same batches."""
    import spockwire
    from spockwire.values import PostgresTypeCatalog

    sdb.execute(SCHEMA)
    has_xml = _accepts_xml(sdb)
    cases = [c for c in CASES if has_xml or c.sqltype.rstrip("[]") != "xml"]
    sdb.execute(";".join(f"CREATE TABLE t_{c.name} (id int PRIMARY KEY, v {c.sqltype})" for c in cases))
    sdb.execute(TOAST_SCHEMA)
    sdb.execute("SELECT spock.repset_add_table('default', t) FROM unnest(%s::text[]) t",
                ([f"t_{c.name}" for c in cases] + ["tk"],))
    sdb.execute("SELECT pg_create_logical_replication_slot('js', 'spock_output')")
    sdb.execute(";\n".join(_insert_sql(f"t_{c.name}", c.values) for c in cases))
    for sql in TOAST_WORK:
        sdb.execute(sql)
    frames = _peek(sdb, "js", dict(SPOCK_BASE, proto_format="json"))
    assert b"" in [p for _l, p in frames] and all(p[:1] in (b"{", b"") for _l, p in frames)
    catalog = PostgresTypeCatalog(sdb.dsn)
    text = _peek(sdb, "js", SPOCK_BASE)
    try:
        for impl in IMPLS:
            native = _decode(load_impl(impl).Decoder("spock", type_catalog=catalog), text)
            assert native["tk"].column("_unchanged_toast").to_pylist()[2] == ["big"]
            gaps = _same(_json(impl, "spock", catalog, frames), native, f"spock json {impl}")
            assert gaps == [n for n in ("t_json.v", "t_jsonb.v", "t_a_jsonb.v", "t_a_inet.v") if n[:-2] in native]
        assert len(native) == len(cases) + 1
    finally:
        catalog.close()
    # the same over a walsender connection: the JSON startup message is checked (protocol 5 negotiated)
    total = sum(t.num_rows for t in native.values())
    with spockwire.connect(sdb.dsn, slot="js", plugin="spock", proto_format="json", reconnect=False) as stream:
        events = collect(stream, lambda evs: row_count(evs) >= total)
        assert stream.proto_version == 5 and stream.startup_params["proto_version"] == "5"
    live: dict[str, list] = {}
    for ev in events:
        live.setdefault(ev.relation.name, []).append(ev.to_arrow())
    _same({name: pa.Table.from_batches(b).replace_schema_metadata(None) for name, b in live.items()}, native,
          "spock connect")


# ------------------------------------------------------------------------------------------------------------------
# malformed messages: no server

S_PGL = b'{"action":"S", "params": {"max_proto_version":"1","encoding":"UTF8","no_txinfo":"f"}}'
B_OK = b'{"action":"B", "has_catalog_changes":"f", "xid":"730", "first_lsn":"0/1997418", ' \
       b'"commit_time":"2026-11-26 16:55:37.60362+00"}'
I_OK = b'{"action":"I","relation":["public","t"],"newtuple":{"id":1,"v":"x"}}'
C_OK = b'{"action":"C", "final_lsn":"0/1998BC0", "end_lsn":"0/1998BF0"}'

MALFORMED = [
    ([b'{"action":"S", "params": {"a":"1"'], "bad JSON 'S' message at LSN 0/10, byte 33: the JSON ends early"),
    ([b"[1]"], "bad JSON message at LSN 0/10, byte 0: a message must be a JSON object, not an array"),
    ([B_OK], "bad JSON 'B' message at LSN 0/10, byte 0: the stream must begin with the startup message (action S)"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":1,}}'],
     "bad JSON 'I' message at LSN 0/12, byte 59: unexpected '}' in the JSON"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":"1\x01"}}'],
     "bad JSON 'I' message at LSN 0/12, byte 57: string is not terminated, or holds a control character or a bad "
     "escape"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":"\\u0000"}}'],
     "bad JSON 'I' message at LSN 0/12, byte 57: string holds a NUL character (\\u0000), which no PostgreSQL text "
     "can"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":1}} x'],
     "bad JSON 'I' message at LSN 0/12, byte 61: more after the end of the JSON value"),
    ([S_PGL, B_OK, b'{"action":"X"}'], "bad JSON 'X' message at LSN 0/12, byte 10: unknown action 'X'"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public"],"newtuple":{}}'],
     "bad JSON 'I' message at LSN 0/12, byte 25: INSERT needs \"relation\": [schema, table]"),
    ([S_PGL, B_OK, b'{"action":"D","relation":["public","t"],"newtuple":{"id":1}}'],
     "bad JSON 'D' message at LSN 0/12, byte 0: DELETE needs an oldtuple and no newtuple"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":1},"extra":1}'],
     "bad JSON 'I' message at LSN 0/12, byte 68: INSERT has an unexpected key 'extra'"),
    ([S_PGL, b'{"action":"B", "has_catalog_changes":"f", "first_lsn":"0/1"}'],
     "bad JSON 'B' message at LSN 0/11, byte 0: BEGIN has no 'xid' (and the stream is not no_txinfo)"),
    ([S_PGL, b'{"action":"B", "has_catalog_changes":"f", "xid":"730", "first_lsn":"0/1", "commit_time":"soon"}'],
     "bad JSON 'B' message at LSN 0/11, byte 88: commit_time 'soon' is not a timestamp with time zone"),
    ([S_PGL, B_OK, I_OK, b'{"action":"C", "final_lsn":"0/X", "end_lsn":"0/1998BF0"}'],
     "bad JSON 'C' message at LSN 0/13, byte 27: final_lsn '0/X' is not an LSN (X/Y in hex)"),
    ([S_PGL, B_OK, b"", b""], "bad JSON message at LSN 0/13, byte 0: empty message (the plugins send one only right after "
                               "a BEGIN)"),
    ([S_PGL, B_OK, b'{"action":"I","relation":["public","t"],"newtuple":{"id":1,"id":2}}'],
     "bad JSON 'I' message at LSN 0/12, byte 51: a tuple names a column twice"),
]


@pytest.mark.parametrize("messages, error", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_json_messages_give_the_same_clear_error(messages: list[bytes], error: str) -> None:
    """A broken or unexpected message is a ProtocolError naming its action, its LSN and the byte, never a crash
    or a skip; both implementations raise the same text."""
    for impl in IMPLS:
        dec = JsonDecoder("pglogical", implementation=load_impl(impl))
        with pytest.raises(ProtocolError) as info:
            for i, payload in enumerate(messages):
                dec.feed(payload, 0x10 + i)
        assert str(info.value) == error, impl


class _Types:
    """A catalog that types t(id int4, v <oid>) -- enough for value errors without a server."""

    def __init__(self, oid: int) -> None:
        self.oid = oid

    def type_info(self, oid: int) -> None:
        return None

    def column_types(self, relation: Any) -> list[tuple[int, int]]:
        return [(23, -1), (self.oid, -1)]


@pytest.mark.parametrize("oid, value, error", [
    (23, b'"12x"', "bad JSON 'I' message at LSN 0/12, byte 63 of column 1 (\"v\"): cannot decode text value b'12x' as "
          "int4"),
    (16, b'"t"', "bad JSON 'I' message at LSN 0/12, byte 63 of column 1 (\"v\"): a bool value must be JSON true "
                 "or false, not a string"),
    (1082, b"17", "bad JSON 'I' message at LSN 0/12, byte 63 of column 1 (\"v\"): a value of this type must be a "
                  "JSON string, not a number"),
    (1007, b"[[1],2]", "bad JSON 'I' message at LSN 0/12, byte 63 of column 1 (\"v\"): an array mixes sub-arrays "
                       "and elements"),
    (1007, b"[[[[[[[1]]]]]]]", "bad JSON 'I' message at LSN 0/12, byte 63 of column 1 (\"v\"): an array value nested "
                               "deeper than PostgreSQL's 6 dimensions"),
], ids=["int4-text", "bool-string", "date-number", "ragged-array", "seven-dimensions"])
def test_value_errors_name_the_column_and_its_byte(oid: int, value: bytes, error: str) -> None:
    """A value that does not fit its column's type: the error of the text kernel (the same in both
    implementations) or of the JSON shape, at the byte where the value starts in the JSON message."""
    texts = []
    for impl in IMPLS:
        dec = JsonDecoder("pglogical", implementation=load_impl(impl), type_catalog=_Types(oid))
        msg = b'{"action":"I","relation":["public","t"],"newtuple":{"id":1,"v":' + value + b"}}"
        with pytest.raises(ProtocolError) as info:
            for i, payload in enumerate([S_PGL, B_OK, msg]):
                dec.feed(payload, 0x10 + i)
        assert str(info.value).startswith(error), (impl, str(info.value))
        assert info.value.column == 1 and info.value.offset == 63
        texts.append(str(info.value))
    assert texts[0] == texts[1]


def test_a_spilled_large_transaction_keeps_its_change_columns(tmp_path) -> None:
    """Rows of a transaction larger than `spill_bytes` wait on disk (the native decoder's spill) and still come
    out with the JSON stream's xid, commit LSN and commit time."""
    import datetime as dt

    row = b'{"action":"I","relation":["public","t"],"newtuple":{"id":%d,"v":"' + b"x" * 4000 + b'"}}'
    for impl in IMPLS:
        dec = JsonDecoder("pglogical", implementation=load_impl(impl), spill_bytes=1 << 20,
                          spill_dir=str(tmp_path))
        for i, payload in enumerate([S_PGL, B_OK, *(row % n for n in range(600)), C_OK]):
            dec.feed(payload, 0x10 + i)
        events = dec.drain()
        assert any(type(ev._inner).__name__ == "SpilledChangeBatch" for ev in events), impl
        table = pa.Table.from_batches([ev.to_arrow() for ev in events])
        assert table.column("id").to_pylist() == [str(n) for n in range(600)]   # untyped: the text
        assert set(table.column("_xid").to_pylist()) == {730}
        assert set(table.column("_commit_lsn").to_pylist()) == {0x1998BC0}
        assert set(table.column("_commit_ts").to_pylist()) == {dt.datetime(2026, 11, 26, 16, 55, 37, 603620,
                                                                           tzinfo=dt.timezone.utc)}
        assert dec.committed_lsn == 0x1998BF0 and dec.open_transactions == 0


def test_frame_files_name_their_format(tmp_path) -> None:
    """A frame file without "proto_format" is native (every file written before the key); "json" is read by the
    JSON decoder and refused, with a clear error, by the Spark frame-file reader; any other value is an error."""
    from spockwire.cli.common import decoder_for
    from spockwire.errors import FrameError
    from spockwire.frames import frame_proto_format, read_frame_file, write_frame_file
    from spockwire.spark.distributed import plan_chunks

    native, js, odd = tmp_path / "n.spwf", tmp_path / "j.spwf", tmp_path / "o.spwf"
    write_frame_file(native, "pglogical", [])
    write_frame_file(js, "pglogical", [(0x10, S_PGL)], proto_format="json")
    write_frame_file(odd, "pgoutput", [], proto_format="json")
    assert frame_proto_format(read_frame_file(native)[0]) == "native"
    header, body = read_frame_file(js)
    assert frame_proto_format(header) == "json"
    dec = decoder_for(load_impl("python"), header)
    assert isinstance(dec, JsonDecoder) and dec.feed_frames(body) == body.nbytes
    assert dec.startup_params["no_txinfo"] == "f"
    with pytest.raises(FrameError, match="a capture of the JSON protocol is read by `spockwire decode`"):
        plan_chunks(str(js))
    with pytest.raises(FrameError, match="proto_format 'json' is not readable here"):
        frame_proto_format(read_frame_file(odd)[0])


def test_deeply_nested_json_without_a_catalog_is_its_text() -> None:
    """Without a catalog a value's type is unknown: an array nested deeper than any PostgreSQL array (a json value)
    is its JSON text, read without recursion."""
    deep = b"[" * 3000 + b"]" * 3000
    for impl in IMPLS:
        dec = JsonDecoder("pglogical", implementation=load_impl(impl))
        msg = b'{"action":"I","relation":["public","t"],"newtuple":{"id":1,"v":' + deep + b"}}"
        for i, payload in enumerate([S_PGL, B_OK, msg, C_OK]):
            dec.feed(payload, 0x10 + i)
        (event,) = dec.drain()
        assert event.to_arrow().column("v").to_pylist() == [deep.decode()], impl
