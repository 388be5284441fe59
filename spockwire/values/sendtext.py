"""PostgreSQL's text output of a value given in its binary send format.

`send_to_text(type_oid, raw)` returns exactly what the type's output function prints under the settings every
connection spockwire decodes from pins (DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3,
TimeZone=UTC, bytea_output=hex; money as with lc_monetary=C), so a column streamed in the binary format gives
the same string as the same column streamed as text.

Covered: every builtin base type with a binary send format that spockwire meets in a table (booleans, integers,
oid/xid/xid8/cid/tid, floats, numeric, money, the text types, bytea, "char", json/jsonb/jsonpath, date/time
types, uuid, inet/cidr/macaddr/macaddr8, bit/varbit, pg_lsn, the geometric types, tsvector, tsquery,
int2vector/oidvector, txid_snapshot/pg_snapshot), builtin ranges and multiranges, arrays of any element type
(any number of dimensions and lower bounds) and records (record_send names each field's type), recursively.
aclitem has no send format: its "send form" here is its internal fields in network order
(spockwire.values.internal_types.aclitem_fields), printed with the role names of a catalog with `role_name(oid)`.
User-defined types (domains, enums, composites, ranges, arrays of them) need a `catalog` with
`type_info(oid)` (spockwire.values.catalog.PostgresTypeCatalog): a domain prints as its base type, an enum as
its label, a composite and a user range by their layouts.

Bytes that are not a valid send form of the type raise `ValueFailure` (INVALID, or INVALID_UTF8 for text that
is not UTF-8); a nested type whose send format is unknown (an extension's base type) raises ValueFailure
(NO_TEXT_FORM). The decoders turn both into a ProtocolError naming the message, byte offset and column.
"""
from __future__ import annotations

import struct
from fractions import Fraction
from typing import Any, Callable

from ._binary_py import char_text, numeric_text_from_binary, timetz_text
from .failures import INVALID, INVALID_UTF8, NO_ROLE_NAMES, NO_TEXT_FORM, ValueFailure

__all__ = ["send_to_text", "can_render", "RENDERED_TYPES", "TYPE_NAMES", "RANGE_SUBTYPES", "MULTIRANGE_RANGES",
           "ARRAY_ELEMENTS", "float8_text", "float4_text"]

_I16, _U16, _I32, _U32, _I64, _U64 = (struct.Struct(">h"), struct.Struct(">H"), struct.Struct(">i"),
                                      struct.Struct(">I"), struct.Struct(">q"), struct.Struct(">Q"))
_F4, _F8 = struct.Struct(">f"), struct.Struct(">d")
US_PER_DAY = 86_400_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_POSTGRES_EPOCH_JDATE = 2451545   # Julian day of 2000-01-01

# builtin range type -> subtype; multirange -> range
RANGE_SUBTYPES: dict[int, int] = {3904: 23, 3926: 20, 3906: 1700, 3908: 1114, 3910: 1184, 3912: 1082}
MULTIRANGE_RANGES: dict[int, int] = {4451: 3904, 4536: 3926, 4532: 3906, 4533: 3908, 4534: 3910, 4535: 3912}
# builtin array type -> element type (array_send names the element type in every value; this only says which
# OIDs are arrays)
ARRAY_ELEMENTS: dict[int, int] = {
    143: 142, 199: 114, 271: 5069, 629: 628, 651: 650, 719: 718, 775: 774, 791: 790, 1000: 16, 1001: 17,
    1002: 18, 1003: 19, 1005: 21, 1006: 22, 1007: 23, 1009: 25, 1010: 27, 1011: 28, 1012: 29, 1013: 30,
    1014: 1042, 1015: 1043, 1016: 20, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700, 1022: 701,
    1027: 604, 1028: 26, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184, 1187: 1186,
    1231: 1700, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790, 2287: 2249, 2949: 2970, 2951: 2950,
    3221: 3220, 3643: 3614, 3645: 3615, 3807: 3802, 3905: 3904, 3907: 3906, 3909: 3908, 3911: 3910,
    3913: 3912, 3927: 3926, 4073: 4072, 5039: 5038, 6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534,
    6155: 4535, 6157: 4536,
}


def _bad(code: int = INVALID) -> ValueFailure:
    return ValueFailure(code)


class _R:
    """A bounds-checked reader over one value (every read refuses to pass the end)."""

    __slots__ = ("b", "pos", "end")

    def __init__(self, b: bytes, pos: int = 0, end: int | None = None) -> None:
        self.b = b
        self.pos = pos
        self.end = len(b) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.end - self.pos < n:
            raise _bad()
        v = self.b[self.pos:self.pos + n]
        self.pos += n
        return v

    def unpack(self, st: struct.Struct) -> Any:
        if self.end - self.pos < st.size:
            raise _bad()
        v = st.unpack_from(self.b, self.pos)[0]
        self.pos += st.size
        return v

    def u8(self) -> int:
        if self.pos >= self.end:
            raise _bad()
        v = self.b[self.pos]
        self.pos += 1
        return v

    def cstring(self) -> bytes:
        z = self.b.find(b"\x00", self.pos, self.end)
        if z < 0:
            raise _bad()
        v = self.b[self.pos:z]
        self.pos = z + 1
        return v

    def done(self) -> None:
        if self.pos != self.end:
            raise _bad()


def _exact(raw: bytes, st: struct.Struct) -> Any:
    if len(raw) != st.size:
        raise _bad()
    return st.unpack(raw)[0]


def _utf8(raw: bytes) -> str:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(INVALID_UTF8) from None


# ------------------------------------------------------------------ numbers
def _shortest(digits: str, exp10: int, neg: bool, fixed_below: int) -> str:
    """Ryu-style output: `digits` (no leading/trailing zeros) times 10**exp10 (position of the last digit),
    fixed notation when the scientific exponent lies in [-4, fixed_below), else d.ddde±XX."""
    sign = "-" if neg else ""
    n = len(digits)
    sci = exp10 + n - 1
    if -4 <= sci < fixed_below:
        if exp10 >= 0:
            return sign + digits + "0" * exp10
        point = n + exp10
        if point > 0:
            return sign + digits[:point] + "." + digits[point:]
        return sign + "0." + "0" * (-point) + digits
    mant = digits[0] + ("." + digits[1:] if n > 1 else "")
    return f"{sign}{mant}e{'-' if sci < 0 else '+'}{abs(sci):02d}"


def _special(v: float) -> str | None:
    if v != v:
        return "NaN"
    if v == float("inf"):
        return "Infinity"
    if v == float("-inf"):
        return "-Infinity"
    if v == 0:
        return "-0" if str(v).startswith("-") else "0"
    return None


def _digits_of(text: str) -> tuple[str, int]:
    """('123', -2) for '1.23' / '1.23e0' style shortest texts (no sign)."""
    mant, _, e = text.partition("e")
    exp = int(e) if e else 0
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    exp -= len(frac)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return stripped or "0", exp


def _on_boundary(text: str, a: float, st: struct.Struct, ust: struct.Struct) -> bool:
    """Whether decimal `text` lies exactly half-way between positive float `a` and a neighbour: PostgreSQL's
    shortest-output (Ryu) excludes those texts, although round-half-even would read them back as `a`."""
    c = Fraction(text)
    x = Fraction(a)
    bits = ust.unpack(st.pack(a))[0]
    for nb in (bits - 1, bits + 1):
        if nb < 0:
            continue
        other = st.unpack(ust.pack(nb))[0]
        if other != other or other in (float("inf"), float("-inf")):
            continue
        if c == (x + Fraction(other)) / 2:
            return True
    return False


def _shortest_digits(a: float, st: struct.Struct, ust: struct.Struct, start: int) -> tuple[str, int]:
    for p in range(start, 18):
        text = f"{a:.{p - 1}e}"
        try:
            back = st.unpack(st.pack(float(text)))[0]
        except OverflowError:   # rounded past the largest float4
            continue
        if back == a and not _on_boundary(text, a, st, ust):
            return _digits_of(text)
    return _digits_of(f"{a:.16e}")


def float8_text(v: float) -> str:
    """float8out with extra_float_digits > 0: the shortest text that reads back as the same double."""
    s = _special(v)
    if s is not None:
        return s
    a = abs(v)
    text = repr(a)
    if _on_boundary(text, a, _F8, _U64):
        digits, exp = _shortest_digits(a, _F8, _U64, len(_digits_of(text)[0]) + 1)
    else:
        digits, exp = _digits_of(text)
    return _shortest(digits, exp, v < 0, 15)


def float4_text(v: float) -> str:
    """float4out with extra_float_digits > 0: the shortest text that reads back as the same float4."""
    s = _special(v)
    if s is not None:
        return s
    digits, exp = _shortest_digits(abs(v), _F4, _U32, 1)
    return _shortest(digits, exp, v < 0, 6)


def _money(cents: int) -> str:
    neg = cents < 0
    units, frac = divmod(abs(cents), 100)
    whole = f"{units:,}"
    return f"{'-' if neg else ''}${whole}.{frac:02d}"


# ------------------------------------------------------------------ date and time
def _civil(days_since_2000: int) -> tuple[int, int, int]:
    """(year, month, day) of a day number (PostgreSQL's j2date: astronomical years, proleptic Gregorian)."""
    julian = days_since_2000 + _POSTGRES_EPOCH_JDATE
    julian += 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = ((julian + 305) % 365 if y != 0 else (julian + 306) % 366) + 123
    y += quad * 4
    year = y - 4800
    quad = julian * 2141 // 65536
    day = julian - 7834 * quad // 256
    month = (quad + 10) % 12 + 1
    return year, month, day


def _ymd(days: int) -> tuple[str, str]:
    year, month, day = _civil(days)
    bc = year <= 0
    shown = 1 - year if bc else year
    return f"{shown:04d}-{month:02d}-{day:02d}", " BC" if bc else ""


def _date(days: int) -> str:
    if days == INT32_MAX:
        return "infinity"
    if days == INT32_MIN:
        return "-infinity"
    text, bc = _ymd(days)
    return text + bc


def _clock(us: int) -> str:
    sec, frac = divmod(us, 1_000_000)
    text = f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
    if frac:
        text += ("." + f"{frac:06d}").rstrip("0")
    return text


def _timestamp(us: int, tz: bool) -> str:
    if us == INT64_MAX:
        return "infinity"
    if us == INT64_MIN:
        return "-infinity"
    days, tod = divmod(us, US_PER_DAY)
    text, bc = _ymd(days)
    return f"{text} {_clock(tod)}{'+00' if tz else ''}{bc}"


def _interval(us: int, days: int, months: int) -> str:
    parts: list[str] = []
    state = {"zero": True, "before": False}

    def add(value: int, unit: str) -> None:
        if value == 0:
            return
        lead = "" if state["zero"] else " "
        plus = "+" if state["before"] and value > 0 else ""
        parts.append(f"{lead}{plus}{value} {unit}{'' if value == 1 else 's'}")
        state["before"] = value < 0
        state["zero"] = False

    year = abs(months) // 12 * (1 if months >= 0 else -1)
    mon = months - year * 12
    add(year, "year")
    add(mon, "mon")
    add(days, "day")
    if state["zero"] or us != 0:
        neg = us < 0
        a = abs(us)
        hours = a // 3_600_000_000
        rest = a - hours * 3_600_000_000
        minutes = rest // 60_000_000
        rest -= minutes * 60_000_000
        secs, frac = divmod(rest, 1_000_000)
        text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
        if frac:
            text += ("." + f"{frac:06d}").rstrip("0")
        sign = "-" if neg else ("+" if state["before"] else "")
        parts.append(f"{'' if state['zero'] else ' '}{sign}{text}")
    return "".join(parts)


# ------------------------------------------------------------------ network
def _ipv6(addr: bytes) -> str:
    words = [addr[2 * k] << 8 | addr[2 * k + 1] for k in range(8)]
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for k in range(8):
        if words[k] == 0:
            if cur_base < 0:
                cur_base, cur_len = k, 1
            else:
                cur_len += 1
        else:
            if cur_base >= 0 and (best_base < 0 or cur_len > best_len):
                best_base, best_len = cur_base, cur_len
            cur_base = -1
    if cur_base >= 0 and (best_base < 0 or cur_len > best_len):
        best_base, best_len = cur_base, cur_len
    if best_base >= 0 and best_len < 2:
        best_base = -1
    out = []
    k = 0
    while k < 8:
        if best_base >= 0 and best_base <= k < best_base + best_len:
            if k == best_base:
                out.append(":")
            k += 1
            continue
        if k:
            out.append(":")
        if k == 6 and best_base == 0 and (best_len == 6 or (best_len == 7 and words[7] != 1)
                                          or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(".".join(str(b) for b in addr[12:16]))
            break
        out.append(f"{words[k]:x}")
        k += 1
    if best_base >= 0 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def _inet(raw: bytes, cidr: bool) -> str:
    r = _R(raw)
    family, bits, _is_cidr, nb = r.u8(), r.u8(), r.u8(), r.u8()
    if family == 2:
        maxbits, size = 32, 4
    elif family == 3:
        maxbits, size = 128, 16
    else:
        raise _bad()
    if bits > maxbits or nb != size:
        raise _bad()
    addr = r.take(nb)
    r.done()
    text = ".".join(str(b) for b in addr) if family == 2 else _ipv6(addr)
    if cidr or bits != maxbits:
        text += f"/{bits}"
    return text


def _mac(raw: bytes, size: int) -> str:
    if len(raw) != size:
        raise _bad()
    return ":".join(f"{b:02x}" for b in raw)


def _bits(raw: bytes) -> str:
    r = _R(raw)
    nbits = r.unpack(_I32)
    if nbits < 0:
        raise _bad()
    data = r.take((nbits + 7) // 8)
    r.done()
    return "".join("1" if data[k >> 3] & (0x80 >> (k & 7)) else "0" for k in range(nbits))


# ------------------------------------------------------------------ geometry
def _floats(raw: bytes, count: int, r: _R | None = None) -> list[str]:
    if r is None:
        if len(raw) != 8 * count:
            raise _bad()
        r = _R(raw)
    return [float8_text(r.unpack(_F8)) for _ in range(count)]


def _points(r: _R, n: int) -> str:
    if n < 0 or n > (r.end - r.pos) // 16:
        raise _bad()
    out = []
    for _ in range(n):
        x, y = _floats(b"", 2, r)
        out.append(f"({x},{y})")
    return ",".join(out)


def _path(raw: bytes) -> str:
    r = _R(raw)
    closed = r.u8()
    n = r.unpack(_I32)
    body = _points(r, n)
    r.done()
    return f"({body})" if closed else f"[{body}]"


def _polygon(raw: bytes) -> str:
    r = _R(raw)
    n = r.unpack(_I32)
    body = _points(r, n)
    r.done()
    return f"({body})"


# ------------------------------------------------------------------ misc builtins
def _tid(raw: bytes) -> str:
    if len(raw) != 6:
        raise _bad()
    return f"({_U32.unpack_from(raw, 0)[0]},{_U16.unpack_from(raw, 4)[0]})"


def _lsn(raw: bytes) -> str:
    v = _exact(raw, _U64)
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


def _snapshot(raw: bytes) -> str:
    r = _R(raw)
    n = r.unpack(_I32)
    xmin, xmax = r.unpack(_U64), r.unpack(_U64)
    if n < 0 or n > (r.end - r.pos) // 8:
        raise _bad()
    xips = [r.unpack(_U64) for _ in range(n)]
    r.done()
    return f"{xmin}:{xmax}:" + ",".join(str(x) for x in xips)


def _vector(raw: bytes, elem: int) -> str:
    """int2vector / oidvector: their send form is a 1-D array; the text is the elements joined by spaces."""
    dims, sent_elem, items = _array_items(raw)
    if len(dims) > 1 or sent_elem != elem or any(v is None for v in items):
        raise _bad()
    return " ".join(_scalar(elem, v, None, 1) for v in items if v is not None)


def _jsonish(raw: bytes) -> str:
    if len(raw) < 1 or raw[0] != 1:
        raise _bad()
    return _utf8(raw[1:])


_LEX_WEIGHTS = "DCBA"


def _tsvector(raw: bytes) -> str:
    r = _R(raw)
    n = r.unpack(_I32)
    if n < 0 or n > r.end - r.pos:
        raise _bad()
    out = []
    for _ in range(n):
        lex = _utf8(r.cstring())
        npos = r.unpack(_U16)
        text = "'" + lex.replace("'", "''").replace("\\", "\\\\") + "'"
        if npos:
            ps = []
            for _ in range(npos):
                wep = r.unpack(_U16)
                p = f"{wep & 0x3FFF}"
                w = wep >> 14
                if w:
                    p += _LEX_WEIGHTS[w]
                ps.append(p)
            text += ":" + ",".join(ps)
        out.append(text)
    r.done()
    return " ".join(out)


_OP_NOT, _OP_AND, _OP_OR, _OP_PHRASE = 1, 2, 3, 4
_OP_PRIORITY = {_OP_NOT: 4, _OP_PHRASE: 3, _OP_AND: 2, _OP_OR: 1}


def _tsquery(raw: bytes) -> str:
    r = _R(raw)
    size = r.unpack(_I32)
    if size < 0 or size > r.end - r.pos:
        raise _bad()
    items: list[tuple[Any, ...]] = []
    for _ in range(size):
        t = r.u8()
        if t == 1:
            weight, prefix = r.u8(), r.u8()
            items.append(("v", _utf8(r.cstring()), weight, prefix))
        elif t == 2:
            op = r.u8()
            if op not in _OP_PRIORITY:
                raise _bad()
            dist = r.unpack(_I16) if op == _OP_PHRASE else 0
            items.append(("o", op, dist))
        else:
            raise _bad()
    r.done()
    if not items:
        return ""
    # the items are in prefix (Polish) order: rebuild the tree, then print it infix like tsqueryout
    pos = 0

    def parse(depth: int) -> tuple[Any, ...]:
        nonlocal pos
        if pos >= len(items) or depth > 1000:
            raise _bad()
        it = items[pos]
        pos += 1
        if it[0] == "v":
            return it
        if it[1] == _OP_NOT:
            return ("o", _OP_NOT, 0, parse(depth + 1))
        right = parse(depth + 1)   # tsquery_send writes the right operand first
        left = parse(depth + 1)
        return ("o", it[1], it[2], left, right)

    try:
        tree = parse(0)
    except RecursionError:   # deeper than Python's stack allows: refused alike by both implementations
        raise _bad() from None
    if pos != len(items):
        raise _bad()

    def show(node: tuple[Any, ...], parent_prio: int, right_of_phrase: bool = False) -> str:
        if node[0] == "v":
            _t, text, weight, prefix = node
            s = "'" + text.replace("'", "''").replace("\\", "\\\\") + "'"
            if weight or prefix:
                s += ":"
                if prefix:
                    s += "*"
                for bit, ch in ((8, "A"), (4, "B"), (2, "C"), (1, "D")):
                    if weight & bit:
                        s += ch
            return s
        op = node[1]
        prio = _OP_PRIORITY[op]
        if op == _OP_NOT:
            inner = show(node[3], prio)
            s = "!" + inner
        else:
            left = show(node[3], prio)
            right = show(node[4], prio, op == _OP_PHRASE)
            if op == _OP_AND:
                sym = " & "
            elif op == _OP_OR:
                sym = " | "
            else:
                sym = " <-> " if node[2] == 1 else f" <{node[2]}> "
            s = left + sym + right
        needs = prio < parent_prio or (op == _OP_PHRASE and right_of_phrase)
        return f"( {s} )" if needs else s

    try:
        return show(tree, 0)
    except RecursionError:
        raise _bad() from None


# ------------------------------------------------------------------ containers
def _array_items(raw: bytes) -> tuple[list[tuple[int, int]], int, list[bytes | None]]:
    r = _R(raw)
    ndim = r.unpack(_I32)
    flags = r.unpack(_I32)
    elem = r.unpack(_U32)
    if ndim < 0 or ndim > 6 or flags not in (0, 1):
        raise _bad()
    dims = []
    total = 1 if ndim else 0
    for _ in range(ndim):
        n, lb = r.unpack(_I32), r.unpack(_I32)
        if n < 0:
            raise _bad()
        dims.append((n, lb))
        total *= n
    if total > (r.end - r.pos) // 4:
        raise _bad()
    items: list[bytes | None] = []
    for _ in range(total):
        length = r.unpack(_I32)
        if length == -1:
            items.append(None)
        else:
            items.append(r.take(length))
    r.done()
    return dims, elem, items


_ARRAY_SPECIAL = set('{}"\\ \t\n\r\v\f')
_RECORD_SPECIAL = set('"\\(),') | set(" \t\n\r\v\f")
_RANGE_SPECIAL = set('"\\()[],') | set(" \t\n\r\v\f")


def _quote_array(text: str, delim: str) -> str:
    if text == "" or text.upper() == "NULL" or any(c in _ARRAY_SPECIAL or c == delim for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _quote_doubling(text: str, special: set[str]) -> str:
    if text == "" or any(c in special for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    return text


def _array(raw: bytes, catalog: Any, depth: int, expect_elem: int = 0) -> str:
    dims, elem, items = _array_items(raw)
    if expect_elem and elem != expect_elem:
        raise _bad()
    if not dims or any(n == 0 for n, _lb in dims):
        return "{}"
    delim = ";" if elem == 603 else ","
    texts = [None if v is None else _quote_array(_scalar(elem, v, catalog, depth + 1), delim) for v in items]
    prefix = ""
    if any(lb != 1 for _n, lb in dims):
        prefix = "".join(f"[{lb}:{lb + n - 1}]" for n, lb in dims) + "="
    pos = 0

    def level(d: int) -> str:
        nonlocal pos
        n = dims[d][0]
        if d == len(dims) - 1:
            part = texts[pos:pos + n]
            pos += n
            return "{" + delim.join("NULL" if t is None else t for t in part) + "}"
        return "{" + delim.join(level(d + 1) for _ in range(n)) + "}"

    return prefix + level(0)


def _record(raw: bytes, catalog: Any, depth: int) -> str:
    r = _R(raw)
    n = r.unpack(_I32)
    if n < 0 or n > (r.end - r.pos) // 8:
        raise _bad()
    out = []
    for _ in range(n):
        oid = r.unpack(_U32)
        length = r.unpack(_I32)
        if length == -1:
            out.append("")
            continue
        out.append(_quote_doubling(_scalar(oid, r.take(length), catalog, depth + 1), _RECORD_SPECIAL))
    r.done()
    return "(" + ",".join(out) + ")"


_R_EMPTY, _R_LB_INC, _R_UB_INC, _R_LB_INF, _R_UB_INF = 0x01, 0x02, 0x04, 0x08, 0x10


def _range(raw: bytes, subtype: int, catalog: Any, depth: int) -> str:
    r = _R(raw)
    flags = r.u8()
    if flags & ~0x1F:
        raise _bad()
    if flags & _R_EMPTY:
        r.done()
        return "empty"
    lower = upper = ""
    if not flags & _R_LB_INF:
        lower = _quote_doubling(_scalar(subtype, r.take(r.unpack(_I32)), catalog, depth + 1), _RANGE_SPECIAL)
    if not flags & _R_UB_INF:
        upper = _quote_doubling(_scalar(subtype, r.take(r.unpack(_I32)), catalog, depth + 1), _RANGE_SPECIAL)
    r.done()
    return f"{'[' if flags & _R_LB_INC else '('}{lower},{upper}{']' if flags & _R_UB_INC else ')'}"


def _multirange(raw: bytes, range_oid: int, catalog: Any, depth: int) -> str:
    r = _R(raw)
    n = r.unpack(_I32)
    if n < 0 or n > (r.end - r.pos) // 5:
        raise _bad()
    out = []
    for _ in range(n):
        out.append(_scalar(range_oid, r.take(r.unpack(_I32)), catalog, depth + 1))
    r.done()
    return "{" + ",".join(out) + "}"


# ------------------------------------------------------------------ dispatch
def _text(raw: bytes) -> str:
    return _utf8(raw)


def _bool(raw: bytes) -> str:
    if len(raw) != 1 or raw[0] > 1:
        raise _bad()
    return "t" if raw[0] else "f"


def _time(raw: bytes) -> str:
    v = _exact(raw, _I64)
    if not 0 <= v <= US_PER_DAY:
        raise _bad()
    return _clock(v)


def _timetz(raw: bytes) -> str:
    if len(raw) != 12:
        raise _bad()
    us, zone = _I64.unpack_from(raw, 0)[0], _I32.unpack_from(raw, 8)[0]
    if not 0 <= us <= US_PER_DAY or not -(15 * 3600 + 59 * 60 + 59) <= zone <= 15 * 3600 + 59 * 60 + 59:
        raise _bad()
    return timetz_text(us, zone)


def _interval_raw(raw: bytes) -> str:
    if len(raw) != 16:
        raise _bad()
    return _interval(_I64.unpack_from(raw, 0)[0], _I32.unpack_from(raw, 8)[0], _I32.unpack_from(raw, 12)[0])


def _uuid(raw: bytes) -> str:
    if len(raw) != 16:
        raise _bad()
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _numeric(raw: bytes) -> str:
    return numeric_text_from_binary(bytes(raw))


_SIMPLE: dict[int, Callable[[bytes], str]] = {
    16: _bool,
    17: lambda b: "\\x" + bytes(b).hex(),
    18: lambda b: char_text(bytes(b)),
    19: _text, 25: _text, 1790: _text, 705: _text, 1042: _text, 1043: _text, 142: _text, 114: _text, 194: _text,
    20: lambda b: str(_exact(b, _I64)),
    21: lambda b: str(_exact(b, _I16)),
    23: lambda b: str(_exact(b, _I32)),
    26: lambda b: str(_exact(b, _U32)), 28: lambda b: str(_exact(b, _U32)), 29: lambda b: str(_exact(b, _U32)),
    5069: lambda b: str(_exact(b, _U64)),
    27: _tid,
    700: lambda b: float4_text(_exact(b, _F4)),
    701: lambda b: float8_text(_exact(b, _F8)),
    790: lambda b: _money(_exact(b, _I64)),
    1700: _numeric,
    1082: lambda b: _date(_exact(b, _I32)),
    1083: _time,
    1114: lambda b: _timestamp(_exact(b, _I64), False),
    1184: lambda b: _timestamp(_exact(b, _I64), True),
    1186: _interval_raw,
    1266: _timetz,
    2950: _uuid,
    3802: _jsonish, 4072: _jsonish,
    869: lambda b: _inet(b, False), 650: lambda b: _inet(b, True),
    829: lambda b: _mac(b, 6), 774: lambda b: _mac(b, 8),
    1560: _bits, 1562: _bits,
    3220: _lsn,
    600: lambda b: "({},{})".format(*_floats(b, 2)),
    601: lambda b: "[({},{}),({},{})]".format(*_floats(b, 4)),
    603: lambda b: "({},{}),({},{})".format(*_floats(b, 4)),
    628: lambda b: "{{{},{},{}}}".format(*_floats(b, 3)),
    718: lambda b: "<({},{}),{}>".format(*_floats(b, 3)),
    602: _path, 604: _polygon,
    2970: _snapshot, 5038: _snapshot,
    3614: _tsvector, 3615: _tsquery,
    22: lambda b: _vector(b, 21), 30: lambda b: _vector(b, 26),
}
_RECORD_OID = 2249
_ACLITEM_OID = 1033
#: aclitem's privilege letters by bit (ACL_ALL_RIGHTS_STR; 'm', MAINTAIN, since PostgreSQL 17)
_ACL_RIGHTS = "arwdDxtXUCTcsAm"


def _role_text(catalog: Any, oid: int) -> str:
    """aclitemout's name of a role: its name, quoted like putid() when it holds anything but letters, digits and
    '_' ('"' doubled); the OID's digits for a role the catalog does not know."""
    name = catalog.role_name(oid)
    if name is None:
        return str(oid)
    if name and all(c.isascii() and (c.isalnum() or c == "_") for c in name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _aclitem(raw: bytes, catalog: Any) -> str:
    """aclitemout: `grantee=privileges/grantor` (an empty grantee for PUBLIC, '*' after a privilege held with
    its grant option) from the fields in network order: grantee, grantor, and 32-bit privileges (grant options in
    the top 16 bits) up to PostgreSQL 15, 64-bit (the top 32) after."""
    if len(raw) == 12:
        grantee, grantor, privs = struct.unpack(">III", raw)
        shift, count = 16, 14
    elif len(raw) == 16:
        grantee, grantor, privs = struct.unpack(">IIQ", raw)
        shift, count = 32, 15
    else:
        raise _bad()
    rights, options = privs & ((1 << shift) - 1), privs >> shift
    if (rights | options) >> count:
        raise _bad()
    if getattr(catalog, "role_name", None) is None:
        raise _bad(NO_ROLE_NAMES)
    out = [_role_text(catalog, grantee) if grantee else "", "="]
    for bit, letter in enumerate(_ACL_RIGHTS[:count]):
        if rights & (1 << bit):
            out.append(letter)
            if options & (1 << bit):
                out.append("*")
    out += ["/", _role_text(catalog, grantor)]
    return "".join(out)


#: names of the builtin types rendered here that have no typed kind of their own (catalog.BUILTIN_TYPES)
TYPE_NAMES: dict[int, str] = {
    22: "int2vector", 27: "tid", 28: "xid", 29: "cid", 30: "oidvector", 194: "pg_node_tree", 600: "point",
    601: "lseg", 602: "path", 603: "box", 604: "polygon", 628: "line", 650: "cidr", 705: "unknown",
    718: "circle", 774: "macaddr8", 790: "money", 829: "macaddr", 869: "inet", 1560: "bit", 1562: "varbit",
    1790: "refcursor", 2249: "record", 2970: "txid_snapshot", 3220: "pg_lsn", 3614: "tsvector",
    3615: "tsquery", 3904: "int4range", 3906: "numrange", 3908: "tsrange", 3910: "tstzrange", 3912: "daterange",
    3926: "int8range", 4072: "jsonpath", 4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange", 5038: "pg_snapshot", 5069: "xid8",
    1033: "aclitem",
}

#: builtin non-array type OIDs whose binary form send_to_text renders without a catalog
RENDERED_TYPES = frozenset(_SIMPLE) | frozenset(RANGE_SUBTYPES) | frozenset(MULTIRANGE_RANGES) \
    | {_RECORD_OID, _ACLITEM_OID}


def _scalar(oid: int, raw: bytes, catalog: Any, depth: int) -> str:
    if depth > 64:
        raise _bad()
    fn = _SIMPLE.get(oid)
    if fn is not None:
        return fn(raw)
    sub = RANGE_SUBTYPES.get(oid)
    if sub is not None:
        return _range(raw, sub, catalog, depth)
    rng = MULTIRANGE_RANGES.get(oid)
    if rng is not None:
        return _multirange(raw, rng, catalog, depth)
    if oid == _RECORD_OID:
        return _record(raw, catalog, depth)
    if oid == _ACLITEM_OID:
        return _aclitem(raw, catalog)
    if oid in ARRAY_ELEMENTS:
        return _array(raw, catalog, depth)
    info = catalog.type_info(oid) if catalog is not None else None
    if info is None:
        raise _bad(NO_TEXT_FORM)
    if info.typtype == "d" and info.base_oid:
        return _scalar(info.base_oid, raw, catalog, depth + 1)
    if info.typtype == "e":
        return _utf8(raw)
    if info.typtype == "c":
        return _record(raw, catalog, depth)
    if info.category == "A" and info.element_oid:
        return _array(raw, catalog, depth)
    if info.typtype == "r" and getattr(info, "subtype_oid", 0):
        return _range(raw, info.subtype_oid, catalog, depth)
    if info.typtype == "m" and getattr(info, "subtype_oid", 0):
        return _multirange(raw, info.subtype_oid, catalog, depth)
    raise _bad(NO_TEXT_FORM)


def send_to_text(type_oid: int, raw: bytes, catalog: Any = None) -> str:
    """PostgreSQL's text output of one non-NULL value of type `type_oid` given in its binary send format.

    `catalog` (anything with `type_info(oid)`, e.g. PostgresTypeCatalog) resolves user-defined types; builtin
    types need none. Raises ValueFailure (spockwire.values.failures codes) when the bytes are not a valid send
    form of the type, or when a type met inside the value has no known send format (NO_TEXT_FORM).
    """
    return _scalar(int(type_oid), bytes(raw), catalog, 0)


def can_render(type_oid: int, catalog: Any = None, depth: int = 0) -> bool:
    """Whether `send_to_text` knows the send format of `type_oid`: builtin types, and through `catalog` domains,
    enums, user ranges and composites whose fields it can render (when the catalog has `composite_fields`)."""
    if type_oid in RENDERED_TYPES:
        return True
    elem = ARRAY_ELEMENTS.get(type_oid)
    if elem is not None:
        return can_render(elem, catalog, depth + 1)
    if catalog is None or depth > 16:
        return False
    info = catalog.type_info(type_oid)
    if info is None:
        return False
    if info.typtype == "d" and info.base_oid:
        return can_render(info.base_oid, catalog, depth + 1)
    if info.typtype == "e":
        return True
    if info.typtype == "c":
        fields = getattr(catalog, "composite_fields", None)
        oids = fields(type_oid) if fields is not None else None
        return oids is None or all(can_render(o, catalog, depth + 1) for o in oids)
    if info.category == "A" and info.element_oid:
        return can_render(info.element_oid, catalog, depth + 1)
    if info.typtype in ("r", "m") and getattr(info, "subtype_oid", 0):
        return can_render(info.subtype_oid, catalog, depth + 1)
    return False
