# Value kernels: the text of the common types kept as PostgreSQL's text, rendered natively from their binary form
# (included by _values.pxi; twin: spockwire/values/sendtext.py and sendtext_scalars.py).

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
