# Value kernels, text ('t') forms: the text parsers (included by _values.pxi; twin: spockwire/values/_text_py.py,
# the same names making the same checks in the same order).

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
