"""The pure-Python twin's read cursor (twin of spockwire/wire/_cursor.pxi): checked big-endian reads of one message,
every failure a ProtocolError naming the message type, the byte offset and what was being read."""
from __future__ import annotations

import struct

from ..errors import protocol_error, truncated

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")

#: transaction timestamps (µs since 2000-01-01) that a datetime can hold: years 1 to 9999
MIN_TXN_TS = -63_082_281_600_000_000
MAX_TXN_TS = 252_455_615_999_999_999


def _type_name(code: int) -> str:
    return chr(code) if 32 <= code < 127 else f"\\x{code:02x}"


class _Reader:
    """A bounds-checked cursor over one message. Offsets are relative to the message start."""

    __slots__ = ("buf", "pos", "end", "mtype", "start")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.mtype: str | None = None
        self.start = 0          # offset of the message type byte (8 after a spock v5 prefix)

    def need(self, n: int, what: str, column: int | None = None, name: str | None = None) -> None:
        remaining = self.end - self.pos
        if remaining < n:
            raise truncated(self.mtype, self.pos, n, remaining, what, column, name)

    def u8(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(1, what, column, name)
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def u16(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(2, what, column, name)
        v = _U16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return v

    def u32(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(4, what, column, name)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def i32(self, what: str, column: int | None = None, name: str | None = None) -> int:
        self.need(4, what, column, name)
        v = _I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        v = _I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def timestamp(self, what: str) -> int:
        """A transaction timestamp (µs since 2000): one outside years 1-9999 is no clock time a server wrote."""
        at = self.pos
        v = self.i64(what)
        if not MIN_TXN_TS <= v <= MAX_TXN_TS:
            raise protocol_error(self.mtype, at, f"{what} {v} is outside years 1-9999")
        return v

    def take(self, n: int, what: str, column: int | None = None, name: str | None = None) -> bytes:
        self.need(n, what, column, name)
        v = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return v

    def cstring(self, what: str, column: int | None = None, name: str | None = None) -> str:
        start = self.pos
        buf = self.buf
        i = start
        end = self.end
        while i < end and buf[i] != 0:
            i += 1
        if i >= end:
            raise truncated(self.mtype, start, end - start + 1, end - start, what + " (no terminating NUL)",
                            column, name)
        self.pos = i + 1
        return self.utf8(bytes(buf[start:i]), start, what, column, name)

    def utf8(self, raw: bytes, at: int, what: str, column: int | None = None, name: str | None = None) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise protocol_error(self.mtype, at, f"{what} is not valid UTF-8", column, name) from None

    def expect(self, byte: int, what: str) -> None:
        got = self.u8(what)
        if got != byte:
            raise protocol_error(self.mtype, self.pos - 1,
                                 f"expected {chr(byte)!r} for {what}, got {_type_name(got)!r}")

    def flags(self, allowed: int, what: str = "the flags") -> int:
        v = self.u8(what)
        if v & ~allowed:
            raise protocol_error(self.mtype, self.pos - 1, f"reserved bits 0x{v & ~allowed:02x} set in {what}")
        return v

    def done(self) -> None:
        if self.pos != self.end:
            raise protocol_error(self.mtype, self.pos, f"{self.end - self.pos} trailing bytes after the message")
