"""`apply_changes` on a real local Spark: in memory, Parquet, and Delta (through delta-rs here)."""
from __future__ import annotations

import datetime as dt

import pytest

from spockwire.spark.apply import apply_changes, has_delta_spark
from tests.spark_session import spark_session

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SCHEMA = ("_change_type string, _commit_lsn long, _commit_ts timestamp, _xid long, _seq long, _origin string, "
          "_unchanged_toast array<string>, id int, name string, doc string")


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def changes(spark, rows):
    """rows: (change, lsn, seq, id, name, doc, toast)"""
    return spark.createDataFrame([(c, lsn, T0, 1, seq, None, toast, i, n, d) for c, lsn, seq, i, n, d, toast in rows],
                                 SCHEMA)


def table(df):
    return sorted(tuple(r) for r in df.select("id", "name", "doc").collect())


def target(spark, rows):
    return spark.createDataFrame(rows, "id int, name string, doc string")


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


def test_apply_in_memory_keeps_unchanged_toast_and_real_nulls(spark):
    start = target(spark, [(1, "one", "D1"), (2, "two", "D2"), (3, "three", "D3")])
    result = apply_changes(changes(spark, EVENTS), start, format="memory", keys=["id"])
    assert table(result) == [(1, "one!", "D1"), (2, "two!", None), (5, "five again", "d5b"), (40, "forty", "d4")]


def test_key_change_takes_unchanged_toast_from_the_target_row(spark):
    start = target(spark, [(7, "seven", "big"), (8, "eight", "other")])
    moved = [("update_preimage", 100, 0, 7, None, None, None), ("update_postimage", 100, 1, 70, "x", None, ["doc"]),
             ("update_preimage", 200, 0, 70, None, None, None), ("update_postimage", 200, 1, 700, "y", None, ["doc"])]
    result = apply_changes(changes(spark, moved), start, format="memory", keys=["id"])
    assert table(result) == [(8, "eight", "other"), (700, "y", "big")]


def test_truncate_drops_the_target_and_earlier_changes(spark):
    start = target(spark, [(1, "one", "D1")])
    rows = [("insert", 100, 0, 2, "two", "d2", None), ("truncate", 150, 0, None, None, None, None),
            ("insert", 150, 1, 3, "three", "d3", None), ("update_postimage", 160, 0, 3, "3", None, ["doc"])]
    assert table(apply_changes(changes(spark, rows), start, format="memory", keys=["id"])) == [(3, "3", "d3")]


def test_keys_are_required(spark):
    with pytest.raises(ValueError, match="key columns"):
        apply_changes(changes(spark, EVENTS), None, format="memory")


def test_apply_to_parquet_twice_is_idempotent(spark, tmp_path):
    path = str(tmp_path / "orders")
    first = changes(spark, [("insert", 10, 0, 1, "one", "D1", None), ("insert", 10, 1, 2, "two", "D2", None),
                            ("insert", 10, 2, 3, "three", "D3", None)])
    apply_changes(first, path, format="parquet", keys=["id"])
    batch = changes(spark, EVENTS)
    apply_changes(batch, path, format="parquet", keys=["id"])
    expected = [(1, "one!", "D1"), (2, "two!", None), (5, "five again", "d5b"), (40, "forty", "d4")]
    assert table(spark.read.parquet(path)) == expected
    apply_changes(batch, path, format="parquet", keys=["id"])   # a replayed micro-batch changes nothing
    assert table(spark.read.parquet(path)) == expected


def test_apply_to_delta_through_delta_rs(spark, tmp_path):
    import deltalake
    path = str(tmp_path / "orders_delta")
    first = changes(spark, [("insert", 10, 0, 1, "one", "D1", None), ("insert", 10, 1, 2, "two", "D2", None),
                            ("insert", 10, 2, 3, "three", "D3", None)])
    apply_changes(first, path, format="delta", keys=["id"], engine="delta-rs")
    apply_changes(changes(spark, EVENTS), path, format="delta", keys=["id"], engine="delta-rs")
    got = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["name"], r["doc"]) for r in got) == \
        [(1, "one!", "D1"), (2, "two!", None), (5, "five again", "d5b"), (40, "forty", "d4")]
    assert deltalake.DeltaTable(path).version() == 1
    # the same table read back through Spark's own reader of the Parquet data files is not needed: delta-rs is
    # the writer here; a truncate rewrites the table in one commit
    apply_changes(changes(spark, [("truncate", 900, 0, None, None, None, None),
                                  ("insert", 900, 1, 9, "nine", "d9", None)]),
                  path, format="delta", keys=["id"], engine="delta-rs")
    assert deltalake.DeltaTable(path).to_pyarrow_table().to_pylist() == [{"id": 9, "name": "nine", "doc": "d9"}]


def test_delta_spark_engine(spark, tmp_path):
    """engine="spark" merges through delta-spark. The suite's session (tests/spark_session.py) loads no Delta jars
    and the delta-spark Python package ships none (they come from Maven through spark.jars.packages), so here the
    test proves the clear error and that nothing was written. In a session with the jars it applies the changes
    and must give the same table as the other engines."""
    path = tmp_path / "d"
    if not has_delta_spark(spark):
        with pytest.raises(RuntimeError, match=r"engine='spark' needs delta-spark in the session: .*"
                                               r"spark\.jars\.packages=io\.delta:delta-spark"):
            apply_changes(changes(spark, EVENTS), str(path), format="delta", keys=["id"], engine="spark")
        assert not path.exists()
        return
    start = target(spark, [(1, "one", "D1"), (2, "two", "D2"), (3, "three", "D3")])
    start.write.format("delta").save(str(path))
    apply_changes(changes(spark, EVENTS), str(path), format="delta", keys=["id"], engine="spark")
    assert table(spark.read.format("delta").load(str(path))) == \
        [(1, "one!", "D1"), (2, "two!", None), (5, "five again", "d5b"), (40, "forty", "d4")]
