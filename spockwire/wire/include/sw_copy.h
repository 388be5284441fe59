/* Copying a value of a few bytes without a call: most column values are under 32 bytes, where libc's memcpy costs
   more in its call and size dispatch than in the copy. Two loads and two stores of overlapping words cover every
   length from one word to two; longer values go to memcpy. Copies exactly n bytes. */
#ifndef SW_COPY_H
#define SW_COPY_H
#include <stdint.h>
#include <string.h>

static inline void sw_copy(char *dst, const char *src, size_t n) {
    if (n > 32) {
        memcpy(dst, src, n);
    } else if (n >= 16) {
        uint64_t a, b, c, d;
        memcpy(&a, src, 8); memcpy(&b, src + 8, 8); memcpy(&c, src + n - 16, 8); memcpy(&d, src + n - 8, 8);
        memcpy(dst, &a, 8); memcpy(dst + 8, &b, 8); memcpy(dst + n - 16, &c, 8); memcpy(dst + n - 8, &d, 8);
    } else if (n >= 8) {
        uint64_t a, b;
        memcpy(&a, src, 8); memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8); memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, src, 4); memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4); memcpy(dst + n - 4, &b, 4);
    } else if (n) {
        /* 1 to 3 bytes: first, middle and last (some of them the same byte) */
        char a = src[0], b = src[n >> 1], c = src[n - 1];
        dst[0] = a; dst[n >> 1] = b; dst[n - 1] = c;
    }
}
#endif
