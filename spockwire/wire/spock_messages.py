"""Spock's own messages: the content of a ``LogicalMessage`` whose prefix is ``Spock``.

Spock writes these with ``LogLogicalMessage`` as raw C structs in the **server's byte order**; the output plugin
forwards only the sync event (``spock.sync_event()``) to the stream, as an ``M`` message (transactional when the
call asked for it, else outside any transaction). Layouts (Spock 6.0, ``include/spock_output_plugin.h``):

* message types 1 and 2 (repair mode on / off): ``i32 message_type`` only, 4 bytes. Spock's output plugin acts on
  them and does not forward them; they are decoded here for streams read by other means.
* message type 3 (sync event): ``i32 message_type``, ``u32 origin_node_id`` (an Oid: the emitting node's id, as
  in ``spock.node.node_id``), ``64-byte name`` (NUL-padded; Spock 6.0 always leaves it empty) — 72 bytes.

:func:`spock_message` turns the bytes into a :class:`SpockSyncEvent` or :class:`SpockRepairMode`; the raw bytes
stay on the ``LogicalMessage`` (``content``). Malformed content raises :class:`spockwire.ProtocolError` (or
:class:`spockwire.TruncatedMessage` when too short), naming the Spock message and the byte offset inside the
content.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Union

from ..errors import ProtocolError, TruncatedMessage

__all__ = ["SPOCK_MESSAGE_PREFIX", "SPOCK_REPAIR_MODE_ON", "SPOCK_REPAIR_MODE_OFF", "SPOCK_SYNC_EVENT",
           "SpockSyncEvent", "SpockRepairMode", "spock_message"]

#: the prefix of every message Spock writes
SPOCK_MESSAGE_PREFIX = "Spock"
SPOCK_REPAIR_MODE_ON = 1
SPOCK_REPAIR_MODE_OFF = 2
SPOCK_SYNC_EVENT = 3

_NAMEDATALEN = 64
_SIZES = {SPOCK_REPAIR_MODE_ON: 4, SPOCK_REPAIR_MODE_OFF: 4, SPOCK_SYNC_EVENT: 8 + _NAMEDATALEN}
_WHAT = "Spock message content"


@dataclass(frozen=True)
class SpockSyncEvent:
    """A sync event (``spock.sync_event()``): a marker a subscriber waits for (``spock.wait_for_sync_event``)."""

    message_type: int  # always 3
    origin_node_id: int  # the emitting node (spock.node.node_id)
    name: str  # the event name field, without its NUL padding ("" from Spock 6.0)
    byteorder: str  # "little" or "big": the server's byte order the struct was written in


@dataclass(frozen=True)
class SpockRepairMode:
    """``spock.repair_mode(true/false)``: decoding of the rest of the transaction is switched off / back on."""

    message_type: int  # 1 (on) or 2 (off)
    enabled: bool
    byteorder: str


SpockMessage = Union[SpockSyncEvent, SpockRepairMode]


def _error(offset: int, problem: str) -> ProtocolError:
    return ProtocolError(f"bad {_WHAT} at byte {offset}: {problem}", msg_type="M", offset=offset)


def spock_message(content: bytes | bytearray | memoryview, byteorder: str | None = None) -> SpockMessage:
    """Decode the content of a ``Spock``-prefixed ``LogicalMessage``.

    `byteorder` is the server's (``"little"``/``"big"``; the startup message's ``binary.bigendian`` says which).
    Without it the order is the one in which the leading ``message_type`` is a known type (1, 2 or 3 read in the
    other order are 16777216 and up, never a known type).
    """
    data = bytes(content)
    if byteorder not in (None, "little", "big"):
        raise ValueError(f"byteorder must be 'little', 'big' or None, not {byteorder!r}")
    if len(data) < 4:
        raise TruncatedMessage(f"truncated {_WHAT}: need 4 bytes for message_type, {len(data)} remaining",
                               msg_type="M", offset=0, needed=4, remaining=len(data))
    orders = (byteorder,) if byteorder else ("little", "big")
    for order in orders:
        mtype = int.from_bytes(data[:4], order, signed=True)
        if mtype in _SIZES:
            break
    else:
        shown = ", ".join(f"{int.from_bytes(data[:4], o, signed=True)} ({o}-endian)" for o in orders)
        raise _error(0, f"unknown message_type {shown}; known: 1 (repair mode on), 2 (repair mode off), "
                        "3 (sync event)")
    size = _SIZES[mtype]
    if len(data) != size:
        kind = "sync event" if mtype == SPOCK_SYNC_EVENT else "repair mode message"
        if len(data) < size:
            raise TruncatedMessage(f"truncated {_WHAT}: need {size} bytes for a {kind}, {len(data)} remaining",
                                   msg_type="M", offset=0, needed=size, remaining=len(data))
        raise _error(size, f"{len(data) - size} bytes after the end of a {size}-byte {kind}")
    if mtype != SPOCK_SYNC_EVENT:
        return SpockRepairMode(mtype, mtype == SPOCK_REPAIR_MODE_ON, order)
    (origin,) = struct.unpack_from("<I" if order == "little" else ">I", data, 4)
    raw_name = data[8:]
    name, nul, rest = raw_name.partition(b"\0")
    if not nul:
        raise _error(8, f"the {_NAMEDATALEN}-byte name field has no NUL terminator")
    if rest.strip(b"\0"):
        raise _error(8 + len(name) + 1, "bytes other than NUL padding after the name")
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(8 + exc.start, "the name is not valid UTF-8") from None
    return SpockSyncEvent(mtype, origin, text, order)
