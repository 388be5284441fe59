# A bounds-checked read cursor over one message: a plain struct on the stack. Every read checks first;
# the error is built in a separate cold function with the same text as the pure-Python twin.

cdef extern from "include/sw_byteorder.h":
    uint16_t sw_load_u16(const char* p) nogil
    uint32_t sw_load_u32(const char* p) nogil
    uint64_t sw_load_u64(const char* p) nogil
    int32_t sw_load_i32(const char* p) nogil
    int64_t sw_load_i64(const char* p) nogil
    int sw_utf8_valid(const unsigned char* s, size_t n) nogil


cdef struct Cur:
    const char* base      # message start
    Py_ssize_t pos        # offset of the next unread byte
    Py_ssize_t end        # message length
    int mtype             # message type byte, -1 before it is read
    Py_ssize_t start      # offset of the message type byte (8 after a spock v5 prefix)


cdef str type_name(int code):
    if code < 0:
        return None
    return chr(code) if 32 <= code < 127 else f"\\x{code:02x}"


cdef int raise_truncated(Cur* c, Py_ssize_t at, Py_ssize_t needed, str what, int column=-1,
                         object name=None) except -1:
    raise truncated(type_name(c.mtype), at, needed, c.end - at, what,
                    None if column < 0 else column, name)


cdef int raise_bad(Cur* c, Py_ssize_t at, str problem, int column=-1, object name=None) except -1:
    raise protocol_error(type_name(c.mtype), at, problem, None if column < 0 else column, name)


cdef inline int need(Cur* c, Py_ssize_t n, str what) except -1:
    if c.end - c.pos < n:
        raise_truncated(c, c.pos, n, what)
    return 0


cdef inline int get_u8(Cur* c, uint8_t* out, str what) except -1:
    if c.pos >= c.end:
        raise_truncated(c, c.pos, 1, what)
    out[0] = <uint8_t>c.base[c.pos]
    c.pos += 1
    return 0


cdef inline int get_u16(Cur* c, uint16_t* out, str what) except -1:
    if c.end - c.pos < 2:
        raise_truncated(c, c.pos, 2, what)
    out[0] = sw_load_u16(c.base + c.pos)
    c.pos += 2
    return 0


cdef inline int get_u32(Cur* c, uint32_t* out, str what) except -1:
    if c.end - c.pos < 4:
        raise_truncated(c, c.pos, 4, what)
    out[0] = sw_load_u32(c.base + c.pos)
    c.pos += 4
    return 0


cdef inline int get_u64(Cur* c, uint64_t* out, str what) except -1:
    if c.end - c.pos < 8:
        raise_truncated(c, c.pos, 8, what)
    out[0] = sw_load_u64(c.base + c.pos)
    c.pos += 8
    return 0


cdef inline int get_i64(Cur* c, int64_t* out, str what) except -1:
    if c.end - c.pos < 8:
        raise_truncated(c, c.pos, 8, what)
    out[0] = sw_load_i64(c.base + c.pos)
    c.pos += 8
    return 0


# transaction timestamps (µs since 2000-01-01) that a datetime can hold: years 1 to 9999
cdef extern from "include/sw_consts.h":
    const int64_t MIN_TXN_TS "SW_MIN_TXN_TS"
    const int64_t MAX_TXN_TS "SW_MAX_TXN_TS"


cdef int get_timestamp(Cur* c, int64_t* out, str what) except -1:
    """A transaction timestamp: one outside years 1-9999 is no clock time a server wrote."""
    cdef Py_ssize_t at = c.pos
    get_i64(c, out, what)
    if out[0] < MIN_TXN_TS or out[0] > MAX_TXN_TS:
        raise_bad(c, at, f"{what} {out[0]} is outside years 1-9999")
    return 0


cdef inline int skip(Cur* c, Py_ssize_t n, str what) except -1:
    if c.end - c.pos < n:
        raise_truncated(c, c.pos, n, what)
    c.pos += n
    return 0


cdef object get_cstring(Cur* c, str what, int column=-1, object name=None):
    """A NUL-terminated string as str (UTF-8, undecodable bytes kept as surrogate escapes)."""
    cdef Py_ssize_t start = c.pos
    cdef const char* p = c.base + start
    cdef const char* z = <const char*>memchr(p, 0, c.end - start)
    if z == NULL:
        raise_truncated(c, start, c.end - start + 1, what + " (no terminating NUL)", column, name)
    c.pos = start + (z - p) + 1
    try:
        return p[:z - p].decode("utf-8")
    except UnicodeDecodeError:
        raise_bad(c, start, f"{what} is not valid UTF-8", column, name)


cdef inline int expect(Cur* c, uint8_t byte, str what) except -1:
    if c.pos < c.end and <uint8_t>c.base[c.pos] == byte:
        c.pos += 1
        return 0
    return unexpected(c, byte, what)


cdef int unexpected(Cur* c, uint8_t byte, str what) except -1:
    cdef uint8_t got
    get_u8(c, &got, what)
    raise_bad(c, c.pos - 1, f"expected {chr(byte)!r} for {what}, got {type_name(got)!r}")


cdef int get_flags(Cur* c, uint8_t allowed, uint8_t* out, str what="the flags") except -1:
    get_u8(c, out, what)
    if out[0] & ~allowed:
        raise_bad(c, c.pos - 1, f"reserved bits 0x{out[0] & ~allowed & 0xff:02x} set in {what}")
    return 0


cdef inline int done(Cur* c) except -1:
    if c.pos != c.end:
        return trailing_bytes(c)
    return 0


cdef int trailing_bytes(Cur* c) except -1:
    raise_bad(c, c.pos, f"{c.end - c.pos} trailing bytes after the message")
