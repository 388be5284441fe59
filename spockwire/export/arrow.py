"""Assembling Arrow record batches from decoder column data.

Both decoder implementations end a batch here: the Cython hot path hands over its preallocated buffers (validity
bitmap, offsets, data) and they are wrapped without copying; the pure-Python twin hands over Python lists.
"""
from __future__ import annotations

from array import array
from typing import Any, Sequence

import pyarrow as pa

from ..model import CHANGE_TYPES, Relation

__all__ = ["CHANGE_COLUMNS", "change_fields", "change_type_scalar", "python_column", "repeated", "int64_sequence",
           "schema_metadata", "finish_batch"]

CHANGE_COLUMNS = ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast")
_TS = pa.timestamp("us", tz="UTC")


def python_column(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """A string, 64-bit integer or boolean array of Python values (None is null), built from its buffers: `pa.array`
    of a list imports pandas, about 50 MB in every process that does it (Spark's decoding workers among them)."""
    n = len(values)
    valid = bytearray((n + 7) // 8)
    nulls = 0
    for i, v in enumerate(values):
        if v is None:
            nulls += 1
        else:
            valid[i >> 3] |= 1 << (i & 7)
    bitmap = pa.py_buffer(bytes(valid)) if nulls else None
    if pa.types.is_int64(type):
        data = array("q", [0 if v is None else v for v in values])
        return pa.Array.from_buffers(type, n, [bitmap, pa.py_buffer(data)], null_count=nulls)
    if pa.types.is_boolean(type):
        bits = bytearray((n + 7) // 8)
        for i, v in enumerate(values):
            if v:
                bits[i >> 3] |= 1 << (i & 7)
        return pa.Array.from_buffers(type, n, [bitmap, pa.py_buffer(bytes(bits))], null_count=nulls)
    if not pa.types.is_string(type):
        raise TypeError(f"python_column builds string, int64 and boolean arrays, not {type}")
    encoded = [b"" if v is None else v.encode() for v in values]
    offsets = array("i", [0])
    for item in encoded:
        offsets.append(offsets[-1] + len(item))
    return pa.Array.from_buffers(type, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


def repeated(value: Any, n: int, type: pa.DataType) -> pa.Array:
    """`value` `n` times as an array of `type` (None: `n` nulls), built from its buffers as `python_column` is:
    a string, or an integer of a fixed-width type (for a timestamp type, in its unit since the epoch)."""
    import numpy as np

    if value is None:
        return pa.nulls(n, type)
    if pa.types.is_string(type):
        item = value.encode()
        offsets = np.arange(n + 1, dtype=np.int32) * len(item)
        return pa.Array.from_buffers(type, n, [None, pa.py_buffer(offsets), pa.py_buffer(item * n)])
    if not (pa.types.is_integer(type) or pa.types.is_timestamp(type)):
        raise TypeError(f"repeated builds string, integer and timestamp arrays, not {type}")
    dtype = np.dtype(("u" if pa.types.is_unsigned_integer(type) else "i") + str(type.bit_width // 8))
    return pa.Array.from_buffers(type, n, [None, pa.py_buffer(np.full(n, value, dtype=dtype))])


def int64_sequence(start: int, n: int) -> pa.Array:
    """``start, start + 1, ...`` (`n` values) as an int64 array, built from its buffer (`pa.array` of a numpy array
    also imports pandas)."""
    import numpy as np

    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.arange(start, start + n, dtype=np.int64))])


_CHANGE_TYPE_NAMES = python_column(CHANGE_TYPES, pa.string())


def change_type_scalar(name: str) -> pa.Scalar:
    """`name` (one of CHANGE_TYPES) as an Arrow string scalar, for comparisons that convert no Python value."""
    return _CHANGE_TYPE_NAMES[CHANGE_TYPES.index(name)]


def change_fields() -> list[pa.Field]:
    """The change columns that precede a table's columns in every batch."""
    return [
        pa.field("_change_type", pa.string(), nullable=False),
        pa.field("_commit_lsn", pa.uint64(), nullable=False),
        pa.field("_commit_ts", _TS, nullable=False),
        pa.field("_xid", pa.uint32()),   # null only in snapshot rows (docs/staging.md)
        pa.field("_seq", pa.int64(), nullable=False),
        pa.field("_origin", pa.string()),
        pa.field("_unchanged_toast", pa.list_(pa.string())),
    ]


def schema_metadata(relation: Relation) -> dict[bytes, bytes]:
    return {
        b"spockwire.relation": relation.qualified_name.encode(),
        b"spockwire.relid": str(relation.relid).encode(),
        b"spockwire.relation_version": str(relation.version).encode(),
    }


def finish_batch(relation: Relation, change_type_codes: pa.Array, commit_lsn: pa.Array, commit_ts: pa.Array,
                 xid: pa.Array, seq: pa.Array, origin: pa.Array, toast_offsets: pa.Array | None,
                 toast_indices: pa.Array | None, toast_mask: pa.Array | None,
                 values: Sequence[pa.Array]) -> pa.RecordBatch:
    """One record batch: change columns built from compact per-row arrays, then the value arrays.

    `change_type_codes` is int8 indices into CHANGE_TYPES; `_unchanged_toast` comes as list offsets, uint16
    column indices and a null mask (True = the row has no unchanged-TOAST column), or all None when no row has one.
    """
    n = len(change_type_codes)
    change_type = _CHANGE_TYPE_NAMES.take(change_type_codes)
    if toast_offsets is None:
        toast = pa.nulls(n, pa.list_(pa.string()))
    else:
        names = pa.array(relation.column_names, pa.string())
        toast = pa.ListArray.from_arrays(toast_offsets, names.take(toast_indices), mask=toast_mask)
    arrays = [change_type, commit_lsn, commit_ts.cast(_TS) if commit_ts.type != _TS else commit_ts,
              xid, seq, origin, toast, *values]
    fields = change_fields()
    for column, array in zip(relation.columns, values):
        fields.append(pa.field(column.name, array.type))
    schema = pa.schema(fields, metadata=schema_metadata(relation))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
