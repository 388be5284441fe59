"""A test-side encoder: byte-exact spock, pglogical and pgoutput messages built from Python values.

Every message is described by a table of fields (name, codec, default); `encode` walks the table. The layouts follow
docs/protocols.md. The encoder writes whatever it is asked to, so the malformed-input tests can override any
field (flags, counts, kinds) to build broken messages on purpose.

Tuple values are written by their Python type:

* ``None`` -> ``'n'`` (NULL)
* ``UNCHANGED`` -> ``'u'`` (unchanged TOAST datum)
* ``str`` -> ``'t'`` (text; spock/pglogical append the NUL that the length counts)
* ``bytes`` -> ``'b'`` (send/recv bytes)
* ``Internal(b"...")`` -> ``'i'`` (raw Datum; spock/pglogical only)
* ``Raw(kind, body)`` -> the kind byte and the body verbatim (for malformed input)
"""
from __future__ import annotations

import struct
from typing import Any, Callable, NamedTuple

__all__ = [
    "UNCHANGED", "Internal", "Raw", "Col", "encode", "spock", "pglogical", "pgoutput", "frames",
    "tuple_data", "spock_sync_event", "PROTOCOLS",
]


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()


class Internal(bytes):
    """A raw Datum sent with kind ``'i'``."""


class Raw(NamedTuple):
    """A tuple entry written verbatim: one kind byte, then ``body`` (no length added)."""
    kind: bytes
    body: bytes = b""


class Col(NamedTuple):
    """One column of a relation message."""
    name: str
    type_oid: int = 25
    typmod: int = -1
    key: bool = False
    flags: int | None = None          # None: 1 if key else 0


_REQUIRED = object()
_OMIT = object()     # optional field: written only when the caller gives a value that is not None


class Field(NamedTuple):
    name: str
    codec: Callable[[Any, dict], bytes]
    default: Any = _REQUIRED


# ---------------------------------------------------------------------------------------------------------------
# scalar codecs

def _fixed(fmt: str) -> Callable[[Any, dict], bytes]:
    packer = struct.Struct(fmt)
    return lambda value, msg: packer.pack(value)


u8, u16, u32, u64 = _fixed(">B"), _fixed(">H"), _fixed(">I"), _fixed(">Q")
i32, i64 = _fixed(">i"), _fixed(">q")


def _text(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def cstring(value, msg) -> bytes:
    return _text(value) + b"\0"


def lenstr8(value, msg) -> bytes:
    """u8 length including the NUL, the text, the NUL (pglogical/spock names)."""
    data = _text(value) + b"\0"
    return struct.pack(">B", len(data)) + data


def char(value, msg) -> bytes:
    data = _text(value)
    assert len(data) == 1, value
    return data


def raw_bytes(value, msg) -> bytes:
    return bytes(value)


def sized_bytes(value, msg) -> bytes:
    """u32 length, then the bytes."""
    return struct.pack(">I", len(value)) + bytes(value)


def startup_pairs(value, msg) -> bytes:
    """cstring key / cstring value pairs up to the end of the message (no count, no terminator)."""
    items = value.items() if isinstance(value, dict) else value
    return b"".join(_text(k) + b"\0" + _text(v) + b"\0" for k, v in items)


# ---------------------------------------------------------------------------------------------------------------
# tuples and column lists

def _datum(value, native: bool) -> bytes:
    if value is None:
        return b"n"
    if value is UNCHANGED:
        return b"u"
    if isinstance(value, Raw):
        return value.kind + value.body
    if isinstance(value, Internal):
        return b"i" + struct.pack(">I", len(value)) + bytes(value)
    if isinstance(value, str):
        data = value.encode() + (b"\0" if native else b"")
        return b"t" + struct.pack(">I", len(data)) + data
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"b" + struct.pack(">I", len(value)) + bytes(value)
    raise TypeError(f"no tuple kind for {value!r}")


def tuple_data(values, protocol: str, natts: int | None = None) -> bytes:
    """A TUPLE: spock/pglogical ``'T' u16 natts entries``; pgoutput ``u16 ncols entries``."""
    native = protocol != "pgoutput"
    count = len(values) if natts is None else natts
    head = (b"T" if native else b"") + struct.pack(">H", count)
    return head + b"".join(_datum(v, native) for v in values)


def _tuple_field(kind_field: str | None, fixed_kind: bytes | None):
    """Codec for a tuple field: the kind byte ('N', 'K' or 'O') and the tuple; None leaves the field out."""
    def codec(values, msg) -> bytes:
        if values is None:
            return b""
        kind = fixed_kind if fixed_kind is not None else _text(msg[kind_field])
        return kind + tuple_data(values, msg["_protocol"], msg.get("natts"))
    return codec


new_tuple = _tuple_field(None, b"N")
old_tuple = _tuple_field("old_kind", None)


def _col_flags(col: Col) -> int:
    return col.flags if col.flags is not None else (1 if col.key else 0)


def native_columns(cols, msg) -> bytes:
    """spock/pglogical: 'A', u16 natts, then per column 'C' flags 'N' u16 len name\\0 [u32 typid, i32 typmod]."""
    typed = msg["_protocol"] == "spock"
    out = [b"A", struct.pack(">H", len(cols) if msg.get("natts") is None else msg["natts"])]
    for col in cols:
        name = _text(col.name) + b"\0"
        out.append(b"C" + struct.pack(">B", _col_flags(col)) + b"N" + struct.pack(">H", len(name)) + name)
        if typed:
            out.append(struct.pack(">Ii", col.type_oid, col.typmod))
    return b"".join(out)


def pgoutput_columns(cols, msg) -> bytes:
    """u16 natts, then per column u8 flags, cstring name, u32 typoid, i32 typmod."""
    out = [struct.pack(">H", len(cols) if msg.get("natts") is None else msg["natts"])]
    for col in cols:
        out.append(struct.pack(">B", _col_flags(col)) + _text(col.name) + b"\0" + struct.pack(">Ii", col.type_oid, col.typmod))
    return b"".join(out)


def relid_list(relids, msg) -> bytes:
    """u32 count (unless the table writes it separately), then u32 relids."""
    return b"".join(struct.pack(">I", r) for r in relids)


def _count_of(field: str):
    return lambda msg: len(msg[field])


# ---------------------------------------------------------------------------------------------------------------
# message tables: type -> fields after the type byte

def _F(name, codec, default=_REQUIRED):
    return Field(name, codec, default)


_FLAGS0 = _F("flags", u8, 0)
_XID_OPT = _F("xid", u32, _OMIT)           # pgoutput [xid] inside a stream block

_NATIVE_COMMON = {
    "S": (_F("format", u8, 1), _F("params", startup_pairs, ())),
    "B": (_FLAGS0, _F("final_lsn", u64), _F("commit_ts", i64), _F("xid", u32)),
    "R": (_FLAGS0, _F("relid", u32), _F("namespace", lenstr8), _F("name", lenstr8), _F("columns", native_columns)),
    "I": (_FLAGS0, _F("relid", u32), _F("new", new_tuple)),
    "U": (_FLAGS0, _F("relid", u32), _F("old", old_tuple, None), _F("new", new_tuple)),
    "D": (_FLAGS0, _F("relid", u32), _F("old", old_tuple)),
    "C": (_FLAGS0, _F("commit_lsn", u64), _F("end_lsn", u64), _F("commit_ts", i64)),
}

PGLOGICAL = dict(_NATIVE_COMMON, **{
    "O": (_FLAGS0, _F("origin_lsn", u64), _F("name", lenstr8)),
})

SPOCK = dict(_NATIVE_COMMON, **{
    "O": (_F("flags", u8, lambda m: 1 if m.get("name") is not None else 0), _F("origin_lsn", u64),
          _F("origin_id", u16), _F("name", cstring, _OMIT)),
    "L": (_FLAGS0, _F("last_commit_ts", i64)),
    "T": (_F("nrelids", u32, _count_of("relids")), _F("flags", u8, 0), _F("relids", relid_list)),
    "M": (_F("xid", u32, 0), _F("lsn", u64), _F("transactional", u8, lambda m: 1 if m.get("xid") else 0),
          _F("prefix", cstring, "Spock"), _F("size", u32, lambda m: len(m["content"])), _F("content", raw_bytes)),
    # v4 ends COMMIT with the remote_insert_lsn; v5 moved it into the prefix of every message.
    "C": _NATIVE_COMMON["C"] + (_F("trailing_insert_lsn", u64, _OMIT),),
})

_TWO_PHASE = (_F("flags", u8, 0), _F("lsn", u64), _F("end_lsn", u64), _F("ts", i64), _F("xid", u32), _F("gid", cstring))

PGOUTPUT = {
    "B": (_F("final_lsn", u64), _F("commit_ts", i64), _F("xid", u32)),
    "C": (_FLAGS0, _F("commit_lsn", u64), _F("end_lsn", u64), _F("commit_ts", i64)),
    "O": (_F("origin_lsn", u64), _F("name", cstring)),
    "Y": (_XID_OPT, _F("type_oid", u32), _F("namespace", cstring, ""), _F("name", cstring)),
    "R": (_XID_OPT, _F("relid", u32), _F("namespace", cstring), _F("name", cstring), _F("replident", char, "d"),
          _F("columns", pgoutput_columns)),
    "I": (_XID_OPT, _F("relid", u32), _F("new", new_tuple)),
    "U": (_XID_OPT, _F("relid", u32), _F("old", old_tuple, None), _F("new", new_tuple)),
    "D": (_XID_OPT, _F("relid", u32), _F("old", old_tuple)),
    "T": (_XID_OPT, _F("nrelids", u32, _count_of("relids")), _F("flags", u8, 0), _F("relids", relid_list)),
    "M": (_XID_OPT, _F("flags", u8, 0), _F("lsn", u64), _F("prefix", cstring), _F("size", u32, lambda m: len(m["content"])),
          _F("content", raw_bytes)),
    "S": (_F("xid", u32), _F("first_segment", u8, 1)),
    "E": (),
    "c": (_F("xid", u32), _F("flags", u8, 0), _F("commit_lsn", u64), _F("end_lsn", u64), _F("commit_ts", i64)),
    "A": (_F("xid", u32), _F("subxid", u32), _F("abort_lsn", u64, _OMIT), _F("abort_ts", i64, _OMIT)),
    "b": (_F("lsn", u64), _F("end_lsn", u64), _F("ts", i64), _F("xid", u32), _F("gid", cstring)),
    "P": _TWO_PHASE,
    "K": _TWO_PHASE,
    "p": _TWO_PHASE,
    "r": (_F("flags", u8, 0), _F("prepare_end_lsn", u64), _F("rollback_end_lsn", u64), _F("prepare_ts", i64),
          _F("rollback_ts", i64), _F("xid", u32), _F("gid", cstring)),
}

PROTOCOLS = {"spock": SPOCK, "pglogical": PGLOGICAL, "pgoutput": PGOUTPUT}

# Field names the tables may read without writing them directly.
_AUX = {"old_kind", "natts"}


def encode(protocol: str, msg_type: str, **fields) -> bytes:
    """One message of `protocol`: the type byte, then the table's fields in order."""
    table = PROTOCOLS[protocol][msg_type]
    known = {f.name for f in table} | _AUX
    unknown = set(fields) - known
    if unknown:
        raise TypeError(f"{protocol} '{msg_type}' has no field(s) {sorted(unknown)}")
    msg = {"_protocol": protocol, "old_kind": "K", "natts": None}
    msg.update(fields)
    out = [msg_type.encode()]
    for field in table:
        value = msg.get(field.name, field.default)
        if value is _REQUIRED:
            raise TypeError(f"{protocol} '{msg_type}' needs field {field.name!r}")
        if value is _OMIT or (field.default is _OMIT and value is None):
            continue
        if callable(value) and not isinstance(value, (bytes, str)):
            value = value(msg)
        out.append(field.codec(value, msg))
    return b"".join(out)


def spock(msg_type: str, *, proto: int = 5, insert_lsn: int = 0, **fields) -> bytes:
    """A spock message. proto 5: every message but 'S' starts with u64 remote_insert_lsn.
    proto 4: no prefix; 'C' ends with the u64 remote_insert_lsn instead."""
    if msg_type == "C" and proto == 4:
        fields.setdefault("trailing_insert_lsn", insert_lsn)
    body = encode("spock", msg_type, **fields)
    if msg_type != "S" and proto >= 5:
        return struct.pack(">Q", insert_lsn) + body
    return body


def pglogical(msg_type: str, **fields) -> bytes:
    return encode("pglogical", msg_type, **fields)


def pgoutput(msg_type: str, **fields) -> bytes:
    return encode("pgoutput", msg_type, **fields)


def spock_sync_event(origin_node: int, byteorder: str = "little") -> bytes:
    """The 72-byte host-order payload of a spock sync-event 'M': i32 mtype=3, u32 origin node, 64 zero bytes."""
    fmt = "<iI" if byteorder == "little" else ">iI"
    return struct.pack(fmt, 3, origin_node) + bytes(64)


_RECORD = struct.Struct(">IQ")


def frames(records) -> bytes:
    """Frame records: per (lsn, payload), u32 payload_length, u64 lsn, then the payload."""
    return b"".join(_RECORD.pack(len(payload), lsn) + bytes(payload) for lsn, payload in records)
