"""`spockwire capture`: record the raw messages of a slot, with their LSNs, into a frame file."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from ..frames import PROTO_FORMAT_KEY, FrameWriter, iter_frames
from ..values.catalog import PostgresTypeCatalog, TypeCatalogError
from ..values.recorded import HEADER_KEY, RecordedTypeCatalog
from ..wire import load_implementation
from ..wire.json_protocol import json_decoder_or_native
from .common import CliError, format_lsn, human_bytes
from .config import CONFIG, Setting, add_settings, positive_int, resolve
from .stream_settings import INTERNAL, PROTO_FORMAT, STREAM_SETTINGS, stream_kwargs

NAME = "capture"
HELP = "record a slot's raw messages (with LSNs) into a frame file"

OUT = Setting("out", "frame file to write (*.spwf)", required=True, metavar="FILE", short="-o")
MAX_MESSAGES = Setting("max_messages", "stop after this many messages", type=positive_int, metavar="N")
DURATION = Setting("duration", "stop after this many seconds", type=float, metavar="SECONDS")
IDLE_EXIT = Setting("idle_exit", "stop after this many seconds without messages", type=float, default=5.0,
                    metavar="SECONDS")
ACK = Setting("ack", "acknowledge what was captured (consumes the slot); by default the slot does not move",
              is_flag=True, default=False)
SETTINGS = (CONFIG, *STREAM_SETTINGS, INTERNAL, PROTO_FORMAT, OUT, MAX_MESSAGES, DURATION, IDLE_EXIT, ACK)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". The file is what `inspect`, `decode`, "
                              "Decoder.feed_frames and the benchmarks read (docs/architecture.md).")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


class _Tap:
    """Stands in for the stream's decoder: writes every frame-record buffer to the file, then decodes it."""

    def __init__(self, decoder: Any, writer: FrameWriter) -> None:
        self._decoder = decoder
        self._writer = writer
        self.messages = 0
        self.bytes = 0

    def feed_frames(self, buffer: Any, **kwargs: Any) -> int:
        for lsn, payload in iter_frames(buffer):
            self._writer.write(lsn, payload)
            self.messages += 1
            self.bytes += len(payload)
        return self._decoder.feed_frames(buffer, **kwargs)

    def feed(self, payload: Any, lsn: int | None = None) -> None:
        self._writer.write(lsn or 0, payload)
        self.messages += 1
        self.bytes += len(payload)
        self._decoder.feed(payload, lsn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)


#: room kept in the frame file's header for the recorded type catalog (rewritten in place as it grows; a
#: catalog that outgrows it makes the file be rewritten once, at the end)
HEADER_RESERVE = 64 << 10


class _TypeRecorder:
    """Records in the frame file's header what decoding the captured relations asks of the type catalog
    (spockwire.values.recorded), each time the stream describes a relation it had not described before, so a
    capture decoded offline gives the live values."""

    def __init__(self, dsn: str, writer: FrameWriter, taps: list[_Tap]) -> None:
        self._source = PostgresTypeCatalog(dsn, strict=False)
        self._writer = writer
        self._taps = taps
        self._seen: set[tuple[int, int, int]] = set()
        self.catalog = RecordedTypeCatalog()

    def update(self) -> None:
        fresh = []
        for i, tap in enumerate(self._taps):
            for rel in list(tap.relations.values()):
                key = (i, rel.relid, rel.version)
                if key not in self._seen:
                    self._seen.add(key)
                    fresh.append(rel)
        if not fresh:
            return
        try:
            changed = self.catalog.record(self._source, fresh)
        except TypeCatalogError as exc:
            print(f"spockwire capture: the type catalog cannot be recorded ({exc}); decoding this capture "
                  f"offline leaves user-defined types as they arrived", file=sys.stderr)
            return
        if changed:
            self._writer.set_header(**{HEADER_KEY: self.catalog.to_json()})

    def close(self) -> None:
        self._source.close()


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    from ..connection import connect

    impl = load_implementation()
    kwargs = stream_kwargs(cfg)
    meta = {"slot": cfg.slot, "plugin": cfg.plugin,
            "options": {k: v for k, v in kwargs.items() if k not in ("slot", "plugin", "create_slot", "proto_format")}}
    proto_format = kwargs.get("proto_format", "native")
    if proto_format != "native":
        meta[PROTO_FORMAT_KEY] = proto_format     # absent: native (every file written before the key existed)
    protocol = "pgoutput" if cfg.plugin == "pgoutput" else cfg.plugin
    taps: list[_Tap] = []
    with FrameWriter(cfg.out, protocol, header_reserve=HEADER_RESERVE, **meta) as writer:
        def factory(proto: str) -> Any:
            tap = _Tap(json_decoder_or_native(impl, proto, proto_format, types="raw"), writer)
            taps.append(tap)
            return tap

        recorder = _TypeRecorder(cfg.dsn, writer, taps)

        try:
            stream = connect(cfg.dsn, decoder_factory=factory, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise CliError(f"cannot start streaming slot {cfg.slot!r}: {exc}") from exc
        started = last = time.monotonic()
        try:
            while True:
                events = stream.read(timeout=0.5)
                recorder.update()
                now = time.monotonic()
                total = sum(t.messages for t in taps)
                if events or total:
                    last = now if events else last
                if cfg.ack and events:
                    writer.flush(fsync=True)
                    stream.ack()
                if cfg.max_messages is not None and total >= cfg.max_messages:
                    break
                if cfg.duration is not None and now - started >= cfg.duration:
                    break
                if cfg.idle_exit is not None and now - last >= cfg.idle_exit:
                    break
        finally:
            stream.close()
            recorder.update()
            recorder.close()
    total = sum(t.messages for t in taps)
    size = sum(t.bytes for t in taps)
    out.write(f"captured {total} messages ({human_bytes(size)} of payload) from slot {cfg.slot!r} into {cfg.out}; "
              f"slot {'acknowledged up to ' + format_lsn(stream.acked_lsn) if cfg.ack else 'not moved'}\n")
    recorded = recorder.catalog
    if recorded.types or recorded.tables or recorded.has_roles:
        out.write(f"recorded for offline decoding: {len(recorded.types)} user-defined type(s), the column types of "
                  f"{len(recorded.tables)} table(s){', the role names' if recorded.has_roles else ''}\n")
    return 0
