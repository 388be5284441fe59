"""Pure-Python twin of the Cython batch pumps (spockwire.connection._pump).

Same classes (`FramePump` for replication streams, `CopyPump` for the SQL transport), same behaviour and errors;
libpq is reached through ctypes (the very library psycopg2 uses), so this twin needs no compiler. It makes several Python calls per message and is therefore slower than the Cython
pump; it exists for platforms without the extension and as the readable reference of the pump's logic.
"""
from __future__ import annotations

import ctypes
import os
import select
import struct
import time

from .errors import ConnectionLost, ReplicationError, classify

__all__ = ["FramePump", "CopyPump", "CopyDataPump", "IMPLEMENTATION", "bind_libpq"]

IMPLEMENTATION = "python"

_PG_EPOCH_OFFSET_US = 946_684_800_000_000
_XLOGDATA_HEADER = 25
_KEEPALIVE_LENGTH = 18
_W = struct.Struct(">QQ")          # dataStart, walEnd after the 'w'
_K = struct.Struct(">QqB")         # walEnd, sendTime, replyRequested after the 'k'
_FRAME = struct.Struct(">IQ")
_STATUS = struct.Struct(">cQQQqB")
_PGRES_COPY_OUT = 3
_PGRES_FATAL_ERROR = 7
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_ROW = struct.Struct(">hiQi")  # 2 fields, 8, lsn, data length
_GATHER = 0.0002      # replication: a pause before reading what arrived meanwhile ...
_GATHER_MAX = 0.01    # ... for at most this long per batch
_LINGER = 0.002  # a COPY batch is handed out once no row arrived for this long (or it is full)
_PG_DIAG_SQLSTATE = ord("C")


def _load_libpq(module_file: str | None = None) -> ctypes.CDLL:
    """libpq's functions as psycopg2 itself reaches them: looked up through psycopg2's extension module, whose
    dependencies include the libpq it was linked with (the system's, or psycopg2-binary's private copy)."""
    if module_file is None:
        import psycopg2._psycopg

        module_file = psycopg2._psycopg.__file__
    try:
        lib = ctypes.CDLL(module_file, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    except OSError as exc:
        raise ImportError(f"cannot reach libpq through {module_file}: {exc}") from exc
    vp, cp, ci = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for fname, restype, argtypes in (
        ("PQgetCopyData", ci, [vp, ctypes.POINTER(vp), ci]),
        ("PQputCopyData", ci, [vp, cp, ci]),
        ("PQputCopyEnd", ci, [vp, cp]),
        ("PQsetnonblocking", ci, [vp, ci]),
        ("PQisBusy", ci, [vp]),
        ("PQsendQuery", ci, [vp, cp]),
        ("PQgetCancel", vp, [vp]),
        ("PQcancel", ci, [vp, cp, ci]),
        ("PQfreeCancel", None, [vp]),
        ("PQflush", ci, [vp]),
        ("PQconsumeInput", ci, [vp]),
        ("PQsocket", ci, [vp]),
        ("PQfreemem", None, [vp]),
        ("PQgetResult", vp, [vp]),
        ("PQresultStatus", ci, [vp]),
        ("PQresultErrorMessage", cp, [vp]),
        ("PQresultErrorField", cp, [vp, ci]),
        ("PQerrorMessage", cp, [vp]),
        ("PQclear", None, [vp]),
    ):
        try:
            fn = getattr(lib, fname)
        except AttributeError:
            raise ImportError(f"the libpq of {module_file} has no {fname}") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def _libpq(module_file: str | None = None) -> ctypes.CDLL:
    """psycopg2's own libpq, loaded once per process."""
    global _lib
    if _lib is None:
        _lib = _load_libpq(module_file)
    return _lib


def bind_libpq(module_file: str | None = None) -> int:
    """Take libpq from psycopg2's own libpq (once per process); returns the address of PQgetCopyData as found
    (`spockwire.connection.libpq.library_of` names its file). See the Cython twin."""
    return ctypes.cast(_libpq(module_file).PQgetCopyData, ctypes.c_void_p).value or 0


def _pg_now_us() -> int:
    return time.time_ns() // 1000 - _PG_EPOCH_OFFSET_US


def _result_error(lib: ctypes.CDLL, res: int) -> tuple[str | None, str | None]:
    """(message, SQLSTATE) of a failed result; (None, None) for any other result."""
    if lib.PQresultStatus(res) != _PGRES_FATAL_ERROR:
        return None, None
    raw = lib.PQresultErrorMessage(res)
    field = lib.PQresultErrorField(res, _PG_DIAG_SQLSTATE)
    return (raw.decode("utf-8", "replace") if raw else "the query failed",
            field.decode("ascii", "replace") if field else None)


class _BatchPump:
    """What both pumps share: the libpq connection, read() (which hands out what arrived before an error first and
    raises the error on the next call) and the counters ``messages``, ``bytes``, ``batches``."""

    _closed_message = "the connection is closed"

    def __init__(self, pgconn_ptr: int, max_batch_bytes: int) -> None:
        if not pgconn_ptr:
            raise ValueError("pgconn_ptr is NULL: the connection is closed")
        if max_batch_bytes < 1024:
            raise ValueError("max_batch_bytes must be at least 1024")
        self._lib = _libpq()
        self._conn: int | None = int(pgconn_ptr)
        self.max_batch_bytes = int(max_batch_bytes)
        self._deferred: BaseException | None = None
        self.messages = 0
        self.bytes = 0
        self.batches = 0

    def detach(self) -> None:
        self._conn = None

    def _errmsg(self) -> str:
        raw = self._lib.PQerrorMessage(self._conn)
        return raw.decode("utf-8", "replace") if raw else ""

    def _get_copy_data(self, ptr: ctypes.c_void_p) -> tuple[int, bytes]:
        """PQgetCopyData without blocking: (its result, the message when it returned one)."""
        n = self._lib.PQgetCopyData(self._conn, ctypes.byref(ptr), 1)
        if n <= 0:
            return n, b""
        try:
            return n, ctypes.string_at(ptr.value, n)
        finally:
            self._lib.PQfreemem(ptr)

    def _append_frame(self, out: bytearray, lsn: int, payload: memoryview) -> None:
        out += _FRAME.pack(len(payload), lsn)
        out += payload
        self.messages += 1
        self.bytes += len(payload)

    def _fill(self, out: bytearray, timeout: float) -> None:
        raise NotImplementedError

    def read(self, timeout: float = 1.0) -> bytes:
        if self._conn is None:
            raise ConnectionLost(self._closed_message)
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc
        out = bytearray()
        try:
            self._fill(out, timeout)
        except ReplicationError as exc:
            if not out:
                raise
            self._deferred = exc  # hand out what arrived before the failure first
        if out:
            self.batches += 1
        return bytes(out)


class FramePump(_BatchPump):
    """Reads one replication connection (already in CopyBoth mode) batch by batch. See the Cython twin."""

    _closed_message = "the replication connection is closed"

    def __init__(self, pgconn_ptr: int, *, status_interval: float = 10.0, max_batch_bytes: int = 4 << 20,
                 flush_lsn: int = 0) -> None:
        super().__init__(pgconn_ptr, max_batch_bytes)
        self.status_interval = float(status_interval)
        self._flush_lsn = int(flush_lsn)
        self.write_lsn = 0
        self.wal_end = 0
        self.keepalives = 0
        self.status_sent = 0
        self.idle = False
        self.keepalive_end = 0
        self.sent_flush = 0
        self._last_status = time.monotonic()

    @property
    def flush_lsn(self) -> int:
        return self._flush_lsn

    @flush_lsn.setter
    def flush_lsn(self, value: int) -> None:
        if value > self._flush_lsn:
            self._flush_lsn = int(value)

    @property
    def seconds_since_status(self) -> float:
        return time.monotonic() - self._last_status

    def _send_status(self, reply: bool, *, flush_now: bool = True) -> None:
        flush = self._flush_lsn
        msg = _STATUS.pack(b"r", max(self.write_lsn, flush), flush, flush, _pg_now_us(), 1 if reply else 0)
        lib = self._lib
        if lib.PQputCopyData(self._conn, msg, len(msg)) <= 0 or (flush_now and lib.PQflush(self._conn) != 0):
            raise classify("could not send a standby status update: " + self._errmsg(), None)
        self.sent_flush = flush
        self.status_sent += 1
        self._last_status = time.monotonic()

    def finish(self, timeout: float = 5.0) -> bool:
        """End the stream cleanly (status update, CopyDone, drain until the server ends the copy); see the C pump."""
        if self._conn is None:
            return False
        lib, conn = self._lib, self._conn
        deadline = time.monotonic() + max(timeout, 0.0)
        if lib.PQsetnonblocking(conn, 1) != 0:
            return False
        try:
            self._send_status(False, flush_now=False)
        except ReplicationError:
            return False
        if lib.PQputCopyEnd(conn, None) != 1:
            return False
        ptr = ctypes.c_void_p()
        copying = True
        while True:
            pending = lib.PQflush(conn)
            if pending < 0:
                return False
            if copying:
                n = lib.PQgetCopyData(conn, ctypes.byref(ptr), 1)
                if n > 0:
                    lib.PQfreemem(ptr)  # the rest of what the server had sent: nobody will see it
                    continue
                if n == -1:
                    copying = False
                    continue
                if n < -1:
                    return False
            elif not lib.PQisBusy(conn):
                res = lib.PQgetResult(conn)
                if not res:
                    return True
                lib.PQclear(res)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sock = lib.PQsocket(conn)
            if sock < 0:
                return False
            select.select([sock], [sock] if pending else [], [], remaining)
            if lib.PQconsumeInput(conn) == 0:
                return False

    def send_status(self, reply: bool = False) -> None:
        if self._conn is None:
            raise ConnectionLost("the replication connection is closed")
        self._send_status(reply)

    def _fill(self, out: bytearray, timeout: float) -> None:
        lib, conn = self._lib, self._conn
        ptr = ctypes.c_void_p()
        consumed = False
        caught = False
        gathered = 0.0
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            n, msg = self._get_copy_data(ptr)
            if n > 0:
                kind = msg[0]
                if kind == 0x77 and n >= _XLOGDATA_HEADER:  # 'w'
                    start, end = _W.unpack_from(msg, 1)
                    self._append_frame(out, start, memoryview(msg)[_XLOGDATA_HEADER:])
                    if start > self.write_lsn:
                        self.write_lsn = start
                    if end > self.wal_end:
                        self.wal_end = end
                    self.idle = False
                elif kind == 0x6B and n >= _KEEPALIVE_LENGTH:  # 'k'
                    end, _ts, reply = _K.unpack_from(msg, 1)
                    if end > self.wal_end:
                        self.wal_end = end
                    if self.keepalive_end < self.write_lsn <= end:
                        caught = True  # the walsender reached the end of the WAL after sending what came before
                    if end > self.keepalive_end:
                        self.keepalive_end = end
                    self.keepalives += 1
                    if self.idle and end > self._flush_lsn:
                        self._flush_lsn = end  # nothing open, all acknowledged: confirm what the server passed
                        reply = True
                    if reply:
                        self._send_status(False)
                else:
                    raise ReplicationError(f"unexpected CopyData message type 0x{kind:02x} in the replication "
                                           f"stream (expected 'w' XLogData or 'k' keepalive)")
                if len(out) >= self.max_batch_bytes:
                    break
                continue
            if n == -1:
                self._raise_result()
            if n != 0:
                raise classify(self._errmsg(), None)
            if not consumed:
                consumed = True
                if lib.PQconsumeInput(conn) == 0:
                    raise classify(self._errmsg(), None)
                continue
            if out:
                # while messages keep coming, let _GATHER pass and take what arrived meanwhile into this batch,
                # for at most _GATHER_MAX in all (see the Cython twin)
                if gathered < _GATHER_MAX:
                    time.sleep(_GATHER)
                    gathered += _GATHER
                    sock = lib.PQsocket(conn)
                    if sock >= 0 and select.select([sock], [], [], 0)[0]:
                        consumed = False
                        continue
                break
            if caught:
                break  # nothing to hand out, but the reader may act on having caught up (see the Cython twin)
            now = time.monotonic()
            if now - self._last_status >= self.status_interval:
                self._send_status(False)
            if now >= deadline:
                break
            wait = min(deadline - now, self.status_interval - (now - self._last_status))
            sock = lib.PQsocket(conn)
            if sock < 0:
                raise classify(self._errmsg(), None)
            select.select([sock], [], [], max(wait, 0.0) + 0.001)
            consumed = False
        if time.monotonic() - self._last_status >= self.status_interval:
            self._send_status(False)

    def _raise_result(self) -> None:
        lib, conn = self._lib, self._conn
        res = lib.PQgetResult(conn)
        message, sqlstate = None, None
        if res:
            message, sqlstate = _result_error(lib, res)
            lib.PQclear(res)
            res = lib.PQgetResult(conn)
            while res:
                lib.PQclear(res)
                res = lib.PQgetResult(conn)
        raise classify(message or "the server ended the replication stream", sqlstate)


class CopyPump(_BatchPump):
    """Runs one binary COPY of ``lsn, data`` rows at a time on an ordinary connection. See the Cython twin."""

    def __init__(self, pgconn_ptr: int, *, max_batch_bytes: int = 4 << 20) -> None:
        super().__init__(pgconn_ptr, max_batch_bytes)
        self._state = "idle"  # idle | starting | copying | results
        self._header_seen = False
        self._skip = 0
        self._error: tuple[str, str | None] | None = None
        self._is_broken = False
        self.rows = 0
        self.skipped = 0
        self.max_lsn = 0

    def detach(self) -> None:
        super().detach()
        self._state = "idle"

    @property
    def active(self) -> bool:
        return self._state != "idle"

    @property
    def finished(self) -> bool:
        return self._state == "idle" and self._deferred is None

    def start(self, query: bytes | str, skip: int = 0) -> None:
        if self._conn is None:
            raise ConnectionLost("the connection is closed")
        if self._state != "idle":
            raise ReplicationError("a COPY is already running on this connection")
        self.rows = self.skipped = self.max_lsn = 0
        self._skip = int(skip)
        self._header_seen = False
        self._deferred = None
        self._error = None
        self._is_broken = False
        if self._lib.PQsendQuery(self._conn, query if isinstance(query, bytes) else query.encode()) != 1:
            raise classify(self._errmsg(), None)
        self._state = "starting"

    def _row(self, msg: bytes, out: bytearray) -> None:
        pos = 0
        if not self._header_seen:
            if len(msg) < 19 or msg[:11] != _COPY_SIGNATURE:
                raise ReplicationError("unexpected COPY data: expected binary (pg_lsn, bytea) rows")
            pos = 19 + struct.unpack_from(">I", msg, 15)[0]
            self._header_seen = True
            if pos == len(msg):
                return
        if len(msg) - pos == 2 and msg[pos:] == b"\xff\xff":
            return  # the trailer
        if len(msg) - pos < 18:     # i16 2, i32 8, u64 lsn, i32 length: an empty message has no data after them
            raise ReplicationError("unexpected COPY data: expected binary (pg_lsn, bytea) rows")
        nfields, l1, lsn, dlen = _COPY_ROW.unpack_from(msg, pos)
        if nfields != 2 or l1 != 8 or dlen < 0 or len(msg) - pos - 18 != dlen:
            raise ReplicationError("unexpected COPY data: expected binary (pg_lsn, bytea) rows")
        self.rows += 1
        if self.rows <= self._skip:
            self.skipped += 1
            return
        self._append_frame(out, lsn, memoryview(msg)[pos + 18:])
        if lsn > self.max_lsn:
            self.max_lsn = lsn

    def _fill(self, out: bytearray, timeout: float) -> None:
        lib, conn = self._lib, self._conn
        ptr = ctypes.c_void_p()
        consumed = False
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            if self._state == "copying":
                n, msg = self._get_copy_data(ptr)
                if n > 0:
                    self._row(msg, out)
                    if len(out) >= self.max_batch_bytes:
                        return
                    continue
                if n == -1:
                    self._state = "results"
                    continue
                if n < -1:
                    self._broken()
            elif self._state != "idle":
                if not lib.PQisBusy(conn):
                    res = lib.PQgetResult(conn)
                    if not res:
                        self._state = "idle"
                        if self._error is not None:
                            message, sqlstate = self._error
                            self._error = None
                            raise classify(message, sqlstate)
                        return
                    status = lib.PQresultStatus(res)
                    if status == _PGRES_COPY_OUT:
                        self._state = "copying"
                    elif status == _PGRES_FATAL_ERROR and self._error is None:
                        self._error = _result_error(lib, res)
                    if self._state == "starting":
                        self._state = "results"
                    lib.PQclear(res)
                    continue
            else:
                return
            if not consumed:
                consumed = True
                if lib.PQconsumeInput(conn) == 0:
                    self._broken()
                continue
            sock = lib.PQsocket(conn)
            if sock < 0:
                self._broken()
            if out:
                # unlike a walsender, the COPY's sender does not wait for us: fill the batch while rows keep coming
                if select.select([sock], [], [], _LINGER)[0]:
                    consumed = False
                    continue
                return
            now = time.monotonic()
            if now >= deadline:
                return
            select.select([sock], [], [], deadline - now + 0.001)
            consumed = False

    def _broken(self) -> None:
        self._state = "idle"
        self._is_broken = True
        raise classify(self._errmsg(), None)

    def cancel(self, timeout: float = 5.0) -> bool:
        if self._conn is None:
            return False
        if self._state == "idle":
            return True
        deadline = time.monotonic() + max(timeout, 0.0)
        lib = self._lib
        handle = lib.PQgetCancel(self._conn)
        if handle:
            errbuf = ctypes.create_string_buffer(256)
            lib.PQcancel(handle, errbuf, 256)
            lib.PQfreeCancel(handle)
        self._skip = 1 << 64  # drop every row still to come
        while self._state != "idle":
            try:
                self._fill(bytearray(), deadline - time.monotonic())
            except ReplicationError:
                if self._is_broken:
                    return False  # otherwise: "canceling statement due to user request"
            if self._state != "idle" and time.monotonic() >= deadline:
                return False
        self._deferred = None
        return True


class CopyDataPump(CopyPump):
    """Runs one ``COPY ... TO STDOUT`` at a time and hands out its data as sent (the CopyData messages' bytes
    joined, about `max_batch_bytes` per read). See the Cython twin."""

    def _row(self, msg: bytes, out: bytearray) -> None:
        self.rows += 1
        if self.rows <= self._skip:   # cancel() drops what still arrives
            self.skipped += 1
            return
        out += msg
        self.messages += 1
        self.bytes += len(msg)
