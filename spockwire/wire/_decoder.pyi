"""Type description of the decoder; spockwire.wire._decoder (Cython) and _decoder_py (pure Python) both follow it."""
from typing import Any, Literal, Mapping, Sequence

import pyarrow

from ..model import ChangeBatch, LogicalMessage, Relation, Truncate
from ..values.catalog import TypeCatalog

IMPLEMENTATION: Literal["c", "python"]
PROTOCOLS: tuple[str, str, str]
DEFAULT_BATCH_ROWS: int
MAX_BATCH_BYTES: int
UNREPRESENTABLE_CHOICES: tuple[str, str]
DEFAULT_COPY_BATCH_ROWS: int
DEFAULT_COPY_BATCH_BYTES: int

def set_buffer_pool_bytes(limit: int) -> int:
    """Keep at most `limit` bytes of released column buffers for reuse (0: none); returns the previous limit."""

def buffer_pool_stats() -> dict[str, int]:
    """What the buffer pool keeps, and how often a buffer was reused."""


class Decoder:
    """A replication stream's messages in, committed changes out as Arrow batches.

    `protocol` is "pgoutput", "pglogical" or "spock". Options: `types` ("typed": Arrow types from the PostgreSQL
    types; "raw": values as sent), `numeric` ("decimal" | "text"), `type_catalog` (types for streams that name
    none), `on_unrepresentable` ("text" | "error"), `column_types` (per-column "text" | "raw", keyed
    "schema.table.column"), `proto_version` (spock, without its startup message), `batch_rows`, `spill_bytes` /
    `spill_dir` (rows of an open transaction beyond this wait on disk), `strings` ("plain" | "view") and
    `pin_bytes` (input bytes a view batch keeps alive).
    """
    protocol: str
    startup_params: dict[str, str]
    type_catalog: TypeCatalog | None
    def __init__(
        self,
        protocol: Literal["pgoutput", "pglogical", "spock"] = "pgoutput",
        *,
        proto_version: int | None = None,
        batch_rows: int = ...,
        types: Literal["typed", "raw"] = "typed",
        type_catalog: TypeCatalog | None = None,
        numeric: Literal["decimal", "text"] = "decimal",
        spill_bytes: int = ...,
        spill_dir: str | None = None,
        on_unrepresentable: Literal["text", "error"] = "text",
        column_types: Mapping[str, Literal["text", "raw"]] | None = None,
        strings: Literal["plain", "view"] = "plain",
        pin_bytes: int = ...,
    ) -> None: ...
    on_unrepresentable: str
    column_types: dict[str, str]
    strings: str
    pin_bytes: int
    @property
    def committed_lsn(self) -> int:
        """The LSN to acknowledge once everything drained so far is persisted; never past an open transaction."""

    @property
    def open_transactions(self) -> int:
        """Transactions begun and not yet ended: the one being received, streamed ones, prepared ones."""

    @property
    def relations(self) -> dict[int, Relation]:
        """The current version of every relation the stream described, by relation id."""

    @property
    def types(self) -> dict[int, tuple[str, str]]: ...
    @property
    def remote_insert_lsn(self) -> int: ...
    def feed(self, payload: Any, lsn: int | None = None) -> None:
        """One message: the payload of one XLogData, or one row of `pg_logical_slot_peek_binary_changes`."""

    def feed_frames(self, buffer: Any, *, partial_ok: bool = False) -> int:
        """Many messages in the frame-record framing; returns the bytes consumed (`partial_ok`: a record cut at
        the end of `buffer` is left unconsumed instead of raising)."""

    def drain(self) -> list[ChangeBatch | Truncate | LogicalMessage]:
        """The committed events decoded so far, in commit order."""



class CopyBinaryDecoder:
    """The data of one `COPY ... TO STDOUT (FORMAT binary)` of `relation`'s columns, as Arrow record batches."""
    relation: Relation
    specs: tuple[Any, ...]
    type_catalog: TypeCatalog | None
    on_unrepresentable: str
    batch_rows: int
    batch_bytes: int
    offset: int
    rows: int
    def __init__(
        self,
        relation: Relation,
        *,
        types: Literal["typed", "raw"] = "typed",
        type_catalog: TypeCatalog | None = None,
        numeric: Literal["decimal", "text"] = "decimal",
        on_unrepresentable: Literal["text", "error"] = "text",
        column_types: Mapping[str, Literal["text", "raw"]] | None = None,
        batch_rows: int = ...,
        batch_bytes: int = ...,
    ) -> None: ...
    @property
    def done(self) -> bool: ...
    @property
    def pending_rows(self) -> int: ...
    def feed(self, data: Any) -> None: ...
    def drain(self) -> list[pyarrow.RecordBatch]: ...
    def finish(self) -> list[pyarrow.RecordBatch]: ...
