"""The Delta tables spockwire writes, read by an independent reader: DuckDB's delta extension (delta-kernel-rs,
tests/delta_check.py) reads the same rows as deltalake after every kind of commit spockwire makes -- OPTIMIZE,
Z-order, VACUUM, state collection, a checkpoint (more than 100 commits), schema changes followed in place (a column
added, renamed, dropped), SCD 2 history, a truncate with its refill, keyless tables -- and every table's protocol is
one that Delta 3 and Delta 4 readers accept. Dates and timestamps at ±infinity land as the type's largest /
smallest day or microsecond count (docs/types.md): DuckDB reads those counts exactly; which of them it calls
infinity is pinned below. No Spark, no server: apply_changes and the maintenance functions on local tables."""
from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from spockwire.spark.apply import apply_changes
from spockwire.spark.delta_target import STATE_DIR
from spockwire.spark.maintenance import collect_state, optimize, vacuum
from spockwire.spark.resolve import first_position
from tests.delta_check import canonical_rows, checked_table, connection, duckdb_table
from tests.test_spark_maintenance import changes

#: The protocols spockwire's tables carry: the legacy (1, 2) of a table of plain types, and reader 3 / writer 7
#: with the one table feature timestampNtz where a column is a timestamp without time zone (PostgreSQL's
#: `timestamp`). Both are read by Delta 3 and Delta 4 (and by delta-kernel-rs, below); no deletion vectors, column
#: mapping, v2 checkpoints or other feature a reader must know.
ACCEPTED = {(1, 2, (), ()), (3, 7, ("timestampNtz",), ("timestampNtz",))}
UTC = dt.timezone.utc
DAY_MAX, DAY_MIN = 2**31 - 1, -2**31            # date `infinity` / `-infinity` as spockwire writes them
US_MAX, US_MIN = 2**63 - 1, -2**63              # timestamp(tz) `infinity` / `-infinity`


def protocol(path: str) -> tuple:
    p = deltalake.DeltaTable(path).protocol()
    return (p.min_reader_version, p.min_writer_version, tuple(sorted(p.reader_features or ())),
            tuple(sorted(p.writer_features or ())))


def check(path) -> pa.Table:
    """The table's rows, read the same by both readers, under a protocol Delta 3 and 4 read."""
    path = str(path)
    assert protocol(path) in ACCEPTED, (path, protocol(path))
    return checked_table(path)


def apply(batch: pa.Table, path, **kw):
    return apply_changes(batch, str(path), format="delta", engine="delta-rs", **kw)


def keyed_history(path, scd: int, batches: int = 6) -> None:
    """Inserts, updates, deletes, a truncate with its refill in the same batch, one token each."""
    lsn = 10
    for b in range(batches):
        parts = [changes("insert", range(b * 40, b * 40 + 40), lsn),
                 changes("update_postimage", range(0, b * 40, 7), lsn + 1),
                 changes("delete", range(3, b * 40, 11), lsn + 2)]
        if b == batches - 2:                 # the truncate and the rows after it: one commit
            parts += [changes("truncate", [None], lsn + 3), changes("insert", range(1000, 1030), lsn + 4)]
        apply(pa.concat_tables(parts), path, keys=["id"], stored_as_scd_type=scd, idempotence=("q", b))
        lsn += 10


@pytest.mark.parametrize("scd", [1, 2])
def test_optimize_zorder_vacuum_and_state_collection_read_the_same(tmp_path, scd):
    path = tmp_path / "t"
    keyed_history(path, scd)
    before = check(path)
    if scd == 2:                             # history: closed versions beside the current ones
        assert before.column("_end_commit_lsn").null_count < before.num_rows
    state = str(path / STATE_DIR)
    assert check(state).num_rows > 0         # tombstones and the truncate
    assert collect_state(str(path), first_position(changes("insert", [0], 1000))) > 0
    check(state)
    for zorder in (False, True):
        assert optimize(str(path), ["id"], zorder=zorder)["numFilesRemoved"] >= 1
        assert canonical_rows(check(path)) == canonical_rows(before)
    vacuum(str(path), 1)
    # the files OPTIMIZE replaced, deleted for good: the current version reads from the rewritten ones alone
    removed = deltalake.DeltaTable(str(path)).vacuum(retention_hours=0, enforce_retention_duration=False,
                                                     dry_run=False)
    assert removed
    assert check(path).num_rows == before.num_rows


def test_a_checkpoint_after_more_than_100_commits_reads_the_same(tmp_path):
    path = tmp_path / "t"
    for b in range(105):
        batch = changes("insert", [b], 10 + b) if b % 3 else changes("update_postimage", [b // 2], 10 + b)
        if b % 10 == 9:
            batch = pa.concat_tables([batch, changes("delete", [b - 5], 10 + b)])
        apply(batch, path, keys=["id"], idempotence=("q", b))
    log = path / "_delta_log"
    # delta-rs checkpoints every 100 commits (versions 0 to 99): read from it and the commits after it
    checkpoint = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert checkpoint == 99 and (log / f"{checkpoint:020}.checkpoint.parquet").exists()
    assert deltalake.DeltaTable(str(path)).version() > checkpoint
    latest = check(path)
    # DuckDB at a version before the checkpoint (the JSON commits alone) and at the checkpoint's own
    for version in (50, checkpoint):
        assert duckdb_table(str(path), version).num_rows == \
            deltalake.DeltaTable(str(path), version=version).to_pyarrow_table().num_rows
    assert latest.num_rows == deltalake.DeltaTable(str(path)).to_pyarrow_table().num_rows


@pytest.mark.parametrize("scd", [1, 2])
def test_schema_changes_followed_in_place_read_the_same(tmp_path, scd):
    """Captured ALTER TABLEs (schema_changes.apply_shaped): a column added (a metadata commit: the files before it
    lack the column, both readers give NULL), renamed and dropped (the table's files rewritten)."""
    from spockwire.spark import schema as S
    from spockwire.spark.schema_changes import apply_shaped, read_shape

    path = str(tmp_path / "t")
    shape = [["id", 20, -1, True], ["v", 25, -1, False]]
    fields = {20: pa.int64(), 25: pa.string()}

    class Reread:                             # a re-read must not be needed: every step is followed in place
        def __call__(self, table):
            raise AssertionError(f"{table} re-read")

        def column_fields(self, table, columns):
            return [pa.field(c[0], fields[c[1]]) for c in columns]

    def described(t: pa.Table, desc: list) -> pa.Table:
        return t.replace_schema_metadata({S.COLUMNS_METADATA: json.dumps(desc).encode()})

    def ddl(columns: list, lsn: int) -> pa.Table:
        t = changes("insert", [0], lsn).select(["_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq",
                                                 "_origin", "_unchanged_toast"])
        t = t.set_column(0, "_change_type", pa.array(["ddl"]))
        after = {"columns": [c + [False, False, False] for c in columns], "statement": "ALTER TABLE t"}
        return t.replace_schema_metadata({S.DDL_METADATA: json.dumps(after).encode()})

    def run(runs: list, token: int) -> None:
        done = apply_shaped(path, runs, ["id"], scd, ("q", token), Reread(), "public.t",
                            lambda *a, **kw: apply_changes(*a, format="delta", engine="delta-rs", **kw))
        assert done.reread_lsn is None

    run([described(changes("insert", range(20), 10), shape)], 0)
    added = shape + [["extra", 20, -1, False]]
    more = changes("insert", range(20, 30), 30).append_column("extra", pa.array(range(10), pa.int64()))
    run([ddl(added, 20), described(more, added)], 1)
    got = check(path)
    assert "extra" in got.column_names and got.column("extra").null_count == 20
    renamed = [["id", 20, -1, True], ["label", 25, -1, False], ["extra", 20, -1, False]]
    moved = changes("update_postimage", [5], 50).rename_columns(
        ["label" if n == "v" else n for n in changes("insert", [0], 0).column_names]) \
        .append_column("extra", pa.array([7], pa.int64()))
    run([ddl(renamed, 40), described(moved, renamed)], 2)
    assert "label" in check(path).column_names
    dropped = [["id", 20, -1, True], ["label", 25, -1, False]]
    run([ddl(dropped, 60), described(changes("insert", [99], 70).rename_columns(
        ["label" if n == "v" else n for n in changes("insert", [0], 0).column_names]), dropped)], 3)
    got = check(path)
    assert ("extra" in got.column_names) == (scd == 2)         # SCD 2 keeps a dropped column for its versions
    assert read_shape(path) == dropped


def test_infinite_dates_and_timestamps_read_as_their_counts(tmp_path):
    """±infinity lands as the type's largest / smallest count (docs/types.md); DuckDB returns exactly those counts
    through Arrow, so the two readers agree row for row. What DuckDB's own SQL makes of them is pinned here:
    DuckDB's `infinity` is the largest count, so date and timestamp(tz) `infinity` are `infinity` to it
    (`isinf` true; `epoch_us` NULL); its `-infinity` is one above the smallest, so spockwire's `-infinity` is to
    DuckDB a finite value below every other: the date `5877642-06-23 (BC)`, the timestamptz
    `290309-12-21 (BC) 19:59:05.224192+00` (`epoch_us` -2^63, `isinf` false), and a timestamp without time zone
    that DuckDB cannot render as text (a ConversionException)."""
    import duckdb

    n = 6
    schema = pa.schema([("d", pa.date32()), ("tz", pa.timestamp("us", "UTC")), ("ntz", pa.timestamp("us")),
                        ("f", pa.float64()), ("amount", pa.decimal128(12, 2)), ("tags", pa.list_(pa.string()))])
    cols = [pa.array([DAY_MAX, DAY_MIN, 0, -719163, 2932897, None], pa.date32()),   # 0000-12-31 (1 BC), 10000-01-01
            pa.array([US_MAX, US_MIN, 0, -62135596800000001, 253402300800000000, None], pa.timestamp("us", "UTC")),
            pa.array([US_MAX, US_MIN, 1, None, -1, 0], pa.timestamp("us")),
            pa.array([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, None]),
            pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-99999.99"), 0, 1, 2], pa.decimal128(12, 2)),
            pa.array([["a", None], [], None, ["x"], [""], ["b"]], pa.list_(pa.string()))]
    batch = changes("insert", range(n), 10)
    for f, c in zip(schema, cols):
        batch = batch.append_column(f, c)
    for scd in (1, 2):
        path = str(tmp_path / f"scd{scd}")
        apply(batch, path, keys=["id"], stored_as_scd_type=scd)
        check(path)
        con = connection().cursor()
        q = f"FROM delta_scan('{path}') ORDER BY id"
        assert con.execute(f"SELECT isinf(d), d::VARCHAR, isinf(tz), tz::VARCHAR, epoch_us(tz) {q} LIMIT 2").fetchall() \
            == [(True, "infinity", True, "infinity", None),
                (False, "5877642-06-23 (BC)", False, "290309-12-21 (BC) 19:59:05.224192+00", US_MIN)]
        assert con.execute(f"SELECT isinf(ntz), epoch_us(ntz) {q} LIMIT 2").fetchall() == [(True, None),
                                                                                          (False, US_MIN)]
        with pytest.raises(duckdb.ConversionException):
            con.execute(f"SELECT ntz::VARCHAR FROM delta_scan('{path}') WHERE id = 1").fetchall()
        # ordered as PostgreSQL orders them: -infinity below every value, infinity above
        assert con.execute(f"SELECT arg_min(id, d), arg_max(id, d), arg_min(id, tz), arg_max(id, tz) "
                           f"FROM delta_scan('{path}')").fetchall() == [(1, 0, 1, 0)]
        con.close()


@pytest.mark.parametrize("scd", [1, 2])
def test_keyless_tables_read_the_same(tmp_path, scd):
    """keys=[]: equal rows several times, a delete of one of them, updates, a truncate with its refill."""
    path = tmp_path / "bag"

    def rows(*parts):
        """One transaction's changes in order (one sequence)."""
        t = pa.concat_tables([changes(kind, ids, 10) for kind, ids in parts])
        t = t.set_column(t.schema.get_field_index("_seq"), "_seq", pa.array(range(t.num_rows), pa.int64()))
        return t.set_column(t.schema.get_field_index("v"), "v",
                            pa.array([None if i is None else f"row {i % 3}" for i in t.column("id").to_pylist()]))

    def lsn(t, at):
        return t.set_column(t.schema.get_field_index("_commit_lsn"), "_commit_lsn", pa.array([at] * t.num_rows))

    apply(lsn(rows(("insert", [1, 1, 1, 2, 4])), 10), path, keys=[], stored_as_scd_type=scd, idempotence=("q", 0))
    apply(lsn(rows(("delete", [1]), ("update_preimage", [2]), ("update_postimage", [5])), 20), path, keys=[],
          stored_as_scd_type=scd, idempotence=("q", 1))
    got = check(path)
    current = got if scd == 1 else got.filter(pa.compute.is_null(got.column("_end_commit_lsn")))
    assert sorted(current.column("id").to_pylist()) == [1, 1, 4, 5]
    apply(lsn(rows(("truncate", [None]), ("insert", [7, 7])), 30), path, keys=[], stored_as_scd_type=scd,
          idempotence=("q", 2))
    got = check(path)
    current = got if scd == 1 else got.filter(pa.compute.is_null(got.column("_end_commit_lsn")))
    assert sorted(current.column("id").to_pylist()) == [7, 7]


def test_the_check_fails_on_a_value_the_readers_give_differently():
    """The comparison itself: one microsecond, NaN against another float, -0.0 against 0.0, an element of a list,
    a decimal's last digit, an extra equal row: each is a difference."""
    from tests.delta_check import assert_tables_agree

    base = pa.table({"ts": pa.array([1, US_MIN], pa.timestamp("us", "UTC")), "f": [float("nan"), -0.0],
                     "l": pa.array([[1, None], []]), "m": pa.array([decimal.Decimal("1.25"), None],
                                                                   pa.decimal128(5, 2))})
    assert_tables_agree(base, base.cast(pa.schema([("ts", pa.timestamp("us", "Etc/UTC")), ("f", pa.float64()),
                                                   ("l", pa.large_list(pa.int64())),
                                                   ("m", pa.decimal128(5, 2))])), "same")
    for column, values in (("ts", pa.array([2, US_MIN], pa.timestamp("us", "UTC"))), ("f", pa.array([1.0, -0.0])),
                           ("f", pa.array([float("nan"), 0.0])), ("l", pa.array([[1, 0], []])),
                           ("m", pa.array([decimal.Decimal("1.26"), None], pa.decimal128(5, 2)))):
        other = base.set_column(base.schema.get_field_index(column), column, values)
        with pytest.raises(AssertionError):
            assert_tables_agree(base, other, column)
    with pytest.raises(AssertionError):
        assert_tables_agree(base, pa.concat_tables([base, base.slice(0, 1)]), "extra row")
    with pytest.raises(AssertionError):
        assert_tables_agree(base, base.cast(pa.schema([("ts", pa.timestamp("us")), *list(base.schema)[1:]])), "tz")


def test_the_extension_is_the_wheels_build_for_this_duckdb():
    import duckdb

    from tests.delta_check import extension_path

    assert Path(extension_path()).parent.name == f"v{duckdb.__version__}"
    rows = connection().execute("SELECT loaded, install_mode FROM duckdb_extensions() "
                                "WHERE extension_name = 'delta'").fetchall()
    assert rows == [(True, "NOT_INSTALLED")]              # loaded from the file, never installed or downloaded
    assert connection().execute("SELECT current_setting('autoinstall_known_extensions'), "
                                "current_setting('autoload_known_extensions')").fetchall() == [(False, False)]
