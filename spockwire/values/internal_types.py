"""The internal ('i') layouts of jsonb, tsvector, tsquery, jsonpath and aclitem, read by the pure-Python twin
(spockwire/wire/include/sw_internal_types.h is the C twin: both accept and refuse exactly the same bytes).

Each reader takes the data of the datum (after its varlena header, decompressed; aclitem is fixed-length) in the
server's byte order and returns the type's binary send form, from which the value is decoded like a 'b' value:

* jsonb: a JsonbContainer -- a header word (count, and one of the object / array flags, the array one with the
  raw-scalar flag for a scalar at top level), one JEntry per element (per key, then per value, in an object), then
  the elements' data. A JEntry holds the element's type (string, numeric, false, true, null, container) and its
  length, or at every 32nd element its end offset. Numbers and nested containers start at 4-byte aligned offsets
  of the data (zero padding first); numbers are numeric datums. The send form is version 1 and jsonb's text:
  what jsonb_out prints (keys in their stored order, ", " and ": " between elements, numbers as numeric_out).
* tsvector: int32 count, count WordEntry words (bitfields: has positions, lexeme length, lexeme offset), then the
  lexemes one after another, each with positions followed at the next even offset by uint16 count and the
  positions (weight in the top 2 bits).
* tsquery: int32 count, count 12-byte QueryItems in prefix order (an operator, its right operand, then its left
  one: `left` is its distance to the left operand), then the operand texts, each followed by a NUL.
* jsonpath: a header word (version 1, 0x80000000 for lax) and a tree of items at 4-byte aligned offsets; the send
  form is version 1 and the text jsonpath_out prints.
* aclitem: grantee and grantor role OIDs and the privilege bits (32-bit with the grant options in the top half
  before PostgreSQL 16, 64-bit after); its "send form" here is those fields in network byte order, which
  spockwire.values.sendtext renders with the role names of the type catalog.

Every read is checked against the end of the data and every byte must be used; a refusal is a DatumFailure
(LAYOUT_INVALID) with the byte of the data where the problem is.
"""
from __future__ import annotations

import struct

from ._binary_py import numeric_text_from_binary
from .failures import INVALID, LAYOUT_INVALID, DatumFailure, ValueFailure

__all__ = ["LAYOUT_TYPES", "layout_send_form", "jsonb_send", "tsvector_send", "tsquery_send", "jsonpath_send",
           "aclitem_fields", "numeric_send", "swap_fields",
           "JSONB_OID", "TSVECTOR_OID", "TSQUERY_OID", "JSONPATH_OID", "ACLITEM_OID"]

JSONB_OID, TSVECTOR_OID, TSQUERY_OID, JSONPATH_OID, ACLITEM_OID = 3802, 3614, 3615, 4072, 1033

# jsonb
_JB_CMASK = 0x0FFFFFFF
_JB_FSCALAR, _JB_FOBJECT, _JB_FARRAY = 0x10000000, 0x20000000, 0x40000000
_JENTRY_OFFLENMASK, _JENTRY_TYPEMASK, _JENTRY_HAS_OFF = 0x0FFFFFFF, 0x70000000, 0x80000000
_JE_STRING, _JE_NUMERIC, _JE_FALSE, _JE_TRUE, _JE_NULL, _JE_CONTAINER = (0x00000000, 0x10000000, 0x20000000,
                                                                         0x30000000, 0x40000000, 0x50000000)


def _fail(pos: int, what: str) -> Exception:
    return DatumFailure(LAYOUT_INVALID, pos, what)


def _bad_value(code: int = INVALID) -> Exception:
    return ValueFailure(code)


class _Data:
    """The data of one datum in the server's byte order; every read checked against its end."""

    __slots__ = ("b", "n", "order")

    def __init__(self, b: bytes, big_endian: bool) -> None:
        self.b = b
        self.n = len(b)
        self.order = "big" if big_endian else "little"

    def need(self, pos: int, size: int, what: str) -> None:
        if size < 0 or pos + size > self.n:
            raise _fail(pos, f"{what} needs {size} bytes at byte {pos}, {max(self.n - pos, 0)} remaining")

    def u32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        return int.from_bytes(self.b[pos:pos + 4], self.order)

    def i32(self, pos: int, what: str) -> int:
        self.need(pos, 4, what)
        return int.from_bytes(self.b[pos:pos + 4], self.order, signed=True)

    def u16(self, pos: int, what: str) -> int:
        self.need(pos, 2, what)
        return int.from_bytes(self.b[pos:pos + 2], self.order)


# ------------------------------------------------------------------------------------------------------------------
# jsonb

_JSON_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r",
                 0x09: b"\\t"}


def json_string(s: bytes) -> bytes:
    """escape_json: the string in double quotes, '"' and '\\' escaped, control characters as \\b \\f \\n \\r \\t
    or \\u00xx."""
    out = bytearray(b'"')
    for c in s:
        esc = _JSON_ESCAPES.get(c)
        if esc is not None:
            out += esc
        elif c < 0x20:
            out += b"\\u%04x" % c
        else:
            out.append(c)
    out.append(0x22)
    return bytes(out)


def numeric_send(data: bytes, big_endian: bool) -> bytes:
    """numeric's send form from the data of its varlena: the short header (sign, 6-bit display scale, 7-bit
    weight), the special values (NaN, ±Infinity: the header alone) or the long header (sign and display scale,
    then a 16-bit weight), then base-10000 digits, all 16-bit in the server's byte order."""
    order = "big" if big_endian else "little"
    n = len(data)
    if n < 2 or n % 2:
        raise _bad_value()
    head = int.from_bytes(data[:2], order)
    if head & 0x8000:
        if (head & 0xC000) == 0xC000:                  # NaN, Infinity, -Infinity
            if head not in (0xC000, 0xD000, 0xF000) or n != 2:
                raise _bad_value()
            return struct.pack(">hhHH", 0, 0, head, 0)
        sign = 0x4000 if head & 0x2000 else 0
        dscale = (head & 0x1F80) >> 7
        weight = (head & 0x003F) - (64 if head & 0x0040 else 0)
        digits = data[2:]
    else:
        if n < 4:
            raise _bad_value()
        sign, dscale = head & 0xC000, head & 0x3FFF
        weight = int.from_bytes(data[2:4], order, signed=True)
        digits = data[4:]
    count = len(digits) // 2
    if count > 0x7FFF:
        raise _bad_value()
    out = bytearray(struct.pack(">hhHH", count, weight, sign, dscale))
    for k in range(count):
        pair = digits[2 * k:2 * k + 2]
        out += pair if big_endian else pair[::-1]
    return bytes(out)


def _numeric_text(d: _Data, start: int, end: int) -> bytes:
    """numeric_out of the numeric datum at [start, end) (an uncompressed varlena of exactly that size)."""
    if start >= end:
        raise _fail(start, "a number has no bytes")
    b0 = d.b[start]
    if (b0 & 0x80) if d.order == "big" else (b0 & 0x01):
        size, head = ((b0 & 0x7F) if d.order == "big" else (b0 >> 1)), 1
    else:
        if end - start < 4:
            raise _fail(start, f"a number of {end - start} bytes is shorter than its 4-byte varlena header")
        word = d.u32(start, "a number's varlena header")
        if (word >> 30 if d.order == "big" else word & 0x03) != 0:
            raise _fail(start, "a number is compressed or external")
        size, head = ((word & 0x3FFFFFFF) if d.order == "big" else (word >> 2)), 4
    if size != end - start:
        raise _fail(start, f"a number's varlena header says {size} bytes but its entry has {end - start}")
    try:
        return numeric_text_from_binary(numeric_send(d.b[start + head:end], d.order == "big")).encode()
    except ValueFailure:
        raise _fail(start, "a number is not a valid numeric datum") from None


def _aligned(d: _Data, base: int, begin: int, end: int, what: str) -> int:
    """The 4-byte aligned start (relative to `base`) of an element at [begin, end), after zero padding."""
    rel = begin - base
    start = base + ((rel + 3) & ~3)
    if start > end:
        raise _fail(begin, f"{what} of {end - begin} bytes is shorter than its alignment padding")
    if any(d.b[begin:start]):
        raise _fail(begin, f"{what} is preceded by padding that is not zero")
    return start


class _Container:
    """One jsonb container being printed: its elements' (type, begin, end) and the next one to print."""

    __slots__ = ("is_object", "count", "entries", "i")

    def __init__(self, d: _Data, start: int, end: int, top: bool) -> None:
        header = d.u32(start, "a container's header")
        count = header & _JB_CMASK
        flags = header & ~_JB_CMASK
        if flags == _JB_FARRAY | _JB_FSCALAR:
            if not top or count != 1:
                raise _fail(start, "a raw scalar container that is not the top-level one with one element")
        elif flags not in (_JB_FOBJECT, _JB_FARRAY):
            raise _fail(start, f"a container header has flags {flags >> 28:#x}, neither an object nor an array")
        self.is_object = flags == _JB_FOBJECT
        nent = count * 2 if self.is_object else count
        if nent > (end - start - 4) // 4:
            raise _fail(start, f"a container of {nent} entries does not fit its {end - start} bytes")
        base = start + 4 + 4 * nent
        entries = []
        prev = 0
        for k in range(nent):
            je = d.u32(start + 4 + 4 * k, "a JEntry")
            stop = je & _JENTRY_OFFLENMASK if je & _JENTRY_HAS_OFF else prev + (je & _JENTRY_OFFLENMASK)
            if stop < prev or base + stop > end:
                raise _fail(start + 4 + 4 * k, f"entry {k} ends at byte {stop} of data of {end - base} bytes")
            entries.append((je & _JENTRY_TYPEMASK, base + prev, base + stop))
            prev = stop
        if base + prev != end:
            raise _fail(base + prev, f"{end - base - prev} bytes follow the container's last element")
        self.count = count
        self.entries = entries
        self.i = 0


def _jsonb_scalar(d: _Data, kind: int, begin: int, end: int, base: int) -> bytes:
    if kind == _JE_STRING:
        return json_string(d.b[begin:end])
    if kind == _JE_NUMERIC:
        return _numeric_text(d, _aligned(d, base, begin, end, "a number"), end)
    if kind in (_JE_FALSE, _JE_TRUE, _JE_NULL):
        if end != begin:
            raise _fail(begin, f"a {'false true null'.split()[(kind - _JE_FALSE) >> 28]} has {end - begin} "
                               "bytes of data")
        return (b"false", b"true", b"null")[(kind - _JE_FALSE) >> 28]
    raise _fail(begin, f"an element has type {kind >> 28}, which is not a JEntry type")


def jsonb_text(data: bytes, big_endian: bool) -> bytes:
    """jsonb_out's text of a JsonbContainer (the data of a jsonb datum)."""
    d = _Data(data, big_endian)
    root = _Container(d, 0, d.n, True)
    out = bytearray()
    if root.count == 1 and not root.is_object and d.u32(0, "") & _JB_FSCALAR:
        kind, begin, end = root.entries[0]
        if kind == _JE_CONTAINER:
            raise _fail(begin, "a raw scalar container holds a container")
        return _jsonb_scalar(d, kind, begin, end, 4 + 4)
    out += b"{" if root.is_object else b"["
    stack = [root]
    while stack:
        c = stack[-1]
        if c.i == c.count:
            out += b"}" if c.is_object else b"]"
            stack.pop()
            continue
        if c.i:
            out += b", "
        if c.is_object:
            kind, begin, end = c.entries[c.i]
            if kind != _JE_STRING:
                raise _fail(begin, f"object key {c.i} is not a string")
            out += json_string(d.b[begin:end]) + b": "
            kind, begin, end = c.entries[c.count + c.i]
        else:
            kind, begin, end = c.entries[c.i]
        c.i += 1
        base = c.entries[0][1] if c.entries else 0      # where the container's data starts
        if kind == _JE_CONTAINER:
            start = _aligned(d, base, begin, end, "a container")
            child = _Container(d, start, end, False)
            out += b"{" if child.is_object else b"["
            stack.append(child)
        else:
            out += _jsonb_scalar(d, kind, begin, end, base)
    return bytes(out)


def jsonb_send(data: bytes, big_endian: bool) -> bytes:
    return b"\x01" + jsonb_text(data, big_endian)


# ------------------------------------------------------------------------------------------------------------------
# tsvector, tsquery

def _word_entry(word: int, big_endian: bool) -> tuple[int, int, int]:
    """(has positions, lexeme length, lexeme offset) of a WordEntry (bitfields: haspos:1, len:11, pos:20)."""
    if big_endian:
        return word >> 31, (word >> 20) & 0x7FF, word & 0xFFFFF
    return word & 1, (word >> 1) & 0x7FF, word >> 12


def _count(d: _Data, width: int, what: str) -> int:
    """The int32 count that starts the data, of entries of `width` bytes each after it."""
    size = d.i32(0, f"the {what} count")
    if size < 0 or size > (d.n - 4) // width:
        raise _fail(0, f"{size} {what}s cannot fit {d.n} bytes")
    return size


def tsvector_send(data: bytes, big_endian: bool) -> bytes:
    """tsvector's send form (int32 count; per lexeme: the text, NUL, uint16 npos, npos uint16 positions)."""
    d = _Data(data, big_endian)
    size = _count(d, 4, "lexeme")
    strs = 4 + 4 * size
    out = bytearray(struct.pack(">i", size))
    cur = 0
    for k in range(size):
        haspos, length, pos = _word_entry(d.u32(4 + 4 * k, "a word entry"), big_endian)
        if pos != cur:
            raise _fail(4 + 4 * k, f"lexeme {k} starts at byte {pos} of the lexemes, not {cur} where the one "
                                   "before it ends")
        d.need(strs + pos, length, f"lexeme {k}")
        lexeme = data[strs + pos:strs + pos + length]
        if 0 in lexeme:
            raise _fail(strs + pos, f"lexeme {k} holds a NUL byte")
        out += lexeme + b"\x00"
        cur = pos + length
        if haspos:
            cur += cur & 1
            npos = d.u16(strs + cur, f"the position count of lexeme {k}")
            d.need(strs + cur + 2, 2 * npos, f"the positions of lexeme {k}")
            out += struct.pack(">H", npos)
            for j in range(npos):
                out += struct.pack(">H", d.u16(strs + cur + 2 + 2 * j, ""))
            cur += 2 + 2 * npos
        else:
            out += b"\x00\x00"
    if strs + cur != d.n:
        raise _fail(strs + cur, f"{d.n - strs - cur} bytes follow the last lexeme")
    return bytes(out)


_QI_VAL, _QI_OPR = 1, 2
_OP_NOT, _OP_PHRASE = 1, 4


def tsquery_send(data: bytes, big_endian: bool) -> bytes:
    """tsquery's send form (int32 count; per item: type 1, weight, prefix, the text and a NUL, or type 2, the
    operator and for <N> the int16 distance), the items in their stored (prefix) order."""
    d = _Data(data, big_endian)
    size = _count(d, 12, "query item")
    texts = 4 + 12 * size
    out = bytearray(struct.pack(">i", size))
    spans = []
    subtree = [0] * size            # items in the subtree of each item, found from the last item back
    for k in range(size):
        at = 4 + 12 * k
        kind = data[at]
        if kind == _QI_VAL:
            weight, prefix = data[at + 1], data[at + 2]
            if weight > 15 or prefix > 1:
                raise _fail(at + 1, f"operand {k} has weight bits {weight:#x} and prefix flag {prefix}")
            word = d.u32(at + 8, "")
            length, dist = (word >> 20, word & 0xFFFFF) if big_endian else (word & 0xFFF, word >> 12)
            d.need(texts + dist, length + 1, f"the text of operand {k}")
            text = data[texts + dist:texts + dist + length]
            if 0 in text or data[texts + dist + length] != 0:
                raise _fail(texts + dist, f"the text of operand {k} is not {length} bytes and a NUL")
            spans.append((dist, length + 1))
            out += bytes((1, weight, prefix)) + text + b"\x00"
        elif kind == _QI_OPR:
            oper = data[at + 1]
            if not 1 <= oper <= 4:
                raise _fail(at + 1, f"operator {k} is {oper}, not one of ! & | <->")
            out += bytes((2, oper))
            if oper == _OP_PHRASE:
                out += data[at + 2:at + 4] if big_endian else data[at + 2:at + 4][::-1]
        else:
            raise _fail(at, f"query item {k} has type {kind}, neither an operand (1) nor an operator (2)")
    for k in range(size - 1, -1, -1):
        at = 4 + 12 * k
        if data[at] == _QI_VAL:
            subtree[k] = 1
            continue
        right = k + 1
        if right >= size:
            raise _fail(at, f"operator {k} has no operand after it")
        if data[at + 1] == _OP_NOT:
            subtree[k] = 1 + subtree[right]
            continue
        left = right + subtree[right]
        if d.u32(at + 4, "") != left - k:
            raise _fail(at + 4, f"operator {k} says its left operand is {d.u32(at + 4, '')} items on, not "
                                f"{left - k}")
        if left >= size:
            raise _fail(at, f"operator {k} has no left operand")
        subtree[k] = 1 + subtree[right] + subtree[left]
    if size and subtree[0] != size:
        raise _fail(4 + 12 * subtree[0], f"items {subtree[0]} to {size - 1} are outside the query's tree")
    cur = 0
    for dist, length in sorted(spans):
        if dist != cur:
            raise _fail(texts + min(dist, cur), f"operand texts are not one after another at byte {cur}")
        cur += length
    if texts + cur != d.n:
        raise _fail(texts + cur, f"{d.n - texts - cur} bytes follow the operand texts")
    return bytes(out)


# ------------------------------------------------------------------------------------------------------------------
# aclitem

def swap_fields(raw: bytes, fields: tuple[int, ...], big_endian: bool) -> bytes:
    """A fixed-length datum with its integer fields in big-endian order (the send form's); raises on length."""
    if len(raw) != sum(fields):
        raise _bad_value()
    if big_endian:
        return bytes(raw)
    out = bytearray()
    pos = 0
    for size in fields:
        out += raw[pos:pos + size][::-1]
        pos += size
    return bytes(out)


def aclitem_fields(raw: bytes, big_endian: bool) -> bytes:
    """aclitem's fields in network byte order: grantee, grantor (uint32), privileges (uint32 up to PostgreSQL 15,
    uint64 after). Raises ValueFailure (INVALID) for another size."""
    if len(raw) not in (12, 16):
        raise ValueFailure(INVALID)
    return swap_fields(raw, (4, 4, len(raw) - 8), big_endian)


# ------------------------------------------------------------------------------------------------------------------

# ------------------------------------------------------------------------------------------------------------------
# jsonpath: items are a type byte, zero padding to a 4-byte boundary, int32 `next` (the offset of the next item of
# the chain from this item's type byte, 0 for none), then the payload; arguments are offsets from the item too.
# Every link points forward (children follow their item), each item is reached once, and the items tile the data.

_JP_LAX = 0x80000000
#: argument nesting deeper than this is refused (the printer of the twin recurses once per level)
JSONPATH_MAX_DEPTH = 100
_JP_PLAIN = {0: "null", 21: "[*]", 26: "@", 27: "$", 31: ".type()", 32: ".size()", 33: ".abs()", 34: ".floor()",
             35: ".ceiling()", 36: ".double()", 38: ".keyvalue()", 40: "last", 43: ".bigint()", 44: ".boolean()",
             45: ".date()", 47: ".integer()", 48: ".number()", 49: ".string()"}
_JP_BINARY = {4: "&&", 5: "||", 8: "==", 9: "!=", 10: "<", 11: ">", 12: "<=", 13: ">=", 14: "+", 15: "-", 16: "*",
              17: "/", 18: "%", 41: "starts with"}
_JP_PRIORITY = {5: 0, 4: 1, 8: 2, 9: 2, 10: 2, 11: 2, 12: 2, 13: 2, 41: 2, 14: 3, 15: 3, 16: 4, 17: 4, 18: 4,
                19: 5, 20: 5}
_JP_UNARY = {6: ("!(", ")"), 7: ("(", ") is unknown"), 29: ("?(", ")"), 30: ("exists (", ")")}
_JP_OPTIONAL = {37: ".datetime(", 50: ".time(", 51: ".time_tz(", 52: ".timestamp(", 53: ".timestamp_tz("}
_JP_REGEX_FLAGS = ((0x01, "i"), (0x02, "s"), (0x04, "m"), (0x08, "x"), (0x10, "q"))
_JP_STRINGS = (1, 25, 28)     # string, key, variable
_U32_MAX = 0xFFFFFFFF


class _JsonPath:
    """One jsonpath's items (at `base` of the data) read and printed like printJsonPathItem."""

    def __init__(self, d: _Data, base: int) -> None:
        self.d = d
        self.base = base
        self.spans: dict[int, int] = {}          # item start -> end of its payload

    def item(self, pos: int) -> tuple[int, int, int]:
        """(type, next link, start of the payload) of the item at `pos` (relative to base), reached once."""
        d, at = self.d, self.base + pos
        if pos in self.spans:
            raise _fail(at, f"the item at byte {at} is reached twice")
        d.need(at, 1, "an item")
        kind = d.b[at]
        payload = self.base + ((pos + 1 + 3) & ~3)
        d.need(at + 1, payload - at - 1, "an item's padding")
        if any(d.b[at + 1:payload]):
            raise _fail(at + 1, "an item's padding is not zero")
        nxt = d.i32(payload, "an item's next link")
        self.spans[pos] = payload + 4 - self.base
        return kind, nxt, payload + 4

    def link(self, pos: int, at: int, optional: bool = False) -> int | None:
        """The item an offset at `at` (from the item at `pos`) points to; None for an optional one of 0."""
        off = self.d.i32(at, "an item's link")
        if off == 0 and optional:
            return None
        if off <= 0:
            raise _fail(at, f"an item's link {off} does not point forward")
        return pos + off

    def kind_at(self, pos: int) -> int:
        self.d.need(self.base + pos, 1, "an item")
        return self.d.b[self.base + pos]

    def done(self, pos: int, end: int) -> None:
        self.spans[pos] = end - self.base

    def print_chain(self, pos: int, in_key: bool, brackets: bool, depth: int) -> bytes:
        """An item and the items chained after it by their next links."""
        out = bytearray()
        while True:
            text, nxt = self.print_item(pos, in_key, brackets, depth)
            out += text
            if nxt == 0:
                return bytes(out)
            if nxt < 0:
                raise _fail(self.base + pos, f"an item's next link {nxt} does not point forward")
            pos, in_key, brackets = pos + nxt, True, True

    def arg(self, pos: int, depth: int, brackets: bool = False) -> bytes:
        if depth >= JSONPATH_MAX_DEPTH:
            raise _fail(self.base + pos, f"the items nest deeper than {JSONPATH_MAX_DEPTH} levels")
        return self.print_chain(pos, False, brackets, depth + 1)

    def operand(self, parent: int, pos: int, depth: int) -> bytes:
        """An operand, in brackets when its operation binds no tighter than the parent's."""
        brackets = _JP_PRIORITY.get(self.kind_at(pos), 6) <= _JP_PRIORITY.get(parent, 6)
        return self.arg(pos, depth, brackets)

    def print_item(self, pos: int, in_key: bool, brackets: bool, depth: int) -> tuple[bytes, int]:
        d = self.d
        kind, nxt, p = self.item(pos)
        end = p
        if kind in _JP_PLAIN:
            out = _JP_PLAIN[kind].encode()
        elif kind in _JP_STRINGS:
            length = d.i32(p, "a string's length")
            d.need(p + 4, length + 1 if length >= 0 else -1, "a string")
            if d.b[p + 4 + length] != 0:
                raise _fail(p + 4 + length, "a string does not end in a NUL")
            end = p + 4 + length + 1
            text = json_string(d.b[p + 4:p + 4 + length])
            out = (b"." if in_key else b"") + text if kind == 25 else (b"$" + text if kind == 28 else text)
        elif kind == 2:
            size = _varlena_size(d, p)
            end = p + size
            text = _numeric_text(d, p, end)
            out = b"(" + text + b")" if nxt else text
        elif kind == 3:
            d.need(p, 1, "a boolean")
            if d.b[p] > 1:
                raise _fail(p, f"a boolean is {d.b[p]}")
            end = p + 1
            out = b"true" if d.b[p] else b"false"
        elif kind in _JP_BINARY:
            left, right = self.link(pos, p), self.link(pos, p + 4)
            end = p + 8
            self.done(pos, end)
            out = (self.operand(kind, left, depth) + b" " + _JP_BINARY[kind].encode() + b" "
                   + self.operand(kind, right, depth))
            if brackets:
                out = b"(" + out + b")"
        elif kind in (19, 20):
            arg = self.link(pos, p)
            end = p + 4
            self.done(pos, end)
            out = (b"+" if kind == 19 else b"-") + self.operand(kind, arg, depth)
            if brackets:
                out = b"(" + out + b")"
        elif kind in _JP_UNARY:
            arg = self.link(pos, p)
            end = p + 4
            self.done(pos, end)
            head, tail = _JP_UNARY[kind]
            out = head.encode() + self.arg(arg, depth) + tail.encode()
        elif kind in _JP_OPTIONAL:
            arg = self.link(pos, p, optional=True)
            end = p + 4
            self.done(pos, end)
            out = _JP_OPTIONAL[kind].encode() + (self.arg(arg, depth) if arg is not None else b"") + b")"
        elif kind == 46:
            left, right = self.link(pos, p, optional=True), self.link(pos, p + 4, optional=True)
            end = p + 8
            self.done(pos, end)
            out = b".decimal(" + (self.arg(left, depth) if left is not None else b"")
            out += (b"," + self.arg(right, depth) if right is not None else b"") + b")"
        elif kind == 22:
            out = b".*" if in_key else b"*"
        elif kind == 24:
            first, last = d.u32(p, "a .** level"), d.u32(p + 4, "a .** level")
            end = p + 8
            if first == 0 and last == _U32_MAX:
                levels = "**"
            elif first == last:
                levels = "**{last}" if first == _U32_MAX else f"**{{{first}}}"
            elif first == _U32_MAX:
                levels = f"**{{last to {last}}}"
            elif last == _U32_MAX:
                levels = f"**{{{first} to last}}"
            else:
                levels = f"**{{{first} to {last}}}"
            out = (b"." if in_key else b"") + levels.encode()
        elif kind == 23:
            count = d.i32(p, "an array subscript count")
            if count < 0 or count > (d.n - p - 4) // 8:
                raise _fail(p, f"{count} array subscripts cannot fit the data")
            end = p + 4 + 8 * count
            self.done(pos, end)
            parts = []
            for k in range(count):
                first = self.link(pos, p + 4 + 8 * k)
                last = self.link(pos, p + 8 + 8 * k, optional=True)
                part = self.arg(first, depth)
                if last is not None:
                    part += b" to " + self.arg(last, depth)
                parts.append(part)
            out = b"[" + b",".join(parts) + b"]"
        elif kind == 42:
            flags = d.i32(p, "like_regex flags")
            if flags & ~0x1F:
                raise _fail(p, f"like_regex flags {flags:#x} are not i, s, m, x, q")
            expr = self.link(pos, p + 4)
            length = d.i32(p + 8, "a pattern's length")
            d.need(p + 12, length + 1 if length >= 0 else -1, "a pattern")
            if d.b[p + 12 + length] != 0:
                raise _fail(p + 12 + length, "a pattern does not end in a NUL")
            end = p + 12 + length + 1
            self.done(pos, end)
            out = self.operand(kind, expr, depth) + b" like_regex " + json_string(d.b[p + 12:p + 12 + length])
            if flags:
                out += b' flag "' + "".join(c for bit, c in _JP_REGEX_FLAGS if flags & bit).encode() + b'"'
            if brackets:
                out = b"(" + out + b")"
        else:
            raise _fail(self.base + pos, f"an item has type {kind}, which is not a jsonpath item")
        self.done(pos, end)
        return out, nxt


def _varlena_size(d: _Data, start: int) -> int:
    """The size a varlena header at `start` gives (1-byte or uncompressed 4-byte header), checked to fit."""
    d.need(start, 1, "a number")
    b0 = d.b[start]
    if (b0 & 0x80) if d.order == "big" else (b0 & 0x01):
        size = (b0 & 0x7F) if d.order == "big" else (b0 >> 1)
    else:
        word = d.u32(start, "a number's varlena header")
        size = (word & 0x3FFFFFFF) if d.order == "big" else (word >> 2)
    d.need(start, size, "a number")
    return size


def jsonpath_text(data: bytes, big_endian: bool) -> bytes:
    """jsonpath_out's text of a JsonPath (the data of a jsonpath datum)."""
    d = _Data(data, big_endian)
    header = d.u32(0, "the header")
    if header & ~_JP_LAX != 1:
        raise _fail(0, f"the header {header:#x} is not version 1")
    path = _JsonPath(d, 4)
    text = path.print_chain(0, False, True, 0)
    end = 0
    for pos in sorted(path.spans):
        if pos != end:
            raise _fail(4 + min(pos, end), f"the items leave bytes {end} to {pos} unused or overlap")
        end = path.spans[pos]
    if 4 + end != d.n:
        raise _fail(4 + end, f"{d.n - 4 - end} bytes follow the last item")
    return (b"" if header & _JP_LAX else b"strict ") + text


def jsonpath_send(data: bytes, big_endian: bool) -> bytes:
    return b"\x01" + jsonpath_text(data, big_endian)


_READERS = {JSONB_OID: jsonb_send, TSVECTOR_OID: tsvector_send, TSQUERY_OID: tsquery_send,
            JSONPATH_OID: jsonpath_send}
#: varlena types whose internal layout is read here
LAYOUT_TYPES = frozenset(_READERS)


def layout_send_form(oid: int, data: bytes, big_endian: bool) -> bytes:
    """The send form of a LAYOUT_TYPES datum from its data; raises DatumFailure (LAYOUT_INVALID)."""
    return _READERS[oid](bytes(data), big_endian)
