# Growable C buffers in Arrow layout, and the object that hands one to pyarrow without copying.
#
# Ownership rule: a builder owns its buffers until it is frozen; freezing moves each buffer into an
# _OwnedBuffer (which frees it when pyarrow lets go) and the builder never touches them again.

import os

from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset


cdef struct Buf:
    char* data
    Py_ssize_t cap


cdef extern from "include/sw_alloc.h":
    int SW_SANITIZED
    char* sw_big_alloc(size_t n) nogil
    char* sw_big_grow(char* p, size_t old, size_t n) nogil
    void sw_big_free(char* p, size_t n) nogil


# ---------------------------------------------------------------------------------------------------------------
# Small and large buffers, and the pool of large ones.
#
# A buffer of less than BIG_BYTES comes from malloc/realloc. A larger one is a mapping of its own (sw_alloc.h):
# growing it moves page table entries instead of copying bytes, and its capacity is a multiple of the page size.
# The capacity alone tells the two apart, so every owner (a builder's Buf, an _OwnedBuffer that pyarrow holds)
# frees with buf_release(data, cap).
#
# Large buffers that pyarrow (or a discarded builder) lets go of are kept in a pool for the next batch instead of
# being unmapped: the first write to each 4 KiB page of a new mapping costs a page fault (the kernel zeroes the
# page), and decoding 200,000 narrow rows into new memory ran at about 60% of the rate of decoding into pages
# already mapped. The pool keeps at most POOL_SLOTS buffers and pool_max_bytes in all (per process, 64 MiB unless
# set_buffer_pool_bytes or SPOCKWIRE_BUFFER_POOL_BYTES says otherwise; 0 turns it off and unmaps what it holds;
# always off in sanitizer builds), preferring large buffers when full. A growth takes a kept buffer of between the
# needed size and twice it, copying the old contents into it; without one it grows its own mapping (or maps a new
# one) and the pool unmaps as many bytes as that adds (pool_trim), so the pool never raises the process's peak
# memory above the peak of the buffers in use. Every pool operation runs with the GIL held (no nogil section grows
# or frees a buffer), which serialises them.

cdef enum:
    POOL_SLOTS = 256
    BIG_BYTES = 1 << 16
    PAGE_BYTES = 4096

cdef Py_ssize_t pool_max_bytes = 0 if SW_SANITIZED else int(os.environ.get("SPOCKWIRE_BUFFER_POOL_BYTES",
                                                                                  64 << 20))
cdef char* pool_data[POOL_SLOTS]
cdef Py_ssize_t pool_cap[POOL_SLOTS]
cdef Py_ssize_t pool_count = 0
cdef Py_ssize_t pool_bytes = 0
cdef unsigned long long pool_hits = 0
cdef unsigned long long pool_misses = 0


cdef inline void buf_release(char* data, Py_ssize_t cap) noexcept:
    """Give a buffer back: to the pool when it is large, to the C library otherwise."""
    if cap >= BIG_BYTES:
        pool_give(data, cap)
    else:
        free(data)


cdef char* pool_remove(Py_ssize_t i) noexcept:
    """Take kept buffer i out of the pool (the last one fills its slot); returns it."""
    global pool_count, pool_bytes
    cdef char* data = pool_data[i]
    pool_bytes -= pool_cap[i]
    pool_count -= 1
    pool_data[i] = pool_data[pool_count]
    pool_cap[i] = pool_cap[pool_count]
    return data


cdef void pool_drop(Py_ssize_t i) noexcept:
    """Unmap kept buffer i."""
    cdef Py_ssize_t cap = pool_cap[i]
    sw_big_free(pool_remove(i), cap)


cdef Py_ssize_t pool_smallest() noexcept:
    """The slot of the smallest kept buffer (0 when the pool is empty)."""
    cdef Py_ssize_t i, smallest = 0
    for i in range(1, pool_count):
        if pool_cap[i] < pool_cap[smallest]:
            smallest = i
    return smallest


cdef void pool_trim(Py_ssize_t need) noexcept:
    """Unmap kept buffers, smallest first, until `need` bytes are given back or none is left: a growth the pool
    could not serve maps new memory, and the pool gives as much back, so that memory in use plus memory kept
    never rises above what was in use at once before."""
    cdef Py_ssize_t smallest
    while need > 0 and pool_count > 0:
        smallest = pool_smallest()
        need -= pool_cap[smallest]
        pool_drop(smallest)


cdef void pool_give(char* data, Py_ssize_t cap) noexcept:
    """Keep a large buffer for reuse. A full pool makes room by unmapping smaller kept buffers (a large buffer is
    the one whose pages cost most to map again), and unmaps the buffer itself when it is the smallest."""
    global pool_count, pool_bytes
    cdef Py_ssize_t smallest
    if data == NULL:
        return
    if cap > pool_max_bytes:
        sw_big_free(data, cap)
        return
    while pool_count >= POOL_SLOTS or pool_bytes + cap > pool_max_bytes:
        smallest = pool_smallest()
        if pool_count == 0 or pool_cap[smallest] >= cap:
            sw_big_free(data, cap)
            return
        pool_drop(smallest)
    pool_data[pool_count] = data
    pool_cap[pool_count] = cap
    pool_count += 1
    pool_bytes += cap


cdef char* pool_take(Py_ssize_t need, Py_ssize_t* cap) noexcept:
    """The smallest kept buffer of at least `need` bytes and at most 2 × `need` (its capacity in *cap), or NULL."""
    global pool_hits, pool_misses
    cdef Py_ssize_t i, best = -1
    for i in range(pool_count):
        if pool_cap[i] >= need and pool_cap[i] <= 2 * need and (best < 0 or pool_cap[i] < pool_cap[best]):
            best = i
    if best < 0:
        pool_misses += 1
        return NULL
    pool_hits += 1
    cap[0] = pool_cap[best]
    return pool_remove(best)


def set_buffer_pool_bytes(Py_ssize_t limit):
    """Set how many bytes of released large column buffers the process keeps for reuse (default 64 MiB); 0 turns
    the pool off and unmaps every kept buffer. Returns the previous limit."""
    global pool_max_bytes
    cdef Py_ssize_t previous = pool_max_bytes
    if limit < 0:
        raise ValueError(f"the buffer pool limit must be 0 or more bytes, got {limit}")
    pool_max_bytes = limit
    while pool_count > 0 and pool_bytes > pool_max_bytes:
        pool_drop(pool_count - 1)
    return previous


def buffer_pool_stats():
    """The pool's state: {"buffers", "bytes", "limit", "hits", "misses"}; hits and misses count the allocations
    and growths of large buffers that found, or did not find, a kept buffer."""
    return {"buffers": pool_count, "bytes": pool_bytes, "limit": pool_max_bytes, "hits": pool_hits,
            "misses": pool_misses}


cdef int buf_grow(Buf* b, Py_ssize_t need) except -1:
    """Grow to at least `need` bytes: max(need, 2 × capacity).

    New bytes are not zeroed: every slot a builder hands to Arrow is written row by row (validity and flag bits
    set or cleared, offsets, values, NULL slots cleared). Only a fresh buffer's first 64 bytes are zeroed, which
    makes offsets[0] = 0. Not touching the new capacity keeps large values from paying a page fault per page twice.
    """
    cdef Py_ssize_t cap = b.cap * 2
    cdef Py_ssize_t got = 0
    cdef char* p
    if cap < need:
        cap = need
    if cap < 64:
        cap = 64
    if cap < BIG_BYTES:
        p = <char*>realloc(b.data, cap)
        if p == NULL:
            raise MemoryError(f"cannot grow a column buffer to {cap} bytes")
        if b.cap == 0:
            memset(p, 0, 64)
        b.data = p
        b.cap = cap
        return 0
    cap = (cap + PAGE_BYTES - 1) & ~(<Py_ssize_t>PAGE_BYTES - 1)
    p = pool_take(cap, &got) if pool_count > 0 else NULL
    if p == NULL and pool_count > 0:
        pool_trim(cap - (b.cap if b.cap >= BIG_BYTES else 0))
    if p == NULL and b.cap >= BIG_BYTES:
        p = sw_big_grow(b.data, b.cap, cap)       # the old mapping's pages move with it
        if p == NULL:
            raise MemoryError(f"cannot grow a column buffer to {cap} bytes")
        b.data = p
        b.cap = cap
        return 0
    if p == NULL:
        p = sw_big_alloc(cap)
        if p == NULL:
            raise MemoryError(f"cannot allocate a column buffer of {cap} bytes")
        got = cap
    if b.cap == 0:
        memset(p, 0, 64)
    else:
        memcpy(p, b.data, b.cap)
        buf_release(b.data, b.cap)
    b.data = p
    b.cap = got
    return 0


cdef inline void buf_free(Buf* b) noexcept:
    buf_release(b.data, b.cap)
    b.data = NULL
    b.cap = 0


cdef class _OwnedBuffer:
    """Read-only buffer over memory it owns (malloc'd, or a mapping when large: buf_release gives it back);
    pyarrow wraps it with pa.py_buffer (zero copy)."""
    cdef char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        buf_release(self.data, self.cap)
        self.data = NULL


cdef object own(Buf* b, Py_ssize_t size):
    """Move a Buf into a pyarrow Buffer of `size` bytes; the Buf is left empty."""
    cdef _OwnedBuffer o = _OwnedBuffer.__new__(_OwnedBuffer)
    if b.data == NULL:
        b.data = <char*>malloc(64)
        if b.data == NULL:
            raise MemoryError()
        memset(b.data, 0, 64)
        b.cap = 64
    o.data = b.data
    o.size = size
    o.cap = b.cap
    b.data = NULL
    b.cap = 0
    return pa.py_buffer(o)


cdef inline void clear_tail_bits(Buf* b, Py_ssize_t n) noexcept:
    """Zero the bits after the first `n` of a bitmap's last byte (they reach IPC streams and spill files)."""
    if b.data != NULL and (n & 7):
        b.data[n >> 3] &= <char>((1 << (n & 7)) - 1)


cdef inline Py_ssize_t popcount64(uint64_t x) noexcept nogil:
    """Set bits of a word (bit arithmetic: a portable wheel cannot assume the POPCNT instruction, and without it
    the compiler's builtin is a library call)."""
    x = x - ((x >> 1) & 0x5555555555555555ULL)
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL
    return <Py_ssize_t>((x * 0x0101010101010101ULL) >> 56)


cdef Py_ssize_t count_nulls(const char* bits, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, valid = 0
    cdef Py_ssize_t whole = n >> 3, words = n >> 6
    cdef uint64_t w
    for i in range(words):
        memcpy(&w, bits + (i << 3), 8)
        valid += popcount64(w)
    for i in range(words << 3, whole):
        valid += popcount64(<unsigned char>bits[i])
    for i in range(whole << 3, n):
        if bits[i >> 3] & (1 << (i & 7)):
            valid += 1
    return n - valid
