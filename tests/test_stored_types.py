"""The stored form of intervals in staged Parquet files: exact for every month_day_nano value, at any nesting, in
sliced batches with NULLs; any Parquet reader sees a plain struct."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spockwire.ingest.stored_types import ARROW_TYPE_KEY, INTERVAL_STRUCT, restore_batch, restore_table, \
    store_batch

MDN = pa.month_day_nano_interval()
I32 = st.integers(-2 ** 31, 2 ** 31 - 1)
I64 = st.integers(-2 ** 63, 2 ** 63 - 1)
VALUES = st.none() | st.tuples(I32, I32, I64).map(pa.MonthDayNano)


def _roundtrip(batch: pa.RecordBatch, tmp_path) -> pa.Table:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_batches([store_batch(batch)]), path)
    return restore_table(pq.read_table(path))


@settings(max_examples=60, deadline=None)
@given(st.lists(VALUES, max_size=12), st.lists(st.none() | st.lists(VALUES, max_size=4), max_size=12),
       st.integers(0, 3))
def test_intervals_and_lists_of_intervals_round_trip_exactly(tmp_path_factory, flat, nested, cut):
    tmp_path = tmp_path_factory.mktemp("rt")
    n = min(len(flat), len(nested))
    batch = pa.RecordBatch.from_arrays([pa.array(flat[:n], MDN), pa.array(nested[:n], pa.list_(MDN)),
                                        pa.array(range(n), pa.int64())], names=["i", "l", "x"])
    batch = batch.slice(min(cut, n))
    back = _roundtrip(batch, tmp_path)
    assert back.schema.field("i").type == MDN and back.schema.field("l").type == pa.list_(MDN)
    assert back.to_pylist() == batch.to_pylist()
    assert back.equals(pa.Table.from_batches([batch]))


@pytest.mark.parametrize("list_type", [pa.large_list, lambda t: pa.list_(t, 2)])
def test_large_and_fixed_size_lists(tmp_path, list_type):
    values = [[pa.MonthDayNano((1, -2, 3)), None], None, [pa.MonthDayNano((0, 0, -(2 ** 63))), pa.MonthDayNano(
        (2 ** 31 - 1, 5, 6))]]
    batch = pa.RecordBatch.from_arrays([pa.array(values, list_type(MDN))], names=["l"]).slice(1)
    back = _roundtrip(batch, tmp_path)
    assert back.schema.field("l").type == list_type(MDN)
    assert back.to_pylist() == batch.to_pylist()


def test_other_readers_see_a_marked_struct(tmp_path):
    batch = pa.RecordBatch.from_arrays([pa.array([pa.MonthDayNano((14, 3, 4_000_000_000)), None], MDN)], names=["v"])
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_batches([store_batch(batch)]), path)
    raw = pq.read_table(path)
    assert raw.schema.field("v").type == INTERVAL_STRUCT
    assert raw.schema.field("v").metadata == {ARROW_TYPE_KEY: b"month_day_nano_interval"}
    assert raw.column("v").to_pylist() == [{"months": 14, "days": 3, "nanoseconds": 4_000_000_000}, None]
    assert restore_batch(raw.to_batches()[0]).column(0).to_pylist() == batch.column(0).to_pylist()


def test_batches_without_intervals_are_untouched():
    batch = pa.RecordBatch.from_arrays([pa.array([1, None]), pa.array([[1], None], pa.list_(pa.int32()))],
                                       names=["a", "b"])
    assert store_batch(batch) is batch
    assert restore_batch(batch) is batch


def test_a_column_whose_type_changed_reads_per_schema_version(tmp_path):
    """A column staged as date32 and later as string (two schema versions): both kept exactly; reading them as one
    table is a clear error naming the versions, each version reads alone."""
    from spockwire.export.arrow import finish_batch
    from spockwire.ingest import StagingError, StagingWriter, read_staging
    from spockwire.model import ChangeBatch, Column, Relation

    rel = Relation(7, "public", "d", (Column("id", 23, -1, True), Column("v", 1082, -1, False)), "d", 1)

    def batch(lsn: int, values: pa.Array) -> ChangeBatch:
        rb = finish_batch(rel, pa.array([0], pa.int8()), pa.array([lsn], pa.uint64()),
                          pa.array([0], pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array([1], pa.uint32()),
                          pa.array([0], pa.int64()), pa.array([None], pa.string()), None, None, None,
                          [pa.array([1], pa.int32()), values])
        return ChangeBatch(rel, rb)

    with StagingWriter(tmp_path, "pgoutput") as writer:
        writer.add(batch(10, pa.array([2 ** 31 - 1], pa.int32()).cast(pa.date32())))
        writer.add(batch(20, pa.array(["infinity"], pa.string())))
        writer.commit(30)
    with pytest.raises(StagingError, match=r"public\.d .*date32.* read its schema versions \(1, 2\) one at a time "
                                           r"with schema_version="):
        read_staging(tmp_path, "public.d")
    assert read_staging(tmp_path, "public.d", schema_version=1).column("v").cast(pa.int32()).to_pylist() == \
        [2 ** 31 - 1]
    assert read_staging(tmp_path, "public.d", schema_version=2).column("v").to_pylist() == ["infinity"]
