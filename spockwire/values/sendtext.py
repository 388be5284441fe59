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

This module dispatches on the type and renders the containers (arrays, records, ranges, multiranges); the text of
each builtin scalar type is in spockwire.values.sendtext_scalars.
"""
from __future__ import annotations

from typing import Any, Callable

from ._binary_py import char_text
from .failures import NO_TEXT_FORM
from .sendtext_scalars import (_F4, _F8, _I16, _I32, _I64, _U32, _U64, _R, _aclitem, _bad, _bits, _bool, _date, _exact,
                               _floats, _inet, _interval_raw, _jsonish, _lsn, _mac, _money, _numeric, _path, _polygon,
                               _snapshot, _text, _tid, _time, _timestamp, _timetz, _tsquery, _tsvector, _utf8, _uuid,
                               float4_text, float8_text)

__all__ = ["send_to_text", "can_render", "RENDERED_TYPES", "TYPE_NAMES", "RANGE_SUBTYPES", "MULTIRANGE_RANGES",
           "ARRAY_ELEMENTS", "float8_text", "float4_text"]


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


def _vector(raw: bytes, elem: int) -> str:
    """int2vector / oidvector: their send form is a 1-D array; the text is the elements joined by spaces."""
    dims, sent_elem, items = _array_items(raw)
    if len(dims) > 1 or sent_elem != elem or any(v is None for v in items):
        raise _bad()
    return " ".join(_scalar(elem, v, None, 1) for v in items if v is not None)


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
