/* UUID text (8-4-4-4-12 hex digits, either case) to its 16 bytes. On little-endian hosts eight digits at a time in
   one 64-bit word: per-byte range tests with the 0x80 bias (every lane is checked below 0x80 first, so no sum carries
   into the next lane), then the nibbles packed pairwise. Elsewhere the table loop. The pure-Python twin is
   text_uuid in spockwire/values/_convert_py.py; tests/test_text_parsers.py checks both on every byte value at every
   position. */
#ifndef SW_HEX_H
#define SW_HEX_H
#include <stdint.h>
#include <string.h>
#include "sw_consts.h"

#define SW_LANES(b) (0x0101010101010101ULL * (uint64_t)(b))

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* the eight hex digits in the lanes of x (first digit in the lowest byte) as four bytes; 0 if any is not a digit */
static inline int sw_hex8(uint64_t x, unsigned char *out) {
    uint64_t folded, digit, letter, v, t;
    uint32_t packed;
    if (x & SW_LANES(0x80))
        return 0;
    /* lane >= lo: x + (0x80 - lo) has its top bit set; lane > hi: x + (0x7F - hi) has */
    digit = (x + SW_LANES(0x80 - '0')) & ~(x + SW_LANES(0x7F - '9'));
    folded = x | SW_LANES(0x20);                      /* 'A'-'F' onto 'a'-'f' */
    letter = (folded + SW_LANES(0x80 - 'a')) & ~(folded + SW_LANES(0x7F - 'f'));
    if (((digit | letter) & SW_LANES(0x80)) != SW_LANES(0x80))
        return 0;
    v = (x & SW_LANES(0x0F)) + ((letter & SW_LANES(0x80)) >> 7) * 9;
    t = ((v & 0x000F000F000F000FULL) << 4) | ((v >> 8) & 0x000F000F000F000FULL);
    t = (t | (t >> 8)) & 0x0000FFFF0000FFFFULL;
    t = (t | (t >> 16)) & 0xFFFFFFFFULL;
    packed = (uint32_t)t;
    memcpy(out, &packed, 4);
    return 1;
}

static inline uint64_t sw_load_two4(const char *a, const char *b) {
    uint32_t lo, hi;
    memcpy(&lo, a, 4);
    memcpy(&hi, b, 4);
    return (uint64_t)lo | ((uint64_t)hi << 32);
}

/* p: 36 bytes whose hyphens are already checked; 0 on success, -1 if a digit is not hex */
static inline int sw_uuid_text(const char *p, unsigned char *out) {
    uint64_t w0, w3;
    memcpy(&w0, p, 8);
    memcpy(&w3, p + 28, 8);
    return (sw_hex8(w0, out) & sw_hex8(sw_load_two4(p + 9, p + 14), out + 4)
            & sw_hex8(sw_load_two4(p + 19, p + 24), out + 8) & sw_hex8(w3, out + 12)) ? 0 : -1;
}
#else
static inline int sw_uuid_text(const char *p, unsigned char *out) {
    int k, hi, lo, bad = 0;
    const unsigned char *q = (const unsigned char *)p;
    for (k = 0; k < 16; k++) {
        hi = sw_hex_value[q[sw_uuid_pos[k]]];
        lo = sw_hex_value[q[sw_uuid_pos[k] + 1]];
        bad |= hi | lo;
        out[k] = (unsigned char)(((hi & 15) << 4) | (lo & 15));
    }
    return bad < 0 ? -1 : 0;
}
#endif
#endif
