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
from .internal_types import ACLITEM_OID, JSONB_OID, aclitem_fields

__all__ = ["ValueFailure", "decode_value", "build_array", "UNIX_DAYS_2000", "UNIX_US_2000"]

UNIX_DAYS_2000 = 10957
UNIX_US_2000 = 946_684_800_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
US_PER_DAY = 86_400_000_000
_POW10 = (1, 10, 100, 1000, 10000, 100000, 1000000)   # scales a fraction of 1 to 6 digits to µs

T, B, I = 0x74, 0x62, 0x69


class ValueFailure(Exception):
    """A value could not be decoded; `code` is one of spockwire.values.failures."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _fail(code: int = INVALID) -> ValueFailure:
    return ValueFailure(code)


_RANGES = {INT2: (-(1 << 15), (1 << 15) - 1), INT4: (INT32_MIN, INT32_MAX), INT8: (INT64_MIN, INT64_MAX),
           OID: (0, (1 << 32) - 1)}
_BE_INT = {INT2: struct.Struct(">h"), INT4: struct.Struct(">i"), INT8: struct.Struct(">q"), OID: struct.Struct(">I")}
_LE_INT = {INT2: struct.Struct("<h"), INT4: struct.Struct("<i"), INT8: struct.Struct("<q"), OID: struct.Struct("<I")}
_F4, _F8 = struct.Struct(">f"), struct.Struct(">d")
_F4LE, _F8LE = struct.Struct("<f"), struct.Struct("<d")
_I16, _U16, _I32, _U32, _I64 = (struct.Struct(">h"), struct.Struct(">H"), struct.Struct(">i"), struct.Struct(">I"),
                                struct.Struct(">q"))


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(INVALID_UTF8) from None


# ------------------------------------------------------------------ small parsers
# The text parsers below follow their namesakes in spockwire/wire/_values.pxi check for check: the same steps in the
# same order, the same failure code at each. Where the C code walks a run of bytes one at a time, the twin asks a
# built-in the same question about the slice (bytes.isdigit: every byte an ASCII digit; bytes.lstrip: scan_digits;
# int(): digits_value; binascii.unhexlify: hex pairs), which CPython answers much faster than a loop over the bytes.
# Python integers do not overflow: where C stops at the width of its integers, the twin checks the same bound before
# calling int() (which also refuses digit runs longer than sys.get_int_max_str_digits()).

_DIGITS = b"0123456789"
# C's fixed_digits(p, 2): the two bytes as their number, -1 unless both are digits (a table lookup of the slice)
_PAIRS = {b"%02d" % k: k for k in range(100)}


def scan_digits(p: bytes, i: int, n: int) -> int:
    """The end of the run of decimal digits that starts at p[i] (at most n)."""
    return n - len(p[i:n].lstrip(_DIGITS))


def text_int(p: bytes, lo: int, hi: int) -> int:
    n = len(p)
    i = 0
    if n > 0 and p[0] == 45:
        i = 1
    if i >= n:
        raise _fail()
    digits = p[i:] if i else p
    if not digits.isdigit():
        raise _fail()
    if n - i > 19:                         # C: the digits checked first, then the magnitude against 2**64 - 1
        mag = digits.lstrip(b"0") or b"0"
        if len(mag) > 20:
            raise _fail(OUT_OF_RANGE)
        v = -int(mag) if i else int(mag)
    else:
        v = int(p)
    if v < lo or v > hi:                   # C: past int64, then past [lo, hi]: the same code
        raise _fail(OUT_OF_RANGE)
    return v


def float_grammar(p: bytes) -> bool:
    """-?(digits(.digits*)?|.digits)([eE][-+]?digits)?"""
    n = len(p)
    i = 0
    if i < n and p[i] == 45:
        i += 1
    e = p.find(b"e", i)                    # the mantissa ends at the exponent's e or E (a second one fails below)
    if e < 0:
        e = p.find(b"E", i)
    end = e if e >= 0 else n
    whole, dot, frac = p[i:end].partition(b".")
    if (whole and not whole.isdigit()) or (frac and not frac.isdigit()):
        return False
    if not whole and not frac:
        return False
    if e >= 0:
        i = e + 1
        if i < n and (p[i] == 43 or p[i] == 45):
            i += 1
        if not p[i:].isdigit():            # C: no exponent digits, or i != n after them
            return False
    return True


def text_float(kind: int, p: bytes) -> float:
    if p == b"NaN":
        return float("nan")
    if p == b"Infinity":
        return float("inf")
    if p == b"-Infinity":
        return float("-inf")
    if not float_grammar(p):
        raise _fail()
    v = float(p)                           # C: PyOS_string_to_double, which float() calls
    if kind == FLOAT4:                     # C: the cast to float (a value past its range becomes ±inf)
        try:
            v = _F4.unpack(_F4.pack(v))[0]
        except OverflowError:
            v = float("inf") if v > 0 else float("-inf")
    return v


def decimal_store(neg: bool, unscaled: int, spec: ColumnSpec) -> Decimal:
    if unscaled >= 10 ** spec.precision:
        raise _fail(OUT_OF_RANGE)
    return Decimal((1 if neg else 0, tuple(map(int, str(unscaled))), -spec.scale))


def text_decimal(p: bytes, spec: ColumnSpec) -> Decimal:
    n = len(p)
    if p == b"NaN" or p == b"Infinity" or p == b"-Infinity":
        raise _fail(SPECIAL_DECIMAL)
    i = 0
    neg = False
    if i < n and p[i] == 45:
        neg = True
        i += 1
    whole_start = i
    dot = p.find(b".", i)                  # the digit runs, each checked whole: [whole_start, whole_end), frac
    whole_end = dot if dot >= 0 else n
    whole = p[whole_start:whole_end]
    if not whole.isdigit():                # C: no whole digits, or the scan stops at neither '.' nor the end
        raise _fail()
    frac = b""
    if dot >= 0:
        frac = p[dot + 1:]
        if not frac.isdigit():             # C: no fraction digits, or i != n after them
            raise _fail()
    scale = spec.scale
    if len(frac) > scale:
        raise _fail()
    if whole_end - whole_start + scale > 18:
        # C: the 128-bit path, whose overflow check fails past 10**38 (decimal_store's bound would fail it too)
        whole = whole.lstrip(b"0") or b"0"
        if len(whole) + scale > 39:
            raise _fail(OUT_OF_RANGE)
    return decimal_store(neg, int(whole + frac) * 10 ** (scale - len(frac)), spec)


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering); the callers check the
    result against int32 as C's overflow flag does."""
    if m <= 2:
        y -= 1
    # truncating division, as the algorithm is written for
    era = y // 400 if y >= 0 else -((399 - y) // 400)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_year(p: bytes, n: int, bc: bool) -> int:
    """The year of the digits p[:n] (already checked, at least 4): INVALID for year 0, OUT_OF_RANGE when huge."""
    i = 0
    while i < n - 1 and p[i] == 48:
        i += 1
    if n - i > 9:
        raise _fail(OUT_OF_RANGE)
    y = int(p[i:n])
    if y == 0:
        raise _fail()
    return 1 - y if bc else y


def text_date(p: bytes) -> int:
    n = len(p)
    if p == b"infinity":
        return INT32_MAX
    if p == b"-infinity":
        return INT32_MIN
    ye = scan_digits(p, 0, n)
    if ye < 4 or (n - ye != 6 and n - ye != 9):
        raise _fail()
    if p[ye] != 45 or p[ye + 3] != 45:
        raise _fail()
    month = _PAIRS.get(p[ye + 1:ye + 3], -1)
    day = _PAIRS.get(p[ye + 4:ye + 6], -1)
    if month < 0 or day < 0:
        raise _fail()
    bc = False
    if n - ye == 9:
        if p[ye + 6:ye + 9] != b" BC":
            raise _fail()
        bc = True
    if month < 1 or month > 12 or day < 1 or day > 31:
        raise _fail()
    days = _civil_days(p, ye, bc, month, day)
    return days


def _civil_days(p: bytes, ye: int, bc: bool, month: int, day: int) -> int:
    """Days since 2000-01-01 of the year whose digits end at `ye`, refused out of the date range."""
    year = parse_year(p, ye, bc)
    if year > 100000000 or year < -100000000:
        raise _fail(OUT_OF_RANGE)
    days = days_from_civil(year, month, day)
    if days <= INT32_MIN or days >= INT32_MAX:
        raise _fail(OUT_OF_RANGE)
    return days


def _tz_pair(p: bytes, i: int, n: int) -> int:
    """The two digits after the sign or colon at `i` of a time zone offset."""
    if n - i < 3:
        raise _fail()
    v = _PAIRS.get(p[i + 1:i + 3], -1)
    if v < 0:
        raise _fail()
    return v


def text_timestamp(p: bytes, with_tz: bool) -> int:
    n = len(p)
    if p == b"infinity":
        return INT64_MAX
    if p == b"-infinity":
        return INT64_MIN
    ye = scan_digits(p, 0, n)
    if ye < 4 or n - ye < 15:
        raise _fail()
    i = ye
    if p[i] != 45 or p[i + 3] != 45 or p[i + 6] != 32 or p[i + 9] != 58 or p[i + 12] != 58:
        raise _fail()
    month = _PAIRS.get(p[i + 1:i + 3], -1)
    day = _PAIRS.get(p[i + 4:i + 6], -1)
    hour = _PAIRS.get(p[i + 7:i + 9], -1)
    minute = _PAIRS.get(p[i + 10:i + 12], -1)
    second = _PAIRS.get(p[i + 13:i + 15], -1)
    if month < 0 or day < 0 or hour < 0 or minute < 0 or second < 0:
        raise _fail()
    i += 15
    frac = 0
    if i < n and p[i] == 46:
        fs = i + 1
        fe = scan_digits(p, fs, n)
        if fe == fs or fe - fs > 6:
            raise _fail()
        frac = int(p[fs:fe]) * _POW10[6 - (fe - fs)]
        i = fe
    has_tz = tz_neg = False
    th = tm = ts = 0
    if i < n and (p[i] == 43 or p[i] == 45):
        has_tz = True
        tz_neg = p[i] == 45
        th = _tz_pair(p, i, n)
        i += 3
        if i < n and p[i] == 58:
            tm = _tz_pair(p, i, n)
            i += 3
            if i < n and p[i] == 58:
                ts = _tz_pair(p, i, n)
                i += 3
    bc = False
    if i < n:
        if n - i == 3 and p[i:] == b" BC":
            bc = True
        else:
            raise _fail()
    if has_tz != with_tz:
        raise _fail()
    if month < 1 or month > 12 or day < 1 or day > 31 or hour > 23 or minute > 59 or second > 59:
        raise _fail()
    offset = 0
    if with_tz:
        if th > 15 or tm > 59 or ts > 59:
            raise _fail()
        offset = th * 3600 + tm * 60 + ts
        if tz_neg:
            offset = -offset
    days = _civil_days(p, ye, bc, month, day)
    us = days * US_PER_DAY + (((hour * 60 + minute) * 60 + second) - offset) * 1000000 + frac
    if us <= INT64_MIN or us >= INT64_MAX:
        raise _fail(OUT_OF_RANGE)
    return us


def text_time(p: bytes) -> int:
    n = len(p)
    if n < 8 or p[2] != 58 or p[5] != 58:
        raise _fail()
    hour = _PAIRS.get(p[0:2], -1)
    minute = _PAIRS.get(p[3:5], -1)
    second = _PAIRS.get(p[6:8], -1)
    if hour < 0 or minute < 0 or second < 0:
        raise _fail()
    frac = 0
    if n > 8:
        if p[8] != 46:
            raise _fail()
        if not p[9:].isdigit() or n - 9 > 6:   # C: scan_digits(p, 9, n) != n, or 1 to 6 digits
            raise _fail()
        frac = int(p[9:]) * _POW10[6 - (n - 9)]
    us = ((hour * 60 + minute) * 60 + second) * 1000000 + frac
    if minute > 59 or second > 59 or us > US_PER_DAY:
        raise _fail()
    return us


def text_interval(p: bytes) -> tuple[int, int, int]:
    n = len(p)
    fields = [0, 0, 0]
    us = 0
    seen_time = overflow = False
    i = 0
    if n == 0:
        raise _fail()
    while True:
        # one token: [i, te)
        te = p.find(b" ", i)
        if te < 0:
            te = n
        if te - i >= 7 and time_token(p, i, te):     # (a shorter token fails time_token's length check)
            if seen_time or te != n:
                raise _fail()
            seen_time = True
            k = i
            neg = False
            if p[k] == 43 or p[k] == 45:
                neg = p[k] == 45
                k += 1
            ds = k
            de = scan_digits(p, k, te)
            minute = _PAIRS.get(p[de + 1:de + 3], -1)
            second = _PAIRS.get(p[de + 4:de + 6], -1)
            if minute > 59 or second > 59:
                raise _fail()
            frac = 0
            if de + 6 < te:                # '.' at de + 6, then 1 to 6 digits (time_token checked them)
                frac = int(p[de + 7:te]) * _POW10[6 - (te - de - 7)]
            if de - ds > 18:
                overflow = True
            else:
                us = ((int(p[ds:de]) * 60 + minute) * 60 + second) * 1000000 + frac
                if neg:
                    us = -us
            break
        # a number then a unit
        k = i
        neg = False
        if k < te and (p[k] == 43 or p[k] == 45):
            neg = p[k] == 45
            k += 1
        if k == te or not p[k:te].isdigit() or te >= n:
            raise _fail()
        ue = p.find(b" ", te + 1)
        if ue < 0:
            ue = n
        unit = interval_unit(p[te + 1:ue])
        if unit < 0:
            raise _fail()
        if te - k > 30:
            overflow = True
        else:
            v = int(p[k:te])
            fields[unit] += -v if neg else v
            if fields[unit] > INT64_MAX * 4 or fields[unit] < INT64_MIN * 4:
                overflow = True
        if ue >= n:
            break
        i = ue + 1
        if i >= n:
            raise _fail()
    if overflow:
        raise _fail(OUT_OF_RANGE)
    months = fields[0] * 12 + fields[1]
    nanos = us * 1000
    if months < INT32_MIN or months > INT32_MAX or fields[2] < INT32_MIN or fields[2] > INT32_MAX \
            or nanos < INT64_MIN or nanos > INT64_MAX:
        raise _fail(OUT_OF_RANGE)
    return months, fields[2], nanos


def time_token(p: bytes, i: int, n: int) -> bool:
    """p[i:n] is [-+]?digits:MM:SS(.f{1,6})?"""
    if i < n and (p[i] == 43 or p[i] == 45):
        i += 1
    de = scan_digits(p, i, n)
    if de == i or n - de < 6 or p[de] != 58 or p[de + 3] != 58:
        return False
    if p[de + 1:de + 3] not in _PAIRS or p[de + 4:de + 6] not in _PAIRS:
        return False
    if n - de == 6:
        return True
    if p[de + 6] != 46 or n - de - 7 < 1 or n - de - 7 > 6:
        return False
    return scan_digits(p, de + 7, n) == n


_INTERVAL_UNITS = {b"year": 0, b"years": 0, b"mon": 1, b"mons": 1, b"day": 2, b"days": 2}


def interval_unit(p: bytes) -> int:
    return _INTERVAL_UNITS.get(p, -1)


def text_uuid(p: bytes) -> bytes:
    if len(p) != 36 or p[8] != 45 or p[13] != 45 or p[18] != 45 or p[23] != 45:
        raise _fail()
    try:
        return binascii.unhexlify(p[0:8] + p[9:13] + p[14:18] + p[19:23] + p[24:36])
    except binascii.Error:                 # C: a byte that is not a hex digit
        raise _fail() from None


def text_bytea(p: bytes) -> bytes:
    n = len(p)
    if n >= 2 and p[0] == 92 and p[1] == 120:
        if (n - 2) % 2:
            raise _fail()
        try:
            return binascii.unhexlify(p[2:])
        except binascii.Error:             # C: hex_value < 0
            raise _fail() from None
    out = bytearray()
    i = 0
    while i < n:
        c = p[i]
        if c != 92:
            out.append(c)
            i += 1
        elif i + 1 < n and p[i + 1] == 92:
            out.append(92)
            i += 2
        elif i + 3 < n and 48 <= p[i + 1] <= 51 and 48 <= p[i + 2] <= 55 and 48 <= p[i + 3] <= 55:
            out.append((p[i + 1] - 48) * 64 + (p[i + 2] - 48) * 8 + (p[i + 3] - 48))
            i += 4
        else:
            raise _fail()
    return bytes(out)


def text_array(p: bytes, spec: ColumnSpec) -> list[Any]:
    n = len(p)
    i = 0
    shifted = False               # a lower bound other than 1: a list cannot keep it
    if n > 0 and p[0] == 91:      # [lb:ub]= decoration
        close = p.find(b"]")
        if close < 0:
            raise _fail()
        if close + 1 < n and p[close + 1] == 91:
            raise _fail(MULTIDIMENSIONAL)
        if not bounds_decoration(p, close + 2, n):
            raise _fail()
        shifted = not (p[1] == 49 and p[2] == 58)
        i = close + 2
    if i >= n or p[i] != 123:
        raise _fail()
    i += 1
    out: list[Any] = []
    elem = spec.element
    if i < n and p[i] == 125:
        if i + 1 != n:
            raise _fail()
        if shifted:
            raise _fail(LOWER_BOUND)
        return out
    while True:
        if i >= n:
            raise _fail()
        if p[i] == 123:
            raise _fail(MULTIDIMENSIONAL)
        if p[i] == 34:            # quoted
            i += 1
            start = i
            q = 0                 # backslashes seen
            while True:
                if i >= n:
                    raise _fail()
                if p[i] == 92:
                    if i + 1 >= n:
                        raise _fail()
                    q += 1
                    i += 2
                elif p[i] == 34:
                    break
                else:
                    i += 1
            if q == 0:
                out.append(decode_value(elem, T, p[start:i], None))
            else:
                tmp = bytearray()
                j = start
                while j < i:
                    if p[j] == 92:
                        j += 1
                    tmp.append(p[j])
                    j += 1
                out.append(decode_value(elem, T, bytes(tmp), None))
            i += 1
        else:
            start = i
            while i < n and p[i] not in _ARRAY_STOP:
                i += 1
            if i == start or (i < n and p[i] in _ARRAY_BAD):
                raise _fail()
            token = p[start:i]
            if i - start == 4 and token.upper() == b"NULL":
                out.append(None)
            else:
                out.append(decode_value(elem, T, token, None))
        if i >= n:
            raise _fail()
        if p[i] == 44:
            i += 1
            continue
        if p[i] == 125 and i + 1 == n:
            if shifted:
                raise _fail(LOWER_BOUND)
            return out
        raise _fail()


_ARRAY_STOP = frozenset(b',}{"\\')   # where an unquoted element ends
_ARRAY_BAD = frozenset(b'{"\\')      # ... and where it must not


def bounds_decoration(p: bytes, end: int, n: int) -> bool:
    """p[0:end] is [-?digits:-?digits]= exactly."""
    i = 1
    if end > n or end < 6 or p[end - 1] != 61 or p[end - 2] != 93:
        return False
    if p[i] == 45:
        i += 1
    s = i
    i = scan_digits(p, i, end)
    if i == s or p[i] != 58:
        return False
    i += 1
    if p[i] == 45:
        i += 1
    s = i
    i = scan_digits(p, i, end)
    return i > s and i == end - 2


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
        or oid in _internal_layouts.VARLENA_CONVERTED or oid == ACLITEM_OID
    if not known or oid == 19 or spec.render is None:
        raise _fail(INTERNAL_UNSUPPORTED)
    if big_endian is None and (fields is None or any(size != 1 for size in fields)):
        raise _fail(BYTE_ORDER_UNKNOWN)
    if oid == ACLITEM_OID:
        return spec.render(aclitem_fields(raw, big_endian))
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
    if kind in (TEXT, JSON, JSONB, BYTEA, DECIMAL, NUMERIC_TEXT, INTERVAL, TIMETZ):
        if big_endian is None:
            raise _fail(BYTE_ORDER_UNKNOWN)
        if kind == INTERVAL:
            return _binary(spec, _internal_layouts.swap_fields(raw, (8, 4, 4), big_endian))
        if kind == TIMETZ:
            return _binary(spec, _internal_layouts.swap_fields(raw, (8, 4), big_endian))
        data = _varlena(raw, big_endian)
        if kind in (DECIMAL, NUMERIC_TEXT):
            return _binary(spec, _internal_layouts.numeric_send(data, big_endian))
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
    kind = spec.kind
    if fmt == I:
        return _internal(spec, raw, big_endian)
    if fmt == B:
        return _binary(spec, raw)
    if kind in (TEXT, JSON, JSONB, ENUM, NUMERIC_TEXT, TIMETZ, CHAR, PGTEXT):
        return _utf8(raw)
    bounds = _RANGES.get(kind)
    if bounds is not None:
        return text_int(raw, bounds[0], bounds[1])
    if kind == BOOL:
        if raw == b"t":
            return True
        if raw == b"f":
            return False
        raise _fail()
    if kind in (FLOAT4, FLOAT8):
        return text_float(kind, raw)
    if kind == DECIMAL:
        return text_decimal(raw, spec)
    if kind == BYTEA:
        return text_bytea(raw)
    if kind == DATE:
        return text_date(raw)
    if kind == TIMESTAMP:
        return text_timestamp(raw, False)
    if kind == TIMESTAMPTZ:
        return text_timestamp(raw, True)
    if kind == TIME:
        return text_time(raw)
    if kind == INTERVAL:
        return text_interval(raw)
    if kind == UUID:
        return text_uuid(raw)
    if kind == ARRAY:
        return text_array(raw, spec)
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
