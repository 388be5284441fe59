# cython: language_level=3
"""Batch pumps driven straight from libpq (Cython fast path).

* `FramePump` - logical-replication CopyBoth streams. psycopg2 sets the connection up and sends START_REPLICATION;
  from then on `FramePump.read()` pulls every CopyData message libpq has (``PQgetCopyData`` in async mode, without
  the GIL), answers primary keepalives, sends periodic standby status updates, and returns the XLogData payloads
  as one buffer of frame records (u32 payload length, u64 dataStart, payload; big-endian) ready for
  `Decoder.feed_frames`. One Python call per batch, not per message. `finish()` ends the stream cleanly.
* `CopyPump` - the SQL transport: runs ``COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(...))
  TO STDOUT (FORMAT binary)`` on an ordinary connection and turns the binary COPY rows into the same frame
  records, batch by batch, optionally skipping the first rows of the result.

The pure-Python twin is `spockwire.connection._pump_py` (same class, same behaviour, libpq through ctypes).
"""
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize

import os

from .errors import ConnectionLost, ReplicationError, classify

__all__ = ["FramePump", "CopyPump", "CopyDataPump", "IMPLEMENTATION", "bind_libpq"]

IMPLEMENTATION = "c"


include "_libpq.pxi"


cdef class _BatchPump:
    """What both pumps share: the libpq connection, the buffer a batch of frame records is built in, and read(),
    which runs the subclass's nogil loop and hands out what arrived before an error first (the error is raised by
    the next call).

    Counters over the pump's life: ``messages``, ``bytes`` (payload bytes returned), ``batches``.
    """

    cdef PGconn *conn
    cdef char *buf
    cdef Py_ssize_t cap
    cdef Py_ssize_t used
    cdef public Py_ssize_t max_batch_bytes
    cdef int deferred  # an error seen after some frames were read: raised by the next read()
    cdef readonly unsigned long long messages
    cdef readonly unsigned long long bytes
    cdef readonly unsigned long long batches

    def __cinit__(self, pgconn_ptr, *args, Py_ssize_t max_batch_bytes=4 << 20, **kwargs):
        cdef size_t address = <size_t>int(pgconn_ptr)
        bind_libpq()
        if address == 0:
            raise ValueError("pgconn_ptr is NULL: the connection is closed")
        if max_batch_bytes < 1024:
            raise ValueError("max_batch_bytes must be at least 1024")
        self.conn = <PGconn *>address
        self.max_batch_bytes = max_batch_bytes
        self.cap = INITIAL_BUFFER
        self.buf = <char *>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()
        self.used = 0
        self.deferred = OK

    def __dealloc__(self):
        if self.buf != NULL:
            free(self.buf)
            self.buf = NULL

    def detach(self):
        """Forget the connection (call before the psycopg2 connection closes); later calls raise."""
        self.conn = NULL

    cdef int _reserve(self, Py_ssize_t need) noexcept nogil:
        """Make the buffer hold at least `need` bytes (doubling, so appends stay amortised O(1))."""
        cdef Py_ssize_t cap
        cdef char *grown
        if need > self.cap:
            cap = self.cap * 2
            if cap < need:
                cap = need
            grown = <char *>realloc(self.buf, cap)
            if grown == NULL:
                return NO_MEMORY
            self.buf = grown
            self.cap = cap
        return OK

    cdef int _append_frame(self, const char *lsn_be, const char *payload, uint32_t length) noexcept nogil:
        """Append one frame record: u32 payload length, the 8 big-endian LSN bytes at `lsn_be`, the payload."""
        cdef Py_ssize_t need = self.used + FRAME_HEADER + length
        if self._reserve(need) != OK:
            return NO_MEMORY
        put_u32(self.buf + self.used, length)
        memcpy(self.buf + self.used + 4, lsn_be, 8)
        memcpy(self.buf + self.used + FRAME_HEADER, payload, length)
        self.used = need
        self.messages += 1
        self.bytes += length
        return OK

    cdef int _pump(self, double timeout) noexcept nogil:
        """Fill self.buf with frame records (the subclass's loop); returns OK or an outcome for _raise."""
        return OK

    cdef _raise(self, int status):
        """Raise the exception for a nogil outcome other than OK."""
        raise ReplicationError(f"batch pump outcome {status}")

    cdef _closed(self):
        raise ConnectionLost("the connection is closed")

    def read(self, double timeout=1.0):
        """Frame records of everything available now (waiting up to `timeout` s for the first); ``b""`` if none.

        An error seen after some records arrived is raised by the next call, after those records were returned.
        """
        cdef int status
        cdef char *small
        if self.conn == NULL:
            self._closed()
        if self.deferred != OK:
            status = self.deferred
            self.deferred = OK
            self._raise(status)
        self.used = 0
        with nogil:
            status = self._pump(timeout)
        if status != OK and status != NO_MEMORY and self.used > 0:
            self.deferred = status  # hand out what arrived before the failure first
            status = OK
        if status != OK:
            self.used = 0
            self._raise(status)
        if self.used == 0:
            return b""
        data = PyBytes_FromStringAndSize(self.buf, self.used)
        self.used = 0
        self.batches += 1
        if self.cap > 4 * self.max_batch_bytes:  # one huge message: give the memory back
            small = <char *>realloc(self.buf, INITIAL_BUFFER)
            if small != NULL:
                self.buf = small
                self.cap = INITIAL_BUFFER
        return data


cdef class FramePump(_BatchPump):
    """Reads one replication connection (already in CopyBoth mode) batch by batch.

    ``pgconn_ptr`` is psycopg2's ``connection.pgconn_ptr``; the psycopg2 connection must stay open (and unused)
    while the pump works. Only one thread may use a pump at a time.

    * ``flush_lsn`` - the LSN reported as flushed and applied in every status update (only ever grows; the
      stream sets it to what the consumer acknowledged).
    * ``write_lsn`` - the highest WAL position received in an XLogData message (its dataStart).
    * ``status_interval`` - seconds between unsolicited status updates while `read()` runs.
    * ``idle`` - set by the stream when nothing is open and everything handed out is acknowledged: a keepalive's
      walEnd then becomes the flush position (and is reported at once), as PostgreSQL's apply worker does. Any
      XLogData message clears it (its content has not been handed out yet).
    * ``keepalive_end`` - the walEnd of the latest keepalive: everything the server decoded before it was sent.
      The first keepalive that covers `write_lsn` (the walsender sent everything and reached the end of the WAL)
      ends `read()` at once, also with nothing to hand out, so the reader learns it has caught up.
    * ``sent_flush`` - the flush position of the last status update sent.
    * counters: ``messages``, ``bytes``, ``keepalives``, ``status_sent``.
    """

    cdef public double status_interval
    cdef public bint idle
    cdef readonly uint64_t keepalive_end
    cdef readonly uint64_t sent_flush
    cdef uint64_t _flush_lsn
    cdef readonly uint64_t write_lsn
    cdef readonly uint64_t wal_end
    cdef readonly unsigned long long keepalives
    cdef readonly unsigned long long status_sent
    cdef double last_status
    cdef int bad_type

    def __cinit__(self, pgconn_ptr, *, double status_interval=10.0, Py_ssize_t max_batch_bytes=4 << 20,
                  flush_lsn=0):
        self.status_interval = status_interval
        self._flush_lsn = flush_lsn
        self.write_lsn = 0
        self.wal_end = 0
        self.idle = 0
        self.keepalive_end = 0
        self.sent_flush = 0
        self.last_status = monotonic()

    @property
    def flush_lsn(self):
        return self._flush_lsn

    @flush_lsn.setter
    def flush_lsn(self, value):
        cdef uint64_t v = value
        if v > self._flush_lsn:
            self._flush_lsn = v

    cdef int _queue_status(self, int reply) noexcept nogil:
        """Queue a standby status update in libpq's output buffer (write = received, flush = apply = flush_lsn)."""
        cdef char msg[STATUS_LENGTH]
        msg[0] = b'r'
        put_u64(msg + 1, self.write_lsn if self.write_lsn > self._flush_lsn else self._flush_lsn)
        put_u64(msg + 9, self._flush_lsn)
        put_u64(msg + 17, self._flush_lsn)
        put_u64(msg + 25, <uint64_t>pg_now_us())
        msg[33] = 1 if reply else 0
        if PQputCopyData(self.conn, msg, STATUS_LENGTH) <= 0:
            return -1
        self.sent_flush = self._flush_lsn
        self.status_sent += 1
        self.last_status = monotonic()
        return 0

    cdef int _send_status(self, int reply) noexcept nogil:
        if self._queue_status(reply) != 0 or PQflush(self.conn) != 0:
            return -1
        return 0

    cdef int _pump(self, double timeout) noexcept nogil:
        """Fill self.buf with frame records until a batch is full, the input runs dry, or the timeout passes."""
        cdef char *msg = NULL
        cdef int n
        cdef int consumed = 0
        cdef uint32_t plen
        cdef uint64_t start, end
        cdef double now, deadline, wait
        cdef pollfd pfd
        cdef Py_ssize_t limit = self.max_batch_bytes
        cdef int gathered = 0
        cdef int caught = 0
        cdef timespec pause
        deadline = monotonic() + (timeout if timeout > 0 else 0)
        while True:
            n = PQgetCopyData(self.conn, &msg, 1)
            if n > 0:
                if msg[0] == b'w' and n >= XLOGDATA_HEADER:
                    plen = <uint32_t>(n - XLOGDATA_HEADER)
                    start = sw_load_u64(msg + 1)
                    end = sw_load_u64(msg + 9)
                    if self._append_frame(msg + 1, msg + XLOGDATA_HEADER, plen) != OK:
                        PQfreemem(msg)
                        return NO_MEMORY
                    if start > self.write_lsn:
                        self.write_lsn = start
                    if end > self.wal_end:
                        self.wal_end = end
                    self.idle = 0
                    PQfreemem(msg)
                elif msg[0] == b'k' and n >= KEEPALIVE_LENGTH:
                    end = sw_load_u64(msg + 1)
                    if end > self.wal_end:
                        self.wal_end = end
                    if self.keepalive_end < self.write_lsn <= end:
                        caught = 1  # the walsender reached the end of the WAL after sending what came before
                    if end > self.keepalive_end:
                        self.keepalive_end = end
                    self.keepalives += 1
                    n = msg[17]
                    PQfreemem(msg)
                    if self.idle and end > self._flush_lsn:
                        self._flush_lsn = end
                        n = 1
                    if n and self._send_status(0) != 0:
                        return SEND_ERROR
                else:
                    self.bad_type = <unsigned char>msg[0]
                    PQfreemem(msg)
                    return BAD_MESSAGE
                msg = NULL
                if self.used >= limit:
                    break
                continue
            if n == -1:
                return END_OF_COPY
            if n != 0:
                return COPY_ERROR
            # nothing complete in libpq's buffer: read what the socket has, once, before giving up on this batch
            if not consumed:
                consumed = 1
                if PQconsumeInput(self.conn) == 0:
                    return COPY_ERROR
                continue
            if self.used > 0:
                # the walsender sends one message at a time: a client that woke up for each would spend a poll
                # and a recv per message and hand out a batch per message. So, while messages keep coming, it
                # lets GATHER_US pass and takes everything that arrived meanwhile into this batch, for at most
                # GATHER_MAX_US in all (a walsender's send buffer holds far more than arrives in that time)
                if gathered < GATHER_MAX_US:
                    pause.tv_sec = 0
                    pause.tv_nsec = GATHER_US * 1000
                    nanosleep(&pause, NULL)
                    gathered += GATHER_US
                    pfd.fd = PQsocket(self.conn)
                    pfd.events = POLLIN
                    pfd.revents = 0
                    if pfd.fd >= 0 and poll(&pfd, 1, 0) > 0:
                        consumed = 0
                        continue
                break
            if caught:
                break  # nothing to hand out, but the reader may act on having caught up (see `keepalive_end`)
            now = monotonic()
            if now - self.last_status >= self.status_interval:
                if self._send_status(0) != 0:
                    return SEND_ERROR
            if now >= deadline:
                break
            wait = deadline - now
            if self.status_interval - (now - self.last_status) < wait:
                wait = self.status_interval - (now - self.last_status)
            pfd.fd = PQsocket(self.conn)
            pfd.events = POLLIN
            pfd.revents = 0
            if pfd.fd < 0:
                return COPY_ERROR
            poll(&pfd, 1, <int>(wait * 1000.0) + 1)
            consumed = 0
        if monotonic() - self.last_status >= self.status_interval:
            if self._send_status(0) != 0:
                return SEND_ERROR
        return OK

    cdef _closed(self):
        raise ConnectionLost("the replication connection is closed")

    cdef _raise(self, int status):
        if status == NO_MEMORY:
            raise MemoryError("replication message does not fit in memory")
        if status == BAD_MESSAGE:
            raise ReplicationError(f"unexpected CopyData message type 0x{self.bad_type:02x} in the replication "
                                   f"stream (expected 'w' XLogData or 'k' keepalive)")
        if status == SEND_ERROR:
            raise classify("could not send a standby status update: "
                           + (<bytes>PQerrorMessage(self.conn)).decode("utf-8", "replace"), None)
        if status == END_OF_COPY:
            self._raise_result()
        # COPY_ERROR: the socket broke or libpq saw garbage
        raise classify((<bytes>PQerrorMessage(self.conn)).decode("utf-8", "replace"), None)

    cdef _raise_result(self):
        cdef PGresult *res = PQgetResult(self.conn)
        cdef char *field
        message = "the server ended the replication stream"
        sqlstate = None
        if res != NULL:
            if PQresultStatus(res) == PGRES_FATAL_ERROR:
                message = (<bytes>PQresultErrorMessage(res)).decode("utf-8", "replace")
                field = PQresultErrorField(res, PG_DIAG_SQLSTATE)
                if field != NULL:
                    sqlstate = (<bytes>field).decode("ascii", "replace")
            PQclear(res)
            res = PQgetResult(self.conn)
            while res != NULL:
                PQclear(res)
                res = PQgetResult(self.conn)
        raise classify(message, sqlstate)

    def send_status(self, bint reply=False):
        """Send a standby status update now (write = received, flush = apply = `flush_lsn`)."""
        cdef int rc
        if self.conn == NULL:
            raise ConnectionLost("the replication connection is closed")
        with nogil:
            rc = self._send_status(reply)
        if rc != 0:
            raise classify("could not send a standby status update: "
                           + (<bytes>PQerrorMessage(self.conn)).decode("utf-8", "replace"), None)

    @property
    def seconds_since_status(self):
        return monotonic() - self.last_status

    def finish(self, double timeout=5.0):
        """End the stream cleanly: a last status update, CopyDone, then read (and drop) whatever the server still
        sends until it ends the copy too, and collect its final results.

        Closing the socket while the server is still sending would make the kernel answer with a reset, and the
        walsender could lose the status update sent just before. Gives up after `timeout` s. Returns True when
        the server acknowledged the end of the stream (the connection is idle again), False otherwise; either way
        the caller closes the connection next.
        """
        cdef int rc
        if self.conn == NULL:
            return False
        with nogil:
            rc = self._finish(timeout)
        return rc == 0

    cdef int _finish(self, double timeout) noexcept nogil:
        cdef double deadline = monotonic() + (timeout if timeout > 0 else 0)
        cdef double now
        cdef char *msg = NULL
        cdef int n, pending
        cdef int copying = 1
        cdef PGresult *res
        cdef pollfd pfd
        # non-blocking from here on, so that a server that stopped reading cannot hold close() up
        if PQsetnonblocking(self.conn, 1) != 0:
            return -1
        if self._queue_status(0) != 0:
            return -1
        if PQputCopyEnd(self.conn, NULL) != 1:
            return -1
        while True:
            pending = PQflush(self.conn)
            if pending < 0:
                return -1
            if copying:
                n = PQgetCopyData(self.conn, &msg, 1)
                if n > 0:
                    PQfreemem(msg)  # the rest of what the server had sent: nobody will see it
                    msg = NULL
                    continue
                if n == -1:
                    copying = 0  # the server ended the copy: its results follow
                    continue
                if n < -1:
                    return -1
            elif not PQisBusy(self.conn):
                res = PQgetResult(self.conn)
                if res == NULL:
                    return 0
                PQclear(res)
                continue
            now = monotonic()
            if now >= deadline:
                return -1
            pfd.fd = PQsocket(self.conn)
            if pfd.fd < 0:
                return -1
            pfd.events = POLLIN
            if pending:
                pfd.events = POLLIN | POLLOUT
            pfd.revents = 0
            poll(&pfd, 1, <int>((deadline - now) * 1000.0) + 1)
            if PQconsumeInput(self.conn) == 0:
                return -1


include "_copy_pump.pxi"
