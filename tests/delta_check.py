"""An independent reader of the suite's Delta tables: DuckDB's delta extension (delta-kernel-rs), loaded by path from
the `duckdb-extension-delta` wheel (nothing is downloaded: autoinstall and autoload are off), compared with what
`deltalake` (delta-rs) reads.

`checked_table(path)` reads a table through both, asserts that they hold the same bag of rows in every column, and
returns delta-rs's table; `duckdb_table(path)` is DuckDB's read alone. Rows are compared in a canonical form that
keeps every value's identity: dates and timestamps as their day / microsecond counts (so ±infinity, years before 1
and after 9999 compare exactly, and a timestamp's time zone name does not matter, its instant does), floats by their
bits (one NaN; -0.0 is not 0.0), decimals at their column's scale, lists, maps and structs element by element, NULL
as NULL; the column names, their order and their types (up to the Arrow layout: string / large_string, list /
large_list) must agree too."""
from __future__ import annotations

import atexit
import collections
import importlib.resources
import tempfile
import threading
from typing import Any

import pyarrow as pa

_LOCK = threading.Lock()
_CONNECTION: Any = None


def extension_path() -> str:
    """The delta extension built for the installed duckdb, inside the duckdb-extension-delta wheel (which ships one
    build, under extensions/v<duckdb version>/): a duckdb of another version has no file there, and this says so."""
    import duckdb

    builds = importlib.resources.files("duckdb_extension_delta") / "extensions"
    path = builds / f"v{duckdb.__version__}" / "delta.duckdb_extension"
    if not path.is_file():
        shipped = sorted(p.name for p in builds.iterdir())
        raise RuntimeError(f"duckdb-extension-delta has builds for {shipped}, not for the installed duckdb "
                           f"{duckdb.__version__}: pin the two to the same version (pyproject.toml, test extra)")
    return str(path)


def connection() -> Any:
    """One DuckDB connection for the process, with the delta extension loaded from the wheel's file."""
    global _CONNECTION
    with _LOCK:
        if _CONNECTION is None:
            import duckdb

            con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                         "autoload_known_extensions": False,
                                         "allow_community_extensions": False,
                                         # an empty folder: no extension installed earlier on the machine is used
                                         "extension_directory": tempfile.mkdtemp(prefix="sw-duckdb-ext-"),
                                         "threads": 2})
            con.execute(f"LOAD {_quote(extension_path())}")
            loaded = con.execute("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'delta'").fetchall()
            assert loaded == [(True,)], loaded
            _CONNECTION = con
            atexit.register(con.close)     # before the interpreter's teardown, not in it
        return _CONNECTION


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def duckdb_table(path: str, version: int | None = None) -> pa.Table:
    """The table at `path` as DuckDB's `delta_scan` reads it (its latest version, or `version`)."""
    pinned = "" if version is None else f", version => {int(version)}"
    cur = connection().cursor()     # a connection of its own to the same database: safe beside other threads
    try:
        result = cur.execute(f"SELECT * FROM delta_scan({_quote(str(path))}{pinned})").arrow()
        return result.read_all() if isinstance(result, pa.RecordBatchReader) else result
    finally:
        cur.close()


def _type_key(t: pa.DataType) -> Any:
    """A column type up to its Arrow layout, and up to the name of a timestamp's zone (only its presence counts)."""
    if pa.types.is_dictionary(t):
        return _type_key(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return ("timestamp", t.unit, t.tz is not None)
    if pa.types.is_map(t):
        return ("map", _type_key(t.key_type), _type_key(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return ("list", _type_key(t.value_type))
    if pa.types.is_struct(t):
        return ("struct", tuple((f.name, _type_key(f.type)) for f in t))
    return str(t)


def _values(arr: pa.Array) -> list:
    """The values of `arr`, canonical and hashable (see the module's docstring)."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _values(arr.dictionary_decode())
    if pa.types.is_date32(t):
        return arr.view(pa.int32()).to_pylist()
    if pa.types.is_date64(t):
        return arr.cast(pa.date32()).view(pa.int32()).to_pylist()
    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return arr.view(pa.int64() if t.bit_width == 64 else pa.int32()).to_pylist()
    if pa.types.is_floating(t):
        return [None if v is None else float.hex(v) for v in arr.to_pylist()]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):   # (a map: a list of structs)
        offsets = arr.offsets.to_pylist()
        inner = _values(arr.values)
        return [None if not valid else tuple(inner[offsets[i]:offsets[i + 1]])
                for i, valid in enumerate(arr.is_valid().to_pylist())]
    if pa.types.is_struct(t):
        fields = [_values(child) for child in arr.flatten()]
        return [None if not valid else tuple(zip([f.name for f in t], (f[i] for f in fields)))
                for i, valid in enumerate(arr.is_valid().to_pylist())]
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t) or pa.types.is_list_view(t):
        return _values(arr.cast(pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
                                if pa.types.is_binary_view(t) else pa.large_list(t.value_type)))
    return arr.to_pylist()


def canonical_rows(table: pa.Table) -> collections.Counter:
    """`table`'s rows as a bag (row -> how many times), every column in canonical form."""
    columns = [_values(col.combine_chunks()) for col in table.columns]
    return collections.Counter(zip(*columns)) if columns else collections.Counter({(): table.num_rows})


def assert_tables_agree(ours: pa.Table, theirs: pa.Table, what: str) -> None:
    """The same column names in the same order, the same column types (up to layout), the same bag of rows."""
    assert ours.column_names == theirs.column_names, f"{what}: columns {ours.column_names} != {theirs.column_names}"
    types = [(f.name, _type_key(f.type), _type_key(g.type)) for f, g in zip(ours.schema, theirs.schema)]
    assert all(a == b for _, a, b in types), f"{what}: types differ {[t for t in types if t[1] != t[2]]}"
    a, b = canonical_rows(ours), canonical_rows(theirs)
    if a != b:
        only_a, only_b = a - b, b - a
        raise AssertionError(f"{what}: {ours.num_rows} rows against {theirs.num_rows}; only in the first "
                             f"({sum(only_a.values())}): {list(only_a)[:3]}; only in the second "
                             f"({sum(only_b.values())}): {list(only_b)[:3]}")


def checked_table(path: str) -> pa.Table:
    """The Delta table at `path` as delta-rs reads it, after asserting that DuckDB's delta extension (delta-kernel-rs)
    reads the same rows. DuckDB reads the latest version; should a commit land meanwhile, both read the version
    delta-rs saw last."""
    import deltalake

    path = str(path)
    version = deltalake.DeltaTable(path).version()
    theirs = duckdb_table(path)
    table = deltalake.DeltaTable(path)
    if table.version() != version:                      # a commit landed meanwhile: compare at one version
        version = table.version()
        theirs = duckdb_table(path, version)
    ours = table.to_pyarrow_table()
    assert_tables_agree(ours, theirs, f"{path} v{version}: deltalake against DuckDB's delta_scan")
    return ours


def assert_readers_agree(path: str) -> None:
    """DuckDB's delta extension and deltalake read the same rows from the Delta table at `path`."""
    checked_table(path)
