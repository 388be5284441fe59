/* The internal ('i') layouts of jsonb, tsvector, tsquery and jsonpath (the data of the datum, after its varlena
 * header and decompressed, in the server's byte order) turned into the type's binary send form; numeric_out's text.
 * Twin: spockwire/values/internal_types.py (the layouts are described there) -- both accept and refuse exactly
 * the same bytes; the twin also says where and why, for both implementations' errors (SW_VL_LAYOUT).
 * Every read is checked against the end of the data; every byte of the data must be used. */
#ifndef SW_INTERNAL_TYPES_H
#define SW_INTERNAL_TYPES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sw_varlena.h"

#define SW_VL_LAYOUT 24       /* LAYOUT_INVALID */

/* a growing output buffer; `data` is malloc'd (the caller frees it) */
typedef struct {
    unsigned char* data;
    long long len;
    long long cap;
} sw_out;

static int sw_out_put(sw_out* o, const void* p, long long n) {
    unsigned char* grown;
    long long cap;
    if (o->len + n > o->cap) {
        cap = o->cap * 2 > o->len + n ? o->cap * 2 : o->len + n + 64;
        grown = (unsigned char*)realloc(o->data, (size_t)cap);
        if (grown == NULL)
            return SW_VL_NOMEM;
        o->data = grown;
        o->cap = cap;
    }
    if (n)
        memcpy(o->data + o->len, p, (size_t)n);
    o->len += n;
    return SW_VL_OK;
}

#define SW_PUT(o, p, n) do { if (sw_out_put((o), (p), (n))) return SW_VL_NOMEM; } while (0)
#define SW_PUTS(o, s) SW_PUT((o), (s), (long long)(sizeof(s) - 1))

static unsigned int sw_it_u16(const unsigned char* p, int big) {
    return big ? ((unsigned int)p[0] << 8) | p[1] : ((unsigned int)p[1] << 8) | p[0];
}

/* numeric_out's text of a numeric given by its fields and `ndigits` base-10000 digits of 2 bytes each (big-endian
 * when `big`, the server's order otherwise), already checked (0..9999 each, sign 0 or 0x4000). */
static int sw_numeric_out(sw_out* o, int negative, int weight, int dscale, long long ndigits,
                          const unsigned char* digits, int big) {
    char tmp[8];
    long long k, j, head;
    int d, c;
    if (negative)
        SW_PUTS(o, "-");
    if (weight < 0) {
        SW_PUTS(o, "0");
    } else {
        head = ndigits < weight + 1 ? ndigits : weight + 1;
        d = head > 0 ? (int)sw_it_u16(digits, big) : 0;
        c = 0;
        do {                                   /* the first group without leading zeros */
            tmp[7 - c++] = (char)('0' + d % 10);
            d /= 10;
        } while (d);
        SW_PUT(o, tmp + 8 - c, c);
        for (k = 1; k < head; k++) {
            d = (int)sw_it_u16(digits + 2 * k, big);
            tmp[0] = (char)('0' + d / 1000);
            tmp[1] = (char)('0' + d / 100 % 10);
            tmp[2] = (char)('0' + d / 10 % 10);
            tmp[3] = (char)('0' + d % 10);
            SW_PUT(o, tmp, 4);
        }
        for (k = weight + 1 - (head > 1 ? head : 1); k > 0; k--)   /* groups past the stored digits are zero */
            SW_PUTS(o, "0000");
    }
    if (dscale > 0) {
        SW_PUTS(o, ".");
        for (j = 0; j < (dscale + 3) / 4; j++) {
            k = weight + 1 + j;
            d = k >= 0 && k < ndigits ? (int)sw_it_u16(digits + 2 * k, big) : 0;
            tmp[0] = (char)('0' + d / 1000);
            tmp[1] = (char)('0' + d / 100 % 10);
            tmp[2] = (char)('0' + d / 10 % 10);
            tmp[3] = (char)('0' + d % 10);
            SW_PUT(o, tmp, dscale - 4 * j < 4 ? dscale - 4 * j : 4);
        }
    }
    return SW_VL_OK;
}

/* numeric_out's text of a numeric datum of exactly `n` bytes at `p` (an uncompressed varlena, short or 4-byte
 * header): the internal short form (sign, 6-bit display scale, 7-bit weight), the special values, or the long
 * form (sign and display scale, 16-bit weight), then the digits. */
static int sw_numeric_datum_text(const unsigned char* p, long long n, int big, sw_out* o) {
    long long size, head, k, ndigits;
    unsigned int word, h;
    int weight, dscale, negative, d;
    const char* special;
    if (n < 1)
        return SW_VL_LAYOUT;
    if (big ? (p[0] & 0x80) : (p[0] & 0x01)) {
        size = big ? (p[0] & 0x7F) : (p[0] >> 1);
        head = 1;
    } else {
        if (n < 4)
            return SW_VL_LAYOUT;
        word = sw_vl_u32(p, big);
        if (big ? (word >> 30) != 0 : (word & 0x03) != 0)
            return SW_VL_LAYOUT;
        size = big ? (word & 0x3FFFFFFF) : (word >> 2);
        head = 4;
    }
    if (size != n)
        return SW_VL_LAYOUT;
    p += head;
    n -= head;
    if (n < 2 || n % 2)
        return SW_VL_LAYOUT;
    h = sw_it_u16(p, big);
    if (h & 0x8000) {
        if ((h & 0xC000) == 0xC000) {
            special = h == 0xC000 ? "NaN" : h == 0xD000 ? "Infinity" : h == 0xF000 ? "-Infinity" : NULL;
            if (n != 2 || special == NULL)
                return SW_VL_LAYOUT;
            return sw_out_put(o, special, (long long)strlen(special));
        }
        negative = (h & 0x2000) != 0;
        dscale = (int)((h & 0x1F80) >> 7);
        weight = (int)(h & 0x003F) - ((h & 0x0040) ? 64 : 0);
        p += 2;
        n -= 2;
    } else {
        if (n < 4)
            return SW_VL_LAYOUT;
        negative = (h & 0xC000) == 0x4000;
        dscale = (int)(h & 0x3FFF);
        weight = (int)(short)sw_it_u16(p + 2, big);
        p += 4;
        n -= 4;
    }
    ndigits = n / 2;
    if (ndigits > 0x7FFF)
        return SW_VL_LAYOUT;
    for (k = 0; k < ndigits; k++) {
        d = (int)(short)sw_it_u16(p + 2 * k, big);
        if (d < 0 || d > 9999)
            return SW_VL_LAYOUT;
    }
    return sw_numeric_out(o, negative, weight, dscale, ndigits, p, big);
}

/* ---------------------------------------------------------------------------------------------------------------
 * jsonb */

#define SW_JB_CMASK 0x0FFFFFFFu
#define SW_JB_FSCALAR 0x10000000u
#define SW_JB_FOBJECT 0x20000000u
#define SW_JB_FARRAY 0x40000000u
#define SW_JE_LENMASK 0x0FFFFFFFu
#define SW_JE_TYPEMASK 0x70000000u
#define SW_JE_HAS_OFF 0x80000000u
#define SW_JE_STRING 0x00000000u
#define SW_JE_NUMERIC 0x10000000u
#define SW_JE_FALSE 0x20000000u
#define SW_JE_TRUE 0x30000000u
#define SW_JE_NULL 0x40000000u
#define SW_JE_CONTAINER 0x50000000u

/* a container being printed: its entries start at start + 4, its elements' data at base; the next key's and the
 * next value's data start at koff and voff (relative to base) */
typedef struct {
    long long start, base, koff, voff;
    unsigned int count, i;
    int is_object;
} sw_jb_frame;

static int sw_json_string(sw_out* o, const unsigned char* s, long long n) {
    static const char hex[] = "0123456789abcdef";
    char esc[6] = {'\\', 'u', '0', '0', 0, 0};
    long long k, run = 0;
    SW_PUTS(o, "\"");
    for (k = 0; k < n; k++) {
        unsigned char c = s[k];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        SW_PUT(o, s + run, k - run);
        run = k + 1;
        switch (c) {
        case '"': SW_PUTS(o, "\\\""); break;
        case '\\': SW_PUTS(o, "\\\\"); break;
        case '\b': SW_PUTS(o, "\\b"); break;
        case '\f': SW_PUTS(o, "\\f"); break;
        case '\n': SW_PUTS(o, "\\n"); break;
        case '\r': SW_PUTS(o, "\\r"); break;
        case '\t': SW_PUTS(o, "\\t"); break;
        default:
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            SW_PUT(o, esc, 6);
        }
    }
    SW_PUT(o, s + run, n - run);
    SW_PUTS(o, "\"");
    return SW_VL_OK;
}

/* The container at [start, end): header and entries checked (every element inside, the last one ending at `end`). */
static int sw_jb_open(const unsigned char* p, long long start, long long end, int top, int big, sw_jb_frame* f) {
    unsigned int header, flags, count, je;
    long long nent, base, prev = 0, stop, k;
    if (end - start < 4)
        return SW_VL_LAYOUT;
    header = sw_vl_u32(p + start, big);
    count = header & SW_JB_CMASK;
    flags = header & ~SW_JB_CMASK;
    if (flags == (SW_JB_FARRAY | SW_JB_FSCALAR)) {
        if (!top || count != 1)
            return SW_VL_LAYOUT;
    } else if (flags != SW_JB_FOBJECT && flags != SW_JB_FARRAY) {
        return SW_VL_LAYOUT;
    }
    f->is_object = flags == SW_JB_FOBJECT;
    nent = f->is_object ? 2 * (long long)count : (long long)count;
    if (nent > (end - start - 4) / 4)
        return SW_VL_LAYOUT;
    base = start + 4 + 4 * nent;
    f->voff = 0;
    for (k = 0; k < nent; k++) {
        je = sw_vl_u32(p + start + 4 + 4 * k, big);
        stop = (je & SW_JE_HAS_OFF) ? (long long)(je & SW_JE_LENMASK) : prev + (je & SW_JE_LENMASK);
        if (stop < prev || base + stop > end)
            return SW_VL_LAYOUT;
        prev = stop;
        if (f->is_object && k == (long long)count - 1)
            f->voff = stop;         /* the values' data follows the keys' */
    }
    if (base + prev != end)
        return SW_VL_LAYOUT;
    f->start = start;
    f->base = base;
    f->koff = 0;
    f->count = count;
    f->i = 0;
    return SW_VL_OK;
}

/* entry k of the frame: its type and data [*begin, *end), *off (relative to the base) moved past it */
static void sw_jb_entry(const unsigned char* p, const sw_jb_frame* f, long long k, int big, long long* off,
                        unsigned int* type, long long* begin, long long* end) {
    unsigned int je = sw_vl_u32(p + f->start + 4 + 4 * k, big);
    long long stop = (je & SW_JE_HAS_OFF) ? (long long)(je & SW_JE_LENMASK) : *off + (je & SW_JE_LENMASK);
    *type = je & SW_JE_TYPEMASK;
    *begin = f->base + *off;
    *end = f->base + stop;
    *off = stop;
}

/* the 4-byte aligned start (relative to `base`) of an element at [begin, end), after zero padding */
static int sw_jb_aligned(const unsigned char* p, long long base, long long begin, long long end, long long* start) {
    long long k;
    *start = base + ((begin - base + 3) & ~3LL);
    if (*start > end)
        return SW_VL_LAYOUT;
    for (k = begin; k < *start; k++)
        if (p[k])
            return SW_VL_LAYOUT;
    return SW_VL_OK;
}

static int sw_jb_scalar(const unsigned char* p, unsigned int type, long long begin, long long end, long long base,
                        int big, sw_out* o) {
    long long start;
    int rc;
    switch (type) {
    case SW_JE_STRING:
        return sw_json_string(o, p + begin, end - begin);
    case SW_JE_NUMERIC:
        if ((rc = sw_jb_aligned(p, base, begin, end, &start)))
            return rc;
        return sw_numeric_datum_text(p + start, end - start, big, o);
    case SW_JE_FALSE:
    case SW_JE_TRUE:
    case SW_JE_NULL:
        if (end != begin)
            return SW_VL_LAYOUT;
        if (type == SW_JE_FALSE)
            SW_PUTS(o, "false");
        else if (type == SW_JE_TRUE)
            SW_PUTS(o, "true");
        else
            SW_PUTS(o, "null");
        return SW_VL_OK;
    default:
        return SW_VL_LAYOUT;
    }
}

static int sw_jsonb_walk(const unsigned char* p, long long n, int big, sw_out* o, sw_jb_frame** stackp) {
    sw_jb_frame* stack = *stackp;
    sw_jb_frame* f;
    sw_jb_frame* grown;
    long long depth = 1, cap = 16, begin, end, start;
    unsigned int type;
    int rc;
    if ((rc = sw_jb_open(p, 0, n, 1, big, &stack[0])))
        return rc;
    if ((sw_vl_u32(p, big) & SW_JB_FSCALAR) != 0) {
        sw_jb_entry(p, &stack[0], 0, big, &stack[0].voff, &type, &begin, &end);
        if (type == SW_JE_CONTAINER)
            return SW_VL_LAYOUT;
        return sw_jb_scalar(p, type, begin, end, stack[0].base, big, o);
    }
    SW_PUT(o, stack[0].is_object ? "{" : "[", 1);
    while (depth > 0) {
        f = &stack[depth - 1];
        if (f->i == f->count) {
            SW_PUT(o, f->is_object ? "}" : "]", 1);
            depth--;
            continue;
        }
        if (f->i)
            SW_PUTS(o, ", ");
        if (f->is_object) {
            sw_jb_entry(p, f, f->i, big, &f->koff, &type, &begin, &end);
            if (type != SW_JE_STRING)
                return SW_VL_LAYOUT;
            if ((rc = sw_json_string(o, p + begin, end - begin)))
                return rc;
            SW_PUTS(o, ": ");
            sw_jb_entry(p, f, (long long)f->count + f->i, big, &f->voff, &type, &begin, &end);
        } else {
            sw_jb_entry(p, f, f->i, big, &f->voff, &type, &begin, &end);
        }
        f->i++;
        if (type != SW_JE_CONTAINER) {
            if ((rc = sw_jb_scalar(p, type, begin, end, f->base, big, o)))
                return rc;
            continue;
        }
        if ((rc = sw_jb_aligned(p, f->base, begin, end, &start)))
            return rc;
        if (depth == cap) {
            grown = (sw_jb_frame*)realloc(stack, (size_t)(2 * cap) * sizeof(sw_jb_frame));
            if (grown == NULL)
                return SW_VL_NOMEM;
            stack = *stackp = grown;
            cap *= 2;
        }
        if ((rc = sw_jb_open(p, start, end, 0, big, &stack[depth])))
            return rc;
        SW_PUT(o, stack[depth].is_object ? "{" : "[", 1);
        depth++;
    }
    return SW_VL_OK;
}

/* jsonb's send form (version 1, then jsonb_out's text) of a JsonbContainer of `n` bytes at `p` */
static int sw_jsonb_send(const unsigned char* p, long long n, int big, sw_out* o) {
    sw_jb_frame* stack = (sw_jb_frame*)malloc(16 * sizeof(sw_jb_frame));
    int rc;
    if (stack == NULL)
        return SW_VL_NOMEM;
    rc = sw_out_put(o, "\x01", 1);
    if (rc == SW_VL_OK)
        rc = sw_jsonb_walk(p, n, big, o, &stack);
    free(stack);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------------
 * tsvector, tsquery */

static void sw_put_be16(unsigned char* s, unsigned int v) {
    s[0] = (unsigned char)(v >> 8);
    s[1] = (unsigned char)v;
}

static void sw_put_be32(unsigned char* s, unsigned int v) {
    s[0] = (unsigned char)(v >> 24);
    s[1] = (unsigned char)(v >> 16);
    s[2] = (unsigned char)(v >> 8);
    s[3] = (unsigned char)v;
}

/* the int32 count that starts the data, of entries of `width` bytes each after it */
static int sw_count(const unsigned char* p, long long n, int big, long long width, long long* size) {
    if (n < 4)
        return SW_VL_LAYOUT;
    *size = (int)sw_vl_u32(p, big);
    return *size < 0 || *size > (n - 4) / width ? SW_VL_LAYOUT : SW_VL_OK;
}

/* tsvector's send form: int32 count; per lexeme its text, a NUL, uint16 npos and the positions */
static int sw_tsvector_send(const unsigned char* p, long long n, int big, sw_out* o) {
    long long size, strs, cur = 0, k, j, haspos, len, pos, npos;
    unsigned int word;
    unsigned char s[4];
    if (sw_count(p, n, big, 4, &size))
        return SW_VL_LAYOUT;
    strs = 4 + 4 * size;
    sw_put_be32(s, (unsigned int)size);
    SW_PUT(o, s, 4);
    for (k = 0; k < size; k++) {
        word = sw_vl_u32(p + 4 + 4 * k, big);
        if (big) {
            haspos = word >> 31;
            len = (word >> 20) & 0x7FF;
            pos = word & 0xFFFFF;
        } else {
            haspos = word & 1;
            len = (word >> 1) & 0x7FF;
            pos = word >> 12;
        }
        if (pos != cur || strs + pos + len > n || memchr(p + strs + pos, 0, (size_t)len) != NULL)
            return SW_VL_LAYOUT;
        SW_PUT(o, p + strs + pos, len);
        SW_PUT(o, "", 1);
        cur = pos + len;
        if (!haspos) {
            SW_PUT(o, "\0\0", 2);
            continue;
        }
        cur += cur & 1;
        if (strs + cur + 2 > n)
            return SW_VL_LAYOUT;
        npos = sw_it_u16(p + strs + cur, big);
        if (strs + cur + 2 + 2 * npos > n)
            return SW_VL_LAYOUT;
        sw_put_be16(s, (unsigned int)npos);
        SW_PUT(o, s, 2);
        for (j = 0; j < npos; j++) {
            sw_put_be16(s, sw_it_u16(p + strs + cur + 2 + 2 * j, big));
            SW_PUT(o, s, 2);
        }
        cur += 2 + 2 * npos;
    }
    return strs + cur == n ? SW_VL_OK : SW_VL_LAYOUT;
}

static int sw_span_cmp(const void* a, const void* b) {
    long long x = ((const long long*)a)[0], y = ((const long long*)b)[0];
    return x < y ? -1 : x > y;
}

/* tsquery: the items and the operand texts checked (the tree of the items, `left` of every binary operator, the
 * texts tiling the area after the items), the send form written */
static int sw_tsquery_items(const unsigned char* p, long long n, int big, sw_out* o, long long size, long long* sub,
                            long long* spans) {
    long long texts = 4 + 12 * size, k, at, len, dist, right, left, cur = 0, nspans = 0;
    unsigned int word;
    unsigned char s[4];
    sw_put_be32(s, (unsigned int)size);
    SW_PUT(o, s, 4);
    for (k = 0; k < size; k++) {
        at = 4 + 12 * k;
        if (p[at] == 1) {
            if (p[at + 1] > 15 || p[at + 2] > 1)
                return SW_VL_LAYOUT;
            word = sw_vl_u32(p + at + 8, big);
            len = big ? word >> 20 : word & 0xFFF;
            dist = big ? word & 0xFFFFF : word >> 12;
            if (texts + dist + len + 1 > n || p[texts + dist + len] != 0
                    || memchr(p + texts + dist, 0, (size_t)len) != NULL)
                return SW_VL_LAYOUT;
            spans[2 * nspans] = dist;
            spans[2 * nspans + 1] = len + 1;
            nspans++;
            SW_PUT(o, p + at, 3);
            SW_PUT(o, p + texts + dist, len + 1);
        } else if (p[at] == 2) {
            if (p[at + 1] < 1 || p[at + 1] > 4)
                return SW_VL_LAYOUT;
            SW_PUT(o, p + at, 2);
            if (p[at + 1] == 4) {
                s[0] = p[at + (big ? 2 : 3)];
                s[1] = p[at + (big ? 3 : 2)];
                SW_PUT(o, s, 2);
            }
        } else {
            return SW_VL_LAYOUT;
        }
    }
    for (k = size - 1; k >= 0; k--) {
        at = 4 + 12 * k;
        if (p[at] == 1) {
            sub[k] = 1;
            continue;
        }
        right = k + 1;
        if (right >= size)
            return SW_VL_LAYOUT;
        if (p[at + 1] == 1) {
            sub[k] = 1 + sub[right];
            continue;
        }
        left = right + sub[right];
        if ((long long)sw_vl_u32(p + at + 4, big) != left - k || left >= size)
            return SW_VL_LAYOUT;
        sub[k] = 1 + sub[right] + sub[left];
    }
    if (size && sub[0] != size)
        return SW_VL_LAYOUT;
    qsort(spans, (size_t)nspans, 2 * sizeof(long long), sw_span_cmp);
    for (k = 0; k < nspans; k++) {
        if (spans[2 * k] != cur)
            return SW_VL_LAYOUT;
        cur += spans[2 * k + 1];
    }
    return texts + cur == n ? SW_VL_OK : SW_VL_LAYOUT;
}

/* tsquery's send form: int32 count; per item type 1, weight, prefix, the text and a NUL, or type 2, the operator
 * and (<N>) the int16 distance -- in the stored (prefix) order */
static int sw_tsquery_send(const unsigned char* p, long long n, int big, sw_out* o) {
    long long size, *sub, *spans;
    int rc;
    if (sw_count(p, n, big, 12, &size))
        return SW_VL_LAYOUT;
    sub = (long long*)malloc((size_t)(size ? size : 1) * sizeof(long long));
    spans = (long long*)malloc((size_t)(size ? size : 1) * 2 * sizeof(long long));
    if (sub == NULL || spans == NULL) {
        free(sub);
        free(spans);
        return SW_VL_NOMEM;
    }
    rc = sw_tsquery_items(p, n, big, o, size, sub, spans);
    free(sub);
    free(spans);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------------
 * jsonpath: items are a type byte, zero padding to a 4-byte boundary, int32 `next` (the next item of the chain,
 * as an offset from this item's type byte; 0 for none), then the payload; arguments are offsets from the item too.
 * Every link points forward, each item is reached once, and the items tile the data after the header. */

#define SW_JP_LAX 0x80000000u
#define SW_JP_MAX_DEPTH 100       /* JSONPATH_MAX_DEPTH: argument nesting deeper than this is refused */

typedef struct {
    const unsigned char* p;       /* the items (the data after the 4-byte header) */
    long long n;
    int big;
    long long* ends;              /* per byte: the end of the item starting there, -1 where none starts */
    sw_out* o;
} sw_jp;

static int sw_jp_item(sw_jp* j, long long pos, int in_key, int brackets, int depth, long long* next);

static int sw_jp_i32(const sw_jp* j, long long at, long long* v) {
    if (at < 0 || at + 4 > j->n)
        return SW_VL_LAYOUT;
    *v = (int)sw_vl_u32(j->p + at, j->big);
    return SW_VL_OK;
}

/* the item an offset at `at` (from the item at `pos`) points to; *to = -1 for an optional offset of 0 */
static int sw_jp_link(const sw_jp* j, long long pos, long long at, int optional, long long* to) {
    long long off;
    if (sw_jp_i32(j, at, &off))
        return SW_VL_LAYOUT;
    if (off == 0 && optional) {
        *to = -1;
        return SW_VL_OK;
    }
    if (off <= 0)
        return SW_VL_LAYOUT;
    *to = pos + off;
    return SW_VL_OK;
}

static int sw_jp_priority(int kind) {
    switch (kind) {
    case 5: return 0;
    case 4: return 1;
    case 8: case 9: case 10: case 11: case 12: case 13: case 41: return 2;
    case 14: case 15: return 3;
    case 16: case 17: case 18: return 4;
    case 19: case 20: return 5;
    default: return 6;
    }
}

/* an item and the items chained after it */
static int sw_jp_chain(sw_jp* j, long long pos, int in_key, int brackets, int depth) {
    long long next;
    int rc;
    for (;;) {
        if ((rc = sw_jp_item(j, pos, in_key, brackets, depth, &next)))
            return rc;
        if (next == 0)
            return SW_VL_OK;
        if (next < 0)
            return SW_VL_LAYOUT;
        pos += next;
        in_key = brackets = 1;
    }
}

static int sw_jp_arg(sw_jp* j, long long pos, int depth, int brackets) {
    if (depth >= SW_JP_MAX_DEPTH)
        return SW_VL_LAYOUT;
    return sw_jp_chain(j, pos, 0, brackets, depth + 1);
}

/* an optional argument (pos -1: none), after `sep` */
static int sw_jp_opt_arg(sw_jp* j, long long pos, const char* sep, int depth) {
    if (pos < 0)
        return SW_VL_OK;
    if (sw_out_put(j->o, sep, (long long)strlen(sep)))
        return SW_VL_NOMEM;
    return sw_jp_arg(j, pos, depth, 0);
}

/* an operand, in brackets when its operation binds no tighter than the parent's */
static int sw_jp_operand(sw_jp* j, int parent, long long pos, int depth) {
    if (pos < 0 || pos >= j->n)
        return SW_VL_LAYOUT;
    return sw_jp_arg(j, pos, depth, sw_jp_priority(j->p[pos]) <= sw_jp_priority(parent));
}

static const char* sw_jp_plain(int kind) {
    switch (kind) {
    case 0: return "null";
    case 21: return "[*]";
    case 26: return "@";
    case 27: return "$";
    case 31: return ".type()";
    case 32: return ".size()";
    case 33: return ".abs()";
    case 34: return ".floor()";
    case 35: return ".ceiling()";
    case 36: return ".double()";
    case 38: return ".keyvalue()";
    case 40: return "last";
    case 43: return ".bigint()";
    case 44: return ".boolean()";
    case 45: return ".date()";
    case 47: return ".integer()";
    case 48: return ".number()";
    case 49: return ".string()";
    default: return NULL;
    }
}

static const char* sw_jp_binary(int kind) {
    switch (kind) {
    case 4: return "&&";
    case 5: return "||";
    case 8: return "==";
    case 9: return "!=";
    case 10: return "<";
    case 11: return ">";
    case 12: return "<=";
    case 13: return ">=";
    case 14: return "+";
    case 15: return "-";
    case 16: return "*";
    case 17: return "/";
    case 18: return "%";
    case 41: return "starts with";
    default: return NULL;
    }
}

static const char* sw_jp_optional(int kind) {
    switch (kind) {
    case 37: return ".datetime(";
    case 50: return ".time(";
    case 51: return ".time_tz(";
    case 52: return ".timestamp(";
    case 53: return ".timestamp_tz(";
    default: return NULL;
    }
}

/* a string payload at `p`: int32 length, the bytes and a NUL; *end after it */
static int sw_jp_string(const sw_jp* j, long long p, long long* len, long long* end) {
    if (sw_jp_i32(j, p, len) || *len < 0 || p + 4 + *len + 1 > j->n || j->p[p + 4 + *len] != 0)
        return SW_VL_LAYOUT;
    *end = p + 4 + *len + 1;
    return SW_VL_OK;
}

static int sw_jp_levels(sw_out* o, unsigned int first, unsigned int last) {
    char s[48];
    int k;
    if (first == 0 && last == 0xFFFFFFFFu)
        k = snprintf(s, sizeof s, "**");
    else if (first == last)
        k = first == 0xFFFFFFFFu ? snprintf(s, sizeof s, "**{last}") : snprintf(s, sizeof s, "**{%u}", first);
    else if (first == 0xFFFFFFFFu)
        k = snprintf(s, sizeof s, "**{last to %u}", last);
    else if (last == 0xFFFFFFFFu)
        k = snprintf(s, sizeof s, "**{%u to last}", first);
    else
        k = snprintf(s, sizeof s, "**{%u to %u}", first, last);
    return sw_out_put(o, s, k);
}

static int sw_jp_item(sw_jp* j, long long pos, int in_key, int brackets, int depth, long long* next) {
    const unsigned char* d = j->p;
    sw_out* o = j->o;
    const char* word;
    long long p, end, len, a, b, k, count, size, flags;
    unsigned int first, last;
    int kind, rc;
    if (pos < 0 || pos >= j->n || j->ends[pos] >= 0)
        return SW_VL_LAYOUT;
    kind = d[pos];
    p = (pos + 1 + 3) & ~3LL;
    if (p + 4 > j->n)
        return SW_VL_LAYOUT;
    for (k = pos + 1; k < p; k++)
        if (d[k])
            return SW_VL_LAYOUT;
    *next = (int)sw_vl_u32(d + p, j->big);
    p += 4;
    j->ends[pos] = p;
    end = p;
    if ((word = sw_jp_plain(kind)) != NULL) {
        SW_PUT(o, word, (long long)strlen(word));
    } else if (kind == 1 || kind == 25 || kind == 28) {
        if ((rc = sw_jp_string(j, p, &len, &end)))
            return rc;
        if ((kind == 25 && in_key) || kind == 28)
            SW_PUT(o, kind == 25 ? "." : "$", 1);
        if ((rc = sw_json_string(o, d + p + 4, len)))
            return rc;
    } else if (kind == 2) {
        if (p + 1 > j->n)
            return SW_VL_LAYOUT;
        if (j->big ? (d[p] & 0x80) : (d[p] & 0x01)) {
            size = j->big ? (d[p] & 0x7F) : (d[p] >> 1);
        } else {
            if (p + 4 > j->n)
                return SW_VL_LAYOUT;
            size = j->big ? (sw_vl_u32(d + p, 1) & 0x3FFFFFFF) : (sw_vl_u32(d + p, 0) >> 2);
        }
        if (p + size > j->n)
            return SW_VL_LAYOUT;
        end = p + size;
        if (*next)
            SW_PUTS(o, "(");
        if ((rc = sw_numeric_datum_text(d + p, size, j->big, o)))
            return rc;
        if (*next)
            SW_PUTS(o, ")");
    } else if (kind == 3) {
        if (p + 1 > j->n || d[p] > 1)
            return SW_VL_LAYOUT;
        end = p + 1;
        if (d[p])
            SW_PUTS(o, "true");
        else
            SW_PUTS(o, "false");
    } else if ((word = sw_jp_binary(kind)) != NULL) {
        if (sw_jp_link(j, pos, p, 0, &a) || sw_jp_link(j, pos, p + 4, 0, &b))
            return SW_VL_LAYOUT;
        end = p + 8;
        if (brackets)
            SW_PUTS(o, "(");
        if ((rc = sw_jp_operand(j, kind, a, depth)))
            return rc;
        SW_PUTS(o, " ");
        SW_PUT(o, word, (long long)strlen(word));
        SW_PUTS(o, " ");
        if ((rc = sw_jp_operand(j, kind, b, depth)))
            return rc;
        if (brackets)
            SW_PUTS(o, ")");
    } else if (kind == 19 || kind == 20) {
        if (sw_jp_link(j, pos, p, 0, &a))
            return SW_VL_LAYOUT;
        end = p + 4;
        if (brackets)
            SW_PUTS(o, "(");
        SW_PUT(o, kind == 19 ? "+" : "-", 1);
        if ((rc = sw_jp_operand(j, kind, a, depth)))
            return rc;
        if (brackets)
            SW_PUTS(o, ")");
    } else if (kind == 6 || kind == 7 || kind == 29 || kind == 30) {
        if (sw_jp_link(j, pos, p, 0, &a))
            return SW_VL_LAYOUT;
        end = p + 4;
        if (kind == 6)
            SW_PUTS(o, "!(");
        else if (kind == 7)
            SW_PUTS(o, "(");
        else if (kind == 29)
            SW_PUTS(o, "?(");
        else
            SW_PUTS(o, "exists (");
        if ((rc = sw_jp_arg(j, a, depth, 0)))
            return rc;
        if (kind == 7)
            SW_PUTS(o, ") is unknown");
        else
            SW_PUTS(o, ")");
    } else if ((word = sw_jp_optional(kind)) != NULL) {
        if (sw_jp_link(j, pos, p, 1, &a))
            return SW_VL_LAYOUT;
        end = p + 4;
        SW_PUT(o, word, (long long)strlen(word));
        if ((rc = sw_jp_opt_arg(j, a, "", depth)))
            return rc;
        SW_PUTS(o, ")");
    } else if (kind == 46) {
        if (sw_jp_link(j, pos, p, 1, &a) || sw_jp_link(j, pos, p + 4, 1, &b))
            return SW_VL_LAYOUT;
        end = p + 8;
        SW_PUTS(o, ".decimal(");
        if ((rc = sw_jp_opt_arg(j, a, "", depth)) || (rc = sw_jp_opt_arg(j, b, ",", depth)))
            return rc;
        SW_PUTS(o, ")");
    } else if (kind == 22) {
        if (in_key)
            SW_PUTS(o, ".*");
        else
            SW_PUTS(o, "*");
    } else if (kind == 24) {
        if (p + 8 > j->n)
            return SW_VL_LAYOUT;
        first = sw_vl_u32(d + p, j->big);
        last = sw_vl_u32(d + p + 4, j->big);
        end = p + 8;
        if (in_key)
            SW_PUTS(o, ".");
        if (sw_jp_levels(o, first, last))
            return SW_VL_NOMEM;
    } else if (kind == 23) {
        if (sw_jp_i32(j, p, &count) || count < 0 || count > (j->n - p - 4) / 8)
            return SW_VL_LAYOUT;
        end = p + 4 + 8 * count;
        SW_PUTS(o, "[");
        for (k = 0; k < count; k++) {
            if (sw_jp_link(j, pos, p + 4 + 8 * k, 0, &a) || sw_jp_link(j, pos, p + 8 + 8 * k, 1, &b))
                return SW_VL_LAYOUT;
            if ((rc = sw_jp_opt_arg(j, a, k ? "," : "", depth)) || (rc = sw_jp_opt_arg(j, b, " to ", depth)))
                return rc;
        }
        SW_PUTS(o, "]");
    } else if (kind == 42) {
        if (sw_jp_i32(j, p, &flags) || ((unsigned long long)flags & ~0x1FULL) != 0)
            return SW_VL_LAYOUT;
        if (sw_jp_link(j, pos, p + 4, 0, &a) || sw_jp_i32(j, p + 8, &len) || len < 0 || p + 12 + len + 1 > j->n
                || d[p + 12 + len] != 0)
            return SW_VL_LAYOUT;
        end = p + 12 + len + 1;
        if (brackets)
            SW_PUTS(o, "(");
        if ((rc = sw_jp_operand(j, kind, a, depth)))
            return rc;
        SW_PUTS(o, " like_regex ");
        if ((rc = sw_json_string(o, d + p + 12, len)))
            return rc;
        if (flags) {
            SW_PUTS(o, " flag \"");
            if (flags & 0x01) SW_PUTS(o, "i");
            if (flags & 0x02) SW_PUTS(o, "s");
            if (flags & 0x04) SW_PUTS(o, "m");
            if (flags & 0x08) SW_PUTS(o, "x");
            if (flags & 0x10) SW_PUTS(o, "q");
            SW_PUTS(o, "\"");
        }
        if (brackets)
            SW_PUTS(o, ")");
    } else {
        return SW_VL_LAYOUT;
    }
    j->ends[pos] = end;
    return SW_VL_OK;
}

/* jsonpath's send form (version 1, then jsonpath_out's text) of a JsonPath of `n` bytes at `p` */
static int sw_jsonpath_send(const unsigned char* p, long long n, int big, sw_out* o) {
    sw_jp j;
    unsigned int header;
    long long k, cur = 0;
    int rc;
    if (n < 4)
        return SW_VL_LAYOUT;
    header = sw_vl_u32(p, big);
    if ((header & ~SW_JP_LAX) != 1)
        return SW_VL_LAYOUT;
    j.p = p + 4;
    j.n = n - 4;
    j.big = big;
    j.o = o;
    j.ends = (long long*)malloc((size_t)(j.n ? j.n : 1) * sizeof(long long));
    if (j.ends == NULL)
        return SW_VL_NOMEM;
    for (k = 0; k < j.n; k++)
        j.ends[k] = -1;
    rc = sw_out_put(o, "\x01", 1);
    if (rc == SW_VL_OK && !(header & SW_JP_LAX))
        rc = sw_out_put(o, "strict ", 7);
    if (rc == SW_VL_OK)
        rc = sw_jp_chain(&j, 0, 0, 1, 0);
    for (k = 0; rc == SW_VL_OK && k < j.n; k++) {
        if (j.ends[k] < 0)
            continue;
        if (k != cur)
            rc = SW_VL_LAYOUT;
        cur = j.ends[k];
    }
    if (rc == SW_VL_OK && cur != j.n)
        rc = SW_VL_LAYOUT;
    free(j.ends);
    return rc;
}

#endif
