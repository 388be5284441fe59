/* Byte order in one place: unaligned-safe big-endian loads (memcpy + byteswap builtins). */
#ifndef SW_BYTEORDER_H
#define SW_BYTEORDER_H
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef __int128 sw_int128;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define SW_BE16(x) (x)
#define SW_BE32(x) (x)
#define SW_BE64(x) (x)
#else
#define SW_BE16(x) __builtin_bswap16(x)
#define SW_BE32(x) __builtin_bswap32(x)
#define SW_BE64(x) __builtin_bswap64(x)
#endif

static inline uint16_t sw_load_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return SW_BE16(v); }
static inline uint32_t sw_load_u32(const char *p) { uint32_t v; memcpy(&v, p, 4); return SW_BE32(v); }
static inline uint64_t sw_load_u64(const char *p) { uint64_t v; memcpy(&v, p, 8); return SW_BE64(v); }
static inline int32_t sw_load_i32(const char *p) { return (int32_t)sw_load_u32(p); }
static inline int64_t sw_load_i64(const char *p) { return (int64_t)sw_load_u64(p); }

/* Strict UTF-8 check (same acceptance as Python's bytes.decode('utf-8')): no overlongs, no surrogates,
   nothing above U+10FFFF. ASCII runs are skipped 64 (SSE2), 32, then eight bytes at a time. */
static inline int sw_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* long ASCII runs (large text values): 64 bytes a step where SSE2 is there (every x86-64), then 32 */
#if defined(__SSE2__)
        while (i + 64 <= n) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(s + i + 48));
            if (_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d)))) break;
            i += 64;
        }
#endif
        while (i + 32 <= n) {
            uint64_t a, b, c, d;
            memcpy(&a, s + i, 8); memcpy(&b, s + i + 8, 8); memcpy(&c, s + i + 16, 8); memcpy(&d, s + i + 24, 8);
            if (((a | b | c | d) & 0x8080808080808080ULL) != 0) break;
            i += 32;
        }
        if (i >= n) break;
        if (i + 8 <= n) {
            uint64_t w; memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ULL) == 0) { i += 8; continue; }
        } else if (n >= 8) {
            /* under eight bytes left: the last eight in one word (those before i are checked already; any of them
               that is not ASCII sends the rest through the byte loop below) */
            uint64_t w; memcpy(&w, s + n - 8, 8);
            if ((w & 0x8080808080808080ULL) == 0) break;
        }
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i+1] & 0xC0) != 0x80) return 0;
            i += 2; continue;
        }
        if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i+1], c2 = s[i+2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;      /* overlong */
            if (c == 0xED && c1 >= 0xA0) return 0;     /* surrogates */
            i += 3; continue;
        }
        if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i+1], c2 = s[i+2], c3 = s[i+3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;      /* overlong */
            if (c == 0xF4 && c1 >= 0x90) return 0;     /* above U+10FFFF */
            i += 4; continue;
        }
        return 0;
    }
    return 1;
}
#endif
