# Value kernels, binary send/recv ('b') forms (included by _values.pxi; twin: spockwire/values/_binary_py.py).

# ------------------------------------------------------------------ binary forms
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
