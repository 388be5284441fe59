"""`spockwire inspect FILE`: a frame file, message by message, with the changes each commit released."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterator, TextIO

from ..frames import frame_proto_format, iter_frames
from ..model import ChangeBatch, LogicalMessage, Relation, Truncate
from .common import (COMMON_SETTINGS, decoder_for, decoder_module, format_lsn, format_value, json_value,
                     load_frame_file)
from ..wire.json_protocol import json_action
from .config import Setting, add_settings, positive_int, resolve

NAME = "inspect"
HELP = "print a frame file readably: one line per message, and the changes each commit releases"

JSON = Setting("json", "print JSON lines instead of text", is_flag=True, default=False)
LIMIT = Setting("limit", "stop after N output lines", type=positive_int, metavar="N", short="-n")
EVENTS_ONLY = Setting("events_only", "print only the decoded changes, truncates and messages (no raw messages)",
                      is_flag=True, default=False)
SETTINGS = (*COMMON_SETTINGS, JSON, LIMIT, EVENTS_ONLY)

_PGOUTPUT_NAMES = {
    "B": "begin", "C": "commit", "O": "origin", "Y": "type", "R": "relation", "I": "insert", "U": "update",
    "D": "delete", "T": "truncate", "M": "message", "S": "stream start", "E": "stream stop",
    "c": "stream commit", "A": "stream abort", "b": "begin prepare", "P": "prepare", "K": "commit prepared",
    "r": "rollback prepared", "p": "stream prepare",
}
_NATIVE_NAMES = {
    "S": "startup", "B": "begin", "C": "commit", "O": "origin", "L": "last commit", "R": "relation",
    "I": "insert", "U": "update", "D": "delete", "T": "truncate", "M": "message",
    "": "empty (JSON protocol: in place of origin)",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(NAME, help=HELP, description=HELP + ". Values are shown as the decoder returns "
                              "them; `--json` prints one JSON object per line (bytes as \\x hex text).")
    p.add_argument("file", metavar="FILE", help="frame file (*.spwf) to read")
    add_settings(p, SETTINGS)
    p.set_defaults(_run=run)


def _type_of(payload: memoryview, protocol: str, v5: bool) -> str:
    pos = 0
    if v5 and payload.nbytes and payload[0] != 0x53:
        pos = 8
    if payload.nbytes <= pos:
        return "?"
    code = payload[pos]
    return chr(code) if 32 <= code < 127 else f"\\x{code:02x}"


def _relation_text(rel: Relation) -> str:
    cols = ", ".join(f"{c.name}{' key' if c.is_key else ''}" + (f" oid={c.type_oid}" if c.type_oid else "")
                     for c in rel.columns)
    return f"{rel.qualified_name} v{rel.version} ({cols})"


def _event_records(event: Any) -> Iterator[dict[str, Any]]:
    if isinstance(event, ChangeBatch):
        rel = event.relation
        names = list(rel.column_names)
        for row in event.to_pylist():
            yield {
                "record": "change", "change_type": row["_change_type"], "table": rel.qualified_name,
                "relation_version": rel.version, "commit_lsn": row["_commit_lsn"], "commit_ts": row["_commit_ts"],
                "xid": row["_xid"], "seq": row["_seq"], "origin": row["_origin"],
                "unchanged_toast": row["_unchanged_toast"],
                "values": {n: row[n] for n in names},
            }
    elif isinstance(event, Truncate):
        yield {
            "record": "truncate", "tables": [r.qualified_name for r in event.relations], "cascade": event.cascade,
            "restart_identity": event.restart_identity, "commit_lsn": event.commit_lsn, "commit_ts": event.commit_ts,
            "xid": event.xid, "seq": event.seq, "origin": event.origin,
        }
    elif isinstance(event, LogicalMessage):
        yield {
            "record": "message", "prefix": event.prefix, "content": event.content,
            "transactional": event.transactional, "lsn": event.lsn, "xid": event.xid,
            "commit_lsn": event.commit_lsn, "commit_ts": event.commit_ts, "seq": event.seq, "origin": event.origin,
        }


def _text(rec: dict[str, Any]) -> str:
    kind = rec["record"]
    if kind == "frame":
        detail = f"  {rec['detail']}" if rec.get("detail") else ""
        return f"{format_lsn(rec['lsn']):>14}  {rec['type']:<2} {rec['name']:<17} {rec['bytes']:>6} B{detail}"
    if kind == "change":
        origin = f" origin={rec['origin']}" if rec["origin"] else ""
        toast = f" unchanged_toast={rec['unchanged_toast']}" if rec["unchanged_toast"] else ""
        values = " ".join(f"{k}={format_value(v)}" for k, v in rec["values"].items())
        return (f"{'':>14}  -> {rec['change_type']:<16} {rec['table']} commit={format_lsn(rec['commit_lsn'])} "
                f"xid={rec['xid']} seq={rec['seq']}{origin}{toast}  {values}")
    if kind == "truncate":
        flags = "".join((" cascade" if rec["cascade"] else "", " restart_identity" if rec["restart_identity"] else ""))
        return (f"{'':>14}  -> truncate         {', '.join(rec['tables'])} commit={format_lsn(rec['commit_lsn'])} "
                f"xid={rec['xid']} seq={rec['seq']}{flags}")
    tx = (f"commit={format_lsn(rec['commit_lsn'])} xid={rec['xid']} seq={rec['seq']}" if rec["transactional"]
          else "non-transactional")
    return (f"{'':>14}  -> message          prefix={rec['prefix']!r} lsn={format_lsn(rec['lsn'])} {tx} "
            f"content={format_value(rec['content'], 60)}")


def _records(path: str, impl: str | None, types: str | None, events_only: bool,
             numeric: str | None = None) -> Iterator[dict[str, Any]]:
    header, body = load_frame_file(path)
    dec = decoder_for(decoder_module(impl), header, types, numeric)
    protocol = header["protocol"]
    names = _PGOUTPUT_NAMES if protocol == "pgoutput" else _NATIVE_NAMES
    options = header.get("options") if isinstance(header.get("options"), dict) else {}
    json_format = frame_proto_format(header) == "json"
    for lsn, payload in iter_frames(body):
        v5 = not json_format and protocol == "spock" and str(dec.startup_params.get("proto_version",
                                                               options.get("proto_version", ""))) == "5"
        mtype = json_action(payload) if json_format else _type_of(payload, protocol, v5)
        before = dict(dec.relations)
        try:
            dec.feed(payload, lsn)
        except Exception as exc:
            exc.spockwire_lsn = lsn  # type: ignore[attr-defined]  # the CLI names it in the error line
            raise
        if not events_only:
            detail = ""
            for relid, rel in dec.relations.items():
                if before.get(relid) is not rel:
                    detail = _relation_text(rel)
            yield {"record": "frame", "lsn": lsn, "type": mtype, "name": names.get(mtype, "unknown"),
                   "bytes": payload.nbytes, "detail": detail}
        for event in dec.drain():
            yield from _event_records(event)
    if not events_only:
        yield {"record": "end", "committed_lsn": dec.committed_lsn}


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    cfg = resolve(args, NAME)
    limit = cfg.limit
    count = 0
    for rec in _records(args.file, cfg.impl, cfg.types, cfg.events_only, cfg.numeric):
        if limit is not None and count >= limit:
            break
        if cfg.json:
            out.write(json.dumps(json_value(rec), allow_nan=False) + "\n")
        elif rec["record"] == "end":
            out.write(f"committed_lsn {format_lsn(rec['committed_lsn'])}\n")
        else:
            out.write(_text(rec) + "\n")
        count += 1
    return 0
