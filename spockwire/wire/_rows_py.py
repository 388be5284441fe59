"""Row messages (insert, update, delete) and their tuples (twin of spockwire/wire/_rows.pxi): values decoded into the
open builder of their relation."""
from __future__ import annotations

from ..errors import protocol_error
from ..model import Relation
from ..values._convert_py import ValueFailure, decode_value
from ..values.catalog import switches_to_text, text_column_spec
from ..values.failures import OFFSET_LIMIT, TOO_LARGE, value_problem
from ..values.internal import DATUM_CODES, describe_datum_failure, layout_oid
from .encodings import encoding_name
from .views import MAX_PINS, pinned_size
from ._cursor_py import _Reader, _type_name
from ._builder_py import _Builder, _column_size, _output_bytes
from ._state_py import (DELETE, INSERT, UPDATE_POST, UPDATE_PRE, _BatchFull, _PGOUTPUT, _PLAIN, _Txn, _Unrepresentable,
                        _is_utf8)
from ._transactions_py import _Transactions


class _Rows(_Transactions):
    """Row messages and their tuples."""

    # ------------------------------------------------------------------ rows
    def _builder(self, txn: _Txn, rel: Relation) -> _Builder:
        if txn.kind == _PLAIN:
            b = self._shared.get(id(rel))
            if b is not None and (b.nrows >= self._batch_rows or b.nbytes >= self._batch_bytes or b.full):
                self._flush_shared()
                b = None
            if b is None:
                b = self._shared[id(rel)] = _Builder(rel, self._specs[id(rel)], self._views)
        else:
            b = txn.builders.get(id(rel))
            if b is not None and (b.nrows >= self._batch_rows or b.nbytes >= self._batch_bytes or b.full):
                self._pend_rows(txn, b, 0, b.nrows)
                b = None
            if b is None:
                b = txn.builders[id(rel)] = _Builder(rel, self._specs[id(rel)], self._views)
        return b

    def _row_message(self, r: _Reader, t: int, sub: int) -> None:
        txn = self._current(r)
        relid = r.u32("the relation id")
        rel = self.relations.get(relid)
        if rel is None:
            raise protocol_error(r.mtype, r.pos - 4, f"row for relation {relid}, which was never described")
        body = r.pos
        b = self._builder(txn, rel)
        while True:
            mark = b.nrows
            mark_bytes = b.nbytes
            b.msg_mark = mark
            try:
                self._row_body(r, t, b, txn, sub, mark)
            except _BatchFull:
                # the message's values would take a column past Arrow's 32-bit offsets together with the rows
                # already in this batch: those rows close as a batch and the message is decoded again, alone
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                b.full = True
                r.pos = body
                b = self._builder(txn, rel)
                continue
            except _Unrepresentable as u:
                # a valid value its column's type cannot hold: the column becomes text under a new version of
                # the relation and the message is decoded again with it
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                for column in self._columns_to_switch(r, t, txn, sub, rel, body, u.column):
                    rel = self._switch_to_text(rel, column)
                r.pos = body
                b = self._builder(txn, rel)
                continue
            except BaseException:
                # a refused message leaves the builder as it was before it
                b.truncate_to(mark)
                b.nbytes = mark_bytes
                raise
            break
        txn.advance(sub, b.nrows - mark)

    def _columns_to_switch(self, r: _Reader, t: int, txn: _Txn, sub: int, rel: Relation, body: int,
                           first: int) -> list[int]:
        """The columns a row message turns to text, in the order its decoding meets them, found on a scratch
        builder: a message refused for another reason raises here and switches nothing."""
        columns = [first]
        specs = list(self._specs[id(rel)])
        while True:
            specs[columns[-1]] = text_column_spec(rel, columns[-1], self.types, self.type_catalog)
            r.pos = body
            try:
                self._row_body(r, t, _Builder(rel, tuple(specs)), txn, sub, 0)
            except _Unrepresentable as u:
                columns.append(u.column)
                continue
            return columns

    def _row_body(self, r: _Reader, t: int, b: _Builder, txn: _Txn, sub: int, mark: int) -> None:
        """The tuples of an INSERT, UPDATE or DELETE after the relation id."""
        if t == 0x49:
            r.expect(0x4E, "the new tuple marker")
            self._tuple(r, b, txn, INSERT, sub, txn.seq)
        elif t == 0x55:
            kind = r.u8("the tuple marker")
            if kind in (0x4B, 0x4F):
                self._tuple(r, b, txn, UPDATE_PRE, sub, txn.seq)
                r.expect(0x4E, "the new tuple marker")
            elif kind != 0x4E:
                raise protocol_error(r.mtype, r.pos - 1,
                                     f"expected 'K', 'O' or 'N' tuple marker, got {_type_name(kind)!r}")
            self._tuple(r, b, txn, UPDATE_POST, sub, txn.seq + b.nrows - mark)
        else:
            kind = r.u8("the tuple marker")
            if kind not in (0x4B, 0x4F):
                raise protocol_error(r.mtype, r.pos - 1,
                                     f"expected 'K' or 'O' tuple marker, got {_type_name(kind)!r}")
            self._tuple(r, b, txn, DELETE, sub, txn.seq)
        r.done()

    def _tuple(self, r: _Reader, b: _Builder, txn: _Txn, change: int, sub: int, seq: int) -> None:
        native = self._proto != _PGOUTPUT
        if native:
            r.expect(0x54, "the tuple block")
        natts = r.u16("the tuple column count")
        if natts != b.ncols:
            raise protocol_error(r.mtype, r.pos - 2, f"tuple has {natts} columns but relation "
                                 f"{b.relation.qualified_name} has {b.ncols}")
        # every column takes at least its kind byte: refuse before setting anything up for the row
        r.need(natts, "the tuple's values (at least one byte per column)")
        if b.has_views:
            self._pin_input(b)
        if b.values is None:
            b.init_columns()
        cols = b.relation.columns
        toast: list[int] | None = None
        values = b.values
        specs = b.specs
        for i in range(natts):
            name = cols[i].name
            kind = r.u8("the value kind", i, name)
            if kind == 0x6E or kind == 0x75:  # n, u
                values[i].append(None)
                if b.marks[i] is not None:
                    b.marks[i].append(False)
                if kind == 0x75:
                    if toast is None:
                        toast = []
                    toast.append(i)
            elif kind == 0x74 or kind == 0x62 or (kind == 0x69 and native):  # t, b, i
                n = r.u32("the value length", i, name)
                v = r.take(n, "the value", i, name)
                start = r.pos - n
                if kind == 0x74 and native:
                    if n == 0 or v[-1] != 0:
                        raise protocol_error(r.mtype, r.pos - 1 if n else r.pos,
                                             "text value is not NUL-terminated", i, name)
                    v = v[:-1]
                    if self._codec is not None and not v.isascii():
                        try:
                            v = v.decode(self._codec).encode("utf-8")
                        except UnicodeDecodeError:
                            raise protocol_error(r.mtype, start, "text value is not valid "
                                                 f"{encoding_name(self._codec)}", i, name) from None
                spec = specs[i]
                if b.marks[i] is not None:
                    values[i].append(v)
                    b.marks[i].append(kind != 0x74 or not _is_utf8(v))
                    b.nbytes += len(v)
                else:
                    try:
                        value = decode_value(spec, kind, v, self._big_endian)
                    except ValueFailure as failure:
                        if self.on_unrepresentable == "text" and switches_to_text(failure.code, spec):
                            raise _Unrepresentable(i) from None
                        if failure.code in DATUM_CODES:   # a refused varlena datum: its own byte and sentence
                            _code, pos, text = describe_datum_failure(v, bool(self._big_endian), spec.type_name,
                                                                      layout_oid(spec))
                            raise protocol_error(r.mtype, start + pos, text, i, name) from None
                        raise protocol_error(r.mtype, start, value_problem(failure.code, kind, v, spec.type_name),
                                             i, name) from None
                    values[i].append(value)
                    # output bytes count too: an expanding kernel (binary numeric to text) closes batches as well
                    b.nbytes += max(len(v), _output_bytes(spec, value, kind == 0x69)) if kind != 0x74 else len(v)
                if b.nbytes > OFFSET_LIMIT:
                    if b.msg_mark > 0:
                        raise _BatchFull()
                    if _column_size(spec, values[i]) > OFFSET_LIMIT:
                        raise protocol_error(r.mtype, start, value_problem(TOO_LARGE, kind, v, spec.type_name),
                                             i, name)
            else:
                raise protocol_error(r.mtype, r.pos - 1, f"unknown value kind {_type_name(kind)!r}", i, name)
        b.change.append(change)
        b.lsn.append(txn.final_lsn)
        b.ts.append(txn.commit_ts)
        b.xid.append(txn.xid)
        b.seq.append(seq)
        b.origin.append(txn.origin)
        b.toast.append(toast)
        b.subxid.append(sub)

    def _pin_input(self, b: _Builder) -> None:
        """The builder pins the input being fed (views.py), unless that takes it past pin_bytes (a new batch when
        it has rows) or past MAX_PINS buffers, or the input alone is larger than pin_bytes (the values are copied). Values are equal either way: only where
        the batches are cut depends on it, exactly as in the C decoder."""
        obj = self._pin
        if obj is None or any(p is obj for p in b.pins) or len(b.pins) >= MAX_PINS:
            return
        size = pinned_size(obj)
        if size > self.pin_bytes:
            return
        if b.pinned_bytes + size > self.pin_bytes:
            if b.msg_mark > 0:
                raise _BatchFull()
            return
        b.pins.append(obj)
        b.pinned_bytes += size
