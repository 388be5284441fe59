"""Spark schemas for decoded changes, and the conversion of decoder Arrow batches into them.

The values catalog (spockwire.values.catalog) decides the Arrow type of each column (raw string/binary, or typed
values: int64, decimal128, timestamp[us, UTC], list<...>, ...); the decoder builds its batches from the same
plan. This module never hard-codes those types: it maps the Arrow schema to the nearest Spark type, and converts
every batch the readers decode to exactly that schema. In the package's one-way flow (data source -> readers ->
this module -> apply) it imports no other module of the package.

Spark has no unsigned integers, no Arrow dictionary columns and no month-day-nano intervals:

| Arrow (decoder) | Spark |
|---|---|
| `_commit_lsn` uint64 | LongType (an LSN is below 2^63) |
| `_xid` uint32, other uint32 (oid) | LongType |
| uint8 / uint16 | ShortType / IntegerType |
| uint64 (table columns) | LongType (a value at or above 2^63 is an error, never wrapped) |
| timestamp[us, tz] / timestamp[us] | TimestampType / TimestampNTZType |
| time64 | StringType (`HH:MM:SS.ffffff`, 24:00:00 included) |
| month_day_nano_interval (also read back from staging) | struct<months: int, days: int, nanoseconds: long> |
| dictionary<_, string> (enums) | StringType |
| decimal256 (precision > 38) | StringType |
| fixed_size_binary (uuid) | BinaryType |
| null (a column seen only as NULL) | StringType |
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..export.arrow import CHANGE_COLUMNS, change_fields
from ..model import Column, Relation

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import DataType, StructField, StructType

__all__ = [
    "CHANGE_COLUMNS", "TABLE_COLUMN", "TRUNCATE", "KEY_METADATA", "spark_type", "spark_fields", "change_schema",
    "spark_schema", "target_arrow_schema", "conform_batch", "table_arrow_schema", "read_table_relation",
    "table_struct_name",
]

#: `_change_type` of the row that stands for a TRUNCATE in Spark change DataFrames (all table columns NULL).
TRUNCATE = "truncate"
#: the column naming the table of each row in the multi-table layout
TABLE_COLUMN = "_table"
#: StructField metadata key marking a replica-identity (key) column
KEY_METADATA = "spockwire.key"

_INTERVAL_FIELDS = (("months", pa.int32()), ("days", pa.int32()), ("nanoseconds", pa.int64()))


# ---------------------------------------------------------------------------------------------------------------
# Arrow -> Spark

#: the schema metadata key of a batch's column description (spockwire.spark.schema_changes): the relation's
#: columns as the upstream described them, ``[[name, type oid or null, type modifier or null, is key], ...]``
COLUMNS_METADATA = b"spockwire.columns"
#: the schema metadata key of a captured ALTER TABLE's row (``_change_type`` ``ddl``): the capture's message
#: (spockwire.connection.ddl_capture)
DDL_METADATA = b"spockwire.ddl"


def _is_view(t: pa.DataType, kind: str) -> bool:
    """string_view / binary_view (pyarrow >= 16; the decoder's strings="view")."""
    return hasattr(pa, "string_view") and t == (pa.string_view() if kind == "string" else pa.binary_view())


def spark_type(arrow_type: pa.DataType) -> "DataType":
    """The Spark type a decoder column of `arrow_type` is read as (see the table in the module docstring)."""
    from pyspark.sql import types as T

    t = arrow_type
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_int8(t):
        return T.ByteType()
    if pa.types.is_int16(t) or pa.types.is_uint8(t):
        return T.ShortType()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return T.IntegerType()
    if pa.types.is_int64(t) or pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return T.LongType()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return T.FloatType()
    if pa.types.is_float64(t):
        return T.DoubleType()
    if pa.types.is_decimal(t):
        if t.precision <= 38:
            return T.DecimalType(t.precision, t.scale)
        return T.StringType()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t) or _is_view(t, "string"):
        return T.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or _is_view(t, "binary"):
        return T.BinaryType()
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pa.types.is_date(t):
        return T.DateType()
    if pa.types.is_time(t):
        return T.StringType()
    if t == pa.month_day_nano_interval():
        return T.StructType([T.StructField(n, spark_type(at)) for n, at in _INTERVAL_FIELDS])
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return T.ArrayType(spark_type(t.value_type), True)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in t])
    if pa.types.is_map(t):
        return T.MapType(spark_type(t.key_type), spark_type(t.item_type), True)
    raise TypeError(f"no Spark type for the Arrow type {t} of a decoded column")


def spark_fields(schema: pa.Schema, key_columns: Iterable[str] = ()) -> list["StructField"]:
    """Spark fields for every column of a decoder Arrow schema; key columns carry `spockwire.key` metadata."""
    from pyspark.sql import types as T

    keys = set(key_columns)
    fields = []
    for f in schema:
        nullable = f.nullable or f.name not in CHANGE_COLUMNS
        meta = {KEY_METADATA: True} if f.name in keys else {}
        fields.append(T.StructField(f.name, spark_type(f.type), nullable, meta))
    return fields


def change_schema() -> "StructType":
    """The change columns alone, as Spark sees them."""
    from pyspark.sql import types as T

    return T.StructType(spark_fields(pa.schema(change_fields())))


def table_struct_name(qualified_name: str) -> str:
    """The column holding one table's values in the multi-table layout: `public.orders` -> `public_orders`."""
    return qualified_name.replace(".", "_")


def spark_schema(tables: Sequence[tuple[Relation, pa.Schema]], *, multi_table: bool = False) -> "StructType":
    """The Spark schema of a change DataFrame.

    One table: the change columns, then the table's columns. Several tables (``multi_table``): the change
    columns, ``_table`` (``namespace.name``), then one struct column per table (named by
    :func:`table_struct_name`) that is set on that table's rows and NULL on every other row.
    """
    from pyspark.sql import types as T

    if not multi_table:
        if len(tables) != 1:
            raise ValueError("a single-table schema needs exactly one table")
        relation, schema = tables[0]
        return T.StructType(spark_fields(schema, _keys(relation)))
    fields = list(change_schema().fields)
    fields.append(T.StructField(TABLE_COLUMN, T.StringType(), False))
    for relation, schema in tables:
        value_fields = [f for f in spark_fields(schema, _keys(relation)) if f.name not in CHANGE_COLUMNS]
        fields.append(T.StructField(table_struct_name(relation.qualified_name), T.StructType(value_fields), True,
                                    {"spockwire.table": relation.qualified_name}))
    return T.StructType(fields)


def _keys(relation: Relation) -> list[str]:
    return [c.name for c in relation.columns if c.is_key]


def target_arrow_schema(schema: "StructType") -> pa.Schema:
    """The Arrow schema Spark expects from a Python data source or `mapInArrow` for `schema`."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------------------------------------------
# converting decoder batches

def _interval_struct(arr: pa.Array) -> pa.Array:
    import numpy as np

    n = len(arr)
    data = arr.buffers()[1]
    raw = np.frombuffer(data, dtype=np.dtype([("m", "<i4"), ("d", "<i4"), ("n", "<i8")]),
                        count=n, offset=arr.offset * 16) if n else np.zeros(0, dtype=[("m", "<i4"), ("d", "<i4"),
                                                                                      ("n", "<i8")])
    mask = arr.is_null() if arr.null_count else None
    return pa.StructArray.from_arrays([pa.array(raw["m"], pa.int32()), pa.array(raw["d"], pa.int32()),
                                       pa.array(raw["n"], pa.int64())],
                                      names=[n for n, _ in _INTERVAL_FIELDS], mask=mask)


def _time_text(arr: pa.Array) -> pa.Array:
    """time64 values as ``HH:MM:SS.ffffff``, 24:00:00 (a valid PostgreSQL time) included — a plain cast would
    give ``<value out of range: 86400000000>`` for it."""
    us = arr.cast(pa.int64())
    if arr.type.unit == "ns":
        us = pc.divide(us, 1000)
    parts = []
    rest = us
    for unit in (3_600_000_000, 60_000_000, 1_000_000):
        whole = pc.divide(rest, unit)
        rest = pc.subtract(rest, pc.multiply(whole, unit))
        parts.append(pc.utf8_lpad(pc.cast(whole, pa.string()), 2, "0"))
    clock = pc.binary_join_element_wise(*parts, ":")
    return pc.binary_join_element_wise(clock, pc.utf8_lpad(pc.cast(rest, pa.string()), 6, "0"), ".")


def conform_array(arr: pa.Array, target: pa.DataType, name: str = "?") -> pa.Array:
    """`arr` (as the decoder made it) converted to the Arrow type Spark expects for its column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    src = arr.type
    if src == target:
        return arr
    if pa.types.is_null(src):
        return pa.nulls(len(arr), target)
    if pa.types.is_dictionary(src):
        return conform_array(arr.dictionary_decode(), target, name)
    if _is_view(src, "string") or _is_view(src, "binary"):
        return conform_array(arr.cast(pa.string() if _is_view(src, "string") else pa.binary()), target, name)
    if src == pa.month_day_nano_interval() and pa.types.is_struct(target):
        return _interval_struct(arr)
    if (pa.types.is_list(src) or pa.types.is_large_list(src)) and pa.types.is_list(target):
        values = conform_array(arr.values, target.value_type, name)
        mask = arr.is_null() if arr.null_count else None
        return pa.ListArray.from_arrays(arr.offsets.cast(pa.int32()), values, mask=mask).cast(target)
    if pa.types.is_struct(src) and pa.types.is_struct(target):
        children = []
        for f in target:
            idx = src.get_field_index(f.name)
            child = arr.field(idx) if idx >= 0 else pa.nulls(len(arr), f.type)
            children.append(conform_array(child, f.type, f"{name}.{f.name}"))
        return pa.StructArray.from_arrays(children, fields=list(target), mask=arr.is_null() if arr.null_count
                                          else None)
    if pa.types.is_unsigned_integer(src) and pa.types.is_integer(target):
        try:
            return pc.cast(arr, target, safe=True)
        except pa.ArrowInvalid as exc:
            raise OverflowError(f"column {name!r}: a {src} value does not fit Spark's signed {target}") from exc
    if pa.types.is_time64(src) and pa.types.is_string(target):
        return _time_text(arr)
    if pa.types.is_string(target) and (pa.types.is_list(src) or pa.types.is_large_list(src)
                                       or pa.types.is_decimal(src) or pa.types.is_floating(src)
                                       or pa.types.is_boolean(src)):
        # a column typed in one schema version and text in a later one: PostgreSQL's text of each value
        from ..export.pg_text import NotRenderable, pg_text

        try:
            return pg_text(arr)
        except NotRenderable as exc:
            raise TypeError(f"column {name!r}: cannot write the decoder's {src} as PostgreSQL's text: {exc}") from exc
    if (pa.types.is_date32(src) or pa.types.is_timestamp(src)) and pa.types.is_string(target):
        # a column staged as a date / timestamp in one schema version and as text in a later one: PostgreSQL's
        # text of each value (infinity, BC, after 9999 included), never pyarrow's ISO cast of the raw number
        from ..export.python import date_text, timestamp_text

        if pa.types.is_date32(src):
            texts = [None if v is None else date_text(v) for v in arr.cast(pa.int32()).to_pylist()]
        else:
            with_tz = src.tz is not None
            texts = [None if v is None else timestamp_text(v, with_tz) for v in arr.cast(pa.int64()).to_pylist()]
        return pa.array(texts, pa.string())
    if (pa.types.is_binary(src) or pa.types.is_large_binary(src)) and pa.types.is_string(target):
        try:
            return pc.cast(arr, target, safe=True)
        except pa.ArrowInvalid as exc:
            raise ValueError(f"column {name!r} holds bytes that are not UTF-8 text where the schema expects a "
                             "string: read it with binary=false or typed values") from exc
    try:
        return pc.cast(arr, target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TypeError(f"column {name!r}: cannot convert the decoder's {src} to Spark's {target}: {exc}") from exc


def conform_batch(batch: pa.RecordBatch, target: pa.Schema, *,
                  extra: dict[str, Callable[[int], pa.Array]] | None = None) -> pa.RecordBatch:
    """`batch` with exactly the columns (by name) and types of `target`.

    A column missing from `batch` becomes NULL (a column added upstream after the query started is not read);
    `extra` builds columns that are not in the decoder output (called with the row count).
    """
    n = batch.num_rows
    arrays = []
    names = batch.schema.names
    for f in target:
        if extra and f.name in extra:
            arrays.append(extra[f.name](n))
        elif f.name in names:
            arrays.append(conform_array(batch.column(names.index(f.name)), f.type, f.name))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


# ---------------------------------------------------------------------------------------------------------------
# the decoder's schema for a table, before any row arrived

def table_arrow_schema(relation: Relation, catalog: Any = None, *, typed: bool = True, binary: bool = False,
                       column_types: Any = None) -> pa.Schema:
    """The Arrow schema the decoder gives `relation`'s rows: the values catalog's types
    (``spockwire.values.catalog.arrow_schema``, the one mapping of PostgreSQL types to Arrow types), with the
    decoder's options (`typed`: typed values or raw; `binary`: raw columns of a binary stream are binary;
    `column_types`: per-column overrides)."""
    from ..values.catalog import arrow_schema

    return arrow_schema(relation, catalog, typed=typed, binary=binary, column_types=column_types)


# ---------------------------------------------------------------------------------------------------------------
# the upstream catalog

def split_table_name(qualified: str) -> tuple[str, str]:
    """`public.orders` -> ("public", "orders"); a bare name is in `public`. Quotes are not interpreted."""
    if "." in qualified:
        nsp, name = qualified.split(".", 1)
    else:
        nsp, name = "public", qualified
    return nsp.strip('"'), name.strip('"')


def read_table_relation(cur: Any, qualified: str, protocol: str = "pgoutput") -> Relation:
    """The table as the upstream will describe it in a Relation message: replicated columns in order, their
    types and which are replica-identity key columns (all of them under REPLICA IDENTITY FULL, as pgoutput
    flags them).

    Dropped columns are left out; generated columns too, except for pglogical, which sends them.
    """
    nsp, name = split_table_name(qualified)
    cur.execute("SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (nsp, name))
    row = cur.fetchone()
    if row is None:
        raise ValueError(f"table {nsp}.{name} does not exist upstream")
    relid, ident = int(row[0]), row[1]
    if isinstance(ident, bytes):
        ident = ident.decode()
    cur.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attgenerated <> '' AS generated, "
        "       coalesce(a.attnum = ANY (i.indkey::int2[]), false) AS is_key "
        "  FROM pg_attribute a "
        "  LEFT JOIN LATERAL (SELECT x.indkey FROM pg_index x WHERE x.indrelid = a.attrelid AND "
        "       ((%s = 'd' AND x.indisprimary) OR (%s = 'i' AND x.indisreplident)) LIMIT 1) i ON true "
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (ident, ident, relid))
    columns = []
    for attname, typoid, typmod, generated, is_key in cur.fetchall():
        if generated and protocol != "pglogical":
            continue
        columns.append(Column(attname, int(typoid), int(typmod), bool(is_key) or ident == "f"))
    if not columns:
        raise ValueError(f"table {nsp}.{name} has no replicated columns")
    return Relation(relid, nsp, name, tuple(columns), ident, 1)
