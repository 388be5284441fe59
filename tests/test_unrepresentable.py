"""Valid values a column's Arrow type cannot hold keep the stream flowing, losslessly.

A live typed stream (pgoutput text and binary, pglogical text and binary with a type catalog) of a table whose
rows bring, one after the other, a 2-D int[] array, NaN in numeric(10,2), a timestamp in 294270 AD, an interval
of 2,562,048 hours and a lower bound of 0: each such value switches its column to PostgreSQL's text under a new
version of the relation, the rows before it keep their typed batch, and every text value equals the server's own
`::text` of it. Both implementations give the same batches. on_unrepresentable="error" raises, column_types
overrides apply, and the ingest worker stages past such values, writing the new schema version.
"""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from spockwire.errors import ProtocolError
from spockwire.ingest import read_staging
from spockwire.ingest.staging import StagingState
from spockwire.values.catalog import PostgresTypeCatalog
from tests.conftest import IMPLEMENTATIONS, load_impl
from tests.pg_fixtures import PgDatabase

COLUMNS = ("a", "n", "ts", "iv")
ROWS = [  # id, a int[], n numeric(10,2), ts timestamp, iv interval
    (1, "'{1,2}'", "1.50", "'2024-01-01 00:00:00'", "'1 day'"),
    (2, "'{{1,2},{3,4}}'", "2.00", "'2024-01-02 00:00:00'", "'2 hours'"),        # a: two dimensions
    (3, "'{5}'", "'NaN'", "'2024-01-03 00:00:00'", "'3 mins'"),                 # n: NaN in numeric(10,2)
    (4, "'{6}'", "4.00", "'294270-01-01 12:00:00'", "'4 days'"),                # ts: past 294247 AD
    (5, "'{7}'", "5.00", "'2024-01-05 00:00:00'", "'2562048 hours'"),           # iv: overflows nanoseconds
    (6, "'[0:1]={8,9}'", "6.00", "'2024-01-06 00:00:00'", "'1 day'"),           # a again (already text)
    (7, "'{10}'", "7.00", "'2024-01-07 00:00:00'", "'5 days'"),
]
# the row at which each column becomes text, and the relation version every row is decoded with
SWITCH_AT = {"a": 2, "n": 3, "ts": 4, "iv": 5}
VERSION_OF_ROW = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 5, 7: 5}

PGOUTPUT_TEXT = ["proto_version", "1", "publication_names", "pub_u"]
PGOUTPUT_BINARY = PGOUTPUT_TEXT + ["binary", "true"]
PGL_TEXT = ["startup_params_format", "1", "min_proto_version", "1", "max_proto_version", "1",
            "pglogical.replication_set_names", "u_set"]
PGL_BINARY = PGL_TEXT + ["binary.want_binary_basetypes", "1", "binary.basetypes_major_version", "1500"]
PGL_INTERNAL_UT = [o if o != "u_set" else "ut_set" for o in PGL_BINARY] + ["binary.want_internal_basetypes", "1"]
STREAMS = {"pgoutput_text": ("pgoutput", "u_pgo", PGOUTPUT_TEXT), "pgoutput_binary": ("pgoutput", "u_pgo", PGOUTPUT_BINARY),
           "pglogical_text": ("pglogical", "u_pgl", PGL_TEXT), "pglogical_binary": ("pglogical", "u_pgl", PGL_BINARY)}


class Source:
    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self.streams: dict[str, tuple[str, list[bytes]]] = {}
        self.text: dict[int, dict[str, str]] = {}
        self.ut_text: dict[int, dict[str, str]] = {}
        self.catalog = PostgresTypeCatalog(db.dsn)

    def decode(self, impl_name: str, stream: str, **kwargs: Any) -> list[Any]:
        protocol, payloads = self.streams[stream]
        dec = load_impl(impl_name).Decoder(protocol, type_catalog=self.catalog, **kwargs)
        for payload in payloads:
            dec.feed(payload)
        return [e for e in dec.drain() if hasattr(e, "to_arrow")]


@pytest.fixture(scope="module")
def source(pg_cluster) -> Source:
    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name("unrepresentable")))
    db.execute("CREATE TABLE u (id int PRIMARY KEY, a int[], n numeric(10,2), ts timestamp, iv interval)")
    db.execute("CREATE PUBLICATION pub_u FOR TABLE u")
    db.execute("CREATE EXTENSION pglogical")
    db.execute("SELECT pglogical.create_node(node_name := 'u', dsn := %s)", (db.dsn,))
    db.execute("SELECT pglogical.create_replication_set('u_set')")
    db.execute("SELECT pglogical.replication_set_add_table('u_set', 'u'::regclass)")
    db.execute("CREATE TABLE ut (id int PRIMARY KEY, ts timestamp, tz timestamptz)")
    db.execute("SELECT pglogical.create_replication_set('ut_set')")
    db.execute("SELECT pglogical.replication_set_add_table('ut_set', 'ut'::regclass)")
    db.execute("SELECT pg_create_logical_replication_slot('u_pgo', 'pgoutput')")
    db.execute("SELECT pg_create_logical_replication_slot('u_pgl', 'pglogical_output')")
    db.execute("BEGIN; " + "; ".join(f"INSERT INTO u VALUES ({', '.join(map(str, r))})" for r in ROWS) + "; COMMIT")
    db.execute("INSERT INTO ut VALUES (1, '2024-01-01 10:00', '2024-01-01 10:00+00'), "
               "(2, '294270-01-01 12:00:00.5', '2024-01-02 10:00+00'), (3, '1999-12-31 23:59:59', "
               "'294276-12-31 23:59:59.999999+00')")
    src = Source(db)
    for name, (protocol, slot, options) in STREAMS.items():
        rows = db.query("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, VARIADIC %s::text[])",
                        (slot, options))
        src.streams[name] = (protocol, [bytes(r[0]) for r in rows])
    rows = db.query("SELECT data FROM pg_logical_slot_peek_binary_changes('u_pgl', NULL, NULL, VARIADIC %s::text[])",
                    (PGL_INTERNAL_UT,))
    src.streams["pglogical_internal_ut"] = ("pglogical", [bytes(r[0]) for r in rows])
    for row in db.query("SELECT id, a::text, n::text, ts::text, iv::text FROM u ORDER BY id"):
        src.text[row[0]] = dict(zip(COLUMNS, row[1:]))
    db.execute("SET TimeZone = 'UTC'")
    src.ut_text = {r[0]: {"ts": r[1], "tz": r[2]} for r in
                   db.query("SET TimeZone = 'UTC'; SELECT id, ts::text, tz::text FROM ut")}
    return src


def _rows(batches: list[Any]) -> list[tuple[int, dict[str, Any], dict[str, pa.DataType]]]:
    """(relation version, row, column types) of every decoded row, in order."""
    out = []
    for b in batches:
        rb = b.to_arrow()
        types = {c: rb.schema.field(c).type for c in COLUMNS}
        out.extend((b.relation.version, row, types) for row in b.to_pylist())
    return out


@pytest.mark.parametrize("stream", sorted(STREAMS))
@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_unrepresentable_values_switch_the_column_to_the_servers_text(source: Source, impl_name: str,
                                                                     stream: str) -> None:
    rows = _rows(source.decode(impl_name, stream))
    assert [row["id"] for _v, row, _t in rows] == [r[0] for r in ROWS]
    assert [row["_seq"] for _v, row, _t in rows] == list(range(len(ROWS)))
    for version, row, types in rows:
        rid = row["id"]
        assert version == VERSION_OF_ROW[rid], (stream, rid)
        for col in COLUMNS:
            if rid >= SWITCH_AT[col]:
                assert types[col] == pa.string(), (stream, rid, col)
                assert row[col] == source.text[rid][col], (stream, rid, col)
            else:
                assert types[col] != pa.string(), (stream, rid, col)
    # the rows before each switch keep their typed values
    first = rows[0][1]
    assert (first["a"], first["n"], first["ts"]) == ([1, 2], Decimal("1.50"), dt.datetime(2024, 1, 1))
    assert first["iv"] == pa.MonthDayNano([0, 1, 0])


def test_both_implementations_give_the_same_batches(source: Source) -> None:
    for stream in STREAMS:
        got = []
        for impl_name in IMPLEMENTATIONS:
            got.append([(b.relation, b.to_arrow()) for b in source.decode(impl_name, stream)])
        assert [r for r, _ in got[0]] == [r for r, _ in got[1]], stream
        for (_, a), (_, b) in zip(*got):
            assert a.equals(b), stream


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_strict_mode_raises_the_error(source: Source, impl_name: str) -> None:
    for stream in STREAMS:
        with pytest.raises(ProtocolError, match="multi-dimensional") as info:
            source.decode(impl_name, stream, on_unrepresentable="error")
        assert info.value.column_name == "a"
    with pytest.raises(ValueError, match="on_unrepresentable"):
        load_impl(impl_name).Decoder("pgoutput", on_unrepresentable="skip")


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_column_type_overrides(source: Source, impl_name: str) -> None:
    for stream in STREAMS:
        batches = source.decode(impl_name, stream, on_unrepresentable="error",
                                column_types={"public.u.a": "text", "public.u.n": "text", "public.u.ts": "raw",
                                              "public.u.iv": "text", "public.other.a": "raw"})
        rows = _rows(batches)
        assert {v for v, _r, _t in rows} == {1}, stream           # nothing left to switch: one version
        for _v, row, types in rows:
            for col in ("a", "n", "iv"):
                assert types[col] == pa.string()
                assert row[col] == source.text[row["id"]][col], (stream, col)
            if stream.endswith("_text"):
                assert types["ts"] == pa.string() and row["ts"] == source.text[row["id"]]["ts"]
            else:
                assert types["ts"] == pa.binary() and len(row["ts"]) == 8     # timestamp_send: int64
    for bad in ({"u.a": "text"}, {"public.u.a": "list"}):
        with pytest.raises(ValueError, match="column_types"):
            load_impl(impl_name).Decoder("pgoutput", column_types=bad)


def test_ingest_stages_past_unrepresentable_values(pg_db, tmp_path) -> None:
    """`spockwire ingest` (pgoutput binary, --column-type) gets past every such value and writes each new schema
    version; the staged text equals the server's."""
    from spockwire.connection import create_publication, create_slot

    pg_db.execute("CREATE TABLE u (id int PRIMARY KEY, a int[], n numeric(10,2), ts timestamp, iv interval)")
    create_publication(pg_db.dsn, "pub")
    slot = f"{pg_db.name}_s"
    create_slot(pg_db.dsn, slot, "pgoutput")
    for r in ROWS:
        pg_db.execute(f"INSERT INTO u VALUES ({', '.join(map(str, r))})")
    out = tmp_path / "staging"
    proc = subprocess.run([sys.executable, "-m", "spockwire", "ingest", "--dsn", pg_db.dsn, "--slot", slot,
                           "--publication", "pub", "--out", str(out), "--binary", "--idle-exit", "1.5",
                           "--flush-seconds", "0.2", "--column-type", "public.u.iv=text",
                           "--column-type", "public.other.x=raw"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = {r[0]: dict(zip(COLUMNS, r[1:])) for r in
            pg_db.query("SELECT id, a::text, n::text, ts::text, iv::text FROM u")}
    state = StagingState.load(out)
    versions = sorted({f.schema_version for f in state.files["public.u"]})
    assert len(versions) == 4                      # iv is text from the start: a, n and ts switch
    seen = set()
    for version in versions:
        table = read_staging(out, "public.u", schema_version=version)
        for row in table.to_pylist():
            seen.add(row["id"])
            assert row["iv"] == text[row["id"]]["iv"]
            for col in ("a", "n", "ts"):
                if table.schema.field(col).type == pa.string():
                    assert row[col] == text[row["id"]][col], (version, row["id"], col)
                    assert row["id"] >= SWITCH_AT[col]
                else:
                    assert row["id"] < SWITCH_AT[col]
    assert seen == {r[0] for r in ROWS}


def test_connect_passes_the_decoder_options(pg_db) -> None:
    """spockwire.connect(column_types=..., on_unrepresentable=...) decodes with them."""
    import spockwire
    from spockwire.connection import create_publication, create_slot

    pg_db.execute("CREATE TABLE u (id int PRIMARY KEY, a int[], n numeric(10,2), ts timestamp, iv interval)")
    create_publication(pg_db.dsn, "pub")
    create_slot(pg_db.dsn, "s", "pgoutput")
    pg_db.execute("INSERT INTO u VALUES (1, '{{1,2},{3,4}}', 1, now(), '1 day')")
    with pytest.raises(ValueError, match="decoder_factory"):
        spockwire.connect(pg_db.dsn, slot="s", publication="pub", column_types={"public.u.n": "text"},
                          decoder_factory=lambda p: None)
    for options, expected in (({"column_types": {"public.u.n": "text"}}, (2, pa.string())),
                              ({"column_types": {"public.u.a": "text"}, "on_unrepresentable": "error"},
                               (1, pa.string()))):
        stream = spockwire.connect(pg_db.dsn, slot="s", publication="pub", binary=True, **options)
        try:
            batches = []
            for _ in range(30):
                batches = [e for e in stream.read(timeout=1) if hasattr(e, "to_arrow")]
                if batches:
                    break
        finally:
            stream.close()
        (batch,) = batches
        assert (batch.relation.version, batch.to_arrow().schema.field("a").type) == expected
        assert batch.to_arrow().schema.field("n").type == (pa.string() if "public.u.n" in options["column_types"]
                                                           else pa.decimal128(10, 2))


@pytest.mark.spark  # imports PySpark (tests/conftest.py, tiers)
def test_spark_options_reach_the_decoder() -> None:
    from spockwire.spark.datasource import options_to_spec
    from spockwire.spark.slot import make_decoder

    spec = options_to_spec({"dsn": "x", "slot": "s", "columnTypes": "public.u.a=text, public.u.b=raw",
                            "onUnrepresentable": "error"})
    assert spec.column_types == {"public.u.a": "text", "public.u.b": "raw"}
    dec = make_decoder("pgoutput", spec.types, None, spec.column_types, spec.on_unrepresentable)
    assert (dec.column_types, dec.on_unrepresentable) == (spec.column_types, "error")
    with pytest.raises(ValueError, match="column_types"):
        options_to_spec({"dsn": "x", "slot": "s", "columnTypes": "public.u.a=list"})


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_internal_format_timestamps_past_the_arrow_range(source: Source, impl_name: str) -> None:
    """pglogical's internal format (by-value datums in the server's byte order): a timestamp past 294247 AD
    switches its column to text too, rendered from the datum."""
    _protocol, payloads = source.streams["pglogical_internal_ut"]
    assert any(p[:1] == b"I" and b"i\x00\x00\x00\x08" in p for p in payloads)   # 8-byte internal datums
    batches = source.decode(impl_name, "pglogical_internal_ut")
    rows = [(b.relation.version, b.to_arrow().schema, row) for b in batches for row in b.to_pylist()]
    assert [r["id"] for _v, _s, r in rows] == [1, 2, 3]
    assert [v for v, _s, _r in rows] == [1, 2, 3]
    _v, schema, first = rows[0]
    assert schema.field("ts").type == pa.timestamp("us") and first["ts"] == dt.datetime(2024, 1, 1, 10)
    for _v, schema, row in rows[1:]:
        assert schema.field("ts").type == pa.string()
        assert row["ts"] == source.ut_text[row["id"]]["ts"]
    assert rows[2][1].field("tz").type == pa.string()
    assert rows[2][2]["tz"] == source.ut_text[3]["tz"]


@pytest.mark.parametrize("impl_name", IMPLEMENTATIONS)
def test_a_refused_row_switches_no_column(impl_name: str) -> None:
    """A row whose numeric does not fit decimal128 but whose later column is malformed is refused as a whole: the
    numeric column stays typed and the relation keeps its version for the rows after it."""
    from tests import wire_encoder as W

    cols = [W.Col("id", 23, -1, True), W.Col("amount", 1700, (12 << 16 | 2) + 4), W.Col("flag", 16, -1)]
    relation = W.pgoutput("R", relid=5, namespace="public", name="t", columns=cols)
    begin = W.pgoutput("B", final_lsn=0x100, commit_ts=0, xid=3)
    refused = W.pgoutput("I", relid=5, new=["1", "NaN", "maybe"])
    valid = [W.pgoutput("I", relid=5, new=["2", "1.50", "t"]),
             W.pgoutput("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=0)]
    module = load_impl(impl_name)
    dec = module.Decoder("pgoutput")
    for message in (relation, begin):
        dec.feed(message)
    with pytest.raises(ProtocolError, match="flag"):
        dec.feed(refused)
    for message in valid:
        dec.feed(message)
    (batch,) = dec.drain()
    assert batch.relation.version == 1
    assert batch.to_arrow().schema.field("amount").type == pa.decimal128(12, 2)
    assert [(r["id"], r["amount"], r["flag"]) for r in batch.to_pylist()] == [(2, Decimal("1.50"), True)]
