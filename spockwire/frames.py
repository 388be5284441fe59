"""The frame-file format: raw captured plugin messages with their LSNs.

A *frame record* is ``u32 payload_length``, ``u64 lsn`` (both big-endian), then ``payload_length`` bytes of payload
(one plugin message, i.e. one XLogData payload or one row of ``pg_logical_slot_peek_binary_changes``). A record
takes ``12 + payload_length`` bytes. A sequence of records is what ``Decoder.feed_frames`` takes.

A *frame file* (``*.spwf``) is ``b"SPWFRAME"``, ``u16`` format version (1), ``u32 header_length``,
``header_length`` bytes of UTF-8 JSON (an object; only ``"protocol"`` is required; writers add ``"options"``,
``"server_version"``, ``"slot"``, ``"created_at"``, ``"proto_format": "json"`` for a capture of the pglogical /
spock JSON protocol -- without it the messages are native -- and ``"type_catalog"``: the types the stream needs,
recorded by ``spockwire capture`` -- spockwire.values.recorded), then frame records up to the end of the file. The
JSON may be followed by spaces inside ``header_length`` (room a writer keeps to rewrite the header in place).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import struct
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Iterable, Iterator, Union

from .errors import FrameError

__all__ = ["MAGIC", "FORMAT_VERSION", "RECORD_HEADER_SIZE", "encode_frame", "encode_frames", "iter_frames",
           "encode_file_header", "write_frame_file", "read_frame_file", "read_file_header", "FrameWriter",
           "PROTO_FORMAT_KEY", "frame_proto_format"]

MAGIC = b"SPWFRAME"
FORMAT_VERSION = 1
RECORD_HEADER_SIZE = 12
MAX_PAYLOAD = 0xFFFFFFFF
MAX_LSN = 0xFFFFFFFFFFFFFFFF

_RECORD = struct.Struct(">IQ")
_FILE_PREFIX = struct.Struct(">8sHI")  # magic, version, header_length
FILE_PREFIX_SIZE = _FILE_PREFIX.size  # 14

Buffer = Union[bytes, bytearray, memoryview]
PathLike = Union[str, "os.PathLike[str]"]


def _check_record(lsn: int, length: int) -> None:
    if not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"lsn {lsn} does not fit in an unsigned 64-bit integer")
    if length > MAX_PAYLOAD:
        raise ValueError(f"payload of {length} bytes is longer than a frame record can hold ({MAX_PAYLOAD})")


def encode_frame(lsn: int, payload: Buffer) -> bytes:
    """One frame record: ``u32 len``, ``u64 lsn``, payload."""
    length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    _check_record(lsn, length)
    return _RECORD.pack(length, lsn) + bytes(payload)


def encode_frames(frames: Iterable[tuple[int, Buffer]]) -> bytes:
    """Many frame records concatenated (the body of a frame file)."""
    out = bytearray()
    for lsn, payload in frames:
        length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
        _check_record(lsn, length)
        out += _RECORD.pack(length, lsn)
        out += payload
    return bytes(out)


def iter_frames(body: Buffer) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(lsn, payload)`` for each record of `body`; payloads are zero-copy views into `body`.

    Raises FrameError (``offset`` = byte offset of the broken record inside `body`) when a record header or its
    payload is cut short.
    """
    view = body if isinstance(body, memoryview) else memoryview(body)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    end = view.nbytes
    pos = 0
    unpack = _RECORD.unpack_from
    while pos < end:
        remaining = end - pos
        if remaining < RECORD_HEADER_SIZE:
            raise FrameError(
                f"truncated frame record at byte {pos}: need {RECORD_HEADER_SIZE} bytes for the record header, "
                f"{remaining} remaining", offset=pos, needed=RECORD_HEADER_SIZE, remaining=remaining)
        length, lsn = unpack(view, pos)
        start = pos + RECORD_HEADER_SIZE
        if length > end - start:
            raise FrameError(
                f"truncated frame record at byte {pos}: need {length} bytes for the payload, "
                f"{end - start} remaining", offset=pos, needed=length, remaining=end - start)
        pos = start + length
        yield lsn, view[start:pos]


def _header_dict(protocol: str, meta: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(protocol, str) or not protocol:
        raise ValueError("protocol must be a non-empty string such as 'pgoutput', 'pglogical' or 'spock'")
    header: dict[str, Any] = {"protocol": protocol}
    if "created_at" not in meta:
        header["created_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for key, value in meta.items():
        if value is not None:
            header[key] = value
    return header


def _header_json(header: dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=False, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_file_header(protocol: str, *, reserve: int = 0, **meta: Any) -> bytes:
    """The bytes a frame file starts with: magic, version, header length and the JSON header.

    ``created_at`` is filled in with the current UTC time unless given; a meta value of None is left out.
    `reserve` pads the JSON with spaces to at least that many bytes, room for `FrameWriter.set_header` to
    rewrite the header in place later (JSON allows trailing whitespace; readers need nothing new).
    """
    raw = _header_json(_header_dict(protocol, meta))
    raw += b" " * max(0, reserve - len(raw))
    return _FILE_PREFIX.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw


def write_frame_file(path: PathLike, protocol: str, frames: Iterable[tuple[int, Buffer]], **meta: Any) -> int:
    """Write a complete frame file (atomically: a temporary file renamed into place). Returns the record count."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    count = 0
    try:
        with FrameWriter(tmp, protocol, **meta) as writer:
            for lsn, payload in frames:
                writer.write(lsn, payload)
            count = writer.count
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return count


def parse_file_header(data: Buffer, *, source: str = "frame file") -> tuple[dict[str, Any], int]:
    """Validate the start of a frame file; return (header, offset of the first record)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    size = view.nbytes
    if size < FILE_PREFIX_SIZE:
        if bytes(view[:min(size, len(MAGIC))]) != MAGIC[:min(size, len(MAGIC))]:
            raise FrameError(f"{source}: not a frame file (bad magic)", offset=0)
        raise FrameError(f"{source}: truncated file header at byte 0: need {FILE_PREFIX_SIZE} bytes, "
                         f"{size} remaining", offset=0, needed=FILE_PREFIX_SIZE, remaining=size)
    magic, version, header_length = _FILE_PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise FrameError(f"{source}: not a frame file (bad magic {magic!r}, expected {MAGIC!r})", offset=0)
    if version != FORMAT_VERSION:
        raise FrameError(f"{source}: unsupported frame file version {version} (this reader knows "
                         f"{FORMAT_VERSION})", offset=8)
    if header_length > size - FILE_PREFIX_SIZE:
        raise FrameError(f"{source}: truncated file header at byte {FILE_PREFIX_SIZE}: need {header_length} "
                         f"bytes for the JSON header, {size - FILE_PREFIX_SIZE} remaining",
                         offset=FILE_PREFIX_SIZE, needed=header_length, remaining=size - FILE_PREFIX_SIZE)
    raw = bytes(view[FILE_PREFIX_SIZE:FILE_PREFIX_SIZE + header_length])
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"{source}: the JSON header is not valid UTF-8 JSON: {exc}",
                         offset=FILE_PREFIX_SIZE) from None
    if not isinstance(header, dict):
        raise FrameError(f"{source}: the JSON header must be an object", offset=FILE_PREFIX_SIZE)
    if not isinstance(header.get("protocol"), str):
        raise FrameError(f"{source}: the JSON header has no \"protocol\" string", offset=FILE_PREFIX_SIZE)
    return header, FILE_PREFIX_SIZE + header_length


def read_file_header(fh: BinaryIO, *, source: str = "frame file") -> tuple[dict[str, Any], int]:
    """The header of the frame file open as `fh` (read from its start): (header, offset of the first record)."""
    fh.seek(0)
    prefix = fh.read(FILE_PREFIX_SIZE)
    if len(prefix) < FILE_PREFIX_SIZE:
        return parse_file_header(prefix, source=source)       # raises what is wrong with it
    header_length = _FILE_PREFIX.unpack(prefix)[2]
    return parse_file_header(prefix + fh.read(header_length), source=source)


#: the header key naming the message format of a pglogical / spock capture ("native" when absent, or "json")
PROTO_FORMAT_KEY = "proto_format"


def frame_proto_format(header: dict[str, Any]) -> str:
    """The message format of a frame file's records: "native" (no ``proto_format`` key: every file written
    before the key existed) or "json"; FrameError for anything else."""
    value = header.get(PROTO_FORMAT_KEY, "native")
    if value not in ("native", "json") or (value == "json" and header.get("protocol") not in ("pglogical", "spock")):
        raise FrameError(f"frame file header: proto_format {value!r} is not readable here (native, or json for "
                         f"pglogical and spock)", offset=FILE_PREFIX_SIZE)
    return value


def read_frame_file(path: PathLike) -> tuple[dict[str, Any], memoryview]:
    """Read a frame file: its JSON header and its body (the frame records) as a memoryview.

    The records are not checked here; ``iter_frames`` (or ``Decoder.feed_frames``) reports a cut-short record.
    """
    data = Path(path).read_bytes()
    header, start = parse_file_header(data, source=str(path))
    return header, memoryview(data)[start:]


class FrameWriter:
    """Appends frame records to a new frame file.

    >>> with FrameWriter("out.spwf", "pgoutput", options={"proto_version": "1"}) as w:   # doctest: +SKIP
    ...     w.write(lsn, payload)
    """

    def __init__(self, path: PathLike, protocol: str, *, buffer_size: int = 1 << 20, header_reserve: int = 0,
                 **meta: Any) -> None:
        self.path = Path(path)
        self.protocol = protocol
        self.count = 0
        self.bytes_written = 0
        self.last_lsn: int | None = None
        head = encode_file_header(protocol, reserve=header_reserve, **meta)
        self.header: dict[str, Any] = parse_file_header(head)[0]
        self._header_room = len(head) - FILE_PREFIX_SIZE     # bytes the JSON header may take in place
        self._header_grown = False                          # set_header outgrew the room: rewritten at close
        self._fh: BinaryIO | None = open(self.path, "wb", buffering=buffer_size)  # noqa: SIM115
        self._fh.write(head)
        self.bytes_written = len(head)

    def set_header(self, **fields: Any) -> None:
        """Add or replace fields of the JSON header (a value of None removes the field).

        The header is rewritten in place, at once, when it fits the room the file was created with
        (`header_reserve`); otherwise the file is rewritten with the larger header when it is closed.
        """
        fh = self._fh
        if fh is None:
            raise ValueError(f"set_header on a closed FrameWriter ({self.path})")
        header = dict(self.header)
        for key, value in fields.items():
            if key == "protocol":
                raise ValueError("the protocol of a frame file cannot change")
            if value is None:
                header.pop(key, None)
            else:
                header[key] = value
        raw = _header_json(header)
        self.header = header
        if len(raw) > self._header_room:
            self._header_grown = True
            return
        fh.flush()
        os.pwrite(fh.fileno(), raw + b" " * (self._header_room - len(raw)), FILE_PREFIX_SIZE)

    @property
    def closed(self) -> bool:
        return self._fh is None

    def write(self, lsn: int, payload: Buffer) -> None:
        """Append one record."""
        fh = self._fh
        if fh is None:
            raise ValueError(f"write to a closed FrameWriter ({self.path})")
        length = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
        _check_record(lsn, length)
        fh.write(_RECORD.pack(length, lsn))
        fh.write(payload)
        self.count += 1
        self.bytes_written += RECORD_HEADER_SIZE + length
        self.last_lsn = lsn

    def write_many(self, frames: Iterable[tuple[int, Buffer]]) -> None:
        for lsn, payload in frames:
            self.write(lsn, payload)

    def flush(self, fsync: bool = False) -> None:
        """Push buffered records to the OS (and to disk with ``fsync=True``)."""
        if self._fh is None:
            return
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
            finally:
                self._fh.close()
                self._fh = None
            if self._header_grown:
                self._rewrite_with_header()

    def _rewrite_with_header(self) -> None:
        """The file again, with the header set_header outgrew its room with (a temporary file renamed into
        place, so a crash leaves the old file whole)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        raw = _header_json(self.header)
        try:
            with open(self.path, "rb") as src, open(tmp, "wb") as dst:
                src.seek(FILE_PREFIX_SIZE + self._header_room)
                dst.write(_FILE_PREFIX.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw)
                while True:
                    block = src.read(8 << 20)
                    if not block:
                        break
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.path)
        finally:
            if tmp.exists():
                tmp.unlink()
        self.bytes_written += len(raw) - self._header_room
        self._header_room = len(raw)
        self._header_grown = False

    def __enter__(self) -> "FrameWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fh is None else "open"
        return f"<FrameWriter {state} {self.path} protocol={self.protocol} records={self.count}>"
