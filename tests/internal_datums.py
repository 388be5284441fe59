"""Test-side writers of PostgreSQL internal ('i') datums, independent of the decoders: varlena headers in either
byte order, pglz and LZ4-block compressors (greedy, written from the format descriptions), and numeric's
internal layouts. Used by tests/test_internal_values.py and fuzz/seeds.py."""
from __future__ import annotations

import struct
from typing import Any

import tests.wire_encoder as W
from tests.wire_encoder import Col


def varlena(data: bytes, big: bool = False, short: bool | None = None) -> bytes:
    """An uncompressed varlena datum: a 1-byte header when `short` (default: when the data fits) else 4 bytes."""
    size = len(data)
    if short is None:
        short = size + 1 <= 127
    if short:
        assert size + 1 <= 127
        return bytes((0x80 | (size + 1),) if big else (((size + 1) << 1) | 1,)) + data
    total = size + 4
    word = total if big else total << 2
    return struct.pack(">I" if big else "<I", word) + data


def compressed(payload: bytes, rawsize: int, method: int, big: bool = False) -> bytes:
    """A 4-byte-header varlena marked compressed: header, va_tcinfo (raw size | method << 30), the data."""
    total = len(payload) + 8
    word = (total | 0x40000000) if big else ((total << 2) | 0x02)
    fmt = ">I" if big else "<I"
    return struct.pack(fmt, word) + struct.pack(fmt, rawsize | (method << 30)) + payload


def pglz(data: bytes) -> bytes:
    """pglz: groups of 8 items behind a control byte (bit set: a tag of length-3 / 12-bit offset, 3 bytes with a
    length byte past 17; clear: a literal)."""
    out = bytearray()
    items: list[bytes] = []
    flags: list[bool] = []
    i, n = 0, len(data)
    while i < n:
        best_len, best_off = 0, 0
        for off in range(1, min(i, 4095) + 1):
            length = 0
            while length < 273 and i + length < n and data[i + length] == data[i + length - off]:
                length += 1
            if length > best_len:
                best_len, best_off = length, off
        if best_len >= 3:
            if best_len >= 18:
                items.append(bytes((((best_off >> 4) & 0xF0) | 0x0F, best_off & 0xFF, best_len - 18)))
            else:
                items.append(bytes((((best_off >> 4) & 0xF0) | (best_len - 3), best_off & 0xFF)))
            flags.append(True)
            i += best_len
        else:
            items.append(data[i:i + 1])
            flags.append(False)
            i += 1
    for g in range(0, len(items), 8):
        ctrl = sum(1 << k for k, f in enumerate(flags[g:g + 8]) if f)
        out.append(ctrl)
        for item in items[g:g + 8]:
            out += item
    return bytes(out)


def _lz4_len(value: int) -> bytes:
    out = bytearray()
    while value >= 255:
        out.append(255)
        value -= 255
    out.append(value)
    return bytes(out)


def lz4(data: bytes) -> bytes:
    """The LZ4 block format: token (literals << 4 | match - 4, 15 continued by length bytes), literals, 2-byte
    little-endian offset, match; the last sequence is literals alone (the last 5 bytes always are)."""
    out = bytearray()
    i, n, anchor = 0, len(data), 0
    limit = n - 5
    while i < limit:
        best_len, best_off = 0, 0
        for off in range(1, min(i, 65535) + 1):
            length = 0
            while i + length < limit and data[i + length] == data[i + length - off]:
                length += 1
            if length > best_len:
                best_len, best_off = length, off
        if best_len < 4:
            i += 1
            continue
        lit = data[anchor:i]
        ml = best_len - 4
        out.append((min(len(lit), 15) << 4) | min(ml, 15))
        if len(lit) >= 15:
            out += _lz4_len(len(lit) - 15)
        out += lit
        out += struct.pack("<H", best_off)
        if ml >= 15:
            out += _lz4_len(ml - 15)
        i += best_len
        anchor = i
    lit = data[anchor:]
    out.append(min(len(lit), 15) << 4)
    if len(lit) >= 15:
        out += _lz4_len(len(lit) - 15)
    out += lit
    return bytes(out)


def numeric_long(ndigits_weight_sign_dscale: tuple[int, int, int, int], digits: list[int], big: bool = False) \
        -> bytes:
    """numeric's long internal data: n_sign_dscale, n_weight, digits (16-bit, server order); no varlena header."""
    _nd, weight, sign, dscale = ndigits_weight_sign_dscale
    e = ">" if big else "<"
    return struct.pack(e + "Hh", sign | dscale, weight) + b"".join(struct.pack(e + "h", d) for d in digits)


def numeric_short(weight: int, negative: bool, dscale: int, digits: list[int], big: bool = False) -> bytes:
    """numeric's short internal data: 0x8000 | sign 0x2000 | dscale << 7 | weight (7-bit two's complement)."""
    e = ">" if big else "<"
    head = 0x8000 | (0x2000 if negative else 0) | (dscale << 7) | (weight & 0x7F)
    return struct.pack(e + "H", head) + b"".join(struct.pack(e + "h", d) for d in digits)


def stream(values: list[Any], type_name: str, big: bool = False, startup: bool = True) -> list[bytes]:
    """pglogical messages: the startup message (binary.bigendian), one relation `public.h (v type_name)`, one
    insert per value (wire_encoder values: Internal(...) for 'i'), the commit."""
    msgs = []
    if startup:
        msgs.append(W.pglogical("S", params={"binary.internal_basetypes": "t", "binary.bigendian": "t" if big else "f",
                                             "binary.binary_basetypes": "t"}))
    msgs += [W.pglogical("B", final_lsn=0x2000, commit_ts=0, xid=7),
             W.pglogical("R", relid=9, namespace="public", name="h", columns=[Col("v")])]
    msgs += [W.pglogical("I", relid=9, new=[v]) for v in values]
    msgs.append(W.pglogical("C", commit_lsn=0x2000, end_lsn=0x2001, commit_ts=0))
    return msgs


def decode(impl: Any, values: list[Any], type_name: str, big: bool = False, startup: bool = True,
           roles: dict[int, str] | None = None, **kwargs: Any) -> list[Any]:
    """The decoded values of `values` in a one-column table of `type_name` (`roles`: the catalog's role names)."""
    from spockwire.values import StaticTypeCatalog
    catalog = StaticTypeCatalog({"public.h": {"v": type_name}}, roles=roles or {})
    dec = impl.Decoder(protocol="pglogical", type_catalog=catalog, **kwargs)
    for k, m in enumerate(stream(values, type_name, big, startup)):
        dec.feed(m, 0x1000 + k)
    return [r["v"] for ev in dec.drain() if hasattr(ev, "to_arrow") for r in ev.to_pylist()]


def decode_both(values: list[Any], type_name: str, big: bool = False, startup: bool = True,
                **kwargs: Any) -> list[Any]:
    """Decoded by both implementations, which must agree."""
    from tests.conftest import load_impl
    c = decode(load_impl("c"), values, type_name, big, startup, **kwargs)
    py = decode(load_impl("python"), values, type_name, big, startup, **kwargs)
    assert c == py
    return c


def error_both(values: list[Any], type_name: str, big: bool = False, startup: bool = True, **kwargs: Any) -> Any:
    """The ProtocolError both implementations raise (same class, text, offset, column)."""
    import pytest

    from spockwire.errors import ProtocolError
    from tests.conftest import load_impl
    errors = []
    for name in ("c", "python"):
        with pytest.raises(ProtocolError) as info:
            decode(load_impl(name), values, type_name, big, startup, **kwargs)
        errors.append(info.value)
    c, py = errors
    assert (type(c), str(c), c.offset, c.column, c.column_name) == \
        (type(py), str(py), py.offset, py.column, py.column_name)
    assert c.column_name == "v"
    return c


def insert_value_offset(value: bytes) -> int:
    """Byte of the insert message at which an 'i' value's datum starts: 'I', flags, relid, 'N', 'T', natts, kind,
    length."""
    return 1 + 1 + 4 + 1 + 1 + 2 + 1 + 4


# ------------------------------------------------------------------------------------------------------------------
# writers of the layouts of jsonb, tsvector and tsquery (from PostgreSQL's headers: jsonb.h, ts_type.h), with the
# data only: wrap them with varlena() or compressed()

def numeric_datum(value: Any, big: bool = False) -> bytes:
    """A numeric datum as numeric_in makes it (4-byte header; the short form when the scale and weight fit), its
    digits from the send form of tests/pg_send.py."""
    from decimal import Decimal

    from tests.pg_send import numeric_send
    sign, digs, exp = Decimal(str(value)).as_tuple()
    unscaled = int(Decimal((sign, digs, 0))) * 10 ** max(exp, 0)      # int() of a Decimal: no digit limit
    send = numeric_send(unscaled, max(-exp, 0))
    ndigits, weight, send_sign, dscale = struct.unpack_from(">hhHH", send)
    digits = list(struct.unpack_from(f">{ndigits}h", send, 8))
    if dscale <= 63 and -64 <= weight <= 63:
        data = numeric_short(weight, send_sign == 0x4000, dscale, digits, big)
    else:
        data = numeric_long((ndigits, weight, send_sign, dscale), digits, big)
    return varlena(data, big, short=False)


def _jsonb_element(v: Any, big: bool) -> tuple[int, bytes, bool]:
    """(JEntry type, data, starts aligned) of one jsonb element."""
    if v is None:
        return 0x40000000, b"", False
    if v is True or v is False:
        return (0x30000000 if v else 0x20000000), b"", False
    if isinstance(v, str):
        return 0x00000000, v.encode(), False
    if isinstance(v, (dict, list)):
        return 0x50000000, jsonb(v, big), True
    return 0x10000000, numeric_datum(v, big), True


def jsonb(value: Any, big: bool = False) -> bytes:
    """A JsonbContainer (the data of a jsonb datum) of a Python value: objects with their keys sorted by length,
    then bytes; every 32nd JEntry an end offset, the others lengths; numbers and containers 4-byte aligned."""
    e = ">" if big else "<"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        header, elems = 0x20000000 | len(keys), list(keys) + [value[k] for k in keys]
    elif isinstance(value, list):
        header, elems = 0x40000000 | len(value), value
    else:
        header, elems = 0x50000000 | 1, [value]       # a raw scalar: an array of one, marked scalar
    entries, data = [], bytearray()
    for k, el in enumerate(elems):
        kind, payload, aligned = _jsonb_element(el, big)
        begin = len(data)
        if aligned:
            data += bytes((-len(data)) % 4)
        data += payload
        word = (0x80000000 | len(data)) if k % 32 == 0 else len(data) - begin
        entries.append(struct.pack(e + "I", kind | word))
    return struct.pack(e + "I", header) + b"".join(entries) + bytes(data)


def tsvector(lexemes: list[tuple[str, list[tuple[int, int]]]], big: bool = False) -> bytes:
    """TSVectorData's data: int32 count, WordEntry bitfields (haspos, len, pos), lexemes, each with positions
    (uint16 count, then weight << 14 | position) at the next even offset."""
    e = ">" if big else "<"
    words, strs = [], bytearray()
    for text, positions in lexemes:
        raw = text.encode()
        pos = len(strs)
        strs += raw
        haspos = 1 if positions else 0
        words.append(struct.pack(e + "I", (haspos << 31 | len(raw) << 20 | pos) if big
                                 else (haspos | len(raw) << 1 | pos << 12)))
        if positions:
            strs += bytes(len(strs) % 2)
            strs += struct.pack(e + "H", len(positions))
            strs += b"".join(struct.pack(e + "H", w << 14 | p) for p, w in positions)
    return struct.pack(e + "i", len(lexemes)) + b"".join(words) + bytes(strs)


def tsquery(tree: Any, big: bool = False) -> bytes:
    """TSQueryData's data from a tree -- ("v", text, weight bits, prefix) | ("!", arg) | ("&" | "|", left, right)
    | ("<N>", N, left, right): items in prefix order (operator, right, left; `left` the distance to the left
    operand), operand texts in the order of the query's text (left to right), each with a NUL."""
    e = ">" if big else "<"
    texts = bytearray()
    offsets: dict[tuple[int, ...], int] = {}

    def place(node: Any, path: tuple[int, ...]) -> None:          # operand texts left to right
        if node[0] == "v":
            offsets[path] = len(texts)
            texts.extend(node[1].encode() + b"\x00")
        elif node[0] == "!":
            place(node[1], path + (1,))
        else:
            place(node[-2], path + (0,))
            place(node[-1], path + (1,))

    def items(node: Any, path: tuple[int, ...]) -> list[bytes]:
        if node[0] == "v":
            raw = node[1].encode()
            word = (len(raw) << 20 | offsets[path]) if big else (len(raw) | offsets[path] << 12)
            return [struct.pack(e + "BBBxiI", 1, node[2], node[3], 0, word)]
        if node[0] == "!":
            return [struct.pack(e + "BbhI4x", 2, 1, 0, 1)] + items(node[1], path + (1,))
        right, left = items(node[-1], path + (1,)), items(node[-2], path + (0,))
        oper, dist = {"&": (2, 0), "|": (3, 0)}.get(node[0], (4, node[1] if node[0] == "<N>" else 0))
        return [struct.pack(e + "BbhI4x", 2, oper, dist, 1 + len(right))] + right + left

    if tree is None:
        return struct.pack(e + "i", 0)
    place(tree, ())
    out = items(tree, ())
    return struct.pack(e + "i", len(out)) + b"".join(out) + bytes(texts)


_JP_KINDS = {"null": 0, "str": 1, "num": 2, "bool": 3, "[*]": 21, ".*": 22, "index": 23, "any": 24, "key": 25,
             "@": 26, "$": 27, "var": 28, "regex": 42, "decimal": 46}


def jsonpath(chain: list, lax: bool = True, big: bool = False) -> bytes:
    """JsonPath's data (header, then the items as flattenJsonPathParseItem lays them out) of a chain of items:
    ("$",) ("@",) ("null",) ("[*]",) (".*",) ("str" | "key" | "var", text) ("num", value) ("bool", b)
    ("method", type) ("bin" | "un" | "opt", type, chain...) ("decimal", chain | None, chain | None)
    ("index", [(chain, chain | None), ...]) ("any", first, last) ("regex", flags, chain, pattern)."""
    e = ">" if big else "<"
    buf = bytearray()

    def link(at: int, pos: int, child: list | None) -> None:
        if child is not None:
            buf[at:at + 4] = struct.pack(e + "i", flatten(child) - pos)

    def flatten(items: list) -> int:
        node = items[0]
        kind = node[1] if node[0] in ("method", "bin", "un", "opt") else _JP_KINDS[node[0]]
        pos = len(buf)
        buf.append(kind)
        buf.extend(bytes(-len(buf) % 4))
        next_at = len(buf)
        buf.extend(bytes(4))
        if node[0] in ("str", "key", "var"):
            raw = node[1].encode()
            buf.extend(struct.pack(e + "i", len(raw)) + raw + b"\x00")
        elif node[0] == "num":
            buf.extend(numeric_datum(node[1], big))
        elif node[0] == "bool":
            buf.append(1 if node[1] else 0)
        elif node[0] in ("bin", "un", "opt", "decimal"):
            args = node[2:] if node[0] != "decimal" else node[1:]
            at = len(buf)
            buf.extend(bytes(4 * len(args)))
            for k, arg in enumerate(args):
                link(at + 4 * k, pos, arg)
        elif node[0] == "index":
            buf.extend(struct.pack(e + "i", len(node[1])))
            at = len(buf)
            buf.extend(bytes(8 * len(node[1])))
            for k, (first, last) in enumerate(node[1]):
                link(at + 8 * k, pos, first)
                link(at + 8 * k + 4, pos, last)
        elif node[0] == "any":
            buf.extend(struct.pack(e + "II", node[1], node[2]))
        elif node[0] == "regex":
            raw = node[3].encode()
            buf.extend(struct.pack(e + "i", node[1]))
            at = len(buf)
            buf.extend(bytes(4) + struct.pack(e + "i", len(raw)) + raw + b"\x00")
            link(at, pos, node[2])
        if len(items) > 1:
            link(next_at, pos, items[1:])
        return pos

    flatten(chain)
    return struct.pack(e + "I", 1 | (0x80000000 if lax else 0)) + bytes(buf)
