# Typed value kernels: text ('t'), binary ('b') and internal ('i') forms decoded straight into Arrow-layout
# column buffers. Twin: spockwire/values/_convert_py.py (decode_value, build_array: same names on both sides) —
# both accept and refuse exactly the same bytes.
# A kernel returns 0, or a failure code from spockwire.values.failures (> 0); the caller raises.

from libc.stdio cimport snprintf
from cpython.ref cimport PyObject, Py_XINCREF, Py_XDECREF
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memmove

from ..values._convert_py import ValueFailure
from ..values.internal import FIXED_FIELDS, VARLENA_CONVERTED, VARLENA_TEXT_TYPES, converted_send_form
from ..values.internal_types import ACLITEM_OID, LAYOUT_TYPES

cdef extern from "Python.h":
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow_exception) except? -1.0

cdef extern from "include/sw_byteorder.h":
    ctypedef long long int128_t "sw_int128"

cdef extern from "include/sw_copy.h":
    void sw_copy(char* dst, const char* src, size_t n) nogil


cdef extern from "include/sw_stamp.h":
    int sw_stamp19(const char* p, int* fields) nogil


cdef extern from "include/sw_hex.h":
    int sw_uuid_text(const char* p, unsigned char* out) nogil

cdef extern from "include/sw_varlena.h":
    int SW_VL_NOMEM
    int sw_varlena(const unsigned char* p, long long n, int big, const unsigned char** data, long long* length,
                   unsigned char** owned) nogil

cdef extern from "include/sw_internal_types.h":
    ctypedef struct sw_out:
        unsigned char* data
        long long len
        long long cap
    int sw_numeric_out(sw_out* o, int negative, int weight, int dscale, long long ndigits,
                       const unsigned char* digits, int big) nogil
    int sw_jsonb_send(const unsigned char* p, long long n, int big, sw_out* o) nogil
    int sw_tsvector_send(const unsigned char* p, long long n, int big, sw_out* o) nogil
    int sw_tsquery_send(const unsigned char* p, long long n, int big, sw_out* o) nogil
    int sw_jsonpath_send(const unsigned char* p, long long n, int big, sw_out* o) nogil

cdef enum:
    K_RAW = 0
    K_BOOL = 1
    K_INT2 = 2
    K_INT4 = 3
    K_INT8 = 4
    K_OID = 5
    K_FLOAT4 = 6
    K_FLOAT8 = 7
    K_DECIMAL = 8
    K_NUMERIC_TEXT = 9
    K_TEXT = 10
    K_JSON = 11
    K_JSONB = 12
    K_BYTEA = 13
    K_DATE = 14
    K_TIMESTAMP = 15
    K_TIMESTAMPTZ = 16
    K_TIME = 17
    K_TIMETZ = 18
    K_INTERVAL = 19
    K_UUID = 20
    K_ENUM = 21
    K_ARRAY = 22
    K_OTHER = 23
    K_CHAR = 24
    K_PGTEXT = 25

cdef enum:
    F_INVALID = 1
    F_INTERNAL_UNSUPPORTED = 2
    F_MULTIDIMENSIONAL = 3
    F_SPECIAL_DECIMAL = 4
    F_OUT_OF_RANGE = 5
    F_INVALID_UTF8 = 6
    F_BYTE_ORDER_UNKNOWN = 7
    F_TOO_LARGE = 8
    F_LOWER_BOUND = 9

cdef extern from "include/sw_consts.h":
    # compile-time constants (folded by the C compiler); tests/test_kernel_constants.py checks them against the twin
    const int64_t I64_MAX "SW_I64_MAX"
    const int64_t I64_MIN "SW_I64_MIN"
    const uint64_t U64_MAX "SW_U64_MAX"
    const int32_t I32_MAX "SW_I32_MAX"
    const int32_t I32_MIN "SW_I32_MIN"
    const int64_t US_PER_DAY "SW_US_PER_DAY"
    const int64_t UNIX_US_2000 "SW_UNIX_US_2000"
    const int32_t UNIX_DAYS_2000 "SW_UNIX_DAYS_2000"
    # Arrow's string, binary and list offsets are int32: a column's data in one batch never passes this many bytes
    # (elements, for lists). Every variable-length append checks it and fails with F_TOO_LARGE instead of wrapping.
    const Py_ssize_t OFFSET_LIMIT "SW_OFFSET_LIMIT"
    const signed char* sw_hex_value
    const uint64_t* sw_pow10_u64

# Bytes appended to variable-length buffers by the value being decoded (the decoder resets it per value and counts
# max(wire bytes, appended bytes) toward the batch limit, so expanding kernels close batches too).
cdef Py_ssize_t appended = 0


cdef struct ColBuf:
    int kind
    int width             # bytes per value of fixed-width kinds, 0 otherwise (bool: bits)
    int precision
    int scale
    Buf validity          # 1 bit per value
    Buf offsets           # int32 per value + 1 (variable-length kinds, arrays)
    Buf data              # values (fixed width), bytes (variable length) or bits (bool)
    Buf marks             # RAW/OTHER: 1 bit per value, set when it did not arrive as UTF-8 text
    int nontext           # RAW/OTHER: set at freeze when any value of the builder is marked
    ColBuf* child         # ARRAY: the elements
    PyObject* render      # PGTEXT: spec.render (bytes -> str), one reference held
    uint32_t type_oid     # PGTEXT: the type (picks a native renderer)
    bint view             # string_view / binary_view output: `data` holds 16-byte views, `offsets` still counts
                          # the column's bytes (the same 32-bit limit as the plain layout)
    Buf arena             # view columns: values longer than 12 bytes that do not lie in the pinned input
    Py_ssize_t arena_len


# Views (strings="view"): the input buffer the row being decoded may point into. Set by the decoder per row message:
# pin_index is the variadic buffer index of that input in the batch (>= 1; 0 is the column's arena), or 0 when the
# message's bytes cannot be pinned (values are then copied into the arena).
cdef const char* pin_base = NULL
cdef const char* pin_end = NULL
cdef int32_t pin_index = 0


cdef inline bint is_view_kind(int kind) noexcept nogil:
    """Kinds whose Arrow type is string or binary: string_view / binary_view when views are asked for."""
    return (kind == K_TEXT or kind == K_JSON or kind == K_JSONB or kind == K_BYTEA or kind == K_RAW
            or kind == K_OTHER)


cdef inline int view_store(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """Slot `idx` of a view column: inline up to 12 bytes, else a view into the pinned input or into the arena."""
    cdef char* v = col.data.data + idx * 16
    cdef uint64_t w[2]
    cdef uint32_t head[4]
    if n <= 12:
        w[0] = 0
        w[1] = 0
        head[0] = <uint32_t>n
        memcpy(w, head, 4)
        if n:
            memcpy((<char*>w) + 4, p, n)
        memcpy(v, w, 16)
        return 0
    head[0] = <uint32_t>n
    memcpy(&head[1], p, 4)
    if pin_index > 0 and p >= pin_base and p + n <= pin_end:
        head[2] = <uint32_t>pin_index
        head[3] = <uint32_t>(p - pin_base)
    else:
        if col.arena_len + n > col.arena.cap:
            buf_grow(&col.arena, col.arena_len + n)
        memcpy(col.arena.data + col.arena_len, p, n)
        head[2] = 0
        head[3] = <uint32_t>col.arena_len
        col.arena_len += n
    memcpy(v, head, 16)
    return 0


cdef int kind_width(int kind) noexcept nogil:
    if kind == K_INT2:
        return 2
    if kind == K_INT4 or kind == K_OID or kind == K_FLOAT4 or kind == K_DATE:
        return 4
    if kind == K_INT8 or kind == K_FLOAT8 or kind == K_TIMESTAMP or kind == K_TIMESTAMPTZ or kind == K_TIME:
        return 8
    if kind == K_DECIMAL or kind == K_INTERVAL or kind == K_UUID:
        return 16
    return 0


cdef inline bint is_varlen(int kind) noexcept nogil:
    return (kind == K_RAW or kind == K_OTHER or kind == K_TEXT or kind == K_JSON or kind == K_JSONB
            or kind == K_BYTEA or kind == K_NUMERIC_TEXT or kind == K_TIMETZ or kind == K_ENUM or kind == K_CHAR
            or kind == K_PGTEXT)


cdef int col_init(ColBuf* col, object spec) except -1:
    """Set a column buffer up from its ColumnSpec (recursively for array elements)."""
    col.kind = spec.kind
    col.width = kind_width(col.kind)
    col.precision = spec.precision
    col.scale = spec.scale
    if col.kind == K_PGTEXT:
        render = spec.render
        Py_XINCREF(<PyObject*>render)
        col.render = <PyObject*>render
        col.type_oid = spec.type_oid
    if col.kind == K_ARRAY:
        col.child = <ColBuf*>malloc(sizeof(ColBuf))
        if col.child == NULL:
            raise MemoryError()
        memset(col.child, 0, sizeof(ColBuf))
        col_init(col.child, spec.element)
    return 0


cdef void col_free(ColBuf* col) noexcept:
    buf_free(&col.validity)
    buf_free(&col.offsets)
    buf_free(&col.data)
    buf_free(&col.marks)
    buf_free(&col.arena)
    if col.render != NULL:
        Py_XDECREF(col.render)
        col.render = NULL
    if col.child != NULL:
        col_free(col.child)
        free(col.child)
        col.child = NULL


cdef int col_reserve(ColBuf* col, Py_ssize_t count) except -1:
    """Room for `count` values (validity, offsets, fixed-width data or bool bits)."""
    if ((count + 7) >> 3) > col.validity.cap:
        buf_grow(&col.validity, (count + 7) >> 3)
    if (col.kind == K_RAW or col.kind == K_OTHER) and ((count + 7) >> 3) > col.marks.cap:
        buf_grow(&col.marks, (count + 7) >> 3)
    if col.width:
        if count * col.width > col.data.cap:
            buf_grow(&col.data, count * col.width)
    elif col.view:
        if (count + 1) * 4 > col.offsets.cap:
            buf_grow(&col.offsets, (count + 1) * 4)
        if count * 16 > col.data.cap:
            buf_grow(&col.data, count * 16)
    elif col.kind == K_BOOL:
        if ((count + 7) >> 3) > col.data.cap:
            buf_grow(&col.data, (count + 7) >> 3)
    else:
        if (count + 1) * 4 > col.offsets.cap:
            buf_grow(&col.offsets, (count + 1) * 4)
    return 0


cdef int reserve_values(ColBuf* col, Py_ssize_t rows, Py_ssize_t count) except -1:
    """Room in a variable-width column for `count` values as large on average as its first `rows` (at most
    OFFSET_LIMIT bytes): one growth instead of a doubling every few thousand rows."""
    cdef Py_ssize_t used, want
    if col.width or col.view or col.kind == K_BOOL or col.offsets.data == NULL:
        return 0
    used = (<int32_t*>col.offsets.data)[rows]
    want = (used // rows + 1) * count
    if want > OFFSET_LIMIT:
        want = OFFSET_LIMIT
    if want > col.data.cap:
        buf_grow(&col.data, want)
    return 0


cdef inline int var_append(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    global appended
    cdef int32_t* off = <int32_t*>col.offsets.data
    cdef Py_ssize_t pos = off[idx]
    if pos + n > OFFSET_LIMIT:
        return F_TOO_LARGE
    appended += n
    if col.view:
        view_store(col, idx, p, n)
        off[idx + 1] = <int32_t>(pos + n)
        return 0
    if pos + n > col.data.cap:
        buf_grow(&col.data, pos + n)
    if n:       # an empty first value: no buffer yet, and no pointer arithmetic on NULL
        sw_copy(col.data.data + pos, p, n)
    off[idx + 1] = <int32_t>(pos + n)
    return 0


cdef inline void set_valid(ColBuf* col, Py_ssize_t idx) noexcept:
    col.validity.data[idx >> 3] |= <char>(1 << (idx & 7))


cdef void set_null(ColBuf* col, Py_ssize_t idx) noexcept:
    """A NULL (or unchanged TOAST) slot: validity cleared, an empty value written."""
    cdef int32_t* off
    col.validity.data[idx >> 3] &= <char>~(1 << (idx & 7))
    if col.width:
        memset(col.data.data + idx * col.width, 0, col.width)
    elif col.kind == K_BOOL:
        col.data.data[idx >> 3] &= <char>~(1 << (idx & 7))
    else:
        off = <int32_t*>col.offsets.data
        off[idx + 1] = off[idx]
        if col.view:
            memset(col.data.data + idx * 16, 0, 16)
        if col.marks.data != NULL:
            col.marks.data[idx >> 3] &= <char>~(1 << (idx & 7))


# ------------------------------------------------------------------ small parsers
cdef inline bint is_digit(char c) noexcept nogil:
    # one unsigned comparison instead of two
    return <unsigned char>(c - 48) <= 9


cdef int digits_value(const char* p, Py_ssize_t n, int64_t* out) noexcept nogil:
    """Decimal digits (already checked) as int64; 1 when the value does not fit."""
    cdef int64_t v = 0
    cdef Py_ssize_t i
    for i in range(n):
        if v > (I64_MAX - (p[i] - 48)) // 10:
            return 1
        v = v * 10 + (p[i] - 48)
    out[0] = v
    return 0


cdef int text_int(const char* p, Py_ssize_t n, int64_t lo, int64_t hi, int64_t* out) noexcept nogil:
    cdef Py_ssize_t i = 0, j
    cdef uint64_t mag = 0
    cdef bint neg = False
    if n > 0 and p[0] == 45:
        neg = True
        i = 1
    if i >= n:
        return F_INVALID
    if n - i <= 19:
        # 19 digits stay below 2**64: no overflow check per digit
        for j in range(i, n):
            if <unsigned char>(p[j] - 48) > 9:
                return F_INVALID
            mag = mag * 10 + <uint64_t>(p[j] - 48)
    else:
        for j in range(i, n):
            if not is_digit(p[j]):
                return F_INVALID
        for j in range(i, n):
            if mag > (U64_MAX - <uint64_t>(p[j] - 48)) // 10:
                return F_OUT_OF_RANGE
            mag = mag * 10 + <uint64_t>(p[j] - 48)
    if neg:
        if mag > <uint64_t>I64_MAX + 1:
            return F_OUT_OF_RANGE
        if mag == <uint64_t>I64_MAX + 1:
            out[0] = I64_MIN
        else:
            out[0] = -<int64_t>mag
    else:
        if mag > <uint64_t>I64_MAX:
            return F_OUT_OF_RANGE
        out[0] = <int64_t>mag
    if out[0] < lo or out[0] > hi:
        return F_OUT_OF_RANGE
    return 0


cdef bint float_grammar(const char* p, Py_ssize_t n) noexcept nogil:
    """-?(digits(.digits*)?|.digits)([eE][-+]?digits)?"""
    cdef Py_ssize_t i = 0, start
    cdef bint whole = False, frac = False
    if i < n and p[i] == 45:
        i += 1
    start = i
    while i < n and is_digit(p[i]):
        i += 1
    whole = i > start
    if i < n and p[i] == 46:
        i += 1
        start = i
        while i < n and is_digit(p[i]):
            i += 1
        frac = i > start
    if not whole and not frac:
        return False
    if i < n and (p[i] == 101 or p[i] == 69):
        i += 1
        if i < n and (p[i] == 43 or p[i] == 45):
            i += 1
        start = i
        while i < n and is_digit(p[i]):
            i += 1
        if i == start:
            return False
    return i == n


cdef int text_float(const char* p, Py_ssize_t n, double* out) except -1:
    cdef char small[128]
    cdef char* z
    if n == 3 and memcmp(p, b"NaN", 3) == 0:
        out[0] = float("nan")
        return 0
    if n == 8 and memcmp(p, b"Infinity", 8) == 0:
        out[0] = float("inf")
        return 0
    if n == 9 and memcmp(p, b"-Infinity", 9) == 0:
        out[0] = float("-inf")
        return 0
    if not float_grammar(p, n):
        return F_INVALID
    if n < 128:
        z = &small[0]
    else:
        z = <char*>malloc(n + 1)
    if z == NULL:
        raise MemoryError()
    memcpy(z, p, n)
    z[n] = 0
    try:
        out[0] = PyOS_string_to_double(z, NULL, NULL)
    finally:
        if n >= 128:
            free(z)
    return 0


cdef int128_t POW10[39]
cdef int _init_pow10() except -1:
    cdef int i
    POW10[0] = 1
    for i in range(1, 39):
        POW10[i] = POW10[i - 1] * 10
    return 0
_init_pow10()


cdef int decimal_store(ColBuf* col, Py_ssize_t idx, bint neg, int128_t unscaled) noexcept:
    if unscaled >= POW10[col.precision]:
        return F_OUT_OF_RANGE
    if neg:
        unscaled = -unscaled
    memcpy(col.data.data + idx * 16, &unscaled, 16)
    return 0


cdef int text_decimal(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i = 0, whole_start, whole_end, frac_start = 0, frac_len = 0, k
    cdef bint neg = False, overflow = False
    cdef int128_t v = 0
    cdef uint64_t u
    cdef int d
    if (n == 3 and memcmp(p, b"NaN", 3) == 0) or (n == 8 and memcmp(p, b"Infinity", 8) == 0) or \
            (n == 9 and memcmp(p, b"-Infinity", 9) == 0):
        return F_SPECIAL_DECIMAL
    if i < n and p[i] == 45:
        neg = True
        i += 1
    whole_start = i
    while i < n and is_digit(p[i]):
        i += 1
    whole_end = i
    if whole_end == whole_start:
        return F_INVALID
    if i < n and p[i] == 46:
        i += 1
        frac_start = i
        while i < n and is_digit(p[i]):
            i += 1
        frac_len = i - frac_start
        if frac_len == 0:
            return F_INVALID
    if i != n:
        return F_INVALID
    if frac_len > col.scale:
        return F_INVALID
    if whole_end - whole_start + col.scale <= 18:
        # at most 18 digits: the unscaled value fits an uint64, no 128-bit overflow check per digit
        u = 0
        for k in range(whole_start, whole_end):
            u = u * 10 + <uint64_t>(p[k] - 48)
        for k in range(frac_start, frac_start + frac_len):
            u = u * 10 + <uint64_t>(p[k] - 48)
        return decimal_store(col, idx, neg, <int128_t>(u * sw_pow10_u64[col.scale - frac_len]))
    for k in range(whole_start, whole_end + col.scale):
        if k < whole_end:
            d = p[k] - 48
        elif k - whole_end < frac_len:
            d = p[frac_start + k - whole_end] - 48
        else:
            d = 0
        if v > (POW10[38] - d) // 10:
            overflow = True
            break
        v = v * 10 + d
    if overflow:
        return F_OUT_OF_RANGE
    return decimal_store(col, idx, neg, v)


cdef int32_t days_from_civil(int64_t y, int64_t m, int64_t d, bint* overflow) noexcept nogil:
    cdef int64_t era, yoe, doy, doe, days
    if m <= 2:
        y -= 1
    # truncating division, as the algorithm is written for
    era = y // 400 if y >= 0 else -((399 - y) // 400)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    if days <= I32_MIN or days >= I32_MAX:
        overflow[0] = True
        return 0
    return <int32_t>days


cdef int fixed_digits(const char* p, Py_ssize_t n) noexcept nogil:
    """n decimal digits as int, -1 if any is not a digit."""
    cdef int v = 0
    cdef Py_ssize_t i
    for i in range(n):
        if not is_digit(p[i]):
            return -1
        v = v * 10 + (p[i] - 48)
    return v


cdef inline int two_digits(const char* p) noexcept nogil:
    """Two decimal digits as int, -1 if either is not a digit."""
    cdef int a = p[0] - 48, b = p[1] - 48
    if <unsigned int>a > 9 or <unsigned int>b > 9:
        return -1
    return a * 10 + b


cdef int parse_year(const char* p, Py_ssize_t n, bint bc, int64_t* year) noexcept nogil:
    """Year digits (already checked, at least 4): 0 ok, F_INVALID for year 0, F_OUT_OF_RANGE when huge."""
    cdef Py_ssize_t i = 0
    cdef int64_t y = 0
    if n == 4 and p[0] != 48:
        y = two_digits(p) * 100 + two_digits(p + 2)
        year[0] = 1 - y if bc else y
        return 0
    while i < n - 1 and p[i] == 48:
        i += 1
    if n - i > 9:
        return F_OUT_OF_RANGE
    digits_value(p + i, n - i, &y)
    if y == 0:
        return F_INVALID
    year[0] = 1 - y if bc else y
    return 0


cdef Py_ssize_t scan_digits(const char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and is_digit(p[i]):
        i += 1
    return i


cdef int text_date(const char* p, Py_ssize_t n, int32_t* out) noexcept nogil:
    cdef Py_ssize_t i, ye
    cdef int month, day, rc
    cdef bint bc = False, overflow = False
    cdef int64_t year = 0
    cdef int32_t days
    if n == 8 and memcmp(p, b"infinity", 8) == 0:
        out[0] = I32_MAX
        return 0
    if n == 9 and memcmp(p, b"-infinity", 9) == 0:
        out[0] = I32_MIN
        return 0
    ye = scan_digits(p, 0, n)
    if ye < 4 or (n - ye != 6 and n - ye != 9):
        return F_INVALID
    if p[ye] != 45 or p[ye + 3] != 45:
        return F_INVALID
    month = fixed_digits(p + ye + 1, 2)
    day = fixed_digits(p + ye + 4, 2)
    if month < 0 or day < 0:
        return F_INVALID
    if n - ye == 9:
        if memcmp(p + ye + 6, b" BC", 3) != 0:
            return F_INVALID
        bc = True
    if month < 1 or month > 12 or day < 1 or day > 31:
        return F_INVALID
    rc = parse_year(p, ye, bc, &year)
    if rc:
        return rc
    if year > 100000000 or year < -100000000:
        return F_OUT_OF_RANGE
    days = days_from_civil(year, month, day, &overflow)
    if overflow:
        return F_OUT_OF_RANGE
    out[0] = days
    return 0


cdef int text_timestamp(const char* p, Py_ssize_t n, bint with_tz, int64_t* out) noexcept nogil:
    cdef Py_ssize_t i, ye, fs, fe
    cdef int month, day, hour, minute, second, th = 0, tm = 0, ts = 0, rc
    cdef int f[6]
    cdef int year4 = -1               # the year when it was read with the rest of the fixed head
    cdef bint bc = False, overflow = False, has_tz = False, tz_neg = False
    cdef int64_t year = 0, offset = 0, frac = 0
    cdef int32_t days
    cdef int128_t us
    if n >= 19 and sw_stamp19(p, f):
        # the usual spelling, a four-digit year: the whole "YYYY-MM-DD HH:MM:SS" in a few word operations
        ye = 4
        year4, month, day, hour, minute, second = f[0], f[1], f[2], f[3], f[4], f[5]
    else:
        if n == 8 and memcmp(p, b"infinity", 8) == 0:
            out[0] = I64_MAX
            return 0
        if n == 9 and memcmp(p, b"-infinity", 9) == 0:
            out[0] = I64_MIN
            return 0
        ye = scan_digits(p, 0, n)
        if ye < 4 or n - ye < 15:
            return F_INVALID
        i = ye
        if p[i] != 45 or p[i + 3] != 45 or p[i + 6] != 32 or p[i + 9] != 58 or p[i + 12] != 58:
            return F_INVALID
        month = two_digits(p + i + 1)
        day = two_digits(p + i + 4)
        hour = two_digits(p + i + 7)
        minute = two_digits(p + i + 10)
        second = two_digits(p + i + 13)
        if (month | day | hour | minute | second) < 0:
            return F_INVALID
    i = ye + 15
    if i < n and p[i] == 46:
        # one pass over the fraction's digits: at most six (microseconds)
        fs = i + 1
        fe = fs
        while fe < n and is_digit(p[fe]):
            if fe - fs == 6:
                return F_INVALID
            frac = frac * 10 + (p[fe] - 48)
            fe += 1
        if fe == fs:
            return F_INVALID
        frac *= <int64_t>sw_pow10_u64[6 - (fe - fs)]
        i = fe
    if i < n and (p[i] == 43 or p[i] == 45):
        has_tz = True
        tz_neg = p[i] == 45
        if n - i < 3:
            return F_INVALID
        th = two_digits(p + i + 1)
        if th < 0:
            return F_INVALID
        i += 3
        if i < n and p[i] == 58:
            if n - i < 3:
                return F_INVALID
            tm = two_digits(p + i + 1)
            if tm < 0:
                return F_INVALID
            i += 3
            if i < n and p[i] == 58:
                if n - i < 3:
                    return F_INVALID
                ts = two_digits(p + i + 1)
                if ts < 0:
                    return F_INVALID
                i += 3
    if i < n:
        if n - i == 3 and memcmp(p + i, b" BC", 3) == 0:
            bc = True
        else:
            return F_INVALID
    if has_tz != with_tz:
        return F_INVALID
    if month < 1 or month > 12 or day < 1 or day > 31 or hour > 23 or minute > 59 or second > 59:
        return F_INVALID
    if with_tz:
        if th > 15 or tm > 59 or ts > 59:
            return F_INVALID
        offset = th * 3600 + tm * 60 + ts
        if tz_neg:
            offset = -offset
    if year4 > 0:
        year = 1 - year4 if bc else year4
    else:
        # other years, and year 0000 (refused there)
        rc = parse_year(p, ye, bc, &year)
        if rc:
            return rc
    if year > 100000000 or year < -100000000:
        return F_OUT_OF_RANGE
    days = days_from_civil(year, month, day, &overflow)
    if overflow:
        return F_OUT_OF_RANGE
    us = <int128_t>days * US_PER_DAY + (<int128_t>((hour * 60 + minute) * 60 + second) - offset) * 1000000 + frac
    if us <= I64_MIN or us >= I64_MAX:
        return F_OUT_OF_RANGE
    out[0] = <int64_t>us
    return 0


cdef int text_time(const char* p, Py_ssize_t n, int64_t* out) noexcept nogil:
    cdef int hour, minute, second
    cdef int64_t frac = 0, us
    cdef Py_ssize_t fe
    if n < 8 or p[2] != 58 or p[5] != 58:
        return F_INVALID
    hour = fixed_digits(p, 2)
    minute = fixed_digits(p + 3, 2)
    second = fixed_digits(p + 6, 2)
    if hour < 0 or minute < 0 or second < 0:
        return F_INVALID
    if n > 8:
        if p[8] != 46:
            return F_INVALID
        fe = scan_digits(p, 9, n)
        if fe != n or n - 9 < 1 or n - 9 > 6:
            return F_INVALID
        frac = fixed_digits(p + 9, n - 9)
        for _ in range(6 - (n - 9)):
            frac *= 10
    us = (<int64_t>(hour * 60 + minute) * 60 + second) * 1000000 + frac
    if minute > 59 or second > 59 or us > US_PER_DAY:
        return F_INVALID
    out[0] = us
    return 0


cdef int text_interval(const char* p, Py_ssize_t n, int32_t* months_out, int32_t* days_out,
                       int64_t* nanos_out) noexcept nogil:
    cdef Py_ssize_t i = 0, te, ue, k, ds, de
    cdef int128_t fields[3]
    cdef int128_t us = 0, v, months, nanos
    cdef bint seen_time = False, neg, overflow = False
    cdef int minute, second, unit
    cdef int64_t hours = 0, frac
    fields[0] = 0
    fields[1] = 0
    fields[2] = 0
    if n == 0:
        return F_INVALID
    while True:
        # one token: [i, te)
        te = i
        while te < n and p[te] != 32:
            te += 1
        if time_token(p + i, te - i):
            if seen_time or te != n:
                return F_INVALID
            seen_time = True
            k = i
            neg = False
            if p[k] == 43 or p[k] == 45:
                neg = p[k] == 45
                k += 1
            ds = k
            de = scan_digits(p, k, te)
            minute = fixed_digits(p + de + 1, 2)
            second = fixed_digits(p + de + 4, 2)
            if minute > 59 or second > 59:
                return F_INVALID
            frac = 0
            if de + 6 < te:         # '.' at de + 6, then 1 to 6 digits (time_token checked them)
                frac = fixed_digits(p + de + 7, te - de - 7)
                for _ in range(6 - (te - de - 7)):
                    frac *= 10
            if de - ds > 18:
                overflow = True
            else:
                digits_value(p + ds, de - ds, &hours)
                us = ((<int128_t>hours * 60 + minute) * 60 + second) * 1000000 + frac
                if neg:
                    us = -us
            break
        # a number then a unit
        k = i
        neg = False
        if k < te and (p[k] == 43 or p[k] == 45):
            neg = p[k] == 45
            k += 1
        if k == te or scan_digits(p, k, te) != te or te >= n:
            return F_INVALID
        ue = te + 1
        while ue < n and p[ue] != 32:
            ue += 1
        unit = interval_unit(p + te + 1, ue - te - 1)
        if unit < 0:
            return F_INVALID
        if te - k > 30:
            overflow = True
        else:
            v = 0
            for ds in range(k, te):
                v = v * 10 + (p[ds] - 48)
            fields[unit] += -v if neg else v
            if fields[unit] > <int128_t>I64_MAX * 4 or fields[unit] < <int128_t>I64_MIN * 4:
                overflow = True
        if ue >= n:
            break
        i = ue + 1
        if i >= n:
            return F_INVALID
    if overflow:
        return F_OUT_OF_RANGE
    months = fields[0] * 12 + fields[1]
    nanos = us * 1000
    if months < I32_MIN or months > I32_MAX or fields[2] < I32_MIN or fields[2] > I32_MAX \
            or nanos < I64_MIN or nanos > I64_MAX:
        return F_OUT_OF_RANGE
    months_out[0] = <int32_t>months
    days_out[0] = <int32_t>fields[2]
    nanos_out[0] = <int64_t>nanos
    return 0


cdef bint time_token(const char* p, Py_ssize_t n) noexcept nogil:
    """[-+]?digits:MM:SS(.f{1,6})?"""
    cdef Py_ssize_t i = 0, de
    if i < n and (p[i] == 43 or p[i] == 45):
        i += 1
    de = scan_digits(p, i, n)
    if de == i or n - de < 6 or p[de] != 58 or p[de + 3] != 58:
        return False
    if fixed_digits(p + de + 1, 2) < 0 or fixed_digits(p + de + 4, 2) < 0:
        return False
    if n - de == 6:
        return True
    if p[de + 6] != 46 or n - de - 7 < 1 or n - de - 7 > 6:
        return False
    return scan_digits(p, de + 7, n) == n


cdef int interval_unit(const char* p, Py_ssize_t n) noexcept nogil:
    if (n == 4 and memcmp(p, b"year", 4) == 0) or (n == 5 and memcmp(p, b"years", 5) == 0):
        return 0
    if (n == 3 and memcmp(p, b"mon", 3) == 0) or (n == 4 and memcmp(p, b"mons", 4) == 0):
        return 1
    if (n == 3 and memcmp(p, b"day", 3) == 0) or (n == 4 and memcmp(p, b"days", 4) == 0):
        return 2
    return -1


cdef inline int hex_value(char c) noexcept nogil:
    return sw_hex_value[<unsigned char>c]


cdef int text_uuid(const char* p, Py_ssize_t n, unsigned char* out) noexcept nogil:
    if n != 36 or p[8] != 45 or p[13] != 45 or p[18] != 45 or p[23] != 45:
        return F_INVALID
    # eight digits at a time on little-endian hosts (include/sw_hex.h)
    return F_INVALID if sw_uuid_text(p, out) else 0


cdef int text_bytea(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    cdef int rc
    cdef Py_ssize_t pos
    if not col.view:
        return text_bytea_into(col, &col.data, idx, p, n)
    # a view column: the decoded bytes go to the end of the arena, then become the value's view
    pos = (<int32_t*>col.offsets.data)[idx]
    rc = text_bytea_into(col, &col.arena, idx, p, n)
    if rc == 0:
        view_decoded(col, idx, (<int32_t*>col.offsets.data)[idx + 1] - pos)
    return rc


cdef int view_decoded(ColBuf* col, Py_ssize_t idx, Py_ssize_t k) except -1:
    """The `k` bytes just decoded at the arena's end (not yet counted in arena_len) as slot `idx`."""
    cdef char* v = col.data.data + idx * 16
    cdef int32_t len32 = <int32_t>k, buf = 0, at = <int32_t>col.arena_len
    if k <= 12:
        return view_store(col, idx, col.arena.data + col.arena_len, k)   # inline: the arena bytes stay unused
    memcpy(v, &len32, 4)
    memcpy(v + 4, col.arena.data + col.arena_len, 4)
    memcpy(v + 8, &buf, 4)
    memcpy(v + 12, &at, 4)
    col.arena_len += k
    return 0


cdef int text_bytea_into(ColBuf* col, Buf* out, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """Decode into `out` from the column's current length (plain: the data buffer) or, for a view column, from
    the arena's end (`out` is the arena); the offsets are updated either way."""
    global appended
    cdef int32_t* off = <int32_t*>col.offsets.data
    cdef Py_ssize_t pos = off[idx], i, k = 0
    cdef Py_ssize_t base = col.arena_len if col.view else pos
    cdef int hi, lo
    cdef unsigned char c
    if n >= 2 and p[0] == 92 and p[1] == 120:
        if (n - 2) % 2:
            return F_INVALID
        if base + (n - 2) // 2 > out.cap:
            buf_grow(out, base + (n - 2) // 2)
        i = 2
        while i < n:
            hi = hex_value(p[i])
            lo = hex_value(p[i + 1])
            if hi < 0 or lo < 0:
                return F_INVALID
            out.data[base + k] = <char>(hi * 16 + lo)
            k += 1
            i += 2
        if pos + k > OFFSET_LIMIT:
            return F_TOO_LARGE
        off[idx + 1] = <int32_t>(pos + k)
        appended += k
        return 0
    if base + n > out.cap:
        buf_grow(out, base + n)
    i = 0
    while i < n:
        c = <unsigned char>p[i]
        if c != 92:
            out.data[base + k] = <char>c
            k += 1
            i += 1
        elif i + 1 < n and p[i + 1] == 92:
            out.data[base + k] = 92
            k += 1
            i += 2
        elif i + 3 < n and 48 <= p[i + 1] <= 51 and 48 <= p[i + 2] <= 55 and 48 <= p[i + 3] <= 55:
            out.data[base + k] = <char>((p[i + 1] - 48) * 64 + (p[i + 2] - 48) * 8 + (p[i + 3] - 48))
            k += 1
            i += 4
        else:
            return F_INVALID
    if pos + k > OFFSET_LIMIT:    # the escape form never grows, so only the result is checked
        return F_TOO_LARGE
    off[idx + 1] = <int32_t>(pos + k)
    appended += k
    return 0


cdef int text_array(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, int order) except -1:
    cdef ColBuf* child = col.child
    cdef int32_t* off = <int32_t*>col.offsets.data
    cdef Py_ssize_t i = 0, start, j, count = off[idx], close, q
    cdef int rc
    cdef char* tmp
    cdef Py_ssize_t tlen
    cdef bint shifted = False     # a lower bound other than 1: a list cannot keep it
    if n > 0 and p[0] == 91:  # [lb:ub]= decoration
        close = -1
        for j in range(n):
            if p[j] == 93:
                close = j
                break
        if close < 0:
            return F_INVALID
        if close + 1 < n and p[close + 1] == 91:
            return F_MULTIDIMENSIONAL
        if not bounds_decoration(p, close + 2, n):
            return F_INVALID
        shifted = not (p[1] == 49 and p[2] == 58)
        i = close + 2
    if i >= n or p[i] != 123:
        return F_INVALID
    i += 1
    if i < n and p[i] == 125:
        if i + 1 != n:
            return F_INVALID
        if shifted:
            return F_LOWER_BOUND
        off[idx + 1] = <int32_t>count
        return 0
    while True:
        if i >= n:
            return F_INVALID
        if p[i] == 123:
            return F_MULTIDIMENSIONAL
        if count + 1 > OFFSET_LIMIT:
            return F_TOO_LARGE
        col_reserve(child, count + 1)
        if p[i] == 34:  # quoted
            i += 1
            start = i
            q = 0               # backslashes seen
            while True:
                if i >= n:
                    return F_INVALID
                if p[i] == 92:
                    if i + 1 >= n:
                        return F_INVALID
                    q += 1
                    i += 2
                elif p[i] == 34:
                    break
                else:
                    i += 1
            if q == 0:
                rc = decode_value(child, count, 0x74, p + start, i - start, order)
            else:
                tmp = <char*>malloc(i - start)
                if tmp == NULL:
                    raise MemoryError()
                tlen = 0
                j = start
                while j < i:
                    if p[j] == 92:
                        j += 1
                    tmp[tlen] = p[j]
                    tlen += 1
                    j += 1
                try:
                    rc = decode_value(child, count, 0x74, tmp, tlen, order)
                finally:
                    free(tmp)
            i += 1
        else:
            start = i
            while i < n and p[i] != 44 and p[i] != 125 and p[i] != 123 and p[i] != 34 and p[i] != 92:
                i += 1
            if i == start or (i < n and (p[i] == 123 or p[i] == 34 or p[i] == 92)):
                return F_INVALID
            if i - start == 4 and (p[start] | 32) == 110 and (p[start + 1] | 32) == 117 and \
                    (p[start + 2] | 32) == 108 and (p[start + 3] | 32) == 108:
                set_valid(child, count)
                set_null(child, count)
                rc = 0
            else:
                rc = decode_value(child, count, 0x74, p + start, i - start, order)
        if rc:
            return rc
        count += 1
        if i >= n:
            return F_INVALID
        if p[i] == 44:
            i += 1
            continue
        if p[i] == 125 and i + 1 == n:
            if shifted:
                return F_LOWER_BOUND
            off[idx + 1] = <int32_t>count
            return 0
        return F_INVALID


cdef bint bounds_decoration(const char* p, Py_ssize_t end, Py_ssize_t n) noexcept nogil:
    """p[0:end] is [-?digits:-?digits]= exactly."""
    cdef Py_ssize_t i = 1, s
    if end > n or end < 6 or p[end - 1] != 61 or p[end - 2] != 93:
        return False
    if p[i] == 45:
        i += 1
    s = i
    i = scan_digits(p, i, end)
    if i == s or p[i] != 58:
        return False
    i += 1
    if p[i] == 45:
        i += 1
    s = i
    i = scan_digits(p, i, end)
    return i > s and i == end - 2


cdef int binary_array(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, int order) except -1:
    cdef ColBuf* child = col.child
    cdef int32_t* off = <int32_t*>col.offsets.data
    cdef Py_ssize_t count = off[idx], pos
    cdef int32_t ndim, flags, nelem, length, k
    cdef int rc
    if n < 12:
        return F_INVALID
    ndim = sw_load_i32(p)
    flags = sw_load_i32(p + 4)
    if (flags != 0 and flags != 1) or ndim < 0:
        return F_INVALID
    if ndim == 0:
        if n != 12:
            return F_INVALID
        off[idx + 1] = <int32_t>count
        return 0
    if ndim > 1:
        return F_MULTIDIMENSIONAL
    if n < 20:
        return F_INVALID
    nelem = sw_load_i32(p + 12)
    if nelem < 0 or nelem > (n - 20) // 4:
        return F_INVALID
    pos = 20
    for k in range(nelem):
        if n - pos < 4:
            return F_INVALID
        length = sw_load_i32(p + pos)
        pos += 4
        if count + 1 > OFFSET_LIMIT:
            return F_TOO_LARGE
        col_reserve(child, count + 1)
        if length == -1:
            set_null(child, count)
            count += 1
            continue
        if length < 0 or n - pos < length:
            return F_INVALID
        rc = decode_value(child, count, 0x62, p + pos, length, order)
        if rc:
            return rc
        pos += length
        count += 1
    if pos != n:
        return F_INVALID
    if sw_load_i32(p + 16) != 1:
        return F_LOWER_BOUND
    off[idx + 1] = <int32_t>count
    return 0


cdef int binary_decimal(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) noexcept:
    cdef int16_t ndigits, weight
    cdef uint16_t sign, dscale
    cdef int k, d, e, top, low
    cdef int128_t v = 0
    cdef uint64_t u = 0
    cdef int rc = numeric_header(p, n, &ndigits, &weight, &sign, &dscale)
    if rc:
        return rc
    if sign == 0xC000 or sign == 0xD000 or sign == 0xF000:
        return F_SPECIAL_DECIMAL
    if ndigits <= 9:
        # up to 36 significant digits fit in 128 bits; the same rules as the digit walk below
        e = 4 * (weight - ndigits + 1) + col.scale
        if ndigits <= 4:
            # up to 16 significant digits: 64-bit arithmetic, no 128-bit division where the exponent allows
            for k in range(ndigits):
                u = u * 10000 + sw_load_u16(p + 8 + 2 * k)
            if 0 <= e <= 22:
                # u < 10**16, so u * 10**e < 10**38: never out of range
                return decimal_store(col, idx, sign == 0x4000, <int128_t>u * POW10[e])
            if -18 <= e < 0:
                if u % sw_pow10_u64[-e] != 0:
                    return F_INVALID
                return decimal_store(col, idx, sign == 0x4000, <int128_t>(u // sw_pow10_u64[-e]))
            v = u
        else:
            for k in range(ndigits):
                v = v * 10000 + sw_load_u16(p + 8 + 2 * k)
        if e >= 0:
            if v != 0 and (e > 38 or v > POW10[38] // POW10[e]):
                return F_OUT_OF_RANGE
            if v != 0:
                v = v * POW10[e]
        elif v != 0:
            if -e > 38:
                return F_INVALID
            if v % POW10[-e] != 0:
                return F_INVALID
            v = v // POW10[-e]
        return decimal_store(col, idx, sign == 0x4000, v)
    # decimal digit at exponent e: group g = weight - floor(e / 4) ... walk from the top exponent down
    top = 4 * weight + 3
    low = -col.scale
    # digits below the scale must be zero
    for k in range(ndigits):
        d = sw_load_u16(p + 8 + 2 * k)
        # group k covers exponents 4*(weight-k) .. 4*(weight-k)+3
        for e in range(4 * (weight - k), 4 * (weight - k) + 4):
            if e < low and digit_at(d, e - 4 * (weight - k)) != 0:
                return F_INVALID
    for e in range(top, low - 1, -1):
        k = weight - floor_div4(e)
        d = 0
        if 0 <= k < ndigits:
            d = digit_at(sw_load_u16(p + 8 + 2 * k), e - 4 * (weight - k))
        if v > (POW10[38] - d) // 10:
            return F_OUT_OF_RANGE
        v = v * 10 + d
    return decimal_store(col, idx, sign == 0x4000, v)


cdef inline int floor_div4(int e) noexcept nogil:
    return e >> 2 if e >= 0 else -((-e + 3) >> 2)


cdef inline int digit_at(int group, int pos) noexcept nogil:
    """Decimal digit `pos` (0 = units) of a base-10000 group."""
    if pos == 0:
        return group % 10
    if pos == 1:
        return group // 10 % 10
    if pos == 2:
        return group // 100 % 10
    return group // 1000


cdef inline int numeric_header(const char* p, Py_ssize_t n, int16_t* ndigits, int16_t* weight, uint16_t* sign,
                        uint16_t* dscale) noexcept nogil:
    cdef int k, d
    if n < 8:
        return F_INVALID
    ndigits[0] = <int16_t>sw_load_u16(p)
    weight[0] = <int16_t>sw_load_u16(p + 2)
    sign[0] = sw_load_u16(p + 4)
    dscale[0] = sw_load_u16(p + 6)
    if ndigits[0] < 0 or n != 8 + 2 * ndigits[0] or not (sign[0] == 0 or sign[0] == 0x4000 or sign[0] == 0xC000
                                                          or sign[0] == 0xD000 or sign[0] == 0xF000) \
            or dscale[0] > 0x3FFF:
        return F_INVALID
    for k in range(ndigits[0]):
        d = <int16_t>sw_load_u16(p + 8 + 2 * k)
        if d < 0 or d > 9999:
            return F_INVALID
    return 0


cdef int binary_numeric_text(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """PostgreSQL's numeric_out text of a binary numeric value (the digits printed by sw_numeric_out)."""
    cdef int16_t ndigits, weight
    cdef uint16_t sign, dscale
    cdef int rc = numeric_header(p, n, &ndigits, &weight, &sign, &dscale)
    cdef sw_out text
    if rc:
        return rc
    if sign == 0xC000:
        return var_append(col, idx, b"NaN", 3)
    if sign == 0xD000:
        return var_append(col, idx, b"Infinity", 8)
    if sign == 0xF000:
        return var_append(col, idx, b"-Infinity", 9)
    text.data = NULL
    text.len = text.cap = 0
    try:
        if sw_numeric_out(&text, sign == 0x4000, weight, dscale, ndigits, <const unsigned char*>p + 8, 1):
            raise MemoryError()
        return var_append(col, idx, <const char*>text.data, text.len)
    finally:
        free(text.data)


cdef int timetz_text(ColBuf* col, Py_ssize_t idx, int64_t us, int32_t zone) except -1:
    cdef char s[64]
    cdef int length, k
    cdef int64_t sec = us // 1000000, frac = us % 1000000
    cdef int tz = -zone, h, m, z
    length = snprintf(s, 64, b"%02d:%02d:%02d", <int>(sec // 3600), <int>(sec // 60 % 60), <int>(sec % 60))
    if frac:
        length += snprintf(s + length, 64 - length, b".%06d", <int>frac)
        while s[length - 1] == 48:
            length -= 1
    z = -tz if tz < 0 else tz
    h = z // 3600
    m = z // 60 % 60
    k = z % 60
    if k:
        length += snprintf(s + length, 64 - length, b"%c%02d:%02d:%02d", <int>(45 if tz < 0 else 43), h, m, k)
    elif m:
        length += snprintf(s + length, 64 - length, b"%c%02d:%02d", <int>(45 if tz < 0 else 43), h, m)
    else:
        length += snprintf(s + length, 64 - length, b"%c%02d", <int>(45 if tz < 0 else 43), h)
    return var_append(col, idx, s, length)


cdef int char_text(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """PostgreSQL's charout text of a "char" value (one byte in the binary and internal forms)."""
    cdef unsigned char b
    cdef char s[4]
    if n != 1:
        return F_INVALID
    b = <unsigned char>p[0]
    if b >= 0x80:
        s[0] = 92
        s[1] = <char>(48 + (b >> 6))
        s[2] = <char>(48 + ((b >> 3) & 7))
        s[3] = <char>(48 + (b & 7))
        return var_append(col, idx, s, 4)
    return var_append(col, idx, p, 1 if b else 0)


cdef inline int pg_days(int32_t days, int32_t* out) noexcept nogil:
    cdef int64_t v
    if days == I32_MAX or days == I32_MIN:
        out[0] = days
        return 0
    v = <int64_t>days + UNIX_DAYS_2000
    if v <= I32_MIN or v >= I32_MAX:
        return F_OUT_OF_RANGE
    out[0] = <int32_t>v
    return 0


cdef inline int pg_us(int64_t us, int64_t* out) noexcept nogil:
    if us == I64_MAX or us == I64_MIN:
        out[0] = us
        return 0
    if us >= I64_MAX - UNIX_US_2000:
        return F_OUT_OF_RANGE
    out[0] = us + UNIX_US_2000
    return 0


cdef inline int utf8_text(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    if not sw_utf8_valid(<const unsigned char*>p, n):
        return F_INVALID_UTF8
    return var_append(col, idx, p, n)


cdef inline uint64_t load_host(const char* p, int size, int big_endian) noexcept nogil:
    """An unsigned integer of `size` bytes in the server's byte order."""
    cdef uint64_t v = 0
    cdef int k
    if big_endian:
        for k in range(size):
            v = (v << 8) | <unsigned char>p[k]
    else:
        for k in range(size - 1, -1, -1):
            v = (v << 8) | <unsigned char>p[k]
    return v


_INTERVAL_FIELDS = (8, 4, 4)
_TIMETZ_FIELDS = (8, 4)
_ACLITEM_FIELDS = {12: (4, 4, 4), 16: (4, 4, 8)}


cdef int swap_fields(const char* p, Py_ssize_t n, object fields, int order, char* out) except -1:
    """A fixed-length internal datum with its integer fields in big-endian order (the send form's) into `out`."""
    cdef Py_ssize_t pos = 0, total = 0, k
    cdef int size
    for size in fields:
        total += size
    if n != total:
        return F_INVALID
    for size in fields:
        for k in range(size):
            out[pos + k] = p[pos + k] if order == 1 else p[pos + size - 1 - k]
        pos += size
    return 0


cdef int numeric_send_form(const unsigned char* d, long long n, int order, char** out, Py_ssize_t* outlen) \
        except -1:
    """numeric's send form from the data of its internal varlena (spockwire.values.internal.numeric_send)."""
    cdef uint16_t head, sign, dscale
    cdef int weight
    cdef long long start, count, k
    cdef char* s
    if n < 2 or n % 2:
        return F_INVALID
    head = <uint16_t>load_host(<const char*>d, 2, order)
    if head & 0x8000:
        if (head & 0xC000) == 0xC000:
            if not (head == 0xC000 or head == 0xD000 or head == 0xF000) or n != 2:
                return F_INVALID
            sign, dscale, weight, start = head, 0, 0, 2
        else:
            sign = 0x4000 if head & 0x2000 else 0
            dscale = (head & 0x1F80) >> 7
            weight = (head & 0x003F) - (64 if head & 0x0040 else 0)
            start = 2
    else:
        if n < 4:
            return F_INVALID
        sign, dscale = head & 0xC000, head & 0x3FFF
        weight = <int16_t>load_host(<const char*>d + 2, 2, order)
        start = 4
    count = (n - start) // 2
    if count > 0x7FFF:
        return F_INVALID
    s = <char*>malloc(8 + 2 * count)
    if s == NULL:
        raise MemoryError()
    s[0], s[1] = <char>(count >> 8), <char>(count & 0xFF)
    s[2], s[3] = <char>((weight >> 8) & 0xFF), <char>(weight & 0xFF)
    s[4], s[5] = <char>(sign >> 8), <char>(sign & 0xFF)
    s[6], s[7] = <char>(dscale >> 8), <char>(dscale & 0xFF)
    for k in range(count):
        s[8 + 2 * k] = <char>d[start + 2 * k + (0 if order == 1 else 1)]
        s[9 + 2 * k] = <char>d[start + 2 * k + (1 if order == 1 else 0)]
    out[0] = s
    outlen[0] = 8 + 2 * count
    return 0


cdef int internal_varlena(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, int order) except -1:
    """A varlena internal datum (text-like, bytea, numeric, and the varlena types kept as text): its data, inline
    compressed data decompressed (include/sw_varlena.h), turned into the send form and decoded from there."""
    cdef const unsigned char* data = NULL
    cdef long long length = 0
    cdef unsigned char* owned = NULL
    cdef char* send = NULL
    cdef Py_ssize_t sendlen = 0
    cdef int kind = col.kind, rc
    cdef bytes converted
    cdef sw_out layout
    rc = sw_varlena(<const unsigned char*>p, n, order, &data, &length, &owned)
    if rc == SW_VL_NOMEM:
        raise MemoryError()
    if rc:
        return rc
    layout.data = NULL
    layout.len = layout.cap = 0
    try:
        if kind == K_JSONB or (kind == K_PGTEXT and col.type_oid in LAYOUT_TYPES):
            # jsonb, tsvector, tsquery, jsonpath: the layout turned into the send form (include/sw_internal_types.h)
            rc = layout_send_form(3802 if kind == K_JSONB else col.type_oid, data, length, order, &layout)
            if rc:
                return rc
            if kind == K_PGTEXT:
                return render_text(col, idx, <const char*>layout.data, layout.len)
            return decode_value(col, idx, 0x62, <const char*>layout.data, layout.len, order)
        if kind == K_DECIMAL or kind == K_NUMERIC_TEXT:
            rc = numeric_send_form(data, length, order, &send, &sendlen)
            if rc:
                return rc
            return decode_value(col, idx, 0x62, send, sendlen, order)
        if kind == K_PGTEXT:
            if col.type_oid in VARLENA_TEXT_TYPES:
                return render_text(col, idx, <const char*>data, length)
            try:
                converted = converted_send_form(col.type_oid, PyBytes_FromStringAndSize(<const char*>data, length),
                                                order == 1)
            except ValueFailure as failure:
                return failure.code
            return render_text(col, idx, converted, len(converted))
        return decode_value(col, idx, 0x62, <const char*>data, length, order)
    finally:
        free(send)
        free(owned)
        free(layout.data)


cdef int layout_send_form(uint32_t oid, const unsigned char* data, long long length, int order, sw_out* out) \
        except -1:
    """The send form of a jsonb, tsvector, tsquery or jsonpath datum's data into `out`; 0 or LAYOUT_INVALID."""
    cdef int rc
    if oid == 3802:
        rc = sw_jsonb_send(data, length, order, out)
    elif oid == 3614:
        rc = sw_tsvector_send(data, length, order, out)
    elif oid == 3615:
        rc = sw_tsquery_send(data, length, order, out)
    else:
        rc = sw_jsonpath_send(data, length, order, out)
    if rc == SW_VL_NOMEM:
        raise MemoryError()
    return rc


cdef int internal_value(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, int order) except -1:
    """The 'i' form (spockwire.values.internal): by-value types in the server's announced byte order, fixed-length
    types through their send form, varlena datums (inline-compressed too) through internal_varlena."""
    cdef int kind = col.kind, size
    cdef uint64_t raw
    cdef char* slot = col.data.data + idx * col.width if col.width else NULL
    cdef int32_t d32
    cdef int64_t d64
    cdef float f4
    cdef double f8
    cdef char swapped[32]
    cdef int rc
    if kind == K_PGTEXT:
        # a column kept as text: PostgreSQL's text of the datum, through the type's send form
        oid = col.type_oid
        if oid == ACLITEM_OID and col.render != NULL:
            # grantee, grantor, privileges (32-bit up to PostgreSQL 15, 64-bit after), rendered with role names
            if order < 0:
                return F_BYTE_ORDER_UNKNOWN
            if n != 12 and n != 16:
                return F_INVALID
            rc = swap_fields(p, n, _ACLITEM_FIELDS[n], order, swapped)
            if rc:
                return rc
            return render_text(col, idx, swapped, n)
        fields = FIXED_FIELDS.get(oid)
        if (fields is None and oid not in VARLENA_TEXT_TYPES and oid not in VARLENA_CONVERTED) or oid == 19 \
                or col.render == NULL:
            return F_INTERNAL_UNSUPPORTED
        if order < 0 and (fields is None or any(f != 1 for f in fields)):
            return F_BYTE_ORDER_UNKNOWN
        if fields is None:
            return internal_varlena(col, idx, p, n, order)
        if n > 32:
            return F_INVALID
        rc = swap_fields(p, n, fields, order, swapped)
        if rc:
            return rc
        return render_text(col, idx, swapped, n)
    if kind == K_TEXT or kind == K_JSON or kind == K_JSONB or kind == K_BYTEA or kind == K_DECIMAL \
            or kind == K_NUMERIC_TEXT or kind == K_INTERVAL or kind == K_TIMETZ:
        if order < 0:
            return F_BYTE_ORDER_UNKNOWN
        if kind == K_INTERVAL or kind == K_TIMETZ:
            rc = swap_fields(p, n, _INTERVAL_FIELDS if kind == K_INTERVAL else _TIMETZ_FIELDS, order, swapped)
            if rc:
                return rc
            return decode_value(col, idx, 0x62, swapped, n, order)
        return internal_varlena(col, idx, p, n, order)
    if kind == K_UUID:
        if n != 16:
            return F_INVALID
        memcpy(slot, p, 16)
        return 0
    if kind == K_CHAR:
        return char_text(col, idx, p, n)
    if kind == K_BOOL:
        size = 1
    elif kind == K_INT2:
        size = 2
    elif kind == K_INT4 or kind == K_OID or kind == K_FLOAT4 or kind == K_DATE:
        size = 4
    elif kind == K_INT8 or kind == K_FLOAT8 or kind == K_TIMESTAMP or kind == K_TIMESTAMPTZ or kind == K_TIME:
        size = 8
    else:
        return F_INTERNAL_UNSUPPORTED
    if order < 0:
        return F_BYTE_ORDER_UNKNOWN
    if n != size:
        return F_INVALID
    raw = load_host(p, size, order)
    if kind == K_BOOL:
        if raw > 1:
            return F_INVALID
        if raw:
            col.data.data[idx >> 3] |= <char>(1 << (idx & 7))
        else:
            col.data.data[idx >> 3] &= <char>~(1 << (idx & 7))
        return 0
    if kind == K_INT2:
        (<int16_t*>slot)[0] = <int16_t>raw
    elif kind == K_INT4 or kind == K_OID:
        (<uint32_t*>slot)[0] = <uint32_t>raw
    elif kind == K_INT8:
        (<uint64_t*>slot)[0] = raw
    elif kind == K_FLOAT4:
        d32 = <int32_t>raw
        memcpy(&f4, &d32, 4)
        (<float*>slot)[0] = f4
    elif kind == K_FLOAT8:
        memcpy(&f8, &raw, 8)
        (<double*>slot)[0] = f8
    elif kind == K_DATE:
        if pg_days(<int32_t>raw, <int32_t*>slot):
            return F_OUT_OF_RANGE
    elif kind == K_TIME:
        d64 = <int64_t>raw
        if d64 < 0 or d64 > US_PER_DAY:
            return F_INVALID
        (<int64_t*>slot)[0] = d64
    else:
        if pg_us(<int64_t>raw, <int64_t*>slot):
            return F_OUT_OF_RANGE
    return 0


cdef inline Py_ssize_t fixed_binary_size(int kind) noexcept nogil:
    """Bytes of a binary value of a fixed-width kind (fixed_binary's kinds), 0 for any other kind."""
    if kind == K_INT8 or kind == K_FLOAT8 or kind == K_TIMESTAMP or kind == K_TIMESTAMPTZ:
        return 8
    if kind == K_INT4 or kind == K_OID or kind == K_FLOAT4 or kind == K_DATE:
        return 4
    if kind == K_INT2:
        return 2
    if kind == K_UUID:
        return 16
    return 0


cdef inline bint fixed_binary(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) noexcept:
    """A binary value of a fixed-width kind stored in its slot, with no kernel call: True when stored. False leaves
    it to decode_value: another kind, a wrong length, or a date or timestamp Arrow cannot hold (it reports them)."""
    cdef int kind = col.kind
    cdef char* slot
    if col.width == 0:
        return False        # a variable-width or bit column, whose data may not be allocated yet
    slot = col.data.data + idx * col.width
    if kind == K_INT8 or kind == K_FLOAT8:
        if n != 8:
            return False
        (<uint64_t*>slot)[0] = sw_load_u64(p)
    elif kind == K_INT4 or kind == K_OID or kind == K_FLOAT4:
        if n != 4:
            return False
        (<uint32_t*>slot)[0] = sw_load_u32(p)
    elif kind == K_TIMESTAMPTZ or kind == K_TIMESTAMP:
        if n != 8 or pg_us(sw_load_i64(p), <int64_t*>slot):
            return False
    elif kind == K_UUID:
        if n != 16:
            return False
        memcpy(slot, p, 16)
    elif kind == K_INT2:
        if n != 2:
            return False
        (<int16_t*>slot)[0] = <int16_t>sw_load_u16(p)
    elif kind == K_DATE:
        if n != 4 or pg_days(sw_load_i32(p), <int32_t*>slot):
            return False
    else:
        return False
    set_valid(col, idx)
    return True


cdef int decode_value(ColBuf* col, Py_ssize_t idx, int fmt, const char* p, Py_ssize_t n, int order) except -1:
    """Decode one non-NULL value into slot `idx` of a typed column; 0 or a failure code."""
    cdef int kind = col.kind, rc = 0
    cdef char* slot = col.data.data + idx * col.width if col.width else NULL
    cdef int64_t v64
    cdef int32_t v32, months, days
    cdef double f8
    cdef int64_t nanos
    set_valid(col, idx)
    if fmt == 0x69:
        return internal_value(col, idx, p, n, order)
    if fmt == 0x62:
        if kind == K_TEXT or kind == K_JSON or kind == K_ENUM:
            return utf8_text(col, idx, p, n)
        if kind == K_CHAR:
            return char_text(col, idx, p, n)
        if kind == K_INT2 or kind == K_INT4 or kind == K_OID or kind == K_INT8 or kind == K_FLOAT4 \
                or kind == K_FLOAT8 or kind == K_UUID or kind == K_DATE or kind == K_TIMESTAMP \
                or kind == K_TIMESTAMPTZ:
            if fixed_binary(col, idx, p, n):
                return 0
            # a wrong length, or a date or timestamp out of Arrow's range
            return F_INVALID if n != fixed_binary_size(kind) else F_OUT_OF_RANGE
        elif kind == K_BOOL:
            if n != 1 or <unsigned char>p[0] > 1:
                return F_INVALID
            if p[0]:
                col.data.data[idx >> 3] |= <char>(1 << (idx & 7))
            else:
                col.data.data[idx >> 3] &= <char>~(1 << (idx & 7))
        elif kind == K_DECIMAL:
            return binary_decimal(col, idx, p, n)
        elif kind == K_NUMERIC_TEXT:
            return binary_numeric_text(col, idx, p, n)
        elif kind == K_JSONB:
            if n < 1 or p[0] != 1:
                return F_INVALID
            return utf8_text(col, idx, p + 1, n - 1)
        elif kind == K_BYTEA:
            return var_append(col, idx, p, n)
        elif kind == K_TIME:
            if n != 8:
                return F_INVALID
            v64 = sw_load_i64(p)
            if v64 < 0 or v64 > US_PER_DAY:
                return F_INVALID
            (<int64_t*>slot)[0] = v64
        elif kind == K_TIMETZ:
            if n != 12:
                return F_INVALID
            v64 = sw_load_i64(p)
            v32 = sw_load_i32(p + 8)
            if v64 < 0 or v64 > US_PER_DAY or v32 < -(15 * 3600 + 59 * 60 + 59) or v32 > 15 * 3600 + 59 * 60 + 59:
                return F_INVALID
            return timetz_text(col, idx, v64, v32)
        elif kind == K_INTERVAL:
            if n != 16:
                return F_INVALID
            v64 = sw_load_i64(p)
            days = sw_load_i32(p + 8)
            months = sw_load_i32(p + 12)
            if v64 > I64_MAX // 1000 or v64 < I64_MIN // 1000:
                return F_OUT_OF_RANGE
            nanos = v64 * 1000
            memcpy(slot, &months, 4)
            memcpy(slot + 4, &days, 4)
            memcpy(slot + 8, &nanos, 8)
        elif kind == K_ARRAY:
            return binary_array(col, idx, p, n, order)
        elif kind == K_PGTEXT and col.render != NULL:
            return render_text(col, idx, p, n)
        else:
            return F_INVALID
        return 0
    # text form
    if kind == K_TEXT or kind == K_JSON or kind == K_JSONB or kind == K_ENUM or kind == K_NUMERIC_TEXT \
            or kind == K_TIMETZ or kind == K_CHAR or kind == K_PGTEXT:
        return utf8_text(col, idx, p, n)
    if kind == K_INT2:
        rc = text_int(p, n, -32768, 32767, &v64)
        if rc == 0:
            (<int16_t*>slot)[0] = <int16_t>v64
    elif kind == K_INT4:
        rc = text_int(p, n, I32_MIN, I32_MAX, &v64)
        if rc == 0:
            (<int32_t*>slot)[0] = <int32_t>v64
    elif kind == K_INT8:
        rc = text_int(p, n, I64_MIN, I64_MAX, &v64)
        if rc == 0:
            (<int64_t*>slot)[0] = v64
    elif kind == K_OID:
        rc = text_int(p, n, 0, 0xFFFFFFFF, &v64)
        if rc == 0:
            (<uint32_t*>slot)[0] = <uint32_t>v64
    elif kind == K_BOOL:
        if n == 1 and p[0] == 116:
            col.data.data[idx >> 3] |= <char>(1 << (idx & 7))
        elif n == 1 and p[0] == 102:
            col.data.data[idx >> 3] &= <char>~(1 << (idx & 7))
        else:
            rc = F_INVALID
    elif kind == K_FLOAT4:
        rc = text_float(p, n, &f8)
        if rc == 0:
            (<float*>slot)[0] = <float>f8
    elif kind == K_FLOAT8:
        rc = text_float(p, n, &f8)
        if rc == 0:
            (<double*>slot)[0] = f8
    elif kind == K_DECIMAL:
        rc = text_decimal(col, idx, p, n)
    elif kind == K_BYTEA:
        rc = text_bytea(col, idx, p, n)
    elif kind == K_DATE:
        rc = text_date(p, n, <int32_t*>slot)
    elif kind == K_TIMESTAMP:
        rc = text_timestamp(p, n, False, <int64_t*>slot)
    elif kind == K_TIMESTAMPTZ:
        rc = text_timestamp(p, n, True, <int64_t*>slot)
    elif kind == K_TIME:
        rc = text_time(p, n, <int64_t*>slot)
    elif kind == K_INTERVAL:
        rc = text_interval(p, n, &months, &days, &nanos)
        if rc == 0:
            memcpy(slot, &months, 4)
            memcpy(slot + 4, &days, 4)
            memcpy(slot + 8, &nanos, 8)
    elif kind == K_UUID:
        rc = text_uuid(p, n, <unsigned char*>slot)
    elif kind == K_ARRAY:
        rc = text_array(col, idx, p, n, order)
    else:
        rc = F_INVALID
    return rc


# ------------------------------------------------------------------ types kept as text: native renderers
# The common ones render here; every other PGTEXT type calls the column's Python renderer (render_text). Both
# produce exactly spockwire.values.sendtext's text and refuse the same bytes (tests/test_typed_values.py,
# tests/test_sendtext.py).
cdef enum:
    NOT_NATIVE = 1000

cdef char* HEX_DIGITS = b"0123456789abcdef"


cdef int render_mac(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, Py_ssize_t size) except -1:
    cdef char s[24]
    cdef Py_ssize_t k, o = 0
    cdef unsigned char b
    if n != size:
        return F_INVALID
    for k in range(size):
        b = <unsigned char>p[k]
        if k:
            s[o] = 58
            o += 1
        s[o] = HEX_DIGITS[b >> 4]
        s[o + 1] = HEX_DIGITS[b & 15]
        o += 2
    return var_append(col, idx, s, o)


cdef int render_inet(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, bint cidr) except -1:
    cdef char s[64]
    cdef int o = 0, k, maxbits, size, best_base = -1, best_len = 0, cur_base = -1, cur_len = 0
    cdef unsigned char family, bits, nb
    cdef const unsigned char* a = <const unsigned char*>p + 4
    cdef uint16_t words[8]
    if n < 4:
        return F_INVALID
    family = <unsigned char>p[0]
    bits = <unsigned char>p[1]
    nb = <unsigned char>p[3]
    if family == 2:
        maxbits, size = 32, 4
    elif family == 3:
        maxbits, size = 128, 16
    else:
        return F_INVALID
    if bits > maxbits or nb != size or n != 4 + size:
        return F_INVALID
    if family == 2:
        o = snprintf(s, 64, b"%u.%u.%u.%u", a[0], a[1], a[2], a[3])
    else:
        for k in range(8):
            words[k] = (<uint16_t>a[2 * k] << 8) | a[2 * k + 1]
        for k in range(8):
            if words[k] == 0:
                if cur_base < 0:
                    cur_base, cur_len = k, 1
                else:
                    cur_len += 1
            else:
                if cur_base >= 0 and (best_base < 0 or cur_len > best_len):
                    best_base, best_len = cur_base, cur_len
                cur_base = -1
        if cur_base >= 0 and (best_base < 0 or cur_len > best_len):
            best_base, best_len = cur_base, cur_len
        if best_base >= 0 and best_len < 2:
            best_base = -1
        k = 0
        while k < 8:
            if best_base >= 0 and best_base <= k < best_base + best_len:
                if k == best_base:
                    s[o] = 58
                    o += 1
                k += 1
                continue
            if k:
                s[o] = 58
                o += 1
            if k == 6 and best_base == 0 and (best_len == 6 or (best_len == 7 and words[7] != 1)
                                              or (best_len == 5 and words[5] == 0xFFFF)):
                o += snprintf(s + o, 64 - o, b"%u.%u.%u.%u", a[12], a[13], a[14], a[15])
                break
            o += snprintf(s + o, 64 - o, b"%x", <unsigned int>words[k])
            k += 1
        if best_base >= 0 and best_base + best_len == 8:
            s[o] = 58
            o += 1
    if cidr or bits != maxbits:
        o += snprintf(s + o, 64 - o, b"/%u", <unsigned int>bits)
    return var_append(col, idx, s, o)


cdef int render_money(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """cash_out as with lc_monetary=C: -$1,234.56"""
    cdef char digits[24]
    cdef char s[48]
    cdef int64_t v
    cdef uint64_t mag, units
    cdef int nd = 0, o = 0, k
    if n != 8:
        return F_INVALID
    v = sw_load_i64(p)
    mag = <uint64_t>(-(v + 1)) + 1 if v < 0 else <uint64_t>v
    units = mag // 100
    while True:
        digits[nd] = <char>(48 + units % 10)
        nd += 1
        units //= 10
        if units == 0:
            break
    if v < 0:
        s[o] = 45
        o += 1
    s[o] = 36
    o += 1
    for k in range(nd - 1, -1, -1):
        s[o] = digits[k]
        o += 1
        if k and k % 3 == 0:
            s[o] = 44
            o += 1
    o += snprintf(s + o, 48 - o, b".%02u", <unsigned int>(mag % 100))
    return var_append(col, idx, s, o)


cdef int render_bits(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    cdef int32_t nbits
    cdef Py_ssize_t k
    cdef bytes out
    cdef char* q
    if n < 4:
        return F_INVALID
    nbits = sw_load_i32(p)
    if nbits < 0 or n - 4 != (<Py_ssize_t>nbits + 7) // 8:
        return F_INVALID
    out = PyBytes_FromStringAndSize(NULL, nbits)
    q = out
    for k in range(nbits):
        q[k] = <char>(49 if (<unsigned char>p[4 + (k >> 3)]) & (0x80 >> (k & 7)) else 48)
    return var_append(col, idx, q, nbits)


cdef inline int64_t floor_div(int64_t a, int64_t b) noexcept nogil:
    cdef int64_t q = a // b
    if (a % b != 0) and ((a < 0) != (b < 0)):
        q -= 1
    return q


cdef int fmt_ymd(char* s, int cap, int64_t days, bint* bc) noexcept nogil:
    """YYYY-MM-DD of a day number since 2000-01-01 (PostgreSQL's j2date, floor arithmetic as in the twin)."""
    cdef int64_t julian = days + 2451545 + 32044, quad, extra, y, year, month, day
    quad = floor_div(julian, 146097)
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + floor_div(extra, 146097)
    quad = floor_div(julian, 1461)
    julian -= quad * 1461
    y = floor_div(julian * 4, 1461)
    if y != 0:
        julian = (julian + 305) - floor_div(julian + 305, 365) * 365 + 123
    else:
        julian = (julian + 306) - floor_div(julian + 306, 366) * 366 + 123
    y += quad * 4
    year = y - 4800
    quad = floor_div(julian * 2141, 65536)
    day = julian - floor_div(7834 * quad, 256)
    month = (quad + 10) - floor_div(quad + 10, 12) * 12 + 1
    bc[0] = year <= 0
    return snprintf(s, cap, b"%04lld-%02lld-%02lld", <long long>(1 - year if year <= 0 else year),
                    <long long>month, <long long>day)


cdef int fmt_clock(char* s, int cap, int64_t us) noexcept nogil:
    cdef int64_t sec = us // 1000000, frac = us % 1000000
    cdef int o = snprintf(s, cap, b"%02lld:%02lld:%02lld", <long long>(sec // 3600), <long long>(sec // 60 % 60),
                          <long long>(sec % 60))
    if frac:
        o += snprintf(s + o, cap - o, b".%06lld", <long long>frac)
        while s[o - 1] == 48:
            o -= 1
    return o


cdef int fmt_subtype(char* s, int cap, uint32_t sub, const char* p, int32_t n, bint* quote) noexcept nogil:
    """The text of one range bound of a builtin subtype; -1 when the bytes are not a value of it."""
    cdef int64_t v, days, tod
    cdef int o
    cdef bint bc = False
    quote[0] = False
    if sub == 23:
        if n != 4:
            return -1
        return snprintf(s, cap, b"%d", <int>sw_load_i32(p))
    if sub == 20:
        if n != 8:
            return -1
        return snprintf(s, cap, b"%lld", <long long>sw_load_i64(p))
    if sub == 1082:
        if n != 4:
            return -1
        v = sw_load_i32(p)
        if v == I32_MAX:
            return snprintf(s, cap, b"infinity")
        if v == I32_MIN:
            return snprintf(s, cap, b"-infinity")
        o = fmt_ymd(s, cap, v, &bc)
    else:   # timestamp, timestamptz
        if n != 8:
            return -1
        v = sw_load_i64(p)
        if v == I64_MAX:
            return snprintf(s, cap, b"infinity")
        if v == I64_MIN:
            return snprintf(s, cap, b"-infinity")
        days = floor_div(v, US_PER_DAY)
        tod = v - days * US_PER_DAY
        o = fmt_ymd(s, cap, days, &bc)
        s[o] = 32
        o += 1
        o += fmt_clock(s + o, cap - o, tod)
        quote[0] = True
        if sub == 1184:
            o += snprintf(s + o, cap - o, b"+00")
    if bc:
        o += snprintf(s + o, cap - o, b" BC")
        quote[0] = True
    return o


cdef int render_range(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n, uint32_t sub) except -1:
    """int4range, int8range, daterange, tsrange, tstzrange: range_out's text ([lo,hi), empty; a bound with a
    space is quoted)."""
    cdef char s[160]
    cdef int o = 0, k, w
    cdef unsigned char flags
    cdef Py_ssize_t pos = 1
    cdef int32_t length
    cdef bint quote
    if n < 1:
        return F_INVALID
    flags = <unsigned char>p[0]
    if flags & ~0x1F:
        return F_INVALID
    if flags & 0x01:
        if n != 1:
            return F_INVALID
        return var_append(col, idx, b"empty", 5)
    s[o] = 91 if flags & 0x02 else 40
    o += 1
    for k in range(2):
        if k:
            s[o] = 44
            o += 1
        if flags & (0x08 if k == 0 else 0x10):
            continue
        if n - pos < 4:
            return F_INVALID
        length = sw_load_i32(p + pos)
        pos += 4
        if length < 0 or n - pos < length:
            return F_INVALID
        if o + 72 > 160:
            return F_INVALID
        w = fmt_subtype(s + o + 1, 70, sub, p + pos, length, &quote)
        if w < 0:
            return F_INVALID
        pos += length
        if quote:
            s[o] = 34
            s[o + 1 + w] = 34
            o += w + 2
        else:
            memmove(s + o, s + o + 1, w)
            o += w
    if pos != n:
        return F_INVALID
    s[o] = 93 if flags & 0x04 else 41
    o += 1
    return var_append(col, idx, s, o)


cdef int render_native(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """A binary value of a common type kept as text, rendered in C; NOT_NATIVE for the others."""
    cdef uint32_t oid = col.type_oid
    if oid == 869 or oid == 650:
        return render_inet(col, idx, p, n, oid == 650)
    if oid == 829:
        return render_mac(col, idx, p, n, 6)
    if oid == 774:
        return render_mac(col, idx, p, n, 8)
    if oid == 790:
        return render_money(col, idx, p, n)
    if oid == 1560 or oid == 1562:
        return render_bits(col, idx, p, n)
    if oid == 3904:
        return render_range(col, idx, p, n, 23)
    if oid == 3926:
        return render_range(col, idx, p, n, 20)
    if oid == 3912:
        return render_range(col, idx, p, n, 1082)
    if oid == 3908:
        return render_range(col, idx, p, n, 1114)
    if oid == 3910:
        return render_range(col, idx, p, n, 1184)
    return NOT_NATIVE


cdef int render_text(ColBuf* col, Py_ssize_t idx, const char* p, Py_ssize_t n) except -1:
    """A binary value of a type kept as text (PGTEXT): PostgreSQL's text output of it. inet, cidr, macaddr,
    macaddr8, money, bit, varbit and the int4/int8/date/timestamp/timestamptz ranges render in C; the others through the column's renderer
    (spockwire.values.sendtext, Python: a cold path, one call per value, which the twin calls for every type)."""
    cdef bytes out
    cdef int rc = render_native(col, idx, p, n)
    if rc != NOT_NATIVE:
        return rc
    try:
        out = (<object>col.render)(PyBytes_FromStringAndSize(p, n)).encode("utf-8")
    except ValueFailure as failure:
        return failure.code
    return var_append(col, idx, out, len(out))


cdef object build_array(ColBuf* col, object spec, Py_ssize_t n, list pins=None):
    """The Arrow array of `n` values of a typed column; its buffers move to pyarrow. A view column's variadic
    buffers are its arena, then `pins` (the pinned input buffers of its batch, index 1 onwards)."""
    cdef Py_ssize_t nulls = count_nulls(col.validity.data, n)
    cdef int kind = col.kind
    cdef int32_t* off
    clear_tail_bits(&col.validity, n)
    validity = own(&col.validity, (n + 7) >> 3) if nulls else None
    if not nulls:
        buf_free(&col.validity)
    typ = spec.arrow_type
    if col.view:
        if kind == K_RAW or kind == K_OTHER:
            col.nontext = count_nulls(col.marks.data, n) != n
            typ = pa.binary_view() if col.nontext else pa.string_view()
        else:
            typ = pa.binary_view() if kind == K_BYTEA else pa.string_view()
        views = own(&col.data, n * 16)
        arena = own(&col.arena, col.arena_len)
        col.arena_len = 0
        return pa.Array.from_buffers(typ, n, [validity, views, arena] + (pins or []), null_count=nulls)
    if col.width:
        values = own(&col.data, n * col.width)
        if kind == K_DATE:
            return pa.Array.from_buffers(pa.int32(), n, [validity, values], null_count=nulls).view(typ)
        if kind == K_TIMESTAMP or kind == K_TIMESTAMPTZ or kind == K_TIME:
            return pa.Array.from_buffers(pa.int64(), n, [validity, values], null_count=nulls).view(typ)
        return pa.Array.from_buffers(typ, n, [validity, values], null_count=nulls)
    if kind == K_BOOL:
        clear_tail_bits(&col.data, n)
        return pa.Array.from_buffers(typ, n, [validity, own(&col.data, (n + 7) >> 3)], null_count=nulls)
    if col.offsets.data == NULL:
        buf_grow(&col.offsets, 4)
    off = <int32_t*>col.offsets.data
    total = off[n]
    offsets = own(&col.offsets, (n + 1) * 4)
    if kind == K_ARRAY:
        child = build_array(col.child, spec.element, total)
        return pa.Array.from_buffers(typ, n, [validity, offsets], null_count=nulls, children=[child])
    data = own(&col.data, total)
    if kind == K_ENUM:
        return pa.Array.from_buffers(pa.string(), n, [validity, offsets, data], null_count=nulls).dictionary_encode()
    if kind == K_RAW or kind == K_OTHER:
        col.nontext = count_nulls(col.marks.data, n) != n
        typ = pa.binary() if col.nontext else pa.string()
    return pa.Array.from_buffers(typ, n, [validity, offsets, data], null_count=nulls)
