"""`apply_changes` on a real local Spark: SCD 1 and SCD 2 against a plain-Python replay of the same changes
(tests/apply_oracle.py), re-applied and out-of-order batches, key changes, deletes, truncates, unchanged TOAST
values, an added column; in memory, Parquet, and Delta (through delta-rs here)."""
from __future__ import annotations

import datetime as dt

import deltalake
import pytest

from spockwire.spark.apply import STATE_DIR, apply_changes, scd2_columns
from tests.apply_oracle import COLUMNS, replay_scd1, replay_scd2, workload
from tests.delta_check import checked_table
from tests.spark_session import spark_session

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SCHEMA = ("_change_type string, _commit_lsn long, _commit_ts timestamp, _xid long, _seq long, _origin string, "
          "_unchanged_toast array<string>, id int, name string, doc string")
FIELDS = ["_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast", *COLUMNS]


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def changes(spark, rows):
    """rows: (change, lsn, seq, id, name, doc, toast)"""
    return spark.createDataFrame([(c, lsn, T0, 1, seq, None, toast, i, n, d) for c, lsn, seq, i, n, d, toast in rows],
                                 SCHEMA)


def frame(spark, rows: list[dict]):
    return spark.createDataFrame([tuple(r[f] for f in FIELDS) for r in rows], SCHEMA)


def table(df):
    return sorted(tuple(r) for r in df.select("id", "name", "doc").collect())


def target(spark, rows):
    return spark.createDataFrame(rows, "id int, name string, doc string")


def utc(rows):
    """Rows with every timestamp as an aware UTC datetime (Spark's collect gives naive UTC ones: the session and
    the test process run in UTC)."""
    def fix(v):
        if isinstance(v, dt.datetime):
            return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v.astimezone(dt.timezone.utc)
        return v
    return {tuple(fix(v) for v in r) for r in rows}


def delta_rows(path, scd=1):
    import deltalake

    rows = checked_table(path).to_pylist()
    if scd == 1:
        return {r["id"]: tuple(r[c] for c in COLUMNS) for r in rows}
    start, end = scd2_columns()
    return utc((*[r[c] for c in COLUMNS], *[r[c] for c in start], *[r[c] for c in end]) for r in rows)


EVENTS = [
    # given out of order on purpose: apply orders by (_commit_lsn, _seq)
    ("update_postimage", 300, 1, 1, "one!", None, ["doc"]),       # doc unchanged TOAST: keeps the target's
    ("insert", 100, 0, 4, "four", "d4", None),
    ("update_postimage", 200, 0, 2, "two!", None, None),           # doc really set to NULL
    ("delete", 400, 0, 3, None, None, None),
    ("update_preimage", 500, 0, 4, None, None, None),               # key 4 -> 40, doc unchanged TOAST
    ("update_postimage", 500, 1, 40, "forty", None, ["doc"]),
    ("insert", 600, 0, 5, "five", "d5", None),
    ("delete", 700, 0, 5, None, None, None),
    ("insert", 800, 0, 5, "five again", "d5b", None),               # delete then insert again
]
AFTER_EVENTS = [(1, "one!", "D1"), (2, "two!", None), (5, "five again", "d5b"), (40, "forty", "d4")]


def test_memory_keeps_unchanged_toast_real_nulls_and_key_change_chains(spark):
    start = target(spark, [(1, "one", "D1"), (2, "two", "D2"), (3, "three", "D3"), (7, "seven", "big")])
    moved = [("update_preimage", 900, 0, 7, None, None, None), ("update_postimage", 900, 1, 70, "x", None, ["doc"]),
             ("update_preimage", 950, 0, 70, None, None, None), ("update_postimage", 950, 1, 700, "y", None, ["doc"])]
    result = apply_changes(changes(spark, EVENTS + moved), start, format="memory", keys=["id"])
    assert table(result) == sorted(AFTER_EVENTS + [(700, "y", "big")])
    # the target keeps each key's sequence: the same changes again change nothing
    assert sorted(map(tuple, result.select("id", "_commit_lsn", "_seq").collect())) == \
        [(1, 300, 1), (2, 200, 0), (5, 800, 0), (40, 500, 1), (700, 950, 1)]
    again = apply_changes(changes(spark, EVENTS + moved), result, format="memory", keys=["id"])
    assert table(again) == table(result)


def test_truncate_drops_the_target_and_earlier_changes(spark):
    start = target(spark, [(1, "one", "D1")])
    rows = [("insert", 100, 0, 2, "two", "d2", None), ("truncate", 150, 0, None, None, None, None),
            ("insert", 150, 1, 3, "three", "d3", None), ("update_postimage", 160, 0, 3, "3", None, ["doc"])]
    assert table(apply_changes(changes(spark, rows), start, format="memory", keys=["id"])) == [(3, "3", "d3")]


def test_keys_and_scd_type_are_checked(spark):
    with pytest.raises(ValueError, match="key columns"):
        apply_changes(changes(spark, EVENTS), None, format="memory")
    with pytest.raises(ValueError, match="stored_as_scd_type must be 1 or 2"):
        apply_changes(changes(spark, EVENTS), None, format="memory", keys=["id"], stored_as_scd_type=3)
    with pytest.raises(ValueError, match="sequence_by columns"):
        apply_changes(changes(spark, EVENTS), None, format="memory", keys=["id"], sequence_by=["nope"])


def test_scd1_delta_equals_replay_with_retried_batches(spark, tmp_path):
    """Every kind of change, unchanged TOAST values (also across key changes and batches), truncates; each
    micro-batch applied twice, as Spark does when it retries a batch after a failure."""
    txs = workload(7, 24)
    batches = [sum(txs[i:i + 8], []) for i in range(0, len(txs), 8)]
    assert {r["_change_type"] for b in batches for r in b} == \
        {"insert", "update_preimage", "update_postimage", "delete", "truncate"}
    path = str(tmp_path / "t")
    seen: list[dict] = []
    for batch in batches:
        df = frame(spark, batch)
        apply_changes(df, path, format="delta", keys=["id"], engine="delta-rs")
        seen += batch
        assert delta_rows(path) == replay_scd1(seen)
        again = apply_changes(df, path, format="delta", keys=["id"], engine="delta-rs")
        assert again.rows_written == 0
        assert delta_rows(path) == replay_scd1(seen)


def test_scd1_and_scd2_out_of_order_batches(spark, tmp_path):
    """Batches applied in another order than their sequence (a later batch holding older changes) give the
    table of the in-order replay: the target keeps each key's last sequence, tombstones and truncates."""
    txs = workload(11, 24, toast=False)
    batches = [sum(txs[i:i + 8], []) for i in range(0, len(txs), 8)]
    everything = sum(batches, [])
    assert any(r["_change_type"] == "truncate" for r in everything)
    order = [2, 0, 1]
    one, two = str(tmp_path / "scd1"), str(tmp_path / "scd2")
    for i in order:
        df = frame(spark, batches[i])
        apply_changes(df, one, format="delta", keys=["id"], engine="delta-rs")
        apply_changes(df, two, format="delta", keys=["id"], engine="delta-rs", stored_as_scd_type=2)
    assert delta_rows(one) == replay_scd1(everything)
    assert delta_rows(two, scd=2) == utc(replay_scd2(everything))


def test_scd2_history_in_memory_and_parquet(spark, tmp_path):
    """SCD 2: every version with its validity; deletes and truncates close the current version, a key change
    closes the old key and opens the new one, unchanged TOAST values come from the previous version. In memory
    (the result fed back as the target) and in Parquet, each batch applied twice."""
    txs = workload(3, 21)
    batches = [sum(txs[i:i + 7], []) for i in range(0, len(txs), 7)]
    start, end = scd2_columns()
    cols = [*COLUMNS, *start, *end]
    memory = None
    path = str(tmp_path / "hist")
    seen: list[dict] = []
    for batch in batches:
        df = frame(spark, batch)
        seen += batch
        memory = apply_changes(df, memory, format="memory", keys=["id"], stored_as_scd_type=2)
        for _ in range(2):
            apply_changes(df, path, format="parquet", keys=["id"], stored_as_scd_type=2)
    expected = utc(replay_scd2(seen))
    assert utc(memory.select(*cols).collect()) == expected
    assert utc(spark.read.parquet(path).select(*cols).collect()) == expected
    # the current versions are the SCD 1 table
    current = {r[0]: tuple(r[:3]) for r in expected if r[6] is None}
    assert current == replay_scd1(seen)


def test_parquet_scd1_keeps_state_and_replays(spark, tmp_path):
    path = str(tmp_path / "orders")
    first = changes(spark, [("insert", 10, 0, 1, "one", "D1", None), ("insert", 10, 1, 2, "two", "D2", None),
                            ("insert", 10, 2, 3, "three", "D3", None)])
    apply_changes(first, path, format="parquet", keys=["id"])
    batch = changes(spark, EVENTS)
    apply_changes(batch, path, format="parquet", keys=["id"])
    assert table(spark.read.parquet(path)) == AFTER_EVENTS
    apply_changes(batch, path, format="parquet", keys=["id"])   # a replayed micro-batch changes nothing
    assert table(spark.read.parquet(path)) == AFTER_EVENTS
    # the delete of key 3 (sequence 400) is remembered: an older insert of it, arriving late, stays deleted
    apply_changes(changes(spark, [("insert", 350, 0, 3, "late", "x", None)]), path, format="parquet", keys=["id"])
    assert table(spark.read.parquet(path)) == AFTER_EVENTS
    assert (tmp_path / "orders" / STATE_DIR).is_dir()


def test_delta_added_column_and_reads_only_touched_keys(spark, tmp_path):
    """A column added upstream appears in the Delta table (older rows NULL); a batch reads only the files whose
    statistics may hold its keys, and only those keys' rows."""
    import deltalake
    import pyarrow as pa

    path = str(tmp_path / "wide")
    for f in range(8):   # 8 files of 50 keys each, as SCD 1 tables of apply_changes are laid out
        ids = list(range(f * 50, f * 50 + 50))
        deltalake.write_deltalake(path, pa.table({
            "id": pa.array(ids, pa.int32()), "name": [f"n{i}" for i in ids], "doc": ["big"] * 50,
            "_commit_lsn": pa.array([100 + f] * 50, pa.int64()), "_seq": pa.array(range(50), pa.int64())}),
            mode="append")
    files = len(deltalake.DeltaTable(path).file_uris())
    schema = SCHEMA + ", note string"
    batch = spark.createDataFrame(
        [("update_postimage", 500, 0, T0, 1, None, ["doc"], 3, "three", None, "hello"),
         ("insert", 500, 1, T0, 1, None, None, 1000, "new", "d", "fresh"),
         ("delete", 500, 2, T0, 1, None, None, 7, None, None, None)],
        "_change_type string, _commit_lsn long, _seq long, _commit_ts timestamp, _xid long, _origin string, "
        "_unchanged_toast array<string>, id int, name string, doc string, note string").select(
            *[c.split()[0] for c in schema.split(", ")])
    metrics = apply_changes(batch, path, format="delta", keys=["id"], engine="delta-rs")
    assert metrics.files_in_table == files >= 8
    assert metrics.files_read == 1          # keys 3, 7 and 1000: only the first file may hold any of them
    assert metrics.stored_rows_read == 2    # the rows of keys 3 and 7
    assert metrics.keys_touched == 3
    got = {r["id"]: r for r in checked_table(path).to_pylist()}
    assert len(got) == 400
    assert (got[3]["name"], got[3]["doc"], got[3]["note"]) == ("three", "big", "hello")
    assert (got[1000]["note"], got[1000]["_commit_lsn"]) == ("fresh", 500)
    assert got[4]["note"] is None and 7 not in got


def test_delta_is_written_through_delta_rs_whatever_the_engine_named(spark, tmp_path):
    """Delta is written through delta-rs in every case: engine "auto" and "delta-rs" give the same table from a
    DataFrame, and "spark" (delta-spark's MERGE, which the suite cannot run) is refused with one line before
    anything is written."""
    for engine in ("auto", "delta-rs"):
        path = tmp_path / engine
        apply_changes(changes(spark, EVENTS), str(path), format="delta", keys=["id"], engine=engine)
        assert deltalake.DeltaTable(str(path)).to_pyarrow_table().num_rows > 0
    assert _rows(tmp_path / "auto") == _rows(tmp_path / "delta-rs")
    for engine, message in (("spark", "engine='spark' is not supported: spockwire writes Delta through delta-rs"),
                            ("merge", "unknown Delta engine 'merge'")):
        with pytest.raises(ValueError, match=message):
            apply_changes(changes(spark, EVENTS), str(tmp_path / "refused"), format="delta", keys=["id"],
                          engine=engine)
    assert not (tmp_path / "refused").exists()


def _rows(path) -> list:
    return sorted(map(repr, checked_table(path).to_pylist()))


def test_delta_files_stay_small_so_one_change_rewrites_one(tmp_path, monkeypatch):
    """The table is written in data files of about TARGET_FILE_BYTES (also its delta.targetFileSize, which MERGE
    keeps): a batch of one change reads and rewrites the one file whose key range holds its key. Arrow input: no
    Spark needed."""
    import deltalake
    import numpy as np
    import pyarrow as pa

    from spockwire.spark import delta_target

    monkeypatch.setattr(delta_target, "TARGET_FILE_BYTES", 1 << 20)
    n = 200_000
    ids = np.arange(n, dtype=np.int32)

    def batch(kind, keys, lsn):
        m = len(keys)
        return pa.table({"_change_type": pa.array([kind] * m), "_commit_lsn": pa.array(np.full(m, lsn, np.int64)),
                         "_commit_ts": pa.array([T0] * m, pa.timestamp("us", tz="UTC")), "_xid": pa.nulls(m, pa.int64()),
                         "_seq": pa.array(np.arange(m, dtype=np.int64)), "_origin": pa.nulls(m, pa.string()),
                         "_unchanged_toast": pa.nulls(m, pa.list_(pa.string())), "id": pa.array(keys),
                         "name": pa.array([f"n{i}" for i in keys]), "doc": pa.array(["x" * 20] * m)})

    path = str(tmp_path / "t")
    first = apply_changes(batch("insert", ids, 10), path, keys=["id"], engine="delta-rs")
    assert first.appended == n and first.commits == 1
    table = deltalake.DeltaTable(path)
    files = len(table.file_uris())
    assert files >= 3
    assert table.metadata().configuration["delta.targetFileSize"] == str(1 << 20)
    one = apply_changes(batch("update_postimage", np.array([n // 2], np.int32), 20), path, keys=["id"],
                        engine="delta-rs")
    assert one.files_read == 1 and one.merge["num_target_files_removed"] == 1
    assert one.merge["num_target_rows_copied"] < n // 2     # the one file's other rows, not the table's
    assert len(deltalake.DeltaTable(path).file_uris()) <= files + 1
    assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == n
