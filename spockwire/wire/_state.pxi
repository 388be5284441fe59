# What a decoder keeps between messages: a relation version's decoding plan (_RelInfo), an open transaction
# (_Txn), and the text of names read from the stream (included by _decoder.pyx; twin: spockwire.wire._state_py).

cdef class _RelInfo:
    cdef object relation
    cdef tuple specs
    cdef Py_ssize_t ncols
    cdef _Builder builder      # shared builder for plain transactions, or None


cdef class _Txn:
    cdef int kind
    cdef uint32_t xid
    cdef uint64_t final_lsn
    cdef int64_t commit_ts
    cdef object origin
    cdef int64_t seq
    cdef list pending          # ("rows", builder, start, stop) | ("truncate", ...) | ("message", ...)
    cdef dict builders         # relid -> _Builder, streamed/prepared transactions only
    cdef set aborted
    cdef uint64_t floor
    cdef object gid
    cdef object spill           # SpillFile once closed batches went to disk
    cdef int64_t mem            # estimated bytes of closed batches still in memory
    cdef dict runs              # streamed: subxid -> runs of _seq its changes took
    cdef uint32_t run_sub
    cdef int64_t run_start

    def __cinit__(self, int kind, uint32_t xid, uint64_t final_lsn, int64_t commit_ts, uint64_t floor):
        self.kind = kind
        self.xid = xid
        self.final_lsn = final_lsn
        self.commit_ts = commit_ts
        self.origin = None
        self.seq = 0
        self.pending = []
        self.builders = {}
        self.aborted = set()
        self.floor = floor
        self.gid = None
        self.spill = None
        self.mem = 0
        self.runs = {}
        self.run_sub = 0
        self.run_start = 0

    cdef inline int advance(self, uint32_t sub, int64_t n) except -1:
        """`n` changes of subtransaction `sub` took the next numbers."""
        if self.kind == STREAM and sub != self.run_sub:
            self.close_run()
            self.run_sub = sub
        self.seq += n
        return 0

    cdef int close_run(self) except -1:
        if self.seq > self.run_start:
            self.runs.setdefault(self.run_sub, []).append((self.run_start, self.seq))
        self.run_start = self.seq
        return 0

    cdef object renumbering(self):
        if not self.aborted:
            return None
        self.close_run()
        return SeqRenumber([run for sub in self.aborted for run in self.runs.get(sub, ())])


cdef bint marks_any(ColBuf* col, Py_ssize_t start, Py_ssize_t stop, object keep):
    cdef Py_ssize_t r
    for r in range(start, stop):
        if col.marks.data[r >> 3] & (1 << (r & 7)):
            if keep is None or keep[r - start]:
                return True
    return False


cdef object utf8_text_of(Cur* c, bytes raw, Py_ssize_t at, str what, int column=-1):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise_bad(c, at, f"{what} is not valid UTF-8", column)


cdef object native_text_of(Cur* c, bytes raw, Py_ssize_t at, str what, object codec, int column=-1):
    """A native name in the stream's text encoding (`codec`; None: UTF-8)."""
    if codec is None or raw.isascii():
        return utf8_text_of(c, raw, at, what, column)
    try:
        return raw.decode(codec)
    except UnicodeDecodeError:
        raise_bad(c, at, f"{what} is not valid {codec_label(codec)}", column)


cdef str codec_label(object codec):
    return encoding_name(codec)


cdef inline bint all_ascii(const char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if <unsigned char>p[i] >= 0x80:
            return False
    return True


cdef bytes latin1_to_utf8(const char* p, Py_ssize_t n):
    """LATIN1 bytes as UTF-8: every byte from 0x80 up becomes two."""
    cdef Py_ssize_t i, j = 0, extra = 0
    cdef unsigned char ch
    for i in range(n):
        if <unsigned char>p[i] >= 0x80:
            extra += 1
    out = PyBytes_FromStringAndSize(NULL, n + extra)
    cdef char* q = PyBytes_AS_STRING(out)
    for i in range(n):
        ch = <unsigned char>p[i]
        if ch < 0x80:
            q[j] = <char>ch
            j += 1
        else:
            q[j] = <char>(0xC0 | (ch >> 6))
            q[j + 1] = <char>(0x80 | (ch & 0x3F))
            j += 2
    return out


cdef str _lsn(uint64_t v):
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"
