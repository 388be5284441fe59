"""Decoding a frame file in parallel on Spark executors.

    df = spockwire.spark.decode_frame_file(spark, "/shared/capture.spwf", table="public.orders")

The driver scans the record headers once (it reads each record's type byte, and the few message kinds that
carry stream state in full) and cuts the body into chunks of about `chunk_bytes`, only where no transaction,
stream or prepared transaction is open. Each chunk carries a preamble: the latest startup message (pglogical,
spock), type ('Y') and relation ('R') messages seen before it, so it decodes on its own. The chunks are decoded
with the Cython decoder inside ``mapInArrow`` -- one Spark task per chunk -- and come out exactly as a
sequential decode of the file would (same rows, same ``_commit_lsn``/``_seq``).

The file must be readable at the same path from every executor (shared storage), as any Spark input.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa

from ..errors import FrameError
from ..frames import RECORD_HEADER_SIZE, encode_frame, frame_proto_format, read_file_header
from ..values.recorded import RecordedTypeCatalog
from . import schema as S
from .slot import decoder_types_supported, make_decoder, select_events

__all__ = ["Chunk", "plan_chunks", "decode_frame_file", "decode_chunk"]

_RECORD = struct.Struct(">IQ")
_U32 = struct.Struct(">I")
#: bytes of a payload the scan reads (enough for every field it looks at); R, Y and S are read in full
_PEEK = 40


@dataclass(frozen=True)
class Chunk:
    """Records ``[start, end)`` (byte offsets in the file) and the frame records to feed before them."""

    index: int
    start: int
    end: int
    preamble: bytes


class _Scanner:
    """Follows just enough of the protocol to know where a chunk may start."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.prefix = 0              # spock proto 5: an 8-byte LSN before the type byte
        self.in_txn = False
        self.in_stream_block = False
        self.streams: set[int] = set()
        self.prepared: set[int] = set()
        self.startup: bytes | None = None
        self.relations: dict[int, bytes] = {}
        self.types: dict[int, bytes] = {}
        self.described: list[bytes] = []     # Y and R messages outside stream blocks, in order (schema lookup)

    @property
    def quiet(self) -> bool:
        return not (self.in_txn or self.in_stream_block or self.streams or self.prepared)

    def preamble(self) -> bytes:
        frames = []
        if self.startup is not None:
            frames.append(encode_frame(0, self.startup))
        frames += [encode_frame(0, p) for p in self.types.values()]
        frames += [encode_frame(0, p) for p in self.relations.values()]
        return b"".join(frames)

    def needs_full(self, head: bytes) -> bool:
        if not head:
            return False
        if head[0] == 0x53 and self.protocol != "pgoutput":
            return True
        t = head[self.prefix] if len(head) > self.prefix else 0
        return t in (0x52, 0x59)

    def see(self, payload: bytes) -> None:
        if not payload:
            return
        if self.protocol != "pgoutput":
            if payload[0] == 0x53:
                self.startup = bytes(payload)
                self.prefix = 8 if self.protocol == "spock" and _spock_v5(payload) else 0
                return
            if len(payload) <= self.prefix:
                return
            t = payload[self.prefix]
            if t == 0x42:
                self.in_txn = True
            elif t == 0x43:
                self.in_txn = False
            elif t == 0x52:
                relid = _U32.unpack_from(payload, self.prefix + 2)[0]
                self.relations[relid] = bytes(payload)
                self.described.append(self.relations[relid])
            return
        t = payload[0]
        if t in (0x42, 0x62):                     # B, b (begin prepare)
            self.in_txn = True
        elif t == 0x43:                           # C
            self.in_txn = False
        elif t == 0x50:                           # P prepare: b..P closed, the prepared transaction pending
            self.in_txn = False
            self.prepared.add(_U32.unpack_from(payload, 26)[0])
        elif t == 0x4B:                           # K commit prepared
            self.prepared.discard(_U32.unpack_from(payload, 26)[0])
        elif t == 0x72:                           # r rollback prepared
            self.prepared.discard(_U32.unpack_from(payload, 34)[0])
        elif t == 0x53:                           # S stream start
            self.in_stream_block = True
            self.streams.add(_U32.unpack_from(payload, 1)[0])
        elif t == 0x45:                           # E stream stop
            self.in_stream_block = False
        elif t == 0x63:                           # c stream commit
            self.streams.discard(_U32.unpack_from(payload, 1)[0])
        elif t == 0x41:                           # A stream abort (of the whole transaction when subxid = xid)
            xid, sub = _U32.unpack_from(payload, 1)[0], _U32.unpack_from(payload, 5)[0]
            if xid == sub:
                self.streams.discard(xid)
        elif t == 0x70:                           # p stream prepare
            xid = _U32.unpack_from(payload, 26)[0]
            self.streams.discard(xid)
            self.prepared.add(xid)
        elif t in (0x52, 0x59):                   # R, Y (inside a stream block: u32 xid first)
            # kept in the top-level form (without the xid), as a chunk's preamble feeds them outside any stream
            plain = bytes(payload[:1]) + bytes(payload[5:]) if self.in_stream_block else bytes(payload)
            oid = _U32.unpack_from(plain, 1)[0]
            (self.relations if t == 0x52 else self.types)[oid] = plain
            self.described.append(plain)


def _spock_v5(startup: bytes) -> bool:
    parts = bytes(startup[2:]).split(b"\0")
    params = dict(zip(parts[0::2], parts[1::2]))
    return params.get(b"proto_version") == b"5"


def plan_chunks(path: str, chunk_bytes: int = 32 << 20) -> tuple[dict, list[Chunk], "_Scanner"]:
    """The file's JSON header, its chunks (each at least `chunk_bytes` of records, except the last) and what the
    scan saw (relation messages)."""
    with open(path, "rb") as fh:
        header, body_start = read_file_header(fh, source=str(path))
        size = os.fstat(fh.fileno()).st_size
        if frame_proto_format(header) != "native":
            raise FrameError(f"{path}: a capture of the JSON protocol is read by `spockwire decode` / "
                             "spockwire.wire.json_protocol.JsonDecoder, not split for Spark")
        scanner = _Scanner(header["protocol"])
        chunks: list[Chunk] = []
        chunk_start = body_start
        preamble = b""
        pos = body_start
        fh.seek(pos)
        reader = _BufferedReader(fh, pos)
        while pos < size:
            if pos - chunk_start >= chunk_bytes and scanner.quiet:
                chunks.append(Chunk(len(chunks), chunk_start, pos, preamble))
                chunk_start = pos
                preamble = scanner.preamble()
            rec = reader.read(pos, RECORD_HEADER_SIZE)
            if len(rec) < RECORD_HEADER_SIZE:
                break  # a cut-short record: the decoder of the last chunk reports it
            length, _lsn = _RECORD.unpack(rec)
            peek = reader.read(pos + RECORD_HEADER_SIZE, min(length, _PEEK))
            if length > _PEEK and scanner.needs_full(peek):
                peek = reader.read(pos + RECORD_HEADER_SIZE, length)
            scanner.see(peek)
            pos += RECORD_HEADER_SIZE + length
        if chunk_start < size or not chunks:
            chunks.append(Chunk(len(chunks), chunk_start, size, preamble))
    return header, chunks, scanner


class _BufferedReader:
    """Reads of small pieces at increasing offsets through a large window (one syscall per window)."""

    def __init__(self, fh: Any, pos: int, window: int = 8 << 20) -> None:
        self.fh = fh
        self.window = window
        self.base = pos
        self.buf = b""

    def read(self, pos: int, n: int) -> bytes:
        if pos < self.base or pos + n > self.base + len(self.buf):
            self.fh.seek(pos)
            self.buf = self.fh.read(max(n, self.window))
            self.base = pos
        off = pos - self.base
        return self.buf[off:off + n]


def _recorded_catalog(header: dict, path: str) -> Any:
    """The type catalog `spockwire capture` recorded in the file's header (None when there is none)."""
    return RecordedTypeCatalog.from_frame_header(header, source=path)


def _relation_of(protocol: str, scanner_relations: Sequence[bytes], startup: bytes | None, table: str,
                 types: str, path: str, catalog: Any = None) -> Any:
    """The table's newest Relation among the relation messages the scan saw (decoded by the real decoder).

    Rows decoded under an older description are converted by column name (a column added later is NULL in
    them; a column dropped later is not read)."""
    dec = make_decoder(protocol, types)
    if startup is not None:
        dec.feed(startup)
    found = None
    for payload in scanner_relations:
        dec.feed(payload)
        for rel in dec.relations.values():
            if rel.qualified_name == table:
                found = rel
    if found is None:
        raise ValueError(f"table {table!r} is never described in {path}")
    return found


def decode_chunk(path: str, protocol: str, start: int, end: int, preamble: bytes, table: str, types: str,
                 target: pa.Schema, catalog: Any = None) -> Iterator[pa.RecordBatch]:
    """Decode one chunk and yield its rows of `table`, converted to `target` (`catalog`: the file's recorded
    type catalog)."""
    dec = make_decoder(protocol, types, catalog)
    if preamble:
        dec.feed_frames(preamble)
        dec.drain()
    with open(path, "rb") as fh:
        fh.seek(start)
        remaining = end - start
        pending = b""
        while remaining > 0:
            block = fh.read(min(remaining, 8 << 20))
            if not block:
                break
            remaining -= len(block)
            data = pending + block
            used = dec.feed_frames(data, partial_ok=True)
            pending = data[used:]
            for _table, batch in select_events(dec.drain(), [table], 0, None):
                yield S.conform_batch(batch, target)
        if pending:
            dec.feed_frames(pending)  # raises the FrameError of a cut-short record
    for _table, batch in select_events(dec.drain(), [table], 0, None):
        yield S.conform_batch(batch, target)


def decode_frame_file(spark: Any, path: str, table: str, *, chunk_bytes: int = 32 << 20, types: str = "auto",
                      partitions: int | None = None) -> Any:
    """A DataFrame of `table`'s changes in the frame file at `path`, decoded in parallel (one task per chunk)."""
    from pyspark.sql import types as T

    path = os.path.abspath(path)
    if "." not in table:
        table = f"public.{table}"
    header, chunks, scan = plan_chunks(path, chunk_bytes)
    protocol = header["protocol"]
    catalog = _recorded_catalog(header, path)
    recorded = None if catalog is None else catalog.to_json()       # what the tasks rebuild it from
    relation = _relation_of(protocol, scan.described, scan.startup, table, types, path, catalog)
    arrow = S.table_arrow_schema(relation, catalog, typed=types != "raw" and decoder_types_supported())
    out_schema = S.spark_schema([(relation, arrow)])
    target = S.target_arrow_schema(out_schema)

    plan_schema = T.StructType([T.StructField("index", T.LongType()), T.StructField("start", T.LongType()),
                                T.StructField("end", T.LongType()), T.StructField("preamble", T.BinaryType())])
    rows = [(c.index, c.start, c.end, bytearray(c.preamble)) for c in chunks]
    # one chunk per partition (or `partitions` round-robin slices of them)
    rdd = spark.sparkContext.parallelize(rows, numSlices=partitions or len(chunks))
    plan = spark.createDataFrame(rdd, plan_schema)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_catalog = None if recorded is None else _recorded_catalog({"type_catalog": recorded}, path)
        for b in batches:
            for i in range(b.num_rows):
                yield from decode_chunk(path, protocol, b.column(1)[i].as_py(), b.column(2)[i].as_py(),
                                        b.column(3)[i].as_py(), table, types, target, task_catalog)

    return plan.mapInArrow(decode, out_schema)
