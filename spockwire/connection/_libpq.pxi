# The C interfaces the pumps use (included by _pump.pyx): libpq, bound at run time to the library psycopg2 loaded
# (bind_libpq), poll and the clocks, big-endian stores, and the constants and outcomes both pumps share.

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
