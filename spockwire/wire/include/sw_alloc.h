/* Memory of large column buffers (spockwire/wire/_buffers.pxi).
 *
 * On Linux a large buffer is an anonymous private mapping: it grows with mremap, which moves the page table
 * entries of the pages already written instead of copying their bytes, and the pages of a new mapping are only
 * taken when first written. Elsewhere the C library's malloc/realloc/free do the same job with copies.
 * Sizes passed to sw_big_grow and sw_big_free are the sizes the mapping was made or last grown with.
 * Under AddressSanitizer (the fuzz and sanitizer builds) every buffer stays on malloc, where the sanitizer sees
 * reads past its end, and SW_SANITIZED tells the pool to keep nothing (a reused buffer would hide a use after
 * free). */
#ifndef SW_ALLOC_H
#define SW_ALLOC_H

#include <stddef.h>
#include <stdlib.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SW_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(SW_SANITIZED)
#define SW_SANITIZED 1
#endif
#ifndef SW_SANITIZED
#define SW_SANITIZED 0
#endif

#if defined(__linux__) && !SW_SANITIZED
#include <sys/mman.h>

static char* sw_big_alloc(size_t n) {
    void* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : (char*)p;
}

static char* sw_big_grow(char* p, size_t old, size_t n) {
    void* q = mremap(p, old, n, MREMAP_MAYMOVE);
    return q == MAP_FAILED ? NULL : (char*)q;
}

static void sw_big_free(char* p, size_t n) {
    if (p != NULL)
        munmap(p, n);
}

#else

static char* sw_big_alloc(size_t n) { return (char*)malloc(n); }

static char* sw_big_grow(char* p, size_t old, size_t n) { (void)old; return (char*)realloc(p, n); }

static void sw_big_free(char* p, size_t n) { (void)n; free(p); }

#endif

#endif
