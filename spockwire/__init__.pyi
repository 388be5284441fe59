from types import ModuleType
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import pyarrow

from .errors import FrameError as FrameError, ProtocolError as ProtocolError, SpockwireError as SpockwireError, \
    TruncatedMessage as TruncatedMessage
from .model import ChangeBatch as ChangeBatch, Column as Column, LogicalMessage as LogicalMessage, \
    Relation as Relation, Truncate as Truncate
from .connection.stream import ReplicationStream
from .export.python import INFINITY as INFINITY, NEG_INFINITY as NEG_INFINITY, PgInfinity as PgInfinity
from .wire._decoder import CopyBinaryDecoder as CopyBinaryDecoder, Decoder as Decoder
from .wire._decoder import buffer_pool_stats as buffer_pool_stats, set_buffer_pool_bytes as set_buffer_pool_bytes
from .snapshot.reader import ReadProgress as ReadProgress
from .wire.spock_messages import SpockRepairMode as SpockRepairMode, SpockSyncEvent as SpockSyncEvent, \
    spock_message as spock_message

__impl__: str
__version__: str
__all__: list[str]


def connect(dsn: str, *, slot: str, plugin: str = "pgoutput", publication: str | Sequence[str] | None = None,
            replication_sets: str | Sequence[str] | None = None, create_slot: bool = False,
            start_lsn: int | str | None = None, binary: bool | Literal["internal"] = False,
            streaming: bool | str = False, two_phase: bool = False, messages: bool = False,
            proto_version: int | None = None,
            forward_origins: bool = True, extra_options: Mapping[str, str] | None = None,
            status_interval: float = 10.0, reconnect: bool = True, reconnect_timeout: float | None = 300.0,
            max_backoff: float = 5.0, max_batch_bytes: int = 4 << 20, read_timeout: float = 1.0,
            pump: str | ModuleType | None = None, decoder_factory: Callable[[str], Any] | None = None,
            connect_kwargs: Mapping[str, Any] | None = None,
            transport: Literal["replication", "sql"] = "replication",
            sql_batch_changes: int = 4_000_000, type_catalog: Any = "auto", heartbeat_interval: float | None = None,
            sql_split_bytes: int = 16 << 20, proto_format: Literal["native", "json"] = "native",
            failover: bool = False, require_failover_safety: bool = False, start_timeline: int | None = None,
            types: Literal["typed", "raw"] = "typed",
            numeric: Literal["decimal", "text"] = "decimal",
            on_unrepresentable: Literal["text", "error"] = "text",
            column_types: Mapping[str, Literal["text", "raw"]] | None = None) -> ReplicationStream:
    """Open a replication stream on `slot` and return it, streaming (spockwire.connection.connect)."""


def read_table(dsn: str, table: str | tuple[str, str], *, workers: int = 1, snapshot: str | None = None,
               columns: Sequence[str] | None = None, types: Literal["typed", "raw"] = "typed",
               where: str | None = None, numeric: Literal["decimal", "text"] = "decimal",
               on_unrepresentable: Literal["text", "error"] = "text",
               column_types: Mapping[str, Literal["text", "raw"]] | None = None, type_catalog: Any = "auto",
               batch_rows: int | None = None, batch_bytes: int | None = None,
               connect_kwargs: Mapping[str, Any] | None = None,
               progress: Callable[[ReadProgress], None] | None = None) -> pyarrow.Table:
    """Every row of a table under one snapshot, by binary COPY over `workers` connections (spockwire.snapshot)."""


def iter_table_batches(dsn: str, table: str | tuple[str, str], *, workers: int = 1, snapshot: str | None = None,
                       columns: Sequence[str] | None = None, types: Literal["typed", "raw"] = "typed",
                       where: str | None = None, numeric: Literal["decimal", "text"] = "decimal",
                       on_unrepresentable: Literal["text", "error"] = "text",
                       column_types: Mapping[str, Literal["text", "raw"]] | None = None,
                       type_catalog: Any = "auto", batch_rows: int | None = None, batch_bytes: int | None = None,
                       connect_kwargs: Mapping[str, Any] | None = None,
                       progress: Callable[[ReadProgress], None] | None = None) -> Iterator[pyarrow.RecordBatch]:
    """The rows of a table as record batches in bounded memory (see read_table)."""
