"""The pipeline's memory settings (spockwire/spark/memory.py): delta-rs's allocator options set by default unless
the user set them, the pages freed by a micro-batch given back to the system; and Spark's Python processes that
plan the source or write its files load no more than they need.

Each case runs in a fresh interpreter: the allocator reads its options once, when ``deltalake`` is loaded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from spockwire.spark.memory import DELTA_ALLOCATOR_CONF, DELTA_ALLOCATOR_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, env: dict[str, str | None]) -> list[str]:
    full = {k: v for k, v in os.environ.items() if k != DELTA_ALLOCATOR_ENV}
    full.update({k: v for k, v in env.items() if v is not None})
    full["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p]])
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def test_delta_allocator_default_applies_only_when_unset_and_before_deltalake_loads():
    mine = "dirty_decay_ms:5000"
    lines = _run(f"""
        import os, sys
        from spockwire.spark.memory import configure_delta_allocator
        assert "deltalake" not in sys.modules
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))      # unset: the default
        os.environ[{DELTA_ALLOCATOR_ENV!r}] = {mine!r}
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))      # the user's setting wins
        del os.environ[{DELTA_ALLOCATOR_ENV!r}]
        import deltalake
        # its allocator has read its options already: setting them now would claim an effect they cannot have
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))
    """, {})
    assert lines[:3] == [f"True {DELTA_ALLOCATOR_CONF}", f"False {mine}", "False None"]


def test_release_memory_gives_freed_pool_pages_back_and_keeps_live_data():
    lines = _run("""
        import numpy as np, pyarrow as pa, pyarrow.compute as pc
        from spockwire.spark.memory import release_memory

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096

        keep = pc.multiply(pa.array(np.arange(1_000_000)), 3)          # live: must survive
        garbage = [pc.multiply(keep, i) for i in range(12)] + [pc.add(keep.slice(0, 50_000), i) for i in range(200)]
        assert pa.total_allocated_bytes() > 150 << 20
        del garbage
        freed = rss()
        release_memory()
        print(freed - rss())
        print(keep[999_999].as_py(), keep.sum().as_py())
    """, {})
    returned, values = int(lines[0]), lines[1]
    # about 180 MB were freed inside pyarrow's pool; without the release the process keeps them resident
    assert returned > 100 << 20, returned
    assert values == f"{3 * 999_999} {3 * 999_999 * 1_000_000 // 2}"


def test_importing_the_source_and_writing_a_batch_file_does_not_load_pandas(tmp_path):
    """Spark's Python workers that plan and decode a micro-batch import the source and write its Arrow files; none of
    it converts Python values with `pa.array` (which loads pandas: about 50 MB in each of those processes)."""
    import pyarrow as pa

    schema = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.uint64()),
                        ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.uint32()), ("_seq", pa.int64()),
                        ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), ("id", pa.int32()),
                        ("v", pa.string())])
    batch = pa.RecordBatch.from_pylist([
        {"_change_type": "insert", "_commit_lsn": 100, "_commit_ts": 0, "_xid": None, "_seq": 0, "id": 1, "v": "a"},
        {"_change_type": "update_postimage", "_commit_lsn": 200, "_commit_ts": 1, "_xid": 7, "_seq": 1, "id": 1,
         "v": "b"}], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    lines = _run(f"""
        import sys
        import pyarrow as pa
        from spockwire.spark import datasource
        from spockwire.spark.batch_files import write_files

        stream = bytes.fromhex({sink.getvalue().to_pybytes().hex()!r})
        batch = pa.ipc.open_stream(pa.py_buffer(stream)).read_next_batch()
        manifest = pa.Table.from_batches(list(write_files({str(tmp_path)!r}, "range-1", iter([("public.t", batch)]),
                                                          batch.schema, False)))
        print(manifest.column("rows").to_pylist(), manifest.column("snapshot_rows").to_pylist(),
              manifest.column("last_lsn").to_pylist())
        print("pandas" in sys.modules)
    """, {})
    assert lines[:2] == ["[2] [1] [200]", "False"]


def test_creating_the_source_in_a_planning_process_loads_neither_pyarrow_nor_the_decoder():
    """Spark creates a Python data source, and reads its schema, in a planning process of its own that stays alive
    beside the query: with stagingPath (the pipeline job) that process imports the source and nothing of pyarrow,
    numpy or the decoder (about 50 MB less in it)."""
    lines = _run("""
        import sys
        import pyspark.sql.worker.create_data_source        # the planning process's own module
        from spockwire.spark.datasource import SpockwireDataSource
        from spockwire.spark.manifest import MANIFEST_SCHEMA

        source = SpockwireDataSource({"dsn": "host=db dbname=shop", "slot": "s", "table": "public.t",
                                      "stagingPath": "/staging"})
        print(source.schema() == MANIFEST_SCHEMA, SpockwireDataSource.name())
        print(sorted(m for m in ("pyarrow", "numpy", "pandas", "psycopg2", "spockwire.wire._decoder")
                     if m in sys.modules))
    """, {})
    assert lines[:2] == ["True spockwire", "[]"]


def test_python_column_equals_pa_array_for_strings_integers_and_booleans_with_nulls():
    import pyarrow as pa
    import pytest

    from spockwire.export.arrow import python_column

    cases = [(["a", None, "", "ééé", "z" * 300], pa.string()), ([], pa.string()), ([None, None], pa.string()),
             ([0, None, -1, 2**63 - 1, -2**63], pa.int64()), ([None], pa.int64()), (list(range(20)), pa.int64()),
             ([True, None, False] * 7, pa.bool_()), ([False] * 9, pa.bool_()), ([], pa.bool_())]
    for values, type_ in cases:
        got = python_column(values, type_)
        got.validate(full=True)
        assert got.equals(pa.array(values, type_)), (values, got)
        assert got.null_count == sum(v is None for v in values)
    with pytest.raises(TypeError, match="string, int64 and boolean"):
        python_column([1.5], pa.float64())
    with pytest.raises(OverflowError):
        python_column([2**63], pa.int64())


def test_repeated_and_int64_sequence_equal_pa_array():
    import pyarrow as pa
    import pytest

    from spockwire.export.arrow import int64_sequence, repeated

    ts = pa.timestamp("us", tz="UTC")
    cases = [("insert", pa.string()), ("", pa.string()), ("ééé", pa.string()), (2**64 - 1, pa.uint64()),
             (-2**63, pa.int64()), (2**32 - 1, pa.uint32()), (-5, pa.int32()), (1_700_000_000_123_456, ts),
             (None, pa.uint32()), (None, pa.string())]
    for value, type_ in cases:
        for n in (0, 1, 5):
            got = repeated(value, n, type_)
            got.validate(full=True)
            assert got.equals(pa.array([value] * n, type_)), (value, type_, n, got)
    for start, n in ((-2**63, 3), (0, 0), (10, 5)):
        got = int64_sequence(start, n)
        got.validate(full=True)
        assert got.equals(pa.array(list(range(start, start + n)), pa.int64()))
    with pytest.raises(TypeError, match="string, integer and timestamp"):
        repeated(1.5, 2, pa.float64())
    with pytest.raises(OverflowError):
        repeated(2**32, 1, pa.uint32())
