"""Live replication streams: connect to a slot, pump frames into the Decoder, acknowledge, resume.

    stream = spockwire.connection.connect(dsn, slot="s1", plugin="pgoutput", publication="pub")
    for event in stream:          # ChangeBatch | Truncate | LogicalMessage, committed, in commit order
        persist(event)
        stream.ack()              # everything handed out so far is durable: the server may forget it

See docs/connection.md.
"""
from __future__ import annotations

from .errors import ConnectionLost, PluginNotAllowed, ReplicationError, ServerError, StartupRejected
from .failover import FailoverNotSupported, FailoverSafety, FailoverUnsafe, TimelineDiverged, check_failover_safety
from .options import check_startup, local_binary_params, native_options, parse_startup_message, pgoutput_options
from .slots import (SlotInfo, create_publication, create_slot, drop_publication, drop_slot, format_lsn, list_slots,
                    parse_lsn, set_failover_slot, slot_info)
from .stream import ReplicationStream, connect, load_pump

__all__ = [
    "connect", "ReplicationStream", "load_pump",
    "ReplicationError", "StartupRejected", "ConnectionLost", "ServerError", "PluginNotAllowed",
    "FailoverNotSupported", "FailoverUnsafe", "TimelineDiverged", "FailoverSafety", "check_failover_safety",
    "pgoutput_options", "native_options", "local_binary_params", "parse_startup_message", "check_startup",
    "SlotInfo", "create_slot", "set_failover_slot", "drop_slot", "list_slots", "slot_info", "create_publication", "drop_publication",
    "format_lsn", "parse_lsn",
]
