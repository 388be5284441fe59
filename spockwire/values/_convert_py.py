"""Value decoders of the pure-Python twin: text ('t'), binary send/recv ('b') and internal ('i') forms to the
storage values of each kind, and the Arrow arrays built from them.

Storage values: bool, int (integers, OID, date as days since 1970, timestamp/time as µs), float, Decimal, str,
bytes, (months, days, nanoseconds) for intervals, lists for arrays, None for NULL. Every rule here has a twin in
spockwire/wire/_values.pxi; both accept and refuse exactly the same bytes.

This module reads internal forms, dispatches a value on its format and builds the arrays; the text forms are read
by spockwire.values._text_py (with the constants the kernels share), the binary forms by
spockwire.values._binary_py. Their public names are all importable from here.
"""
from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from .kinds import ARRAY, BOOL, BYTEA, CHAR, DATE, DECIMAL, ENUM, FLOAT4, FLOAT8, INT2, INT4, INT8, INTERVAL, JSON, \
    JSONB, NUMERIC_TEXT, OID, OTHER, PGTEXT, RAW, TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TIMETZ, UUID, ColumnSpec
from .failures import BYTE_ORDER_UNKNOWN, INTERNAL_UNSUPPORTED, ValueFailure
from . import internal as _internal_layouts
from .internal_types import ACLITEM_OID, JSONB_OID, aclitem_fields, numeric_send, swap_fields
from ._text_py import B, I, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, T, UNIX_DAYS_2000, UNIX_US_2000, US_PER_DAY, \
    _fail, days_from_civil, text_value
from ._binary_py import _binary, _pg_days, _pg_us, char_text, numeric_text_from_binary, timetz_text

__all__ = ["ValueFailure", "decode_value", "text_value", "build_array", "numeric_text_from_binary", "timetz_text",
           "char_text", "days_from_civil", "RAW", "OTHER", "T", "B", "I", "UNIX_DAYS_2000", "UNIX_US_2000",
           "US_PER_DAY", "INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX"]


_INTERNAL_STRUCTS = {BOOL: "?", INT2: "h", INT4: "i", INT8: "q", OID: "I", FLOAT4: "f", FLOAT8: "d", DATE: "i",
                     TIMESTAMP: "q", TIMESTAMPTZ: "q", TIME: "q"}


def _varlena(raw: bytes, big_endian: bool) -> bytes:
    """The data of a varlena datum (spockwire.values.internal), a refusal as a ValueFailure of its code."""
    try:
        return _internal_layouts.unpack_varlena(raw, big_endian)
    except _internal_layouts.DatumFailure as failure:
        raise _fail(failure.code) from None


def _internal_text(spec: ColumnSpec, raw: bytes, big_endian: bool | None) -> str:
    """A column kept as text (PGTEXT) given an internal datum: PostgreSQL's text of it, through its send form."""
    oid = spec.type_oid
    fields = _internal_layouts.FIXED_FIELDS.get(oid)
    known = fields is not None or oid in _internal_layouts.VARLENA_TEXT_TYPES \
        or oid in _internal_layouts.VARLENA_CONVERTED or oid == ACLITEM_OID
    if not known or oid == 19 or spec.render is None:
        raise _fail(INTERNAL_UNSUPPORTED)
    if big_endian is None and (fields is None or any(size != 1 for size in fields)):
        raise _fail(BYTE_ORDER_UNKNOWN)
    if oid == ACLITEM_OID:
        return spec.render(aclitem_fields(raw, big_endian))
    if fields is not None:
        return spec.render(swap_fields(raw, fields, bool(big_endian)))
    data = _varlena(raw, bool(big_endian))
    if oid in _internal_layouts.VARLENA_TEXT_TYPES:
        return spec.render(data)
    return spec.render(_internal_layouts.converted_send_form(oid, data, bool(big_endian)))


def _internal(spec: ColumnSpec, raw: bytes, big_endian: bool | None) -> Any:
    kind = spec.kind
    if kind == PGTEXT:
        return _internal_text(spec, raw, big_endian)
    if kind == UUID:
        if len(raw) != 16:
            raise _fail()
        return raw
    if kind == CHAR:
        return char_text(raw)
    if kind in (TEXT, JSON, JSONB, BYTEA, DECIMAL, NUMERIC_TEXT, INTERVAL, TIMETZ):
        if big_endian is None:
            raise _fail(BYTE_ORDER_UNKNOWN)
        if kind == INTERVAL:
            return _binary(spec, swap_fields(raw, (8, 4, 4), big_endian))
        if kind == TIMETZ:
            return _binary(spec, swap_fields(raw, (8, 4), big_endian))
        data = _varlena(raw, big_endian)
        if kind in (DECIMAL, NUMERIC_TEXT):
            return _binary(spec, numeric_send(data, big_endian))
        if kind == JSONB:
            return _binary(spec, _internal_layouts.converted_send_form(JSONB_OID, data, big_endian))
        return _binary(spec, data)
    code = _INTERNAL_STRUCTS.get(kind)
    if code is None:
        raise _fail(INTERNAL_UNSUPPORTED)
    if big_endian is None:
        raise _fail(BYTE_ORDER_UNKNOWN)
    st = struct.Struct((">" if big_endian else "<") + code)
    if len(raw) != st.size:
        raise _fail()
    if kind == BOOL:
        if raw[0] > 1:
            raise _fail()
        return raw[0] == 1
    v = st.unpack(raw)[0]
    if kind == DATE:
        return _pg_days(v)
    if kind in (TIMESTAMP, TIMESTAMPTZ):
        return _pg_us(v)
    if kind == TIME and not 0 <= v <= US_PER_DAY:
        raise _fail()
    return v


def decode_value(spec: ColumnSpec, fmt: int, raw: bytes, big_endian: bool | None) -> Any:
    """The storage value of one non-NULL value of a typed column (raises ValueFailure)."""
    if fmt == I:
        return _internal(spec, raw, big_endian)
    if fmt == B:
        return _binary(spec, raw)
    return text_value(spec, raw)


_STORAGE = {DATE: pa.int32(), TIMESTAMP: pa.int64(), TIMESTAMPTZ: pa.int64(), TIME: pa.int64()}


def build_array(spec: ColumnSpec, values: list[Any]) -> pa.Array:
    """An Arrow array of a typed column from its storage values."""
    kind = spec.kind
    if kind == ARRAY:
        offsets = [0]
        flat: list[Any] = []
        mask = []
        for v in values:
            if v is not None:
                flat.extend(v)
            offsets.append(len(flat))
            mask.append(v is None)
        child = build_array(spec.element, flat)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), child,
                                        mask=pa.array(mask, pa.bool_()) if any(mask) else None)
    if kind in _STORAGE:
        return pa.array(values, _STORAGE[kind]).view(spec.arrow_type)
    if kind == ENUM:
        return pa.array(values, pa.string()).dictionary_encode()
    return pa.array(values, spec.arrow_type)

