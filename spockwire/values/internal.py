"""PostgreSQL's internal ('i') datum layouts read by the pure-Python twin, and the descriptions of refused datums
that both implementations use (spockwire/wire/include/sw_varlena.h holds the C twin of the varlena, pglz and LZ4
readers; both accept and refuse exactly the same bytes).

An internal datum is what the server keeps in its tuples, in the server's byte order (the startup message's
`binary.bigendian`):

* varlena types (text, varchar, bpchar, xml, json, bytea, numeric, inet, cidr, bit, varbit, path, polygon,
  pg_snapshot, txid_snapshot, ...): a 1-byte header (short datum up to 126 bytes of data) or a 4-byte header, the
  length including the header. A 4-byte header may mark the datum as compressed inline: then a second word
  (`va_tcinfo`) holds the raw size (30 bits) and the method (2 bits: 0 pglz, 1 LZ4), and the compressed bytes
  follow. A 1-byte header of length 0 is an external TOAST pointer, which a stream never carries.
* fixed-length by-reference types (interval, timetz, uuid, macaddr, macaddr8, tid, circle): their struct,
  integers in the server's byte order.
* by-value types: the value in the server's byte order.

Values are turned into the type's binary send form and decoded like a 'b' value from there, so both forms give
the same result. jsonb, tsvector, tsquery, jsonpath and aclitem have layouts of their own, read by
spockwire.values.internal_types (LAYOUT_INVALID when their data is not one). Types whose internal layout is not
read here fail with INTERNAL_UNSUPPORTED.
"""
from __future__ import annotations

import struct

from .failures import COMPRESSED_CORRUPT, EXTERNAL_DATUM, INTERNAL_UNSUPPORTED, INVALID, LAYOUT_INVALID, \
    RAW_SIZE_MISMATCH, VARLENA_INVALID, DatumFailure, ValueFailure
from .internal_types import ACLITEM_OID, LAYOUT_TYPES, aclitem_fields, layout_send_form, numeric_send, swap_fields
from .kinds import JSONB

__all__ = ["DatumFailure", "unpack_varlena", "pglz_decompress", "lz4_decompress", "numeric_send",
           "internal_send_form", "describe_datum_failure", "VARLENA_TEXT_TYPES", "FIXED_FIELDS",
           "DATUM_CODES"]

#: failure codes whose text and byte offset come from describe_datum_failure
DATUM_CODES = frozenset({VARLENA_INVALID, EXTERNAL_DATUM, COMPRESSED_CORRUPT, RAW_SIZE_MISMATCH, LAYOUT_INVALID})

#: varlena types whose data is their send form: text-like types (in the database encoding) and bytea
VARLENA_TEXT_TYPES = frozenset({25, 1043, 1042, 142, 114, 17, 1790, 194, 19})
#: varlena types converted to their send form here (LAYOUT_TYPES: by spockwire.values.internal_types)
VARLENA_CONVERTED = frozenset({1700, 869, 650, 1560, 1562, 602, 604, 2970, 5038}) | LAYOUT_TYPES
#: fixed-length types: OID -> the sizes of their fields, each in the server's byte order (1: single bytes)
FIXED_FIELDS: dict[int, tuple[int, ...]] = {
    16: (1,), 18: (1,), 20: (8,), 21: (2,), 23: (4,), 26: (4,), 28: (4,), 29: (4,), 700: (4,), 701: (8,),
    790: (8,), 1082: (4,), 1083: (8,), 1114: (8,), 1184: (8,), 3220: (8,), 5069: (8,),
    1186: (8, 4, 4), 1266: (8, 4), 27: (2, 2, 2), 718: (8, 8, 8),
    2950: (1,) * 16, 829: (1,) * 6, 774: (1,) * 8,
}

_PGLZ, _LZ4 = 0, 1
_METHOD_NAMES = {_PGLZ: "pglz", _LZ4: "lz4"}
_EXTSIZE_MASK = 0x3FFFFFFF
# the most raw bytes one compressed byte can stand for: a 3-byte pglz tag gives 273, an LZ4 length byte 255
_PGLZ_MAX_RATIO = 91
_LZ4_MAX_RATIO = 255


# ------------------------------------------------------------------------------------------------------------------
# decompressors: `src` is the compressed data, which starts at byte `base` of the datum (positions in errors)

def _corrupt(method: str, pos: int, what: str) -> DatumFailure:
    return DatumFailure(COMPRESSED_CORRUPT, pos, f"has {method}-compressed data that is corrupt at byte {pos} of "
                                                  f"the datum: {what}")


def _copy_match(out: bytearray, off: int, length: int) -> None:
    start = len(out) - off
    if off >= length:
        out += out[start:start + length]
    else:   # overlapping: the match repeats the last `off` bytes
        chunk = bytes(out[start:])
        out += (chunk * (length // off + 1))[:length]


def pglz_decompress(src: bytes, rawsize: int, base: int = 0) -> bytes:
    """PostgreSQL's pglz format: control bytes (bit set, least significant first: a tag; clear: a literal byte);
    a tag is 2 bytes (length - 3 in the low nibble of the first, offset = its high nibble << 8 | second byte) or 3
    when the low nibble is 15 (length 18 + third byte). The output must be exactly `rawsize` bytes and every
    source byte used."""
    out = bytearray()
    n = len(src)
    sp = 0
    while sp < n:
        if len(out) == rawsize:
            raise _corrupt("pglz", base + sp, f"{n - sp} bytes are left over after the declared raw size "
                                              f"of {rawsize} bytes")
        ctrl = src[sp]
        sp += 1
        for bit in range(8):
            if sp >= n:
                break
            if ctrl & (1 << bit):
                at = sp
                if sp + 2 > n:
                    raise _corrupt("pglz", base + at, "a match tag is cut off")
                b0, b1 = src[sp], src[sp + 1]
                sp += 2
                length = (b0 & 0x0F) + 3
                off = ((b0 & 0xF0) << 4) | b1
                if length == 18:
                    if sp >= n:
                        raise _corrupt("pglz", base + at, "a match tag is cut off")
                    length += src[sp]
                    sp += 1
                if off == 0 or off > len(out):
                    raise _corrupt("pglz", base + at, f"a match refers {off} bytes back with {len(out)} bytes "
                                                      "decompressed")
                if len(out) + length > rawsize:
                    raise _corrupt("pglz", base + at, f"a match runs past the declared raw size of {rawsize} bytes")
                _copy_match(out, off, length)
            else:
                if len(out) >= rawsize:
                    raise _corrupt("pglz", base + sp, f"a literal runs past the declared raw size of {rawsize} "
                                                      "bytes")
                out.append(src[sp])
                sp += 1
    if len(out) != rawsize:
        raise DatumFailure(RAW_SIZE_MISMATCH, base + n, f"has pglz-compressed data that decompresses to "
                                                        f"{len(out)} bytes, not the declared raw size of {rawsize}")
    return bytes(out)


def _lz4_length(src: bytes, sp: int, value: int, base: int, at: int) -> tuple[int, int]:
    """An LZ4 length whose nibble was 15: add bytes until one is not 255."""
    n = len(src)
    while True:
        if sp >= n:
            raise _corrupt("lz4", base + at, "a length is cut off")
        b = src[sp]
        sp += 1
        value += b
        if b != 255:
            return value, sp


def lz4_decompress(src: bytes, rawsize: int, base: int = 0) -> bytes:
    """The LZ4 block format: sequences of a token (literal length high nibble, match length - 4 low nibble, 15
    continued by bytes while they are 255), the literals, a 2-byte little-endian match offset and the match; the
    last sequence ends after its literals at the end of the block. The output must be exactly `rawsize` bytes."""
    out = bytearray()
    n = len(src)
    sp = 0
    while True:
        if sp >= n:
            raise _corrupt("lz4", base + sp, "the block ends where a sequence should start")
        at = sp
        token = src[sp]
        sp += 1
        lit = token >> 4
        if lit == 15:
            lit, sp = _lz4_length(src, sp, lit, base, at)
        if lit > n - sp:
            raise _corrupt("lz4", base + at, f"a run of {lit} literals passes the end of the block")
        if lit > rawsize - len(out):
            raise _corrupt("lz4", base + at, f"literals run past the declared raw size of {rawsize} bytes")
        out += src[sp:sp + lit]
        sp += lit
        if sp == n:
            break
        if sp + 2 > n:
            raise _corrupt("lz4", base + sp, "a match offset is cut off")
        off = src[sp] | (src[sp + 1] << 8)
        if off == 0 or off > len(out):
            raise _corrupt("lz4", base + sp, f"a match refers {off} bytes back with {len(out)} bytes decompressed")
        sp += 2
        length = (token & 0x0F) + 4
        if length == 19:
            length, sp = _lz4_length(src, sp, length, base, at)
        if length > rawsize - len(out):
            raise _corrupt("lz4", base + at, f"a match runs past the declared raw size of {rawsize} bytes")
        _copy_match(out, off, length)
    if len(out) != rawsize:
        raise DatumFailure(RAW_SIZE_MISMATCH, base + n, f"has lz4-compressed data that decompresses to "
                                                        f"{len(out)} bytes, not the declared raw size of {rawsize}")
    return bytes(out)


# ------------------------------------------------------------------------------------------------------------------
# the varlena header

def unpack_varlena(raw: bytes, big_endian: bool) -> bytes:
    """The data of a varlena datum (decompressed when it is compressed inline); raises DatumFailure."""
    n = len(raw)
    if n < 1:
        raise DatumFailure(VARLENA_INVALID, 0, "is empty: a varlena datum has at least a 1-byte header")
    b0 = raw[0]
    if (b0 & 0x80) if big_endian else (b0 & 0x01):          # 1-byte header
        size = (b0 & 0x7F) if big_endian else (b0 >> 1)
        if size == 0:
            raise DatumFailure(EXTERNAL_DATUM, 0, "is an external TOAST pointer, which the internal format never "
                                                  "carries (the datum is not in the stream)")
        if size != n:
            raise DatumFailure(VARLENA_INVALID, 0, f"has a 1-byte varlena header of {size} bytes but {n} bytes "
                                                   "arrived")
        return raw[1:]
    if n < 4:
        raise DatumFailure(VARLENA_INVALID, 0, f"is {n} bytes, shorter than its 4-byte varlena header")
    word = int.from_bytes(raw[:4], "big" if big_endian else "little")
    if big_endian:
        size, compressed = word & 0x3FFFFFFF, (word >> 30) == 1
    else:
        size, compressed = word >> 2, (word & 0x03) == 0x02
    if size != n:
        raise DatumFailure(VARLENA_INVALID, 0, f"has a 4-byte varlena header of {size} bytes but {n} bytes arrived")
    if not compressed:
        return raw[4:]
    if n < 8:
        raise DatumFailure(VARLENA_INVALID, 0, f"is {n} bytes, shorter than the 8-byte header of a compressed "
                                               "datum")
    tcinfo = int.from_bytes(raw[4:8], "big" if big_endian else "little")
    rawsize, method = tcinfo & _EXTSIZE_MASK, tcinfo >> 30
    if method not in _METHOD_NAMES:
        raise _corrupt("inline", 4, f"compression method {method} is neither pglz (0) nor lz4 (1)")
    name = _METHOD_NAMES[method]
    if rawsize > (n - 8) * (_PGLZ_MAX_RATIO if method == _PGLZ else _LZ4_MAX_RATIO) + 16:
        raise _corrupt(name, 4, f"the declared raw size of {rawsize} bytes cannot come from {n - 8} compressed "
                                "bytes")
    if method == _PGLZ:
        return pglz_decompress(raw[8:], rawsize, 8)
    return lz4_decompress(raw[8:], rawsize, 8)


# ------------------------------------------------------------------------------------------------------------------
# internal datums to send forms

def _fail(code: int = INVALID) -> Exception:
    return ValueFailure(code)


def _u32(data: bytes, pos: int, big_endian: bool) -> int:
    return int.from_bytes(data[pos:pos + 4], "big" if big_endian else "little")


def _swap8s(data: bytes, big_endian: bool) -> bytes:
    return bytes(data) if big_endian else b"".join(data[k:k + 8][::-1] for k in range(0, len(data), 8))


def _varlena_send(oid: int, data: bytes, big_endian: bool) -> bytes:
    """The send form of a converted varlena type from the data of its datum."""
    if oid in LAYOUT_TYPES:
        try:
            return layout_send_form(oid, data, big_endian)
        except DatumFailure as failure:
            raise _fail(failure.code) from None
    if oid == 1700:
        return numeric_send(data, big_endian)
    if oid in (869, 650):            # family, bits, the address: send adds is_cidr and the address length
        if len(data) < 2:
            raise _fail()
        return bytes(data[:2]) + bytes((1 if oid == 650 else 0, len(data) - 2)) + bytes(data[2:])
    if oid in (1560, 1562):          # int32 bit length, then the bits
        if len(data) < 4:
            raise _fail()
        return struct.pack(">I", _u32(data, 0, big_endian)) + bytes(data[4:])
    if oid == 602:                   # path: npts, closed, padding, points -> closed byte, npts, points
        if len(data) < 12 or (len(data) - 12) % 16:
            raise _fail()
        npts, closed = _u32(data, 0, big_endian), _u32(data, 4, big_endian)
        if npts != (len(data) - 12) // 16:
            raise _fail()
        return bytes((1 if closed else 0,)) + struct.pack(">I", npts) + _swap8s(data[12:], big_endian)
    if oid == 604:                   # polygon: npts, bounding box, points -> npts, points
        if len(data) < 36 or (len(data) - 36) % 16:
            raise _fail()
        npts = _u32(data, 0, big_endian)
        if npts != (len(data) - 36) // 16:
            raise _fail()
        return struct.pack(">I", npts) + _swap8s(data[36:], big_endian)
    if oid in (2970, 5038):          # nxip, xmin, xmax, xip[]: 4 then 8-byte fields
        if len(data) < 20 or (len(data) - 20) % 8:
            raise _fail()
        nxip = _u32(data, 0, big_endian)
        if nxip != (len(data) - 20) // 8:
            raise _fail()
        return struct.pack(">I", nxip) + _swap8s(data[4:], big_endian)
    raise _fail(INTERNAL_UNSUPPORTED)


def internal_send_form(oid: int, raw: bytes, big_endian: bool) -> bytes:
    """The send form of an internal datum of builtin type `oid` (for the types kept as text, and the C
    implementation's cold path). Raises ValueFailure (INTERNAL_UNSUPPORTED for a layout not read here) or
    DatumFailure."""
    fields = FIXED_FIELDS.get(oid)
    if fields is not None:
        return swap_fields(raw, fields, big_endian)
    if oid == ACLITEM_OID:
        return aclitem_fields(raw, big_endian)
    if oid in VARLENA_TEXT_TYPES and oid != 19:
        return unpack_varlena(raw, big_endian)
    if oid in VARLENA_CONVERTED:
        return _varlena_send(oid, unpack_varlena(raw, big_endian), big_endian)
    raise _fail(INTERNAL_UNSUPPORTED)


def converted_send_form(oid: int, data: bytes, big_endian: bool) -> bytes:
    """The C implementation's cold path: the send form of a converted varlena type from its (decompressed) data."""
    return _varlena_send(oid, bytes(data), big_endian)


def _compressed(raw: bytes, big_endian: bool) -> bool:
    """Whether a valid varlena datum is compressed inline (a 4-byte header with the compressed mark)."""
    if (raw[0] & 0x80) if big_endian else (raw[0] & 0x01):
        return False
    return (raw[0] >> 6) == 1 if big_endian else (raw[0] & 0x03) == 0x02


def layout_oid(spec) -> int:
    """The type whose internal layout a column's datums have, for describe_datum_failure (0: a plain varlena)."""
    return 3802 if spec.kind == JSONB else spec.type_oid


def describe_datum_failure(raw: bytes, big_endian: bool, type_name: str, oid: int = 0) -> tuple[int, int, str]:
    """(code, byte of the datum, sentence) for a varlena datum of type `oid` refused by either implementation: its
    varlena header or compressed data, or (LAYOUT_TYPES) the layout of its data."""
    raw = bytes(raw)
    prefix = f"internal-format value of type {type_name}"
    try:
        data = unpack_varlena(raw, big_endian)
    except DatumFailure as failure:
        return failure.code, failure.pos, f"{prefix} {failure.detail}"
    if oid in LAYOUT_TYPES:
        try:
            layout_send_form(oid, data, big_endian)
        except DatumFailure as failure:
            if not _compressed(raw, big_endian):
                at = len(raw) - len(data) + failure.pos
                return failure.code, at, f"{prefix} has a corrupt layout at byte {at} of the datum: {failure.detail}"
            return failure.code, 0, (f"{prefix} has a corrupt layout at byte {failure.pos} of its decompressed "
                                     f"data: {failure.detail}")
    return VARLENA_INVALID, 0, f"{prefix} has a varlena header that cannot be read"
