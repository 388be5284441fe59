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
           **kwargs: Any) -> list[Any]:
    """The decoded values of `values` in a one-column table of `type_name`."""
    from spockwire.values import StaticTypeCatalog
    dec = impl.Decoder(protocol="pglogical", type_catalog=StaticTypeCatalog({"public.h": {"v": type_name}}),
                       **kwargs)
    for k, m in enumerate(stream(values, type_name, big, startup)):
        dec.feed(m, 0x1000 + k)
    return [r["v"] for ev in dec.drain() if hasattr(ev, "to_arrow") for r in ev.to_pylist()]


def insert_value_offset(value: bytes) -> int:
    """Byte of the insert message at which an 'i' value's datum starts: 'I', flags, relid, 'N', 'T', natts, kind,
    length."""
    return 1 + 1 + 4 + 1 + 1 + 2 + 1 + 4
