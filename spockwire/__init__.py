"""spockwire: PostgreSQL logical-replication streams (spock, pglogical, pgoutput) decoded into Arrow batches.

    dec = spockwire.Decoder(protocol="pgoutput")
    dec.feed(payload)                 # one replication message
    for event in dec.drain():         # committed ChangeBatch | Truncate | LogicalMessage, in commit order
        ...
    dec.committed_lsn                 # acknowledge this once everything drained is persisted

`spockwire.__impl__` says which decoder is loaded: "c" (the Cython hot path) or "python" (the pure-Python twin).
"""
from __future__ import annotations

from .errors import FrameError, ProtocolError, SpockwireError, TruncatedMessage
from .python_objects import INFINITY, NEG_INFINITY, PgInfinity
from .model import ChangeBatch, Column, LogicalMessage, Relation, Truncate
from .wire import load_implementation as _load_implementation
from .wire.spock_messages import SpockRepairMode, SpockSyncEvent, spock_message
from .connection.stream import connect  # noqa: E402 - pure Python; psycopg2 is imported at the first call
from .snapshot.reader import ReadProgress, iter_table_batches, read_table

_impl = _load_implementation()


Decoder = _impl.Decoder
CopyBinaryDecoder = _impl.CopyBinaryDecoder
set_buffer_pool_bytes = _impl.set_buffer_pool_bytes
buffer_pool_stats = _impl.buffer_pool_stats
__impl__: str = _impl.IMPLEMENTATION
__version__ = "0.1.0"

__all__ = [
    "Decoder", "connect", "ChangeBatch", "Truncate", "LogicalMessage", "Relation", "Column",
    "SpockwireError", "ProtocolError", "TruncatedMessage", "FrameError", "INFINITY", "NEG_INFINITY", "PgInfinity",
    "spock_message", "SpockSyncEvent", "SpockRepairMode", "__impl__", "__version__",
    "read_table", "iter_table_batches", "ReadProgress", "CopyBinaryDecoder", "set_buffer_pool_bytes",
    "buffer_pool_stats",
]
