# Binary COPY framing (`COPY ... TO STDOUT (FORMAT binary)`) over the same value kernels as the stream's binary
# ('b') values: one value decoder (_values.pxi), two framings. Twin: CopyBinaryDecoder in _decoder_py.py.
#
# Layout: the 11-byte signature PGCOPY\n\377\r\n\0, int32 flags, int32 header extension length and the
# extension; then per row an int16 field count (-1: the trailer, the end of the data) and per field an int32
# length (-1: NULL) and that many bytes of the type's send format. Rows may be cut anywhere between two feed()
# calls: the bytes of an incomplete row wait (copied once) for the next call. Every offset in an error counts
# from the first byte of the COPY data, so the same bytes give the same error however they were cut.

from libc.stdlib cimport calloc

cdef enum:
    COPY_HEADER = 0
    COPY_ROWS = 1
    COPY_DONE = 2

cdef const char* COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

DEFAULT_COPY_BATCH_ROWS = 1 << 16
DEFAULT_COPY_BATCH_BYTES = 64 << 20


def _copy_check_options(types, numeric, on_unrepresentable, batch_rows, batch_bytes):
    if types not in ("typed", "raw"):
        raise ValueError(f"types must be 'typed' or 'raw', got {types!r}")
    if numeric not in ("decimal", "text"):
        raise ValueError(f"numeric must be 'decimal' or 'text', got {numeric!r}")
    if on_unrepresentable not in UNREPRESENTABLE_CHOICES:
        raise ValueError(f"on_unrepresentable must be 'text' or 'error', got {on_unrepresentable!r}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    if batch_bytes < 1:
        raise ValueError(f"batch_bytes must be at least 1, got {batch_bytes}")


cdef class CopyBinaryDecoder:
    """Decodes the data of one binary COPY of `relation`'s columns into Arrow record batches.

    feed(data) takes the COPY data in pieces of any size; drain() returns the batches completed so far (each at most
    `batch_rows` rows and about `batch_bytes` value bytes); finish() checks the data ended with the trailer and
    returns the last batches. Column types come from the relation's type OIDs and modifiers exactly as for the
    stream decoder (spockwire.values.catalog.column_specs), so both give the same Arrow types and values.
    """
    cdef readonly object relation
    cdef readonly tuple specs
    cdef tuple names
    cdef Py_ssize_t ncols
    cdef ColBuf* cols
    cdef Py_ssize_t nrows
    cdef Py_ssize_t cap_rows
    cdef int64_t nbytes
    cdef readonly Py_ssize_t batch_rows
    cdef readonly int64_t batch_bytes
    cdef Buf carry
    cdef Py_ssize_t carry_len
    cdef readonly int64_t offset          # bytes of COPY data consumed: the header and the complete rows
    cdef int state
    cdef list ready
    cdef bint fallback_text
    cdef readonly str on_unrepresentable
    cdef readonly object type_catalog
    cdef readonly unsigned long long rows
    cdef Py_ssize_t row_pos               # _parse: offset of the next row in the piece being decoded
    cdef int64_t mark_bytes               # value bytes of the batch before the row being decoded
    cdef Py_ssize_t* data_hint            # per column: data bytes of the last batch (reserved for the next)

    def __init__(self, relation, *, str types="typed", type_catalog=None, str numeric="decimal",
                 str on_unrepresentable="text", column_types=None, Py_ssize_t batch_rows=DEFAULT_COPY_BATCH_ROWS,
                 int64_t batch_bytes=DEFAULT_COPY_BATCH_BYTES):
        _copy_check_options(types, numeric, on_unrepresentable, batch_rows, batch_bytes)
        self.relation = relation
        self.type_catalog = type_catalog
        self.specs = column_specs(relation, {}, type_catalog, types == "typed", numeric,
                                  check_column_types(column_types))
        self.names = relation.column_names
        self.ncols = len(self.names)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.on_unrepresentable = on_unrepresentable
        self.fallback_text = on_unrepresentable == "text"
        self.state = COPY_HEADER
        self.ready = []
        self._alloc()

    def __dealloc__(self):
        self._free_cols()
        buf_free(&self.carry)
        free(self.data_hint)
        self.data_hint = NULL

    cdef void _free_cols(self) noexcept:
        cdef Py_ssize_t i
        if self.cols != NULL:
            for i in range(self.ncols):
                col_free(&self.cols[i])
            free(self.cols)
            self.cols = NULL

    cdef int _alloc(self) except -1:
        cdef Py_ssize_t i
        self._free_cols()
        if self.data_hint == NULL:
            self.data_hint = <Py_ssize_t*>calloc(max(self.ncols, 1), sizeof(Py_ssize_t))
            if self.data_hint == NULL:
                raise MemoryError()
        self.cols = <ColBuf*>malloc(max(self.ncols, 1) * sizeof(ColBuf))
        if self.cols == NULL:
            raise MemoryError()
        memset(self.cols, 0, max(self.ncols, 1) * sizeof(ColBuf))
        for i in range(self.ncols):
            col_init(&self.cols[i], self.specs[i])
        self.cap_rows = 0
        self.nrows = 0
        self.nbytes = 0
        return 0

    cdef int _reserve(self, Py_ssize_t rows) except -1:
        """Room for `rows` rows. A batch's first reservation takes all its rows at once (up to 65536) and, for a
        variable-length column, as many data bytes as the previous batch used: no regrowth, no copies (at most
        about 64 MB of fixed-width slots for very wide tables)."""
        cdef Py_ssize_t i, cap = self.cap_rows * 2
        cdef bint first = self.cap_rows == 0
        if cap < rows:
            cap = rows
        if first:
            cap = max(rows, min(self.batch_rows, 65536, max(1024, (1 << 22) // max(self.ncols, 1))))
        if cap > self.batch_rows:
            cap = max(self.batch_rows, rows)
        for i in range(self.ncols):
            col_reserve(&self.cols[i], cap)
            if first and self.data_hint[i] > self.cols[i].data.cap and is_varlen(self.cols[i].kind):
                buf_grow(&self.cols[i].data, min(self.data_hint[i] + (self.data_hint[i] >> 3), OFFSET_LIMIT))
        self.cap_rows = cap
        return 0

    @property
    def done(self):
        """True once the trailer was read."""
        return self.state == COPY_DONE

    @property
    def pending_rows(self):
        """Rows decoded but not yet handed out in a batch."""
        return self.nrows

    def feed(self, data):
        """Decode the next piece of COPY data (any buffer); complete batches wait in drain()."""
        cdef Py_buffer view
        cdef Py_ssize_t used
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if view.len == 0:
                return
            if self.state == COPY_DONE:
                raise copy_error(self.offset, "data after the end-of-data trailer")
            if self.carry_len == 0:
                used = self._parse(<const char*>view.buf, view.len, False)
                if used < view.len:
                    self._keep(<const char*>view.buf + used, view.len - used)
            else:
                self._keep(<const char*>view.buf, view.len)
                used = self._parse(self.carry.data, self.carry_len, False)
                self._drop(used)
        finally:
            PyBuffer_Release(&view)

    cdef int _keep(self, const char* p, Py_ssize_t n) except -1:
        if self.carry_len + n > self.carry.cap:
            buf_grow(&self.carry, self.carry_len + n)
        memcpy(self.carry.data + self.carry_len, p, n)
        self.carry_len += n
        return 0

    cdef void _drop(self, Py_ssize_t used) noexcept:
        if used >= self.carry_len:
            self.carry_len = 0
        elif used > 0:
            memmove(self.carry.data, self.carry.data + used, self.carry_len - used)
            self.carry_len -= used
        if self.carry_len == 0 and self.carry.cap > (1 << 24):
            buf_free(&self.carry)   # one huge row passed: give the memory back

    def drain(self):
        """The batches completed so far (list of pyarrow.RecordBatch)."""
        out = self.ready
        self.ready = []
        return out

    def finish(self):
        """The COPY data ended: raise when it stopped inside the header or a row or before the trailer; return the
        remaining batches."""
        if self.state != COPY_DONE:
            if self.carry_len == 0:
                self._parse(b"", 0, True)
            else:
                self._parse(self.carry.data, self.carry_len, True)
        self._close_batch()
        return self.drain()

    cdef Py_ssize_t _parse(self, const char* p, Py_ssize_t n, bint eof) except -1:
        """Decode whole rows from p[0:n] (which starts at stream offset self.offset); the bytes used."""
        cdef Py_ssize_t pos = 0
        if self.state == COPY_HEADER:
            pos = self._header(p, n, eof)
            if pos == 0:
                return 0
        self.row_pos = pos
        while self.state == COPY_ROWS:
            self.mark_bytes = self.nbytes
            try:
                if self._rows(p, n, eof):
                    break
            except _BatchFull:
                # the row's values would take a column past Arrow's 32-bit offsets with the rows already here:
                # those rows close as a batch and the row is decoded again, alone
                self.nbytes = self.mark_bytes
                self._close_batch()
            except _Unrepresentable as u:
                # a valid value its column's Arrow type cannot hold: the rows before close as a batch and the
                # column keeps PostgreSQL's text from this row on (as the stream decoder does)
                self.nbytes = self.mark_bytes
                self._close_batch()
                self.specs = self.specs[:u.column] + (text_column_spec(self.relation, u.column, {},
                                                                       self.type_catalog),) + self.specs[u.column + 1:]
                self._alloc()
        pos = self.row_pos
        if self.state == COPY_DONE and pos < n:
            raise copy_error(self.offset + pos, "data after the end-of-data trailer")
        self.offset += pos
        return pos

    cdef int _rows(self, const char* p, Py_ssize_t n, bint eof) except -1:
        """Rows from p[self.row_pos:] until the trailer (0) or an incomplete row (1); self.row_pos follows."""
        cdef Py_ssize_t r
        while self.state == COPY_ROWS:
            self.mark_bytes = self.nbytes
            r = self._row(p, n, self.row_pos, eof)
            if r < 0:
                self.nbytes = self.mark_bytes
                return 1
            self.row_pos = r
            self.rows += 1
            if self.nrows >= self.batch_rows or self.nbytes >= self.batch_bytes:
                self._close_batch()
        return 0

    cdef Py_ssize_t _header(self, const char* p, Py_ssize_t n, bint eof) except -1:
        """The file header: its length, or 0 while it is incomplete."""
        cdef int64_t at = self.offset
        cdef int32_t flags, ext
        if n < 11:
            if not eof:
                return 0
            raise copy_truncated(at, 11, n, "the signature")
        if memcmp(p, COPY_SIGNATURE, 11) != 0:
            raise copy_error(at, "not binary COPY data: the signature is not PGCOPY\\n\\377\\r\\n\\0")
        if n < 15:
            if not eof:
                return 0
            raise copy_truncated(at + 11, 4, n - 11, "the flags field")
        flags = sw_load_i32(p + 11)
        if flags & 0x10000:
            raise copy_error(at + 11, "the rows carry OIDs (flags bit 16), which a COPY of columns never asks for")
        if flags & 0xFFFF:
            raise copy_error(at + 11, f"unknown critical flag bits 0x{flags & 0xFFFF:04x} set in the header")
        if n < 19:
            if not eof:
                return 0
            raise copy_truncated(at + 15, 4, n - 15, "the header extension length")
        ext = sw_load_i32(p + 15)
        if ext < 0:
            raise copy_error(at + 15, f"negative header extension length {ext}")
        if n - 19 < ext:
            if not eof:
                return 0
            raise copy_truncated(at + 19, ext, n - 19, "the header extension")
        self.state = COPY_ROWS
        return 19 + ext

    cdef Py_ssize_t _row(self, const char* p, Py_ssize_t n, Py_ssize_t pos, bint eof) except -2:
        """One row from p[pos:]: the offset after it, or -1 while it is incomplete (nothing of it is kept)."""
        global appended
        cdef int64_t base = self.offset
        cdef int16_t count
        cdef int32_t flen
        cdef Py_ssize_t i, row = self.nrows, vat, dpos
        cdef ColBuf* col
        cdef int32_t* off
        cdef int rc
        cdef unsigned char bit = 1 << (row & 7)
        cdef Py_ssize_t byte = row >> 3
        if n - pos < 2:
            if not eof:
                return -1
            raise copy_truncated(base + pos, 2, n - pos, "the field count of a row (or the trailer)")
        count = <int16_t>sw_load_u16(p + pos)
        if count == -1:
            self.state = COPY_DONE
            return pos + 2
        if count != self.ncols:
            raise copy_error(base + pos, f"row has {count} fields, expected {self.ncols} (one per column read)")
        pos += 2
        if row + 1 > self.cap_rows:
            self._reserve(row + 1)
        for i in range(self.ncols):
            col = &self.cols[i]
            if n - pos < 4:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, 4, n - pos, "the field length", i, self.names[i])
            flen = sw_load_i32(p + pos)
            pos += 4
            if flen < 0:
                if flen != -1:
                    raise copy_error(base + pos - 4, f"negative field length {flen}", i, self.names[i])
                set_null(col, row)
                continue
            if n - pos < flen:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, flen, n - pos, "the value", i, self.names[i])
            vat = pos
            pos += flen
            if col.kind == K_RAW or col.kind == K_OTHER:
                col.marks.data[byte] |= bit        # a binary value: the column is binary in its batch
                off = <int32_t*>col.offsets.data
                dpos = off[row]
                if dpos + flen > OFFSET_LIMIT:
                    self._failed(F_TOO_LARGE, p + vat, flen, base + vat, i)
                if dpos + flen > col.data.cap:
                    buf_grow(&col.data, dpos + flen)
                if flen:
                    memcpy(col.data.data + dpos, p + vat, flen)
                off[row + 1] = <int32_t>(dpos + flen)
                col.validity.data[byte] |= bit
                self.nbytes += flen
            else:
                appended = 0
                rc = append_value(col, row, 0x62, p + vat, flen, -1)
                if rc:
                    self._failed(rc, p + vat, flen, base + vat, i)
                self.nbytes += flen if flen >= appended else appended
            if self.nbytes > OFFSET_LIMIT and row > 0:
                raise _BatchFull()
        self.nrows = row + 1
        return pos

    cdef int _failed(self, int rc, const char* p, Py_ssize_t n, int64_t at, Py_ssize_t i) except -1:
        if rc == F_TOO_LARGE and self.nrows > 0:
            raise _BatchFull()
        if self.fallback_text and switches_to_text(rc, self.specs[i]):
            raise _Unrepresentable(i)
        raise copy_error(at, value_problem(rc, 0x62, p[:n], self.specs[i].type_name), i, self.names[i])

    cdef int _close_batch(self) except -1:
        cdef Py_ssize_t i, n = self.nrows
        if n == 0:
            return 0
        for i in range(self.ncols):
            if is_varlen(self.cols[i].kind) and self.cols[i].offsets.data != NULL:
                self.data_hint[i] = (<int32_t*>self.cols[i].offsets.data)[n]
        arrays = [storage_array(&self.cols[i], self.specs[i], n) for i in range(self.ncols)]
        self.ready.append(pa.RecordBatch.from_arrays(arrays, names=list(self.names)))
        self._alloc()
        return 0
