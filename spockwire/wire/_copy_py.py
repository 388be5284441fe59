"""Binary COPY for the pure-Python twin: the framing of `COPY ... TO STDOUT (FORMAT binary)` over the same value
decoding as the stream's binary ('b') values (decode_value). Twin of CopyBinaryDecoder in _copy.pxi: same batches'
types and values, same errors."""
from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

from ..errors import copy_error, copy_truncated
from ..model import Relation
from ..values._convert_py import ValueFailure, build_array, decode_value
from ..values.catalog import check_column_types, column_specs, switches_to_text, text_column_spec
from ..values.failures import OFFSET_LIMIT, TOO_LARGE, value_problem
from ._cursor_py import _I32
from ._builder_py import _column_size, _output_bytes
from ._state_py import UNREPRESENTABLE_CHOICES, _BatchFull, _Unrepresentable

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER, _COPY_ROWS, _COPY_DONE = 0, 1, 2
_I16 = struct.Struct(">h")

DEFAULT_COPY_BATCH_ROWS = 1 << 16
DEFAULT_COPY_BATCH_BYTES = 64 << 20


def _copy_check_options(types: str, numeric: str, on_unrepresentable: str, batch_rows: int,
                        batch_bytes: int) -> None:
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


class CopyBinaryDecoder:
    """Decodes the data of one binary COPY of `relation`'s columns into Arrow record batches (see the C twin)."""

    def __init__(self, relation: Relation, *, types: str = "typed", type_catalog: Any = None,
                 numeric: str = "decimal", on_unrepresentable: str = "text", column_types: Any = None,
                 batch_rows: int = DEFAULT_COPY_BATCH_ROWS, batch_bytes: int = DEFAULT_COPY_BATCH_BYTES) -> None:
        _copy_check_options(types, numeric, on_unrepresentable, batch_rows, batch_bytes)
        self.relation = relation
        self.type_catalog = type_catalog
        self.specs = column_specs(relation, {}, type_catalog, types == "typed", numeric,
                                  check_column_types(column_types))
        self._names = relation.column_names
        self._ncols = len(self._names)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.on_unrepresentable = on_unrepresentable
        self.offset = 0          # bytes of COPY data consumed: the header and the complete rows
        self.rows = 0
        self._state = _COPY_HEADER
        self._carry = bytearray()
        self._ready: list[pa.RecordBatch] = []
        self._reset()

    def _reset(self) -> None:
        self._values: list[list[Any]] = [[] for _ in range(self._ncols)]
        self._nrows = 0
        self._nbytes = 0

    @property
    def done(self) -> bool:
        return self._state == _COPY_DONE

    @property
    def pending_rows(self) -> int:
        return self._nrows

    def feed(self, data: Any) -> None:
        data = memoryview(data).cast("B")
        if not len(data):
            return
        if self._state == _COPY_DONE:
            raise copy_error(self.offset, "data after the end-of-data trailer")
        if not self._carry:
            used = self._parse(data, False)
            if used < len(data):
                self._carry += data[used:]
        else:
            self._carry += data
            used = self._parse(memoryview(self._carry), False)
            del self._carry[:used]

    def drain(self) -> list[pa.RecordBatch]:
        out, self._ready = self._ready, []
        return out

    def finish(self) -> list[pa.RecordBatch]:
        if self._state != _COPY_DONE:
            self._parse(memoryview(bytes(self._carry)), True)
        self._close_batch()
        return self.drain()

    def _parse(self, buf: memoryview, eof: bool) -> int:
        n = len(buf)
        pos = 0
        if self._state == _COPY_HEADER:
            pos = self._header(buf, n, eof)
            if pos == 0:
                return 0
        while self._state == _COPY_ROWS:
            mark_bytes = self._nbytes
            try:
                r = self._row(buf, n, pos, eof)
            except _BatchFull:
                self._truncate_row()
                self._nbytes = mark_bytes
                self._close_batch()
                continue
            except _Unrepresentable as u:
                self._truncate_row()
                self._nbytes = mark_bytes
                self._close_batch()
                self.specs = self.specs[:u.column] + (text_column_spec(self.relation, u.column, {},
                                                                       self.type_catalog),) + self.specs[u.column + 1:]
                continue
            if r < 0:
                self._truncate_row()
                self._nbytes = mark_bytes
                break
            pos = r
            self.rows += 1
            if self._nrows >= self.batch_rows or self._nbytes >= self.batch_bytes:
                self._close_batch()
        if self._state == _COPY_DONE and pos < n:
            raise copy_error(self.offset + pos, "data after the end-of-data trailer")
        self.offset += pos
        return pos

    def _truncate_row(self) -> None:
        """Forget the values of a row that did not complete."""
        for col in self._values:
            del col[self._nrows:]

    def _header(self, buf: memoryview, n: int, eof: bool) -> int:
        at = self.offset
        if n < 11:
            if not eof:
                return 0
            raise copy_truncated(at, 11, n, "the signature")
        if bytes(buf[:11]) != _COPY_SIGNATURE:
            raise copy_error(at, "not binary COPY data: the signature is not PGCOPY\\n\\377\\r\\n\\0")
        if n < 15:
            if not eof:
                return 0
            raise copy_truncated(at + 11, 4, n - 11, "the flags field")
        flags = _I32.unpack_from(buf, 11)[0]
        if flags & 0x10000:
            raise copy_error(at + 11, "the rows carry OIDs (flags bit 16), which a COPY of columns never asks for")
        if flags & 0xFFFF:
            raise copy_error(at + 11, f"unknown critical flag bits 0x{flags & 0xFFFF:04x} set in the header")
        if n < 19:
            if not eof:
                return 0
            raise copy_truncated(at + 15, 4, n - 15, "the header extension length")
        ext = _I32.unpack_from(buf, 15)[0]
        if ext < 0:
            raise copy_error(at + 15, f"negative header extension length {ext}")
        if n - 19 < ext:
            if not eof:
                return 0
            raise copy_truncated(at + 19, ext, n - 19, "the header extension")
        self._state = _COPY_ROWS
        return 19 + ext

    def _row(self, buf: memoryview, n: int, pos: int, eof: bool) -> int:
        """One row from buf[pos:]: the offset after it, or -1 while it is incomplete."""
        base = self.offset
        names = self._names
        if n - pos < 2:
            if not eof:
                return -1
            raise copy_truncated(base + pos, 2, n - pos, "the field count of a row (or the trailer)")
        count = _I16.unpack_from(buf, pos)[0]
        if count == -1:
            self._state = _COPY_DONE
            return pos + 2
        if count != self._ncols:
            raise copy_error(base + pos, f"row has {count} fields, expected {self._ncols} (one per column read)")
        pos += 2
        values = self._values
        specs = self.specs
        for i in range(self._ncols):
            if n - pos < 4:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, 4, n - pos, "the field length", i, names[i])
            flen = _I32.unpack_from(buf, pos)[0]
            pos += 4
            if flen < 0:
                if flen != -1:
                    raise copy_error(base + pos - 4, f"negative field length {flen}", i, names[i])
                values[i].append(None)
                continue
            if n - pos < flen:
                if not eof:
                    return -1
                raise copy_truncated(base + pos, flen, n - pos, "the value", i, names[i])
            raw = bytes(buf[pos:pos + flen])
            vat = pos
            pos += flen
            spec = specs[i]
            if spec.is_raw:
                values[i].append(raw)
                self._nbytes += flen
            else:
                try:
                    value = decode_value(spec, 0x62, raw, None)
                except ValueFailure as failure:
                    if failure.code == TOO_LARGE and self._nrows > 0:
                        raise _BatchFull() from None
                    if self.on_unrepresentable == "text" and switches_to_text(failure.code, spec):
                        raise _Unrepresentable(i) from None
                    raise copy_error(base + vat, value_problem(failure.code, 0x62, raw, spec.type_name),
                                     i, names[i]) from None
                values[i].append(value)
                self._nbytes += max(flen, _output_bytes(spec, value))
            if self._nbytes > OFFSET_LIMIT:
                if self._nrows > 0:
                    raise _BatchFull()
                if _column_size(spec, values[i]) > OFFSET_LIMIT:
                    raise copy_error(base + vat, value_problem(TOO_LARGE, 0x62, raw, spec.type_name), i, names[i])
        self._nrows += 1
        return pos

    def _close_batch(self) -> None:
        if self._nrows == 0:
            return
        arrays = []
        for spec, col in zip(self.specs, self._values):
            if not spec.is_raw:
                arrays.append(build_array(spec, col))
            elif any(v is not None for v in col):
                arrays.append(pa.array(col, pa.binary()))      # binary values: the column is binary in its batch
            else:
                arrays.append(pa.array(col, pa.string()))
        self._ready.append(pa.RecordBatch.from_arrays(arrays, names=list(self._names)))
        self._reset()
