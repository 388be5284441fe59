# The rows of one relation version being built: column buffers laid out as Arrow arrays, frozen into a record
# batch when the batch closes (included by _decoder.pyx; twin: spockwire.wire._builder_py).

cdef class _Builder:
    """Rows of one relation version in Arrow-layout buffers, reserved ahead and grown geometrically."""
    cdef readonly object relation
    cdef object names
    cdef tuple specs
    cdef public Py_ssize_t ncols
    cdef public Py_ssize_t nrows
    cdef public Py_ssize_t committed
    cdef Py_ssize_t msg_mark       # rows before the row message being decoded
    cdef bint full                 # closed early: a message's values would not fit with the rows already here
    cdef Py_ssize_t cap_rows
    cdef Py_ssize_t initial_rows   # first reservation: 256 rows, fewer for very wide relations
    cdef readonly int64_t nbytes
    cdef ColBuf* cols
    cdef Buf change, lsn, ts, xid, seq, origin, subxid, toast_valid, toast_off, toast_idx
    cdef list origins          # distinct origin names seen; per row an int32 index, -1 = none
    cdef object last_origin
    cdef int32_t last_origin_idx
    cdef bint any_toast
    cdef object frozen         # pa.RecordBatch of all rows once frozen
    cdef bint views            # strings="view": the string and binary columns are string_view / binary_view
    cdef bint has_views        # ... and this relation has such a column
    cdef list pins             # input buffers the views point into (variadic buffer 1, 2, ...)
    cdef object last_pin
    cdef int32_t last_pin_idx
    cdef int64_t pinned_bytes  # total size of the pinned buffers

    def __cinit__(self, relation, tuple specs, bint views=False):
        cdef Py_ssize_t i
        self.relation = relation
        self.names = relation.column_names
        self.specs = specs
        self.views = views
        self.has_views = views and any(is_view_kind(spec.kind) for spec in specs)
        self.pins = []
        self.last_pin = None
        self.last_pin_idx = 0
        self.pinned_bytes = 0
        self.ncols = len(relation.columns)
        self.cols = NULL             # allocated by the first reservation, once a row has passed its checks
        # a first row must not reserve much more than the relation's own description took on the wire
        self.initial_rows = max(1, min(256, 16384 // max(self.ncols, 1)))
        self.origins = []
        self.last_origin = None
        self.last_origin_idx = -1

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.cols != NULL:
            for i in range(self.ncols):
                col_free(&self.cols[i])
            free(self.cols)
            self.cols = NULL
        buf_free(&self.change)
        buf_free(&self.lsn)
        buf_free(&self.ts)
        buf_free(&self.xid)
        buf_free(&self.seq)
        buf_free(&self.origin)
        buf_free(&self.subxid)
        buf_free(&self.toast_valid)
        buf_free(&self.toast_off)
        buf_free(&self.toast_idx)

    cdef int reserve_rows(self, Py_ssize_t rows) except -1:
        """Room for `rows` rows in every per-row buffer."""
        cdef Py_ssize_t i, cap = self.cap_rows * 2
        if rows <= self.cap_rows:
            return 0
        if self.cols == NULL:
            self.cols = <ColBuf*>malloc(max(self.ncols, 1) * sizeof(ColBuf))
            if self.cols == NULL:
                raise MemoryError()
            memset(self.cols, 0, max(self.ncols, 1) * sizeof(ColBuf))
            for i in range(self.ncols):
                col_init(&self.cols[i], self.specs[i])
                self.cols[i].view = self.views and is_view_kind(self.cols[i].kind)
        if cap < rows:
            cap = rows
        if cap < self.initial_rows:
            cap = self.initial_rows
        buf_grow(&self.change, cap)
        buf_grow(&self.lsn, cap * 8)
        buf_grow(&self.ts, cap * 8)
        buf_grow(&self.xid, cap * 4)
        buf_grow(&self.seq, cap * 8)
        buf_grow(&self.origin, cap * 4)
        buf_grow(&self.subxid, cap * 4)
        buf_grow(&self.toast_valid, (cap + 7) >> 3)
        buf_grow(&self.toast_off, (cap + 1) * 4)
        for i in range(self.ncols):
            col_reserve(&self.cols[i], cap)
            if self.nrows > 0:
                reserve_values(&self.cols[i], self.nrows, cap)
        self.cap_rows = cap
        return 0

    cdef int32_t origin_index(self, object origin) except -2:
        if origin is None:
            return -1
        if origin is self.last_origin:
            return self.last_origin_idx
        try:
            idx = self.origins.index(origin)
        except ValueError:
            idx = len(self.origins)
            self.origins.append(origin)
        self.last_origin = origin
        self.last_origin_idx = idx
        return idx

    cdef void fill_commit(self, Py_ssize_t start, uint64_t lsn, int64_t ts) noexcept:
        cdef Py_ssize_t i
        cdef uint64_t* l = <uint64_t*>self.lsn.data
        cdef int64_t* t = <int64_t*>self.ts.data
        for i in range(start, self.nrows):
            l[i] = lsn
            t[i] = ts + _EPOCH

    cdef object freeze(self):
        """All rows as one pa.RecordBatch; the buffers move to pyarrow and the builder takes no more rows."""
        cdef Py_ssize_t i, n = self.nrows
        if self.frozen is not None:
            return self.frozen
        if self.cap_rows == 0:
            self.reserve_rows(1)
        pins = [pa.py_buffer(o) for o in self.pins] if self.pins else None
        values = [build_array(&self.cols[i], self.specs[i], n, pins) for i in range(self.ncols)]
        self.pins = []
        self.last_pin = None
        if self.any_toast:
            nidx = (<int32_t*>self.toast_off.data)[n]
            toast_off = pa.Array.from_buffers(pa.int32(), n + 1, [None, own(&self.toast_off, (n + 1) * 4)])
            toast_idx = pa.Array.from_buffers(pa.uint16(), nidx, [None, own(&self.toast_idx, nidx * 2)])
            clear_tail_bits(&self.toast_valid, n)
            valid = pa.Array.from_buffers(pa.bool_(), n, [None, own(&self.toast_valid, (n + 7) >> 3)])
            toast_mask = pc.invert(valid)
        else:
            toast_off = toast_idx = toast_mask = None
        if self.origins:
            idx = pa.Array.from_buffers(pa.int32(), n, [None, own(&self.origin, n * 4)])
            origin = pa.array(self.origins, pa.string()).take(
                pc.if_else(pc.less(idx, 0), pa.scalar(None, pa.int32()), idx))
        else:
            origin = pa.nulls(n, pa.string())
        ts = pa.Array.from_buffers(pa.int64(), n, [None, own(&self.ts, n * 8)]).view(_TS_TYPE)
        self.frozen = finish_batch(
            self.relation,
            pa.Array.from_buffers(pa.int8(), n, [None, own(&self.change, n)]),
            pa.Array.from_buffers(pa.uint64(), n, [None, own(&self.lsn, n * 8)]),
            ts,
            pa.Array.from_buffers(pa.uint32(), n, [None, own(&self.xid, n * 4)]),
            pa.Array.from_buffers(pa.int64(), n, [None, own(&self.seq, n * 8)]),
            origin, toast_off, toast_idx, toast_mask, values)
        return self.frozen

    cdef object take_rows(self, Py_ssize_t start, Py_ssize_t stop, object keep=None):
        if stop <= start:
            return None
        cdef Py_ssize_t i
        batch = self.freeze()
        if start != 0 or stop != self.nrows:
            batch = batch.slice(start, stop - start)
        if keep is not None:
            batch = filter_batch(batch, pa.array(keep, pa.bool_()))
            if batch.num_rows == 0:
                return None
        for i in range(self.ncols):
            # an untyped column is binary in a batch only when one of the batch's own values was not text
            if (self.cols[i].kind == K_RAW or self.cols[i].kind == K_OTHER) and self.cols[i].nontext \
                    and not marks_any(&self.cols[i], start, stop, keep):
                pos = 7 + i
                text = pa.string_view() if self.cols[i].view else pa.string()
                batch = batch.set_column(pos, batch.schema.field(pos).with_type(text), batch.column(pos).cast(text))
        return ChangeBatch(self.relation, batch)

    cdef dict raw_marks(self, Py_ssize_t start, Py_ssize_t stop):
        """For each untyped column with a value in rows [start, stop) that did not arrive as text: the marks of
        those rows (what the column's type is decided by once rows of aborted subtransactions are dropped)."""
        cdef Py_ssize_t i, r
        cdef dict out = {}
        for i in range(self.ncols):
            if (self.cols[i].kind == K_RAW or self.cols[i].kind == K_OTHER) and self.cols[i].nontext \
                    and marks_any(&self.cols[i], start, stop, None):
                out[i] = [bool(self.cols[i].marks.data[r >> 3] & (1 << (r & 7))) for r in range(start, stop)]
        return out

    cdef list subxids(self, Py_ssize_t start, Py_ssize_t stop):
        cdef uint32_t* s = <uint32_t*>self.subxid.data
        return [s[i] for i in range(start, stop)]
