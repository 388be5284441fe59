# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython hot path of the spockwire decoder (twin: spockwire.wire._decoder_py).

Byte-level work only: the read cursor, message dispatch, the tuple loop and appends into preallocated column
buffers laid out as Arrow arrays (validity bitmap, offsets, data). Relation metadata, event objects and the
final Arrow assembly are made in Python once per relation / per batch, never per field.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FrameError, ProtocolError, copy_error, copy_truncated, protocol_error, truncated
from ..export.arrow import finish_batch
from ..model import ChangeBatch, Column, LogicalMessage, Relation, Truncate, PG_EPOCH_OFFSET_US, \
    pg_timestamp_to_datetime
from ..values.catalog import check_column_types, column_specs, switches_to_text, text_column_spec
from ..values.failures import value_problem
from ..values.internal import DATUM_CODES, describe_datum_failure, layout_oid
from .encodings import encoding_name, text_codec
from .renumber import SeqRenumber
from .spill import (DEFAULT_SPILL_BYTES, MAX_BATCH_BYTES, batch_bytes_limit, released_batch,
                    row_bytes_estimate, spill_item)
from .views import DEFAULT_PIN_BYTES, MAX_PINS, STRINGS_CHOICES, check_strings, filter_batch, \
    pin_source, pinned_size

include "_cursor.pxi"
include "_buffers.pxi"
include "_values.pxi"

__all__ = ["Decoder", "CopyBinaryDecoder", "IMPLEMENTATION", "set_buffer_pool_bytes", "buffer_pool_stats"]

IMPLEMENTATION = "c"

PROTOCOLS = ("pgoutput", "pglogical", "spock")
cdef enum:
    PGOUTPUT = 0
    PGLOGICAL = 1
    SPOCK = 2

cdef enum:
    INSERT = 0
    UPDATE_PRE = 1
    UPDATE_POST = 2
    DELETE = 3

cdef enum:
    PLAIN = 0       # B..C: rows go straight into the shared builders
    STREAM = 1      # pgoutput streamed transaction: rows kept apart until 'c'
    PREPARED = 2    # two-phase: rows kept apart until COMMIT PREPARED

cdef enum:
    AFTER_NOTHING = 0
    AFTER_BEGIN = 1
    AFTER_ORIGIN = 2

cdef enum:
    # a tuple that cannot be added as it is (the row message is decoded again): returned, not raised, because a
    # try block around every row costs as much as decoding a field
    ROW_BATCH_FULL = 1          # its values would not fit with the batch's rows: they close first
    ROW_UNREPRESENTABLE = 2     # a valid value its column's type cannot hold (column: Decoder.unrepresentable)

DEFAULT_BATCH_ROWS = 1 << 18
cdef int64_t _EPOCH = PG_EPOCH_OFFSET_US

_TS_TYPE = pa.timestamp("us", tz="UTC")


class _BatchFull(Exception):
    """Internal, COPY rows (_copy.pxi): the row must start a new batch. The stream's tuple loop returns
    ROW_BATCH_FULL instead (a try block per row costs as much as a field)."""


class _Unrepresentable(Exception):
    """Internal, COPY rows: a valid value its column's Arrow type cannot hold; the column switches to text (the
    stream's tuple loop returns ROW_UNREPRESENTABLE)."""

    def __init__(self, column):
        self.column = column


UNREPRESENTABLE_CHOICES = ("text", "error")


include "_builder.pxi"
include "_state.pxi"
include "_transactions.pxi"
include "_rows.pxi"


# ---------------------------------------------------------------------------------------------- decoder
cdef class Decoder(_Rows):
    """Decodes one logical-replication stream (pgoutput, pglogical or spock) into committed change events."""

    def __init__(self, str protocol="pgoutput", *, proto_version=None, Py_ssize_t batch_rows=DEFAULT_BATCH_ROWS,
                 str types="typed", type_catalog=None, str numeric="decimal",
                 int64_t spill_bytes=DEFAULT_SPILL_BYTES, spill_dir=None, str on_unrepresentable="text",
                 column_types=None, str strings="plain", int64_t pin_bytes=DEFAULT_PIN_BYTES):
        self.views = check_strings(strings, pin_bytes)
        self.strings = strings
        self.pin_bytes = pin_bytes
        self.pin_obj = None
        if on_unrepresentable not in UNREPRESENTABLE_CHOICES:
            raise ValueError(f"on_unrepresentable must be 'text' or 'error', got {on_unrepresentable!r}")
        self.on_unrepresentable = on_unrepresentable
        self.fallback_text = on_unrepresentable == "text"
        self.column_types = check_column_types(column_types)
        self.spill_bytes = spill_bytes
        self.batch_bytes = batch_bytes_limit(spill_bytes)
        self.spill_dir = spill_dir
        if types not in ("typed", "raw"):
            raise ValueError(f"types must be 'typed' or 'raw', got {types!r}")
        if numeric not in ("decimal", "text"):
            raise ValueError(f"numeric must be 'decimal' or 'text', got {numeric!r}")
        self.numeric = numeric
        self.typed = types == "typed"
        self.type_catalog = type_catalog
        self.internal_order = -1
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        if proto_version is not None and protocol == "spock" and proto_version not in (2, 3, 4, 5):
            raise ValueError(f"unsupported spock proto_version {proto_version}: expected 2, 3, 4 or 5")
        self.batch_rows = batch_rows
        self.protocol = protocol
        self.proto = PROTOCOLS.index(protocol)
        self.spock_version = proto_version if (protocol == "spock" and proto_version is not None) else -1
        self.startup_params = {}
        self.relations = {}
        self.types = {}
        self.remote_insert_lsn = 0
        self.versions = {}
        self.infos = {}
        self.shared = []
        self.events = []
        self.txn = None
        self.stream = None
        self.streams = {}
        self.prepared = {}
        self.last_commit_end = 0
        self.after = AFTER_NOTHING
        self.last_relid = 0
        self.last_info = None

    # ------------------------------------------------------------------ public API
    def feed(self, payload, lsn=None):
        cdef Py_buffer view
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            if self.views:
                self._set_pin(payload, &view)
            self._message(<const char*>view.buf, view.len)
        except BaseException:
            if self.in_message:
                self._refused()
            raise
        finally:
            self.pin_obj = None
            PyBuffer_Release(&view)

    def feed_frames(self, buffer, *, bint partial_ok=False):
        cdef Py_buffer view
        cdef const char* p
        cdef Py_ssize_t n, pos = 0
        cdef uint32_t length
        PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        try:
            if self.views:
                self._set_pin(buffer, &view)
            p = <const char*>view.buf
            n = view.len
            # one try for the whole input rather than one per message (its entry costs as much as a field)
            try:
                while pos < n:
                    if n - pos < 12:
                        if partial_ok:
                            break
                        raise FrameError(f"truncated frame record at byte {pos}: need 12 bytes for the record "
                                         f"header, {n - pos} remaining", offset=pos, needed=12, remaining=n - pos)
                    length = sw_load_u32(p + pos)
                    if n - pos - 12 < <Py_ssize_t>length:
                        if partial_ok:
                            break
                        raise FrameError(f"truncated frame record at byte {pos}: need {length} bytes for the "
                                         f"payload, {n - pos - 12} remaining", offset=pos, needed=length,
                                         remaining=n - pos - 12)
                    self.ahead_bytes = n - pos - 12 - length
                    self._message(p + pos + 12, length)
                    pos += 12 + length
            except BaseException as exc:
                if self.in_message:
                    self._refused()
                    if isinstance(exc, ProtocolError):
                        exc.frame_offset = pos
                raise
        finally:
            self.pin_obj = None
            self.ahead_bytes = 0
            PyBuffer_Release(&view)
        return pos

    cdef int _set_pin(self, object obj, Py_buffer* view) except -1:
        self.pin_obj = pin_source(obj)
        self.pin_start = <const char*>view.buf
        self.pin_len = view.len
        if self.pin_obj is not None:
            self.pin_cost = pinned_size(self.pin_obj)
        return 0

    def drain(self):
        self._flush_shared(True)
        events = self.events
        self.events = []
        return events

    # ------------------------------------------------------------------ dispatch
    cdef int _message(self, const char* base, Py_ssize_t length) except -1:
        cdef Cur c
        cdef uint8_t t
        cdef int after
        c.base = base
        c.pos = 0
        c.end = length
        c.mtype = -1
        c.start = 0
        # a refused message leaves the ORIGIN / LAST-COMMIT placement as it was: its caller restores it (_refused)
        self.msg_after = self.after
        self.in_message = True
        if self.proto == SPOCK and self.spock_version == 5 and not (length and base[0] == 0x53):
            # every v5 message but the startup 'S' carries the publisher's insert LSN first
            get_u64(&c, &self.remote_insert_lsn, "the remote_insert_lsn prefix")
        c.start = c.pos
        get_u8(&c, &t, "the message type")
        c.mtype = t
        after = self.after
        self.after = AFTER_NOTHING
        if self.proto == PGOUTPUT:
            if t == 0x49 and self.stream is None:
                self._row_message(&c, t, 0)     # the hot path, an INSERT outside a stream block, with no detour
            else:
                self._pgoutput(&c, t, after)
        else:
            self._native(&c, t, after)
        self.in_message = False
        return 0

    cdef int _refused(self) except -1:
        """The message being decoded raised: the decoder is left as it was before it (feed, feed_frames)."""
        cdef _Builder b = self.row_builder
        self.in_message = False
        self.after = self.msg_after
        if b is not None:
            b.nrows = b.msg_mark
            b.nbytes = self.row_mark_bytes
            self.row_builder = None
        return 0

    cdef int _pgoutput(self, Cur* c, uint8_t t, int after) except -1:
        cdef uint64_t a, b
        cdef int64_t ts
        cdef uint32_t xid, subxid, oid, relid, nrels, size
        cdef uint8_t flags, ident, first
        cdef uint16_t natts, i
        cdef int32_t typmod
        if t == 0x49 or t == 0x55 or t == 0x44:  # I U D: the hot path
            subxid = 0
            if self.stream is not None:
                get_u32(c, &subxid, "the subtransaction xid")
            return self._row_message(c, t, subxid)
        elif t == 0x42:  # B
            get_u64(c, &a, "the final LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            get_u32(c, &xid, "the xid")
            done(c)
            self._begin(c, PLAIN, xid, a, ts)
        elif t == 0x43:  # C
            get_flags(c, 0, &flags)
            get_u64(c, &a, "the commit LSN")
            get_u64(c, &b, "the end LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            done(c)
            self._commit_plain(c, a, b, ts)
        elif t == 0x4F:  # O
            get_u64(c, &a, "the origin LSN")
            name = get_cstring(c, "the origin name")
            done(c)
            self._origin(c, after, name)
        elif t == 0x59:  # Y
            self._stream_xid(c)
            get_u32(c, &oid, "the type OID")
            nsp = get_cstring(c, "the type namespace")
            name = get_cstring(c, "the type name")
            done(c)
            self.types[oid] = (nsp, name)
        elif t == 0x52:  # R
            self._stream_xid(c)
            get_u32(c, &relid, "the relation id")
            nsp = get_cstring(c, "the namespace")
            name = get_cstring(c, "the relation name")
            get_u8(c, &ident, "the replica identity")
            get_u16(c, &natts, "the column count")
            cols = []
            for i in range(natts):
                if c.pos >= c.end:
                    raise_truncated(c, c.pos, 1, "the flags", i)
                flags = <uint8_t>c.base[c.pos]
                c.pos += 1
                if flags & ~1:
                    raise_bad(c, c.pos - 1, f"reserved bits 0x{flags & ~1 & 0xff:02x} set in the flags", i)
                cname = get_cstring(c, "the column name", i)
                if c.end - c.pos < 4:
                    raise_truncated(c, c.pos, 4, "the type OID", i, cname)
                oid = sw_load_u32(c.base + c.pos)
                c.pos += 4
                if c.end - c.pos < 4:
                    raise_truncated(c, c.pos, 4, "the type modifier", i, cname)
                typmod = sw_load_i32(c.base + c.pos)
                c.pos += 4
                cols.append(Column(cname, oid, typmod, bool(flags & 1)))
            done(c)
            self._relation(relid, nsp, name, tuple(cols), chr(ident) if 32 <= ident < 127 else str(ident))
        elif t == 0x54:  # T
            subxid = self._stream_xid(c)
            get_u32(c, &nrels, "the relation count")
            get_flags(c, 3, &flags)
            self._truncate(c, nrels, flags, subxid)
        elif t == 0x4D:  # M
            subxid = self._stream_xid(c)
            get_flags(c, 1, &flags)
            get_u64(c, &a, "the message LSN")
            prefix = get_cstring(c, "the message prefix")
            get_u32(c, &size, "the content length")
            need(c, size, "the content")
            content = c.base[c.pos:c.pos + size]
            c.pos += size
            done(c)
            self._logical_message(c, flags & 1, a, prefix, content, subxid)
        elif t == 0x53:  # S stream start
            get_u32(c, &xid, "the xid")
            get_u8(c, &first, "the first-segment flag")
            done(c)
            self._stream_start(c, xid, first)
        elif t == 0x45:  # E stream stop
            done(c)
            if self.stream is None:
                raise_bad(c, c.start, "stream stop without a stream start")
            self.stream = None
        elif t == 0x63:  # c stream commit
            get_u32(c, &xid, "the xid")
            get_flags(c, 0, &flags)
            get_u64(c, &a, "the commit LSN")
            get_u64(c, &b, "the end LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            done(c)
            self._stream_commit(c, xid, a, b, ts)
        elif t == 0x41:  # A stream abort
            get_u32(c, &xid, "the xid")
            get_u32(c, &subxid, "the subtransaction xid")
            if c.end - c.pos:
                skip(c, 8, "the abort LSN")
                skip(c, 8, "the abort timestamp")
            done(c)
            self._stream_abort(c, xid, subxid)
        elif t == 0x62:  # b begin prepare
            get_u64(c, &a, "the prepare LSN")
            skip(c, 8, "the end LSN")
            get_timestamp(c, &ts, "the prepare timestamp")
            get_u32(c, &xid, "the xid")
            gid = get_cstring(c, "the gid")
            done(c)
            txn = self._begin(c, PREPARED, xid, a, ts)
            (<_Txn>txn).gid = gid
        elif t == 0x50 or t == 0x70:  # P prepare, p stream prepare
            get_flags(c, 0, &flags)
            skip(c, 8, "the prepare LSN")
            skip(c, 8, "the end LSN")
            skip(c, 8, "the prepare timestamp")
            get_u32(c, &xid, "the xid")
            gid = get_cstring(c, "the gid")
            done(c)
            if t == 0x50:
                self._prepare(c, xid, gid)
            else:
                self._stream_prepare(c, xid, gid)
        elif t == 0x4B:  # K commit prepared
            get_flags(c, 0, &flags)
            get_u64(c, &a, "the commit LSN")
            get_u64(c, &b, "the end LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            get_u32(c, &xid, "the xid")
            gid = get_cstring(c, "the gid")
            done(c)
            self._commit_prepared(c, xid, gid, a, b, ts)
        elif t == 0x72:  # r rollback prepared
            get_flags(c, 0, &flags)
            skip(c, 8, "the prepare end LSN")
            get_u64(c, &b, "the rollback end LSN")
            skip(c, 8, "the prepare timestamp")
            skip(c, 8, "the rollback timestamp")
            skip(c, 4, "the xid")
            gid = get_cstring(c, "the gid")
            done(c)
            self._rollback_prepared(c, gid, b)
        else:
            raise_bad(c, c.start, "unknown pgoutput message type")
        return 0

    cdef int _native(self, Cur* c, uint8_t t, int after) except -1:
        cdef bint spock = self.proto == SPOCK
        cdef uint64_t a, b
        cdef int64_t ts
        cdef uint32_t xid, relid, nrels, size, oid
        cdef uint16_t natts, i, n16, node
        cdef uint8_t flags, fmt, n8, transactional
        cdef int32_t typmod
        if t == 0x49 or t == 0x55 or t == 0x44:  # I U D: the hot path
            if spock and self.spock_version < 0:
                self._need_startup(c)
            get_flags(c, 0, &flags)
            return self._row_message(c, t, 0)
        if t == 0x53:  # S startup
            get_u8(c, &fmt, "the startup format")
            if fmt != 1:
                raise_bad(c, c.pos - 1, f"unsupported startup message format {fmt}")
            params = {}
            while c.pos < c.end:
                key = get_cstring(c, "a startup parameter name")
                params[key] = get_cstring(c, f"the value of startup parameter {key!r}")
            self.startup_params = params
            self.internal_order = _byte_order(params)
            try:
                self.codec = text_codec(params.get("encoding"))
            except ValueError as exc:
                raise_bad(c, c.start, str(exc))
            if spock:
                self.spock_version = _negotiated_spock_version(type_name(c.mtype), params)
            return 0
        if spock and self.spock_version < 0:
            self._need_startup(c)
        if t == 0x42:  # B
            get_flags(c, 0, &flags)
            get_u64(c, &a, "the final LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            get_u32(c, &xid, "the xid")
            done(c)
            self._begin(c, PLAIN, xid, a, ts)
        elif t == 0x43:  # C
            get_flags(c, 0, &flags)
            get_u64(c, &a, "the commit LSN")
            get_u64(c, &b, "the end LSN")
            get_timestamp(c, &ts, "the commit timestamp")
            if spock and (self.spock_version == 3 or self.spock_version == 4):
                get_u64(c, &self.remote_insert_lsn, "the remote_insert_lsn")
            done(c)
            self._commit_plain(c, a, b, ts)
        elif t == 0x4F:  # O
            if spock:
                get_flags(c, 1, &flags)
                get_u64(c, &a, "the origin LSN")
                get_u16(c, &node, "the origin node id")
                name = get_cstring(c, "the origin name") if flags & 1 else None
                done(c)
                if a == 0:
                    name = None  # a local transaction
                elif name is None:
                    name = str(node)
            else:
                get_flags(c, 0, &flags)
                skip(c, 8, "the origin LSN")
                get_u8(c, &n8, "the origin name length")
                need(c, n8, "the origin name")
                raw = c.base[c.pos:c.pos + n8]
                c.pos += n8
                done(c)
                if n8 == 0 or c.base[c.pos - 1] != 0:
                    raise_bad(c, c.pos - 1 if n8 else c.pos, "origin name is not NUL-terminated")
                name = native_text_of(c, raw[:n8 - 1], c.pos - n8, "the origin name", self.codec)
            self._origin(c, after, name)
            if spock:
                self.after = AFTER_ORIGIN
        elif t == 0x4C and spock:  # L last commit ts
            get_flags(c, 0, &flags)
            skip(c, 8, "the last commit timestamp")
            done(c)
            if after != AFTER_ORIGIN:
                raise_bad(c, c.start, "LAST-COMMIT message not right after ORIGIN")
        elif t == 0x52:  # R
            get_flags(c, 0, &flags)
            get_u32(c, &relid, "the relation id")
            nsp = _native_name(c, "the namespace", self.codec)
            name = _native_name(c, "the relation name", self.codec)
            expect(c, 0x41, "the attributes block")
            get_u16(c, &natts, "the column count")
            cols = []
            for i in range(natts):
                expect(c, 0x43, "the column block")
                if c.pos >= c.end:
                    raise_truncated(c, c.pos, 1, "the flags", i)
                flags = <uint8_t>c.base[c.pos]
                c.pos += 1
                if flags & ~1:
                    raise_bad(c, c.pos - 1, f"reserved bits 0x{flags & ~1 & 0xff:02x} set in the flags", i)
                expect(c, 0x4E, "the column name block")
                get_u16(c, &n16, "the column name length")
                if c.end - c.pos < n16:
                    raise_truncated(c, c.pos, n16, "the column name", i)
                c.pos += n16
                if n16 == 0 or c.base[c.pos - 1] != 0:
                    raise_bad(c, c.pos - 1 if n16 else c.pos, "column name is not NUL-terminated", i)
                cname = native_text_of(c, c.base[c.pos - n16:c.pos - 1], c.pos - n16, "the column name",
                                       self.codec, i)
                if spock:
                    if c.end - c.pos < 4:
                        raise_truncated(c, c.pos, 4, "the type OID", i, cname)
                    oid = sw_load_u32(c.base + c.pos)
                    c.pos += 4
                    if c.end - c.pos < 4:
                        raise_truncated(c, c.pos, 4, "the type modifier", i, cname)
                    typmod = sw_load_i32(c.base + c.pos)
                    c.pos += 4
                    cols.append(Column(cname, oid, typmod, bool(flags & 1)))
                else:
                    cols.append(Column(cname, None, None, bool(flags & 1)))
            done(c)
            self._relation(relid, nsp, name, tuple(cols), None)
        elif t == 0x54 and spock:  # T truncate: no flags byte first
            get_u32(c, &nrels, "the relation count")
            get_flags(c, 3, &flags)
            self._truncate(c, nrels, flags, 0)
        elif t == 0x4D and spock:  # M sync event message: no flags byte
            get_u32(c, &xid, "the xid")
            get_u64(c, &a, "the message LSN")
            get_u8(c, &transactional, "the transactional flag")
            if transactional > 1:
                raise_bad(c, c.pos - 1, f"transactional flag must be 0 or 1, got {transactional}")
            prefix = get_cstring(c, "the message prefix")
            get_u32(c, &size, "the content length")
            need(c, size, "the content")
            content = c.base[c.pos:c.pos + size]
            c.pos += size
            done(c)
            self._logical_message(c, transactional, a, prefix, content, 0)
        else:
            raise_bad(c, c.start, f"unknown {self.protocol} message type")
        return 0

    cdef int _need_startup(self, Cur* c) except -1:
        raise_bad(c, c.start, "spock stream must begin with the startup message 'S' "
                        "(or build the Decoder with proto_version=4 or 5)")


cdef object _native_name(Cur* c, str what, object codec):
    cdef uint8_t n
    get_u8(c, &n, what + " length")
    if c.end - c.pos < n:
        raise_truncated(c, c.pos, n, what)
    c.pos += n
    if n == 0 or c.base[c.pos - 1] != 0:
        raise_bad(c, c.pos - 1 if n else c.pos, f"{what} is not NUL-terminated")
    return native_text_of(c, c.base[c.pos - n:c.pos - 1], c.pos - n, what, codec)


def _negotiated_spock_version(mtype, dict params):
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
        raise protocol_error(mtype, 0, f"unsupported spock proto_version {text!r} in the startup message")
    return version


def _byte_order(dict params):
    """1 when the startup message says the server is big-endian, 0 little-endian, -1 when it does not say."""
    value = params.get("binary.bigendian")
    if value is None:
        return -1
    return 1 if value.strip().lower() in ("t", "true", "1", "on", "yes") else 0


include "_copy.pxi"
