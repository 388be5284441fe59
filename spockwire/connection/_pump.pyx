# cython: language_level=3
"""Batch pump for logical-replication CopyBoth streams, driven straight from libpq (Cython fast path).

psycopg2 sets the connection up and sends START_REPLICATION; from then on `FramePump.read()` pulls every CopyData
message libpq has (``PQgetCopyData`` in async mode, without the GIL), answers primary keepalives, sends periodic
standby status updates, and returns the XLogData payloads as one buffer of frame records (u32 payload length,
u64 dataStart, payload; big-endian) ready for `Decoder.feed_frames`. One Python call per batch, not per message.

The pure-Python twin is `spockwire.connection._pump_py` (same class, same behaviour, libpq through ctypes).
"""
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize

from .errors import ConnectionLost, ReplicationError, classify

__all__ = ["FramePump", "IMPLEMENTATION"]

IMPLEMENTATION = "c"


cdef extern from "sw_byteorder.h":
    uint32_t SW_BE32(uint32_t x) nogil
    uint64_t SW_BE64(uint64_t x) nogil
    uint64_t sw_load_u64(const char *p) nogil


cdef extern from "libpq-fe.h":
    ctypedef struct PGconn:
        pass
    ctypedef struct PGresult:
        pass
    ctypedef enum ExecStatusType:
        PGRES_COMMAND_OK
        PGRES_COPY_BOTH
        PGRES_FATAL_ERROR
    ctypedef enum ConnStatusType:
        CONNECTION_OK
        CONNECTION_BAD
    int PQgetCopyData(PGconn *conn, char **buffer, int async_) nogil
    int PQputCopyData(PGconn *conn, const char *buffer, int nbytes) nogil
    int PQflush(PGconn *conn) nogil
    int PQconsumeInput(PGconn *conn) nogil
    int PQsocket(const PGconn *conn) nogil
    void PQfreemem(void *ptr) nogil
    PGresult *PQgetResult(PGconn *conn) nogil
    ExecStatusType PQresultStatus(const PGresult *res) nogil
    char *PQresultErrorMessage(const PGresult *res) nogil
    char *PQresultErrorField(const PGresult *res, int fieldcode) nogil
    char *PQerrorMessage(const PGconn *conn) nogil
    ConnStatusType PQstatus(const PGconn *conn) nogil
    void PQclear(PGresult *res) nogil
    int PG_DIAG_SQLSTATE


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN


cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME


# µs between 1970-01-01 and 2000-01-01 (PostgreSQL's epoch)
cdef int64_t PG_EPOCH_OFFSET_US = 946684800000000

cdef enum:
    XLOGDATA_HEADER = 25   # 'w', u64 dataStart, u64 walEnd, i64 sendTime, then the payload
    KEEPALIVE_LENGTH = 18  # 'k', u64 walEnd, i64 sendTime, u8 replyRequested
    FRAME_HEADER = 12      # frame record: u32 payload length, u64 LSN
    STATUS_LENGTH = 34     # 'r', u64 write, u64 flush, u64 apply, i64 clock, u8 replyRequested

# outcomes of the nogil loop
cdef enum:
    OK = 0
    END_OF_COPY = 1
    COPY_ERROR = 2
    SEND_ERROR = 3
    BAD_MESSAGE = 4
    NO_MEMORY = 5


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


cdef class FramePump:
    """Reads one replication connection (already in CopyBoth mode) batch by batch.

    ``pgconn_ptr`` is psycopg2's ``connection.pgconn_ptr``; the psycopg2 connection must stay open (and unused)
    while the pump works. Only one thread may use a pump at a time.

    * ``flush_lsn`` - the LSN reported as flushed and applied in every status update (only ever grows; the
      stream sets it to what the consumer acknowledged).
    * ``write_lsn`` - the highest WAL position received (dataStart of XLogData, walEnd of keepalives).
    * ``status_interval`` - seconds between unsolicited status updates while `read()` runs.
    * counters: ``messages``, ``bytes``, ``keepalives``, ``status_sent``.
    """

    cdef PGconn *conn
    cdef char *buf
    cdef Py_ssize_t cap
    cdef Py_ssize_t used
    cdef public double status_interval
    cdef public Py_ssize_t max_batch_bytes
    cdef uint64_t _flush_lsn
    cdef readonly uint64_t write_lsn
    cdef readonly uint64_t wal_end
    cdef readonly unsigned long long messages
    cdef readonly unsigned long long bytes
    cdef readonly unsigned long long keepalives
    cdef readonly unsigned long long status_sent
    cdef double last_status
    cdef int bad_type
    cdef int deferred  # an error seen after some frames were read: raised by the next read()

    def __cinit__(self, pgconn_ptr, *, double status_interval=10.0, Py_ssize_t max_batch_bytes=4 << 20,
                  flush_lsn=0):
        cdef size_t address = <size_t>int(pgconn_ptr)
        if address == 0:
            raise ValueError("pgconn_ptr is NULL: the connection is closed")
        if max_batch_bytes < 1024:
            raise ValueError("max_batch_bytes must be at least 1024")
        self.conn = <PGconn *>address
        self.status_interval = status_interval
        self.max_batch_bytes = max_batch_bytes
        self.cap = 64 * 1024
        self.buf = <char *>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()
        self.used = 0
        self._flush_lsn = flush_lsn
        self.write_lsn = 0
        self.wal_end = 0
        self.last_status = monotonic()

    def __dealloc__(self):
        if self.buf != NULL:
            free(self.buf)
            self.buf = NULL

    @property
    def flush_lsn(self):
        return self._flush_lsn

    @flush_lsn.setter
    def flush_lsn(self, value):
        cdef uint64_t v = value
        if v > self._flush_lsn:
            self._flush_lsn = v

    def detach(self):
        """Forget the connection (call before the psycopg2 connection closes); later calls raise."""
        self.conn = NULL

    cdef int _send_status(self, int reply) noexcept nogil:
        cdef char msg[STATUS_LENGTH]
        msg[0] = b'r'
        put_u64(msg + 1, self.write_lsn if self.write_lsn > self._flush_lsn else self._flush_lsn)
        put_u64(msg + 9, self._flush_lsn)
        put_u64(msg + 17, self._flush_lsn)
        put_u64(msg + 25, <uint64_t>pg_now_us())
        msg[33] = 1 if reply else 0
        if PQputCopyData(self.conn, msg, STATUS_LENGTH) <= 0 or PQflush(self.conn) != 0:
            return -1
        self.status_sent += 1
        self.last_status = monotonic()
        return 0

    cdef int _reserve(self, Py_ssize_t extra) noexcept nogil:
        cdef Py_ssize_t need = self.used + extra
        cdef Py_ssize_t cap
        cdef char *grown
        if need <= self.cap:
            return 0
        cap = self.cap * 2
        if cap < need:
            cap = need
        grown = <char *>realloc(self.buf, cap)
        if grown == NULL:
            return -1
        self.buf = grown
        self.cap = cap
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
        deadline = monotonic() + (timeout if timeout > 0 else 0)
        while True:
            n = PQgetCopyData(self.conn, &msg, 1)
            if n > 0:
                if msg[0] == b'w' and n >= XLOGDATA_HEADER:
                    plen = <uint32_t>(n - XLOGDATA_HEADER)
                    start = sw_load_u64(msg + 1)
                    end = sw_load_u64(msg + 9)
                    if self._reserve(FRAME_HEADER + plen) != 0:
                        PQfreemem(msg)
                        return NO_MEMORY
                    put_u32(self.buf + self.used, plen)
                    put_u64(self.buf + self.used + 4, start)
                    memcpy(self.buf + self.used + FRAME_HEADER, msg + XLOGDATA_HEADER, plen)
                    self.used += FRAME_HEADER + plen
                    self.messages += 1
                    self.bytes += plen
                    if start > self.write_lsn:
                        self.write_lsn = start
                    if end > self.wal_end:
                        self.wal_end = end
                    PQfreemem(msg)
                elif msg[0] == b'k' and n >= KEEPALIVE_LENGTH:
                    end = sw_load_u64(msg + 1)
                    if end > self.wal_end:
                        self.wal_end = end
                    self.keepalives += 1
                    n = msg[17]
                    PQfreemem(msg)
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
                break  # no lingering for more: a full walsender send buffer slows the server down
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

    def read(self, double timeout=1.0):
        """Frame records of every XLogData message available now (waiting up to `timeout` s for the first one).

        Returns ``b""`` when nothing arrived in time. Raises ConnectionLost when the connection broke or the
        server ended the stream for a retryable reason, ServerError for any other server error.
        """
        cdef int status
        if self.conn == NULL:
            raise ConnectionLost("the replication connection is closed")
        if self.deferred != OK:
            status = self.deferred
            self.deferred = OK
            self._raise(status)
        self.used = 0
        with nogil:
            status = self._pump(timeout)
        if status != OK and status != NO_MEMORY and self.used > 0:
            # hand out what arrived before the failure first
            self.deferred = status
            status = OK
        if status == OK:
            if self.used == 0:
                return b""
            data = PyBytes_FromStringAndSize(self.buf, self.used)
            self.used = 0
            if self.cap > 4 * self.max_batch_bytes:  # one huge message: give the memory back
                self._shrink()
            return data
        self.used = 0
        self._raise(status)

    cdef void _shrink(self) noexcept:
        cdef char *small = <char *>realloc(self.buf, 64 * 1024)
        if small != NULL:
            self.buf = small
            self.cap = 64 * 1024

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
