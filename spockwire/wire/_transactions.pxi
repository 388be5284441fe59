# The decoder's state and what happens to a transaction: relations described, transactions begun, rows pended,
# cut, emitted at commit, streamed and prepared transactions (included by _decoder.pyx; twin:
# spockwire.wire._transactions_py). Decoder (_decoder.pyx) builds on _Rows (_rows.pxi), which builds on this class.

# ---------------------------------------------------------------------------------------------- transactions
cdef class _Transactions:
    """The state of a Decoder and what it does with relations and transactions."""
    cdef readonly str protocol
    cdef int proto
    cdef int spock_version            # -1 until known
    cdef public dict startup_params
    cdef readonly dict relations
    cdef readonly dict types
    cdef readonly uint64_t remote_insert_lsn
    cdef dict versions
    cdef dict infos
    cdef list shared                  # builders in use by plain transactions, in creation order
    cdef list events
    cdef _Txn txn                     # open plain B..C or b..P transaction
    cdef _Txn stream                  # stream block in progress
    cdef dict streams                 # top xid -> streamed transaction
    cdef dict prepared                # gid -> prepared transaction
    cdef uint64_t last_commit_end
    cdef int after
    cdef Py_ssize_t batch_rows
    cdef uint32_t last_relid
    cdef _RelInfo last_info
    cdef bint typed
    cdef str numeric
    cdef readonly str on_unrepresentable
    cdef bint fallback_text
    cdef readonly dict column_types
    cdef int64_t spill_bytes
    cdef Py_ssize_t ahead_bytes       # input after the message being decoded (feed_frames): sizes reservations
    cdef int64_t batch_bytes          # a builder is sealed at this size (batch_bytes_limit)
    cdef object spill_dir
    cdef readonly object type_catalog
    cdef object codec                 # native protocols: the codec of text (startup 'encoding'); None: UTF-8
    cdef int internal_order           # server byte order of 'i' datums: 1 big, 0 little, -1 not announced
    cdef bint views                   # strings="view"
    cdef readonly str strings
    cdef readonly int64_t pin_bytes
    cdef object pin_obj               # the input being fed, when views may point into it (views.pin_source)
    cdef const char* pin_start
    cdef Py_ssize_t pin_len
    cdef int64_t pin_cost             # bytes pinning it keeps alive (views.pinned_size)
    cdef bint in_message              # a message is being decoded (cleared when it is done or refused)
    cdef int msg_after                # `after` before that message, restored when it is refused
    cdef _Builder row_builder         # the builder a row message is adding to, reset when the message is refused
    cdef int64_t row_mark_bytes       # its nbytes before the message
    cdef Py_ssize_t unrepresentable   # the column of the last ROW_UNREPRESENTABLE


    # ------------------------------------------------------------------ positions
    @property
    def committed_lsn(self):
        cdef uint64_t lsn = self.last_commit_end
        cdef _Txn t
        for t in self.streams.values():
            if t.floor < lsn:
                lsn = t.floor
        for t in self.prepared.values():
            if t.floor < lsn:
                lsn = t.floor
        if self.txn is not None and self.txn.kind == PREPARED and self.txn.floor < lsn:
            lsn = self.txn.floor
        return lsn

    @property
    def open_transactions(self):
        """Transactions begun and not yet ended: the one being received, streamed ones, prepared ones."""
        return (self.txn is not None) + len(self.streams) + len(self.prepared)

    # ------------------------------------------------------------------ relations
    cdef uint32_t _stream_xid(self, Cur* c) except? 0xFFFFFFFF:
        cdef uint32_t sub = 0
        if self.stream is not None:
            get_u32(c, &sub, "the subtransaction xid")
        return sub

    cdef _relation(self, uint32_t relid, nsp, name, tuple cols, ident):
        cdef _RelInfo previous = self.infos.get(relid)
        if previous is not None:
            self._close_builders_of(previous)
        version = self.versions.get(relid, 0) + 1
        self.versions[relid] = version
        rel = Relation(relid, nsp, name, cols, ident, version)
        cdef _RelInfo info = _RelInfo.__new__(_RelInfo)
        info.specs = column_specs(rel, self.types, self.type_catalog, self.typed, self.numeric, self.column_types)
        self.relations[relid] = rel
        info.relation = rel
        info.ncols = len(cols)
        info.builder = None
        self.infos[relid] = info
        if self.last_info is not None and self.last_relid == relid:
            self.last_info = None

    cdef _RelInfo _switch_to_text(self, _RelInfo previous, Py_ssize_t column):
        """A new version of the relation whose `column` keeps PostgreSQL's text of every value from now on; the
        rows of the previous version close first, as for a Relation message sent again."""
        self._close_builders_of(previous)
        old = previous.relation
        version = self.versions.get(old.relid, 0) + 1
        self.versions[old.relid] = version
        rel = Relation(old.relid, old.namespace, old.name, old.columns, old.replica_identity, version)
        cdef _RelInfo info = _RelInfo.__new__(_RelInfo)
        specs = list(previous.specs)
        specs[column] = text_column_spec(rel, column, self.types, self.type_catalog)
        info.specs = tuple(specs)
        info.relation = rel
        info.ncols = previous.ncols
        info.builder = None
        self.relations[old.relid] = rel
        self.infos[old.relid] = info
        self.last_info = info
        self.last_relid = old.relid
        return info

    cdef int _close_builders_of(self, _RelInfo info) except -1:
        """A relation is described again: the rows of its previous version that open streamed or prepared
        transactions hold in builders become pending slices now, before any row of the new version (a builder is
        found by its description's identity, which is not reused while the builder is open). Plain transactions
        keep their builders in creation order (self.shared), which is already the order of their rows."""
        cdef _Txn txn
        cdef _Builder b
        key = id(info)
        txns = list(self.streams.values())
        txns.extend(self.prepared.values())
        if self.txn is not None and self.txn.kind != PLAIN:
            txns.append(self.txn)
        for txn in txns:
            b = txn.builders.pop(key, None)
            if b is not None:
                self._pend_rows(txn, b, 0, b.nrows)
        return 0

    # ------------------------------------------------------------------ transactions
    cdef _Txn _begin(self, Cur* c, int kind, uint32_t xid, uint64_t final_lsn, int64_t ts):
        if self.txn is not None:
            raise_bad(c, c.start, f"BEGIN while transaction {self.txn.xid} is still open")
        if self.stream is not None:
            raise_bad(c, c.start, "BEGIN inside a stream block")
        txn = _Txn(kind, xid, final_lsn, ts, self.committed_lsn)
        self.txn = txn
        self.after = AFTER_BEGIN
        return txn

    cdef int _origin(self, Cur* c, int after, name) except -1:
        if after != AFTER_BEGIN:
            raise_bad(c, c.start, "ORIGIN message not right after BEGIN")
        txn = self.stream if self.stream is not None else self.txn
        (<_Txn>txn).origin = name
        return 0

    cdef _Txn _current(self, Cur* c):
        cdef _Txn txn = self.stream if self.stream is not None else self.txn
        if txn is None:
            raise_bad(c, c.start, "change outside a transaction")
        return txn

    cdef int _truncate(self, Cur* c, uint32_t nrels, uint8_t flags, uint32_t sub) except -1:
        cdef _Txn txn = self._current(c)
        cdef uint32_t k, relid
        need(c, 4 * <Py_ssize_t>nrels, "the relation ids")  # bounds the count before any allocation
        rels = []
        for k in range(nrels):
            relid = sw_load_u32(c.base + c.pos)
            c.pos += 4
            rel = self.relations.get(relid)
            if rel is None:
                raise_bad(c, c.pos - 4, f"TRUNCATE of relation {relid}, which was never described")
            rels.append(rel)
        done(c)
        self._cut(txn)
        txn.pending.append(("truncate", tuple(rels), bool(flags & 1), bool(flags & 2), txn.seq, sub))
        txn.advance(sub, 1)
        return 0

    cdef int _logical_message(self, Cur* c, bint transactional, uint64_t lsn, prefix, content,
                              uint32_t sub) except -1:
        cdef _Txn txn
        if not transactional:
            self._flush_shared()
            self.events.append(LogicalMessage(prefix, content, False, lsn, sub if sub else None, None, None, None,
                                              None))
            return 0
        txn = self._current(c)
        self._cut(txn)
        txn.pending.append(("message", prefix, content, lsn, txn.seq, sub))
        txn.advance(sub, 1)
        return 0

    cdef int _cut(self, _Txn txn) except -1:
        """Close the rows written so far so that a truncate/message that follows keeps its place in order."""
        cdef _Builder b
        if txn.kind == PLAIN:
            self._flush_shared()
        else:
            for b in txn.builders.values():
                self._pend_rows(txn, b, 0, b.nrows)
            txn.builders = {}
        return 0

    cdef int _flush_shared(self, bint keep_open=False) except -1:
        """Emit the committed rows of the shared builders and retire them.

        Rows of a still-open plain transaction become a pending slice of it (they come out at its COMMIT,
        before its later rows), so no row is ever copied. With `keep_open` (drain), a builder that holds only rows
        of the open transaction stays open instead, while it has room and the transaction's rows in memory stay
        under a quarter of spill_bytes: a transaction fed in many small pieces then becomes one batch per relation
        at its COMMIT, not one per piece.
        """
        cdef _Builder b
        cdef _RelInfo info
        cdef list kept, keep = []
        cdef int64_t held = 0
        cdef Py_ssize_t split
        cdef bint room
        if not self.shared:
            return 0
        split = len(self.shared)
        if keep_open and self.txn is not None:
            held = self.txn.mem
            for b in self.shared:
                room = (b.committed == 0 and not b.full and b.nrows < self.batch_rows
                        and b.nbytes < self.batch_bytes and held + b.nbytes <= self.spill_bytes // 4)
                if room:
                    held += b.nbytes
                keep.append(room)
            # a builder stays open only if every later one does: its rows would otherwise come out after rows of
            # the same transaction parked from a later builder (a relation described again mid-transaction)
            while split > 0 and keep[split - 1]:
                split -= 1
        kept = self.shared[split:]
        for b in self.shared[:split]:
            if b.committed:
                self.events.append(b.take_rows(0, b.committed))
            if b.nrows > b.committed:
                self._pend_rows(self.txn, b, b.committed, b.nrows)
        self.shared = kept
        for info in self.infos.values():
            if info.builder is not None and info.builder not in kept:     # identity: _Builder has no __eq__
                info.builder = None
        return 0

    cdef int _pend_rows(self, _Txn txn, _Builder b, Py_ssize_t start, Py_ssize_t stop) except -1:
        """Park closed rows on their open transaction; past spill_bytes, its parked rows go to disk."""
        cdef _Builder pb
        cdef Py_ssize_t k
        if stop <= start:
            return 0
        txn.pending.append(("rows", b, start, stop))
        txn.mem += row_bytes_estimate(b.nbytes, b.nrows, stop - start)
        if txn.mem > self.spill_bytes:
            for k in range(len(txn.pending)):
                item = txn.pending[k]
                if item[0] == "rows":
                    pb = item[1]
                    txn.spill, ref = spill_item(txn.spill, self.spill_dir, pb.take_rows(item[2], item[3]),
                                                pb.subxids(item[2], item[3]), pb.relation,
                                                pb.raw_marks(item[2], item[3]))
                    txn.pending[k] = ("spilled", ref)
            txn.mem = 0
        return 0

    cdef int _emit_pending(self, _Txn txn, uint64_t commit_lsn, int64_t ts) except -1:
        cdef _Builder b
        cdef Py_ssize_t start, stop
        aborted = txn.aborted
        renumber = txn.renumbering()
        when = pg_timestamp_to_datetime(ts)
        for item in txn.pending:
            kind = item[0]
            if kind == "rows":
                b = item[1]
                start = item[2]
                stop = item[3]
                if txn.kind != PLAIN:
                    b.fill_commit(start, commit_lsn, ts)
                keep = [s not in aborted for s in b.subxids(start, stop)] if aborted else None
                batch = b.take_rows(start, stop, keep)
                if batch is not None:
                    if renumber:
                        batch = ChangeBatch(batch.relation, renumber.batch(batch.to_arrow()))
                    self.events.append(batch)
            elif kind == "spilled":
                if item[1] is not None:
                    plain = txn.kind == PLAIN
                    batch = released_batch(item[1], aborted, None if plain else commit_lsn,
                                           None if plain else ts + _EPOCH, renumber)
                    if batch is not None:
                        self.events.append(batch)
            elif item[5] not in aborted:
                if kind == "truncate":
                    _, rels, cascade, restart, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self.events.append(Truncate(rels, cascade, restart, commit_lsn, when, txn.xid, seq, txn.origin))
                else:
                    _, prefix, content, lsn, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self.events.append(LogicalMessage(prefix, content, True, lsn, txn.xid, commit_lsn, when, seq,
                                                      txn.origin))
        return 0

    cdef int _release(self, _Txn txn, uint64_t commit_lsn, int64_t ts) except -1:
        """A streamed or prepared transaction committed: emit its rows, truncates and messages in order."""
        self._flush_shared()
        self._cut(txn)
        return self._emit_pending(txn, commit_lsn, ts)

    cdef int _commit_plain(self, Cur* c, uint64_t commit_lsn, uint64_t end_lsn, int64_t ts) except -1:
        cdef _Txn txn = self.txn
        cdef _Builder b
        if txn is None or txn.kind != PLAIN:
            raise_bad(c, c.start, "COMMIT outside a transaction")
        if commit_lsn != txn.final_lsn:
            raise_bad(c, c.start + 2, f"commit LSN {_lsn(commit_lsn)} does not match the BEGIN's final "
                            f"LSN {_lsn(txn.final_lsn)}")
        self.txn = None
        # rows before its last truncate/message were cut into pending; later rows stay in the shared builders
        if txn.pending:
            self._emit_pending(txn, commit_lsn, ts)
        for b in self.shared:
            b.committed = b.nrows
        self.last_commit_end = end_lsn
        return 0

    cdef int _stream_start(self, Cur* c, uint32_t xid, uint8_t first) except -1:
        cdef _Txn txn
        if self.stream is not None:
            raise_bad(c, c.start, "stream start inside a stream block")
        if self.txn is not None:
            raise_bad(c, c.start, f"stream start while transaction {self.txn.xid} is open")
        if first > 1:
            raise_bad(c, c.start + 5, f"first-segment flag must be 0 or 1, got {first}")
        txn = self.streams.get(xid)
        if first:
            if txn is not None:
                raise_bad(c, c.start + 1, f"first stream segment for transaction {xid}, which is already open")
            txn = _Txn(STREAM, xid, 0, 0, self.committed_lsn)
            self.streams[xid] = txn
            self.after = AFTER_BEGIN
        elif txn is None:
            raise_bad(c, c.start + 1, f"stream segment for transaction {xid}, which never started")
        self.stream = txn
        return 0

    cdef int _outside_stream(self, Cur* c) except -1:
        if self.stream is not None:
            raise_bad(c, c.start, "message not allowed inside a stream block")
        if self.txn is not None:
            raise_bad(c, c.start, f"message not allowed while transaction {self.txn.xid} is open")
        return 0

    cdef int _stream_commit(self, Cur* c, uint32_t xid, uint64_t commit_lsn, uint64_t end_lsn,
                            int64_t ts) except -1:
        self._outside_stream(c)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise_bad(c, c.start + 1, f"stream commit of transaction {xid}, which was never streamed")
        self._release(txn, commit_lsn, ts)
        self.last_commit_end = end_lsn
        return 0

    cdef int _stream_abort(self, Cur* c, uint32_t xid, uint32_t subxid) except -1:
        self._outside_stream(c)
        txn = self.streams.get(xid)
        if txn is None:
            return 0
        if subxid == xid:
            del self.streams[xid]
        else:
            (<_Txn>txn).close_run()
            (<_Txn>txn).aborted.add(subxid)
        return 0

    cdef int _stream_prepare(self, Cur* c, uint32_t xid, gid) except -1:
        cdef _Txn txn
        self._outside_stream(c)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise_bad(c, c.start + 25, f"stream prepare of transaction {xid}, which was never streamed")
        txn.kind = PREPARED
        txn.gid = gid
        self.prepared[gid] = txn
        return 0

    cdef int _prepare(self, Cur* c, uint32_t xid, gid) except -1:
        cdef _Txn txn = self.txn
        if txn is None or txn.kind != PREPARED:
            raise_bad(c, c.start, "PREPARE without BEGIN PREPARE")
        if txn.xid != xid or txn.gid != gid:
            raise_bad(c, c.start, f"PREPARE of transaction {xid} ({gid!r}) inside transaction {txn.xid} ({txn.gid!r})")
        self.txn = None
        self.prepared[gid] = txn
        return 0

    cdef int _commit_prepared(self, Cur* c, uint32_t xid, gid, uint64_t commit_lsn, uint64_t end_lsn,
                              int64_t ts) except -1:
        self._outside_stream(c)
        txn = self.prepared.pop(gid, None)
        if txn is None:
            raise_bad(c, c.start, f"COMMIT PREPARED of {gid!r}, which was never prepared in this stream")
        self._release(txn, commit_lsn, ts)
        self.last_commit_end = end_lsn
        return 0

    cdef int _rollback_prepared(self, Cur* c, gid, uint64_t end_lsn) except -1:
        self._outside_stream(c)
        self.prepared.pop(gid, None)
        return 0
