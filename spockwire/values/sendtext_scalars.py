"""The text of each builtin scalar type's send form, for spockwire.values.sendtext (which dispatches on the type
and renders arrays, records, ranges and multiranges): numbers, date and time, network, geometric and full-text
types, and the small readers they share. Every text is exactly what the type's output function prints under the
pinned session settings.
"""
from __future__ import annotations

import struct
from fractions import Fraction
from typing import Any

from ._binary_py import numeric_text_from_binary, timetz_text
from .failures import INVALID, INVALID_UTF8, NO_ROLE_NAMES, ValueFailure

_I16, _U16, _I32, _U32, _I64, _U64 = (struct.Struct(">h"), struct.Struct(">H"), struct.Struct(">i"),
                                      struct.Struct(">I"), struct.Struct(">q"), struct.Struct(">Q"))
_F4, _F8 = struct.Struct(">f"), struct.Struct(">d")
US_PER_DAY = 86_400_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_POSTGRES_EPOCH_JDATE = 2451545   # Julian day of 2000-01-01


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


# ------------------------------------------------------------------ simple types
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
