"""The Parquet form of decoded Arrow types that Parquet cannot hold, and their exact restoration.

Every Arrow type the decoder produces is written to Parquet as it is, except ``month_day_nano_interval`` (no Parquet
mapping), also inside lists. It is stored as

    struct<months: int32 not null, days: int32 not null, nanoseconds: int64 not null>

on a field carrying the metadata ``spockwire.arrow_type = month_day_nano_interval``; a NULL interval is a NULL
struct. `restore_table` turns every field with that metadata back into ``month_day_nano_interval`` with the same
three numbers, so `read_staging` returns exactly the Arrow arrays the decoder produced (docs/staging.md, "Column
types"). Any Parquet reader sees the struct; the three numbers are PostgreSQL's own interval fields.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ARROW_TYPE_KEY", "INTERVAL_STRUCT", "stored_type", "store_batch", "restore_table", "restore_batch",
           "restore_schema"]

#: Field metadata key naming the decoder's Arrow type of a field stored in another form.
ARROW_TYPE_KEY = b"spockwire.arrow_type"
_MDN = pa.month_day_nano_interval()
_MDN_NAME = b"month_day_nano_interval"
INTERVAL_STRUCT = pa.struct([pa.field("months", pa.int32(), nullable=False),
                             pa.field("days", pa.int32(), nullable=False),
                             pa.field("nanoseconds", pa.int64(), nullable=False)])
_RECORD = np.dtype([("m", "<i4"), ("d", "<i4"), ("n", "<i8")])


def _needs_store(t: pa.DataType) -> bool:
    if t == _MDN:
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _needs_store(t.value_type)
    if pa.types.is_struct(t):
        return any(_needs_store(f.type) for f in t)
    return False


def _store_field(f: pa.Field) -> pa.Field:
    t = f.type
    if t == _MDN:
        meta = dict(f.metadata or {})
        meta[ARROW_TYPE_KEY] = _MDN_NAME
        return pa.field(f.name, INTERVAL_STRUCT, f.nullable, meta)
    return f.with_type(stored_type(t))


def stored_type(t: pa.DataType) -> pa.DataType:
    """The type a decoder column of type `t` has in Parquet (`t` itself unless it holds an interval)."""
    if not _needs_store(t):
        return t
    if t == _MDN:
        return INTERVAL_STRUCT
    if pa.types.is_list(t):
        return pa.list_(_store_field(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_store_field(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_store_field(t.value_field), t.list_size)
    return pa.struct([_store_field(f) for f in t])


def _validity(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _list_parts(arr: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Offsets starting at 0 and the values they index, for a (possibly sliced) list array."""
    offsets = arr.offsets
    first = offsets[0].as_py()
    if first == 0 and arr.offset == 0:
        return offsets, arr.values
    last = offsets[len(offsets) - 1].as_py()
    rebased = pc.subtract(offsets, pa.scalar(first, offsets.type))
    return rebased, arr.values.slice(first, last - first)


def _store_array(arr: pa.Array, target: pa.DataType) -> pa.Array:
    src = arr.type
    if src == target:
        return arr
    if src == _MDN:
        n = len(arr)
        if n:
            raw = np.frombuffer(arr.buffers()[1], dtype=_RECORD, count=n, offset=arr.offset * _RECORD.itemsize)
        else:
            raw = np.zeros(0, dtype=_RECORD)
        children = [pa.array(raw["m"], pa.int32()), pa.array(raw["d"], pa.int32()), pa.array(raw["n"], pa.int64())]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_validity(arr))
    if pa.types.is_list(src) or pa.types.is_large_list(src):
        offsets, values = _list_parts(arr)
        cls = pa.ListArray if pa.types.is_list(src) else pa.LargeListArray
        return cls.from_arrays(offsets, _store_array(values, target.value_type), type=target, mask=_validity(arr))
    if pa.types.is_fixed_size_list(src):
        flat = arr.values.slice(arr.offset * src.list_size, len(arr) * src.list_size)
        return pa.FixedSizeListArray.from_arrays(_store_array(flat, target.value_type), type=target,
                                                 mask=_validity(arr))
    children = [_store_array(arr.field(i), f.type) for i, f in enumerate(target)]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_validity(arr))


def store_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with every interval (also inside lists) in its stored form; the same batch when it has none."""
    if not any(_needs_store(f.type) for f in batch.schema):
        return batch
    fields, arrays = [], []
    for i, f in enumerate(batch.schema):
        if _needs_store(f.type):
            sf = _store_field(f)
            arrays.append(_store_array(batch.column(i), sf.type))
            fields.append(sf)
        else:
            arrays.append(batch.column(i))
            fields.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=batch.schema.metadata))


# ------------------------------------------------------------------------------------------------ restoring

def _is_stored_interval(f: pa.Field) -> bool:
    return bool(f.metadata) and f.metadata.get(ARROW_TYPE_KEY) == _MDN_NAME and pa.types.is_struct(f.type)


def _needs_restore(f: pa.Field) -> bool:
    if _is_stored_interval(f):
        return True
    t = f.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _needs_restore(t.value_field)
    if pa.types.is_struct(t):
        return any(_needs_restore(c) for c in t)
    return False


def _restored_field(f: pa.Field) -> pa.Field:
    if _is_stored_interval(f):
        meta = {k: v for k, v in f.metadata.items() if k != ARROW_TYPE_KEY}
        return pa.field(f.name, _MDN, f.nullable, meta or None)
    t = f.type
    if pa.types.is_list(t):
        return f.with_type(pa.list_(_restored_field(t.value_field)))
    if pa.types.is_large_list(t):
        return f.with_type(pa.large_list(_restored_field(t.value_field)))
    if pa.types.is_fixed_size_list(t):
        return f.with_type(pa.list_(_restored_field(t.value_field), t.list_size))
    if pa.types.is_struct(t):
        return f.with_type(pa.struct([_restored_field(c) for c in t]))
    return f


def restore_schema(schema: pa.Schema) -> pa.Schema:
    """The decoder's schema of a staged file's schema (intervals back to month_day_nano_interval)."""
    if not any(_needs_restore(f) for f in schema):
        return schema
    return pa.schema([_restored_field(f) if _needs_restore(f) else f for f in schema], metadata=schema.metadata)


def _restore_array(arr: pa.Array, stored: pa.Field, target: pa.Field) -> pa.Array:
    if stored.type == target.type and not _needs_restore(stored):
        return arr
    if _is_stored_interval(stored):
        n = len(arr)
        raw = np.zeros(n, dtype=_RECORD)
        for key, name in (("m", "months"), ("d", "days"), ("n", "nanoseconds")):
            child = arr.field(name)
            if child.null_count:
                child = child.fill_null(0)
            raw[key] = child.to_numpy(zero_copy_only=False)
        valid = arr.is_valid().buffers()[1] if arr.null_count else None
        return pa.Array.from_buffers(_MDN, n, [valid, pa.py_buffer(raw.tobytes())], null_count=arr.null_count)
    t = stored.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets, values = _list_parts(arr)
        values = _restore_array(values, t.value_field, target.type.value_field)
        cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return cls.from_arrays(offsets, values, type=target.type, mask=_validity(arr))
    if pa.types.is_fixed_size_list(t):
        flat = arr.values.slice(arr.offset * t.list_size, len(arr) * t.list_size)
        return pa.FixedSizeListArray.from_arrays(_restore_array(flat, t.value_field, target.type.value_field),
                                                 type=target.type, mask=_validity(arr))
    children = [_restore_array(arr.field(i), c, tc) for i, (c, tc) in enumerate(zip(t, target.type))]
    return pa.StructArray.from_arrays(children, fields=list(target.type), mask=_validity(arr))


def restore_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch read from a staged file with the decoder's types again (see the module description)."""
    schema = restore_schema(batch.schema)
    if schema is batch.schema:
        return batch
    arrays = [_restore_array(batch.column(i), f, t) for i, (f, t) in enumerate(zip(batch.schema, schema))]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def restore_table(table: pa.Table) -> pa.Table:
    """A table read from a staged file with the decoder's types again (see the module description)."""
    schema = restore_schema(table.schema)
    if schema is table.schema:
        return table
    columns = []
    for i, (f, t) in enumerate(zip(table.schema, schema)):
        col = table.column(i)
        if f.type == t.type and not _needs_restore(f):
            columns.append(col)
        else:
            columns.append(pa.chunked_array([_restore_array(c, f, t) for c in col.chunks], t.type))
    return pa.Table.from_arrays(columns, schema=schema)
