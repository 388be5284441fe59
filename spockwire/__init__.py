"""spockwire: PostgreSQL logical-replication streams (spock, pglogical, pgoutput) decoded into Arrow batches.

    dec = spockwire.Decoder(protocol="pgoutput")
    dec.feed(payload)                 # one replication message
    for event in dec.drain():         # committed ChangeBatch | Truncate | LogicalMessage, in commit order
        ...
    dec.committed_lsn                 # acknowledge this once everything drained is persisted

`spockwire.__impl__` says which decoder is loaded: "c" (the Cython hot path) or "python" (the pure-Python twin).
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import FrameError, ProtocolError, SpockwireError, TruncatedMessage

__version__ = "0.1.0"

# Everything else loads at first use (PEP 562): importing a submodule (``spockwire.spark.datasource`` in Spark's
# planning processes) does not load pyarrow, numpy and the decoder.
_FROM_MODULE = {
    "INFINITY": ".python_objects", "NEG_INFINITY": ".python_objects", "PgInfinity": ".python_objects",
    "ChangeBatch": ".model", "Column": ".model", "LogicalMessage": ".model", "Relation": ".model",
    "Truncate": ".model",
    "SpockRepairMode": ".wire.spock_messages", "SpockSyncEvent": ".wire.spock_messages",
    "spock_message": ".wire.spock_messages",
    "connect": ".connection.stream",
    "ReadProgress": ".snapshot.reader", "iter_table_batches": ".snapshot.reader", "read_table": ".snapshot.reader",
}
#: names of the decoder implementation (spockwire.wire.load_implementation: the Cython hot path or its twin)
_FROM_IMPLEMENTATION = {"Decoder": "Decoder", "CopyBinaryDecoder": "CopyBinaryDecoder",
                        "set_buffer_pool_bytes": "set_buffer_pool_bytes", "buffer_pool_stats": "buffer_pool_stats",
                        "__impl__": "IMPLEMENTATION"}


def __getattr__(name: str) -> Any:
    if name in _FROM_MODULE:
        value = getattr(importlib.import_module(_FROM_MODULE[name], __name__), name)
    elif name in _FROM_IMPLEMENTATION:
        from .wire import load_implementation

        value = getattr(load_implementation(), _FROM_IMPLEMENTATION[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Decoder", "connect", "ChangeBatch", "Truncate", "LogicalMessage", "Relation", "Column",
    "SpockwireError", "ProtocolError", "TruncatedMessage", "FrameError", "INFINITY", "NEG_INFINITY", "PgInfinity",
    "spock_message", "SpockSyncEvent", "SpockRepairMode", "__impl__", "__version__",
    "read_table", "iter_table_batches", "ReadProgress", "CopyBinaryDecoder", "set_buffer_pool_bytes",
    "buffer_pool_stats",
]
