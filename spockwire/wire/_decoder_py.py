"""Pure-Python twin of the Cython decoder (spockwire.wire._decoder).

Same classes, same behaviour, same errors (class, text and byte offset) as the hot path; slower. It is the
readable reference of the three protocol state machines: spock native (proto 4/5), pglogical native (proto 1)
and pgoutput (proto 1-4). Every read is bounds-checked before it happens.

Its modules follow the .pyx and its includes part for part: _cursor_py (_cursor.pxi), _builder_py (_builder.pxi),
_state_py (_state.pxi, with the markers the .pyx keeps in its header), _transactions_py (_transactions.pxi),
_rows_py (_rows.pxi), _copy_py (_copy.pxi), and this module (_decoder.pyx): the Decoder's construction, public API
and message dispatch. The value kernels of _values.pxi are spockwire.values._convert_py and its parts.
"""
from __future__ import annotations

import os
import struct
from typing import Any

from ..errors import FrameError, ProtocolError, protocol_error
from ..model import Column, Relation
from ..values.catalog import ColumnSpec, check_column_types
from .encodings import encoding_name, text_codec
from .spill import DEFAULT_SPILL_BYTES, batch_bytes_limit
from .views import DEFAULT_PIN_BYTES, check_strings, pin_source
from ._cursor_py import _Reader, _type_name
from ._builder_py import _Builder
from ._state_py import (DEFAULT_BATCH_ROWS, PROTOCOLS, UNREPRESENTABLE_CHOICES, _AFTER_NOTHING, _AFTER_ORIGIN,
                        _PGOUTPUT, _PLAIN, _PREPARED, _SPOCK, _Txn)
from ._rows_py import _Rows
from ._copy_py import CopyBinaryDecoder

__all__ = ["Decoder", "CopyBinaryDecoder", "IMPLEMENTATION", "set_buffer_pool_bytes", "buffer_pool_stats"]

IMPLEMENTATION = "python"

_FRAME_HEAD = struct.Struct(">IQ")

# The compiled decoder keeps released large column buffers for reuse (its _buffers.pxi); the twin builds Python
# lists, so its pool only records the limit and never holds a buffer.
_pool_limit = int(os.environ.get("SPOCKWIRE_BUFFER_POOL_BYTES", 64 << 20))


def set_buffer_pool_bytes(limit: int) -> int:
    """Set how many bytes of released large column buffers the process keeps for reuse; returns the previous
    limit (the twin keeps none)."""
    global _pool_limit
    if limit < 0:
        raise ValueError(f"the buffer pool limit must be 0 or more bytes, got {limit}")
    previous, _pool_limit = _pool_limit, limit
    return previous


def buffer_pool_stats() -> dict[str, int]:
    """The pool's state: {"buffers", "bytes", "limit", "hits", "misses"}."""
    return {"buffers": 0, "bytes": 0, "limit": _pool_limit, "hits": 0, "misses": 0}


class Decoder(_Rows):
    """Decodes one logical-replication stream (pgoutput, pglogical or spock) into committed change events."""

    def __init__(self, protocol: str = "pgoutput", *, proto_version: int | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS, types: str = "typed", type_catalog: Any = None,
                 numeric: str = "decimal", spill_bytes: int = DEFAULT_SPILL_BYTES,
                 spill_dir: str | None = None, on_unrepresentable: str = "text",
                 column_types: dict[str, str] | None = None, strings: str = "plain",
                 pin_bytes: int = DEFAULT_PIN_BYTES) -> None:
        self._views = check_strings(strings, pin_bytes)
        self.strings = strings
        self.pin_bytes = pin_bytes
        self._pin: Any = None                      # the input being fed, when views may point into it
        if on_unrepresentable not in UNREPRESENTABLE_CHOICES:
            raise ValueError(f"on_unrepresentable must be 'text' or 'error', got {on_unrepresentable!r}")
        self.on_unrepresentable = on_unrepresentable
        self.column_types = check_column_types(column_types)
        self._spill_bytes = spill_bytes
        self._batch_bytes = batch_bytes_limit(spill_bytes)   # a builder is sealed at this size
        self._spill_dir = spill_dir
        if types not in ("typed", "raw"):
            raise ValueError(f"types must be 'typed' or 'raw', got {types!r}")
        if numeric not in ("decimal", "text"):
            raise ValueError(f"numeric must be 'decimal' or 'text', got {numeric!r}")
        self._numeric = numeric
        self._typed = types == "typed"
        self.type_catalog = type_catalog
        self._big_endian: bool | None = None
        self._specs: dict[int, tuple[ColumnSpec, ...]] = {}
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        self._batch_rows = batch_rows
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if proto_version is not None and protocol == "spock" and proto_version not in (2, 3, 4, 5):
            raise ValueError(f"unsupported spock proto_version {proto_version}: expected 2, 3, 4 or 5")
        self.protocol = protocol
        self._proto = PROTOCOLS.index(protocol)
        self._spock_version: int | None = proto_version if protocol == "spock" else None
        self.startup_params: dict[str, str] = {}
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, tuple[str, str]] = {}
        self.remote_insert_lsn = 0
        self._versions: dict[int, int] = {}
        self._shared: dict[int, _Builder] = {}     # id(relation) -> builder for plain transactions
        self._events: list[Any] = []
        self._txn: _Txn | None = None              # open plain B..C or b..P transaction
        self._stream: _Txn | None = None           # stream block in progress (S..E)
        self._streams: dict[int, _Txn] = {}        # open streamed transactions by top xid
        self._prepared: dict[str, _Txn] = {}       # prepared, unresolved transactions by gid
        self._last_commit_end = 0
        self._after = _AFTER_NOTHING
        self._codec: str | None = None             # native protocols: the encoding of text, from the startup message

    # ------------------------------------------------------------------ public API
    def feed(self, payload: Any, lsn: int | None = None) -> None:
        buf = memoryview(payload).cast("B")
        self._pin = pin_source(payload) if self._views else None
        try:
            self._message(buf, 0, len(buf))
        finally:
            self._pin = None

    def feed_frames(self, buffer: Any, *, partial_ok: bool = False) -> int:
        buf = memoryview(buffer).cast("B")
        self._pin = pin_source(buffer) if self._views else None
        try:
            return self._feed_frames(buf, partial_ok)
        finally:
            self._pin = None

    def _feed_frames(self, buf: memoryview, partial_ok: bool) -> int:
        n = len(buf)
        pos = 0
        while pos < n:
            if n - pos < 12:
                if partial_ok:
                    break
                raise FrameError(f"truncated frame record at byte {pos}: need 12 bytes for the record header, "
                                 f"{n - pos} remaining", offset=pos, needed=12, remaining=n - pos)
            length, _lsn = _FRAME_HEAD.unpack_from(buf, pos)
            if n - pos - 12 < length:
                if partial_ok:
                    break
                raise FrameError(f"truncated frame record at byte {pos}: need {length} bytes for the payload, "
                                 f"{n - pos - 12} remaining", offset=pos, needed=length, remaining=n - pos - 12)
            try:
                self._message(buf, pos + 12, pos + 12 + length)
            except ProtocolError as exc:
                exc.frame_offset = pos
                raise
            pos += 12 + length
        return pos

    def drain(self) -> list[Any]:
        self._flush_shared(True)
        events = self._events
        self._events = []
        return events

    # ------------------------------------------------------------------ dispatch
    def _message(self, buf: memoryview, start: int, end: int) -> None:
        # offsets are reported relative to the message start
        r = _Reader(buf[start:end], 0, end - start)
        if self._proto == _SPOCK and self._spock_version == 5 and not (r.end and r.buf[0] == 0x53):
            # every v5 message but the startup 'S' carries the publisher's insert LSN first
            self.remote_insert_lsn = r.u64("the remote_insert_lsn prefix")
        r.start = r.pos
        t = r.u8("the message type")
        r.mtype = _type_name(t)
        after = self._after
        self._after = _AFTER_NOTHING
        try:
            if self._proto == _PGOUTPUT:
                self._pgoutput(t, r, after)
            else:
                self._native(t, r, after)
        except BaseException:
            self._after = after   # a refused message leaves the ORIGIN / LAST-COMMIT placement as it was
            raise

    def _pgoutput(self, t: int, r: _Reader, after: int) -> None:
        if t == 0x42:  # B
            final_lsn = r.u64("the final LSN")
            ts = r.timestamp("the commit timestamp")
            xid = r.u32("the xid")
            r.done()
            self._begin(r, _PLAIN, xid, final_lsn, ts)
        elif t == 0x43:  # C
            r.flags(0)
            commit_lsn = r.u64("the commit LSN")
            end_lsn = r.u64("the end LSN")
            ts = r.timestamp("the commit timestamp")
            r.done()
            self._commit_plain(r, commit_lsn, end_lsn, ts)
        elif t == 0x4F:  # O
            r.u64("the origin LSN")
            name = r.cstring("the origin name")
            r.done()
            self._origin(r, after, name)
        elif t == 0x59:  # Y
            self._stream_xid(r)
            oid = r.u32("the type OID")
            nsp = r.cstring("the type namespace")
            name = r.cstring("the type name")
            r.done()
            self.types[oid] = (nsp, name)
        elif t == 0x52:  # R
            self._stream_xid(r)
            relid = r.u32("the relation id")
            nsp = r.cstring("the namespace")
            name = r.cstring("the relation name")
            ident = r.u8("the replica identity")
            natts = r.u16("the column count")
            cols = []
            for i in range(natts):
                flags = r.u8("the flags", i)
                if flags & ~1:
                    raise protocol_error(r.mtype, r.pos - 1, f"reserved bits 0x{flags & ~1:02x} set in the flags", i)
                cname = r.cstring("the column name", i)
                typoid = r.u32("the type OID", i, cname)
                typmod = r.i32("the type modifier", i, cname)
                cols.append(Column(cname, typoid, typmod, bool(flags & 1)))
            r.done()
            self._relation(relid, nsp, name, tuple(cols), chr(ident) if 32 <= ident < 127 else str(ident))
        elif t in (0x49, 0x55, 0x44):  # I U D
            sub = self._stream_xid(r)
            self._row_message(r, t, sub)
        elif t == 0x54:  # T
            sub = self._stream_xid(r)
            nrels = r.u32("the relation count")
            flags = r.flags(3)
            self._truncate(r, nrels, flags, sub)
        elif t == 0x4D:  # M
            sub = self._stream_xid(r)
            flags = r.flags(1)
            lsn = r.u64("the message LSN")
            prefix = r.cstring("the message prefix")
            size = r.u32("the content length")
            content = r.take(size, "the content")
            r.done()
            self._logical_message(r, bool(flags & 1), lsn, prefix, content, sub)
        elif t == 0x53:  # S stream start
            xid = r.u32("the xid")
            first = r.u8("the first-segment flag")
            r.done()
            self._stream_start(r, xid, first)
        elif t == 0x45:  # E stream stop
            r.done()
            if self._stream is None:
                raise protocol_error(r.mtype, r.start, "stream stop without a stream start")
            self._stream = None
        elif t == 0x63:  # c stream commit
            xid = r.u32("the xid")
            r.flags(0)
            commit_lsn = r.u64("the commit LSN")
            end_lsn = r.u64("the end LSN")
            ts = r.timestamp("the commit timestamp")
            r.done()
            self._stream_commit(r, xid, commit_lsn, end_lsn, ts)
        elif t == 0x41:  # A stream abort
            xid = r.u32("the xid")
            subxid = r.u32("the subtransaction xid")
            if r.end - r.pos:
                r.u64("the abort LSN")
                r.i64("the abort timestamp")
            r.done()
            self._stream_abort(r, xid, subxid)
        elif t == 0x62:  # b begin prepare
            prepare_lsn = r.u64("the prepare LSN")
            r.u64("the end LSN")
            ts = r.timestamp("the prepare timestamp")
            xid = r.u32("the xid")
            gid = r.cstring("the gid")
            r.done()
            txn = self._begin(r, _PREPARED, xid, prepare_lsn, ts)
            txn.gid = gid
        elif t == 0x50:  # P prepare
            r.flags(0)
            r.u64("the prepare LSN")
            r.u64("the end LSN")
            r.i64("the prepare timestamp")
            xid = r.u32("the xid")
            gid = r.cstring("the gid")
            r.done()
            self._prepare(r, xid, gid)
        elif t == 0x4B:  # K commit prepared
            r.flags(0)
            commit_lsn = r.u64("the commit LSN")
            end_lsn = r.u64("the end LSN")
            ts = r.timestamp("the commit timestamp")
            xid = r.u32("the xid")
            gid = r.cstring("the gid")
            r.done()
            self._commit_prepared(r, xid, gid, commit_lsn, end_lsn, ts)
        elif t == 0x72:  # r rollback prepared
            r.flags(0)
            r.u64("the prepare end LSN")
            end_lsn = r.u64("the rollback end LSN")
            r.i64("the prepare timestamp")
            r.i64("the rollback timestamp")
            r.u32("the xid")
            gid = r.cstring("the gid")
            r.done()
            self._rollback_prepared(r, gid, end_lsn)
        elif t == 0x70:  # p stream prepare
            r.flags(0)
            r.u64("the prepare LSN")
            r.u64("the end LSN")
            r.i64("the prepare timestamp")
            xid = r.u32("the xid")
            gid = r.cstring("the gid")
            r.done()
            self._stream_prepare(r, xid, gid)
        else:
            raise protocol_error(r.mtype, r.start, "unknown pgoutput message type")

    def _native(self, t: int, r: _Reader, after: int) -> None:
        spock = self._proto == _SPOCK
        if t == 0x53:  # S startup
            fmt = r.u8("the startup format")
            if fmt != 1:
                raise protocol_error(r.mtype, r.pos - 1, f"unsupported startup message format {fmt}")
            params: dict[str, str] = {}
            while r.pos < r.end:
                key = r.cstring("a startup parameter name")
                params[key] = r.cstring(f"the value of startup parameter {key!r}")
            self.startup_params = params
            self._big_endian = _byte_order(params)
            self._codec = _startup_codec(r, params)
            if spock:
                self._spock_version = _negotiated_spock_version(r, params)
            return
        if spock and self._spock_version is None:
            raise protocol_error(r.mtype, r.start, "spock stream must begin with the startup message 'S' "
                                             "(or build the Decoder with proto_version=4 or 5)")
        if t == 0x42:  # B
            r.flags(0)
            final_lsn = r.u64("the final LSN")
            ts = r.timestamp("the commit timestamp")
            xid = r.u32("the xid")
            r.done()
            self._begin(r, _PLAIN, xid, final_lsn, ts)
        elif t == 0x43:  # C
            r.flags(0)
            commit_lsn = r.u64("the commit LSN")
            end_lsn = r.u64("the end LSN")
            ts = r.timestamp("the commit timestamp")
            if spock and self._spock_version in (3, 4):
                self.remote_insert_lsn = r.u64("the remote_insert_lsn")
            r.done()
            self._commit_plain(r, commit_lsn, end_lsn, ts)
        elif t == 0x4F:  # O
            if spock:
                flags = r.flags(1)
                origin_lsn = r.u64("the origin LSN")
                node = r.u16("the origin node id")
                name = r.cstring("the origin name") if flags & 1 else None
                r.done()
                if origin_lsn == 0:
                    name = None  # a local transaction
                elif name is None:
                    name = str(node)
            else:
                r.flags(0)
                r.u64("the origin LSN")
                n = r.u8("the origin name length")
                raw = r.take(n, "the origin name")
                r.done()
                if n == 0 or raw[-1] != 0:
                    raise protocol_error(r.mtype, r.pos - 1 if n else r.pos,
                                         "origin name is not NUL-terminated")
                name = self._text(r, raw[:-1], r.pos - n, "the origin name")
            self._origin(r, after, name)
            if spock:
                self._after = _AFTER_ORIGIN
        elif t == 0x4C and spock:  # L last commit ts
            r.flags(0)
            r.i64("the last commit timestamp")
            r.done()
            if after != _AFTER_ORIGIN:
                raise protocol_error(r.mtype, r.start, "LAST-COMMIT message not right after ORIGIN")
        elif t == 0x52:  # R
            r.flags(0)
            relid = r.u32("the relation id")
            nsp = self._native_name(r, "the namespace")
            name = self._native_name(r, "the relation name")
            r.expect(0x41, "the attributes block")
            natts = r.u16("the column count")
            cols = []
            for i in range(natts):
                r.expect(0x43, "the column block")
                flags = r.u8("the flags", i)
                if flags & ~1:
                    raise protocol_error(r.mtype, r.pos - 1, f"reserved bits 0x{flags & ~1:02x} set in the flags", i)
                r.expect(0x4E, "the column name block")
                n = r.u16("the column name length")
                raw = r.take(n, "the column name", i)
                if n == 0 or raw[-1] != 0:
                    raise protocol_error(r.mtype, r.pos - 1 if n else r.pos, "column name is not NUL-terminated", i)
                cname = self._text(r, raw[:-1], r.pos - n, "the column name", i)
                if spock:
                    typoid = r.u32("the type OID", i, cname)
                    typmod = r.i32("the type modifier", i, cname)
                    cols.append(Column(cname, typoid, typmod, bool(flags & 1)))
                else:
                    cols.append(Column(cname, None, None, bool(flags & 1)))
            r.done()
            self._relation(relid, nsp, name, tuple(cols), None)
        elif t in (0x49, 0x55, 0x44):  # I U D
            r.flags(0)
            self._row_message(r, t, 0)
        elif t == 0x54 and spock:  # T truncate: no flags byte first
            nrels = r.u32("the relation count")
            flags = r.flags(3)
            self._truncate(r, nrels, flags, 0)
        elif t == 0x4D and spock:  # M sync event message: no flags byte
            xid = r.u32("the xid")
            lsn = r.u64("the message LSN")
            transactional = r.u8("the transactional flag")
            if transactional > 1:
                raise protocol_error(r.mtype, r.pos - 1, f"transactional flag must be 0 or 1, got {transactional}")
            prefix = r.cstring("the message prefix")
            size = r.u32("the content length")
            content = r.take(size, "the content")
            r.done()
            self._logical_message(r, bool(transactional), lsn, prefix, content, 0)
        else:
            raise protocol_error(r.mtype, r.start, f"unknown {self.protocol} message type")

    def _native_name(self, r: _Reader, what: str) -> str:
        n = r.u8(what + " length")
        raw = r.take(n, what)
        if n == 0 or raw[-1] != 0:
            raise protocol_error(r.mtype, r.pos - 1 if n else r.pos, f"{what} is not NUL-terminated")
        return self._text(r, raw[:-1], r.pos - n, what)

    def _text(self, r: _Reader, raw: bytes, at: int, what: str, column: int | None = None) -> str:
        """A native name in the stream's text encoding (UTF-8 unless the startup message said otherwise)."""
        if self._codec is None or raw.isascii():
            return r.utf8(raw, at, what, column)
        try:
            return raw.decode(self._codec)
        except UnicodeDecodeError:
            raise protocol_error(r.mtype, at, f"{what} is not valid {encoding_name(self._codec)}",
                                 column) from None


def _negotiated_spock_version(r: _Reader, params: dict[str, str]) -> int:
    text = params.get("proto_version")
    if text is None:
        try:
            num = int(params.get("spock_version_num", "50000"))
        except ValueError:
            num = 50000
        return 4 if num >= 50000 else 2
    try:
        version = int(text)
    except ValueError:
        version = -1
    if version not in (2, 3, 4, 5):
        raise protocol_error(r.mtype, r.start, f"unsupported spock proto_version {text!r} in the startup message")
    return version


def _startup_codec(r: _Reader, params: dict[str, str]) -> str | None:
    """The codec of the text a native stream sends (its startup message's ``encoding``); None for UTF-8."""
    try:
        return text_codec(params.get("encoding"))
    except ValueError as exc:
        raise protocol_error(r.mtype, r.start, str(exc)) from None


def _byte_order(params: dict[str, str]) -> bool | None:
    """True when the startup message says the server is big-endian, False little-endian, None when it does not."""
    value = params.get("binary.bigendian")
    if value is None:
        return None
    return value.strip().lower() in ("t", "true", "1", "on", "yes")
