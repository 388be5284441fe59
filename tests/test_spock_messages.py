"""spockwire.spock_message: the content of Spock's own 'Spock'-prefixed messages, and clear errors for bytes that do
not follow Spock's structs. The layouts are Spock 6.0's (include/spock_output_plugin.h); the live plugin's own sync
events are decoded in tests/test_spock_live.py."""
from __future__ import annotations

import struct

import pytest

import spockwire
from spockwire import ProtocolError, SpockRepairMode, SpockSyncEvent, TruncatedMessage, spock_message


def sync_event(node: int, name: bytes = b"", order: str = "<") -> bytes:
    return struct.pack(order + "iI", 3, node) + name.ljust(64, b"\0")


def test_sync_event_in_both_byte_orders():
    assert spock_message(sync_event(49708)) == SpockSyncEvent(3, 49708, "", "little")
    assert spock_message(sync_event(49708, order=">")) == SpockSyncEvent(3, 49708, "", "big")
    assert spock_message(sync_event(7, order=">"), "big").origin_node_id == 7
    assert spock_message(memoryview(sync_event(4294967295, b"x" * 63))) == SpockSyncEvent(3, 4294967295, "x" * 63,
                                                                                          "little")
    assert spock_message(bytearray(sync_event(1, "ünï".encode()))).name == "ünï"
    assert spockwire.spock_message is spock_message


def test_repair_mode_messages():
    assert spock_message(struct.pack("<i", 1)) == SpockRepairMode(1, True, "little")
    assert spock_message(struct.pack(">i", 2)) == SpockRepairMode(2, False, "big")


@pytest.mark.parametrize("content, order, cls, text", [
    (b"", None, TruncatedMessage, "truncated Spock message content: need 4 bytes for message_type, 0 remaining"),
    (b"\x03\0\0", None, TruncatedMessage, "need 4 bytes for message_type, 3 remaining"),
    (sync_event(1)[:71], None, TruncatedMessage, "need 72 bytes for a sync event, 71 remaining"),
    (sync_event(1)[:8], None, TruncatedMessage, "need 72 bytes for a sync event, 8 remaining"),
    (sync_event(1) + b"\0", None, ProtocolError, "at byte 72: 1 bytes after the end of a 72-byte sync event"),
    (struct.pack("<i", 1) + b"\0", None, ProtocolError, "at byte 4: 1 bytes after the end of a 4-byte repair mode"),
    (struct.pack("<i", 9) + bytes(68), None, ProtocolError,
     "at byte 0: unknown message_type 9 (little-endian), 150994944 (big-endian)"),
    (struct.pack("<i", -1), None, ProtocolError, "unknown message_type -1 (little-endian), -1 (big-endian)"),
    (sync_event(1), "big", ProtocolError, "unknown message_type 50331648 (big-endian)"),
    (struct.pack("<iI", 3, 1) + b"y" * 64, None, ProtocolError, "at byte 8: the 64-byte name field has no NUL"),
    (struct.pack("<iI", 3, 1) + b"ab\0c" + bytes(60), None, ProtocolError,
     "at byte 11: bytes other than NUL padding after the name"),
    (struct.pack("<iI", 3, 1) + b"a\xff" + bytes(62), None, ProtocolError, "at byte 9: the name is not valid UTF-8"),
])
def test_malformed_content_is_a_clear_error(content, order, cls, text):
    with pytest.raises(cls) as info:
        spock_message(content, order)
    assert type(info.value) is cls and text in str(info.value)
    assert info.value.msg_type == "M" and isinstance(info.value, spockwire.SpockwireError)


def test_bad_byteorder_argument():
    with pytest.raises(ValueError, match="byteorder"):
        spock_message(sync_event(1), "middle")
