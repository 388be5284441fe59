"""`spockwire decode FILE --out DIR`: a frame file into the Parquet staging layout, exactly as ingest stages."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from ..frames import RECORD_HEADER_SIZE
from ..ingest.staging import StagingWriter
from .common import (COLUMN_TYPE, COMMON_SETTINGS, ON_UNREPRESENTABLE, STAGING_SETTINGS, decoder_for, decoder_module, format_lsn, human_bytes,
                     load_frame_file)
from .config import add_settings, resolve

NAME = "decode"
HELP = "decode a frame file into the Parquet staging layout (as `ingest` writes it)"

SETTINGS = (*COMMON_SETTINGS, COLUMN_TYPE, ON_UNREPRESENTABLE, *STAGING_SETTINGS)

#: bytes of frame records handed to the decoder at a time
CHUNK = 64 << 10


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". Running it again on the same folder "
                              "adds nothing: changes already staged are skipped (see docs/staging.md).")
    p.add_argument("file", metavar="FILE", help="frame file (*.spwf) to decode")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    header, body = load_frame_file(args.file)
    module = decoder_module(cfg.impl)
    dec = decoder_for(module, header, cfg.types, cfg.numeric, column_types=cfg.column_type,
                      on_unrepresentable=cfg.on_unrepresentable)
    started = time.perf_counter()
    commits = files = 0
    rows: dict[str, int] = {}
    truncates = messages = 0
    with StagingWriter(cfg.out, protocol=header["protocol"], compression=cfg.compression,
                       max_rows=cfg.flush_rows, max_bytes=cfg.flush_bytes, max_age=float("inf")) as writer:
        resumed_from = writer.resume_lsn
        removed = len(writer.state.removed)

        def commit() -> None:
            nonlocal commits, files, truncates, messages
            entry = writer.commit(dec.committed_lsn)
            if entry is None:
                return
            commits += 1
            files += len(entry["files"]) + len(entry["messages"])
            for f in entry["files"]:
                rows[f["table"]] = rows.get(f["table"], 0) + f["rows"]
            truncates += len(entry["truncates"])
            messages += sum(m["rows"] for m in entry["messages"])

        pos, end = 0, body.nbytes
        while pos < end:
            window = body[pos:pos + CHUNK]
            used = dec.feed_frames(window, partial_ok=True)
            if used == 0:  # one record larger than the window: feed exactly that record
                length = int.from_bytes(body[pos:pos + 4], "big") if end - pos >= 4 else 0
                used = dec.feed_frames(body[pos:pos + RECORD_HEADER_SIZE + length])
            pos += used
            writer.add_all(dec.drain())
            if writer.should_flush():
                commit()
        writer.add_all(dec.drain())
        commit()
        elapsed = time.perf_counter() - started
        out.write(f"decoded {args.file} ({header['protocol']}, {human_bytes(body.nbytes)}) into {cfg.out} "
                  f"in {elapsed:.2f} s with the {module.IMPLEMENTATION} decoder\n")
        if resumed_from:
            out.write(f"resumed after committed_lsn {format_lsn(resumed_from)}; skipped as already staged: "
                      f"{writer.skipped_rows} rows, {writer.skipped_truncates} truncates, "
                      f"{writer.skipped_messages} messages\n")
        if removed:
            out.write(f"removed {removed} leftover file(s) of an interrupted commit\n")
        out.write(f"staging commits: {commits}, files: {files}, committed_lsn "
                  f"{format_lsn(writer.committed_lsn)}\n")
        width = max([len(t) for t in rows] + [5])
        for table in sorted(rows):
            out.write(f"  {table:<{width}}  {rows[table]:>9} rows\n")
        out.write(f"  truncates: {truncates}, messages: {messages}\n")
    return 0
