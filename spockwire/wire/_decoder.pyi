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

def set_buffer_pool_bytes(limit: int) -> int: ...
def buffer_pool_stats() -> dict[str, int]: ...

class Decoder:
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
    def committed_lsn(self) -> int: ...
    @property
    def open_transactions(self) -> int: ...
    @property
    def relations(self) -> dict[int, Relation]: ...
    @property
    def types(self) -> dict[int, tuple[str, str]]: ...
    @property
    def remote_insert_lsn(self) -> int: ...
    def feed(self, payload: Any, lsn: int | None = None) -> None: ...
    def feed_frames(self, buffer: Any, *, partial_ok: bool = False) -> int: ...
    def drain(self) -> list[ChangeBatch | Truncate | LogicalMessage]: ...


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
