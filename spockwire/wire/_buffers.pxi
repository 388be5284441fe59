# Growable C buffers in Arrow layout, and the object that hands one to pyarrow without copying.
#
# Ownership rule: a builder owns its buffers until it is frozen; freezing moves each buffer into an
# _OwnedBuffer (which frees it when pyarrow lets go) and the builder never touches them again.

from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset


cdef struct Buf:
    char* data
    Py_ssize_t cap


cdef int buf_grow(Buf* b, Py_ssize_t need) except -1:
    """Grow to at least `need` bytes: max(need, 2 × capacity).

    New bytes are not zeroed: every slot a builder hands to Arrow is written row by row (validity and flag bits
    set or cleared, offsets, values, NULL slots cleared). Only a fresh buffer's first 64 bytes are zeroed, which
    makes offsets[0] = 0. Not touching the new capacity keeps large values from paying a page fault per page twice.
    """
    cdef Py_ssize_t cap = b.cap * 2
    cdef char* p
    if cap < need:
        cap = need
    if cap < 64:
        cap = 64
    p = <char*>realloc(b.data, cap)
    if p == NULL:
        raise MemoryError(f"cannot grow a column buffer to {cap} bytes")
    if b.cap == 0:
        memset(p, 0, 64)
    b.data = p
    b.cap = cap
    return 0


cdef inline void buf_free(Buf* b) noexcept:
    free(b.data)
    b.data = NULL
    b.cap = 0


cdef class _OwnedBuffer:
    """Read-only buffer over malloc'd memory it owns; pyarrow wraps it with pa.py_buffer (zero copy)."""
    cdef char* data
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        free(self.data)
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
    b.data = NULL
    b.cap = 0
    return pa.py_buffer(o)


cdef inline void clear_tail_bits(Buf* b, Py_ssize_t n) noexcept:
    """Zero the bits after the first `n` of a bitmap's last byte (they reach IPC streams and spill files)."""
    if b.data != NULL and (n & 7):
        b.data[n >> 3] &= <char>((1 << (n & 7)) - 1)


cdef Py_ssize_t count_nulls(const char* bits, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, valid = 0
    cdef Py_ssize_t whole = n >> 3
    for i in range(whole):
        valid += __builtin_popcount(<unsigned char>bits[i])
    for i in range(whole << 3, n):
        if bits[i >> 3] & (1 << (i & 7)):
            valid += 1
    return n - valid
