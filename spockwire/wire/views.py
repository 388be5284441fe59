"""Views over the input (``strings="view"``), shared by both decoder implementations.

With ``strings="view"`` the columns whose Arrow type is string or binary (text, varchar, name, json, jsonb, bytea and
the untyped raw columns) come out as ``string_view`` / ``binary_view``: values of up to 12 bytes sit inline in the
view, longer ones point into the input buffer the decoder was fed, which the batch then keeps alive (it is
*pinned*), or, when that buffer cannot be pinned or the value's bytes were changed by decoding (a hex bytea, text
converted from another encoding, a decompressed datum), into a buffer of the batch's own.

Only immutable input is pinned: ``bytes``, or a read-only ``memoryview`` whose underlying object is ``bytes``; a
``bytearray`` (which its owner may overwrite) or anything else is copied. A batch pins at most ``pin_bytes`` bytes
of input buffers (the whole sizes of the objects they keep alive: a memoryview's underlying bytes) and at most ``MAX_PINS`` buffers: a row message whose input would take
the batch past ``pin_bytes`` starts a new batch when the batch already has rows; an input larger than ``pin_bytes``
on its own is never pinned, nor are inputs past ``MAX_PINS`` buffers (their values are copied).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..values.failures import OFFSET_LIMIT

__all__ = ["STRINGS_CHOICES", "DEFAULT_PIN_BYTES", "MAX_PINS", "check_strings", "pin_source", "views_supported",
           "plain_type", "to_plain", "from_plain", "filter_batch", "pinned_size"]

STRINGS_CHOICES = ("plain", "view")
#: input bytes one batch keeps alive at most (the sum of its pinned buffers' sizes)
DEFAULT_PIN_BYTES = 256 << 20
#: input buffers one batch pins at most (feeding one message at a time pins one buffer per message)
MAX_PINS = 1024


def views_supported() -> bool:
    """pyarrow 16 and later have the string_view and binary_view types."""
    return hasattr(pa, "string_view") and hasattr(pa, "binary_view")


def check_strings(strings: str, pin_bytes: int) -> bool:
    """Validate the decoder's ``strings`` and ``pin_bytes`` options; True for views."""
    if strings not in STRINGS_CHOICES:
        raise ValueError(f"strings must be 'plain' or 'view', got {strings!r}")
    if pin_bytes < 0:
        raise ValueError(f"pin_bytes must not be negative, got {pin_bytes}")
    if strings == "view" and not views_supported():
        raise ValueError(f"strings='view' needs pyarrow >= 16 (string_view); pyarrow {pa.__version__} is installed")
    return strings == "view"


def pinned_size(buffer: Any) -> int:
    """The bytes a batch keeps alive by pinning `buffer` (a pin_source): all of the underlying bytes object, also
    when only a slice of it was fed."""
    return len(buffer.obj) if type(buffer) is memoryview else len(buffer)


def pin_source(buffer: Any) -> Any:
    """`buffer` when views may point into it (immutable, addressable with 32-bit offsets), else None."""
    if type(buffer) is bytes:
        return buffer if len(buffer) <= OFFSET_LIMIT else None
    if type(buffer) is memoryview and buffer.readonly and type(buffer.obj) is bytes and buffer.c_contiguous:
        return buffer if buffer.nbytes <= OFFSET_LIMIT else None
    return None


def _is_view(t: pa.DataType) -> bool:
    return views_supported() and (t == pa.string_view() or t == pa.binary_view())


def plain_type(t: pa.DataType) -> pa.DataType:
    """string for string_view, binary for binary_view, any other type as is."""
    if views_supported():
        if t == pa.string_view():
            return pa.string()
        if t == pa.binary_view():
            return pa.binary()
    return t


def to_plain(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[int]]:
    """The batch with its view columns cast to string / binary (one copy of the bytes they reference), and the
    positions cast. For writers of plain types, and for the spill file: Arrow IPC writes a view column's variadic
    buffers whole, which for a pinned input buffer is much more than the batch's own bytes."""
    positions = [i for i, f in enumerate(batch.schema) if _is_view(f.type)]
    for i in positions:
        field = batch.schema.field(i)
        typ = plain_type(field.type)
        batch = batch.set_column(i, field.with_type(typ), batch.column(i).cast(typ))
    return batch, positions


def from_plain(batch: pa.RecordBatch, positions: list[int]) -> pa.RecordBatch:
    """Undo to_plain for `positions` (string -> string_view, binary -> binary_view)."""
    for i in positions:
        field = batch.schema.field(i)
        typ = pa.binary_view() if pa.types.is_binary(field.type) else pa.string_view()
        batch = batch.set_column(i, field.with_type(typ), batch.column(i).cast(typ))
    return batch


def filter_batch(batch: pa.RecordBatch, mask: pa.Array) -> pa.RecordBatch:
    """batch.filter(mask), also for view columns: pyarrow's filter and take kernels have no string_view /
    binary_view case (pyarrow 26), so those columns are filtered as string / binary and made views again."""
    plain, positions = to_plain(batch)
    if not positions:
        return batch.filter(mask)
    return from_plain(plain.filter(mask), positions)
