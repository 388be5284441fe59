"""Value decoders of the pure-Python twin, binary send/recv ('b') forms: the twins of the binary value readers of
spockwire/wire/_values.pxi, and the texts of numeric, timetz and "char" values that spockwire.values.sendtext and
the internal layouts share.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from .kinds import ARRAY, BOOL, BYTEA, CHAR, DATE, DECIMAL, ENUM, FLOAT4, FLOAT8, INTERVAL, JSON, JSONB, NUMERIC_TEXT, \
    PGTEXT, TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TIMETZ, UUID, ColumnSpec
from .failures import LOWER_BOUND, MULTIDIMENSIONAL, OUT_OF_RANGE, SPECIAL_DECIMAL
from ._text_py import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UNIX_DAYS_2000, UNIX_US_2000, US_PER_DAY, _BE_INT, \
    _F4, _F8, _I16, _I32, _I64, _U16, _fail, _utf8, decimal_store


# ------------------------------------------------------------------ binary forms
def _numeric_header(raw: bytes) -> tuple[int, int, int, int, list[int]]:
    if len(raw) < 8:
        raise _fail()
    ndigits = _I16.unpack_from(raw, 0)[0]
    weight = _I16.unpack_from(raw, 2)[0]
    sign = _U16.unpack_from(raw, 4)[0]
    dscale = _U16.unpack_from(raw, 6)[0]
    if ndigits < 0 or len(raw) != 8 + 2 * ndigits or sign not in (0, 0x4000, 0xC000, 0xD000, 0xF000) \
            or dscale > 0x3FFF:
        raise _fail()
    digits = [_I16.unpack_from(raw, 8 + 2 * k)[0] for k in range(ndigits)]
    if any(not 0 <= d <= 9999 for d in digits):
        raise _fail()
    return ndigits, weight, sign, dscale, digits


def _binary_decimal(raw: bytes, spec: ColumnSpec) -> Decimal:
    ndigits, weight, sign, _dscale, digits = _numeric_header(raw)
    if sign in (0xC000, 0xD000, 0xF000):
        raise _fail(SPECIAL_DECIMAL)
    n = 0
    for d in digits:
        n = n * 10000 + d
    e10 = 4 * (weight - ndigits + 1) + spec.scale
    if e10 >= 0:
        unscaled = n * 10 ** e10
    else:
        unscaled, rest = divmod(n, 10 ** -e10)
        if rest:
            raise _fail()
    return decimal_store(sign == 0x4000, unscaled, spec)


def numeric_text_from_binary(raw: bytes) -> str:
    """PostgreSQL's numeric_out text of a binary numeric value."""
    ndigits, weight, sign, dscale, digits = _numeric_header(raw)
    if sign == 0xC000:
        return "NaN"
    if sign == 0xD000:
        return "Infinity"
    if sign == 0xF000:
        return "-Infinity"
    out = ["-"] if sign == 0x4000 else []
    if weight < 0:
        out.append("0")
    else:
        head = digits[:min(ndigits, weight + 1)]
        out.append(str(head[0]) if head else "0")
        out.extend(f"{d:04d}" for d in head[1:])
        out.append("0000" * (weight + 1 - max(len(head), 1)))   # groups past the stored digits are zero
    if dscale > 0:
        frac = []
        for j in range((dscale + 3) // 4):
            k = weight + 1 + j
            frac.append(f"{digits[k] if 0 <= k < ndigits else 0:04d}")
        out.append("." + "".join(frac)[:dscale])
    return "".join(out)


def timetz_text(us: int, zone: int) -> str:
    """PostgreSQL's text of a timetz (time in µs, zone in seconds west of UTC)."""
    sec, frac = divmod(us, 1_000_000)
    text = f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
    if frac:
        text += ("." + f"{frac:06d}").rstrip("0")
    tz = -zone
    sign = "-" if tz < 0 else "+"
    tz = abs(tz)
    h, m, s = tz // 3600, tz // 60 % 60, tz % 60
    if s:
        return f"{text}{sign}{h:02d}:{m:02d}:{s:02d}"
    if m:
        return f"{text}{sign}{h:02d}:{m:02d}"
    return f"{text}{sign}{h:02d}"


def _binary_array(raw: bytes, spec: ColumnSpec) -> list[Any]:
    n = len(raw)
    if n < 12:
        raise _fail()
    ndim = _I32.unpack_from(raw, 0)[0]
    flags = _I32.unpack_from(raw, 4)[0]
    if flags not in (0, 1) or ndim < 0:
        raise _fail()
    if ndim == 0:
        if n != 12:
            raise _fail()
        return []
    if ndim > 1:
        raise _fail(MULTIDIMENSIONAL)
    if n < 20:
        raise _fail()
    count = _I32.unpack_from(raw, 12)[0]
    if count < 0 or count > (n - 20) // 4:
        raise _fail()
    pos = 20
    out: list[Any] = []
    elem = spec.element
    for _ in range(count):
        if n - pos < 4:
            raise _fail()
        length = _I32.unpack_from(raw, pos)[0]
        pos += 4
        if length == -1:
            out.append(None)
            continue
        if length < 0 or n - pos < length:
            raise _fail()
        out.append(_binary(elem, raw[pos:pos + length]))
        pos += length
    if pos != n:
        raise _fail()
    if _I32.unpack_from(raw, 16)[0] != 1:
        raise _fail(LOWER_BOUND)
    return out


def char_text(raw: bytes) -> str:
    """PostgreSQL's charout text of a "char" value (one byte in the binary and internal forms)."""
    if len(raw) != 1:
        raise _fail()
    b = raw[0]
    if b >= 0x80:
        return f"\\{b:03o}"
    return chr(b) if b else ""


def _binary(spec: ColumnSpec, raw: bytes) -> Any:
    kind = spec.kind
    n = len(raw)
    if kind in (TEXT, JSON, ENUM):
        return _utf8(raw)
    if kind == CHAR:
        return char_text(raw)
    if kind in _BE_INT:
        if n != _BE_INT[kind].size:
            raise _fail()
        return _BE_INT[kind].unpack(raw)[0]
    if kind == BOOL:
        if n != 1 or raw[0] > 1:
            raise _fail()
        return raw[0] == 1
    if kind == FLOAT4:
        if n != 4:
            raise _fail()
        return _F4.unpack(raw)[0]
    if kind == FLOAT8:
        if n != 8:
            raise _fail()
        return _F8.unpack(raw)[0]
    if kind == DECIMAL:
        return _binary_decimal(raw, spec)
    if kind == NUMERIC_TEXT:
        return numeric_text_from_binary(raw)
    if kind == JSONB:
        if n < 1 or raw[0] != 1:
            raise _fail()
        return _utf8(raw[1:])
    if kind == BYTEA:
        return raw
    if kind == DATE:
        if n != 4:
            raise _fail()
        return _pg_days(_I32.unpack(raw)[0])
    if kind in (TIMESTAMP, TIMESTAMPTZ):
        if n != 8:
            raise _fail()
        return _pg_us(_I64.unpack(raw)[0])
    if kind == TIME:
        if n != 8:
            raise _fail()
        v = _I64.unpack(raw)[0]
        if not 0 <= v <= US_PER_DAY:
            raise _fail()
        return v
    if kind == TIMETZ:
        if n != 12:
            raise _fail()
        us = _I64.unpack_from(raw, 0)[0]
        zone = _I32.unpack_from(raw, 8)[0]
        if not 0 <= us <= US_PER_DAY or not -15 * 3600 - 59 * 60 - 59 <= zone <= 15 * 3600 + 59 * 60 + 59:
            raise _fail()
        return timetz_text(us, zone)
    if kind == INTERVAL:
        if n != 16:
            raise _fail()
        us = _I64.unpack_from(raw, 0)[0]
        days = _I32.unpack_from(raw, 8)[0]
        months = _I32.unpack_from(raw, 12)[0]
        nanos = us * 1000
        if not INT64_MIN <= nanos <= INT64_MAX:
            raise _fail(OUT_OF_RANGE)
        return months, days, nanos
    if kind == UUID:
        if n != 16:
            raise _fail()
        return raw
    if kind == ARRAY:
        return _binary_array(raw, spec)
    if kind == PGTEXT:
        return spec.render(raw)   # spockwire.values.sendtext: PostgreSQL's text output of the send form
    raise _fail()


def _pg_days(days: int) -> int:
    if days in (INT32_MAX, INT32_MIN):
        return days
    v = days + UNIX_DAYS_2000
    if not INT32_MIN < v < INT32_MAX:
        raise _fail(OUT_OF_RANGE)
    return v


def _pg_us(us: int) -> int:
    if us in (INT64_MAX, INT64_MIN):
        return us
    v = us + UNIX_US_2000
    if not INT64_MIN < v < INT64_MAX:
        raise _fail(OUT_OF_RANGE)
    return v


