/* Constants of the value kernels as compile-time constants, so the C compiler folds them (a module-level cdef
   variable is assigned when the module initialises and stays a memory load). The pure-Python twin holds the same
   numbers (spockwire/values/_convert_py.py, spockwire/values/failures.py, spockwire/wire/_decoder_py.py);
   tests/test_kernel_constants.py checks every one against this file and the .pxi enums. */
#ifndef SW_CONSTS_H
#define SW_CONSTS_H
#include <stdint.h>

#define SW_I64_MAX ((int64_t)0x7FFFFFFFFFFFFFFFLL)
#define SW_I64_MIN (-SW_I64_MAX - 1)
#define SW_U64_MAX ((uint64_t)0xFFFFFFFFFFFFFFFFULL)
#define SW_I32_MAX ((int32_t)0x7FFFFFFF)
#define SW_I32_MIN (-SW_I32_MAX - 1)
#define SW_US_PER_DAY ((int64_t)86400000000LL)
#define SW_UNIX_US_2000 ((int64_t)946684800000000LL)
#define SW_UNIX_DAYS_2000 ((int32_t)10957)
#define SW_OFFSET_LIMIT ((Py_ssize_t)0x7FFFFFFF)
#define SW_MIN_TXN_TS ((int64_t)-63082281600000000LL)
#define SW_MAX_TXN_TS ((int64_t)252455615999999999LL)

/* hex digit values, -1 for every other byte */
static const signed char sw_hex_value[256] = {
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,  0, 1, 2, 3, 4, 5, 6, 7, 8, 9,-1,-1,-1,-1,-1,-1,
    -1,10,11,12,13,14,15,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,10,11,12,13,14,15,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
    -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1, -1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,
};

/* where the 16 bytes of a canonical UUID text (8-4-4-4-12) start */
static const unsigned char sw_uuid_pos[16] = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};

/* 10**k for k = 0..18 (every power an uint64 holds exactly) */
static const uint64_t sw_pow10_u64[19] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
    10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
};

#endif
