"""Golden byte vectors, written by hand from docs/protocols.md, grouped into small valid streams.

Each message is hex (with "quoted" ASCII for names and text, and # comments), the encoder call that must produce
exactly those bytes, and the prefix lengths that are themselves complete valid messages. Each stream lists what
decoding it must give: rows, truncates, messages, relations, startup parameters and committed_lsn after every
message. These bytes check tests/wire_encoder.py, never the other way round.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Callable, NamedTuple

from tests import wire_encoder as W
from tests.wire_encoder import UNCHANGED, Col, Internal

EPOCH_2000 = datetime(2000, 1, 1, tzinfo=timezone.utc)

_TOKEN = re.compile(r'"[^"]*"|[0-9a-fA-F]+|\S')


def hx(text: str) -> bytes:
    """Hand-written bytes: hex digits (runs of any even length) and "quoted" ASCII; # starts a comment."""
    out = bytearray()
    for line in text.splitlines():
        for token in _TOKEN.findall(line.split("#", 1)[0]):
            if token.startswith('"'):
                out += token[1:-1].encode("ascii")
            else:
                if len(token) % 2 or not all(c in "0123456789abcdefABCDEF" for c in token):
                    raise ValueError(f"bad hex token {token!r}")
                out += bytes.fromhex(token)
    return bytes(out)


def ts(micros: int) -> datetime:
    """A wire timestamp (µs since 2000-01-01 UTC) as the datetime the decoder must give."""
    return EPOCH_2000 + timedelta(microseconds=micros)


class Vector(NamedTuple):
    name: str
    data: bytes
    encode: Callable[[], bytes]
    complete_prefixes: frozenset = frozenset()    # prefix lengths that are complete valid messages too


class Golden(NamedTuple):
    name: str
    protocol: str
    decoder_kwargs: dict
    vectors: list
    changes: list                 # normalize.changes() of everything drained
    nontransactional: list        # normalize.nontransactional()
    relations: dict               # relid -> normalize.relation_data()
    startup_params: dict
    committed_lsn: list           # after each message


def V(name, hex_text, encode, complete=()):
    return Vector(name, hx(hex_text), encode, frozenset(complete))


def _startup_complete(data: bytes) -> set[int]:
    """'S' prefixes that are complete: just the format byte, or ending right after a value's NUL."""
    ends, nul_count = {2}, 0
    for i in range(2, len(data)):
        if data[i] == 0:
            nul_count += 1
            if nul_count % 2 == 0:
                ends.add(i + 1)
    return ends - {len(data)}


def row(table, version, change, commit_lsn, commit_ts, xid, seq, origin=None, toast=None, **cols) -> dict:
    return dict({"kind": "row", "table": table, "version": version, "_change_type": change,
                 "_commit_lsn": commit_lsn, "_commit_ts": ts(commit_ts), "_xid": xid, "_seq": seq,
                 "_origin": origin, "_unchanged_toast": toast}, **cols)


def truncate(tables, cascade, restart, commit_lsn, commit_ts, xid, seq, origin=None) -> dict:
    return {"kind": "truncate", "tables": tables, "cascade": cascade, "restart_identity": restart,
            "commit_lsn": commit_lsn, "commit_ts": ts(commit_ts), "xid": xid, "seq": seq, "origin": origin}


def message(prefix, content, transactional, lsn, xid, commit_lsn, commit_ts, seq, origin=None) -> dict:
    return {"kind": "message", "prefix": prefix, "content": content, "transactional": transactional, "lsn": lsn,
            "xid": xid, "commit_lsn": commit_lsn, "commit_ts": None if commit_ts is None else ts(commit_ts),
            "seq": seq, "origin": origin}


def relation(relid, namespace, name, columns, version, replica_identity=None) -> dict:
    return {"relid": relid, "namespace": namespace, "name": name, "replica_identity": replica_identity,
            "version": version, "columns": columns}


TS1 = 0x0002a1b2c3d4e5f6
TS2 = 0x0002a1b2c3d4e600
TS3 = 0x0002a1b2c3d4e700
TS4 = 0x0002a1b2c3d4e800
TS5 = 0x0002a1b2c3d4e900


# =================================================================================================================
# pglogical 2, protocol 1

PGL_ITEMS_V1 = [Col("id", key=True), Col("note"), Col("qty"), Col("code")]
PGL_ITEMS_V2 = [Col("id", key=True), Col("note"), Col("extra")]
_pgl = W.pglogical
_PGL_STARTUP = {"max_proto_version": "1", "min_proto_version": "1", "pglogical_version": "2.4.4",
                "pglogical_version_num": "20404"}
_pgl_s = hx('53 01 "max_proto_version" 00 "1" 00 "min_proto_version" 00 "1" 00'
            ' "pglogical_version" 00 "2.4.4" 00 "pglogical_version_num" 00 "20404" 00')

PGLOGICAL = Golden(
    "pglogical", "pglogical", {},
    [
        V("S startup", _pgl_s.hex(), lambda: _pgl("S", params=_PGL_STARTUP), _startup_complete(_pgl_s)),
        V("B begin", "42 00 0000000001000200 0002a1b2c3d4e5f6 000002f0",
          lambda: _pgl("B", final_lsn=0x1000200, commit_ts=TS1, xid=752)),
        # verified on a live pglogical 2.4.2
        V("O origin", "4f 00 0000000000abcdef 07 6e6f64655f7800",
          lambda: _pgl("O", origin_lsn=0xabcdef, name="node_x")),
        V("R relation", """
            52 00 00004001 07 "public" 00 06 "items" 00 41 0004
            43 01 4e 0003 "id" 00
            43 00 4e 0005 "note" 00
            43 00 4e 0004 "qty" 00
            43 00 4e 0005 "code" 00""",
          lambda: _pgl("R", relid=0x4001, namespace="public", name="items", columns=PGL_ITEMS_V1)),
        # 'i' int4 1 (host order), 't' "1", 'b' int4 1, 'i' text "abc" with its 1-byte varlena header
        V("I insert", """
            49 00 00004001 4e 54 0004
            69 00000004 01000000
            74 00000002 3100
            62 00000004 00000001
            69 00000004 09 616263""",
          lambda: _pgl("I", relid=0x4001, new=[Internal(b"\1\0\0\0"), "1", b"\0\0\0\1", Internal(b"\x09abc")])),
        V("U update with key", """
            55 00 00004001
            4b 54 0004 69 00000004 01000000 6e 6e 6e
            4e 54 0004 69 00000004 02000000 74 00000004 "two" 00 6e 75""",
          lambda: _pgl("U", relid=0x4001, old=[Internal(b"\1\0\0\0"), None, None, None],
                       new=[Internal(b"\2\0\0\0"), "two", None, UNCHANGED])),
        # 't' of length 1 holding only the NUL: the empty string
        V("U update without key", """
            55 00 00004001
            4e 54 0004 69 00000004 02000000 74 00000001 00 62 00000004 00000007 6e""",
          lambda: _pgl("U", relid=0x4001, new=[Internal(b"\2\0\0\0"), "", b"\0\0\0\7", None])),
        V("D delete", "44 00 00004001 4b 54 0004 69 00000004 02000000 6e 6e 6e",
          lambda: _pgl("D", relid=0x4001, old=[Internal(b"\2\0\0\0"), None, None, None])),
        V("C commit", "43 00 0000000001000200 0000000001000238 0002a1b2c3d4e5f6",
          lambda: _pgl("C", commit_lsn=0x1000200, end_lsn=0x1000238, commit_ts=TS1)),
        V("B begin 2", "42 00 0000000001000300 0002a1b2c3d4e600 000002f1",
          lambda: _pgl("B", final_lsn=0x1000300, commit_ts=TS2, xid=753)),
        V("R relation re-sent", """
            52 00 00004001 07 "public" 00 06 "items" 00 41 0003
            43 01 4e 0003 "id" 00
            43 00 4e 0005 "note" 00
            43 00 4e 0006 "extra" 00""",
          lambda: _pgl("R", relid=0x4001, namespace="public", name="items", columns=PGL_ITEMS_V2)),
        V("I insert 2", '49 00 00004001 4e 54 0003 69 00000004 03000000 74 00000004 "abc" 00 74 00000001 00',
          lambda: _pgl("I", relid=0x4001, new=[Internal(b"\3\0\0\0"), "abc", ""])),
        V("C commit 2", "43 00 0000000001000300 0000000001000340 0002a1b2c3d4e600",
          lambda: _pgl("C", commit_lsn=0x1000300, end_lsn=0x1000340, commit_ts=TS2)),
    ],
    changes=[
        row("public.items", 1, "insert", 0x1000200, TS1, 752, 0, "node_x",
            id=b"\1\0\0\0", note="1", qty=b"\0\0\0\1", code=b"\x09abc"),
        row("public.items", 1, "update_preimage", 0x1000200, TS1, 752, 1, "node_x",
            id=b"\1\0\0\0", note=None, qty=None, code=None),
        row("public.items", 1, "update_postimage", 0x1000200, TS1, 752, 2, "node_x", ["code"],
            id=b"\2\0\0\0", note="two", qty=None, code=None),
        row("public.items", 1, "update_postimage", 0x1000200, TS1, 752, 3, "node_x",
            id=b"\2\0\0\0", note="", qty=b"\0\0\0\7", code=None),
        row("public.items", 1, "delete", 0x1000200, TS1, 752, 4, "node_x",
            id=b"\2\0\0\0", note=None, qty=None, code=None),
        row("public.items", 2, "insert", 0x1000300, TS2, 753, 0, None, id=b"\3\0\0\0", note="abc", extra=""),
    ],
    nontransactional=[],
    relations={0x4001: relation(0x4001, "public", "items", [("id", None, None, True), ("note", None, None, False),
                                                            ("extra", None, None, False)], 2)},
    startup_params=_PGL_STARTUP,
    committed_lsn=[0, 0, 0, 0, 0, 0, 0, 0, 0x1000238, 0x1000238, 0x1000238, 0x1000238, 0x1000340],
)


# =================================================================================================================
# spock, protocol 5 (u64 remote_insert_lsn before every message but 'S')

SPOCK_ORDERS = [Col("id", 20, -1, True), Col("total", 1700, 0x000c0006), Col("memo", 25, -1)]
_SPOCK5_STARTUP = {"max_proto_version": "5", "min_proto_version": "4", "proto_version": "5", "coltypes": "f",
                   "spock_version_num": "60000"}
_sp5_s = hx('53 01 "max_proto_version" 00 "5" 00 "min_proto_version" 00 "4" 00 "proto_version" 00 "5" 00'
            ' "coltypes" 00 "f" 00 "spock_version_num" 00 "60000" 00')
# a sync event: i32 mtype 3, u32 origin node, 64 zero bytes, in host (little-endian) order
_SYNC2 = hx("03000000 02000000" + " 00" * 64)
_SYNC5 = hx("03000000 05000000" + " 00" * 64)


def _sp5(msg_type, insert_lsn, **fields):
    return lambda: W.spock(msg_type, proto=5, insert_lsn=insert_lsn, **fields)


SPOCK5 = Golden(
    "spock5", "spock", {},
    [
        V("S startup", _sp5_s.hex(), lambda: W.spock("S", params=_SPOCK5_STARTUP), _startup_complete(_sp5_s)),
        V("B begin", "0000000002000010 42 00 0000000002000100 0002a1b2c3d4e5f6 00000400",
          _sp5("B", 0x2000010, final_lsn=0x2000100, commit_ts=TS1, xid=1024)),
        V("O origin with name", '0000000002000018 4f 01 0000000000001234 0002 "n2" 00',
          _sp5("O", 0x2000018, origin_lsn=0x1234, origin_id=2, name="n2")),
        V("L last commit ts", "0000000002000020 4c 00 0002a1b2c3d4e000",
          _sp5("L", 0x2000020, last_commit_ts=0x0002a1b2c3d4e000)),
        V("R relation", """
            0000000002000028 52 00 00004002 07 "public" 00 07 "orders" 00 41 0003
            43 01 4e 0003 "id" 00 00000014 ffffffff
            43 00 4e 0006 "total" 00 000006a4 000c0006
            43 00 4e 0005 "memo" 00 00000019 ffffffff""",
          _sp5("R", 0x2000028, relid=0x4002, namespace="public", name="orders", columns=SPOCK_ORDERS)),
        V("I insert", '0000000002000030 49 00 00004002 4e 54 0003 62 00000008 0000000000000001'
                      ' 74 00000006 "12.50" 00 6e',
          _sp5("I", 0x2000030, relid=0x4002, new=[b"\0\0\0\0\0\0\0\1", "12.50", None])),
        V("U update with key", """
            0000000002000038 55 00 00004002
            4b 54 0003 62 00000008 0000000000000001 6e 6e
            4e 54 0003 62 00000008 0000000000000002 74 00000006 "13.00" 00 75""",
          _sp5("U", 0x2000038, relid=0x4002, old=[b"\0\0\0\0\0\0\0\1", None, None],
               new=[b"\0\0\0\0\0\0\0\2", "13.00", UNCHANGED])),
        V("D delete", "0000000002000040 44 00 00004002 4b 54 0003 62 00000008 0000000000000002 6e 6e",
          _sp5("D", 0x2000040, relid=0x4002, old=[b"\0\0\0\0\0\0\0\2", None, None])),
        V("T truncate", "0000000002000048 54 00000001 03 00004002",
          _sp5("T", 0x2000048, flags=3, relids=[0x4002])),
        V("M sync event", '0000000002000050 4d 00000400 0000000002000050 01 "Spock" 00 00000048 '
                          + _SYNC2.hex(),
          _sp5("M", 0x2000050, xid=1024, lsn=0x2000050, content=_SYNC2)),
        V("C commit", "0000000002000060 43 00 0000000002000100 0000000002000140 0002a1b2c3d4e5f6",
          _sp5("C", 0x2000060, commit_lsn=0x2000100, end_lsn=0x2000140, commit_ts=TS1)),
        V("B begin 2", "0000000002000200 42 00 0000000002000300 0002a1b2c3d4e700 00000401",
          _sp5("B", 0x2000200, final_lsn=0x2000300, commit_ts=TS3, xid=1025)),
        # origin_lsn 0: a local transaction (the local node's id and name), so no origin
        V("O local origin", '0000000002000208 4f 01 0000000000000000 0001 "n1" 00',
          _sp5("O", 0x2000208, origin_lsn=0, origin_id=1, name="n1")),
        V("L zero", "0000000002000210 4c 00 0000000000000000", _sp5("L", 0x2000210, last_commit_ts=0)),
        V("I insert 2", '0000000002000218 49 00 00004002 4e 54 0003 62 00000008 0000000000000003 6e'
                        ' 74 00000003 "hi" 00',
          _sp5("I", 0x2000218, relid=0x4002, new=[b"\0\0\0\0\0\0\0\3", None, "hi"])),
        V("C commit 2", "0000000002000220 43 00 0000000002000300 0000000002000340 0002a1b2c3d4e700",
          _sp5("C", 0x2000220, commit_lsn=0x2000300, end_lsn=0x2000340, commit_ts=TS3)),
        V("M outside a transaction", '0000000002000400 4d 00000000 0000000002000400 00 "Spock" 00 00000048 '
                                     + _SYNC5.hex(),
          _sp5("M", 0x2000400, xid=0, lsn=0x2000400, content=_SYNC5)),
    ],
    changes=[
        row("public.orders", 1, "insert", 0x2000100, TS1, 1024, 0, "n2", id=b"\0\0\0\0\0\0\0\1", total="12.50",
            memo=None),
        row("public.orders", 1, "update_preimage", 0x2000100, TS1, 1024, 1, "n2", id=b"\0\0\0\0\0\0\0\1",
            total=None, memo=None),
        row("public.orders", 1, "update_postimage", 0x2000100, TS1, 1024, 2, "n2", ["memo"],
            id=b"\0\0\0\0\0\0\0\2", total="13.00", memo=None),
        row("public.orders", 1, "delete", 0x2000100, TS1, 1024, 3, "n2", id=b"\0\0\0\0\0\0\0\2", total=None,
            memo=None),
        truncate(["public.orders"], True, True, 0x2000100, TS1, 1024, 4, "n2"),
        message("Spock", _SYNC2, True, 0x2000050, 1024, 0x2000100, TS1, 5, "n2"),
        row("public.orders", 1, "insert", 0x2000300, TS3, 1025, 0, None, id=b"\0\0\0\0\0\0\0\3", total=None,
            memo="hi"),
    ],
    nontransactional=[message("Spock", _SYNC5, False, 0x2000400, None, None, None, None)],
    relations={0x4002: relation(0x4002, "public", "orders", [("id", 20, -1, True), ("total", 1700, 0x000c0006, False),
                                                             ("memo", 25, -1, False)], 1)},
    startup_params=_SPOCK5_STARTUP,
    committed_lsn=[0] * 10 + [0x2000140] * 5 + [0x2000340] * 2,
)


# =================================================================================================================
# spock, protocol 4 (spock 5.0.x: no proto_version key, trailing remote_insert_lsn on COMMIT)

_SPOCK4_STARTUP = {"max_proto_version": "4", "min_proto_version": "4", "spock_version_num": "50001"}
_sp4_s = hx('53 01 "max_proto_version" 00 "4" 00 "min_proto_version" 00 "4" 00 "spock_version_num" 00 "50001" 00')
SPOCK_KV = [Col("k", 23, -1, True), Col("v", 25, -1)]


def _sp4(msg_type, **fields):
    return lambda: W.spock(msg_type, proto=4, **fields)


SPOCK4_VECTORS = [
    V("B begin", "42 00 0000000003000100 0002a1b2c3d4e5f6 00000500",
      _sp4("B", final_lsn=0x3000100, commit_ts=TS1, xid=0x500)),
    # v4 origin: flags 0, no name; the origin is the node id as text
    V("O origin without name", "4f 00 0000000000005678 0007", _sp4("O", origin_lsn=0x5678, origin_id=7)),
    V("L last commit ts", "4c 00 0000000000000000", _sp4("L", last_commit_ts=0)),
    V("R relation", """
        52 00 00004003 07 "public" 00 03 "kv" 00 41 0002
        43 01 4e 0002 "k" 00 00000017 ffffffff
        43 00 4e 0002 "v" 00 00000019 ffffffff""",
      _sp4("R", relid=0x4003, namespace="public", name="kv", columns=SPOCK_KV)),
    V("I insert", '49 00 00004003 4e 54 0002 74 00000003 "42" 00 74 00000002 "x" 00',
      _sp4("I", relid=0x4003, new=["42", "x"])),
    V("C commit with trailing insert lsn", "43 00 0000000003000100 0000000003000120 0002a1b2c3d4e5f6 0000000003000118",
      _sp4("C", commit_lsn=0x3000100, end_lsn=0x3000120, commit_ts=TS1, insert_lsn=0x3000118)),
]
_SPOCK4_RESULT = dict(
    changes=[row("public.kv", 1, "insert", 0x3000100, TS1, 0x500, 0, "7", k="42", v="x")],
    nontransactional=[],
    relations={0x4003: relation(0x4003, "public", "kv", [("k", 23, -1, True), ("v", 25, -1, False)], 1)},
)

SPOCK4 = Golden(
    "spock4", "spock", {},
    [V("S startup without proto_version", _sp4_s.hex(), lambda: W.spock("S", params=_SPOCK4_STARTUP),
       _startup_complete(_sp4_s))] + SPOCK4_VECTORS,
    startup_params=_SPOCK4_STARTUP, committed_lsn=[0] * 6 + [0x3000120], **_SPOCK4_RESULT)

# the same v4 stream without 'S', for a decoder told the version up front
SPOCK4_NO_STARTUP = Golden(
    "spock4-no-startup", "spock", {"proto_version": 4}, SPOCK4_VECTORS,
    startup_params={}, committed_lsn=[0] * 5 + [0x3000120], **_SPOCK4_RESULT)


# =================================================================================================================
# pgoutput, protocol 1

_pgo = W.pgoutput
PGO_ACCOUNTS = [Col("id", 23, -1, True), Col("owner", 25, -1), Col("level", 0x4168, -1)]

PGOUTPUT = Golden(
    "pgoutput", "pgoutput", {},
    [
        V("B begin", "42 0000000004000100 0002a1b2c3d4e5f6 00000600",
          lambda: _pgo("B", final_lsn=0x4000100, commit_ts=TS1, xid=0x600)),
        V("O origin", '4f 0000000000009abc "sub_origin" 00', lambda: _pgo("O", origin_lsn=0x9abc, name="sub_origin")),
        # verified on PostgreSQL 15: a domain over int4 is described with the base type's name
        V("Y type", "59 00004168 00 696e743400", lambda: _pgo("Y", type_oid=0x4168, namespace="", name="int4")),
        V("R relation", """
            52 00004004 "public" 00 "accounts" 00 64 0003
            01 "id" 00 00000017 ffffffff
            00 "owner" 00 00000019 ffffffff
            00 "level" 00 00004168 ffffffff""",
          lambda: _pgo("R", relid=0x4004, namespace="public", name="accounts", replident="d", columns=PGO_ACCOUNTS)),
        V("I insert", '49 00004004 4e 0003 74 00000001 "1" 74 00000005 "alice" 74 00000001 "3"',
          lambda: _pgo("I", relid=0x4004, new=["1", "alice", "3"])),
        V("U update with old tuple", """
            55 00004004
            4f 0003 74 00000001 "1" 74 00000005 "alice" 74 00000001 "3"
            4e 0003 74 00000001 "1" 75 74 00000001 "4" """,
          lambda: _pgo("U", relid=0x4004, old_kind="O", old=["1", "alice", "3"], new=["1", UNCHANGED, "4"])),
        # 't' of length 0 is the empty string in pgoutput
        V("U update with key", """
            55 00004004
            4b 0003 74 00000001 "1" 6e 6e
            4e 0003 74 00000001 "2" 74 00000000 6e""",
          lambda: _pgo("U", relid=0x4004, old=["1", None, None], new=["2", "", None])),
        V("U update without old tuple", '55 00004004 4e 0003 74 00000001 "2" 74 00000003 "bob" 74 00000001 "5"',
          lambda: _pgo("U", relid=0x4004, new=["2", "bob", "5"])),
        V("D delete", '44 00004004 4b 0003 74 00000001 "2" 6e 6e', lambda: _pgo("D", relid=0x4004, old=["2", None, None])),
        V("T truncate", "54 00000001 01 00004004", lambda: _pgo("T", flags=1, relids=[0x4004])),
        V("M transactional message", '4d 01 0000000004000080 "app" 00 00000005 "hello"',
          lambda: _pgo("M", flags=1, lsn=0x4000080, prefix="app", content=b"hello")),
        V("C commit", "43 00 0000000004000100 0000000004000140 0002a1b2c3d4e5f6",
          lambda: _pgo("C", commit_lsn=0x4000100, end_lsn=0x4000140, commit_ts=TS1)),
        V("M non-transactional message", '4d 00 0000000004000150 "note" 00 00000003 010203',
          lambda: _pgo("M", flags=0, lsn=0x4000150, prefix="note", content=b"\1\2\3")),
        V("B begin 2", "42 0000000004000200 0002a1b2c3d4e700 00000601",
          lambda: _pgo("B", final_lsn=0x4000200, commit_ts=TS3, xid=0x601)),
        V("I insert binary", '49 00004004 4e 0003 62 00000004 00000007 62 00000003 "eve" 6e',
          lambda: _pgo("I", relid=0x4004, new=[b"\0\0\0\7", b"eve", None])),
        V("C commit 2", "43 00 0000000004000200 0000000004000240 0002a1b2c3d4e700",
          lambda: _pgo("C", commit_lsn=0x4000200, end_lsn=0x4000240, commit_ts=TS3)),
    ],
    changes=[
        row("public.accounts", 1, "insert", 0x4000100, TS1, 0x600, 0, "sub_origin", id="1", owner="alice", level="3"),
        row("public.accounts", 1, "update_preimage", 0x4000100, TS1, 0x600, 1, "sub_origin", id="1", owner="alice",
            level="3"),
        row("public.accounts", 1, "update_postimage", 0x4000100, TS1, 0x600, 2, "sub_origin", ["owner"], id="1",
            owner=None, level="4"),
        row("public.accounts", 1, "update_preimage", 0x4000100, TS1, 0x600, 3, "sub_origin", id="1", owner=None,
            level=None),
        row("public.accounts", 1, "update_postimage", 0x4000100, TS1, 0x600, 4, "sub_origin", id="2", owner="",
            level=None),
        row("public.accounts", 1, "update_postimage", 0x4000100, TS1, 0x600, 5, "sub_origin", id="2", owner="bob",
            level="5"),
        row("public.accounts", 1, "delete", 0x4000100, TS1, 0x600, 6, "sub_origin", id="2", owner=None, level=None),
        truncate(["public.accounts"], True, False, 0x4000100, TS1, 0x600, 7, "sub_origin"),
        message("app", b"hello", True, 0x4000080, 0x600, 0x4000100, TS1, 8, "sub_origin"),
        row("public.accounts", 1, "insert", 0x4000200, TS3, 0x601, 0, None, id=b"\0\0\0\7", owner=b"eve", level=None),
    ],
    nontransactional=[message("note", b"\1\2\3", False, 0x4000150, None, None, None, None)],
    relations={0x4004: relation(0x4004, "public", "accounts", [("id", 23, -1, True), ("owner", 25, -1, False),
                                                               ("level", 0x4168, -1, False)], 1, "d")},
    startup_params={},
    committed_lsn=[0] * 11 + [0x4000140] * 4 + [0x4000240],
)


# =================================================================================================================
# pgoutput streaming (proto 2 and, for the long 'A', proto 4 with streaming=parallel)

PGO_EVENTS = [Col("id", 23, -1, True), Col("body", 25, -1, True)]

PGOUTPUT_STREAM = Golden(
    "pgoutput-stream", "pgoutput", {},
    [
        V("S stream start (first)", "53 0000031b 01", lambda: _pgo("S", xid=795, first_segment=1)),
        V("R relation in a stream", """
            52 0000031b 00004005 "public" 00 "events" 00 66 0002
            01 "id" 00 00000017 ffffffff
            01 "body" 00 00000019 ffffffff""",
          lambda: _pgo("R", xid=795, relid=0x4005, namespace="public", name="events", replident="f",
                       columns=PGO_EVENTS)),
        V("I by the top transaction", '49 0000031b 00004005 4e 0002 74 00000001 "1" 74 00000001 "a"',
          lambda: _pgo("I", xid=795, relid=0x4005, new=["1", "a"])),
        V("I by subtransaction 796", '49 0000031c 00004005 4e 0002 74 00000001 "2" 74 00000001 "b"',
          lambda: _pgo("I", xid=796, relid=0x4005, new=["2", "b"])),
        V("E stream stop", "45", lambda: _pgo("E")),
        V("B plain begin", "42 0000000005000100 0002a1b2c3d4e5f6 00000320",
          lambda: _pgo("B", final_lsn=0x5000100, commit_ts=TS1, xid=800)),
        V("I plain", '49 00004005 4e 0002 74 00000001 "9" 74 00000001 "z"',
          lambda: _pgo("I", relid=0x4005, new=["9", "z"])),
        V("C plain commit", "43 00 0000000005000100 0000000005000140 0002a1b2c3d4e5f6",
          lambda: _pgo("C", commit_lsn=0x5000100, end_lsn=0x5000140, commit_ts=TS1)),
        V("S stream start (continued)", "53 0000031b 00", lambda: _pgo("S", xid=795, first_segment=0)),
        V("U by subtransaction 797", """
            55 0000031d 00004005
            4f 0002 74 00000001 "1" 74 00000001 "a"
            4e 0002 74 00000001 "1" 74 00000001 "c" """,
          lambda: _pgo("U", xid=797, relid=0x4005, old_kind="O", old=["1", "a"], new=["1", "c"])),
        V("E stream stop 2", "45", lambda: _pgo("E")),
        V("A subtransaction abort", "41 0000031b 0000031c", lambda: _pgo("A", xid=795, subxid=796)),
        V("c stream commit", "63 0000031b 00 0000000005000200 0000000005000240 0002a1b2c3d4e700",
          lambda: _pgo("c", xid=795, commit_lsn=0x5000200, end_lsn=0x5000240, commit_ts=TS3)),
        V("S another stream", "53 00000321 01", lambda: _pgo("S", xid=801, first_segment=1)),
        V("I in the other stream", '49 00000321 00004005 4e 0002 74 00000001 "7" 74 00000001 "q"',
          lambda: _pgo("I", xid=801, relid=0x4005, new=["7", "q"])),
        V("E stream stop 3", "45", lambda: _pgo("E")),
        # streaming=parallel: abort_lsn and abort_ts follow
        V("A whole-transaction abort with lsn and ts", "41 00000321 00000321 0000000005000300 0002a1b2c3d4e800",
          lambda: _pgo("A", xid=801, subxid=801, abort_lsn=0x5000300, abort_ts=TS4), complete=[9]),
        V("B plain begin 2", "42 0000000005000400 0002a1b2c3d4e900 00000322",
          lambda: _pgo("B", final_lsn=0x5000400, commit_ts=TS5, xid=802)),
        V("I plain 2", '49 00004005 4e 0002 74 00000001 "8" 6e', lambda: _pgo("I", relid=0x4005, new=["8", None])),
        V("C plain commit 2", "43 00 0000000005000400 0000000005000440 0002a1b2c3d4e900",
          lambda: _pgo("C", commit_lsn=0x5000400, end_lsn=0x5000440, commit_ts=TS5)),
    ],
    changes=[
        row("public.events", 1, "insert", 0x5000100, TS1, 800, 0, id="9", body="z"),
        row("public.events", 1, "insert", 0x5000200, TS3, 795, 0, id="1", body="a"),
        # the aborted subtransaction 796's change is dropped and the kept changes are numbered 0..n-1, as a
        # non-streamed delivery of the same transaction numbers them
        row("public.events", 1, "update_preimage", 0x5000200, TS3, 795, 1, id="1", body="a"),
        row("public.events", 1, "update_postimage", 0x5000200, TS3, 795, 2, id="1", body="c"),
        row("public.events", 1, "insert", 0x5000400, TS5, 802, 0, id="8", body=None),
    ],
    nontransactional=[],
    relations={0x4005: relation(0x4005, "public", "events", [("id", 23, -1, True), ("body", 25, -1, True)], 1, "f")},
    startup_params={},
    # the open stream holds committed_lsn where it was when the stream began
    committed_lsn=[0] * 12 + [0x5000240] * 5 + [0x5000240] * 2 + [0x5000440],
)


# =================================================================================================================
# pgoutput two-phase (proto 3)

PGO_LEDGER = [Col("id", 20, -1, True), Col("amount", 1700, 0x000c0006)]

PGOUTPUT_TWO_PHASE = Golden(
    "pgoutput-two-phase", "pgoutput", {},
    [
        V("b begin prepare", '62 0000000006000100 0000000006000140 0002a1b2c3d4e5f6 00000384 "gid-1" 00',
          lambda: _pgo("b", lsn=0x6000100, end_lsn=0x6000140, ts=TS1, xid=900, gid="gid-1")),
        V("R relation", """
            52 00004006 "public" 00 "ledger" 00 69 0002
            01 "id" 00 00000014 ffffffff
            00 "amount" 00 000006a4 000c0006""",
          lambda: _pgo("R", relid=0x4006, namespace="public", name="ledger", replident="i", columns=PGO_LEDGER)),
        V("I prepared", '49 00004006 4e 0002 74 00000001 "1" 74 00000004 "9.99"',
          lambda: _pgo("I", relid=0x4006, new=["1", "9.99"])),
        V("P prepare", '50 00 0000000006000100 0000000006000140 0002a1b2c3d4e5f6 00000384 "gid-1" 00',
          lambda: _pgo("P", lsn=0x6000100, end_lsn=0x6000140, ts=TS1, xid=900, gid="gid-1")),
        V("B plain begin", "42 0000000006000200 0002a1b2c3d4e600 00000385",
          lambda: _pgo("B", final_lsn=0x6000200, commit_ts=TS2, xid=901)),
        V("I plain", '49 00004006 4e 0002 74 00000001 "2" 74 00000004 "1.50"',
          lambda: _pgo("I", relid=0x4006, new=["2", "1.50"])),
        V("C plain commit", "43 00 0000000006000200 0000000006000240 0002a1b2c3d4e600",
          lambda: _pgo("C", commit_lsn=0x6000200, end_lsn=0x6000240, commit_ts=TS2)),
        V("K commit prepared", '4b 00 0000000006000300 0000000006000340 0002a1b2c3d4e700 00000384 "gid-1" 00',
          lambda: _pgo("K", lsn=0x6000300, end_lsn=0x6000340, ts=TS3, xid=900, gid="gid-1")),
        V("b begin prepare 2", '62 0000000006000400 0000000006000440 0002a1b2c3d4e800 00000386 "gid-2" 00',
          lambda: _pgo("b", lsn=0x6000400, end_lsn=0x6000440, ts=TS4, xid=902, gid="gid-2")),
        V("I prepared 2", '49 00004006 4e 0002 74 00000001 "3" 6e', lambda: _pgo("I", relid=0x4006, new=["3", None])),
        V("P prepare 2", '50 00 0000000006000400 0000000006000440 0002a1b2c3d4e800 00000386 "gid-2" 00',
          lambda: _pgo("P", lsn=0x6000400, end_lsn=0x6000440, ts=TS4, xid=902, gid="gid-2")),
        V("r rollback prepared", """
            72 00 0000000006000440 0000000006000500 0002a1b2c3d4e800 0002a1b2c3d4e900 00000386 "gid-2" 00""",
          lambda: _pgo("r", prepare_end_lsn=0x6000440, rollback_end_lsn=0x6000500, prepare_ts=TS4, rollback_ts=TS5,
                       xid=902, gid="gid-2")),
        V("S stream start", "53 00000387 01", lambda: _pgo("S", xid=903, first_segment=1)),
        V("I streamed", '49 00000387 00004006 4e 0002 74 00000001 "4" 74 00000001 "0"',
          lambda: _pgo("I", xid=903, relid=0x4006, new=["4", "0"])),
        V("E stream stop", "45", lambda: _pgo("E")),
        V("p stream prepare", '70 00 0000000006000600 0000000006000640 0002a1b2c3d4ea00 00000387 "gid-3" 00',
          lambda: _pgo("p", lsn=0x6000600, end_lsn=0x6000640, ts=0x0002a1b2c3d4ea00, xid=903, gid="gid-3")),
        V("K commit prepared 2", '4b 00 0000000006000700 0000000006000740 0002a1b2c3d4eb00 00000387 "gid-3" 00',
          lambda: _pgo("K", lsn=0x6000700, end_lsn=0x6000740, ts=0x0002a1b2c3d4eb00, xid=903, gid="gid-3")),
    ],
    changes=[
        row("public.ledger", 1, "insert", 0x6000200, TS2, 901, 0, id="2", amount="1.50"),
        row("public.ledger", 1, "insert", 0x6000300, TS3, 900, 0, id="1", amount="9.99"),
        row("public.ledger", 1, "insert", 0x6000700, 0x0002a1b2c3d4eb00, 903, 0, id="4", amount="0"),
    ],
    nontransactional=[],
    relations={0x4006: relation(0x4006, "public", "ledger", [("id", 20, -1, True), ("amount", 1700, 0x000c0006, False)],
                                1, "i")},
    startup_params={},
    committed_lsn=[0] * 7 + [0x6000340] * 9 + [0x6000740],
)


GOLDEN = [PGLOGICAL, SPOCK5, SPOCK4, SPOCK4_NO_STARTUP, PGOUTPUT, PGOUTPUT_STREAM, PGOUTPUT_TWO_PHASE]
# the streams whose vectors are all distinct (SPOCK4_NO_STARTUP repeats SPOCK4's)
GOLDEN_DISTINCT = [PGLOGICAL, SPOCK5, SPOCK4, PGOUTPUT, PGOUTPUT_STREAM, PGOUTPUT_TWO_PHASE]


def all_vectors(streams=GOLDEN_DISTINCT) -> list[tuple[Golden, int, Vector]]:
    return [(g, i, v) for g in streams for i, v in enumerate(g.vectors)]


def wire_types() -> dict[str, set[str]]:
    """Which message types of each protocol the golden streams cover."""
    seen: dict[str, set[str]] = {}
    for g, _, v in all_vectors():
        prefix = 8 if g is SPOCK5 and not v.name.startswith("S ") else 0
        key = {"spock5": "spock5", "spock4": "spock4"}.get(g.name, g.protocol)
        seen.setdefault(key, set()).add(chr(v.data[prefix]))
    return seen

