# Row messages (insert, update, delete) and the tuple loop: values decoded into the open builder of their
# relation (included by _decoder.pyx; twin: spockwire.wire._rows_py).

# ---------------------------------------------------------------------------------------------- rows
cdef class _Rows(_Transactions):
    """Row messages and their tuples (the per-value hot path)."""

    cdef _Builder _builder(self, _Txn txn, _RelInfo info):
        cdef _Builder b
        if txn.kind == PLAIN:
            b = info.builder
            if b is not None and (b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full):
                self._flush_shared()
                b = None
            if b is None:
                b = _Builder(info.relation, info.specs, self.views)
                info.builder = b
                self.shared.append(b)
        else:
            key = id(info)
            b = txn.builders.get(key)
            if b is not None and (b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full):
                self._pend_rows(txn, b, 0, b.nrows)
                b = None
            if b is None:
                b = _Builder(info.relation, info.specs, self.views)
                txn.builders[key] = b
        return b

    cdef int _row_message(self, Cur* c, uint8_t t, uint32_t sub) except -1:
        cdef _Txn txn = self.stream if self.stream is not None else self.txn
        cdef uint32_t relid
        cdef _RelInfo info
        cdef _Builder b
        cdef Py_ssize_t mark
        cdef uint8_t kind
        if txn is None:
            self._current(c)     # raises
        get_u32(c, &relid, "the relation id")
        if self.last_info is not None and relid == self.last_relid:
            info = self.last_info
        else:
            info = self.infos.get(relid)
            if info is None:
                raise_bad(c, c.pos - 4, f"row for relation {relid}, which was never described")
            self.last_info = info
            self.last_relid = relid
        cdef Py_ssize_t body = c.pos
        cdef int64_t mark_bytes
        cdef int rc
        b = info.builder
        if txn.kind != PLAIN or b is None or b.nrows >= self.batch_rows or b.nbytes >= self.batch_bytes or b.full:
            b = self._builder(txn, info)     # the usual case, a plain transaction's open builder, needs no call
        while True:
            mark = b.nrows
            mark_bytes = b.nbytes
            b.msg_mark = mark
            self.row_builder = b          # a refused message takes its rows back out (_refused)
            self.row_mark_bytes = mark_bytes
            if t == 0x49:     # an INSERT's one tuple without the _row_body call
                expect(c, 0x4E, "the new tuple marker")
                rc = self._tuple(c, b, txn, INSERT, sub, txn.seq)
                if rc == 0:
                    done(c)
            else:
                rc = self._row_body(c, t, b, txn, sub, mark)
            if rc == 0:
                break
            b.nrows = mark
            b.nbytes = mark_bytes
            if rc == ROW_BATCH_FULL:
                # the message's values would take a column past Arrow's 32-bit offsets together with the rows
                # already in this batch: those rows close as a batch and the message is decoded again, alone
                b.full = True
            else:
                # a valid value its column's type cannot hold: the column becomes text under a new version of
                # the relation and the message is decoded again with it
                for column in self._columns_to_switch(c, t, txn, sub, info, body, self.unrepresentable):
                    info = self._switch_to_text(info, column)
            c.pos = body
            b = self._builder(txn, info)
        self.row_builder = None
        txn.advance(sub, b.nrows - mark)
        return 0

    cdef list _columns_to_switch(self, Cur* c, uint8_t t, _Txn txn, uint32_t sub, _RelInfo info, Py_ssize_t body,
                                 Py_ssize_t first):
        """The columns a row message turns to text, in the order its decoding meets them, found on a scratch
        builder: a message refused for another reason raises here and switches nothing."""
        cdef list columns = [first]
        cdef Py_ssize_t column = first
        specs = list(info.specs)
        while True:
            specs[column] = text_column_spec(info.relation, column, self.types, self.type_catalog)
            c.pos = body
            if self._row_body(c, t, _Builder(info.relation, tuple(specs)), txn, sub, 0) == ROW_UNREPRESENTABLE:
                column = self.unrepresentable
                columns.append(column)
                continue
            return columns

    cdef int _row_body(self, Cur* c, uint8_t t, _Builder b, _Txn txn, uint32_t sub, Py_ssize_t mark) except -1:
        """The tuples of an INSERT, UPDATE or DELETE after the relation id: 0, or ROW_BATCH_FULL /
        ROW_UNREPRESENTABLE from a tuple (the message must be decoded again)."""
        cdef uint8_t kind
        cdef int rc
        if t == 0x49:
            expect(c, 0x4E, "the new tuple marker")
            rc = self._tuple(c, b, txn, INSERT, sub, txn.seq)
            if rc:
                return rc
        elif t == 0x55:
            get_u8(c, &kind, "the tuple marker")
            if kind == 0x4B or kind == 0x4F:
                rc = self._tuple(c, b, txn, UPDATE_PRE, sub, txn.seq)
                if rc:
                    return rc
                expect(c, 0x4E, "the new tuple marker")
            elif kind != 0x4E:
                raise_bad(c, c.pos - 1, f"expected 'K', 'O' or 'N' tuple marker, got {type_name(kind)!r}")
            rc = self._tuple(c, b, txn, UPDATE_POST, sub, txn.seq + b.nrows - mark)
            if rc:
                return rc
        else:
            get_u8(c, &kind, "the tuple marker")
            if kind != 0x4B and kind != 0x4F:
                raise_bad(c, c.pos - 1, f"expected 'K' or 'O' tuple marker, got {type_name(kind)!r}")
            rc = self._tuple(c, b, txn, DELETE, sub, txn.seq)
            if rc:
                return rc
        done(c)
        return 0

    cdef Py_ssize_t _rows_to_reserve(self, _Builder b, Py_ssize_t need, Py_ssize_t msg_bytes) noexcept:
        """Rows a builder that is full reserves: after its first reservation, as many as the rest of the input
        could still bring in messages of this one's size (at most batch_rows). Large buffers are mappings whose
        pages are taken only when written, so reserving ahead costs no memory; it saves the doublings, and a
        batch's buffers then come in the sizes the previous batch's left in the pool."""
        cdef Py_ssize_t want
        if b.cap_rows == 0 or self.ahead_bytes <= 0:
            return need
        want = need + self.ahead_bytes // (msg_bytes if msg_bytes > 0 else 1)
        if want > self.batch_rows:
            want = self.batch_rows
        return want if want > need else need

    cdef int _tuple(self, Cur* c, _Builder b, _Txn txn, int8_t change, uint32_t sub, int64_t seq) except -1:
        """One tuple block into row b.nrows: 0, or ROW_BATCH_FULL / ROW_UNREPRESENTABLE (nothing kept)."""
        cdef bint native = self.proto != PGOUTPUT
        cdef uint16_t natts, i
        cdef Py_ssize_t row = b.nrows, at
        cdef uint8_t kind
        cdef uint32_t n
        cdef ColBuf* col
        cdef int32_t* off
        cdef const char* p
        cdef int32_t ntoast = 0
        cdef int rc
        cdef int32_t toast_at
        cdef bytes converted              # a text value converted from the stream's encoding to UTF-8
        cdef Py_ssize_t vat               # where the value starts in the message
        cdef unsigned char bit = 1 << (row & 7)
        cdef Py_ssize_t byte = row >> 3
        # the cursor and the batch's byte count live in locals through the loop: the compiler cannot keep fields
        # behind pointers in registers across the kernels' calls
        cdef const char* base = c.base
        cdef Py_ssize_t pos, end = c.end
        cdef int64_t nbytes = b.nbytes
        cdef ColBuf* cols
        global appended
        if native:
            expect(c, 0x54, "the tuple block")
        get_u16(c, &natts, "the tuple column count")
        if natts != b.ncols:
            raise_bad(c, c.pos - 2, f"tuple has {natts} columns but relation "
                                    f"{b.relation.qualified_name} has {b.ncols}")
        pos = c.pos
        if end - pos < natts:
            # every column takes at least its kind byte: refuse before reserving anything for the row
            raise_truncated(c, pos, natts, "the tuple's values (at least one byte per column)")
        if b.has_views:
            rc = self._pin(b)
            if rc:
                return rc
        if row + 1 > b.cap_rows:
            b.reserve_rows(self._rows_to_reserve(b, row + 1, end))
        toast_at = (<int32_t*>b.toast_off.data)[row]
        cols = b.cols
        for i in range(natts):
            col = &cols[i]
            if pos >= end:
                raise_truncated(c, pos, 1, "the value kind", i, b.names[i])
            kind = <uint8_t>base[pos]
            pos += 1
            if kind == 0x74 or kind == 0x62 or (kind == 0x69 and native):  # t b i
                if end - pos < 4:
                    raise_truncated(c, pos, 4, "the value length", i, b.names[i])
                n = sw_load_u32(base + pos)
                pos += 4
                if <size_t>(end - pos) < n:
                    raise_truncated(c, pos, n, "the value", i, b.names[i])
                p = base + pos
                vat = pos
                pos += n
                if kind == 0x74 and native:
                    if n == 0 or p[n - 1] != 0:
                        raise_bad(c, pos - 1 if n else pos, "text value is not NUL-terminated", i, b.names[i])
                    n -= 1
                    if self.codec is not None and not all_ascii(p, n):
                        if self.codec == "latin-1":
                            converted = latin1_to_utf8(p, n)
                        else:
                            try:
                                converted = p[:n].decode(self.codec).encode("utf-8")
                            except UnicodeDecodeError:
                                raise_bad(c, vat, f"text value is not valid {codec_label(self.codec)}", i,
                                          b.names[i])
                        p = converted
                        n = len(converted)
                if col.kind == K_RAW or col.kind == K_OTHER:
                    if kind != 0x74 or not sw_utf8_valid(<const unsigned char*>p, n):
                        col.marks.data[byte] |= bit
                    else:
                        col.marks.data[byte] &= ~bit
                    off = <int32_t*>col.offsets.data
                    at = off[row]
                    if at + <Py_ssize_t>n > OFFSET_LIMIT:
                        return self._value_failed(c, b, vat, F_TOO_LARGE, kind, p, n, i)
                    if col.view:
                        view_store(col, row, p, n)
                    else:
                        if at + <Py_ssize_t>n > col.data.cap:
                            buf_grow(&col.data, at + n)
                        if n:   # an empty first value: no buffer yet, and no pointer arithmetic on NULL
                            sw_copy(col.data.data + at, p, n)
                    off[row + 1] = <int32_t>(at + n)
                    col.validity.data[byte] |= bit
                    nbytes += n
                elif kind == 0x62 and fixed_binary(col, row, p, n):
                    nbytes += n     # stored here: a fixed-width binary value needs no kernel call
                else:
                    appended = 0
                    rc = decode_value(col, row, kind, p, n, self.internal_order)
                    if rc:
                        return self._value_failed(c, b, vat, rc, kind, p, n, i)
                    # output bytes count too: an expanding kernel (binary numeric to text) closes batches as well
                    nbytes += n if <Py_ssize_t>n >= appended else appended
                if nbytes > OFFSET_LIMIT and b.msg_mark > 0:
                    return ROW_BATCH_FULL
            elif kind == 0x6E or kind == 0x75:  # n u
                set_null(col, row)
                if kind == 0x75:
                    if (toast_at + ntoast + 1) * 2 > b.toast_idx.cap:
                        buf_grow(&b.toast_idx, (toast_at + ntoast + 1) * 2)
                    (<uint16_t*>b.toast_idx.data)[toast_at + ntoast] = i
                    ntoast += 1
            else:
                raise_bad(c, pos - 1, f"unknown value kind {type_name(kind)!r}", i, b.names[i])
        c.pos = pos
        b.nbytes = nbytes
        (<int8_t*>b.change.data)[row] = change
        (<uint64_t*>b.lsn.data)[row] = txn.final_lsn
        (<int64_t*>b.ts.data)[row] = txn.commit_ts + _EPOCH
        (<uint32_t*>b.xid.data)[row] = txn.xid
        (<int64_t*>b.seq.data)[row] = seq
        (<int32_t*>b.origin.data)[row] = -1 if txn.origin is None else \
            b.last_origin_idx if txn.origin is b.last_origin else b.origin_index(txn.origin)
        (<uint32_t*>b.subxid.data)[row] = sub
        (<int32_t*>b.toast_off.data)[row + 1] = toast_at + ntoast
        if ntoast:
            b.toast_valid.data[byte] |= bit
            b.any_toast = True
        else:
            b.toast_valid.data[byte] &= ~bit
        b.nrows = row + 1
        return 0

    cdef int _value_failed(self, Cur* c, _Builder b, Py_ssize_t at, int rc, uint8_t kind, const char* p,
                           uint32_t n, Py_ssize_t i) except -1:
        """A value failed: ROW_BATCH_FULL when rows before the message can close first, ROW_UNREPRESENTABLE (a
        switch to text) for a valid value the column's Arrow type cannot hold, else the error."""
        if rc == F_TOO_LARGE and b.msg_mark > 0:
            return ROW_BATCH_FULL
        if self.fallback_text and switches_to_text(rc, b.specs[i]):
            self.unrepresentable = i
            return ROW_UNREPRESENTABLE
        if rc in DATUM_CODES:   # a refused varlena datum: its own byte and sentence (the twin's description)
            _code, pos, text = describe_datum_failure(p[:n], self.internal_order == 1, b.specs[i].type_name,
                                                 layout_oid(b.specs[i]))
            raise_bad(c, at + pos, text, i, b.names[i])
        raise_bad(c, at, value_problem(rc, kind, p[:n], b.specs[i].type_name), i, b.names[i])

    cdef int _pin(self, _Builder b) except -1:
        """Where the views of the row being decoded may point (views.py): the builder pins the input being fed,
        unless that would take it past pin_bytes (ROW_BATCH_FULL when it has rows) or MAX_PINS, or the input alone
        is larger than pin_bytes (the values are copied then)."""
        global pin_base, pin_end, pin_index
        cdef Py_ssize_t k
        cdef object obj = self.pin_obj
        pin_index = 0
        if obj is None:
            return 0
        if b.last_pin is not obj:
            for k in range(len(b.pins)):
                if b.pins[k] is obj:
                    break
            else:
                if len(b.pins) >= MAX_PINS or self.pin_cost > self.pin_bytes:
                    return 0
                if b.pinned_bytes + self.pin_cost > self.pin_bytes:
                    if b.msg_mark > 0:
                        return ROW_BATCH_FULL
                    return 0
                b.pins.append(obj)
                b.pinned_bytes += self.pin_cost
                k = len(b.pins) - 1
            b.last_pin = obj
            b.last_pin_idx = <int32_t>(k + 1)
        pin_index = b.last_pin_idx
        pin_base = self.pin_start
        pin_end = self.pin_start + self.pin_len
        return 0
