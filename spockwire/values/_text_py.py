"""Value decoders of the pure-Python twin, text ('t') forms: the constants the value kernels share, and the text
parsers of spockwire/wire/_values.pxi, each with the same name and the same checks in the same order.

Storage values as in spockwire.values._convert_py (which dispatches on the format and builds the Arrow arrays).
"""
from __future__ import annotations

import binascii
import struct
from decimal import Decimal
from typing import Any

from .kinds import ARRAY, BOOL, BYTEA, CHAR, DATE, DECIMAL, ENUM, FLOAT4, FLOAT8, INT2, INT4, INT8, INTERVAL, JSON, \
    JSONB, NUMERIC_TEXT, OID, PGTEXT, TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TIMETZ, UUID, ColumnSpec
from .failures import INVALID, INVALID_UTF8, LOWER_BOUND, MULTIDIMENSIONAL, OUT_OF_RANGE, SPECIAL_DECIMAL, ValueFailure

UNIX_DAYS_2000 = 10957
UNIX_US_2000 = 946_684_800_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
US_PER_DAY = 86_400_000_000
_POW10 = (1, 10, 100, 1000, 10000, 100000, 1000000)   # scales a fraction of 1 to 6 digits to µs

T, B, I = 0x74, 0x62, 0x69


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
                out.append(text_value(elem, p[start:i]))
            else:
                tmp = bytearray()
                j = start
                while j < i:
                    if p[j] == 92:
                        j += 1
                    tmp.append(p[j])
                    j += 1
                out.append(text_value(elem, bytes(tmp)))
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
                out.append(text_value(elem, token))
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



def text_value(spec: ColumnSpec, raw: bytes) -> Any:
    """The storage value of one non-NULL text-format value of a typed column (raises ValueFailure)."""
    kind = spec.kind
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
