"""`spockwire main`: the built-in default job — decode the real captures bundled with the package.

It prints, per capture, what the stream holds (tables, rows per change type, relation versions, truncates,
messages), a few rows per table, and how fast the selected decoder implementation gets through it.
"""
from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from typing import Any, TextIO

from ..errors import SpockwireError
from ..model import ChangeBatch, CHANGE_TYPES, LogicalMessage, Truncate
from .common import (COMMON_SETTINGS, CliError, decoder_for, decoder_module, format_lsn, format_row, human_bytes,
                     load_frame_file, parse_frame_bytes)
from .config import Setting, add_settings, positive_int, resolve

NAME = "main"
HELP = "decode the bundled real captures: per-table summary, sample rows and decode throughput"

SAMPLES = Setting("samples", "sample rows to print per table", type=int, default=3, metavar="N")
MIN_TIME = Setting("min_time", "seconds to spend measuring the throughput of each capture", type=float,
                   default=0.5, metavar="SECONDS")
MIN_RUNS = Setting("min_runs", "decode each capture at least this many times when measuring", type=positive_int,
                   default=3, metavar="N")
SETTINGS = (*COMMON_SETTINGS, SAMPLES, MIN_TIME, MIN_RUNS)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". The captures were recorded from "
                              "PostgreSQL 15 with pgoutput (protocol 1, text) and pglogical 2; pass frame files "
                              "to summarise those instead.")
    p.add_argument("files", nargs="*", metavar="FILE", help="frame files to use instead of the bundled ones")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def bundled_captures() -> list[tuple[str, bytes]]:
    """(name, bytes) of the frame files shipped in spockwire/data, sorted by name."""
    folder = resources.files("spockwire").joinpath("data")
    if not folder.is_dir():
        return []
    return sorted((entry.name, entry.read_bytes()) for entry in folder.iterdir() if entry.name.endswith(".spwf"))


class _Summary:
    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Any]] = {}
        self.truncates = 0
        self.messages = [0, 0]  # transactional, non-transactional
        self.rows = 0

    def table(self, name: str) -> dict[str, Any]:
        t = self.tables.get(name)
        if t is None:
            t = self.tables[name] = {"counts": dict.fromkeys(CHANGE_TYPES, 0), "versions": set(), "truncates": 0,
                                     "samples": [], "columns": None}
        return t

    def add(self, event: Any, samples: int) -> None:
        if isinstance(event, ChangeBatch):
            rel = event.relation
            t = self.table(rel.qualified_name)
            t["versions"].add(rel.version)
            rb = event.to_arrow()
            self.rows += rb.num_rows
            for value in rb.column("_change_type").to_pylist():
                t["counts"][value] += 1
            if len(t["samples"]) < samples:
                for row in ChangeBatch(rel, rb.slice(0, samples - len(t["samples"]))).to_pylist():
                    t["samples"].append((row, list(rel.column_names)))
        elif isinstance(event, Truncate):
            self.truncates += 1
            for rel in event.relations:
                self.table(rel.qualified_name)["truncates"] += 1
        elif isinstance(event, LogicalMessage):
            self.messages[0 if event.transactional else 1] += 1


def _decode_once(module: Any, header: dict[str, Any], body: memoryview, types: str | None,
                 numeric: str | None = None) -> tuple[Any, list[Any]]:
    dec = decoder_for(module, header, types, numeric)
    dec.feed_frames(body)
    events = dec.drain()
    for e in events:
        if isinstance(e, ChangeBatch):
            e.to_arrow()
    return dec, events


def _throughput(module: Any, header: dict[str, Any], body: memoryview, types: str | None, numeric: str | None,
                min_time: float, min_runs: int) -> tuple[float, int]:
    """Best wall time of one full decode (time.perf_counter), over at least `min_runs` runs and `min_time` s."""
    best = float("inf")
    runs = 0
    spent = 0.0
    while runs < min_runs or spent < min_time:
        t0 = time.perf_counter()
        _decode_once(module, header, body, types, numeric)
        took = time.perf_counter() - t0
        best = min(best, took)
        spent += took
        runs += 1
        if runs >= 100_000:
            break
    return best, runs


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    module = decoder_module(cfg.impl)
    if args.files:
        captures = []
        for path in args.files:
            header, body = load_frame_file(path)
            captures.append((path, header, body))
    else:
        captures = [(name, *parse_frame_bytes(data, name)) for name, data in bundled_captures()]
        if not captures:
            raise CliError("no bundled captures found in spockwire/data (is the package installed completely?)")
    import spockwire

    out.write(f"spockwire {spockwire.__version__}: decoder implementation {module.IMPLEMENTATION!r} "
              f"({module.__name__})\n")
    # the bundled captures hold edge values on purpose, NaN in a numeric(p,s) column among them: decimal128
    # cannot hold NaN, so this job shows numerics as their exact text unless told otherwise
    numeric = cfg.numeric or "text"
    out.write(f"numeric columns as: {numeric}" + (" (a numeric(14,3) column in the sample holds NaN, which "
              "decimal128 cannot hold; --numeric decimal shows the error)" if cfg.numeric is None else "") + "\n")
    total_rows = total_bytes = 0
    total_time = 0.0
    failed = []
    for name, header, body in captures:
        try:
            dec, events = _decode_once(module, header, body, cfg.types, numeric)
        except SpockwireError as exc:
            failed.append(name)
            out.write(f"\n== {name}: protocol {header['protocol']}: cannot be decoded: {type(exc).__name__}: {exc}\n")
            continue
        summary = _Summary()
        for event in events:
            summary.add(event, max(cfg.samples, 0))
        server = header.get("server_version", "unknown server")
        out.write(f"\n== {name}: protocol {header['protocol']}, {server}, {human_bytes(body.nbytes)}, "
                  f"{len(events)} events, committed_lsn {format_lsn(dec.committed_lsn)}\n")
        width = max([len(t) for t in summary.tables] + [5])
        out.write(f"  {'table':<{width}}  {'versions':>8}  {'insert':>6}  {'upd_pre':>7}  {'upd_post':>8}  "
                  f"{'delete':>6}  {'truncate':>8}\n")
        for tname in sorted(summary.tables):
            t = summary.tables[tname]
            c = t["counts"]
            versions = ",".join(f"v{v}" for v in sorted(t["versions"])) or "-"
            out.write(f"  {tname:<{width}}  {versions:>8}  {c['insert']:>6}  {c['update_preimage']:>7}  "
                      f"{c['update_postimage']:>8}  {c['delete']:>6}  {t['truncates']:>8}\n")
        out.write(f"  rows: {summary.rows}, truncates: {summary.truncates}, messages: {sum(summary.messages)} "
                  f"({summary.messages[0]} transactional, {summary.messages[1]} non-transactional)\n")
        if cfg.samples > 0:
            out.write("  sample rows:\n")
            for tname in sorted(summary.tables):
                for row, names in summary.tables[tname]["samples"]:
                    line = (f"    {tname} {row['_change_type']} commit={format_lsn(row['_commit_lsn'])} "
                            f"seq={row['_seq']}: {format_row(row, names, 24)}")
                    out.write((line if len(line) <= 220 else line[:219] + "…") + "\n")
        best, runs = _throughput(module, header, body, cfg.types, numeric, cfg.min_time, cfg.min_runs)
        total_rows += summary.rows
        total_bytes += body.nbytes
        total_time += best
        out.write(f"  throughput ({module.IMPLEMENTATION}): {summary.rows / best:,.0f} rows/s, "
                  f"{body.nbytes / best / 1e6:.1f} MB/s (best of {runs} runs, {best * 1e3:.2f} ms per decode)\n")
        if summary.rows < 10_000:
            out.write("  (a small capture of many short transactions: fixed per-transaction and per-batch costs "
                      "dominate; the benchmarks measure large workloads)\n")
    if len(captures) > 1 and total_time > 0:
        out.write(f"\nall captures ({module.IMPLEMENTATION}): {total_rows / total_time:,.0f} rows/s, "
                  f"{total_bytes / total_time / 1e6:.1f} MB/s\n")
    if failed:
        raise CliError(f"{len(failed)} of {len(captures)} captures could not be decoded: {', '.join(failed)}")
    return 0
