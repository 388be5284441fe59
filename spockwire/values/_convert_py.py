"""Value decoders of the pure-Python twin: text ('t'), binary send/recv ('b') and internal ('i') forms to the
storage values of each kind, and the Arrow arrays built from them.

Storage values: bool, int (integers, OID, date as days since 1970, timestamp/time as µs), float, Decimal, str,
bytes, (months, days, nanoseconds) for intervals, lists for arrays, None for NULL. Every rule here has a twin in
spockwire/wire/_values.pxi; both accept and refuse exactly the same bytes.
"""
from __future__ import annotations

import binascii
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa

from .catalog import ARRAY, BOOL, BYTEA, CHAR, DATE, DECIMAL, ENUM, FLOAT4, FLOAT8, INT2, INT4, INT8, INTERVAL, JSON, \
    JSONB, NUMERIC_TEXT, OID, OTHER, PGTEXT, RAW, TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TIMETZ, UUID, ColumnSpec
from .failures import BYTE_ORDER_UNKNOWN, INTERNAL_UNSUPPORTED, INVALID, INVALID_UTF8, LOWER_BOUND, MULTIDIMENSIONAL, \
    OUT_OF_RANGE, SPECIAL_DECIMAL
from . import internal as _internal_layouts

__all__ = ["ValueFailure", "decode_value", "build_array", "UNIX_DAYS_2000", "UNIX_US_2000"]

UNIX_DAYS_2000 = 10957
UNIX_US_2000 = 946_684_800_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
US_PER_DAY = 86_400_000_000

T, B, I = 0x74, 0x62, 0x69


class ValueFailure(Exception):
    """A value could not be decoded; `code` is one of spockwire.values.failures."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _fail(code: int = INVALID) -> ValueFailure:
    return ValueFailure(code)


# Byte scanners for the text forms, the twin of the C kernels' character loops (spockwire/wire/_values.pxi): each
# accepts exactly the bytes its kernel accepts and returns the fields it found, or None.
_DIGITS = b"0123456789"
_HEX_OR_DASH = b"0123456789abcdefABCDEF-"


def _digits(raw: bytes, i: int) -> int:
    """The end of the run of ASCII digits that starts at `i`."""
    return len(raw) - len(raw[i:].lstrip(_DIGITS)) if i < len(raw) else i


def _fixed_digits(raw: bytes, i: int, count: int) -> bytes | None:
    """`count` digits at `i`, or None."""
    part = raw[i:i + count]
    return part if len(part) == count and part.isdigit() else None


def _scan_int(raw: bytes) -> bool:
    """-?[0-9]+"""
    return (raw[1:] if raw[:1] == b"-" else raw).isdigit()


def _scan_float(raw: bytes) -> bool:
    """-?([0-9]+(.[0-9]*)?|.[0-9]+)([eE][-+]?[0-9]+)?"""
    n = len(raw)
    i = 1 if raw[:1] == b"-" else 0
    j = _digits(raw, i)
    whole = j > i
    if j < n and raw[j] == 0x2E:                      # '.'
        k = _digits(raw, j + 1)
        if not whole and k == j + 1:
            return False
        j = k
    elif not whole:
        return False
    if j < n and raw[j] in b"eE":
        j += 1
        if j < n and raw[j] in b"+-":
            j += 1
        k = _digits(raw, j)
        if k == j:
            return False
        j = k
    return j == n


def _scan_numeric(raw: bytes) -> tuple[bool, bytes, bytes | None] | None:
    """(-)?([0-9]+)(.[0-9]+)?: (negative, whole digits, fraction digits or None)"""
    negative = raw[:1] == b"-"
    whole, dot, frac = (raw[1:] if negative else raw).partition(b".")
    if not whole.isdigit() or (dot and not frac.isdigit()):
        return None
    return negative, whole, frac if dot else None


def _scan_bc(raw: bytes, i: int) -> tuple[bytes | None, int] | None:
    """An optional " BC" at `i` that ends the value: (b" BC" or None, end)."""
    if i == len(raw):
        return None, i
    return (b" BC", i + 3) if raw[i:] == b" BC" else None


def _scan_ymd(raw: bytes) -> tuple[bytes, bytes, bytes, int] | None:
    """[0-9]{4,}-[0-9]{2}-[0-9]{2}: (year, month, day, end)"""
    j = raw.find(b"-")
    if j < 4 or not raw[:j].isdigit():
        return None
    month = _fixed_digits(raw, j + 1, 2)
    if month is None or raw[j + 3:j + 4] != b"-":
        return None
    day = _fixed_digits(raw, j + 4, 2)
    return None if day is None else (raw[:j], month, day, j + 6)


def _scan_clock(raw: bytes, i: int) -> tuple[bytes, bytes, bytes, bytes | None, int] | None:
    """[0-9]{2}:[0-9]{2}:[0-9]{2}(.[0-9]{1,6})? at `i`: (hours, minutes, seconds, fraction or None, end)"""
    hh = _fixed_digits(raw, i, 2)
    mi = _fixed_digits(raw, i + 3, 2) if raw[i + 2:i + 3] == b":" else None
    ss = _fixed_digits(raw, i + 6, 2) if raw[i + 5:i + 6] == b":" else None
    if hh is None or mi is None or ss is None:
        return None
    return (hh, mi, ss) + _scan_fraction(raw, i + 8)


def _scan_fraction(raw: bytes, i: int) -> tuple[bytes | None, int] | tuple[None, int]:
    """(.[0-9]{1,6})? at `i`: (fraction or None, end); 7 or more digits end the value there (and it is refused)."""
    if raw[i:i + 1] != b".":
        return None, i
    k = _digits(raw, i + 1)
    if not 1 <= k - i - 1 <= 6:
        return None, -1
    return raw[i + 1:k], k


def _scan_date(raw: bytes) -> tuple[bytes, bytes, bytes, bytes | None] | None:
    """[0-9]{4,}-[0-9]{2}-[0-9]{2}( BC)?"""
    ymd = _scan_ymd(raw)
    if ymd is None:
        return None
    bc = _scan_bc(raw, ymd[3])
    return None if bc is None else (ymd[0], ymd[1], ymd[2], bc[0])


def _scan_timestamp(raw: bytes) -> tuple | None:
    """date time(.frac)?([-+]hh(:mm(:ss)?)?)?( BC)?: the fields in the order of the C kernel's reads"""
    ymd = _scan_ymd(raw)
    if ymd is None or raw[ymd[3]:ymd[3] + 1] != b" ":
        return None
    clock = _scan_clock(raw, ymd[3] + 1)
    if clock is None or clock[4] < 0:
        return None
    i = clock[4]
    tzsign = tzh = tzm = tzs = None
    if raw[i:i + 1] in (b"+", b"-"):
        tzsign, tzh = raw[i:i + 1], _fixed_digits(raw, i + 1, 2)
        if tzh is None:
            return None
        i += 3
        if raw[i:i + 1] == b":" and _fixed_digits(raw, i + 1, 2) is not None:
            tzm, i = raw[i + 1:i + 3], i + 3
            if raw[i:i + 1] == b":" and _fixed_digits(raw, i + 1, 2) is not None:
                tzs, i = raw[i + 1:i + 3], i + 3
    bc = _scan_bc(raw, i)
    if bc is None:
        return None
    return ymd[:3] + clock[:4] + (tzsign, tzh, tzm, tzs, bc[0])


def _scan_time(raw: bytes) -> tuple[bytes, bytes, bytes, bytes | None] | None:
    """[0-9]{2}:[0-9]{2}:[0-9]{2}(.[0-9]{1,6})?"""
    clock = _scan_clock(raw, 0)
    return None if clock is None or clock[4] != len(raw) else clock[:4]


def _scan_uuid(raw: bytes) -> bool:
    """8-4-4-4-12 hex digits"""
    return (len(raw) == 36 and raw[8] == raw[13] == raw[18] == raw[23] == 0x2D and raw.count(b"-") == 4
            and not raw.translate(None, _HEX_OR_DASH))


def _scan_iv_time(tok: bytes) -> tuple[bytes | None, bytes, bytes, bytes, bytes | None] | None:
    """[-+]?[0-9]+:[0-9]{2}:[0-9]{2}(.[0-9]{1,6})?: (sign, hours, minutes, seconds, fraction)"""
    sign = tok[:1] if tok[:1] in (b"+", b"-") else None
    i = 1 if sign else 0
    j = _digits(tok, i)
    if j == i or tok[j:j + 1] != b":":
        return None
    mi = _fixed_digits(tok, j + 1, 2)
    ss = _fixed_digits(tok, j + 4, 2) if tok[j + 3:j + 4] == b":" else None
    if mi is None or ss is None:
        return None
    frac, end = _scan_fraction(tok, j + 6)
    return (sign, tok[i:j], mi, ss, frac) if end == len(tok) else None


def _scan_iv_part(tok: bytes) -> tuple[bytes | None, bytes] | None:
    """[-+]?[0-9]+: (sign, digits)"""
    sign = tok[:1] if tok[:1] in (b"+", b"-") else None
    i = 1 if sign else 0
    return (sign, tok[i:]) if len(tok) > i and _digits(tok, i) == len(tok) else None


def _scan_dims(head: bytes) -> bool:
    """[-?[0-9]+:-?[0-9]+]= (a one-dimensional array's bounds)"""
    if head[:1] != b"[" or head[-2:] != b"]=":
        return False
    lo, colon, hi = head[1:-2].partition(b":")
    return bool(colon) and _scan_int(lo) and _scan_int(hi)


_IV_UNITS = {b"year": 0, b"years": 0, b"mon": 1, b"mons": 1, b"day": 2, b"days": 2}

_RANGES = {INT2: (-(1 << 15), (1 << 15) - 1), INT4: (INT32_MIN, INT32_MAX), INT8: (INT64_MIN, INT64_MAX),
           OID: (0, (1 << 32) - 1)}
_BE_INT = {INT2: struct.Struct(">h"), INT4: struct.Struct(">i"), INT8: struct.Struct(">q"), OID: struct.Struct(">I")}
_LE_INT = {INT2: struct.Struct("<h"), INT4: struct.Struct("<i"), INT8: struct.Struct("<q"), OID: struct.Struct("<I")}
_F4, _F8 = struct.Struct(">f"), struct.Struct(">d")
_F4LE, _F8LE = struct.Struct("<f"), struct.Struct("<d")
_I16, _U16, _I32, _U32, _I64 = (struct.Struct(">h"), struct.Struct(">H"), struct.Struct(">i"), struct.Struct(">I"),
                                struct.Struct(">q"))


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    y -= m <= 2
    era = _trunc_div(y if y >= 0 else y - 399, 400)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _year(digits: bytes, bc: bytes | None) -> int:
    year = int(digits)
    if year == 0:
        raise _fail()
    return 1 - year if bc else year


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(INVALID_UTF8) from None


def _frac_us(frac: bytes | None) -> int:
    return int(frac.ljust(6, b"0")) if frac else 0


# ------------------------------------------------------------------ text forms
def _text_int(kind: int, raw: bytes) -> int:
    if not _scan_int(raw):
        raise _fail()
    v = int(raw)
    lo, hi = _RANGES[kind]
    if not lo <= v <= hi:
        raise _fail(OUT_OF_RANGE)
    return v


def _text_float(kind: int, raw: bytes) -> float:
    if raw == b"NaN":
        return float("nan")
    if raw == b"Infinity":
        return float("inf")
    if raw == b"-Infinity":
        return float("-inf")
    if not _scan_float(raw):
        raise _fail()
    v = float(raw)
    if kind == FLOAT4:
        try:
            v = _F4.unpack(_F4.pack(v))[0]
        except OverflowError:
            v = float("inf") if v > 0 else float("-inf")
    return v


def _decimal(negative: bool, unscaled: int, spec: ColumnSpec) -> Decimal:
    if unscaled >= 10 ** spec.precision:
        raise _fail(OUT_OF_RANGE)
    return Decimal((1 if negative else 0, tuple(int(c) for c in str(unscaled)), -spec.scale))


def _text_decimal(raw: bytes, spec: ColumnSpec) -> Decimal:
    if raw in (b"NaN", b"Infinity", b"-Infinity"):
        raise _fail(SPECIAL_DECIMAL)
    m = _scan_numeric(raw)
    if m is None:
        raise _fail()
    sign, whole, frac = m
    frac = frac or b""
    if len(frac) > spec.scale:
        raise _fail()
    return _decimal(bool(sign), int(whole + frac.ljust(spec.scale, b"0")), spec)


def _text_date(raw: bytes) -> int:
    if raw == b"infinity":
        return INT32_MAX
    if raw == b"-infinity":
        return INT32_MIN
    m = _scan_date(raw)
    if m is None:
        raise _fail()
    y, mo, d, bc = m
    month, day = int(mo), int(d)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise _fail()
    days = days_from_civil(_year(y, bc), month, day)
    if not INT32_MIN < days < INT32_MAX:
        raise _fail(OUT_OF_RANGE)
    return days


def _text_timestamp(raw: bytes, with_tz: bool) -> int:
    if raw == b"infinity":
        return INT64_MAX
    if raw == b"-infinity":
        return INT64_MIN
    m = _scan_timestamp(raw)
    if m is None:
        raise _fail()
    y, mo, d, hh, mi, ss, frac, tzsign, tzh, tzm, tzs, bc = m
    if (tzsign is not None) != with_tz:
        raise _fail()
    month, day, hour, minute, second = int(mo), int(d), int(hh), int(mi), int(ss)
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 59):
        raise _fail()
    offset = 0
    if with_tz:
        th, tm, ts_ = int(tzh), int(tzm or b"0"), int(tzs or b"0")
        if th > 15 or tm > 59 or ts_ > 59:
            raise _fail()
        offset = th * 3600 + tm * 60 + ts_
        if tzsign == b"-":
            offset = -offset
    days = days_from_civil(_year(y, bc), month, day)
    us = days * US_PER_DAY + ((hour * 60 + minute) * 60 + second - offset) * 1_000_000 + _frac_us(frac)
    if not INT64_MIN < us < INT64_MAX:
        raise _fail(OUT_OF_RANGE)
    return us


def _text_time(raw: bytes) -> int:
    m = _scan_time(raw)
    if m is None:
        raise _fail()
    hh, mi, ss, frac = m
    hour, minute, second = int(hh), int(mi), int(ss)
    us = ((hour * 60 + minute) * 60 + second) * 1_000_000 + _frac_us(frac)
    if minute > 59 or second > 59 or us > US_PER_DAY:
        raise _fail()
    return us


def _text_interval(raw: bytes) -> tuple[int, int, int]:
    fields = [0, 0, 0]
    us = 0
    seen_time = False
    tokens = raw.split(b" ")
    i = 0
    if not raw:
        raise _fail()
    while i < len(tokens):
        tok = tokens[i]
        m = _scan_iv_time(tok)
        if m is not None:
            if seen_time or i != len(tokens) - 1:
                raise _fail()
            seen_time = True
            sign, hh, mi, ss, frac = m
            minute, second = int(mi), int(ss)
            if minute > 59 or second > 59:
                raise _fail()
            us = ((int(hh) * 60 + minute) * 60 + second) * 1_000_000 + _frac_us(frac)
            if sign == b"-":
                us = -us
            i += 1
            continue
        part = _scan_iv_part(tok)
        if part is None or i + 1 >= len(tokens) or tokens[i + 1] not in _IV_UNITS:
            raise _fail()
        v = int(part[1])
        if part[0] == b"-":
            v = -v
        fields[_IV_UNITS[tokens[i + 1]]] += v
        i += 2
    months = fields[0] * 12 + fields[1]
    days = fields[2]
    nanos = us * 1000
    if not (INT32_MIN <= months <= INT32_MAX and INT32_MIN <= days <= INT32_MAX and INT64_MIN <= nanos <= INT64_MAX):
        raise _fail(OUT_OF_RANGE)
    return months, days, nanos


def _text_bytea(raw: bytes) -> bytes:
    if raw.startswith(b"\\x"):
        body = raw[2:]
        if len(body) % 2:
            raise _fail()
        try:
            return binascii.unhexlify(body)
        except (binascii.Error, ValueError):
            raise _fail() from None
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
        elif i + 1 < n and raw[i + 1] == 0x5C:
            out.append(0x5C)
            i += 2
        elif (i + 3 < n + 0 and all(0x30 <= raw[i + k] <= 0x37 for k in (1, 2, 3)) and raw[i + 1] <= 0x33):
            out.append((raw[i + 1] - 0x30) * 64 + (raw[i + 2] - 0x30) * 8 + (raw[i + 3] - 0x30))
            i += 4
        else:
            raise _fail()
    return bytes(out)


def _text_uuid(raw: bytes) -> bytes:
    if not _scan_uuid(raw):
        raise _fail()
    return binascii.unhexlify(raw.replace(b"-", b""))


def _text_array(raw: bytes, spec: ColumnSpec) -> list[Any]:
    n = len(raw)
    i = 0
    shifted = False               # a lower bound other than 1: a list cannot keep it
    if i < n and raw[0] == 0x5B:  # [lb:ub]= dimension decoration
        close = raw.find(b"]")
        if close < 0:
            raise _fail()
        if raw[close + 1:close + 2] == b"[":
            raise _fail(MULTIDIMENSIONAL)
        if not _scan_dims(raw[:close + 2]):
            raise _fail()
        shifted = raw[1:3] != b"1:"
        i = close + 2
    if i >= n or raw[i] != 0x7B:
        raise _fail()
    i += 1
    out: list[Any] = []
    elem = spec.element
    if i < n and raw[i] == 0x7D:
        if i + 1 != n:
            raise _fail()
        if shifted:
            raise _fail(LOWER_BOUND)
        return out
    while True:
        if i >= n:
            raise _fail()
        c = raw[i]
        if c == 0x7B:
            raise _fail(MULTIDIMENSIONAL)
        if c == 0x22:  # quoted
            i += 1
            buf = bytearray()
            while True:
                if i >= n:
                    raise _fail()
                c = raw[i]
                if c == 0x5C:
                    if i + 1 >= n:
                        raise _fail()
                    buf.append(raw[i + 1])
                    i += 2
                elif c == 0x22:
                    i += 1
                    break
                else:
                    buf.append(c)
                    i += 1
            out.append(decode_value(elem, T, bytes(buf), None))
        else:
            start = i
            while i < n and raw[i] not in b',}{"\\':
                i += 1
            token = raw[start:i]
            if not token or (i < n and raw[i] in b'{"\\'):
                raise _fail()
            out.append(None if token.upper() == b"NULL" else decode_value(elem, T, token, None))
        if i >= n:
            raise _fail()
        if raw[i] == 0x2C:
            i += 1
            continue
        if raw[i] == 0x7D and i + 1 == n:
            if shifted:
                raise _fail(LOWER_BOUND)
            return out
        raise _fail()


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
    return _decimal(sign == 0x4000, unscaled, spec)


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
        out.append(decode_value(elem, B, raw[pos:pos + length], None))
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
        or oid in _internal_layouts.VARLENA_CONVERTED
    if not known or oid == 19 or spec.render is None:
        raise _fail(INTERNAL_UNSUPPORTED)
    if big_endian is None and (fields is None or any(size != 1 for size in fields)):
        raise _fail(BYTE_ORDER_UNKNOWN)
    if fields is not None:
        return spec.render(_internal_layouts.swap_fields(raw, fields, bool(big_endian)))
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
    if kind in (TEXT, JSON, BYTEA, DECIMAL, NUMERIC_TEXT, INTERVAL, TIMETZ):
        if big_endian is None:
            raise _fail(BYTE_ORDER_UNKNOWN)
        if kind == INTERVAL:
            return _binary(spec, _internal_layouts.swap_fields(raw, (8, 4, 4), big_endian))
        if kind == TIMETZ:
            return _binary(spec, _internal_layouts.swap_fields(raw, (8, 4), big_endian))
        data = _varlena(raw, big_endian)
        if kind in (DECIMAL, NUMERIC_TEXT):
            return _binary(spec, _internal_layouts.numeric_send(data, big_endian))
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
    kind = spec.kind
    if fmt == I:
        return _internal(spec, raw, big_endian)
    if fmt == B:
        return _binary(spec, raw)
    if kind in (TEXT, JSON, JSONB, ENUM, NUMERIC_TEXT, TIMETZ, CHAR, PGTEXT):
        return _utf8(raw)
    if kind in _RANGES:
        return _text_int(kind, raw)
    if kind == BOOL:
        if raw == b"t":
            return True
        if raw == b"f":
            return False
        raise _fail()
    if kind in (FLOAT4, FLOAT8):
        return _text_float(kind, raw)
    if kind == DECIMAL:
        return _text_decimal(raw, spec)
    if kind == BYTEA:
        return _text_bytea(raw)
    if kind == DATE:
        return _text_date(raw)
    if kind == TIMESTAMP:
        return _text_timestamp(raw, False)
    if kind == TIMESTAMPTZ:
        return _text_timestamp(raw, True)
    if kind == TIME:
        return _text_time(raw)
    if kind == INTERVAL:
        return _text_interval(raw)
    if kind == UUID:
        return _text_uuid(raw)
    if kind == ARRAY:
        return _text_array(raw, spec)
    raise _fail()


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


__all__ += ["numeric_text_from_binary", "timetz_text", "char_text", "days_from_civil", "RAW", "OTHER"]
