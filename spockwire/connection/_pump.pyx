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


cdef extern from "sw_byteorder.h":
    uint32_t SW_BE32(uint32_t x) nogil
    uint64_t SW_BE64(uint64_t x) nogil
    uint64_t sw_load_u64(const char *p) nogil


# libpq, resolved at run time from psycopg2's own libpq (sw_libpq.h explains why); the names are macros there
cdef extern from "sw_libpq.h":
    ctypedef struct PGconn:
        pass
    ctypedef struct PGresult:
        pass
    ctypedef enum ExecStatusType:
        PGRES_COMMAND_OK
        PGRES_COPY_OUT
        PGRES_COPY_BOTH
        PGRES_FATAL_ERROR
    ctypedef struct PGcancel:
        pass
    int PQgetCopyData(PGconn *conn, char **buffer, int async_) nogil
    int PQputCopyData(PGconn *conn, const char *buffer, int nbytes) nogil
    int PQputCopyEnd(PGconn *conn, const char *errormsg) nogil
    int PQsetnonblocking(PGconn *conn, int arg) nogil
    int PQisBusy(PGconn *conn) nogil
    int PQsendQuery(PGconn *conn, const char *query) nogil
    PGcancel *PQgetCancel(PGconn *conn) nogil
    int PQcancel(PGcancel *cancel, char *errbuf, int errbufsize) nogil
    void PQfreeCancel(PGcancel *cancel) nogil
    int PQflush(PGconn *conn) nogil
    int PQconsumeInput(PGconn *conn) nogil
    int PQsocket(const PGconn *conn) nogil
    void PQfreemem(void *ptr) nogil
    PGresult *PQgetResult(PGconn *conn) nogil
    ExecStatusType PQresultStatus(const PGresult *res) nogil
    char *PQresultErrorMessage(const PGresult *res) nogil
    char *PQresultErrorField(const PGresult *res, int fieldcode) nogil
    char *PQerrorMessage(const PGconn *conn) nogil
    void PQclear(PGresult *res) nogil
    int PG_DIAG_SQLSTATE
    const char *sw_libpq_bind(void *handle)
    void *sw_libpq_handle
    void *sw_PQgetCopyData


cdef extern from "<dlfcn.h>":
    void *dlopen(const char *filename, int flags)
    char *dlerror()
    int RTLD_NOW
    int RTLD_NOLOAD


def bind_libpq(module_file=None):
    """Take every libpq function from the libpq that psycopg2 uses (once per process); returns the address of
    PQgetCopyData as found (`spockwire.connection.libpq.library_of` names its file).

    `module_file`: a loaded extension module linked against that libpq; default: psycopg2's ``_psycopg``.
    """
    cdef void *handle
    cdef const char *missing
    if sw_libpq_handle == NULL:
        if module_file is None:
            import psycopg2._psycopg
            module_file = psycopg2._psycopg.__file__
        path = os.fsencode(module_file)
        handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
        if handle == NULL:
            error = dlerror()
            raise ImportError(f"cannot reach libpq through {module_file}: "
                              + ((<bytes>error).decode("utf-8", "replace") if error != NULL else "not loaded"))
        missing = sw_libpq_bind(handle)
        if missing != NULL:
            raise ImportError(f"the libpq of {module_file} has no {(<bytes>missing).decode()}")
    return <size_t>sw_PQgetCopyData


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN
    short POLLOUT


cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp)
    int nanosleep(const timespec *req, timespec *rem)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME


# µs between 1970-01-01 and 2000-01-01 (PostgreSQL's epoch)
cdef int64_t PG_EPOCH_OFFSET_US = 946684800000000

cdef enum:
    XLOGDATA_HEADER = 25   # 'w', u64 dataStart, u64 walEnd, i64 sendTime, then the payload
    KEEPALIVE_LENGTH = 18  # 'k', u64 walEnd, i64 sendTime, u8 replyRequested
    FRAME_HEADER = 12      # frame record: u32 payload length, u64 LSN
    STATUS_LENGTH = 34     # 'r', u64 write, u64 flush, u64 apply, i64 clock, u8 replyRequested

# outcomes of the nogil loops (both pumps)
cdef enum:
    OK = 0
    NO_MEMORY = 1
    # FramePump
    END_OF_COPY = 2
    COPY_ERROR = 3
    SEND_ERROR = 4
    BAD_MESSAGE = 5
    # CopyPump
    C_FAILED = 6      # the server reported an error (kept in err_res)
    C_BROKEN = 7      # the connection broke
    C_BAD_ROW = 8     # not a (pg_lsn, bytea) binary COPY row

cdef enum:
    INITIAL_BUFFER = 64 * 1024
    GATHER_US = 200             # replication: a pause before reading what arrived meanwhile ...
    GATHER_MAX_US = 10000       # ... for at most this long per batch


cdef inline double monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline int64_t pg_now_us() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000000 + ts.tv_nsec // 1000 - PG_EPOCH_OFFSET_US


cdef inline void put_u32(char *p, uint32_t v) noexcept nogil:
    cdef uint32_t be = SW_BE32(v)
    memcpy(p, &be, 4)


cdef inline void put_u64(char *p, uint64_t v) noexcept nogil:
    cdef uint64_t be = SW_BE64(v)
    memcpy(p, &be, 8)


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


# ------------------------------------------------------------------------------------------------------------------
# the SQL transport: binary COPY of pg_logical_slot_peek_binary_changes

cdef extern from *:
    """
    static const char SW_COPY_SIGNATURE[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\\n', '\\377', '\\r', '\\n', '\\0'};
    """
    const char SW_COPY_SIGNATURE[11]

cdef extern from "<string.h>" nogil:
    int memcmp(const void *a, const void *b, size_t n)

# states of a CopyPump
cdef enum:
    C_IDLE = 0        # no call running; the connection is free for other queries
    C_STARTING = 1    # query sent, waiting for CopyOutResponse (the server is decoding)
    C_COPYING = 2     # rows arriving
    C_RESULTS = 3     # the copy ended: collecting the final results

cdef enum:
    LINGER_MS = 2     # a batch is handed out once no row arrived for this long (or it is full)


cdef inline uint32_t load_u32(const char *p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return SW_BE32(v)


cdef class CopyPump(_BatchPump):
    """Runs one binary COPY of ``lsn, data`` rows at a time on an ordinary connection, batch by batch.

    ``pgconn_ptr`` is psycopg2's ``connection.pgconn_ptr`` (autocommit, idle). `start(query, skip)` sends the
    query; `read(timeout)` returns the next frame records (u32 payload length, u64 lsn, payload) - ``b""`` when
    nothing arrived in time - dropping the first `skip` rows of the result; `finished` is True once the COPY
    completed and the connection is idle again. psycopg2 must not use the connection while a COPY runs.

    Per call: ``rows`` (including skipped ones), ``skipped``, ``max_lsn`` (highest lsn of the rows returned).
    """

    cdef int state
    cdef int header_seen
    cdef PGresult *err_res
    cdef unsigned long long skip
    cdef readonly unsigned long long rows
    cdef readonly unsigned long long skipped
    cdef readonly uint64_t max_lsn

    def __cinit__(self, pgconn_ptr, *, Py_ssize_t max_batch_bytes=4 << 20):
        self.state = C_IDLE

    def __dealloc__(self):
        if self.err_res != NULL:
            PQclear(self.err_res)
            self.err_res = NULL

    def detach(self):
        """Forget the connection (call before the psycopg2 connection closes); later calls raise."""
        self.conn = NULL
        self.state = C_IDLE

    @property
    def active(self):
        """True while a COPY is running (the connection is busy)."""
        return self.state != C_IDLE

    @property
    def finished(self):
        """True when no COPY is running and nothing is left to hand out."""
        return self.state == C_IDLE and self.deferred == OK

    def start(self, query, unsigned long long skip=0):
        """Send a ``COPY (SELECT lsn, data ...) TO STDOUT (FORMAT binary)`` query; drop its first `skip` rows."""
        cdef bytes q = query if isinstance(query, bytes) else query.encode("utf-8")
        cdef const char *text = q
        cdef int ok
        if self.conn == NULL:
            raise ConnectionLost("the connection is closed")
        if self.state != C_IDLE:
            raise ReplicationError("a COPY is already running on this connection")
        self.rows = 0
        self.skipped = 0
        self.max_lsn = 0
        self.skip = skip
        self.header_seen = 0
        self.deferred = OK
        with nogil:
            ok = PQsendQuery(self.conn, text)
        if ok != 1:
            raise classify((<bytes>PQerrorMessage(self.conn)).decode("utf-8", "replace"), None)
        self.state = C_STARTING

    cdef int _row(self, const char *msg, int n) noexcept nogil:
        """One CopyData message: (the file header, on the first,) one (lsn, data) row, or the trailer."""
        cdef const char *p = msg
        cdef const char *end = msg + n
        cdef uint32_t ext, dlen
        cdef uint64_t lsn
        if not self.header_seen:
            if n < 19 or memcmp(p, SW_COPY_SIGNATURE, 11) != 0:
                return C_BAD_ROW
            ext = load_u32(p + 15)
            p += 19
            if <Py_ssize_t>(end - p) < <Py_ssize_t>ext:
                return C_BAD_ROW
            p += ext
            self.header_seen = 1
            if p == end:
                return OK
        if end - p == 2 and <unsigned char>p[0] == 0xFF and <unsigned char>p[1] == 0xFF:
            return OK  # the trailer
        # i16 2 fields, i32 8, u64 lsn, i32 length, data (which may be empty: the JSON protocol's message after a
        # BEGIN)
        if end - p < 18 or p[0] != 0 or p[1] != 2 or load_u32(p + 2) != 8:
            return C_BAD_ROW
        lsn = sw_load_u64(p + 6)
        dlen = load_u32(p + 14)
        if dlen == <uint32_t>0xFFFFFFFFU or <Py_ssize_t>(end - p - 18) != <Py_ssize_t>dlen:
            return C_BAD_ROW
        self.rows += 1
        if self.rows <= self.skip:
            self.skipped += 1
            return OK
        if self._append_frame(p + 6, p + 18, dlen) != OK:
            return NO_MEMORY
        if lsn > self.max_lsn:
            self.max_lsn = lsn
        return OK

    cdef int _pump(self, double timeout) noexcept nogil:
        cdef char *msg = NULL
        cdef int n, rc
        cdef int consumed = 0
        cdef double now
        cdef double deadline = monotonic() + (timeout if timeout > 0 else 0)
        cdef PGresult *res
        cdef ExecStatusType st
        cdef pollfd pfd
        while True:
            if self.state == C_COPYING:
                n = PQgetCopyData(self.conn, &msg, 1)
                if n > 0:
                    rc = self._row(msg, n)
                    PQfreemem(msg)
                    msg = NULL
                    if rc != OK:
                        return rc
                    if self.used >= self.max_batch_bytes:
                        return OK
                    continue
                if n == -1:
                    self.state = C_RESULTS
                    continue
                if n < -1:
                    return C_BROKEN
            elif self.state != C_IDLE:
                # STARTING or RESULTS: read results without blocking
                if not PQisBusy(self.conn):
                    res = PQgetResult(self.conn)
                    if res == NULL:
                        self.state = C_IDLE
                        return C_FAILED if self.err_res != NULL else OK
                    st = PQresultStatus(res)
                    if st == PGRES_COPY_OUT:
                        PQclear(res)
                        self.state = C_COPYING
                        continue
                    if st == PGRES_FATAL_ERROR and self.err_res == NULL:
                        self.err_res = res
                    else:
                        PQclear(res)
                    if self.state == C_STARTING:
                        self.state = C_RESULTS
                    continue
            else:
                return OK
            # nothing complete in libpq's buffer
            if not consumed:
                consumed = 1
                if PQconsumeInput(self.conn) == 0:
                    return C_BROKEN
                continue
            pfd.fd = PQsocket(self.conn)
            if pfd.fd < 0:
                return C_BROKEN
            pfd.events = POLLIN
            pfd.revents = 0
            if self.used > 0:
                # unlike a walsender, the COPY's sender does not wait for us: fill the batch while rows keep coming
                if poll(&pfd, 1, LINGER_MS) > 0:
                    consumed = 0
                    continue
                return OK
            now = monotonic()
            if now >= deadline:
                return OK
            poll(&pfd, 1, <int>((deadline - now) * 1000.0) + 1)
            consumed = 0

    cdef _raise(self, int status):
        cdef char *field
        cdef PGresult *res
        if status == NO_MEMORY:
            raise MemoryError("a logical decoding row does not fit in memory")
        if status == C_BAD_ROW:
            raise ReplicationError("unexpected COPY data: expected binary (pg_lsn, bytea) rows")
        if status == C_FAILED and self.err_res != NULL:
            res = self.err_res
            self.err_res = NULL
            message = (<bytes>PQresultErrorMessage(res)).decode("utf-8", "replace")
            field = PQresultErrorField(res, PG_DIAG_SQLSTATE)
            sqlstate = (<bytes>field).decode("ascii", "replace") if field != NULL else None
            PQclear(res)
            raise classify(message, sqlstate)
        self.state = C_IDLE
        raise classify((<bytes>PQerrorMessage(self.conn)).decode("utf-8", "replace"), None)

    def cancel(self, double timeout=5.0):
        """Stop a running COPY: ask the server to cancel it, drop what still arrives, collect the results.

        Returns True when the connection is idle again within `timeout` s (it can be used or closed cleanly).
        """
        cdef PGcancel *c
        cdef char errbuf[256]
        cdef double deadline
        cdef int status
        if self.conn == NULL:
            return False
        if self.state == C_IDLE:
            return True
        deadline = monotonic() + (timeout if timeout > 0 else 0)
        with nogil:
            c = PQgetCancel(self.conn)
            if c != NULL:
                PQcancel(c, errbuf, 256)
                PQfreeCancel(c)
        self.skip = 0xFFFFFFFFFFFFFFFFULL  # drop every row still to come
        while self.state != C_IDLE:
            self.used = 0
            with nogil:
                status = self._pump(deadline - monotonic())
            self.used = 0
            if status == C_BROKEN or status == C_BAD_ROW or status == NO_MEMORY:
                return False
            if self.err_res != NULL:
                PQclear(self.err_res)
                self.err_res = NULL
            if self.state != C_IDLE and monotonic() >= deadline:
                return False
        self.deferred = OK
        return True


cdef class CopyDataPump(CopyPump):
    """Runs one ``COPY ... TO STDOUT`` at a time and hands out its data as sent: the bytes of the CopyData messages
    joined, about `max_batch_bytes` per `read()` - one Python call per batch, never one per row (PostgreSQL sends
    a CopyData message per row). The table reader (spockwire.snapshot) feeds them to `CopyBinaryDecoder.feed`.
    Same `start`, `read`, `finished`, `cancel` and `detach` as `CopyPump`; ``rows`` counts the CopyData messages.
    """

    cdef int _row(self, const char *msg, int n) noexcept nogil:
        cdef Py_ssize_t need = self.used + n
        self.rows += 1
        if self.rows <= self.skip:   # cancel() drops what still arrives
            self.skipped += 1
            return OK
        if self._reserve(need) != OK:
            return NO_MEMORY
        memcpy(self.buf + self.used, msg, n)
        self.used = need
        self.messages += 1
        self.bytes += n
        return OK
