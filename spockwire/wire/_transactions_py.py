"""The decoder's relations and transactions (twin of spockwire/wire/_transactions.pxi): relations described,
transactions begun, rows pended, cut, emitted at commit, streamed and prepared transactions. Decoder builds on
_Rows (spockwire.wire._rows_py), which builds on this class."""
from __future__ import annotations

from ..errors import protocol_error
from ..model import ChangeBatch, LogicalMessage, PG_EPOCH_OFFSET_US, Relation, Truncate, pg_timestamp_to_datetime
from ..values.catalog import column_specs, text_column_spec
from .spill import released_batch, row_bytes_estimate, spill_item
from ._cursor_py import _Reader
from ._builder_py import _Builder
from ._state_py import _AFTER_BEGIN, _PLAIN, _PREPARED, _STREAM, _Txn, _lsn


class _Transactions:
    """What a Decoder does with relations and transactions (its state is set by Decoder.__init__)."""

    # ------------------------------------------------------------------ positions
    @property
    def committed_lsn(self) -> int:
        lsn = self._last_commit_end
        for t in self._streams.values():
            lsn = min(lsn, t.floor)
        for t in self._prepared.values():
            lsn = min(lsn, t.floor)
        if self._txn is not None and self._txn.kind == _PREPARED:
            lsn = min(lsn, self._txn.floor)
        return lsn

    @property
    def open_transactions(self) -> int:
        """Transactions begun and not yet ended: the one being received, streamed ones, prepared ones."""
        return (self._txn is not None) + len(self._streams) + len(self._prepared)

    # ------------------------------------------------------------------ relations
    def _stream_xid(self, r: _Reader) -> int:
        if self._stream is not None:
            return r.u32("the subtransaction xid")
        return 0

    def _relation(self, relid: int, nsp: str, name: str, cols: tuple, ident: str | None) -> None:
        previous = self.relations.get(relid)
        if previous is not None:
            self._close_builders_of(previous)
        version = self._versions.get(relid, 0) + 1
        self._versions[relid] = version
        rel = Relation(relid, nsp, name, cols, ident, version)
        self._specs[id(rel)] = column_specs(rel, self.types, self.type_catalog, self._typed, self._numeric,
                                            self.column_types)
        self.relations[relid] = rel

    def _switch_to_text(self, previous: Relation, column: int) -> Relation:
        """A new version of the relation whose `column` keeps PostgreSQL's text of every value from now on; the
        rows of the previous version close first, as for a Relation message sent again."""
        self._close_builders_of(previous)
        version = self._versions.get(previous.relid, 0) + 1
        self._versions[previous.relid] = version
        rel = Relation(previous.relid, previous.namespace, previous.name, previous.columns,
                       previous.replica_identity, version)
        specs = list(self._specs[id(previous)])
        specs[column] = text_column_spec(rel, column, self.types, self.type_catalog)
        self._specs[id(rel)] = tuple(specs)
        self.relations[previous.relid] = rel
        return rel

    def _close_builders_of(self, relation: Relation) -> None:
        """A relation is described again: the rows of its previous version that open streamed or prepared
        transactions hold in builders become pending slices now, before any row of the new version. Plain
        transactions keep their builders in creation order (self._shared), already the order of their rows."""
        key = id(relation)
        txns = [*self._streams.values(), *self._prepared.values()]
        if self._txn is not None and self._txn.kind != _PLAIN:
            txns.append(self._txn)
        for txn in txns:
            b = txn.builders.pop(key, None)
            if b is not None:
                self._pend_rows(txn, b, 0, b.nrows)

    # ------------------------------------------------------------------ transactions
    def _begin(self, r: _Reader, kind: int, xid: int, final_lsn: int, ts: int) -> _Txn:
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"BEGIN while transaction {self._txn.xid} is still open")
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "BEGIN inside a stream block")
        txn = _Txn(kind, xid, final_lsn, ts, self.committed_lsn)
        self._txn = txn
        self._after = _AFTER_BEGIN
        return txn

    def _origin(self, r: _Reader, after: int, name: str | None) -> None:
        if after != _AFTER_BEGIN:
            raise protocol_error(r.mtype, r.start, "ORIGIN message not right after BEGIN")
        txn = self._stream if self._stream is not None else self._txn
        txn.origin = name

    def _current(self, r: _Reader) -> _Txn:
        txn = self._stream if self._stream is not None else self._txn
        if txn is None:
            raise protocol_error(r.mtype, r.start, "change outside a transaction")
        return txn

    def _truncate(self, r: _Reader, nrels: int, flags: int, sub: int) -> None:
        txn = self._current(r)
        r.need(4 * nrels, "the relation ids")  # bounds the count by the bytes present before any allocation
        rels = []
        for _ in range(nrels):
            relid = r.u32("a relation id")
            rel = self.relations.get(relid)
            if rel is None:
                raise protocol_error(r.mtype, r.pos - 4, f"TRUNCATE of relation {relid}, which was never described")
            rels.append(rel)
        r.done()
        self._cut(txn)
        txn.pending.append(("truncate", tuple(rels), bool(flags & 1), bool(flags & 2), txn.seq, sub))
        txn.advance(sub, 1)

    def _logical_message(self, r: _Reader, transactional: bool, lsn: int, prefix: str, content: bytes,
                         sub: int) -> None:
        if not transactional:
            self._flush_shared()
            xid = sub if sub else None
            self._events.append(LogicalMessage(prefix, content, False, lsn, xid, None, None, None, None))
            return
        txn = self._current(r)
        self._cut(txn)
        txn.pending.append(("message", prefix, content, lsn, txn.seq, sub))
        txn.advance(sub, 1)

    def _cut(self, txn: _Txn) -> None:
        """Close the rows written so far so that a truncate/message that follows keeps its place in order."""
        if txn.kind == _PLAIN:
            self._flush_shared()
        else:
            for b in txn.builders.values():
                self._pend_rows(txn, b, 0, b.nrows)
            txn.builders = {}

    def _flush_shared(self, keep_open: bool = False) -> None:
        """Emit the committed rows of the shared builders and retire them.

        Rows of a still-open plain transaction become a pending slice of it (they come out at its COMMIT, before
        its later rows), so no row is ever copied. With `keep_open` (drain), a builder that holds only rows of the
        open transaction stays open instead, while it has room and the transaction's rows in memory stay under a
        quarter of spill_bytes: a transaction fed in many small pieces then becomes one batch per relation at its
        COMMIT, not one per piece.
        """
        builders = list(self._shared.items())
        keep: list[bool] = []
        split = len(builders)
        if keep_open and self._txn is not None:
            held = self._txn.mem
            for _key, b in builders:
                room = (b.committed == 0 and not b.full and b.nrows < self._batch_rows
                        and b.nbytes < self._batch_bytes and held + b.nbytes <= self._spill_bytes // 4)
                if room:
                    held += b.nbytes
                keep.append(room)
            # a builder stays open only if every later one does: its rows would otherwise come out after rows of
            # the same transaction parked from a later builder (a relation described again mid-transaction)
            while split > 0 and keep[split - 1]:
                split -= 1
        kept = dict(builders[split:])
        for _key, b in builders[:split]:
            if b.committed:
                self._events.append(b.take_rows(0, b.committed))
            if b.nrows > b.committed:
                self._pend_rows(self._txn, b, b.committed, b.nrows)
        self._shared = kept

    def _pend_rows(self, txn: _Txn, b: _Builder, start: int, stop: int) -> None:
        """Park closed rows on their open transaction; past spill_bytes, its parked rows go to disk."""
        if stop <= start:
            return
        txn.pending.append(("rows", b, start, stop))
        txn.mem += row_bytes_estimate(b.nbytes, b.nrows, stop - start)
        if txn.mem > self._spill_bytes:
            for k, item in enumerate(txn.pending):
                if item[0] == "rows":
                    _, pb, pstart, pstop = item
                    txn.spill, ref = spill_item(txn.spill, self._spill_dir, pb.take_rows(pstart, pstop),
                                                pb.subxid[pstart:pstop], pb.relation, pb.raw_marks(pstart, pstop))
                    txn.pending[k] = ("spilled", ref)
            txn.mem = 0

    def _release(self, txn: _Txn, commit_lsn: int, ts: int) -> None:
        """A streamed or prepared transaction committed: emit its rows, truncates and messages in order."""
        self._flush_shared()
        self._cut(txn)
        self._emit_pending(txn, commit_lsn, ts)

    def _emit_pending(self, txn: _Txn, commit_lsn: int, ts: int) -> None:
        aborted = txn.aborted
        renumber = txn.renumbering()
        when = pg_timestamp_to_datetime(ts)
        for item in txn.pending:
            kind = item[0]
            if kind == "rows":
                _, b, start, stop = item
                if txn.kind != _PLAIN:
                    b.fill_commit(start, commit_lsn, ts)
                keep = [b.subxid[i] not in aborted for i in range(start, stop)] if aborted else None
                batch = b.take_rows(start, stop, keep)
                if batch is not None:
                    if renumber:
                        batch = ChangeBatch(batch.relation, renumber.batch(batch.to_arrow()))
                    self._events.append(batch)
            elif kind == "spilled":
                if item[1] is not None:
                    plain = txn.kind == _PLAIN
                    batch = released_batch(item[1], aborted, None if plain else commit_lsn,
                                           None if plain else ts + PG_EPOCH_OFFSET_US, renumber)
                    if batch is not None:
                        self._events.append(batch)
            elif item[-1] not in aborted:
                if kind == "truncate":
                    _, rels, cascade, restart, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self._events.append(Truncate(rels, cascade, restart, commit_lsn, when, txn.xid, seq, txn.origin))
                else:
                    _, prefix, content, lsn, seq, _sub = item
                    seq = renumber.scalar(seq) if renumber else seq
                    self._events.append(LogicalMessage(prefix, content, True, lsn, txn.xid, commit_lsn, when, seq,
                                                       txn.origin))

    def _commit_plain(self, r: _Reader, commit_lsn: int, end_lsn: int, ts: int) -> None:
        txn = self._txn
        if txn is None or txn.kind != _PLAIN:
            raise protocol_error(r.mtype, r.start, "COMMIT outside a transaction")
        if commit_lsn != txn.final_lsn:
            raise protocol_error(r.mtype, r.start + 2, f"commit LSN {_lsn(commit_lsn)} does not match the BEGIN's final "
                                             f"LSN {_lsn(txn.final_lsn)}")
        self._txn = None
        # rows before its last truncate/message were cut into pending; later rows stay in the shared builders
        self._emit_pending(txn, commit_lsn, ts)
        for b in self._shared.values():
            b.committed = b.nrows
        self._last_commit_end = end_lsn

    def _stream_start(self, r: _Reader, xid: int, first: int) -> None:
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "stream start inside a stream block")
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"stream start while transaction {self._txn.xid} is open")
        if first > 1:
            raise protocol_error(r.mtype, r.start + 5, f"first-segment flag must be 0 or 1, got {first}")
        txn = self._streams.get(xid)
        if first:
            if txn is not None:
                raise protocol_error(r.mtype, r.start + 1, f"first stream segment for transaction {xid}, which is already open")
            txn = self._streams[xid] = _Txn(_STREAM, xid, 0, 0, self.committed_lsn)
            self._after = _AFTER_BEGIN
        elif txn is None:
            raise protocol_error(r.mtype, r.start + 1, f"stream segment for transaction {xid}, which never started")
        self._stream = txn

    def _stream_commit(self, r: _Reader, xid: int, commit_lsn: int, end_lsn: int, ts: int) -> None:
        self._outside_stream(r)
        txn = self._streams.pop(xid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start + 1, f"stream commit of transaction {xid}, which was never streamed")
        self._release(txn, commit_lsn, ts)
        self._last_commit_end = end_lsn

    def _stream_abort(self, r: _Reader, xid: int, subxid: int) -> None:
        self._outside_stream(r)
        txn = self._streams.get(xid)
        if txn is None:
            return
        if subxid == xid:
            del self._streams[xid]
        else:
            txn.close_run()
            txn.aborted.add(subxid)

    def _stream_prepare(self, r: _Reader, xid: int, gid: str) -> None:
        self._outside_stream(r)
        txn = self._streams.pop(xid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start + 25, f"stream prepare of transaction {xid}, which was never streamed")
        txn.kind = _PREPARED
        txn.gid = gid
        self._prepared[gid] = txn

    def _outside_stream(self, r: _Reader) -> None:
        if self._stream is not None:
            raise protocol_error(r.mtype, r.start, "message not allowed inside a stream block")
        if self._txn is not None:
            raise protocol_error(r.mtype, r.start, f"message not allowed while transaction {self._txn.xid} is open")

    def _prepare(self, r: _Reader, xid: int, gid: str) -> None:
        txn = self._txn
        if txn is None or txn.kind != _PREPARED:
            raise protocol_error(r.mtype, r.start, "PREPARE without BEGIN PREPARE")
        if txn.xid != xid or txn.gid != gid:
            raise protocol_error(r.mtype, r.start, f"PREPARE of transaction {xid} ({gid!r}) inside transaction "
                                             f"{txn.xid} ({txn.gid!r})")
        self._txn = None
        self._prepared[gid] = txn

    def _commit_prepared(self, r: _Reader, xid: int, gid: str, commit_lsn: int, end_lsn: int, ts: int) -> None:
        self._outside_stream(r)
        txn = self._prepared.pop(gid, None)
        if txn is None:
            raise protocol_error(r.mtype, r.start, f"COMMIT PREPARED of {gid!r}, which was never prepared in this stream")
        self._release(txn, commit_lsn, ts)
        self._last_commit_end = end_lsn

    def _rollback_prepared(self, r: _Reader, gid: str, end_lsn: int) -> None:
        self._outside_stream(r)
        self._prepared.pop(gid, None)
