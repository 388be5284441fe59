/* PostgreSQL varlena datums of the internal ('i') format: the 1- and 4-byte headers in either byte order, and
 * inline-compressed data (pglz, LZ4 block format) decompressed into a buffer of exactly the declared raw size.
 * Twin: spockwire/values/internal.py -- both accept and refuse exactly the same bytes with the same codes
 * (spockwire/values/failures.py); the Python twin also says where and why, for both implementations' errors.
 * Every read is checked against the end of the input and every write against the declared raw size. */
#ifndef SW_VARLENA_H
#define SW_VARLENA_H

#include <stdlib.h>
#include <string.h>

#define SW_VL_OK 0
#define SW_VL_INVALID 20      /* VARLENA_INVALID */
#define SW_VL_EXTERNAL 21     /* EXTERNAL_DATUM */
#define SW_VL_CORRUPT 22      /* COMPRESSED_CORRUPT */
#define SW_VL_RAWSIZE 23      /* RAW_SIZE_MISMATCH */
#define SW_VL_NOMEM (-1)

#define SW_PGLZ_MAX_RATIO 91
#define SW_LZ4_MAX_RATIO 255

static unsigned int sw_vl_u32(const unsigned char* p, int big) {
    if (big)
        return ((unsigned int)p[0] << 24) | ((unsigned int)p[1] << 16) | ((unsigned int)p[2] << 8) | p[3];
    return ((unsigned int)p[3] << 24) | ((unsigned int)p[2] << 16) | ((unsigned int)p[1] << 8) | p[0];
}

/* copy `len` bytes from `off` bytes back; overlapping copies repeat the pattern byte by byte */
static void sw_vl_match(unsigned char* out, long long pos, long long off, long long len) {
    unsigned char* d = out + pos;
    const unsigned char* s = d - off;
    if (off >= len) {
        memcpy(d, s, (size_t)len);
        return;
    }
    while (len-- > 0)
        *d++ = *s++;
}

/* pglz: control bytes, least significant bit first (1: a 2-3 byte match tag, 0: a literal byte) */
static int sw_pglz(const unsigned char* src, long long n, unsigned char* out, long long rawsize) {
    long long sp = 0, dp = 0, len, off;
    int bit;
    unsigned char ctrl;
    while (sp < n) {
        if (dp == rawsize)
            return SW_VL_CORRUPT;                 /* bytes left over */
        ctrl = src[sp++];
        for (bit = 0; bit < 8 && sp < n; bit++) {
            if (ctrl & (1 << bit)) {
                if (sp + 2 > n)
                    return SW_VL_CORRUPT;
                len = (src[sp] & 0x0F) + 3;
                off = ((long long)(src[sp] & 0xF0) << 4) | src[sp + 1];
                sp += 2;
                if (len == 18) {
                    if (sp >= n)
                        return SW_VL_CORRUPT;
                    len += src[sp++];
                }
                if (off == 0 || off > dp || len > rawsize - dp)
                    return SW_VL_CORRUPT;
                sw_vl_match(out, dp, off, len);
                dp += len;
            } else {
                if (dp >= rawsize)
                    return SW_VL_CORRUPT;
                out[dp++] = src[sp++];
            }
        }
    }
    return dp == rawsize ? SW_VL_OK : SW_VL_RAWSIZE;
}

/* an LZ4 length continued past its nibble of 15: bytes added while they are 255 */
static int sw_lz4_len(const unsigned char* src, long long n, long long* sp, long long* value) {
    unsigned char b;
    do {
        if (*sp >= n)
            return SW_VL_CORRUPT;
        b = src[(*sp)++];
        *value += b;
    } while (b == 255);
    return SW_VL_OK;
}

/* the LZ4 block format: token, literals, 2-byte little-endian offset, match; the last sequence has no match */
static int sw_lz4(const unsigned char* src, long long n, unsigned char* out, long long rawsize) {
    long long sp = 0, dp = 0, lit, len, off;
    unsigned char token;
    for (;;) {
        if (sp >= n)
            return SW_VL_CORRUPT;
        token = src[sp++];
        lit = token >> 4;
        if (lit == 15 && sw_lz4_len(src, n, &sp, &lit))
            return SW_VL_CORRUPT;
        if (lit > n - sp || lit > rawsize - dp)
            return SW_VL_CORRUPT;
        memcpy(out + dp, src + sp, (size_t)lit);
        dp += lit;
        sp += lit;
        if (sp == n)
            break;
        if (sp + 2 > n)
            return SW_VL_CORRUPT;
        off = src[sp] | ((long long)src[sp + 1] << 8);
        if (off == 0 || off > dp)
            return SW_VL_CORRUPT;
        sp += 2;
        len = (token & 0x0F) + 4;
        if (len == 19 && sw_lz4_len(src, n, &sp, &len))
            return SW_VL_CORRUPT;
        if (len > rawsize - dp)
            return SW_VL_CORRUPT;
        sw_vl_match(out, dp, off, len);
        dp += len;
    }
    return dp == rawsize ? SW_VL_OK : SW_VL_RAWSIZE;
}

/* The data of a varlena datum of `n` bytes at `p`: *data and *len point into `p`, or into *owned (malloc'd, the
 * caller frees it) when the datum was compressed. Returns SW_VL_OK, a failure code or SW_VL_NOMEM. */
static int sw_varlena(const unsigned char* p, long long n, int big, const unsigned char** data, long long* len,
                      unsigned char** owned) {
    unsigned int word, tcinfo, method;
    long long size, rawsize;
    int compressed, rc;
    unsigned char* buf;
    *owned = NULL;
    if (n < 1)
        return SW_VL_INVALID;
    if (big ? (p[0] & 0x80) : (p[0] & 0x01)) {
        size = big ? (p[0] & 0x7F) : (p[0] >> 1);
        if (size == 0)
            return SW_VL_EXTERNAL;
        if (size != n)
            return SW_VL_INVALID;
        *data = p + 1;
        *len = n - 1;
        return SW_VL_OK;
    }
    if (n < 4)
        return SW_VL_INVALID;
    word = sw_vl_u32(p, big);
    if (big) {
        size = word & 0x3FFFFFFF;
        compressed = (word >> 30) == 1;
    } else {
        size = word >> 2;
        compressed = (word & 0x03) == 0x02;
    }
    if (size != n)
        return SW_VL_INVALID;
    if (!compressed) {
        *data = p + 4;
        *len = n - 4;
        return SW_VL_OK;
    }
    if (n < 8)
        return SW_VL_INVALID;
    tcinfo = sw_vl_u32(p + 4, big);
    rawsize = tcinfo & 0x3FFFFFFF;
    method = tcinfo >> 30;
    if (method > 1)
        return SW_VL_CORRUPT;
    if (rawsize > (n - 8) * (method == 0 ? SW_PGLZ_MAX_RATIO : SW_LZ4_MAX_RATIO) + 16)
        return SW_VL_CORRUPT;
    buf = (unsigned char*)malloc(rawsize ? (size_t)rawsize : 1);
    if (buf == NULL)
        return SW_VL_NOMEM;
    rc = method == 0 ? sw_pglz(p + 8, n - 8, buf, rawsize) : sw_lz4(p + 8, n - 8, buf, rawsize);
    if (rc) {
        free(buf);
        return rc;
    }
    *owned = buf;
    *data = buf;
    *len = rawsize;
    return SW_VL_OK;
}

#endif
