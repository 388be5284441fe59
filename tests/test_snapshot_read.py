"""spockwire.read_table / iter_table_batches against real servers, with both implementations.

Oracles: the server's own values (psycopg2 rows of the same SELECT, ``::text`` where Python has no type) and, for
every type of the type table, the replication stream's decode of the same rows in binary mode (which
tests/test_types_live.py checks against the server's output functions): COPY and the stream must give the same Arrow
types and values.
"""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

import spockwire
from spockwire.snapshot import plan as plan_module, reader as reader_module
from tests.test_types_live import COLUMNS as TYPE_COLUMNS, SCHEMA as TYPE_SCHEMA

pytestmark = pytest.mark.pg


@pytest.fixture(params=["c", "python"])
def impl(request, monkeypatch):
    monkeypatch.setenv("SPOCKWIRE_IMPL", request.param)
    return request.param


def rows_of(db, sql: str) -> list[tuple]:
    return [tuple(r) for r in db.query(sql)]


def same(a: list, b: list) -> bool:
    return a == b or str(a) == str(b)     # NaN != NaN


def same_column(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Equal values (a dictionary's own order aside; NaN equal to NaN)."""
    a, b = a.combine_chunks(), b.combine_chunks()
    if a.equals(b):
        return True
    if pa.types.is_dictionary(a.type):
        a, b = a.cast(a.type.value_type), b.cast(b.type.value_type)
    elif pa.types.is_list(a.type) and pa.types.is_dictionary(a.type.value_type):
        a, b = a.cast(pa.list_(pa.string())), b.cast(pa.list_(pa.string()))
    return a.equals(b) or same(a.to_pylist(), b.to_pylist())


# ---------------------------------------------------------------------------------------------- every type
def _stream_rows(db, slot: str) -> pa.Table:
    batches = []
    with spockwire.connect(db.dsn, slot=slot, publication="pub_copy_types", binary=True) as stream:
        deadline = time.monotonic() + 30
        rows = 0
        while rows < 3 and time.monotonic() < deadline:
            for ev in stream.read(0.5):
                if hasattr(ev, "to_arrow"):
                    batches.append(ev.to_arrow())
                    rows += ev.num_rows
    names = ["id"] + [c[0] for c in TYPE_COLUMNS]
    return pa.Table.from_batches(batches).select(names).sort_by("id")


def test_every_type_through_copy_equals_the_streams_binary_decode(pg_db, impl) -> None:
    db = pg_db
    db.execute(TYPE_SCHEMA)
    db.execute("CREATE TABLE everything (id int PRIMARY KEY, "
               + ", ".join(f"{name} {typ}" for name, typ, _a, _b in TYPE_COLUMNS) + ")")
    db.execute("CREATE PUBLICATION pub_copy_types FOR TABLE everything")
    db.execute("SELECT pg_create_logical_replication_slot('copy_types', 'pgoutput')")
    for ident, pick in ((1, 2), (2, 3)):
        db.execute(f"INSERT INTO everything VALUES ({ident}, " + ", ".join(c[pick] for c in TYPE_COLUMNS) + ")")
    db.execute("INSERT INTO everything (id) VALUES (3)")
    streamed = _stream_rows(db, "copy_types")
    db.execute("SELECT pg_drop_replication_slot('copy_types')")
    for workers in (1, 2):
        table = spockwire.read_table(db.dsn, "public.everything", workers=workers).sort_by("id")
        assert table.schema == streamed.schema
        for name in streamed.column_names:
            assert same_column(table.column(name), streamed.column(name)), name


def test_the_full_type_table_through_copy_equals_the_streams_binary_decode(pg_db, impl) -> None:
    """Every case of the type mapping table (tests/test_typed_values.py: every builtin type and its array, edge
    values, NULLs) in one wide table: COPY and the binary stream give the same Arrow types and values."""
    from spockwire.values.catalog import PostgresTypeCatalog
    from spockwire.wire import load_implementation
    from tests.test_typed_values import CASES, SCHEMA as TV_SCHEMA, _insert_sql

    db = pg_db
    db.execute(TV_SCHEMA)
    for case in CASES:
        db.execute(f"CREATE TABLE t_{case.name} (id int PRIMARY KEY, v {case.sqltype})")
        db.execute(_insert_sql(f"t_{case.name}", case.values))
    db.execute("CREATE TABLE t_wide (id int PRIMARY KEY, " + ", ".join(f"c_{c.name} {c.sqltype}" for c in CASES) + ")")
    db.execute("CREATE PUBLICATION pub_wide FOR TABLE t_wide")
    db.execute("SELECT pg_create_logical_replication_slot('copy_wide', 'pgoutput')")
    rows = max(len(c.values) for c in CASES) + 1
    db.execute("INSERT INTO t_wide SELECT g.id, " + ", ".join(f"t_{c.name}.v" for c in CASES)
               + f" FROM generate_series(1, {rows}) g(id) "
               + " ".join(f"LEFT JOIN t_{c.name} ON t_{c.name}.id = g.id" for c in CASES))
    frames = db.query("SELECT lsn - '0/0', data FROM pg_logical_slot_get_binary_changes('copy_wide', NULL, NULL, "
                      "'proto_version', '1', 'publication_names', 'pub_wide', 'binary', 'true')")
    db.execute("SELECT pg_drop_replication_slot('copy_wide')")
    catalog = PostgresTypeCatalog(db.dsn)
    try:
        dec = load_implementation().Decoder("pgoutput", type_catalog=catalog)
        for lsn, payload in frames:
            dec.feed(bytes(payload), int(lsn))
        streamed = pa.Table.from_batches([ev.to_arrow() for ev in dec.drain() if hasattr(ev, "to_arrow")])
    finally:
        catalog.close()
    names = ["id"] + [f"c_{c.name}" for c in CASES]
    streamed = streamed.select(names).sort_by("id")
    copied = spockwire.read_table(db.dsn, "t_wide").sort_by("id")
    assert copied.num_rows == streamed.num_rows == rows
    assert copied.schema == streamed.schema
    for name in names:
        assert same_column(copied.column(name), streamed.column(name)), name


# ---------------------------------------------------------------------------------------------- values
MIXED = ("CREATE TABLE mixed (a bigint, b int, c text, d numeric(12,2), e timestamptz, f float8, g bool, "
         "h bytea, i jsonb)")   # no primary key


def _fill_mixed(db, n: int) -> None:
    db.execute(MIXED)
    db.execute(f"INSERT INTO mixed SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE i * 3 END, 'row ' || i, "
               "i * 1.25, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', i / 3.0, i % 2 = 0, "
               "CASE WHEN i % 5 = 0 THEN NULL ELSE int8send(i) END, jsonb_build_object('k', i) "
               f"FROM generate_series(1, {int(n)}) i")
    db.execute("INSERT INTO mixed VALUES (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")


def _expected_mixed(db, where: str = "") -> list[tuple]:
    return rows_of(db, f"SELECT a, b, c, d, e, f, g, h, i::text FROM mixed {where} ORDER BY a NULLS LAST")


def _as_rows(table: pa.Table) -> list[tuple]:
    table = table.sort_by([("a", "ascending")])
    cols = [table.column(n).to_pylist() for n in table.column_names]
    out = []
    for r in zip(*cols):
        r = list(r)
        r[8] = None if r[8] is None else r[8]
        out.append(tuple(r))
    # NULL a sorts last in both
    return sorted(out, key=lambda r: (r[0] is None, r[0] or 0))


@pytest.mark.pg_servers("pg15", "pg18")
def test_values_nulls_and_no_primary_key(pg_db, pg_server, impl) -> None:
    _fill_mixed(pg_db, 3000)
    table = spockwire.read_table(pg_db.dsn, "mixed")
    assert table.schema.types == [pa.int64(), pa.int32(), pa.string(), pa.decimal128(12, 2),
                                  pa.timestamp("us", tz="UTC"), pa.float64(), pa.bool_(), pa.binary(), pa.string()]
    got = _as_rows(table)
    want = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in _expected_mixed(pg_db)]
    # jsonb: the server's text of the value
    assert got == want


def test_toasted_values(pg_db, impl) -> None:
    pg_db.execute("CREATE TABLE big (id int, t text, b bytea)")
    pg_db.execute("ALTER TABLE big ALTER COLUMN t SET STORAGE EXTERNAL")   # out of line, not compressed
    pg_db.execute("INSERT INTO big SELECT i, repeat(md5(i::text), 20000 * i), "
                  "decode(repeat(md5((i + 1)::text), 30000), 'hex') FROM generate_series(1, 4) i")
    assert pg_db.query("SELECT pg_total_relation_size(reltoastrelid) > 1000000 FROM pg_class "
                       "WHERE relname = 'big'")[0][0]
    table = spockwire.read_table(pg_db.dsn, "big", batch_bytes=1 << 20).sort_by("id")
    want = rows_of(pg_db, "SELECT id, t, b FROM big ORDER BY id")
    assert [(r["id"], r["t"], r["b"]) for r in table.to_pylist()] == [(i, t, bytes(b)) for i, t, b in want]


def test_empty_table_has_the_schema(pg_db, impl) -> None:
    pg_db.execute("CREATE TABLE nothing (id int, v numeric(5,1), u text)")
    table = spockwire.read_table(pg_db.dsn, "nothing", workers=2)
    assert table.num_rows == 0
    assert table.schema.types == [pa.int32(), pa.decimal128(5, 1), pa.string()]
    assert list(spockwire.iter_table_batches(pg_db.dsn, "nothing")) == []


def test_columns_subset_and_where(pg_db, impl) -> None:
    _fill_mixed(pg_db, 500)
    table = spockwire.read_table(pg_db.dsn, "public.mixed", columns=["c", "a"], where="a % 10 = 3")
    assert table.column_names == ["c", "a"]
    want = rows_of(pg_db, "SELECT c, a FROM mixed WHERE a % 10 = 3 ORDER BY a")
    assert sorted(zip(table.column("c").to_pylist(), table.column("a").to_pylist()), key=lambda r: r[1]) == want
    raw = spockwire.read_table(pg_db.dsn, "mixed", columns=["a", "d"], types="raw", where="a <= 20")
    assert raw.schema.types == [pa.binary(), pa.binary()]     # the values as sent: the types' send format
    want = rows_of(pg_db, "SELECT int8send(a), numeric_send(d) FROM mixed WHERE a <= 20 ORDER BY a")
    assert sorted(zip(raw.column("a").to_pylist(), raw.column("d").to_pylist())) == \
        sorted((bytes(a), bytes(d)) for a, d in want)
    with pytest.raises(spockwire.snapshot.SnapshotReadError, match="no column 'zz'"):
        spockwire.read_table(pg_db.dsn, "mixed", columns=["zz"])
    with pytest.raises(spockwire.snapshot.SnapshotReadError, match="no table"):
        spockwire.read_table(pg_db.dsn, "public.nope")


# ---------------------------------------------------------------------------------------------- partitions
@pytest.mark.pg_servers("pg15", "pg18")
def test_partitioned_table_reads_its_leaves_as_the_parent(pg_db, impl) -> None:
    db = pg_db
    db.execute("CREATE TABLE m (id int, region text, amount numeric(8,2)) PARTITION BY LIST (region)")
    db.execute("CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')")
    db.execute("CREATE TABLE m_us (amount numeric(8,2), region text, id int)")     # other column order
    db.execute("ALTER TABLE m ATTACH PARTITION m_us FOR VALUES IN ('us')")
    db.execute("CREATE TABLE m_rest PARTITION OF m DEFAULT PARTITION BY RANGE (id)")   # a sub-partitioned leaf
    db.execute("CREATE TABLE m_rest_lo PARTITION OF m_rest FOR VALUES FROM (MINVALUE) TO (1000)")
    db.execute("CREATE TABLE m_rest_hi PARTITION OF m_rest FOR VALUES FROM (1000) TO (MAXVALUE)")
    db.execute("INSERT INTO m SELECT i, (ARRAY['eu', 'us', 'ap'])[i % 3 + 1], i / 4.0 FROM generate_series(1, 2000) i")
    progress = []
    table = spockwire.read_table(db.dsn, "m", workers=2, progress=progress.append)
    assert table.column_names == ["id", "region", "amount"]
    assert table.schema.types == [pa.int32(), pa.string(), pa.decimal128(8, 2)]
    got = sorted(tuple(r.values()) for r in table.to_pylist())
    assert got == rows_of(db, "SELECT id, region, amount FROM m ORDER BY id")
    assert progress[-1].finished and progress[-1].tables_done == progress[-1].tables_total == 4
    assert progress[-1].rows == 2000


# ---------------------------------------------------------------------------------------------- workers, snapshot
def test_two_workers_read_what_one_reads(pg_db, impl, monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "MIN_CHUNK_PAGES", 4)   # cut a small table into many block ranges
    n = 20000 if impl == "c" else 4000
    _fill_mixed(pg_db, n)
    progress = []
    two = spockwire.read_table(pg_db.dsn, "mixed", workers=2, progress=progress.append)
    one = spockwire.read_table(pg_db.dsn, "mixed", workers=1)
    assert progress[-1].chunks_total > 4 and progress[-1].chunks_done == progress[-1].chunks_total
    assert progress[-1].rows == n + 1 and progress[-1].bytes > 0
    assert _as_rows(two) == _as_rows(one)
    with reader_module.TableReader(pg_db.dsn, "mixed", workers=2) as reader:
        assert reader.snapshot_name is not None and len(reader.chunks) > 4
        assert "ctid >= '(" in reader.query(reader.chunks[1])


@pytest.mark.pg_servers("pg15", "pg18")
def test_rows_written_after_the_snapshot_are_not_seen(pg_db, impl) -> None:
    db = pg_db
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int)")
    db.execute("INSERT INTO acct SELECT i, 100 FROM generate_series(1, 300) i")
    holder = db.connect()
    try:
        with holder.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT pg_export_snapshot()")
            name = cur.fetchone()[0]
        db.execute("INSERT INTO acct SELECT i, 1 FROM generate_series(301, 400) i")
        db.execute("UPDATE acct SET balance = 0 WHERE id <= 10")
        db.execute("DELETE FROM acct WHERE id BETWEEN 11 AND 20")
        for workers in (1, 2):
            old = spockwire.read_table(db.dsn, "acct", workers=workers, snapshot=name)
            assert sorted(old.column("id").to_pylist()) == list(range(1, 301))
            assert set(old.column("balance").to_pylist()) == {100}
        new = spockwire.read_table(db.dsn, "acct")
        assert new.num_rows == 390
    finally:
        holder.close()


def test_batches_are_bounded_and_the_iterator_stops_early(pg_db, impl) -> None:
    _fill_mixed(pg_db, 3000)
    sizes = [b.num_rows for b in spockwire.iter_table_batches(pg_db.dsn, "mixed", batch_rows=1000)]
    assert max(sizes) <= 1000 and sum(sizes) == 3001
    it = spockwire.iter_table_batches(pg_db.dsn, "mixed", workers=2, batch_rows=100)
    first = next(it)
    assert first.num_rows <= 100
    it.close()    # cancels the COPYs and closes the connections
    # A backend leaves pg_stat_activity a moment after its client has gone (the server's own exit, not the
    # reader's); a COPY that was never cancelled or closed stays there for good.
    deadline = time.monotonic() + 10
    while (copies := pg_db.query("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND query LIKE 'COPY%%' AND pid <> pg_backend_pid()")[0][0]) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert copies == 0


def test_a_value_the_arrow_type_cannot_hold_turns_the_column_to_text(pg_db, impl) -> None:
    db = pg_db
    db.execute("CREATE TABLE m (id int, price numeric(6,2), at timestamp)")
    db.execute("INSERT INTO m SELECT i, i / 4.0, timestamp '2024-01-01' + i * interval '1 day' "
               "FROM generate_series(1, 300) i")
    db.execute("INSERT INTO m VALUES (301, 'NaN', 'infinity'), (302, -1.5, NULL)")
    batches = list(spockwire.iter_table_batches(db.dsn, "m", batch_rows=100))
    assert batches[0].schema.field("price").type == pa.decimal128(6, 2)
    assert batches[-1].schema.field("price").type == pa.string()      # from the NaN row on, as the stream does
    table = spockwire.read_table(db.dsn, "m", batch_rows=100)          # one schema: read again with text
    assert table.schema.field("price").type == pa.string()
    assert table.schema.field("at").type == pa.timestamp("us")         # infinity fits (int64 max)
    got = sorted(zip(table.column("id").to_pylist(), table.column("price").to_pylist()))
    assert got == rows_of(db, "SELECT id, price::text FROM m ORDER BY id")
    with pytest.raises(spockwire.ProtocolError, match="NaN or infinite value"):
        spockwire.read_table(db.dsn, "m", on_unrepresentable="error")


def test_a_server_error_in_the_middle_of_a_copy_is_raised(pg_db, impl, monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "MIN_CHUNK_PAGES", 2)
    pg_db.execute("CREATE TABLE d (a int, pad text)")
    pg_db.execute("INSERT INTO d SELECT i, repeat('x', 200) FROM generate_series(1, 5000) i")
    for workers in (1, 2):
        with pytest.raises(spockwire.SpockwireError, match="division by zero"):
            spockwire.read_table(pg_db.dsn, "d", workers=workers, where="1 / (a - 4000) <> 7")
    assert spockwire.read_table(pg_db.dsn, "d", workers=2).num_rows == 5000


@pytest.mark.pg_servers("pg15", "pg18")
def test_the_snapshot_a_new_replication_slot_exports(pg_db, impl) -> None:
    """The slot's exported snapshot (held by its replication connection) is what every worker reads: rows of
    transactions committed after the slot's consistent point are not in it."""
    db = pg_db
    db.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO s SELECT i, 'before' FROM generate_series(1, 2000) i")
    repl = db.connect(logical_replication=True)
    try:
        with repl.cursor() as cur:
            cur.execute("CREATE_REPLICATION_SLOT copy_export LOGICAL pgoutput EXPORT_SNAPSHOT")
            _slot, _lsn, name, _plugin = cur.fetchone()
            db.execute("INSERT INTO s SELECT i, 'after' FROM generate_series(2001, 2100) i")
            db.execute("UPDATE s SET v = 'after' WHERE id <= 5")
            for workers in (1, 2):
                table = spockwire.read_table(db.dsn, "public.s", workers=workers, snapshot=name)
                assert sorted(table.column("id").to_pylist()) == list(range(1, 2001))
                assert set(table.column("v").to_pylist()) == {"before"}
    finally:
        repl.close()
        db.execute("SELECT pg_drop_replication_slot('copy_export')")
