"""Position order has one definition (spockwire/spark/arrow_target.position_before: the sequence columns compared
in turn, NULL before every value), rendered as row masks for the Arrow-held targets and as SQL for delta-rs's
delete and update: both give the same rows, and a truncate ends the rows without a position (a plain table's
rows, older than any change) in a Delta target as in a Parquet one. No Spark."""
from __future__ import annotations

import os
import random

import deltalake
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from spockwire.spark.apply import apply_changes
from spockwire.spark.arrow_target import before, position_before
from spockwire.spark.delta_target import SqlConditions
from spockwire.spark.resolve import scd2_columns
from tests.test_spark_maintenance import changes


def _earlier(row: tuple, pos: tuple) -> bool:
    """Position order in plain Python: NULL before every value."""
    return tuple((v is not None, v) for v in row) < tuple((v is not None, v) for v in pos)


def test_rows_before_and_after_a_position_are_the_same_as_masks_and_in_sql(tmp_path):
    rnd = random.Random(4)
    values = [None, 1, 2, 3]
    rows = [(a, b) for a in values for b in values]
    table = pa.table({"row": list(range(len(rows))), "a": pa.array([r[0] for r in rows], pa.int64()),
                      "b": pa.array([r[1] for r in rows], pa.int64())})
    positions = [(a, b) for a in values for b in values]
    for n, pos in enumerate(rnd.sample(positions, 8)):
        earlier = [_earlier(r, pos) for r in rows]
        later = [_earlier(pos, r) for r in rows]
        assert before(table, ["a", "b"], pos).tolist() == earlier, pos
        assert before(table, ["a", "b"], pos, after=True).tolist() == later, pos
        for after, expected in ((False, earlier), (True, later)):
            path = str(tmp_path / f"t{n}{after}")
            deltalake.write_deltalake(path, table)
            deltalake.DeltaTable(path).delete(position_before(["a", "b"], pos, SqlConditions(), after=after))
            kept = set(deltalake.DeltaTable(path).to_pyarrow_table().column("row").to_pylist())
            assert kept == {i for i, e in enumerate(expected) if not e}, (pos, after)


def _read(path: str, fmt: str) -> list[dict]:
    if fmt == "delta":
        table = deltalake.DeltaTable(path).to_pyarrow_table()
    else:
        table = pads.dataset(path, format="parquet", exclude_invalid_files=True).to_table()
    names = sorted(table.column_names)
    return sorted((tuple(r[c] for c in names) for r in table.select(names).to_pylist()), key=repr)


@pytest.mark.parametrize("scd", [1, 2])
def test_a_truncate_ends_the_rows_without_a_position_in_delta_as_in_parquet(tmp_path, scd):
    """A plain table (its rows hold no position: older than any change) updated once, then truncated: SCD 1 keeps
    none of its rows, SCD 2 closes each of its versions at the truncate, the same in a Delta and a Parquet
    target."""
    plain = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    if scd == 2:        # an SCD 2 table's validity columns, NULL: versions older than any change
        start, end = scd2_columns()
        types = {c: pa.timestamp("us", tz="UTC") if c.endswith("_ts") else pa.int64() for c in start + end}
        plain = pa.table({**{c: plain.column(c) for c in plain.column_names},
                          **{c: pa.nulls(2, t) for c, t in types.items()}})
    got = {}
    for fmt in ("delta", "parquet"):
        path = str(tmp_path / fmt)
        if fmt == "delta":
            deltalake.write_deltalake(path, plain)
        else:
            os.makedirs(path)
            pq.write_table(plain, os.path.join(path, "part-0.parquet"))
        apply_changes(changes("update_postimage", [1], 20), path, format=fmt, keys=["id"], stored_as_scd_type=scd)
        apply_changes(pa.concat_tables([changes("truncate", [None], 25), changes("insert", [3], 26)]), path,
                      format=fmt, keys=["id"], stored_as_scd_type=scd)
        got[fmt] = _read(path, fmt)
    assert got["delta"] == got["parquet"]
    table = deltalake.DeltaTable(str(tmp_path / "delta")).to_pyarrow_table().to_pylist()
    if scd == 1:
        assert [(r["id"], r["v"]) for r in table] == [(3, "insert 3 at 26")]
    else:
        ends = sorted(((r["id"], r["v"], r["_end_commit_lsn"]) for r in table), key=repr)
        assert ends == [(1, "a", 20), (1, "update_postimage 1 at 20", 25), (2, "b", 25), (3, "insert 3 at 26", None)]
