/* The fixed head of a timestamp's text, "YYYY-MM-DD HH:MM:SS" (a four-digit year, as PostgreSQL writes every year
   from 1000 to 9999), read on little-endian hosts as two 64-bit words and three bytes: every lane is tested for
   its digit or separator at once, then the digits are taken out of their lanes. Anything else (other years, other
   hosts) is left to the byte-by-byte parser of text_timestamp in spockwire/wire/_values.pxi, which gives the same
   answer; tests/test_text_parsers.py puts every byte value at every place of a timestamp through both
   implementations. */
#ifndef SW_STAMP_H
#define SW_STAMP_H
#include <stdint.h>
#include <string.h>

/* a lane holds a digit when it is 0x3N (masked with 0xF0) and stays 0x3N with 6 added (N <= 9): no lane carries
   into the next, as no lane is above 0x3F + 6 after the first test */
#define SW_STAMP_FITS(w, mask, pat, add, dig, exp) (((w) & (mask)) == (pat) && (((w) + (add)) & (dig)) == (exp))
#define SW_LANE(w, i) ((int)(((w) >> (8 * (i))) & 0x0F))

/* 1 and the six fields when p[0..19) is "YYYY-MM-DD HH:MM:SS" (digits unchecked for range), else 0 */
static inline int sw_stamp19(const char *p, int *f) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w1, w2;
    unsigned char s0 = (unsigned char)p[17] - '0', s1 = (unsigned char)p[18] - '0';
    memcpy(&w1, p, 8);      /* "YYYY-MM-" */
    memcpy(&w2, p + 8, 8);  /* "DD HH:MM" */
    if (!SW_STAMP_FITS(w1, 0xFFF0F0FFF0F0F0F0ULL, 0x2D30302D30303030ULL,       /* "-" after YYYY and MM */
                       0x0006060006060606ULL, 0x00F0F000F0F0F0F0ULL, 0x0030300030303030ULL)
            || !SW_STAMP_FITS(w2, 0xF0F0FFF0F0FFF0F0ULL, 0x30303A3030203030ULL,    /* " " after DD, ":" after HH */
                              0x0606000606000606ULL, 0xF0F000F0F000F0F0ULL, 0x3030003030003030ULL)
            || p[16] != ':' || s0 > 9 || s1 > 9)
        return 0;
    f[0] = SW_LANE(w1, 0) * 1000 + SW_LANE(w1, 1) * 100 + SW_LANE(w1, 2) * 10 + SW_LANE(w1, 3);
    f[1] = SW_LANE(w1, 5) * 10 + SW_LANE(w1, 6);
    f[2] = SW_LANE(w2, 0) * 10 + SW_LANE(w2, 1);
    f[3] = SW_LANE(w2, 3) * 10 + SW_LANE(w2, 4);
    f[4] = SW_LANE(w2, 6) * 10 + SW_LANE(w2, 7);
    f[5] = s0 * 10 + s1;
    return 1;
#else
    (void)p; (void)f;
    return 0;
#endif
}
#endif
