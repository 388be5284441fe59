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


# ---------------------------------------------------------------------------------------------- builder
cdef class _Builder:
    """Rows of one relation version in Arrow-layout buffers, reserved ahead and grown geometrically."""
    cdef readonly object relation
    cdef object names
    cdef tuple specs
    cdef public Py_ssize_t ncols
    cdef public Py_ssize_t nrows
    cdef public Py_ssize_t committed
    cdef Py_ssize_t msg_mark       # rows before the row message being decoded
    cdef bint full                 # closed early: a message's values would not fit with the rows already here
    cdef Py_ssize_t cap_rows
    cdef Py_ssize_t initial_rows   # first reservation: 256 rows, fewer for very wide relations
    cdef readonly int64_t nbytes
    cdef ColBuf* cols
    cdef Buf change, lsn, ts, xid, seq, origin, subxid, toast_valid, toast_off, toast_idx
    cdef list origins          # distinct origin names seen; per row an int32 index, -1 = none
    cdef object last_origin
    cdef int32_t last_origin_idx
    cdef bint any_toast
    cdef object frozen         # pa.RecordBatch of all rows once frozen
    cdef bint views            # strings="view": the string and binary columns are string_view / binary_view
    cdef bint has_views        # ... and this relation has such a column
    cdef list pins             # input buffers the views point into (variadic buffer 1, 2, ...)
    cdef object last_pin
    cdef int32_t last_pin_idx
    cdef int64_t pinned_bytes  # total size of the pinned buffers

    def __cinit__(self, relation, tuple specs, bint views=False):
        cdef Py_ssize_t i
        self.relation = relation
        self.names = relation.column_names
        self.specs = specs
        self.views = views
        self.has_views = views and any(is_view_kind(spec.kind) for spec in specs)
        self.pins = []
        self.last_pin = None
        self.last_pin_idx = 0
        self.pinned_bytes = 0
        self.ncols = len(relation.columns)
        self.cols = NULL             # allocated by the first reservation, once a row has passed its checks
        # a first row must not reserve much more than the relation's own description took on the wire
        self.initial_rows = max(1, min(256, 16384 // max(self.ncols, 1)))
        self.origins = []
        self.last_origin = None
        self.last_origin_idx = -1

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.cols != NULL:
            for i in range(self.ncols):
                col_free(&self.cols[i])
            free(self.cols)
            self.cols = NULL
        buf_free(&self.change)
        buf_free(&self.lsn)
        buf_free(&self.ts)
        buf_free(&self.xid)
        buf_free(&self.seq)
        buf_free(&self.origin)
        buf_free(&self.subxid)
        buf_free(&self.toast_valid)
        buf_free(&self.toast_off)
        buf_free(&self.toast_idx)

    cdef int reserve_rows(self, Py_ssize_t rows) except -1:
        """Room for `rows` rows in every per-row buffer."""
        cdef Py_ssize_t i, cap = self.cap_rows * 2
        if rows <= self.cap_rows:
            return 0
        if self.cols == NULL:
            self.cols = <ColBuf*>malloc(max(self.ncols, 1) * sizeof(ColBuf))
            if self.cols == NULL:
                raise MemoryError()
            memset(self.cols, 0, max(self.ncols, 1) * sizeof(ColBuf))
            for i in range(self.ncols):
                col_init(&self.cols[i], self.specs[i])
                self.cols[i].view = self.views and is_view_kind(self.cols[i].kind)
        if cap < rows:
            cap = rows
        if cap < self.initial_rows:
            cap = self.initial_rows
        buf_grow(&self.change, cap)
        buf_grow(&self.lsn, cap * 8)
        buf_grow(&self.ts, cap * 8)
        buf_grow(&self.xid, cap * 4)
        buf_grow(&self.seq, cap * 8)
        buf_grow(&self.origin, cap * 4)
        buf_grow(&self.subxid, cap * 4)
        buf_grow(&self.toast_valid, (cap + 7) >> 3)
        buf_grow(&self.toast_off, (cap + 1) * 4)
        for i in range(self.ncols):
            col_reserve(&self.cols[i], cap)
            if self.nrows > 0:
                reserve_values(&self.cols[i], self.nrows, cap)
        self.cap_rows = cap
        return 0

    cdef int32_t origin_index(self, object origin) except -2:
        if origin is None:
            return -1
        if origin is self.last_origin:
            return self.last_origin_idx
        try:
            idx = self.origins.index(origin)
        except ValueError:
            idx = len(self.origins)
            self.origins.append(origin)
        self.last_origin = origin
        self.last_origin_idx = idx
        return idx

    cdef void fill_commit(self, Py_ssize_t start, uint64_t lsn, int64_t ts) noexcept:
        cdef Py_ssize_t i
        cdef uint64_t* l = <uint64_t*>self.lsn.data
        cdef int64_t* t = <int64_t*>self.ts.data
        for i in range(start, self.nrows):
            l[i] = lsn
            t[i] = ts + _EPOCH

    cdef object freeze(self):
        """All rows as one pa.RecordBatch; the buffers move to pyarrow and the builder takes no more rows."""
        cdef Py_ssize_t i, n = self.nrows
        if self.frozen is not None:
            return self.frozen
        if self.cap_rows == 0:
            self.reserve_rows(1)
        pins = [pa.py_buffer(o) for o in self.pins] if self.pins else None
        values = [build_array(&self.cols[i], self.specs[i], n, pins) for i in range(self.ncols)]
        self.pins = []
        self.last_pin = None
        if self.any_toast:
            nidx = (<int32_t*>self.toast_off.data)[n]
            toast_off = pa.Array.from_buffers(pa.int32(), n + 1, [None, own(&self.toast_off, (n + 1) * 4)])
            toast_idx = pa.Array.from_buffers(pa.uint16(), nidx, [None, own(&self.toast_idx, nidx * 2)])
            clear_tail_bits(&self.toast_valid, n)
            valid = pa.Array.from_buffers(pa.bool_(), n, [None, own(&self.toast_valid, (n + 7) >> 3)])
            toast_mask = pc.invert(valid)
        else:
            toast_off = toast_idx = toast_mask = None
        if self.origins:
            idx = pa.Array.from_buffers(pa.int32(), n, [None, own(&self.origin, n * 4)])
            origin = pa.array(self.origins, pa.string()).take(
                pc.if_else(pc.less(idx, 0), pa.scalar(None, pa.int32()), idx))
        else:
            origin = pa.nulls(n, pa.string())
        ts = pa.Array.from_buffers(pa.int64(), n, [None, own(&self.ts, n * 8)]).view(_TS_TYPE)
        self.frozen = finish_batch(
            self.relation,
            pa.Array.from_buffers(pa.int8(), n, [None, own(&self.change, n)]),
            pa.Array.from_buffers(pa.uint64(), n, [None, own(&self.lsn, n * 8)]),
            ts,
            pa.Array.from_buffers(pa.uint32(), n, [None, own(&self.xid, n * 4)]),
            pa.Array.from_buffers(pa.int64(), n, [None, own(&self.seq, n * 8)]),
            origin, toast_off, toast_idx, toast_mask, values)
        return self.frozen

    cdef object take_rows(self, Py_ssize_t start, Py_ssize_t stop, object keep=None):
        if stop <= start:
            return None
        cdef Py_ssize_t i
        batch = self.freeze()
        if start != 0 or stop != self.nrows:
            batch = batch.slice(start, stop - start)
        if keep is not None:
            batch = filter_batch(batch, pa.array(keep, pa.bool_()))
            if batch.num_rows == 0:
                return None
        for i in range(self.ncols):
            # an untyped column is binary in a batch only when one of the batch's own values was not text
            if (self.cols[i].kind == K_RAW or self.cols[i].kind == K_OTHER) and self.cols[i].nontext \
                    and not marks_any(&self.cols[i], start, stop, keep):
                pos = 7 + i
                text = pa.string_view() if self.cols[i].view else pa.string()
                batch = batch.set_column(pos, batch.schema.field(pos).with_type(text), batch.column(pos).cast(text))
        return ChangeBatch(self.relation, batch)

    cdef dict raw_marks(self, Py_ssize_t start, Py_ssize_t stop):
        """For each untyped column with a value in rows [start, stop) that did not arrive as text: the marks of
        those rows (what the column's type is decided by once rows of aborted subtransactions are dropped)."""
        cdef Py_ssize_t i, r
        cdef dict out = {}
        for i in range(self.ncols):
            if (self.cols[i].kind == K_RAW or self.cols[i].kind == K_OTHER) and self.cols[i].nontext \
                    and marks_any(&self.cols[i], start, stop, None):
                out[i] = [bool(self.cols[i].marks.data[r >> 3] & (1 << (r & 7))) for r in range(start, stop)]
        return out

    cdef list subxids(self, Py_ssize_t start, Py_ssize_t stop):
        cdef uint32_t* s = <uint32_t*>self.subxid.data
        return [s[i] for i in range(start, stop)]


# ---------------------------------------------------------------------------------------------- state
cdef class _RelInfo:
    cdef object relation
    cdef tuple specs
    cdef Py_ssize_t ncols
    cdef _Builder builder      # shared builder for plain transactions, or None


cdef class _Txn:
    cdef int kind
    cdef uint32_t xid
    cdef uint64_t final_lsn
    cdef int64_t commit_ts
    cdef object origin
    cdef int64_t seq
    cdef list pending          # ("rows", builder, start, stop) | ("truncate", ...) | ("message", ...)
    cdef dict builders         # relid -> _Builder, streamed/prepared transactions only
    cdef set aborted
    cdef uint64_t floor
    cdef object gid
    cdef object spill           # SpillFile once closed batches went to disk
    cdef int64_t mem            # estimated bytes of closed batches still in memory
    cdef dict runs              # streamed: subxid -> runs of _seq its changes took
    cdef uint32_t run_sub
    cdef int64_t run_start

    def __cinit__(self, int kind, uint32_t xid, uint64_t final_lsn, int64_t commit_ts, uint64_t floor):
        self.kind = kind
        self.xid = xid
        self.final_lsn = final_lsn
        self.commit_ts = commit_ts
        self.origin = None
        self.seq = 0
        self.pending = []
        self.builders = {}
        self.aborted = set()
        self.floor = floor
        self.gid = None
        self.spill = None
        self.mem = 0
        self.runs = {}
        self.run_sub = 0
        self.run_start = 0

    cdef inline int advance(self, uint32_t sub, int64_t n) except -1:
        """`n` changes of subtransaction `sub` took the next numbers."""
        if self.kind == STREAM and sub != self.run_sub:
            self.close_run()
            self.run_sub = sub
        self.seq += n
        return 0

    cdef int close_run(self) except -1:
        if self.seq > self.run_start:
            self.runs.setdefault(self.run_sub, []).append((self.run_start, self.seq))
        self.run_start = self.seq
        return 0

    cdef object renumbering(self):
        if not self.aborted:
            return None
        self.close_run()
        return SeqRenumber([run for sub in self.aborted for run in self.runs.get(sub, ())])


cdef bint marks_any(ColBuf* col, Py_ssize_t start, Py_ssize_t stop, object keep):
    cdef Py_ssize_t r
    for r in range(start, stop):
        if col.marks.data[r >> 3] & (1 << (r & 7)):
            if keep is None or keep[r - start]:
                return True
    return False


cdef object utf8_text_of(Cur* c, bytes raw, Py_ssize_t at, str what, int column=-1):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise_bad(c, at, f"{what} is not valid UTF-8", column)


cdef object native_text_of(Cur* c, bytes raw, Py_ssize_t at, str what, object codec, int column=-1):
    """A native name in the stream's text encoding (`codec`; None: UTF-8)."""
    if codec is None or raw.isascii():
        return utf8_text_of(c, raw, at, what, column)
    try:
        return raw.decode(codec)
    except UnicodeDecodeError:
        raise_bad(c, at, f"{what} is not valid {codec_label(codec)}", column)


cdef str codec_label(object codec):
    return encoding_name(codec)


cdef inline bint all_ascii(const char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if <unsigned char>p[i] >= 0x80:
            return False
    return True


cdef bytes latin1_to_utf8(const char* p, Py_ssize_t n):
    """LATIN1 bytes as UTF-8: every byte from 0x80 up becomes two."""
    cdef Py_ssize_t i, j = 0, extra = 0
    cdef unsigned char ch
    for i in range(n):
        if <unsigned char>p[i] >= 0x80:
            extra += 1
    out = PyBytes_FromStringAndSize(NULL, n + extra)
    cdef char* q = PyBytes_AS_STRING(out)
    for i in range(n):
        ch = <unsigned char>p[i]
        if ch < 0x80:
            q[j] = <char>ch
            j += 1
        else:
            q[j] = <char>(0xC0 | (ch >> 6))
            q[j + 1] = <char>(0x80 | (ch & 0x3F))
            j += 2
    return out


cdef str _lsn(uint64_t v):
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


# ---------------------------------------------------------------------------------------------- decoder
cdef class Decoder:
    """Decodes one logical-replication stream (pgoutput, pglogical or spock) into committed change events."""
    cdef readonly str protocol
    cdef int proto
    cdef int spock_version            # -1 until known
    cdef public dict startup_params
    cdef readonly dict relations
    cdef readonly dict types
    cdef readonly uint64_t remote_insert_lsn
    cdef dict versions
    cdef dict infos
    cdef list shared                  # builders in use by plain transactions, in creation order
    cdef list events
    cdef _Txn txn                     # open plain B..C or b..P transaction
    cdef _Txn stream                  # stream block in progress
    cdef dict streams                 # top xid -> streamed transaction
    cdef dict prepared                # gid -> prepared transaction
    cdef uint64_t last_commit_end
    cdef int after
    cdef Py_ssize_t batch_rows
    cdef uint32_t last_relid
    cdef _RelInfo last_info
    cdef bint typed
    cdef str numeric
    cdef readonly str on_unrepresentable
    cdef bint fallback_text
    cdef readonly dict column_types
    cdef int64_t spill_bytes
    cdef Py_ssize_t ahead_bytes       # input after the message being decoded (feed_frames): sizes reservations
    cdef int64_t batch_bytes          # a builder is sealed at this size (batch_bytes_limit)
    cdef object spill_dir
    cdef readonly object type_catalog
    cdef object codec                 # native protocols: the codec of text (startup 'encoding'); None: UTF-8
    cdef int internal_order           # server byte order of 'i' datums: 1 big, 0 little, -1 not announced
    cdef bint views                   # strings="view"
    cdef readonly str strings
    cdef readonly int64_t pin_bytes
    cdef object pin_obj               # the input being fed, when views may point into it (views.pin_source)
    cdef const char* pin_start
    cdef Py_ssize_t pin_len
    cdef int64_t pin_cost             # bytes pinning it keeps alive (views.pinned_size)
    cdef bint in_message              # a message is being decoded (cleared when it is done or refused)
    cdef int msg_after                # `after` before that message, restored when it is refused
    cdef _Builder row_builder         # the builder a row message is adding to, reset when the message is refused
    cdef int64_t row_mark_bytes       # its nbytes before the message
    cdef Py_ssize_t unrepresentable   # the column of the last ROW_UNREPRESENTABLE

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
    @property
    def committed_lsn(self):
        cdef uint64_t lsn = self.last_commit_end
        cdef _Txn t
        for t in self.streams.values():
            if t.floor < lsn:
                lsn = t.floor
        for t in self.prepared.values():
            if t.floor < lsn:
                lsn = t.floor
        if self.txn is not None and self.txn.kind == PREPARED and self.txn.floor < lsn:
            lsn = self.txn.floor
        return lsn

    @property
    def open_transactions(self):
        """Transactions begun and not yet ended: the one being received, streamed ones, prepared ones."""
        return (self.txn is not None) + len(self.streams) + len(self.prepared)

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

    cdef int _pin(self, _Builder b) except -1:
        """Where the views of the row being decoded may point (views.py): the builder pins the input being fed,
        unless that would take it past pin_bytes (ROW_BATCH_FULL when it has rows) or MAX_PINS, or the input alone
        is larger than pin_bytes (the values are copied then)."""
        global pin_base, pin_end, pin_index
        cdef Py_ssize_t k
        cdef object obj = self.pin_obj
        pin_index = 0
        if obj is None:
            return 0
        if b.last_pin is not obj:
            for k in range(len(b.pins)):
                if b.pins[k] is obj:
                    break
            else:
                if len(b.pins) >= MAX_PINS or self.pin_cost > self.pin_bytes:
                    return 0
                if b.pinned_bytes + self.pin_cost > self.pin_bytes:
                    if b.msg_mark > 0:
                        return ROW_BATCH_FULL
                    return 0
                b.pins.append(obj)
                b.pinned_bytes += self.pin_cost
                k = len(b.pins) - 1
            b.last_pin = obj
            b.last_pin_idx = <int32_t>(k + 1)
        pin_index = b.last_pin_idx
        pin_base = self.pin_start
        pin_end = self.pin_start + self.pin_len
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

    # ------------------------------------------------------------------ relations
    cdef uint32_t _stream_xid(self, Cur* c) except? 0xFFFFFFFF:
        cdef uint32_t sub = 0
        if self.stream is not None:
            get_u32(c, &sub, "the subtransaction xid")
        return sub

    cdef _relation(self, uint32_t relid, nsp, name, tuple cols, ident):
        cdef _RelInfo previous = self.infos.get(relid)
        if previous is not None:
            self._close_builders_of(previous)
        version = self.versions.get(relid, 0) + 1
        self.versions[relid] = version
        rel = Relation(relid, nsp, name, cols, ident, version)
        cdef _RelInfo info = _RelInfo.__new__(_RelInfo)
        info.specs = column_specs(rel, self.types, self.type_catalog, self.typed, self.numeric, self.column_types)
        self.relations[relid] = rel
        info.relation = rel
        info.ncols = len(cols)
        info.builder = None
        self.infos[relid] = info
        if self.last_info is not None and self.last_relid == relid:
            self.last_info = None

    cdef _RelInfo _switch_to_text(self, _RelInfo previous, Py_ssize_t column):
        """A new version of the relation whose `column` keeps PostgreSQL's text of every value from now on; the
        rows of the previous version close first, as for a Relation message sent again."""
        self._close_builders_of(previous)
        old = previous.relation
        version = self.versions.get(old.relid, 0) + 1
        self.versions[old.relid] = version
        rel = Relation(old.relid, old.namespace, old.name, old.columns, old.replica_identity, version)
        cdef _RelInfo info = _RelInfo.__new__(_RelInfo)
        specs = list(previous.specs)
        specs[column] = text_column_spec(rel, column, self.types, self.type_catalog)
        info.specs = tuple(specs)
        info.relation = rel
        info.ncols = previous.ncols
        info.builder = None
        self.relations[old.relid] = rel
        self.infos[old.relid] = info
        self.last_info = info
        self.last_relid = old.relid
        return info

    cdef int _close_builders_of(self, _RelInfo info) except -1:
        """A relation is described again: the rows of its previous version that open streamed or prepared
        transactions hold in builders become pending slices now, before any row of the new version (a builder is
        found by its description's identity, which is not reused while the builder is open). Plain transactions
        keep their builders in creation order (self.shared), which is already the order of their rows."""
        cdef _Txn txn
        cdef _Builder b
        key = id(info)
        txns = list(self.streams.values())
        txns.extend(self.prepared.values())
        if self.txn is not None and self.txn.kind != PLAIN:
            txns.append(self.txn)
        for txn in txns:
            b = txn.builders.pop(key, None)
            if b is not None:
                self._pend_rows(txn, b, 0, b.nrows)
        return 0

    # ------------------------------------------------------------------ transactions
    cdef _Txn _begin(self, Cur* c, int kind, uint32_t xid, uint64_t final_lsn, int64_t ts):
        if self.txn is not None:
            raise_bad(c, c.start, f"BEGIN while transaction {self.txn.xid} is still open")
        if self.stream is not None:
            raise_bad(c, c.start, "BEGIN inside a stream block")
        txn = _Txn(kind, xid, final_lsn, ts, self.committed_lsn)
        self.txn = txn
        self.after = AFTER_BEGIN
        return txn

    cdef int _origin(self, Cur* c, int after, name) except -1:
        if after != AFTER_BEGIN:
            raise_bad(c, c.start, "ORIGIN message not right after BEGIN")
        txn = self.stream if self.stream is not None else self.txn
        (<_Txn>txn).origin = name
        return 0

    cdef _Txn _current(self, Cur* c):
        cdef _Txn txn = self.stream if self.stream is not None else self.txn
        if txn is None:
            raise_bad(c, c.start, "change outside a transaction")
        return txn

    cdef _Builder _builder(self, _Txn txn, _RelInfo info):
        cdef _Builder b
        if txn.kind == PLAIN:
            b = info.builder
            if b is not None and (b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full):
                self._flush_shared()
                b = None
            if b is None:
                b = _Builder(info.relation, info.specs, self.views)
                info.builder = b
                self.shared.append(b)
        else:
            key = id(info)
            b = txn.builders.get(key)
            if b is not None and (b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full):
                self._pend_rows(txn, b, 0, b.nrows)
                b = None
            if b is None:
                b = _Builder(info.relation, info.specs, self.views)
                txn.builders[key] = b
        return b

    cdef int _row_message(self, Cur* c, uint8_t t, uint32_t sub) except -1:
        cdef _Txn txn = self.stream if self.stream is not None else self.txn
        cdef uint32_t relid
        cdef _RelInfo info
        cdef _Builder b
        cdef Py_ssize_t mark
        cdef uint8_t kind
        if txn is None:
            self._current(c)     # raises
        get_u32(c, &relid, "the relation id")
        if self.last_info is not None and relid == self.last_relid:
            info = self.last_info
        else:
            info = self.infos.get(relid)
            if info is None:
                raise_bad(c, c.pos - 4, f"row for relation {relid}, which was never described")
            self.last_info = info
            self.last_relid = relid
        cdef Py_ssize_t body = c.pos
        cdef int64_t mark_bytes
        cdef int rc
        b = info.builder
        if txn.kind != PLAIN or b is None or b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full:
            b = self._builder(txn, info)     # the usual case, a plain transaction's open builder, needs no call
        while True:
            mark = b.nrows
            mark_bytes = b.nbytes
            b.msg_mark = mark
            self.row_builder = b          # a refused message takes its rows back out (_refused)
            self.row_mark_bytes = mark_bytes
            if t == 0x49:     # an INSERT's one tuple without the _row_body call
                expect(c, 0x4E, "the new tuple marker")
                rc = self._tuple(c, b, txn, INSERT, sub, txn.seq)
                if rc == 0:
                    done(c)
            else:
                rc = self._row_body(c, t, b, txn, sub, mark)
            if rc == 0:
                break
            b.nrows = mark
            b.nbytes = mark_bytes
            if rc == ROW_BATCH_FULL:
                # the message's values would take a column past Arrow's 32-bit offsets together with the rows
                # already in this batch: those rows close as a batch and the message is decoded again, alone
                b.full = True
            else:
                # a valid value its column's type cannot hold: the column becomes text under a new version of
                # the relation and the message is decoded again with it
                for column in self._columns_to_switch(c, t, txn, sub, info, body, self.unrepresentable):
                    info = self._switch_to_text(info, column)
            c.pos = body
            b = self._builder(txn, info)
        self.row_builder = None
        txn.advance(sub, b.nrows - mark)
        return 0

    cdef list _columns_to_switch(self, Cur* c, uint8_t t, _Txn txn, uint32_t sub, _RelInfo info, Py_ssize_t body,
                                 Py_ssize_t first):
        """The columns a row message turns to text, in the order its decoding meets them, found on a scratch
        builder: a message refused for another reason raises here and switches nothing."""
        cdef list columns = [first]
        cdef Py_ssize_t column = first
        specs = list(info.specs)
        while True:
            specs[column] = text_column_spec(info.relation, column, self.types, self.type_catalog)
            c.pos = body
            if self._row_body(c, t, _Builder(info.relation, tuple(specs)), txn, sub, 0) == ROW_UNREPRESENTABLE:
                column = self.unrepresentable
                columns.append(column)
                continue
            return columns

    cdef int _row_body(self, Cur* c, uint8_t t, _Builder b, _Txn txn, uint32_t sub, Py_ssize_t mark) except -1:
        """The tuples of an INSERT, UPDATE or DELETE after the relation id: 0, or ROW_BATCH_FULL /
        ROW_UNREPRESENTABLE from a tuple (the message must be decoded again)."""
        cdef uint8_t kind
        cdef int rc
        if t == 0x49:
            expect(c, 0x4E, "the new tuple marker")
            rc = self._tuple(c, b, txn, INSERT, sub, txn.seq)
            if rc:
                return rc
        elif t == 0x55:
            get_u8(c, &kind, "the tuple marker")
            if kind == 0x4B or kind == 0x4F:
                rc = self._tuple(c, b, txn, UPDATE_PRE, sub, txn.seq)
                if rc:
                    return rc
                expect(c, 0x4E, "the new tuple marker")
            elif kind != 0x4E:
                raise_bad(c, c.pos - 1, f"expected 'K', 'O' or 'N' tuple marker, got {type_name(kind)!r}")
            rc = self._tuple(c, b, txn, UPDATE_POST, sub, txn.seq + b.nrows - mark)
            if rc:
                return rc
        else:
            get_u8(c, &kind, "the tuple marker")
            if kind != 0x4B and kind != 0x4F:
                raise_bad(c, c.pos - 1, f"expected 'K' or 'O' tuple marker, got {type_name(kind)!r}")
            rc = self._tuple(c, b, txn, DELETE, sub, txn.seq)
            if rc:
                return rc
        done(c)
        return 0

    cdef Py_ssize_t _rows_to_reserve(self, _Builder b, Py_ssize_t need, Py_ssize_t msg_bytes) noexcept:
        """Rows a builder that is full reserves: after its first reservation, as many as the rest of the input
        could still bring in messages of this one's size (at most batch_rows). Large buffers are mappings whose
        pages are taken only when written, so reserving ahead costs no memory; it saves the doublings, and a
        batch's buffers then come in the sizes the previous batch's left in the pool."""
        cdef Py_ssize_t want
        if b.cap_rows == 0 or self.ahead_bytes <= 0:
            return need
        want = need + self.ahead_bytes // (msg_bytes if msg_bytes > 0 else 1)
        if want > self.batch_rows:
            want = self.batch_rows
        return want if want > need else need

    cdef int _tuple(self, Cur* c, _Builder b, _Txn txn, int8_t change, uint32_t sub, int64_t seq) except -1:
        """One tuple block into row b.nrows: 0, or ROW_BATCH_FULL / ROW_UNREPRESENTABLE (nothing kept)."""
        cdef bint native = self.proto != PGOUTPUT
        cdef uint16_t natts, i
        cdef Py_ssize_t row = b.nrows, at
        cdef uint8_t kind
        cdef uint32_t n
        cdef ColBuf* col
        cdef int32_t* off
        cdef const char* p
        cdef int32_t ntoast = 0
        cdef int rc
        cdef int32_t toast_at
        cdef bytes converted              # a text value converted from the stream's encoding to UTF-8
        cdef Py_ssize_t vat               # where the value starts in the message
        cdef unsigned char bit = 1 << (row & 7)
        cdef Py_ssize_t byte = row >> 3
        # the cursor and the batch's byte count live in locals through the loop: the compiler cannot keep fields
        # behind pointers in registers across the kernels' calls
        cdef const char* base = c.base
        cdef Py_ssize_t pos, end = c.end
        cdef int64_t nbytes = b.nbytes
        cdef ColBuf* cols
        global appended
        if native:
            expect(c, 0x54, "the tuple block")
        get_u16(c, &natts, "the tuple column count")
        if natts != b.ncols:
            raise_bad(c, c.pos - 2, f"tuple has {natts} columns but relation "
                                    f"{b.relation.qualified_name} has {b.ncols}")
        pos = c.pos
        if end - pos < natts:
            # every column takes at least its kind byte: refuse before reserving anything for the row
            raise_truncated(c, pos, natts, "the tuple's values (at least one byte per column)")
        if b.has_views:
            rc = self._pin(b)
            if rc:
                return rc
        if row + 1 > b.cap_rows:
            b.reserve_rows(self._rows_to_reserve(b, row + 1, end))
        toast_at = (<int32_t*>b.toast_off.data)[row]
        cols = b.cols
        for i in range(natts):
            col = &cols[i]
            if pos >= end:
                raise_truncated(c, pos, 1, "the value kind", i, b.names[i])
            kind = <uint8_t>base[pos]
            pos += 1
            if kind == 0x74 or kind == 0x62 or (kind == 0x69 and native):  # t b i
                if end - pos < 4:
                    raise_truncated(c, pos, 4, "the value length", i, b.names[i])
                n = sw_load_u32(base + pos)
                pos += 4
                if <size_t>(end - pos) < n:
                    raise_truncated(c, pos, n, "the value", i, b.names[i])
                p = base + pos
                vat = pos
                pos += n
                if kind == 0x74 and native:
                    if n == 0 or p[n - 1] != 0:
                        raise_bad(c, pos - 1 if n else pos, "text value is not NUL-terminated", i, b.names[i])
                    n -= 1
                    if self.codec is not None and not all_ascii(p, n):
                        if self.codec == "latin-1":
                            converted = latin1_to_utf8(p, n)
                        else:
                            try:
                                converted = p[:n].decode(self.codec).encode("utf-8")
                            except UnicodeDecodeError:
                                raise_bad(c, vat, f"text value is not valid {codec_label(self.codec)}", i,
                                          b.names[i])
                        p = converted
                        n = len(converted)
                if col.kind == K_RAW or col.kind == K_OTHER:
                    if kind != 0x74 or not sw_utf8_valid(<const unsigned char*>p, n):
                        col.marks.data[byte] |= bit
                    else:
                        col.marks.data[byte] &= ~bit
                    off = <int32_t*>col.offsets.data
                    at = off[row]
                    if at + <Py_ssize_t>n > OFFSET_LIMIT:
                        return self._value_failed(c, b, vat, F_TOO_LARGE, kind, p, n, i)
                    if col.view:
                        view_store(col, row, p, n)
                    else:
                        if at + <Py_ssize_t>n > col.data.cap:
                            buf_grow(&col.data, at + n)
                        if n:   # an empty first value: no buffer yet, and no pointer arithmetic on NULL
                            sw_copy(col.data.data + at, p, n)
                    off[row + 1] = <int32_t>(at + n)
                    col.validity.data[byte] |= bit
                    nbytes += n
                elif kind == 0x62 and fixed_binary(col, row, p, n):
                    nbytes += n     # stored here: a fixed-width binary value needs no kernel call
                else:
                    appended = 0
                    rc = decode_value(col, row, kind, p, n, self.internal_order)
                    if rc:
                        return self._value_failed(c, b, vat, rc, kind, p, n, i)
                    # output bytes count too: an expanding kernel (binary numeric to text) closes batches as well
                    nbytes += n if <Py_ssize_t>n >= appended else appended
                if nbytes > OFFSET_LIMIT and b.msg_mark > 0:
                    return ROW_BATCH_FULL
            elif kind == 0x6E or kind == 0x75:  # n u
                set_null(col, row)
                if kind == 0x75:
                    if (toast_at + ntoast + 1) * 2 > b.toast_idx.cap:
                        buf_grow(&b.toast_idx, (toast_at + ntoast + 1) * 2)
                    (<uint16_t*>b.toast_idx.data)[toast_at + ntoast] = i
                    ntoast += 1
            else:
                raise_bad(c, pos - 1, f"unknown value kind {type_name(kind)!r}", i, b.names[i])
        c.pos = pos
        b.nbytes = nbytes
        (<int8_t*>b.change.data)[row] = change
        (<uint64_t*>b.lsn.data)[row] = txn.final_lsn
        (<int64_t*>b.ts.data)[row] = txn.commit_ts + _EPOCH
        (<uint32_t*>b.xid.data)[row] = txn.xid
        (<int64_t*>b.seq.data)[row] = seq
        (<int32_t*>b.origin.data)[row] = -1 if txn.origin is None else \
            b.last_origin_idx if txn.origin is b.last_origin else b.origin_index(txn.origin)
        (<uint32_t*>b.subxid.data)[row] = sub
        (<int32_t*>b.toast_off.data)[row + 1] = toast_at + ntoast
        if ntoast:
            b.toast_valid.data[byte] |= bit
            b.any_toast = True
        else:
            b.toast_valid.data[byte] &= ~bit
        b.nrows = row + 1
        return 0

    cdef int _value_failed(self, Cur* c, _Builder b, Py_ssize_t at, int rc, uint8_t kind, const char* p,
                           uint32_t n, Py_ssize_t i) except -1:
        """A value failed: ROW_BATCH_FULL when rows before the message can close first, ROW_UNREPRESENTABLE (a
        switch to text) for a valid value the column's Arrow type cannot hold, else the error."""
        if rc == F_TOO_LARGE and b.msg_mark > 0:
            return ROW_BATCH_FULL
        if self.fallback_text and switches_to_text(rc, b.specs[i]):
            self.unrepresentable = i
            return ROW_UNREPRESENTABLE
        if rc in DATUM_CODES:   # a refused varlena datum: its own byte and sentence (the twin's description)
            _code, pos, text = describe_datum_failure(p[:n], self.internal_order == 1, b.specs[i].type_name,
                                                 layout_oid(b.specs[i]))
            raise_bad(c, at + pos, text, i, b.names[i])
        raise_bad(c, at, value_problem(rc, kind, p[:n], b.specs[i].type_name), i, b.names[i])

    cdef int _truncate(self, Cur* c, uint32_t nrels, uint8_t flags, uint32_t sub) except -1:
        cdef _Txn txn = self._current(c)
        cdef uint32_t k, relid
        need(c, 4 * <Py_ssize_t>nrels, "the relation ids")  # bounds the count before any allocation
        rels = []
        for k in range(nrels):
            relid = sw_load_u32(c.base + c.pos)
            c.pos += 4
            rel = self.relations.get(relid)
            if rel is None:
                raise_bad(c, c.pos - 4, f"TRUNCATE of relation {relid}, which was never described")
            rels.append(rel)
        done(c)
        self._cut(txn)
        txn.pending.append(("truncate", tuple(rels), bool(flags & 1), bool(flags & 2), txn.seq, sub))
        txn.advance(sub, 1)
        return 0

    cdef int _logical_message(self, Cur* c, bint transactional, uint64_t lsn, prefix, content,
                              uint32_t sub) except -1:
        cdef _Txn txn
        if not transactional:
            self._flush_shared()
            self.events.append(LogicalMessage(prefix, content, False, lsn, sub if sub else None, None, None, None,
                                              None))
            return 0
        txn = self._current(c)
        self._cut(txn)
        txn.pending.append(("message", prefix, content, lsn, txn.seq, sub))
        txn.advance(sub, 1)
        return 0

    cdef int _cut(self, _Txn txn) except -1:
        """Close the rows written so far so that a truncate/message that follows keeps its place in order."""
        cdef _Builder b
        if txn.kind == PLAIN:
            self._flush_shared()
        else:
            for b in txn.builders.values():
                self._pend_rows(txn, b, 0, b.nrows)
            txn.builders = {}
        return 0

    cdef int _flush_shared(self, bint keep_open=False) except -1:
        """Emit the committed rows of the shared builders and retire them.

        Rows of a still-open plain transaction become a pending slice of it (they come out at its COMMIT,
        before its later rows), so no row is ever copied. With `keep_open` (drain), a builder that holds only rows
        of the open transaction stays open instead, while it has room and the transaction's rows in memory stay
        under a quarter of spill_bytes: a transaction fed in many small pieces then becomes one batch per relation
        at its COMMIT, not one per piece.
        """
        cdef _Builder b
        cdef _RelInfo info
        cdef list kept, keep = []
        cdef int64_t held = 0
        cdef Py_ssize_t split
        cdef bint room
        if not self.shared:
            return 0
        split = len(self.shared)
        if keep_open and self.txn is not None:
            held = self.txn.mem
            for b in self.shared:
                room = (b.committed == 0 and not b.full and b.nrows < self.batch_rows
                        and b.nbytes < self.batch_bytes and held + b.nbytes <= self.spill_bytes // 4)
                if room:
                    held += b.nbytes
                keep.append(room)
            # a builder stays open only if every later one does: its rows would otherwise come out after rows of
            # the same transaction parked from a later builder (a relation described again mid-transaction)
            while split > 0 and keep[split - 1]:
                split -= 1
        kept = self.shared[split:]
        for b in self.shared[:split]:
            if b.committed:
                self.events.append(b.take_rows(0, b.committed))
            if b.nrows > b.committed:
                self._pend_rows(self.txn, b, b.committed, b.nrows)
        self.shared = kept
        for info in self.infos.values():
            if info.builder is not None and info.builder not in kept:     # identity: _Builder has no __eq__
                info.builder = None
        return 0

    cdef int _pend_rows(self, _Txn txn, _Builder b, Py_ssize_t start, Py_ssize_t stop) except -1:
        """Park closed rows on their open transaction; past spill_bytes, its parked rows go to disk."""
        cdef _Builder pb
        cdef Py_ssize_t k
        if stop <= start:
            return 0
        txn.pending.append(("rows", b, start, stop))
        txn.mem += row_bytes_estimate(b.nbytes, b.nrows, stop - start)
        if txn.mem > self.spill_bytes:
            for k in range(len(txn.pending)):
                item = txn.pending[k]
                if item[0] == "rows":
                    pb = item[1]
                    txn.spill, ref = spill_item(txn.spill, self.spill_dir, pb.take_rows(item[2], item[3]),
                                                pb.subxids(item[2], item[3]), pb.relation,
                                                pb.raw_marks(item[2], item[3]))
                    txn.pending[k] = ("spilled", ref)
            txn.mem = 0
        return 0

    cdef int _emit_pending(self, _Txn txn, uint64_t commit_lsn, int64_t ts) except -1:
        cdef _Builder b
        cdef Py_ssize_t start, stop
        aborted = txn.aborted
        renumber = txn.renumbering()
        when = pg_timestamp_to_datetime(ts)
        for item in txn.pending:
            kind = item[0]
            if kind == "rows":
                b = item[1]
                start = item[2]
                stop = item[3]
                if txn.kind != PLAIN:
                    b.fill_commit(start, commit_lsn, ts)
                keep = [s not in aborted for s in b.subxids(start, stop)] if aborted else None
                batch = b.take_rows(start, stop, keep)
                if batch is not None:
                    if renumber:
                        batch = ChangeBatch(batch.relation, renumber.batch(batch.to_arrow()))
                    self.events.append(batch)
            elif kind == "spilled":
                if item[1] is not None:
                    plain = txn.kind == PLAIN
                    batch = released_batch(item[1], aborted, None if plain else commit_lsn,
                                           None if plain else ts + _EPOCH, renumber)
                    if batch is not None:
                        self.events.append(batch)
            elif item[5] not in aborted:
                if kind == "truncate":
                    _, rels, cascade, restart, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self.events.append(Truncate(rels, cascade, restart, commit_lsn, when, txn.xid, seq, txn.origin))
                else:
                    _, prefix, content, lsn, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self.events.append(LogicalMessage(prefix, content, True, lsn, txn.xid, commit_lsn, when, seq,
                                                      txn.origin))
        return 0

    cdef int _release(self, _Txn txn, uint64_t commit_lsn, int64_t ts) except -1:
        """A streamed or prepared transaction committed: emit its rows, truncates and messages in order."""
        self._flush_shared()
        self._cut(txn)
        return self._emit_pending(txn, commit_lsn, ts)

    cdef int _commit_plain(self, Cur* c, uint64_t commit_lsn, uint64_t end_lsn, int64_t ts) except -1:
        cdef _Txn txn = self.txn
        cdef _Builder b
        if txn is None or txn.kind != PLAIN:
            raise_bad(c, c.start, "COMMIT outside a transaction")
        if commit_lsn != txn.final_lsn:
            raise_bad(c, c.start + 2, f"commit LSN {_lsn(commit_lsn)} does not match the BEGIN's final "
                            f"LSN {_lsn(txn.final_lsn)}")
        self.txn = None
        # rows before its last truncate/message were cut into pending; later rows stay in the shared builders
        if txn.pending:
            self._emit_pending(txn, commit_lsn, ts)
        for b in self.shared:
            b.committed = b.nrows
        self.last_commit_end = end_lsn
        return 0

    cdef int _stream_start(self, Cur* c, uint32_t xid, uint8_t first) except -1:
        cdef _Txn txn
        if self.stream is not None:
            raise_bad(c, c.start, "stream start inside a stream block")
        if self.txn is not None:
            raise_bad(c, c.start, f"stream start while transaction {self.txn.xid} is open")
        if first > 1:
            raise_bad(c, c.start + 5, f"first-segment flag must be 0 or 1, got {first}")
        txn = self.streams.get(xid)
        if first:
            if txn is not None:
                raise_bad(c, c.start + 1, f"first stream segment for transaction {xid}, which is already open")
            txn = _Txn(STREAM, xid, 0, 0, self.committed_lsn)
            self.streams[xid] = txn
            self.after = AFTER_BEGIN
        elif txn is None:
            raise_bad(c, c.start + 1, f"stream segment for transaction {xid}, which never started")
        self.stream = txn
        return 0

    cdef int _outside_stream(self, Cur* c) except -1:
        if self.stream is not None:
            raise_bad(c, c.start, "message not allowed inside a stream block")
        if self.txn is not None:
            raise_bad(c, c.start, f"message not allowed while transaction {self.txn.xid} is open")
        return 0

    cdef int _stream_commit(self, Cur* c, uint32_t xid, uint64_t commit_lsn, uint64_t end_lsn,
                            int64_t ts) except -1:
        self._outside_stream(c)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise_bad(c, c.start + 1, f"stream commit of transaction {xid}, which was never streamed")
        self._release(txn, commit_lsn, ts)
        self.last_commit_end = end_lsn
        return 0

    cdef int _stream_abort(self, Cur* c, uint32_t xid, uint32_t subxid) except -1:
        self._outside_stream(c)
        txn = self.streams.get(xid)
        if txn is None:
            return 0
        if subxid == xid:
            del self.streams[xid]
        else:
            (<_Txn>txn).close_run()
            (<_Txn>txn).aborted.add(subxid)
        return 0

    cdef int _stream_prepare(self, Cur* c, uint32_t xid, gid) except -1:
        cdef _Txn txn
        self._outside_stream(c)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise_bad(c, c.start + 25, f"stream prepare of transaction {xid}, which was never streamed")
        txn.kind = PREPARED
        txn.gid = gid
        self.prepared[gid] = txn
        return 0

    cdef int _prepare(self, Cur* c, uint32_t xid, gid) except -1:
        cdef _Txn txn = self.txn
        if txn is None or txn.kind != PREPARED:
            raise_bad(c, c.start, "PREPARE without BEGIN PREPARE")
        if txn.xid != xid or txn.gid != gid:
            raise_bad(c, c.start, f"PREPARE of transaction {xid} ({gid!r}) inside transaction {txn.xid} ({txn.gid!r})")
        self.txn = None
        self.prepared[gid] = txn
        return 0

    cdef int _commit_prepared(self, Cur* c, uint32_t xid, gid, uint64_t commit_lsn, uint64_t end_lsn,
                              int64_t ts) except -1:
        self._outside_stream(c)
        txn = self.prepared.pop(gid, None)
        if txn is None:
            raise_bad(c, c.start, f"COMMIT PREPARED of {gid!r}, which was never prepared in this stream")
        self._release(txn, commit_lsn, ts)
        self.last_commit_end = end_lsn
        return 0

    cdef int _rollback_prepared(self, Cur* c, gid, uint64_t end_lsn) except -1:
        self._outside_stream(c)
        self.prepared.pop(gid, None)
        return 0


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
