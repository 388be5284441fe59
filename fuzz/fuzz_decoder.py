"""Coverage-guided, differential fuzzing of the spockwire decoder with atheris.

Every input drives both implementations -- the sanitizer-built Cython module and the pure-Python twin -- through
one decoder entry point, and then compares them. spockwire.errors.ProtocolError (and its subclasses) is the
expected answer to bad bytes. A finding is anything else: another exception type from either implementation,
a crash or sanitizer report (ASan/UBSan abort the process), an allocation above -malloc_limit_mb, a time-out, or
the two implementations disagreeing (events, relations, committed_lsn, startup parameters, bytes consumed, or
the error's class, text, offset and other attributes).

Input layout (so the fuzzer mutates the configuration along with the bytes):

    byte 0  bits 0-1  protocol: 0 pgoutput, 1 pglogical, 2-3 spock
            bits 2-3  entry point: 0 "message"  feed(): preamble, the rest of the input as ONE message, epilogue
                                   1 "messages" feed(): setup messages, then the rest of the input split into
                                                messages by u16 big-endian length prefixes
                                   2 "frames"   feed_frames(rest) (frame records: u32 length, u64 lsn, payload)
                                   3 "partial"  feed_frames(rest, partial_ok=True), then feed_frames() of what
                                                it left over
            bit 4     types="raw" (else "typed")
            bit 5     numeric="text" (else "decimal")
            bits 6-7  spock: proto_version 5, 4, None after a v5 startup, None after a v4 startup;
                      pglogical: not 0 makes the entry point "datum" (below); pgoutput: unused
    byte 1  bits 0-1  batch_rows: default, 1, 2, 5
            bit 2     drain() after every message (else once at the end)
            bits 3-4  preamble of "message": 0 R.. B | 1 R.. B O(origin) | 2 pgoutput stream block S..E + c
                      (native: no startup message) | 3 pgoutput two-phase b..P + K (native: like 1)
            bit 5     on_unrepresentable="error" (else "text": a value its column's type cannot hold switches the
                      column to text under a new relation version)
            bit 6     entry point "copy" instead of byte 0's: the rest is binary COPY data (`COPY ... TO STDOUT
                      (FORMAT binary)`) of the preamble's relation number (byte 0 bits 0-1) mod 3, decoded by
                      CopyBinaryDecoder; byte 0 bits 4-5 and byte 1 bits 0-1 and 5 choose its options as above,
                      bits 3-4 the size of the pieces fed: 1, 3 or 17 bytes, or all at once
            bit 7     strings="view" with pin_bytes=VIEW_PIN_BYTES (else "plain"): string and binary columns as
                      string_view / binary_view; with that small limit, messages fed one by one are pinned, cut
                      batches and are copied (spockwire/wire/views.py)
    rest    the fuzzed bytes

The "datum" entry point (pglogical, byte 0 bits 6-7 not 0; byte 1 bit 6 clear): the rest is the data of one
internal ('i') datum of a type with a layout of its own (spockwire.values.internal_types), inserted into a
one-column table; byte 1 chooses:

            bits 0-2  the column: DATUM_TYPES[bits] (jsonb, tsvector, tsquery, jsonpath, aclitem, jsonb kept as
                      text, tsvector and jsonpath once more)
            bit 3     a big-endian server (binary.bigendian in the startup message)
            bit 4     the data inline-compressed (pglz, literals only) instead of behind a 4-byte header; aclitem
                      (fixed-length) is the rest as it is
            bit 5     on_unrepresentable="error", as above
            bit 7     strings="view", as above

Run it under the sanitizer build (fuzz/README.md):

    python fuzz/fuzz_decoder.py [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]
    python fuzz/fuzz_decoder.py --replay FILE...      run inputs once, without atheris (any build)
"""
from __future__ import annotations

import ctypes
import decimal
import functools
import importlib
import importlib.util
import math
import os
import struct
import sys
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROTOCOLS = ("pgoutput", "pglogical", "spock", "spock")
ENTRIES = ("message", "messages", "frames", "partial")
COPY_PIECES = (1, 3, 17, None)
BATCH_ROWS = (None, 1, 2, 5)
VIEW_PIN_BYTES = 200
SPOCK_VARIANTS = ((5, "v5"), (4, "v4"), (None, "v5"), (None, "v4"))  # (proto_version, startup message)
#: the "datum" entry's columns: (type, kept as text)
DATUM_TYPES = (("jsonb", False), ("tsvector", False), ("tsquery", False), ("jsonpath", False), ("aclitem", False),
               ("jsonb", True), ("tsvector", False), ("jsonpath", False))
DATUM_ROLES = {10: "postgres", 16384: "alice", 16385: "Bob \"B\""}

# -------------------------------------------------------------------------------------------------------------
# the fixed preamble: three relations covering the typed value kinds, one transaction around the fuzzed message

NUMERIC_12_2 = ((12 << 16) | 2) + 4
NUMERIC_40_5 = ((40 << 16) | 5) + 4
RELATIONS = (
    (0x101, "public", "fz_a", (("id", 23, -1, True), ("name", 25, -1, False), ("amount", 1700, NUMERIC_12_2, False),
                               ("data", 17, -1, False), ("flag", 16, -1, False), ("at", 1184, -1, False),
                               ("doc", 3802, -1, False))),
    (0x102, "public", "fz_b", (("ints", 1007, -1, True), ("names", 1009, -1, False), ("nums", 1231, -1, False),
                               ("span", 1186, -1, False), ("uid", 2950, -1, False), ("day", 1082, -1, False),
                               ("tz", 1266, -1, False))),
    (0x103, "sales", "fz_c", (("f4", 700, -1, False), ("f8", 701, -1, False), ("i2", 21, -1, True),
                              ("i8", 20, -1, False), ("o", 26, -1, False), ("t", 1083, -1, False),
                              ("ts", 1114, -1, False), ("n", 1700, -1, False), ("big", 1700, NUMERIC_40_5, False),
                              ("pt", 600, -1, False), ("js", 114, -1, False), ("c", 1043, 14, False))),
)
XID = 0x2F0
BEGIN_LSN, FINAL_LSN, END_LSN = 0x2000010, 0x2000100, 0x2000140
COMMIT_TS = 0x0002A1B2C3D4E5F6
GID = "fz-gid"
STARTUP = {
    "pglogical": {"max_proto_version": "1", "min_proto_version": "1", "pglogical_version": "2.4.4",
                  "pglogical_version_num": "20404", "binary.bigendian": "0", "binary.want_binary_basetypes": "1"},
    "v5": {"max_proto_version": "5", "min_proto_version": "4", "proto_version": "5", "coltypes": "f",
           "spock_version_num": "60000", "binary.bigendian": "0"},
    "v4": {"max_proto_version": "4", "min_proto_version": "4", "spock_version_num": "50001",
           "binary.bigendian": "0"},
}


class Case(NamedTuple):
    protocol: str
    kwargs: dict
    entry: str
    spock_version: int | None    # the version the stream speaks (5 or 4 for spock), None otherwise
    startup: str | None          # key of STARTUP sent first, or None
    preamble: int
    drain_each: bool
    rest: bytes


def parse_input(data: bytes) -> Case:
    b0 = data[0] if len(data) > 0 else 0
    b1 = data[1] if len(data) > 1 else 0
    protocol = PROTOCOLS[b0 & 3]
    kwargs: dict[str, Any] = {"types": "raw" if b0 & 0x10 else "typed",
                              "numeric": "text" if b0 & 0x20 else "decimal"}
    spock_version = startup = None
    if protocol == "spock":
        kwargs["proto_version"], startup = SPOCK_VARIANTS[b0 >> 6]
        spock_version = 5 if startup == "v5" else 4
    elif protocol == "pglogical":
        startup = "pglogical"
        kwargs["type_catalog"] = pglogical_catalog()
    if b1 & 0x20:
        kwargs["on_unrepresentable"] = "error"
    if BATCH_ROWS[b1 & 3] is not None:
        kwargs["batch_rows"] = BATCH_ROWS[b1 & 3]
    if b1 & 0x80 and not b1 & 0x40:
        kwargs["strings"] = "view"
        kwargs["pin_bytes"] = VIEW_PIN_BYTES
    if b1 & 0x40:
        kwargs.pop("proto_version", None)
        kwargs["type_catalog"] = None
        return Case(protocol, kwargs, "copy", None, None, (b1 >> 3) & 3, bool(b1 & 4), bytes(data[2:]))
    if protocol == "pglogical" and b0 >> 6:
        type_name, as_text = DATUM_TYPES[b1 & 7]
        kwargs["type_catalog"] = datum_catalog(type_name)
        if as_text:
            kwargs["column_types"] = {"public.fz_d.v": "text"}
        kwargs.pop("batch_rows", None)
        return Case(protocol, kwargs, "datum", None, "pglogical", b1 & 0x18, False, bytes(data[2:]))
    return Case(protocol, kwargs, ENTRIES[(b0 >> 2) & 3], spock_version, startup, (b1 >> 3) & 3,
                bool(b1 & 4), bytes(data[2:]))


def make_input(protocol: str, entry: str, body: bytes, *, raw: bool = False, numeric_text: bool = False,
               spock_variant: int = 0, batch_rows: int = 0, drain_each: bool = False, preamble: int = 0,
               strict: bool = False, views: bool = False) -> bytes:
    """The input that parse_input() turns back into these choices (used by fuzz/seeds.py and the tests)."""
    b0 = ({"pgoutput": 0, "pglogical": 1, "spock": 2}[protocol] | ENTRIES.index(entry) << 2
          | (0x10 if raw else 0) | (0x20 if numeric_text else 0) | spock_variant << 6)
    b1 = batch_rows | (4 if drain_each else 0) | preamble << 3 | (0x20 if strict else 0) | (0x80 if views else 0)
    return bytes([b0, b1]) + body


def make_datum_input(type_index: int, data: bytes, *, big: bool = False, compressed: bool = False) -> bytes:
    """The "datum" entry's input: a datum of DATUM_TYPES[type_index] (used by fuzz/seeds.py and the tests)."""
    return bytes([0x41, type_index | (8 if big else 0) | (0x10 if compressed else 0)]) + data


@functools.lru_cache(maxsize=None)
def datum_catalog(type_name: str):
    from spockwire.values.catalog import StaticTypeCatalog

    return StaticTypeCatalog({"public.fz_d": {"v": type_name}}, roles=DATUM_ROLES)


def _pglz_literals(data: bytes) -> bytes:
    """pglz data of literals only: a control byte of 0 before every 8 bytes."""
    return b"".join(b"\x00" + data[k:k + 8] for k in range(0, len(data), 8))


def datum_messages(case: Case) -> list[bytes]:
    """Startup (the case's byte order), the one-column relation, B, the insert of the datum, C."""
    W = _encoder()
    big, compressed = bool(case.preamble & 8), bool(case.preamble & 0x10)
    order = ">" if big else "<"
    data = case.rest
    if case.kwargs["type_catalog"].tables["public.fz_d"]["v"] == "aclitem":
        datum = data
    elif compressed:
        payload = _pglz_literals(data)
        size = 8 + len(payload)
        word = (size | 0x40000000) if big else (size << 2 | 0x02)
        datum = struct.pack(order + "II", word, len(data)) + payload
    else:
        datum = struct.pack(order + "I", (len(data) + 4) if big else (len(data) + 4) << 2) + data
    params = dict(STARTUP["pglogical"], **{"binary.bigendian": "1" if big else "0",
                                          "binary.want_internal_basetypes": "1"})
    return [W.pglogical("S", params=params), W.pglogical("B", final_lsn=FINAL_LSN, commit_ts=COMMIT_TS, xid=XID),
            W.pglogical("R", relid=0x104, namespace="public", name="fz_d", columns=[W.Col("v")]),
            W.pglogical("I", relid=0x104, new=[W.Internal(datum)]),
            W.pglogical("C", commit_lsn=FINAL_LSN, end_lsn=END_LSN, commit_ts=COMMIT_TS)]


_CATALOG = None


def pglogical_catalog():
    """pglogical sends no column types: a static catalog gives the preamble's tables theirs."""
    global _CATALOG
    if _CATALOG is None:
        from spockwire.values.catalog import StaticTypeCatalog

        _CATALOG = StaticTypeCatalog({f"{ns}.{name}": {c[0]: (c[1], c[2]) for c in cols}
                                      for _relid, ns, name, cols in RELATIONS})
    return _CATALOG


def _encoder():
    from tests import wire_encoder as W

    return W


def message(case_or_protocol, msg_type: str, spock_version: int | None = None, **fields) -> bytes:
    """One valid message of the case's protocol (spock v5 messages get their remote_insert_lsn prefix)."""
    W = _encoder()
    protocol = case_or_protocol if isinstance(case_or_protocol, str) else case_or_protocol.protocol
    if spock_version is None and not isinstance(case_or_protocol, str):
        spock_version = case_or_protocol.spock_version
    if protocol == "spock":
        return W.spock(msg_type, proto=spock_version or 5, insert_lsn=BEGIN_LSN, **fields)
    return W.encode(protocol, msg_type, **fields)


def relation_messages(protocol: str, spock_version: int | None = None, xid: int | None = None) -> list[bytes]:
    W = _encoder()
    out = []
    for relid, ns, name, cols in RELATIONS:
        columns = [W.Col(c[0], c[1], c[2], c[3]) for c in cols]
        if protocol == "pgoutput":
            fields = {"xid": xid} if xid is not None else {}
            out.append(message(protocol, "R", relid=relid, namespace=ns, name=name, replident="d", columns=columns,
                               **fields))
        else:
            out.append(message(protocol, "R", spock_version, relid=relid, namespace=ns, name=name, columns=columns))
    return out


@functools.lru_cache(maxsize=None)
def _setup_messages(protocol: str, spock_version: int | None, startup: str | None, preamble: int) -> tuple:
    out = []
    if startup is not None and not (preamble == 2 and protocol != "pgoutput"):
        out.append(message(protocol, "S", spock_version, params=STARTUP[startup]))
    return tuple(out + relation_messages(protocol, spock_version))


@functools.lru_cache(maxsize=None)
def _around(protocol: str, spock_version: int | None, startup: str | None, preamble: int) -> tuple:
    case = Case(protocol, {}, "message", spock_version, startup, preamble, False, b"")
    pre, post = _around_uncached(case)
    return tuple(pre), tuple(post)


def setup_messages(case: Case) -> list[bytes]:
    """Startup message (native protocols) and the three relations."""
    return list(_setup_messages(case.protocol, case.spock_version, case.startup, case.preamble))


def around(case: Case) -> tuple[list[bytes], list[bytes]]:
    """(preamble, epilogue) of the "message" entry point."""
    pre, post = _around(case.protocol, case.spock_version, case.startup, case.preamble)
    return list(pre), list(post)


def _around_uncached(case: Case) -> tuple[list[bytes], list[bytes]]:
    p = case.protocol
    begin = message(case, "B", final_lsn=FINAL_LSN, commit_ts=COMMIT_TS, xid=XID)
    commit = message(case, "C", commit_lsn=FINAL_LSN, end_lsn=END_LSN, commit_ts=COMMIT_TS)
    origin = (message(case, "O", origin_lsn=0x1234, name="node_x") if p != "spock"
              else message(case, "O", origin_lsn=0x1234, origin_id=2, name="n2"))
    pre = setup_messages(case)
    if p == "pgoutput" and case.preamble == 2:
        return (pre + [message(p, "S", xid=XID, first_segment=1)],
                [message(p, "E"), message(p, "c", xid=XID, commit_lsn=FINAL_LSN, end_lsn=END_LSN,
                                          commit_ts=COMMIT_TS)])
    if p == "pgoutput" and case.preamble == 3:
        two = dict(lsn=FINAL_LSN, end_lsn=END_LSN, ts=COMMIT_TS, xid=XID, gid=GID)
        return (pre + [message(p, "b", **two)], [message(p, "P", **two), message(p, "K", **two)])
    if case.preamble in (1, 3):
        return pre + [begin, origin], [commit]
    return pre + [begin], [commit]


def split_messages(rest: bytes) -> list[bytes]:
    """u16 big-endian length, then that many bytes (the last message takes what is left)."""
    out, pos = [], 0
    while pos < len(rest):
        if len(rest) - pos < 2:
            out.append(rest[pos:])
            break
        (n,) = struct.unpack_from(">H", rest, pos)
        out.append(rest[pos + 2:pos + 2 + n])
        pos += 2 + n
    return out


def join_messages(messages) -> bytes:
    return b"".join(struct.pack(">H", len(m)) + m for m in messages)


# -------------------------------------------------------------------------------------------------------------
# exact-size, poisoned buffers: with the ASan runtime loaded, a read one byte before or after the fuzzed bytes
# is reported (a Python bytes object has a NUL after its end and lives inside a larger block).

_GUARD = 64
_asan_poison = _asan_unpoison = None


def _find_asan() -> None:
    global _asan_poison, _asan_unpoison
    try:
        lib = ctypes.CDLL(None)
        _asan_poison = lib.__asan_poison_memory_region
        _asan_unpoison = lib.__asan_unpoison_memory_region
    except AttributeError:
        return
    for fn in (_asan_poison, _asan_unpoison):
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        fn.restype = None


class Guarded:
    """`data` in a buffer with poisoned guard bytes on both sides; .view is a memoryview of exactly `data`."""

    def __init__(self, data: bytes) -> None:
        n = len(data)
        self.buf = (ctypes.c_ubyte * (_GUARD + n + _GUARD))()
        ctypes.memmove(ctypes.addressof(self.buf) + _GUARD, data, n)
        self.view = memoryview(self.buf).cast("B")[_GUARD:_GUARD + n]
        self.poisoned = _asan_poison is not None
        if self.poisoned:
            base = ctypes.addressof(self.buf)
            _asan_poison(base, _GUARD)
            _asan_poison(base + _GUARD + n, _GUARD)

    def close(self) -> None:
        self.view.release()
        if self.poisoned:
            _asan_unpoison(ctypes.addressof(self.buf), len(self.buf))
            self.poisoned = False


# -------------------------------------------------------------------------------------------------------------
# running one implementation and describing what it did as plain, comparable data

class Finding(Exception):
    """Not a ProtocolError, or the implementations disagree: what the fuzzer is looking for."""


def canon(value: Any) -> Any:
    """Values made comparable with ==: NaN equals NaN, -0.0 differs from 0.0, Decimal keeps its exponent."""
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", value.hex())
    if isinstance(value, decimal.Decimal):
        return ("decimal", str(value))
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def error_data(exc: BaseException) -> tuple:
    return (type(exc).__name__, str(exc), exc.msg_type, exc.offset, exc.needed, exc.remaining, exc.column,
            exc.column_name, getattr(exc, "frame_offset", None))


def _as_integers(arrow_type):
    """The integer type with the same layout as a temporal type (or a list of one), else None: to_pylist() cannot
    turn the ±infinity timestamps and dates (int64/int32 extremes) into datetime objects."""
    import pyarrow as pa

    t = arrow_type
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_list(t):
        inner = _as_integers(t.value_type)
        if inner is not None:
            return pa.list_(pa.field(t.value_field.name, inner, t.value_field.nullable))
    return None


def columns_data(record) -> list:
    out = []
    for name, column in zip(record.schema.names, record.columns):
        as_int = _as_integers(column.type)
        if as_int is not None:
            column = column.view(as_int)
        out.append((name, canon(column.to_pylist())))
    return out


def events_data(events: list) -> list:
    from tests import normalize as N

    out = []
    for event in events:
        if hasattr(event, "to_arrow"):
            record = event.to_arrow()
            record.validate(full=True)
            out.append({"batch": N.relation_data(event.relation), "rows": event.num_rows,
                        "schema": str(record.schema), "columns": columns_data(record)})
        else:
            out.append(canon(N.plain_events([event])[0]))
    return out


def state_data(dec) -> dict:
    from tests import normalize as N

    return {"committed_lsn": dec.committed_lsn,
            "relations": [N.relation_data(dec.relations[k]) for k in sorted(dec.relations)],
            "startup_params": dict(dec.startup_params),
            "remote_insert_lsn": getattr(dec, "remote_insert_lsn", None)}


def copy_relation(case: Case):
    """The Relation a "copy" case reads: one of the preamble's tables, with its column types."""
    from spockwire.model import Column, Relation

    relid, ns, name, cols = RELATIONS[PROTOCOLS.index(case.protocol) % 3]
    return Relation(relid, ns, name, tuple(Column(c[0], c[1], c[2], c[3]) for c in cols), None, 1)


def make_copy_input(relation_index: int, body: bytes, *, raw: bool = False, numeric_text: bool = False,
                    batch_rows: int = 0, piece: int = 3, strict: bool = False) -> bytes:
    """A "copy" input (fuzz/seeds.py and the tests): binary COPY data of RELATIONS[relation_index]."""
    b0 = relation_index | (0x10 if raw else 0) | (0x20 if numeric_text else 0)
    b1 = batch_rows | piece << 3 | (0x20 if strict else 0) | 0x40
    return bytes([b0, b1]) + body


def run_copy(module, case: Case, guard: bool) -> dict:
    """Feed a "copy" case to one implementation's CopyBinaryDecoder."""
    from spockwire.errors import ProtocolError

    dec = module.CopyBinaryDecoder(copy_relation(case), **case.kwargs)
    result: dict[str, Any] = {"error": None}
    batches: list = []
    piece = COPY_PIECES[case.preamble] or max(len(case.rest), 1)
    try:
        try:
            for at in range(0, len(case.rest), piece):
                data = case.rest[at:at + piece]
                g = Guarded(data) if guard else None
                try:
                    dec.feed(g.view if g is not None else data)
                finally:
                    if g is not None:
                        g.close()
                if case.drain_each:
                    batches.extend(dec.drain())
            batches.extend(dec.finish())
        except ProtocolError as exc:
            result["error"] = error_data(exc)
        batches.extend(dec.drain())
        out = []
        for record in batches:
            record.validate(full=True)
            out.append({"rows": record.num_rows, "schema": str(record.schema), "columns": columns_data(record)})
        # how rows are cut into batches may differ: the rows, in order, must not
        result["rows"] = sum(r["rows"] for r in out)
        result["columns"] = [[name for name, _v in o["columns"]] for o in out[:1]]
        result["values"] = [list(zip(*[v for _n, v in o["columns"]])) for o in out]
        result["values"] = [row for chunk in result["values"] for row in chunk]
        result["schemas"] = sorted({o["schema"] for o in out})
        result["offset"] = dec.offset
        result["done"] = dec.done
    except Exception as exc:
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
        raise Finding(f"{module.IMPLEMENTATION}: {type(exc).__name__}: {exc} (at {where})") from exc
    return result


def run(module, case: Case, guard: bool) -> dict:
    """Feed the case to one implementation; ProtocolError is an outcome, any other exception a Finding."""
    from spockwire.errors import ProtocolError

    if case.entry == "copy":
        return run_copy(module, case, guard)
    dec = module.Decoder(case.protocol, **case.kwargs)
    trace: list = []
    events: list = []
    result: dict[str, Any] = {"error": None, "consumed": []}

    def wrap(data: bytes):
        if not guard:
            return data, None
        g = Guarded(data)
        return g.view, g

    def step(fn, data: bytes):
        view, g = wrap(data)
        try:
            out = fn(view)
        finally:
            if g is not None:
                g.close()
        if case.drain_each:
            events.extend(dec.drain())
            trace.append(dec.committed_lsn)
        return out

    try:
        try:
            if case.entry == "message":
                pre, post = around(case)
                for m in pre:
                    step(dec.feed, m)
                step(dec.feed, case.rest)
                for m in post:
                    step(dec.feed, m)
            elif case.entry == "messages":
                for m in setup_messages(case):
                    step(dec.feed, m)
                for m in split_messages(case.rest):
                    step(dec.feed, m)
            elif case.entry == "frames":
                result["consumed"].append(step(dec.feed_frames, case.rest))
            elif case.entry == "datum":
                for m in datum_messages(case):
                    step(dec.feed, m)
            else:
                n = step(lambda v: dec.feed_frames(v, partial_ok=True), case.rest)
                result["consumed"].append(n)
                if not isinstance(n, int) or not 0 <= n <= len(case.rest):
                    raise Finding(f"feed_frames(partial_ok=True) returned {n!r} for {len(case.rest)} bytes")
                result["consumed"].append(step(dec.feed_frames, case.rest[n:]))
        except ProtocolError as exc:
            result["error"] = error_data(exc)
        events.extend(dec.drain())
        result["events"] = events_data(events)
        result["trace"] = trace
        result.update(state_data(dec))
    except Finding:
        raise
    except Exception as exc:
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
        raise Finding(f"{module.IMPLEMENTATION}: {type(exc).__name__}: {exc} (at {where})") from exc
    return result


def first_difference(a: Any, b: Any, path: str = "") -> str:
    if type(a) is not type(b):
        return f"{path}: {a!r:.300} != {b!r:.300}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items; first {a[:3]!r:.300} / {b[:3]!r:.300}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r:.300} != {b!r:.300}"


_MODULES: tuple | None = None


def load_modules(c_path: str | None = None, instrument=None) -> tuple:
    """(C module, Python module). c_path: a sanitizer build of spockwire.wire._decoder to load by path;
    without it the C module is the normal import (the in-place build)."""
    global _MODULES
    if _MODULES is not None:
        return _MODULES

    def import_all():
        import spockwire  # noqa: F401
        import spockwire.errors  # noqa: F401
        py = importlib.import_module("spockwire.wire._decoder_py")
        importlib.import_module("spockwire.values._convert_py")
        importlib.import_module("tests.normalize")
        return py

    if c_path:
        # `import spockwire` must not load the unsanitized in-place build: the sanitized module is loaded by path
        os.environ["SPOCKWIRE_IMPL"] = "python"
        os.environ.pop("SPOCKWIRE_REQUIRE_EXT", None)
    if instrument is not None:
        with instrument():
            py_module = import_all()
    else:
        py_module = import_all()
    name = "spockwire.wire._decoder"
    if c_path:
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) != c_path:
            raise RuntimeError(f"{name} was imported from {sys.modules[name].__file__} before the sanitizer build")
        spec = importlib.util.spec_from_file_location(name, c_path)
        c_module = importlib.util.module_from_spec(spec)
        sys.modules[name] = c_module
        spec.loader.exec_module(c_module)
        sys.modules["spockwire.wire"]._decoder = c_module
    else:
        c_module = importlib.import_module(name)
    _find_asan()
    _MODULES = (c_module, py_module)
    return _MODULES


_KNOWN: list | None = None


def known_findings() -> list:
    """Patterns (regular expressions, one a line, # comments) of findings already reported, from the file named
    by SPOCKWIRE_FUZZ_KNOWN: a long run passes over them instead of stopping at the first again and again."""
    global _KNOWN
    if _KNOWN is None:
        import re

        path = os.environ.get("SPOCKWIRE_FUZZ_KNOWN")
        lines = Path(path).read_text().splitlines() if path else []
        _KNOWN = [re.compile(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return _KNOWN


_LAST = os.environ.get("SPOCKWIRE_FUZZ_LAST")


def check(data: bytes) -> None:
    """One fuzz input: both implementations, then the comparison. Raises Finding on a new finding."""
    if _LAST:
        # written before the run: the input that was running when the process was killed (a hang in native code
        # ends in SIGALRM without a libFuzzer artifact) is still there
        with open(_LAST, "wb") as f:
            f.write(data)
    try:
        _check(data)
    except Finding as exc:
        if any(p.search(str(exc)) for p in known_findings()):
            return
        raise


def _check(data: bytes) -> None:
    c_module, py_module = load_modules()
    case = parse_input(data)
    c_result = run(c_module, case, guard=True)
    py_result = run(py_module, case, guard=False)
    if c_result != py_result:
        raise Finding(f"C and Python disagree ({case.protocol}, {case.entry}, {case.kwargs.get('types')}): "
                      + first_difference(c_result, py_result))


def main(argv: list[str]) -> None:
    c_path = os.environ.get("SPOCKWIRE_FUZZ_MODULE")
    if argv[1:2] == ["--replay"]:
        load_modules(c_path)
        failed = 0
        for path in argv[2:]:
            try:
                check(Path(path).read_bytes())
                print(f"ok       {path}")
            except Finding as exc:
                failed += 1
                print(f"FINDING  {path}: {exc}")
        sys.exit(1 if failed else 0)

    import atheris

    if not c_path:
        sys.exit("fuzz_decoder: set SPOCKWIRE_FUZZ_MODULE to the sanitizer build (fuzz/build_sanitized.sh prints "
                 "its path); see fuzz/README.md")
    load_modules(c_path, instrument=lambda: atheris.instrument_imports(include=["spockwire"]))
    atheris.Setup(argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
