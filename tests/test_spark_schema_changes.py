"""Schema changes through the pipeline job (spockwire.spark.schema_changes), against a live server: after each
migration a real application runs, with the job streaming and no restart, the Delta table equals the source in
every row and every column, and the history table's current versions do too. A migration that changes the
table's columns is answered by a re-read of that table, reported in the micro-batch's line; the other table keeps
streaming without one."""
from __future__ import annotations

import datetime as dt
import decimal
import time
import uuid

import pyarrow as pa
import pytest

from spockwire.spark.job import JobConfig, flush_lsn, start, target_path, wait_caught_up
from spockwire.spark.schema_changes import SHAPE_FILE, apply_shaped, read_shape, segments
from tests.delta_check import checked_table
from tests.spark_session import spark_session
from tests.test_spark_source import _slot

pytestmark = pytest.mark.pg

BOOKKEEPING = {"_commit_lsn", "_seq", "_start_commit_lsn", "_start_seq", "_start_commit_ts", "_end_commit_lsn",
               "_end_seq", "_end_commit_ts"}


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _value(v):
    if isinstance(v, float) and v != v:
        return "NaN"                   # equal to another NaN, as the rows compared are
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(v, uuid.UUID):
        return v.bytes
    if isinstance(v, decimal.Decimal):
        return v.normalize()
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def _source(db, table: str) -> tuple[list[str], list[tuple]]:
    import psycopg2.extras

    conn = db.connect()
    psycopg2.extras.register_uuid(conn_or_curs=conn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
    finally:
        conn.close()
    return names, sorted((tuple(_value(v) for v in r) for r in rows), key=repr)


def _delta(path: str, names: list[str], current_only: bool = False) -> tuple[list[str], list[tuple]]:
    t = checked_table(path)
    if current_only:
        t = t.filter(pa.compute.is_null(t.column("_end_commit_lsn")))
    have = [n for n in t.column_names if n not in BOOKKEEPING]
    rows = t.select([n for n in names if n in have]).to_pylist()
    return have, sorted((tuple(_value(r[n]) for n in names if n in have) for r in rows), key=repr)


def _write_then_lsn(db, sql: str) -> int:
    """Run `sql` and return a WAL position inside its transaction: the stream has applied it once the query's end
    offset reaches this. (The server's flush position read after it may lie past WAL the stream has no output for,
    such as the temporary slot of the job's own re-read, which the source moves over only once more WAL comes.)"""
    conn = db.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            cur.execute("SELECT pg_current_wal_insert_lsn()")
            hi, lo = cur.fetchone()[0].split("/")
        conn.commit()
    finally:
        conn.close()
    return (int(hi, 16) << 32) | int(lo, 16)


def _assert_equal(db, cfg, table: str, what: str) -> None:
    names, want = _source(db, table)
    have, got = _delta(target_path(cfg.target, f"public.{table}"), names)
    assert have == names, f"{what}: Delta columns {have}, source {names}"
    assert got == want, f"{what}: the Delta table differs from the source"
    hist_have, hist = _delta(target_path(cfg.target, f"public.{table}", history=True), names, current_only=True)
    assert set(names) <= set(hist_have), f"{what}: history columns {hist_have}"
    assert hist == want, f"{what}: the history table's current versions differ from the source"


MIGRATIONS = [
    ("add column with a constant default", ["ALTER TABLE t ADD COLUMN extra text DEFAULT 'x'"]),
    ("add column NOT NULL DEFAULT", ["ALTER TABLE t ADD COLUMN flag boolean NOT NULL DEFAULT true"]),
    ("add column without a default", ["ALTER TABLE t ADD COLUMN note text"]),
    ("add column with a volatile default", ["ALTER TABLE t ADD COLUMN token uuid DEFAULT gen_random_uuid()"]),
    ("rename column", ["ALTER TABLE t RENAME COLUMN s TO label"]),
    ("drop column", ["ALTER TABLE t DROP COLUMN extra"]),
    ("widen int to bigint", ["ALTER TABLE t ALTER COLUMN v TYPE bigint"]),
    ("widen numeric(10,2) to numeric(14,4)", ["ALTER TABLE t ALTER COLUMN amount TYPE numeric(14,4)"]),
    ("varchar(10) to text", ["ALTER TABLE t ALTER COLUMN code TYPE text"]),
    ("text to int USING", ["ALTER TABLE t ALTER COLUMN label TYPE int USING length(label)"]),
    ("primary key change", ["ALTER TABLE t DROP CONSTRAINT t_pkey", "ALTER TABLE t ADD PRIMARY KEY (id, v)"]),
    ("truncate and refill", ["TRUNCATE t", "INSERT INTO t (id, v, s2) SELECT g, g, 'r' FROM generate_series(1, 30) g"]),
]


@pytest.mark.parametrize("capture", [False, True], ids=["relation-messages", "ddl-capture"])
def test_schema_changes_flow_through_the_running_job(spark, pg_db, tmp_path, capture):
    """Without the DDL capture every change of the columns is a re-read; with it, a column added without a default,
    a rename, a drop and the widenings are applied in place (no re-read; a column added to a table reaches its
    Delta table before any change of the table does)."""
    if capture:
        from spockwire.connection.ddl_capture import install

        install(pg_db.dsn)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, s text, amount numeric(10,2), code varchar(10), "
                  "s2 text)")
    pg_db.execute("CREATE TABLE other (k int PRIMARY KEY, n int)")
    pg_db.execute("INSERT INTO t SELECT g, g * 10, 's' || g, g / 3.0, 'c' || g FROM generate_series(1, 40) g")
    pg_db.execute("INSERT INTO other SELECT g, g FROM generate_series(1, 20) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t, other")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"],
                    tables={"public.t": None, "public.other": None}, target=str(tmp_path / "delta"),
                    checkpoint=str(tmp_path / "ck"), starting_position="snapshot", trigger_seconds=0.2,
                    history=True, create_slot=True)
    reports = []
    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        _assert_equal(pg_db, cfg, "t", "after the snapshot")
        assert cfg.ddl_capture is None
        in_place = []
        for i, (what, ddl) in enumerate(MIGRATIONS):
            before = sum(bool(r.reread) for r in reports)
            for sql in ddl:
                pg_db.execute(sql)
            # a change after the migration (the stream describes the table again with it) and one to the other table
            pg_db.execute(f"UPDATE t SET v = v + 1 WHERE id = {i + 2}")
            pg_db.execute(f"INSERT INTO t (id, v) VALUES ({1000 + i}, {i})")
            wait_caught_up(query, _write_then_lsn(pg_db, f"UPDATE other SET n = n + 1 WHERE k = {i + 1}"),
                           timeout=300)
            _assert_equal(pg_db, cfg, "t", what)
            _assert_equal(pg_db, cfg, "other", what)
            if sum(bool(r.reread) for r in reports) == before:
                in_place.append(what)
        # a column added to a table that does not change afterwards
        pg_db.execute("ALTER TABLE other ADD COLUMN z int")
        wait_caught_up(query, _write_then_lsn(pg_db, "UPDATE t SET v = v + 1 WHERE id = 3"), timeout=300)
        if capture:
            _assert_equal(pg_db, cfg, "other", "a column added to a table without changes")
    finally:
        query.stop()
    rereads = [r.reread for r in reports if r.reread]
    assert all(set(r) == {"public.t"} for r in rereads)      # the other table never needed one
    # TRUNCATE changes no column; with the capture, a column added without a default is added in place
    assert in_place == ["add column without a default", "rename column", "drop column", "widen int to bigint",
                        "widen numeric(10,2) to numeric(14,4)", "varchar(10) to text", "truncate and refill"] \
        if capture else ["truncate and refill"]
    assert read_shape(target_path(cfg.target, "public.t"))[0][:1] == ["id"]


def _run(desc: list | None, lsn: int, **cols) -> pa.Table:
    from spockwire.spark.schema import COLUMNS_METADATA

    n = len(next(iter(cols.values())))
    heads = {"_change_type": pa.array(["insert"] * n), "_commit_lsn": pa.array([lsn] * n, pa.int64()),
             "_commit_ts": pa.array([0] * n, pa.timestamp("us", "UTC")), "_xid": pa.array([1] * n, pa.int64()),
             "_seq": pa.array(range(n), pa.int64()), "_origin": pa.nulls(n, pa.string()),
             "_unchanged_toast": pa.nulls(n, pa.list_(pa.string()))}
    t = pa.table({**heads, **cols})
    import json

    return t.replace_schema_metadata({COLUMNS_METADATA: json.dumps(desc).encode()} if desc else None)


def test_runs_are_cut_where_the_description_changes():
    a = [["id", 23, -1, True], ["v", 23, -1, False]]
    b = [["id", 23, -1, True], ["v", 20, -1, False]]
    runs = segments([_run(a, 1, id=[1], v=pa.array([1], pa.int32())), _run(a, 2, id=[2], v=pa.array([2], pa.int32())),
                     _run(b, 3, id=[3], v=pa.array([3], pa.int64())), _run(b, 4, id=[4], v=pa.array([4], pa.int64()))])
    assert [r.num_rows for r in runs] == [2, 2]
    assert runs[1].schema.field("v").type == pa.int64()


def test_a_run_of_another_shape_rereads_and_earlier_changes_are_left_out(tmp_path):
    """apply_shaped on its own: the first run lands, a run of another shape takes the re-read (recorded with its
    point in the same commit), and a later batch's changes from before that point are left out, whatever their
    shape."""
    from spockwire.spark.apply import apply_changes
    from spockwire.spark.schema_changes import TableSnapshot, reread_point
    from spockwire.spark.delta_target import open_delta

    path = str(tmp_path / "t")
    a = [["id", 23, -1, True], ["v", 23, -1, False]]
    b = [["id", 23, -1, True], ["w", 25, -1, False]]

    def apply(*args, **kw):
        return apply_changes(*args, format="delta", engine="delta-rs", **kw)

    snap_rows = _run(b, 500, id=[1, 2], w=["one", "two"])
    calls = []

    def reread(table):
        calls.append(table)
        return TableSnapshot(table, 500, snap_rows, b)

    done = apply_shaped(path, [_run(a, 10, id=[1, 2], v=pa.array([1, 2], pa.int32()))], ["id"], 1, ("app", 1),
                        reread, "public.t", apply)
    assert done.reread_lsn is None and read_shape(path) == a
    done = apply_shaped(path, [_run(a, 20, id=[1], v=pa.array([5], pa.int32())), _run(b, 30, id=[2], w=["x"])],
                        ["id"], 1, ("app", 2), reread, "public.t", apply)
    assert done.reread_lsn == 500 and calls == ["public.t"]
    dt = open_delta(path)
    assert reread_point(dt) == 500 and dt.transaction_version("app") == 2
    got = checked_table(path)
    assert sorted(c for c in got.column_names if c not in BOOKKEEPING) == ["id", "w"]
    assert sorted(zip(got.column("id").to_pylist(), got.column("w").to_pylist())) == [(1, "one"), (2, "two")]
    assert read_shape(path) == b
    # a replayed earlier change, in the old shape, is left out; a later one applies
    done = apply_shaped(path, [_run(a, 40, id=[1], v=pa.array([9], pa.int32())), _run(b, 600, id=[2], w=["new"])],
                        ["id"], 1, ("app", 3), reread, "public.t", apply)
    assert done.dropped_rows == 1 and done.reread_lsn is None and calls == ["public.t"]
    got = checked_table(path)
    assert sorted(zip(got.column("id").to_pylist(), got.column("w").to_pylist())) == [(1, "one"), (2, "new")]
    assert (tmp_path / "t" / SHAPE_FILE).exists()


@pytest.mark.parametrize("scd", [1, 2])
def test_a_batch_of_only_a_truncate_keeps_the_columns_the_table_has(tmp_path, scd):
    """A task whose first change of a table is a TRUNCATE writes it in a file of the table's columns as the query
    started (a truncate has none of its own). Alone in its micro-batch, after the columns changed upstream, it ends
    the rows and adds none of those old columns back."""
    from spockwire.spark.apply import apply_changes

    path = str(tmp_path / "t")
    b = [["id", 23, -1, True], ["w", 25, -1, False]]

    def apply(*args, **kw):
        return apply_changes(*args, format="delta", engine="delta-rs", **kw)

    def reread(table):
        raise AssertionError("a truncate is no change of the columns")

    apply_shaped(path, [_run(b, 10, id=[1, 2], w=["one", "two"])], ["id"], scd, ("app", 1), reread, "public.t",
                 apply)
    truncate = _run(None, 20, id=pa.array([None], pa.int32()), v=pa.array([None], pa.int32()))
    truncate = truncate.set_column(0, "_change_type", pa.array(["truncate"]))
    apply_shaped(path, [truncate], ["id"], scd, ("app", 2), reread, "public.t", apply)
    got = checked_table(path)
    assert sorted(c for c in got.column_names if c not in BOOKKEEPING) == ["id", "w"]
    assert got.num_rows == (0 if scd == 1 else 2)
    if scd == 2:
        assert got.column("_end_commit_lsn").null_count == 0
    assert read_shape(path) == b


@pytest.mark.parametrize("crash", ["before-the-commit", "before-the-shape-is-recorded"])
def test_a_crash_inside_a_reread_leaves_the_table_before_or_after_it(tmp_path, monkeypatch, crash):
    """The re-read's steps fail one at a time (what kill -9 leaves is on disk alone), then the micro-batch is
    replayed and the next one applied: the table ends as the source, with nothing lost or doubled."""
    import deltalake

    from spockwire.spark import schema_changes as sc
    from spockwire.spark.apply import apply_changes
    from spockwire.spark.delta_target import open_delta

    path = str(tmp_path / "t")
    a = [["id", 23, -1, True], ["v", 23, -1, False]]
    b = [["id", 23, -1, True], ["w", 25, -1, False]]
    reads = []
    source = {1: "one", 2: "two", 3: "three"}     # the source table as of now

    def reread(table):                             # each read at a later point, of the source as it is then
        lsn = 500 + 200 * len(reads)
        reads.append(lsn)
        return sc.TableSnapshot(table, lsn, _run(b, lsn, id=list(source), w=list(source.values())), b)

    def apply(*args, **kw):
        return apply_changes(*args, format="delta", engine="delta-rs", **kw)

    sc.apply_shaped(path, [_run(a, 10, id=[1, 2], v=pa.array([1, 2], pa.int32()))], ["id"], 1, ("app", 1), reread,
                    "public.t", apply)
    batch2 = [_run(a, 20, id=[3], v=pa.array([3], pa.int32())), _run(b, 30, id=[2], w=["x"])]

    class Crash(Exception):
        pass

    if crash == "before-the-commit":
        real = deltalake.write_deltalake

        def failing(*args, **kw):
            if kw.get("mode") == "overwrite":
                raise Crash()
            return real(*args, **kw)

        monkeypatch.setattr(deltalake, "write_deltalake", failing)
    else:
        monkeypatch.setattr(sc, "write_shape", lambda *a: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        sc.apply_shaped(path, batch2, ["id"], 1, ("app", 2), reread, "public.t", apply)
    monkeypatch.undo()
    # the batch is replayed, then the next one comes
    sc.apply_shaped(path, batch2, ["id"], 1, ("app", 2), reread, "public.t", apply)
    source[3] = "three!"
    sc.apply_shaped(path, [_run(b, 1000, id=[3], w=["three!"])], ["id"], 1, ("app", 3), reread, "public.t", apply)
    got = open_delta(path).to_pyarrow_table()
    assert sorted(c for c in got.column_names if c not in BOOKKEEPING) == ["id", "w"]
    assert sorted(zip(got.column("id").to_pylist(), got.column("w").to_pylist())) == \
        [(1, "one"), (2, "two"), (3, "three!")]
    assert read_shape(path) == b
    # before the commit: the replay reads again; after it, the recorded point drops the replay, and the next
    # batch's shape, unrecorded, costs one more read
    assert len(reads) == 2 and sc.reread_point(open_delta(path)) == 700


def test_what_a_captured_statement_changes_in_place():
    from spockwire.spark.schema_changes import in_place

    def num(p, s):
        return ((p << 16) | s) + 4

    shape = [["id", 23, -1, True], ["v", 23, -1, False], ["amount", 1700, num(10, 2), False], ["s", 1043, 14, False]]

    def after(cols, rewritten=False, statement="ALTER TABLE t ..."):
        return {"columns": [c + [False, False, False] for c in cols], "rewritten": rewritten, "statement": statement}

    def change(i, col):
        return [col if j == i else c for j, c in enumerate(shape)]

    assert in_place(shape, after(shape + [["n", 25, -1, False]])) == ("add", [["n", 25, -1, False]])
    with_default = after(shape + [["n", 25, -1, False]])
    with_default["columns"][-1][4] = True                                # a missing value: the rows hold 'x'
    assert in_place(shape, with_default) is None
    assert in_place(shape, after(shape + [["n", 25, -1, False]], rewritten=True)) is None   # a volatile default
    assert in_place(shape, after(change(1, ["w", 23, -1, False]))) == ("rename", {"v": "w"})
    assert in_place(shape, after(shape[:1] + shape[2:])) == ("drop", ["v"])
    assert in_place(shape, after(change(1, ["v", 20, -1, False]), True)) == ("widen", [["v", 20, -1, False]])
    assert in_place(shape, after(change(1, ["v", 20, -1, False]), True, "ALTER TABLE t ALTER v TYPE bigint "
                                                                        "USING v * 2")) is None
    assert in_place(shape, after(change(2, ["amount", 1700, num(14, 4), False]), True))[0] == "widen"
    assert in_place(shape, after(change(2, ["amount", 1700, num(10, 1), False]), True)) is None   # rounds
    assert in_place(shape, after(change(2, ["amount", 1700, num(9, 2), False]), True)) is None    # fewer digits
    assert in_place(shape, after(change(3, ["s", 25, -1, False])))[0] == "widen"                  # varchar -> text
    assert in_place(shape, after(change(3, ["s", 1043, 10, False]), True)) is None                # shorter
    assert in_place(shape, after(change(1, ["v", 25, -1, False]), True)) is None                  # int -> text
    assert in_place(shape, after(change(1, ["v", 23, -1, True]))) is None                         # a new key


@pytest.mark.timeout(900)
def test_kill_9_around_rereads_then_delta_equals_source(pg_db, tmp_path):
    """The job (a child process, the whole publication) killed with SIGKILL at random moments while migrations are
    re-read, restarted each time, then run until caught up: the table and its history equal the source."""
    import random

    from tests.test_spark_exactly_once import Job

    rng = random.Random(40)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int, s text)")
    pg_db.execute("INSERT INTO t SELECT g, g, 's' || g FROM generate_series(1, 20000) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    migrations = ["ALTER TABLE t ADD COLUMN extra text DEFAULT 'x'", "ALTER TABLE t RENAME COLUMN s TO label",
                  "ALTER TABLE t ALTER COLUMN v TYPE bigint"]
    def log() -> str:
        return (tmp_path / "job.log").read_text()[-3000:]

    def spark_did_not_start(job) -> bool:
        # on a loaded machine Spark can fail to start its Python worker in time (the job then exits 1 before its
        # first micro-batch): starting it again is what a user does, and the point of this test
        return job.proc.poll() not in (None, 0) and "failed to connect back" in log()

    for i, sql in enumerate(migrations):
        for _ in range(3):
            job = Job(pg_db, tmp_path, [], tables={})
            if job.wait_for("batch", 300) or not spark_did_not_start(job):
                break
        assert job.wait_for("batch", 1), log()
        pg_db.execute(sql)
        pg_db.execute(f"UPDATE t SET v = v + 1 WHERE id % 97 = {i}")
        pg_db.execute(f"INSERT INTO t (id, v) VALUES ({100000 + i}, {i})")
        time.sleep(rng.uniform(0.5, 3.0))      # before, during or after the re-read
        job.kill_group()
    pg_db.execute("UPDATE t SET v = 0 WHERE id = 1")
    for _ in range(3):
        final = Job(pg_db, tmp_path, ["--until-caught-up", "--timeout", "600"], tables={})
        final.proc.wait(700)
        if not spark_did_not_start(final):
            break
    assert final.proc.wait(1) == 0, log()
    final.reader.join(10)
    cfg = JobConfig(dsn=pg_db.dsn, slot="", publication=["pub"], tables={}, target=str(tmp_path / "delta"),
                    checkpoint="")
    _assert_equal(pg_db, cfg, "t", "after the kills")


@pytest.mark.parametrize("scd", [1, 2])
def test_a_reread_lands_values_no_statistic_can_bound(tmp_path, scd):
    """A re-read holding ±infinity dates and NaN replaces a table written before (statistics kept exact: delta-rs
    would otherwise fail on the infinite date) and reads back exactly."""
    import math

    from spockwire.spark import schema_changes as sc
    from spockwire.spark.apply import apply_changes
    from spockwire.spark.delta_target import open_delta

    path = str(tmp_path / "t")
    a = [["id", 23, -1, True], ["d", 1082, -1, False]]
    b = [["id", 23, -1, True], ["d", 1082, -1, False], ["f", 701, -1, False]]
    days = pa.array([-2147483648, 2147483647, 0], pa.int32()).cast(pa.date32())
    snap = _run(b, 500, id=[1, 2, 3], d=days, f=pa.array([float("nan"), float("inf"), 1.5]))

    def apply(*args, **kw):
        return apply_changes(*args, format="delta", engine="delta-rs", **kw)

    sc.apply_shaped(path, [_run(a, 10, id=[1], d=pa.array([5], pa.int32()).cast(pa.date32()))], ["id"], scd,
                    ("app", 1), lambda t: None, "public.t", apply)
    done = sc.apply_shaped(path, [_run(b, 20, id=[1], d=days.slice(0, 1), f=[0.5])], ["id"], scd, ("app", 2),
                           lambda t: sc.TableSnapshot(t, 500, snap, b), "public.t", apply)
    assert done.reread_lsn == 500
    got = open_delta(path).to_pyarrow_table()
    if scd == 2:
        got = got.filter(pa.compute.is_null(got.column("_end_commit_lsn")))
    rows = sorted(zip(got.column("id").to_pylist(), got.column("d").cast(pa.int32()).to_pylist(),
                      got.column("f").to_pylist()))
    assert [r[:2] for r in rows] == [(1, -2147483648), (2, 2147483647), (3, 0)]
    assert math.isnan(rows[0][2]) and rows[1][2] == float("inf") and rows[2][2] == 1.5


def test_a_column_the_decoder_turns_to_text_stays_exact(spark, pg_db, tmp_path):
    """A valid value its column's Arrow type cannot hold (NaN in a numeric(10,2), a two-dimensional array in an
    int[] column) makes the decoder carry that column as PostgreSQL's text for the rest of the relation's version:
    no schema change (same type), so no re-read. The Delta column becomes text once, every stored value written as
    PostgreSQL prints it; typed values of later relation versions are written as text too. The table and its history
    equal the source read as text, SCD 1 and 2, and no re-read happened."""
    pg_db.execute("CREATE TABLE m (id int PRIMARY KEY, amount numeric(10,2), grid int[], note text)")
    pg_db.execute("INSERT INTO m SELECT g, g * 1.25, ARRAY[g, -g], 'n' || g FROM generate_series(1, 40) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE m")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub"], tables={"public.m": None},
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.3, create_slot=True, history=True)
    as_text = ("SELECT id, amount::text AS amount, grid::text AS grid, note FROM m")

    def equal(what: str, typed: set[str]) -> None:
        conn = pg_db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(as_text if typed != {"amount", "grid"} else "SELECT * FROM m")
                want = sorted((tuple(_value(v) for v in r) for r in cur.fetchall()), key=repr)
        finally:
            conn.close()
        names = ["id", "amount", "grid", "note"]
        for history in (False, True):
            path = target_path(cfg.target, "public.m", history)
            import deltalake

            table = deltalake.DeltaTable(path).to_pyarrow_table()
            types = {n: table.schema.field(n).type for n in names}
            assert {n for n in ("amount", "grid") if types[n] != pa.string()} == typed, (what, types)
            _, got = _delta(path, names, current_only=history)
            if typed != {"amount", "grid"}:
                got = sorted(((r[0], r[1] if isinstance(r[1], str) else None if r[1] is None else str(r[1]),
                               *r[2:]) for r in got), key=repr)
            assert got == want, (what, history, [r for r in got if r not in want][:3], [r for r in want
                                                                                        if r not in got][:3])

    reports: list = []
    # two sessions of the stream: the switch in the first; the second describes the table again, typed, and its
    # values are written as text
    sessions = [("after the switch", ["UPDATE m SET amount = 'NaN', grid = '{{1,2},{3,4}}' WHERE id = 3",
                                      "UPDATE m SET amount = amount + 1 WHERE id IN (4, 5)"]),
                ("typed again", ["UPDATE m SET amount = 7.5, grid = '{5,-6}', note = 'typed again' WHERE id = 6",
                                 "INSERT INTO m VALUES (41, 0.01, '{}', 'new'), (42, -99999999.99, '{NULL,7}', NULL)"])]
    for n, (what, statements) in enumerate(sessions):
        query = start(spark, cfg, reports.append)
        try:
            if not n:
                wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
                equal("snapshot", {"amount", "grid"})
            for statement in statements:
                pg_db.execute(statement)
            wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
            equal(what, set())
        finally:
            query.stop()
    assert not any(r.reread for r in reports), [r.reread for r in reports if r.reread]
