"""Pure-Python twin of the Cython decoder (spockwire.wire._decoder).

Same classes, same behaviour, same errors (class, text and byte offset) as the hot path; slower. It is the
readable reference of the three protocol state machines: spock native (proto 4/5), pglogical native (proto 1)
and pgoutput (proto 1-4). Every read is bounds-checked before it happens.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import pyarrow as pa

from ..errors import FrameError, ProtocolError, copy_error, copy_truncated, protocol_error, truncated
from ..export.arrow import finish_batch
from ..model import ChangeBatch, Column, LogicalMessage, Relation, Truncate, PG_EPOCH_OFFSET_US, \
    pg_timestamp_to_datetime
from ..values._convert_py import ValueFailure, build_array, decode_value
from ..values.catalog import ARRAY, BYTEA, CHAR, ENUM, JSON, JSONB, NUMERIC_TEXT, OTHER, PGTEXT, RAW, TEXT, \
    TIMETZ, ColumnSpec, check_column_types, column_specs, switches_to_text, text_column_spec
from ..values.failures import OFFSET_LIMIT, TOO_LARGE, value_problem
from ..values.internal import DATUM_CODES, describe_datum_failure, layout_oid
from .encodings import encoding_name, text_codec
from .renumber import SeqRenumber
from .spill import (DEFAULT_SPILL_BYTES, MAX_BATCH_BYTES, SpillFile, batch_bytes_limit,
                    released_batch, row_bytes_estimate, spill_item)
from .views import DEFAULT_PIN_BYTES, MAX_PINS, check_strings, pin_source, pinned_size

__all__ = ["Decoder", "CopyBinaryDecoder", "IMPLEMENTATION", "set_buffer_pool_bytes", "buffer_pool_stats"]

IMPLEMENTATION = "python"

PROTOCOLS = ("pgoutput", "pglogical", "spock")
_PGOUTPUT, _PGLOGICAL, _SPOCK = 0, 1, 2

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_FRAME_HEAD = struct.Struct(">IQ")

INSERT, UPDATE_PRE, UPDATE_POST, DELETE = 0, 1, 2, 3

#: transaction timestamps (µs since 2000-01-01) that a datetime can hold: years 1 to 9999
MIN_TXN_TS = -63_082_281_600_000_000
MAX_TXN_TS = 252_455_615_999_999_999

#: rows in one batch at most (a batch is closed and a new one started beyond it)
DEFAULT_BATCH_ROWS = 1 << 18

# kinds whose text can be longer than the binary or internal form it is made from
_EXPANDING = frozenset((NUMERIC_TEXT, TIMETZ, CHAR))
_VIEW_KINDS = frozenset((TEXT, JSON, JSONB, BYTEA, RAW, OTHER))   # string / binary: views with strings="view"
_VARLEN = frozenset((RAW, OTHER, TEXT, JSON, JSONB, BYTEA, NUMERIC_TEXT, TIMETZ, ENUM, CHAR, PGTEXT))


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


class _BatchFull(Exception):
    """Internal: the row message must start a new batch (see Decoder._row_message)."""


class _Unrepresentable(Exception):
    """Internal: a valid value its column's Arrow type cannot hold; the column switches to text."""

    def __init__(self, column: int) -> None:
        self.column = column


UNREPRESENTABLE_CHOICES = ("text", "error")


def _output_bytes(spec: ColumnSpec, value: Any, internal: bool = False) -> int:
    """Bytes a binary or internal value of a kind rendered to text adds to its column (0 for other kinds); an
    internal text, json, jsonb or bytea datum may have been compressed (and jsonb's text is longer than its
    container): its decompressed bytes, the text."""
    if internal and spec.kind in (TEXT, JSON, JSONB):
        return len(value.encode("utf-8"))
    if internal and spec.kind == BYTEA:
        return len(value)
    if spec.kind in _EXPANDING:
        return len(value)                       # these texts are ASCII
    if spec.kind == PGTEXT:
        return len(value.encode("utf-8"))
    if spec.kind == ARRAY and spec.element.kind in _EXPANDING:
        return sum(len(e) for e in value if e is not None)
    return 0


def _column_size(spec: ColumnSpec, values: list[Any]) -> int:
    """What a column's Arrow offsets would have to count: data bytes, or elements and element bytes of a list."""
    if spec.kind == ARRAY:
        elements = sum(len(v) for v in values if v is not None)
        flat = [e for v in values if v is not None for e in v]
        return max(elements, _column_size(spec.element, flat))
    if spec.kind not in _VARLEN:
        return 0
    return sum(len(v.encode("utf-8")) if isinstance(v, str) else len(v) for v in values if v is not None)

# transaction kinds
_PLAIN, _STREAM, _PREPARED = 0, 1, 2

# "what came just before" markers for ORIGIN / LAST-COMMIT placement rules
_AFTER_NOTHING, _AFTER_BEGIN, _AFTER_ORIGIN = 0, 1, 2


def _type_name(code: int) -> str:
    return chr(code) if 32 <= code < 127 else f"\\x{code:02x}"


class _Reader:
    """A bounds-checked cursor over one message. Offsets are relative to the message start."""

    __slots__ = ("buf", "pos", "end", "mtype", "start")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.mtype: str | None = None
        self.start = 0          # offset of the message type byte (8 after a spock v5 prefix)

    def need(self, n: int, what: str, column: int | None = None, name: str | None = None) -> None:
        remaining = self.end - self.pos
        if remaining < n:
            raise truncated(self.mtype, self.pos, n, remaining, what, column, name)

    def u8(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(1, what, column, name)
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def u16(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(2, what, column, name)
        v = _U16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return v

    def u32(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(4, what, column, name)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def i32(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(4, what, column, name)
        v = _I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        v = _I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def timestamp(self, what: str) -> int:
        """A transaction timestamp (µs since 2000): one outside years 1-9999 is no clock time a server wrote."""
        at = self.pos
        v = self.i64(what)
        if not MIN_TXN_TS <= v <= MAX_TXN_TS:
            raise protocol_error(self.mtype, at, f"{what} {v} is outside years 1-9999")
        return v

    def take(self, n: int, what: str, column: int | None = None, name: str | None = None) -> bytes:
        self.need(n, what, column, name)
        v = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return v

    def cstring(self, what: str, column: int | None = None, name: str | None = None) -> str:
        start = self.pos
        buf = self.buf
        i = start
        end = self.end
        while i < end and buf[i] != 0:
            i += 1
        if i >= end:
            raise truncated(self.mtype, start, end - start + 1, end - start, what + " (no terminating NUL)",
                            column, name)
        self.pos = i + 1
        return self.utf8(bytes(buf[start:i]), start, what, column, name)

    def utf8(self, raw: bytes, at: int, what: str, column: int | None = None, name: str | None = None) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise protocol_error(self.mtype, at, f"{what} is not valid UTF-8", column, name) from None

    def expect(self, byte: int, what: str) -> None:
        got = self.u8(what)
        if got != byte:
            raise protocol_error(self.mtype, self.pos - 1,
                                 f"expected {chr(byte)!r} for {what}, got {_type_name(got)!r}")

    def flags(self, allowed: int, what: str = "the flags") -> int:
        v = self.u8(what)
        if v & ~allowed:
            raise protocol_error(self.mtype, self.pos - 1, f"reserved bits 0x{v & ~allowed:02x} set in {what}")
        return v

    def done(self) -> None:
        if self.pos != self.end:
            raise protocol_error(self.mtype, self.pos, f"{self.end - self.pos} trailing bytes after the message")


class _Builder:
    """Rows of one relation version, column by column (the twin keeps Python lists; C keeps Arrow buffers)."""

    __slots__ = ("relation", "specs", "ncols", "change", "lsn", "ts", "xid", "seq", "origin", "toast", "subxid",
                 "values", "marks", "committed", "nbytes", "msg_mark", "full", "views", "has_views", "pins",
                 "pinned_bytes")

    def __init__(self, relation: Relation, specs: tuple[ColumnSpec, ...], views: bool = False) -> None:
        self.relation = relation
        self.specs = specs
        self.views = views
        self.has_views = views and any(spec.kind in _VIEW_KINDS for spec in specs)
        self.pins: list[Any] = []   # input buffers the views point into (the C decoder's variadic buffers)
        self.pinned_bytes = 0
        self.ncols = len(relation.columns)
        self.change: list[int] = []
        self.lsn: list[int] = []
        self.ts: list[int] = []
        self.xid: list[int] = []
        self.seq: list[int] = []
        self.origin: list[str | None] = []
        self.toast: list[list[int] | None] = []
        self.subxid: list[int] = []
        # per-column lists, made by the first row that passes its checks (init_columns)
        self.values: list[list[Any]] | None = None
        # untyped columns: per row, True when the value did not arrive as UTF-8 text (decides string vs binary)
        self.marks: list[list[bool] | None] | None = None
        self.committed = 0
        self.nbytes = 0
        self.msg_mark = 0       # rows before the row message being decoded
        self.full = False       # closed early: a message's values would not fit with the rows already here

    @property
    def nrows(self) -> int:
        return len(self.change)

    def init_columns(self) -> None:
        self.values = [[] for _ in range(self.ncols)]
        self.marks = [[] if spec.is_raw else None for spec in self.specs]

    def truncate_to(self, n: int) -> None:
        for lst in (self.change, self.lsn, self.ts, self.xid, self.seq, self.origin, self.toast, self.subxid):
            del lst[n:]
        for col in self.values or ():
            del col[n:]
        for marks in self.marks or ():
            if marks is not None:
                del marks[n:]

    def fill_commit(self, start: int, lsn: int, ts: int) -> None:
        for i in range(start, self.nrows):
            self.lsn[i] = lsn
            self.ts[i] = ts

    def raw_marks(self, start: int, stop: int) -> dict[int, list[bool]]:
        """For each untyped column with a value in rows [start, stop) that did not arrive as text: the marks of
        those rows (what the column's type is decided by once rows of aborted subtransactions are dropped)."""
        out = {}
        for c, marks in enumerate(self.marks or ()):
            if marks is not None and any(marks[start:stop]):
                out[c] = marks[start:stop]
        return out

    def take_rows(self, start: int, stop: int, keep: list[bool] | None = None) -> ChangeBatch | None:
        """Rows [start, stop) (optionally filtered) as a ChangeBatch."""
        idx = range(start, stop) if keep is None else [i for i in range(start, stop) if keep[i - start]]
        if len(idx) == 0:
            return None
        pick = (lambda lst: lst[start:stop]) if keep is None else (lambda lst: [lst[i] for i in idx])
        toast_rows = pick(self.toast)
        if any(t is not None for t in toast_rows):
            offsets = [0]
            indices: list[int] = []
            for t in toast_rows:
                if t is not None:
                    indices.extend(t)
                offsets.append(len(indices))
            toast_offsets = pa.array(offsets, pa.int32())
            toast_indices = pa.array(indices, pa.uint16())
            toast_mask = pa.array([t is None for t in toast_rows], pa.bool_())
        else:
            toast_offsets = toast_indices = toast_mask = None
        values = []
        for c in range(self.ncols):
            col = pick(self.values[c])
            marks = self.marks[c]
            if marks is None:
                arr = build_array(self.specs[c], col)
            elif any(pick(marks)):
                arr = pa.array(col, pa.binary())
            else:
                arr = pa.array([None if v is None else v.decode("utf-8") for v in col], pa.string())
            if self.views and self.specs[c].kind in _VIEW_KINDS:
                arr = arr.cast(pa.binary_view() if pa.types.is_binary(arr.type) else pa.string_view())
            values.append(arr)
        batch = finish_batch(
            self.relation,
            pa.array(pick(self.change), pa.int8()),
            pa.array(pick(self.lsn), pa.uint64()),
            pa.array([t + PG_EPOCH_OFFSET_US for t in pick(self.ts)], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")),
            pa.array(pick(self.xid), pa.uint32()),
            pa.array(pick(self.seq), pa.int64()),
            pa.array(pick(self.origin), pa.string()),
            toast_offsets, toast_indices, toast_mask, values)
        return ChangeBatch(self.relation, batch)


class _Txn:
    """An open transaction: plain (rows go to the shared builders), streamed or prepared (rows kept apart)."""

    __slots__ = ("kind", "xid", "final_lsn", "commit_ts", "origin", "seq", "pending", "builders", "aborted",
                 "floor", "gid", "spill", "mem", "runs", "run_sub", "run_start")

    def __init__(self, kind: int, xid: int, final_lsn: int, commit_ts: int, floor: int) -> None:
        self.kind = kind
        self.xid = xid
        self.final_lsn = final_lsn
        self.commit_ts = commit_ts
        self.origin: str | None = None
        self.seq = 0
        # pending events in order: ("rows", builder, start, stop) | ("truncate", ...) | ("message", ...)
        self.pending: list[tuple] = []
        self.builders: dict[int, _Builder] = {}   # id(relation) -> builder, for streamed/prepared transactions
        self.aborted: set[int] = set()
        self.floor = floor
        self.gid: str | None = None
        self.spill: SpillFile | None = None   # closed batches written to disk past the decoder's spill_bytes
        self.mem = 0                          # estimated bytes of closed batches still in memory
        self.runs: dict[int, list[tuple[int, int]]] = {}   # streamed: subxid -> runs of _seq its changes took
        self.run_sub = 0
        self.run_start = 0

    def advance(self, sub: int, n: int) -> None:
        """`n` changes of subtransaction `sub` took the next numbers."""
        if self.kind == _STREAM and sub != self.run_sub:
            self.close_run()
            self.run_sub = sub
        self.seq += n

    def close_run(self) -> None:
        if self.seq > self.run_start:
            self.runs.setdefault(self.run_sub, []).append((self.run_start, self.seq))
        self.run_start = self.seq

    def renumbering(self) -> SeqRenumber | None:
        if not self.aborted:
            return None
        self.close_run()
        return SeqRenumber(run for sub in self.aborted for run in self.runs.get(sub, ()))


class Decoder:
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
    @property
    def committed_lsn(self) -> int:
        lsn = self._last_commit_end
        for t in self._streams.values():
            lsn = min(lsn, t.floor)
        for t in self._prepared.values():
            lsn = min(lsn, t.floor)
        if self._txn is not None and self._txn.kind == _PREPARED:
            lsn = min(lsn, self._txn.floor)
        return lsn

    @property
    def open_transactions(self) -> int:
        """Transactions begun and not yet ended: the one being received, streamed ones, prepared ones."""
        return (self._txn is not None) + len(self._streams) + len(self._prepared)

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

    # ------------------------------------------------------------------ relations
    def _stream_xid(self, r: _Reader) -> int:
        if self._stream is not None:
            return r.u32("the subtransaction xid")
        return 0

    def _relation(self, relid: int, nsp: str, name: str, cols: tuple, ident: str | None) -> None:
        previous = self.relations.get(relid)
        if previous is not None:
            self._close_builders_of(previous)
        version = self._versions.get(relid, 0) + 1
        self._versions[relid] = version
        rel = Relation(relid, nsp, name, cols, ident, version)
        self._specs[id(rel)] = column_specs(rel, self.types, self.type_catalog, self._typed, self._numeric,
                                            self.column_types)
        self.relations[relid] = rel

    def _switch_to_text(self, previous: Relation, column: int) -> Relation:
        """A new version of the relation whose `column` keeps PostgreSQL's text of every value from now on; the
        rows of the previous version close first, as for a Relation message sent again."""
        self._close_builders_of(previous)
        version = self._versions.get(previous.relid, 0) + 1
        self._versions[previous.relid] = version
        rel = Relation(previous.relid, previous.namespace, previous.name, previous.columns,
                       previous.replica_identity, version)
        specs = list(self._specs[id(previous)])
        specs[column] = text_column_spec(rel, column, self.types, self.type_catalog)
        self._specs[id(rel)] = tuple(specs)
        self.relations[previous.relid] = rel
        return rel

    def _close_builders_of(self, relation: Relation) -> None:
        """A relation is described again: the rows of its previous version that open streamed or prepared
        transactions hold in builders become pending slices now, before any row of the new version. Plain
        transactions keep their builders in creation order (self._shared), already the order of their rows."""
        key = id(relation)
        txns = [*self._streams.values(), *self._prepared.values()]
        if self._txn is not None and self._txn.kind != _PLAIN:
            txns.append(self._txn)
        for txn in txns:
            b = txn.builders.pop(key, None)
            if b is not None:
                self._pend_rows(txn, b, 0, b.nrows)

    # ------------------------------------------------------------------ transactions
    def _begin(self, r: _Reader, kind: int, xid: int, final_lsn: int, ts: int) -> _Txn:
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"BEGIN while transaction {self._txn.xid} is still open")
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "BEGIN inside a stream block")
        txn = _Txn(kind, xid, final_lsn, ts, self.committed_lsn)
        self._txn = txn
        self._after = _AFTER_BEGIN
        return txn

    def _origin(self, r: _Reader, after: int, name: str | None) -> None:
        if after != _AFTER_BEGIN:
            raise protocol_error(r.mtype, r.start, "ORIGIN message not right after BEGIN")
        txn = self._stream if self._stream is not None else self._txn
        txn.origin = name

    def _current(self, r: _Reader) -> _Txn:
        txn = self._stream if self._stream is not None else self._txn
        if txn is None:
            raise protocol_error(r.mtype, r.start, "change outside a transaction")
        return txn

    def _builder(self, txn: _Txn, rel: Relation) -> _Builder:
        if txn.kind == _PLAIN:
            b = self._shared.get(id(rel))
            if b is not None and (b.nrows >= self._batch_rows or b.nbytes >= self._batch_bytes or b.full):
                self._flush_shared()
                b = None
            if b is None:
                b = self._shared[id(rel)] = _Builder(rel, self._specs[id(rel)], self._views)
        else:
            b = txn.builders.get(id(rel))
            if b is not None and (b.nrows >= self._batch_rows or b.nbytes >= self._batch_bytes or b.full):
                self._pend_rows(txn, b, 0, b.nrows)
                b = None
            if b is None:
                b = txn.builders[id(rel)] = _Builder(rel, self._specs[id(rel)], self._views)
        return b

    def _row_message(self, r: _Reader, t: int, sub: int) -> None:
        txn = self._current(r)
        relid = r.u32("the relation id")
        rel = self.relations.get(relid)
        if rel is None:
            raise protocol_error(r.mtype, r.pos - 4, f"row for relation {relid}, which was never described")
        body = r.pos
        b = self._builder(txn, rel)
        while True:
            mark = b.nrows
            mark_bytes = b.nbytes
            b.msg_mark = mark
            try:
                self._row_body(r, t, b, txn, sub, mark)
            except _BatchFull:
                # the message's values would take a column past Arrow's 32-bit offsets together with the rows
                # already in this batch: those rows close as a batch and the message is decoded again, alone
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                b.full = True
                r.pos = body
                b = self._builder(txn, rel)
                continue
            except _Unrepresentable as u:
                # a valid value its column's type cannot hold: the column becomes text under a new version of
                # the relation and the message is decoded again with it
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                for column in self._columns_to_switch(r, t, txn, sub, rel, body, u.column):
                    rel = self._switch_to_text(rel, column)
                r.pos = body
                b = self._builder(txn, rel)
                continue
            except BaseException:
                # a refused message leaves the builder as it was before it
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                raise
            break
        txn.advance(sub, b.nrows - mark)

    def _columns_to_switch(self, r: _Reader, t: int, txn: _Txn, sub: int, rel: Relation, body: int,
                           first: int) -> list[int]:
        """The columns a row message turns to text, in the order its decoding meets them, found on a scratch
        builder: a message refused for another reason raises here and switches nothing."""
        columns = [first]
        specs = list(self._specs[id(rel)])
        while True:
            specs[columns[-1]] = text_column_spec(rel, columns[-1], self.types, self.type_catalog)
            r.pos = body
            try:
                self._row_body(r, t, _Builder(rel, tuple(specs)), txn, sub, 0)
            except _Unrepresentable as u:
                columns.append(u.column)
                continue
            return columns

    def _row_body(self, r: _Reader, t: int, b: _Builder, txn: _Txn, sub: int, mark: int) -> None:
        """The tuples of an INSERT, UPDATE or DELETE after the relation id."""
        if t == 0x49:
            r.expect(0x4E, "the new tuple marker")
            self._tuple(r, b, txn, INSERT, sub, txn.seq)
        elif t == 0x55:
            kind = r.u8("the tuple marker")
            if kind in (0x4B, 0x4F):
                self._tuple(r, b, txn, UPDATE_PRE, sub, txn.seq)
                r.expect(0x4E, "the new tuple marker")
            elif kind != 0x4E:
                raise protocol_error(r.mtype, r.pos - 1,
                                     f"expected 'K', 'O' or 'N' tuple marker, got {_type_name(kind)!r}")
            self._tuple(r, b, txn, UPDATE_POST, sub, txn.seq + b.nrows - mark)
        else:
            kind = r.u8("the tuple marker")
            if kind not in (0x4B, 0x4F):
                raise protocol_error(r.mtype, r.pos - 1,
                                     f"expected 'K' or 'O' tuple marker, got {_type_name(kind)!r}")
            self._tuple(r, b, txn, DELETE, sub, txn.seq)
        r.done()

    def _tuple(self, r: _Reader, b: _Builder, txn: _Txn, change: int, sub: int, seq: int) -> None:
        native = self._proto != _PGOUTPUT
        if native:
            r.expect(0x54, "the tuple block")
        natts = r.u16("the tuple column count")
        if natts != b.ncols:
            raise protocol_error(r.mtype, r.pos - 2, f"tuple has {natts} columns but relation "
                                 f"{b.relation.qualified_name} has {b.ncols}")
        # every column takes at least its kind byte: refuse before setting anything up for the row
        r.need(natts, "the tuple's values (at least one byte per column)")
        if b.has_views:
            self._pin_input(b)
        if b.values is None:
            b.init_columns()
        cols = b.relation.columns
        toast: list[int] | None = None
        values = b.values
        specs = b.specs
        for i in range(natts):
            name = cols[i].name
            kind = r.u8("the value kind", i, name)
            if kind == 0x6E or kind == 0x75:  # n, u
                values[i].append(None)
                if b.marks[i] is not None:
                    b.marks[i].append(False)
                if kind == 0x75:
                    if toast is None:
                        toast = []
                    toast.append(i)
            elif kind == 0x74 or kind == 0x62 or (kind == 0x69 and native):  # t, b, i
                n = r.u32("the value length", i, name)
                v = r.take(n, "the value", i, name)
                start = r.pos - n
                if kind == 0x74 and native:
                    if n == 0 or v[-1] != 0:
                        raise protocol_error(r.mtype, r.pos - 1 if n else r.pos,
                                             "text value is not NUL-terminated", i, name)
                    v = v[:-1]
                    if self._codec is not None and not v.isascii():
                        try:
                            v = v.decode(self._codec).encode("utf-8")
                        except UnicodeDecodeError:
                            raise protocol_error(r.mtype, start, "text value is not valid "
                                                 f"{encoding_name(self._codec)}", i, name) from None
                spec = specs[i]
                if b.marks[i] is not None:
                    values[i].append(v)
                    b.marks[i].append(kind != 0x74 or not _is_utf8(v))
                    b.nbytes += len(v)
                else:
                    try:
                        value = decode_value(spec, kind, v, self._big_endian)
                    except ValueFailure as failure:
                        if self.on_unrepresentable == "text" and switches_to_text(failure.code, spec):
                            raise _Unrepresentable(i) from None
                        if failure.code in DATUM_CODES:   # a refused varlena datum: its own byte and sentence
                            _code, pos, text = describe_datum_failure(v, bool(self._big_endian), spec.type_name,
                                                                      layout_oid(spec))
                            raise protocol_error(r.mtype, start + pos, text, i, name) from None
                        raise protocol_error(r.mtype, start, value_problem(failure.code, kind, v, spec.type_name),
                                             i, name) from None
                    values[i].append(value)
                    # output bytes count too: an expanding kernel (binary numeric to text) closes batches as well
                    b.nbytes += max(len(v), _output_bytes(spec, value, kind == 0x69)) if kind != 0x74 else len(v)
                if b.nbytes > OFFSET_LIMIT:
                    if b.msg_mark > 0:
                        raise _BatchFull()
                    if _column_size(spec, values[i]) > OFFSET_LIMIT:
                        raise protocol_error(r.mtype, start, value_problem(TOO_LARGE, kind, v, spec.type_name),
                                             i, name)
            else:
                raise protocol_error(r.mtype, r.pos - 1, f"unknown value kind {_type_name(kind)!r}", i, name)
        b.change.append(change)
        b.lsn.append(txn.final_lsn)
        b.ts.append(txn.commit_ts)
        b.xid.append(txn.xid)
        b.seq.append(seq)
        b.origin.append(txn.origin)
        b.toast.append(toast)
        b.subxid.append(sub)

    def _pin_input(self, b: _Builder) -> None:
        """The builder pins the input being fed (views.py), unless that takes it past pin_bytes (a new batch when
        it has rows) or past MAX_PINS buffers, or the input alone is larger than pin_bytes (the values are copied). Values are equal either way: only where
        the batches are cut depends on it, exactly as in the C decoder."""
        obj = self._pin
        if obj is None or any(p is obj for p in b.pins) or len(b.pins) >= MAX_PINS:
            return
        size = pinned_size(obj)
        if size > self.pin_bytes:
            return
        if b.pinned_bytes + size > self.pin_bytes:
            if b.msg_mark > 0:
                raise _BatchFull()
            return
        b.pins.append(obj)
        b.pinned_bytes += size

    def _truncate(self, r: _Reader, nrels: int, flags: int, sub: int) -> None:
        txn = self._current(r)
        r.need(4 * nrels, "the relation ids")  # bounds the count by the bytes present before any allocation
        rels = []
        for _ in range(nrels):
            relid = r.u32("a relation id")
            rel = self.relations.get(relid)
            if rel is None:
                raise protocol_error(r.mtype, r.pos - 4, f"TRUNCATE of relation {relid}, which was never described")
            rels.append(rel)
        r.done()
        self._cut(txn)
        txn.pending.append(("truncate", tuple(rels), bool(flags & 1), bool(flags & 2), txn.seq, sub))
        txn.advance(sub, 1)

    def _logical_message(self, r: _Reader, transactional: bool, lsn: int, prefix: str, content: bytes,
                         sub: int) -> None:
        if not transactional:
            self._flush_shared()
            xid = sub if sub else None
            self._events.append(LogicalMessage(prefix, content, False, lsn, xid, None, None, None, None))
            return
        txn = self._current(r)
        self._cut(txn)
        txn.pending.append(("message", prefix, content, lsn, txn.seq, sub))
        txn.advance(sub, 1)

    def _cut(self, txn: _Txn) -> None:
        """Close the rows written so far so that a truncate/message that follows keeps its place in order."""
        if txn.kind == _PLAIN:
            self._flush_shared()
        else:
            for b in txn.builders.values():
                self._pend_rows(txn, b, 0, b.nrows)
            txn.builders = {}

    def _flush_shared(self, keep_open: bool = False) -> None:
        """Emit the committed rows of the shared builders and retire them.

        Rows of a still-open plain transaction become a pending slice of it (they come out at its COMMIT, before
        its later rows), so no row is ever copied. With `keep_open` (drain), a builder that holds only rows of the
        open transaction stays open instead, while it has room and the transaction's rows in memory stay under a
        quarter of spill_bytes: a transaction fed in many small pieces then becomes one batch per relation at its
        COMMIT, not one per piece.
        """
        builders = list(self._shared.items())
        keep: list[bool] = []
        split = len(builders)
        if keep_open and self._txn is not None:
            held = self._txn.mem
            for _key, b in builders:
                room = (b.committed == 0 and not b.full and b.nrows < self._batch_rows
                        and b.nbytes < self._batch_bytes and held + b.nbytes <= self._spill_bytes // 4)
                if room:
                    held += b.nbytes
                keep.append(room)
            # a builder stays open only if every later one does: its rows would otherwise come out after rows of
            # the same transaction parked from a later builder (a relation described again mid-transaction)
            while split > 0 and keep[split - 1]:
                split -= 1
        kept = dict(builders[split:])
        for _key, b in builders[:split]:
            if b.committed:
                self._events.append(b.take_rows(0, b.committed))
            if b.nrows > b.committed:
                self._pend_rows(self._txn, b, b.committed, b.nrows)
        self._shared = kept

    def _pend_rows(self, txn: _Txn, b: _Builder, start: int, stop: int) -> None:
        """Park closed rows on their open transaction; past spill_bytes, its parked rows go to disk."""
        if stop <= start:
            return
        txn.pending.append(("rows", b, start, stop))
        txn.mem += row_bytes_estimate(b.nbytes, b.nrows, stop - start)
        if txn.mem > self._spill_bytes:
            for k, item in enumerate(txn.pending):
                if item[0] == "rows":
                    _, pb, pstart, pstop = item
                    txn.spill, ref = spill_item(txn.spill, self._spill_dir, pb.take_rows(pstart, pstop),
                                                pb.subxid[pstart:pstop], pb.relation, pb.raw_marks(pstart, pstop))
                    txn.pending[k] = ("spilled", ref)
            txn.mem = 0

    def _release(self, txn: _Txn, commit_lsn: int, ts: int) -> None:
        """A streamed or prepared transaction committed: emit its rows, truncates and messages in order."""
        self._flush_shared()
        self._cut(txn)
        self._emit_pending(txn, commit_lsn, ts)

    def _emit_pending(self, txn: _Txn, commit_lsn: int, ts: int) -> None:
        aborted = txn.aborted
        renumber = txn.renumbering()
        when = pg_timestamp_to_datetime(ts)
        for item in txn.pending:
            kind = item[0]
            if kind == "rows":
                _, b, start, stop = item
                if txn.kind != _PLAIN:
                    b.fill_commit(start, commit_lsn, ts)
                keep = [b.subxid[i] not in aborted for i in range(start, stop)] if aborted else None
                batch = b.take_rows(start, stop, keep)
                if batch is not None:
                    if renumber:
                        batch = ChangeBatch(batch.relation, renumber.batch(batch.to_arrow()))
                    self._events.append(batch)
            elif kind == "spilled":
                if item[1] is not None:
                    plain = txn.kind == _PLAIN
                    batch = released_batch(item[1], aborted, None if plain else commit_lsn,
                                           None if plain else ts + PG_EPOCH_OFFSET_US, renumber)
                    if batch is not None:
                        self._events.append(batch)
            elif item[-1] not in aborted:
                if kind == "truncate":
                    _, rels, cascade, restart, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self._events.append(Truncate(rels, cascade, restart, commit_lsn, when, txn.xid, seq, txn.origin))
                else:
                    _, prefix, content, lsn, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self._events.append(LogicalMessage(prefix, content, True, lsn, txn.xid, commit_lsn, when, seq,
                                                       txn.origin))

    def _commit_plain(self, r: _Reader, commit_lsn: int, end_lsn: int, ts: int) -> None:
        txn = self._txn
        if txn is None or txn.kind != _PLAIN:
            raise protocol_error(r.mtype, r.start, "COMMIT outside a transaction")
        if commit_lsn != txn.final_lsn:
            raise protocol_error(r.mtype, r.start + 2, f"commit LSN {_lsn(commit_lsn)} does not match the BEGIN's final "
                                             f"LSN {_lsn(txn.final_lsn)}")
        self._txn = None
        # rows before its last truncate/message were cut into pending; later rows stay in the shared builders
        self._emit_pending(txn, commit_lsn, ts)
        for b in self._shared.values():
            b.committed = b.nrows
        self._last_commit_end = end_lsn

    def _stream_start(self, r: _Reader, xid: int, first: int) -> None:
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "stream start inside a stream block")
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"stream start while transaction {self._txn.xid} is open")
        if first > 1:
            raise protocol_error(r.mtype, r.start + 5, f"first-segment flag must be 0 or 1, got {first}")
        txn = self._streams.get(xid)
        if first:
            if txn is not None:
                raise protocol_error(r.mtype, r.start + 1, f"first stream segment for transaction {xid}, which is already open")
            txn = self._streams[xid] = _Txn(_STREAM, xid, 0, 0, self.committed_lsn)
            self._after = _AFTER_BEGIN
        elif txn is None:
            raise protocol_error(r.mtype, r.start + 1, f"stream segment for transaction {xid}, which never started")
        self._stream = txn

    def _stream_commit(self, r: _Reader, xid: int, commit_lsn: int, end_lsn: int, ts: int) -> None:
        self._outside_stream(r)
        txn = self._streams.pop(xid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start + 1, f"stream commit of transaction {xid}, which was never streamed")
        self._release(txn, commit_lsn, ts)
        self._last_commit_end = end_lsn

    def _stream_abort(self, r: _Reader, xid: int, subxid: int) -> None:
        self._outside_stream(r)
        txn = self._streams.get(xid)
        if txn is None:
            return
        if subxid == xid:
            del self._streams[xid]
        else:
            txn.close_run()
            txn.aborted.add(subxid)

    def _stream_prepare(self, r: _Reader, xid: int, gid: str) -> None:
        self._outside_stream(r)
        txn = self._streams.pop(xid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start + 25, f"stream prepare of transaction {xid}, which was never streamed")
        txn.kind = _PREPARED
        txn.gid = gid
        self._prepared[gid] = txn

    def _outside_stream(self, r: _Reader) -> None:
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "message not allowed inside a stream block")
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"message not allowed while transaction {self._txn.xid} is open")

    def _prepare(self, r: _Reader, xid: int, gid: str) -> None:
        txn = self._txn
        if txn is None or txn.kind != _PREPARED:
            raise protocol_error(r.mtype, r.start, "PREPARE without BEGIN PREPARE")
        if txn.xid != xid or txn.gid != gid:
            raise protocol_error(r.mtype, r.start, f"PREPARE of transaction {xid} ({gid!r}) inside transaction "
                                             f"{txn.xid} ({txn.gid!r})")
        self._txn = None
        self._prepared[gid] = txn

    def _commit_prepared(self, r: _Reader, xid: int, gid: str, commit_lsn: int, end_lsn: int, ts: int) -> None:
        self._outside_stream(r)
        txn = self._prepared.pop(gid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start, f"COMMIT PREPARED of {gid!r}, which was never prepared in this stream")
        self._release(txn, commit_lsn, ts)
        self._last_commit_end = end_lsn

    def _rollback_prepared(self, r: _Reader, gid: str, end_lsn: int) -> None:
        self._outside_stream(r)
        self._prepared.pop(gid, None)


def _lsn(v: int) -> str:
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


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


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _byte_order(params: dict[str, str]) -> bool | None:
    """True when the startup message says the server is big-endian, False little-endian, None when it does not."""
    value = params.get("binary.bigendian")
    if value is None:
        return None
    return value.strip().lower() in ("t", "true", "1", "on", "yes")


# ---------------------------------------------------------------------------------------------- binary COPY
# The framing of `COPY ... TO STDOUT (FORMAT binary)` over the same value decoding as the stream's binary ('b')
# values (decode_value). Twin of CopyBinaryDecoder in _copy.pxi: same batches' types and values, same errors.

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER, _COPY_ROWS, _COPY_DONE = 0, 1, 2
_I16 = struct.Struct(">h")

DEFAULT_COPY_BATCH_ROWS = 1 << 16
DEFAULT_COPY_BATCH_BYTES = 64 << 20


def _copy_check_options(types: str, numeric: str, on_unrepresentable: str, batch_rows: int,
                        batch_bytes: int) -> None:
    if types not in ("typed", "raw"):
        raise ValueError(f"types must be 'typed' or 'raw', got {types!r}")
    if numeric not in ("decimal", "text"):
        raise ValueError(f"numeric must be 'decimal' or 'text', got {numeric!r}")
    if on_unrepresentable not in UNREPRESENTABLE_CHOICES:
        raise ValueError(f"on_unrepresentable must be 'text' or 'error', got {on_unrepresentable!r}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    if batch_bytes < 1:
        raise ValueError(f"batch_bytes must be at least 1, got {batch_bytes}")


class CopyBinaryDecoder:
    """Decodes the data of one binary COPY of `relation`'s columns into Arrow record batches (see the C twin)."""

    def __init__(self, relation: Relation, *, types: str = "typed", type_catalog: Any = None,
                 numeric: str = "decimal", on_unrepresentable: str = "text", column_types: Any = None,
                 batch_rows: int = DEFAULT_COPY_BATCH_ROWS, batch_bytes: int = DEFAULT_COPY_BATCH_BYTES) -> None:
        _copy_check_options(types, numeric, on_unrepresentable, batch_rows, batch_bytes)
        self.relation = relation
        self.type_catalog = type_catalog
        self.specs = column_specs(relation, {}, type_catalog, types == "typed", numeric,
                                  check_column_types(column_types))
        self._names = relation.column_names
        self._ncols = len(self._names)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.on_unrepresentable = on_unrepresentable
        self.offset = 0          # bytes of COPY data consumed: the header and the complete rows
        self.rows = 0
        self._state = _COPY_HEADER
        self._carry = bytearray()
        self._ready: list[pa.RecordBatch] = []
        self._reset()

    def _reset(self) -> None:
        self._values: list[list[Any]] = [[] for _ in range(self._ncols)]
        self._nrows = 0
        self._nbytes = 0

    @property
    def done(self) -> bool:
        return self._state == _COPY_DONE

    @property
    def pending_rows(self) -> int:
        return self._nrows

    def feed(self, data: Any) -> None:
        data = memoryview(data).cast("B")
        if not len(data):
            return
        if self._state == _COPY_DONE:
            raise copy_error(self.offset, "data after the end-of-data trailer")
        if not self._carry:
            used = self._parse(data, False)
            if used < len(data):
                self._carry += data[used:]
        else:
            self._carry += data
            used = self._parse(memoryview(self._carry), False)
            del self._carry[:used]

    def drain(self) -> list[pa.RecordBatch]:
        out, self._ready = self._ready, []
        return out

    def finish(self) -> list[pa.RecordBatch]:
        if self._state != _COPY_DONE:
            self._parse(memoryview(bytes(self._carry)), True)
        self._close_batch()
        return self.drain()

    def _parse(self, buf: memoryview, eof: bool) -> int:
        n = len(buf)
        pos = 0
        if self._state == _COPY_HEADER:
            pos = self._header(buf, n, eof)
            if pos == 0:
                return 0
        while self._state == _COPY_ROWS:
            mark_bytes = self._nbytes
            try:
                r = self._row(buf, n, pos, eof)
            except _BatchFull:
                self._truncate_row()
                self._nbytes = mark_bytes
                self._close_batch()
                continue
            except _Unrepresentable as u:
                self._truncate_row()
                self._nbytes = mark_bytes
                self._close_batch()
                self.specs = self.specs[:u.column] + (text_column_spec(self.relation, u.column, {},
                                                                       self.type_catalog),) + self.specs[u.column + 1:]
                continue
            if r < 0:
                self._truncate_row()
                self._nbytes = mark_bytes
                break
            pos = r
            self.rows += 1
            if self._nrows >= self.batch_rows or self._nbytes >= self.batch_bytes:
                self._close_batch()
        if self._state == _COPY_DONE and pos < n:
            raise copy_error(self.offset + pos, "data after the end-of-data trailer")
        self.offset += pos
        return pos

    def _truncate_row(self) -> None:
        """Forget the values of a row that did not complete."""
        for col in self._values:
            del col[self._nrows:]

    def _header(self, buf: memoryview, n: int, eof: bool) -> int:
        at = self.offset
        if n < 11:
            if not eof:
                return 0
            raise copy_truncated(at, 11, n, "the signature")
        if bytes(buf[:11]) != _COPY_SIGNATURE:
            raise copy_error(at, "not binary COPY data: the signature is not PGCOPY\\n\\377\\r\\n\\0")
        if n < 15:
            if not eof:
                return 0
            raise copy_truncated(at + 11, 4, n - 11, "the flags field")
        flags = _I32.unpack_from(buf, 11)[0]
        if flags & 0x10000:
            raise copy_error(at + 11, "the rows carry OIDs (flags bit 16), which a COPY of columns never asks for")
        if flags & 0xFFFF:
            raise copy_error(at + 11, f"unknown critical flag bits 0x{flags & 0xFFFF:04x} set in the header")
        if n < 19:
            if not eof:
                return 0
            raise copy_truncated(at + 15, 4, n - 15, "the header extension length")
        ext = _I32.unpack_from(buf, 15)[0]
        if ext < 0:
            raise copy_error(at + 15, f"negative header extension length {ext}")
        if n - 19 < ext:
            if not eof:
                return 0
            raise copy_truncated(at + 19, ext, n - 19, "the header extension")
        self._state = _COPY_ROWS
        return 19 + ext

    def _row(self, buf: memoryview, n: int, pos: int, eof: bool) -> int:
        """One row from buf[pos:]: the offset after it, or -1 while it is incomplete."""
        base = self.offset
        names = self._names
        if n - pos < 2:
            if not eof:
                return -1
            raise copy_truncated(base + pos, 2, n - pos, "the field count of a row (or the trailer)")
        count = _I16.unpack_from(buf, pos)[0]
        if count == -1:
            self._state = _COPY_DONE
            return pos + 2
        if count != self._ncols:
            raise copy_error(base + pos, f"row has {count} fields, expected {self._ncols} (one per column read)")
        pos += 2
        values = self._values
        specs = self.specs
        for i in range(self._ncols):
            if n - pos < 4:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, 4, n - pos, "the field length", i, names[i])
            flen = _I32.unpack_from(buf, pos)[0]
            pos += 4
            if flen < 0:
                if flen != -1:
                    raise copy_error(base + pos - 4, f"negative field length {flen}", i, names[i])
                values[i].append(None)
                continue
            if n - pos < flen:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, flen, n - pos, "the value", i, names[i])
            raw = bytes(buf[pos:pos + flen])
            vat = pos
            pos += flen
            spec = specs[i]
            if spec.is_raw:
                values[i].append(raw)
                self._nbytes += flen
            else:
                try:
                    value = decode_value(spec, 0x62, raw, None)
                except ValueFailure as failure:
                    if failure.code == TOO_LARGE and self._nrows > 0:
                        raise _BatchFull() from None
                    if self.on_unrepresentable == "text" and switches_to_text(failure.code, spec):
                        raise _Unrepresentable(i) from None
                    raise copy_error(base + vat, value_problem(failure.code, 0x62, raw, spec.type_name),
                                     i, names[i]) from None
                values[i].append(value)
                self._nbytes += max(flen, _output_bytes(spec, value))
            if self._nbytes > OFFSET_LIMIT:
                if self._nrows > 0:
                    raise _BatchFull()
                if _column_size(spec, values[i]) > OFFSET_LIMIT:
                    raise copy_error(base + vat, value_problem(TOO_LARGE, 0x62, raw, spec.type_name), i, names[i])
        self._nrows += 1
        return pos

    def _close_batch(self) -> None:
        if self._nrows == 0:
            return
        arrays = []
        for spec, col in zip(self.specs, self._values):
            if not spec.is_raw:
                arrays.append(build_array(spec, col))
            elif any(v is not None for v in col):
                arrays.append(pa.array(col, pa.binary()))      # binary values: the column is binary in its batch
            else:
                arrays.append(pa.array(col, pa.string()))
        self._ready.append(pa.RecordBatch.from_arrays(arrays, names=list(self._names)))
        self._reset()
