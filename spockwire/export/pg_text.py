"""PostgreSQL's text of typed Arrow values: what ``value::text`` prints on the server, for the column types a
stored column may have to become text in (a column the decoder switched to text, spockwire.values.catalog:
arrays, numerics, dates and timestamps).

Exact for integers, booleans, numeric(p,s) (decimal128: the declared scale's digits, as PostgreSQL prints a
numeric with a type modifier), float4 and float8 (the shortest text that reads back the same value, in PostgreSQL's
own layout: an exponent below 1e-4 and from 1e15, or 1e6 for float4, up), text, dates and timestamps (±infinity
and BC included; timestamptz in UTC, ``+00``), and one-dimensional arrays of these (PostgreSQL's quoting).
Anything else raises :class:`NotRenderable`: the caller reads the values from the server instead.
"""
from __future__ import annotations

import math
import struct
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

import pyarrow as pa

from ..python_objects import date_text, timestamp_text

__all__ = ["NotRenderable", "pg_text", "float_text"]


class NotRenderable(TypeError):
    """An Arrow type whose PostgreSQL text this module does not render exactly."""


def float_text(value: float, single: bool = False) -> str:
    """float8's (`single`: float4's) output: the shortest digits strictly inside the value's rounding interval
    (PostgreSQL's Ryu never takes a digit string on the interval's edge), fixed below 10**15 (float4: 10**6) and
    from 1e-4, else ``d.ddde+XX``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, mantissa, exponent = Decimal(_shortest(value, single)).as_tuple()
    text = "".join(map(str, mantissa)).rstrip("0") or "0"
    point = len(mantissa) + int(exponent)          # where the decimal point goes, counted from the first digit
    limit = 6 if single else 15
    minus = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= limit:
        body = text[0] + ("." + text[1:] if len(text) > 1 else "")
        e = point - 1
        return f"{minus}{body}e{'-' if e < 0 else '+'}{abs(e):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{minus}{text}{'0' * (point - len(text))}"
    return f"{minus}{text[:point]}.{text[point:]}"


def _float32_neighbours(value: float) -> tuple[float, float]:
    """The float4 values next below and above the float4 `value` (not zero)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    magnitude, negative = bits & 0x7FFFFFFF, bool(bits & 0x80000000)

    def as_float(m: int) -> float:
        v = struct.unpack("<f", struct.pack("<I", m))[0]
        return -v if negative else v

    smaller, larger = as_float(magnitude - 1), as_float(magnitude + 1)
    return (larger, smaller) if negative else (smaller, larger)


def _shortest(value: float, single: bool) -> str:
    """The fewest significant digits, correctly rounded, that lie strictly between the midpoints to the value's
    neighbours (so read back as the value however ties are rounded)."""
    exact = Fraction(value)
    if single:
        below, above = _float32_neighbours(value)
    else:
        below, above = math.nextafter(value, -math.inf), math.nextafter(value, math.inf)
    # past the largest finite value, the interval is as wide as on the other side
    low = (exact + Fraction(below)) / 2 if math.isfinite(below) else exact - (Fraction(above) - exact) / 2
    high = (exact + Fraction(above)) / 2 if math.isfinite(above) else exact + (exact - Fraction(below)) / 2
    # Python's repr is the shortest that reads back (an edge allowed): never longer than the strict one
    digits = 1 if single else len(repr(value).lstrip("-").split("e")[0].replace(".", "").strip("0"))
    for precision in range(max(digits - 1, 0), 17):
        text = f"{value:.{precision}e}"
        if low < Fraction(Decimal(text)) < high:
            return text
    return f"{value:.16e}"


def _needs_quotes(text: str) -> bool:
    return (text == "" or text.upper() == "NULL"
            or any(ch in '{}",\\' or ch.isspace() for ch in text))


def _array_element(text: str) -> str:
    if not _needs_quotes(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar_renderer(t: pa.DataType) -> Callable[[Any], str]:
    """The text of one non-null Python value of Arrow type `t` (as ``to_pylist`` gives it, raw numbers for dates
    and timestamps)."""
    if pa.types.is_boolean(t):
        return lambda v: "t" if v else "f"
    if pa.types.is_integer(t):
        return str
    if pa.types.is_floating(t):
        single = t == pa.float32()
        return lambda v: float_text(v, single)
    if pa.types.is_decimal(t):
        return lambda v: format(v, "f")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: v
    if pa.types.is_date32(t):
        return date_text
    if pa.types.is_timestamp(t) and t.unit == "us":
        with_tz = t.tz is not None
        return lambda v: timestamp_text(v, with_tz)
    raise NotRenderable(f"PostgreSQL's text of Arrow {t} values is not rendered here")


def _raw(arr: pa.Array) -> pa.Array:
    """Dates and timestamps as their raw numbers (Python's date types cannot hold ±infinity or BC)."""
    t = arr.type
    if pa.types.is_date32(t):
        return arr.cast(pa.int32())
    if pa.types.is_timestamp(t):
        return arr.cast(pa.int64())
    return arr


def pg_text(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """PostgreSQL's text of every value of `arr` (NULL stays NULL), as a string array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _scalar_renderer(t.value_type)
        items = _raw(arr.values).to_pylist()
        offsets = arr.offsets.to_pylist()
        valid = arr.is_valid().to_pylist()
        out = []
        for i, ok in enumerate(valid):
            if not ok:
                out.append(None)
                continue
            parts = ["NULL" if v is None else _array_element(element(v)) for v in items[offsets[i]:offsets[i + 1]]]
            out.append("{" + ",".join(parts) + "}")
        return pa.array(out, pa.string())
    render = _scalar_renderer(t)
    return pa.array([None if v is None else render(v) for v in _raw(arr).to_pylist()], pa.string())
