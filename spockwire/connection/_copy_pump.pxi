# The COPY pumps (included by _pump.pyx): CopyPump, the SQL transport, turns the binary COPY rows of
# pg_logical_slot_peek_binary_changes into frame records; CopyDataPump hands out the data of any COPY ... TO STDOUT
# as sent (the table reader's).

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
