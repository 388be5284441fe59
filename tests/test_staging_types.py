"""Every type the decoder produces goes through the Parquet staging and comes back identical, from a real server.

The full type table of tests/test_typed_values.py (every builtin type and array type of spockwire/values/catalog.py,
enums, domains, and types without an Arrow form) is written to a database whose slots were created first. Then:

1. the ingest worker streams it (text and binary format, C and Python decoders) into a staging folder; every
   staged table read back with `read_staging` equals, array for array, what the same decoder makes of the same
   changes read from a second slot, and its values equal the server's (psycopg2's values, or `::text` where Python
   cannot hold them);
2. the same changes decoded with a type catalog (enums as dictionaries, domains as their base types) go through
   a StagingWriter and come back identical, and equal the server's values;
3. `replay_table`, `to_pandas` and the Spark staging reader give the same values as the Python reader: intervals
   (stored as struct<months, days, nanoseconds>) and ±infinity (the Arrow sentinels) included.

The server's `::text` and psycopg2's values are the oracle; the comparison helpers are test_typed_values'.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spockwire import INFINITY, NEG_INFINITY
from spockwire.ingest import StagingWriter, read_staging
from spockwire.ingest.replay import replay_table
from spockwire.ingest.staging import StagingState
from spockwire.ingest.stored_types import ARROW_TYPE_KEY, INTERVAL_STRUCT
from spockwire.ingest.worker import IngestConfig, IngestWorker
from spockwire.model import ChangeBatch, Column, Relation
from spockwire.values import PostgresTypeCatalog
from tests.conftest import load_impl
from tests.pg_fixtures import PgDatabase
from tests.test_typed_values import CASES, SCHEMA, _insert_sql, assert_matches_server, server_expected, \
    assert_same_array

CHANGE = ("_change_type", "_commit_lsn", "_seq")
RUNS = [(impl, fmt) for impl in ("c", "python") for fmt in ("text", "binary")]
TYPED = [c for c in CASES if c.arrow is not None]


class Source:
    """The type-table database, its expected values, and the reference decode of each format."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self.expected: dict[str, list[tuple]] = {}
        self.frames: dict[str, list[tuple[int, bytes]]] = {}
        self.staged: dict[tuple[str, str], Any] = {}

    def decode(self, impl: str, fmt: str, catalog: Any = None) -> list[Any]:
        """The reference slot's events, decoded by `impl` as the worker's decoder would (or with a catalog)."""
        dec = load_impl(impl).Decoder("pgoutput", type_catalog=catalog)
        for lsn, payload in self.frames[fmt]:
            dec.feed(payload, lsn)
        return dec.drain()

    def reference(self, impl: str, fmt: str, catalog: Any = None) -> dict[str, pa.Table]:
        """{table: Arrow table} of the reference slot's changes (see `decode`)."""
        return _tables(self.decode(impl, fmt, catalog))


def _tables(events: list[Any]) -> dict[str, pa.Table]:
    batches: dict[str, list[pa.RecordBatch]] = {}
    for ev in events:
        if isinstance(ev, ChangeBatch):
            batches.setdefault(ev.relation.qualified_name, []).append(ev.to_arrow())
    return {t: pa.Table.from_batches(bs).replace_schema_metadata(None) for t, bs in batches.items()}


@pytest.fixture(scope="module")
def source(pg_cluster, tmp_path_factory) -> Source:
    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name("staging_types")))
    db.execute(SCHEMA)
    for case in CASES:
        db.execute(f"CREATE TABLE t_{case.name} (id int PRIMARY KEY, v {case.sqltype})")
    # one wide table with a column per case as well (what the Spark reader reads: one Spark job for every type)
    db.execute("CREATE TABLE t_wide (id int PRIMARY KEY, " + ", ".join(f"c_{c.name} {c.sqltype}" for c in CASES)
               + ")")
    db.execute("CREATE PUBLICATION pub FOR TABLE t_wide, " + ", ".join(f"t_{c.name}" for c in CASES))
    slots = [f"st_{impl}_{fmt}" for impl, fmt in RUNS] + ["st_ref_text", "st_ref_binary"]
    for slot in slots:
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    for case in CASES:
        db.execute(_insert_sql(f"t_{case.name}", case.values))
    rows = max(len(c.values) for c in CASES) + 1
    db.execute(f"INSERT INTO t_wide SELECT g.id, " + ", ".join(f"t_{c.name}.v" for c in CASES)
               + f" FROM generate_series(1, {rows}) g(id) "
               + " ".join(f"LEFT JOIN t_{c.name} ON t_{c.name}.id = g.id" for c in CASES))
    db.execute("UPDATE t_interval SET v = v + interval '1 month' WHERE id = 1")
    db.execute("DELETE FROM t_date WHERE id = 1")
    src = Source(db)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for fmt in ("text", "binary"):
                opts = ["proto_version", "1", "publication_names", "pub"] + (["binary", "true"] if fmt == "binary"
                                                                             else [])
                cur.execute("SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                            "VARIADIC %s::text[])", (f"st_ref_{fmt}", opts))
                src.frames[fmt] = [(int(lsn), bytes(data)) for lsn, data in cur.fetchall()]
            src.expected.update(server_expected(cur, CASES))
    finally:
        conn.close()
    for impl, fmt in RUNS:
        out = tmp_path_factory.mktemp(f"staging_{impl}_{fmt}")
        worker = IngestWorker(IngestConfig(dsn=db.dsn, slot=f"st_{impl}_{fmt}", out=str(out), publication=["pub"],
                                           binary=fmt == "binary", impl=impl, idle_exit=1.0, flush_seconds=0.2,
                                           flush_rows=40, progress=False,
                                           # as the reference decodes: no catalog (the catalog test is below)
                                           type_catalog=False))
        assert worker.run() == 0
        src.staged[(impl, fmt)] = out
    return src


def _rows(table: pa.Table, name: str) -> list[dict[str, Any]]:
    rel = Relation(0, *name.split(".", 1), tuple(), None, 0)
    return [r for rb in table.to_batches() for r in ChangeBatch(rel, rb).to_pylist()]


def _final_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the table holds at the end (by id, last change wins; deletes remove)."""
    state: dict[Any, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["_commit_lsn"], r["_seq"])):
        if r["_change_type"] == "delete":
            state.pop(r["id"], None)
        elif r["_change_type"] != "update_preimage":
            state[r["id"]] = r
    return list(state.values())


@pytest.mark.parametrize("impl,fmt", RUNS)
def test_worker_staging_reads_back_every_type_identically(source: Source, impl: str, fmt: str) -> None:
    out = source.staged[(impl, fmt)]
    reference = source.reference(impl, fmt)
    state = StagingState.load(out)
    assert sorted(state.tables) == sorted(reference) == sorted([f"public.t_{c.name}" for c in CASES] + ["public.t_wide"])
    assert state.commit > 1          # flush_rows=40: several commits, several files per table
    kinds = set()
    for table, ref in reference.items():
        staged = read_staging(out, table)
        names = [n for n in ref.column_names if n not in ("_commit_ts", "_xid", "_origin", "_unchanged_toast")]
        assert [n for n in staged.column_names if n in names] == names, table
        for name in names:
            assert_same_array(staged.column(name).combine_chunks(), ref.column(name).combine_chunks(),
                              f"{impl}/{fmt} {table}.{name}")
        if table != "public.t_wide":
            kinds.add(str(ref.schema.field("v").type))
    # the worker decodes without a type catalog: every Arrow type but the dictionary (enum) one is here
    for expected in ("month_day_nano_interval", "list<item: month_day_nano_interval>", "date32[day]",
                     "timestamp[us, tz=UTC]", "time64[us]", "fixed_size_binary[16]", "decimal128(38, 38)",
                     "uint32", "list<item: fixed_size_binary[16]>", "list<item: date32[day]>", "binary", "string"):
        assert expected in kinds, (expected, sorted(kinds))
    # values against the server (the typed cases the worker decodes as typed; domains and enums need a catalog)
    untyped = set()
    for case in TYPED:
        table = f"public.t_{case.name}"
        if reference[table].schema.field("v").type != case.arrow:
            untyped.add(case.name)
            continue
        rows = _final_rows(_rows(read_staging(out, table), table))
        assert_matches_server(case, rows, source.expected[case.name], f"{impl}/{fmt} staged {case.name}")
    # without a catalog binary composites also stay as they arrived (their fields' types need it, README "Types")
    assert untyped <= {"enum", "a_enum", "dom_int4", "dom_num", "dom_text"} | (
        {"composite", "rich_comp", "a_comp"} if fmt == "binary" else set()), untyped


@pytest.mark.parametrize("impl", ["c", "python"])
def test_catalog_typed_values_stage_and_read_back(source: Source, tmp_path, impl: str) -> None:
    """With a type catalog (enums as dictionary<int32, string>, also in lists; domains as their base type)."""
    catalog = PostgresTypeCatalog(source.db.dsn)
    try:
        events = source.decode(impl, "binary", catalog)
    finally:
        catalog.close()
    reference = _tables(events)
    with StagingWriter(tmp_path / "out", "pgoutput") as writer:
        writer.add_all(events)
        writer.commit(max(lsn for lsn, _ in source.frames["binary"]))
    assert str(reference["public.t_a_enum"].schema.field("v").type) == "list<item: dictionary<values=string, " \
                                                                        "indices=int32, ordered=0>>"
    for case in CASES:
        table = f"public.t_{case.name}"
        staged = read_staging(tmp_path / "out", table)
        assert_same_array(staged.column("v").combine_chunks(), reference[table].column("v").combine_chunks(),
                          f"{impl} catalog {table}")
        if case.arrow is not None:
            assert staged.schema.field("v").type == case.arrow, case.name
            rows = _final_rows(_rows(staged, table))
            assert_matches_server(case, rows, source.expected[case.name], f"{impl} catalog staged {case.name}")


def test_intervals_are_stored_as_a_marked_struct(source: Source) -> None:
    out = source.staged[("c", "binary")]
    state = StagingState.load(out)
    for table, field_type in (("public.t_interval", INTERVAL_STRUCT), ("public.t_a_interval", None)):
        schema = pq.read_schema(out / state.files[table][0].path)
        f = schema.field("v")
        if field_type is not None:
            assert f.type == field_type and f.metadata[ARROW_TYPE_KEY] == b"month_day_nano_interval"
        else:
            assert f.type.value_field.metadata[ARROW_TYPE_KEY] == b"month_day_nano_interval"
        # the log keeps the decoder's type
        assert state.schemas[table][-1].columns[1][4] in ("month_day_nano_interval",
                                                          "list<item: month_day_nano_interval>")


def test_replay_and_to_pandas_agree_with_the_server_for_infinity(source: Source) -> None:
    """±infinity: the Arrow sentinels in staging, spockwire.INFINITY / NEG_INFINITY from to_pylist and replay,
    the same objects in to_pandas (never an exception), where the server's text says infinity."""
    out = source.staged[("python", "text")]
    for case in ("date", "timestamp", "timestamptz", "a_date", "a_timestamp"):
        table = f"public.t_{case}"
        texts = {ident: text for ident, _py, text, _extra in source.expected[case]}
        replayed = replay_table(out, table, ("id",))
        assert sorted(k[0] for k in replayed) == sorted(texts)
        staged = read_staging(out, table)
        arrow_type = staged.schema.field("v").type
        storage = pa.int32() if "date" in str(arrow_type) else pa.int64()
        bits = 31 if storage == pa.int32() else 63
        frame = ChangeBatch(Relation(0, "public", f"t_{case}", tuple(), None, 0),
                            staged.combine_chunks().to_batches()[0]).to_pandas()
        pylist = _rows(staged, table)
        assert [v for v in frame["v"]] == [r["v"] for r in pylist]
        for (ident,), row in replayed.items():
            text = texts[ident]
            values, server = (row["v"], text) if not case.startswith("a_") else (row["v"] or [], text or [])
            if not case.startswith("a_"):
                values, server = [values], [server]
            for got, txt in zip(values, server):
                if txt == "infinity":
                    assert got is INFINITY
                elif txt == "-infinity":
                    assert got is NEG_INFINITY
                else:
                    assert got is not INFINITY and got is not NEG_INFINITY
        flat = staged.column("v").combine_chunks()
        if pa.types.is_list(flat.type):
            flat = flat.flatten()
        ints = flat.cast(storage).to_pylist()
        assert (2 ** bits - 1) in ints and -(2 ** bits) in ints
    assert INFINITY > dt.date(9999, 12, 31) and NEG_INFINITY < dt.datetime(1, 1, 1)


def test_spark_reads_staged_types_like_the_python_reader(source: Source) -> None:
    """One table with a column of every case, read by the Spark staging reader: the same values as the Python
    reader converted to the Spark types (intervals as struct<months, days, nanoseconds>, ±infinity as the same
    day / microsecond counts), and intervals and infinity equal to the server's values."""
    from tests.spark_session import spark_session

    import spockwire.spark as sws
    from spockwire.spark import schema as S

    spark = spark_session()
    out = source.staged[("c", "binary")]
    df = sws.read_staging(spark, str(out), "public.t_wide")
    # one Spark job: the columns as read, and what Spark SQL computes from them
    got = df.selectExpr("*", "unix_micros(c_timestamptz) AS _us", "unix_date(c_date) AS _days").toArrow()
    extra = 2
    staged = read_staging(out, "public.t_wide")
    expected = pa.Table.from_batches([S.conform_batch(b, pa.schema(list(got.schema)[:-extra]))
                                      for b in staged.combine_chunks().to_batches()])
    order = sorted(range(got.num_rows), key=lambda i: (got.column("_commit_lsn")[i].as_py(),
                                                       got.column("_seq")[i].as_py()))
    got = got.take(pa.array(order, pa.int64()))
    assert got.num_rows == staged.num_rows > 10
    for name in ["_change_type", "_commit_lsn", "_seq", "id"] + [f"c_{c.name}" for c in CASES]:
        assert_same_array(got.column(name).combine_chunks(), expected.column(name).combine_chunks(),
                          f"spark t_wide.{name}")
    # the oracle directly: interval fields, and infinity as the numbers Spark SQL computes
    rows = {r["id"]: r for r in got.select(["id", "c_interval", "_us", "_days", "c_time", "c_a_time"]).to_pylist()}
    # time: Spark's string (HH:MM:SS.ffffff) is the server's text with the fraction padded; 24:00:00 included
    for case in ("time", "a_time"):
        for ident, _py, text, _x in source.expected[case]:
            value = rows[ident][f"c_{case}"]
            values, texts = (value, text) if case == "a_time" else ([value], [text])
            assert (values is None) == (texts is None), (case, ident)
            for v, t in zip(values or [], texts or []):
                assert (v is None and t is None) or v.rstrip("0").rstrip(".") == t, (case, ident, v, t)
    for ident, triple, _text, _x in source.expected["interval"]:
        if ident == 1:
            continue                        # updated in t_interval after t_wide was filled
        value = rows[ident]["c_interval"]
        if triple is None or triple == [None, None, None]:
            assert value is None
        else:
            assert (value["months"], value["days"], value["nanoseconds"]) == (triple[0], triple[1],
                                                                              triple[2] * 1000)
    # (t_date lost id 1 after t_wide was filled: only the ids the server still has are compared)
    for case, column, top in (("timestamptz", "_us", 2 ** 63), ("date", "_days", 2 ** 31)):
        texts = {ident: text for ident, _py, text, _x in source.expected[case]}
        assert {i for i, t in texts.items() if t == "infinity"} == \
            {i for i, r in rows.items() if r[column] == top - 1 and i in texts}
        assert {i for i, t in texts.items() if t == "-infinity"} == \
            {i for i, r in rows.items() if r[column] == -top and i in texts}


def test_command_line_json_gives_infinity_and_dates_as_text() -> None:
    """`spockwire inspect --format json` of typed values: ±infinity as PostgreSQL's text, dates and times ISO."""
    import decimal
    import json
    import uuid

    from spockwire.cli.common import json_value

    row = {"d": [dt.date(2000, 1, 2), INFINITY, NEG_INFINITY, None], "t": dt.time(1, 2, 3, 500000),
           "n": decimal.Decimal("1.50"), "u": uuid.UUID(int=5)}
    assert json.loads(json.dumps(row, default=json_value)) == {
        "d": ["2000-01-02", "infinity", "-infinity", None], "t": "01:02:03.500000", "n": "1.50",
        "u": "00000000-0000-0000-0000-000000000005"}


def _insert_batch(rel: Relation, lsn: int, ids: list[int], values: pa.Array) -> ChangeBatch:
    """A batch of inserts of (id, v) at one commit LSN, as a decoder would hand it over."""
    from spockwire.export.arrow import finish_batch

    n = len(ids)
    rb = finish_batch(rel, pa.array([0] * n, pa.int8()), pa.array([lsn] * n, pa.uint64()),
                      pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array([1] * n, pa.uint32()),
                      pa.array(range(n), pa.int64()), pa.array([None] * n, pa.string()), None, None, None,
                      [pa.array(ids, pa.int32()), values])
    return ChangeBatch(rel, rb)


@pytest.mark.spark  # imports PySpark (tests/conftest.py, tiers)
def test_spark_unifies_an_all_null_text_version_with_binary_values(tmp_path) -> None:
    """A send-format (binary) column whose batch held only NULLs is staged as string in a schema version of its
    own (the decoder types a column without values as text): Spark reads the column as binary, as read_staging
    unifies it, and keeps every value."""
    from tests.spark_session import spark_session

    import spockwire.spark as sws

    rel = Relation(8, "public", "sent", (Column("id", 23, -1, True), Column("v", 16385, -1, False)), "d", 1)
    raw = [b"\x00\xff\x80", b"plain"]
    with StagingWriter(tmp_path, "pgoutput") as writer:
        writer.add(_insert_batch(rel, 10, [1, 2], pa.array(raw, pa.binary())))
        writer.add(_insert_batch(rel, 20, [3], pa.array([None], pa.string())))
        writer.add(_insert_batch(rel, 30, [4], pa.array([b"\xfe"], pa.binary())))
        writer.add(_insert_batch(rel, 40, [5], pa.array([None], pa.string())))      # the newest version: string
        writer.commit(50)
    assert len(StagingState.load(tmp_path).schemas["public.sent"]) == 4
    python = read_staging(tmp_path, "public.sent")
    assert python.schema.field("v").type == pa.binary()
    df = sws.read_staging(spark_session(), str(tmp_path), "public.sent")
    assert df.schema["v"].dataType.typeName() == "binary"
    got = {r["id"]: r["v"] for r in df.collect()}
    assert got == {1: raw[0], 2: raw[1], 3: None, 4: b"\xfe", 5: None} == dict(zip(python.column("id").to_pylist(),
                                                                      python.column("v").to_pylist()))


def test_spark_reads_a_date_column_that_became_text_as_postgresql_text(source: Source, tmp_path) -> None:
    """A column staged as date32 in schema version 1 and as string in version 2 (the Spark schema takes the newest
    type): the version 1 values become the server's own text of each date, infinity and BC included."""
    from tests.spark_session import spark_session

    import spockwire.spark as sws

    dates = ["infinity", "-infinity", "1970-01-01", "0044-03-15 BC", "5874897-12-31"]
    server = [r[0] for r in source.db.query(
        "SELECT d::date::text FROM unnest(%s::text[]) WITH ORDINALITY u(d, o) ORDER BY o", (dates,))]
    days = [2 ** 31 - 1, -(2 ** 31)] + [r[0] for r in source.db.query(
        "SELECT d::date - '1970-01-01'::date FROM unnest(%s::text[]) WITH ORDINALITY u(d, o) ORDER BY o",
        (dates[2:],))]
    rel = Relation(9, "public", "changed", (Column("id", 23, -1, True), Column("v", 1082, -1, False)), "d", 1)
    with StagingWriter(tmp_path, "pgoutput") as writer:
        writer.add(_insert_batch(rel, 10, list(range(len(days))), pa.array(days, pa.int32()).cast(pa.date32())))
        writer.add(_insert_batch(rel, 20, [99], pa.array(["later text"], pa.string())))
        writer.commit(30)
    got = {r["id"]: r["v"] for r in sws.read_staging(spark_session(), str(tmp_path), "public.changed").collect()}
    assert got == {**dict(enumerate(server)), 99: "later text"}
