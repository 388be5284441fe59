# Typed value kernels: text ('t'), binary ('b') and internal ('i') forms decoded straight into Arrow-layout
# column buffers. Twin: spockwire/values/_convert_py.py (decode_value, build_array: same names on both sides) —
# both accept and refuse exactly the same bytes. This file holds the column buffers, the internal forms and the
# dispatch; it includes the text forms (_values_text.pxi, twin _text_py.py), the binary forms (_values_binary.pxi,
# twin _binary_py.py) and the native renderers of types kept as text (_values_render.pxi, twin sendtext.py).
# A kernel returns 0, or a failure code from spockwire.values.failures (> 0); the caller raises.

from libc.stdio cimport snprintf
from cpython.ref cimport PyObject, Py_XINCREF, Py_XDECREF
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memmove

from ..values.failures import ValueFailure
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


include "_values_text.pxi"


include "_values_binary.pxi"


# ------------------------------------------------------------------ internal forms, dispatch
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


include "_values_render.pxi"


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
