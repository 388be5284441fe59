"""Malformed input: each protocol rule broken once -> the right error class at the right byte, same in both twins."""
from __future__ import annotations

from typing import NamedTuple

import pytest

from spockwire.errors import ProtocolError, TruncatedMessage
from tests import wire_encoder as W
from tests.wire_encoder import Col, Internal, Raw

TS = 0x0002a1b2c3d4e5f6
REL_COLS = [Col("a", 23, -1, True), Col("b", 25, -1)]


def pgo(t, **f):
    return W.pgoutput(t, **f)


def sp5(t, **f):
    return W.spock(t, proto=5, insert_lsn=0x77, **f)


def pgl(t, **f):
    return W.pglogical(t, **f)


# contexts: the messages that put a decoder where the bad message can be tried
PGO_REL = [pgo("R", relid=0x10, namespace="public", name="t", columns=REL_COLS)]
PGO_TXN = [pgo("B", final_lsn=0x100, commit_ts=TS, xid=5)] + PGO_REL
SP5_START = [W.spock("S", params={"proto_version": "5"})]
SP5_TXN = SP5_START + [sp5("B", final_lsn=0x100, commit_ts=TS, xid=5), sp5("O", origin_lsn=9, origin_id=2, name="n2"),
                       sp5("L", last_commit_ts=0),
                       sp5("R", relid=0x10, namespace="public", name="t", columns=REL_COLS)]
PGL_START = [pgl("S", params={"max_proto_version": "1"})]
PGL_TXN = PGL_START + [pgl("B", final_lsn=0x100, commit_ts=TS, xid=5),
                       pgl("R", relid=0x10, namespace="public", name="t", columns=REL_COLS)]
PGO_STREAM = PGO_REL + [pgo("S", xid=7, first_segment=1)]


class Case(NamedTuple):
    name: str
    protocol: str
    context: list
    bad: bytes
    error: type = ProtocolError      # exactly this class (ProtocolError means: not a TruncatedMessage)
    offset: int | None = None        # None: not pinned by the contract
    column: int | None = None
    kwargs: dict = {}


def _with(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + bytes([value]) + data[at + 1:]


CASES: list[Case] = [
    # unknown message types
    Case("pgoutput unknown type", "pgoutput", [], b"Z\0\0", offset=0),
    Case("spock unknown type", "spock", SP5_START, (0x77).to_bytes(8, "big") + b"Z", offset=8),
    Case("pglogical has no 'T'", "pglogical", PGL_TXN, b"T\0\0\0\1\0\0\0\0\x10", offset=0),
    Case("pglogical has no 'L'", "pglogical", PGL_TXN, b"L\0" + bytes(8), offset=0),
    Case("pglogical has no 'M'", "pglogical", PGL_TXN, b"M" + bytes(13) + b"Spock\0" + bytes(4), offset=0),
    # changes and commits outside a transaction
    Case("pgoutput I outside a transaction", "pgoutput", PGO_REL, pgo("I", relid=0x10, new=["1", "x"]), offset=0),
    Case("pgoutput U outside a transaction", "pgoutput", PGO_REL, pgo("U", relid=0x10, new=["1", "x"]), offset=0),
    Case("pgoutput D outside a transaction", "pgoutput", PGO_REL, pgo("D", relid=0x10, old=["1", None]), offset=0),
    Case("pgoutput T outside a transaction", "pgoutput", PGO_REL, pgo("T", relids=[0x10]), offset=0),
    Case("pgoutput C outside a transaction", "pgoutput", PGO_REL,
         pgo("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS), offset=0),
    Case("spock I outside a transaction", "spock", SP5_START + [sp5("R", relid=0x10, namespace="public", name="t",
                                                                        columns=REL_COLS)],
         sp5("I", relid=0x10, new=["1", "x"]), offset=8),
    Case("spock C outside a transaction", "spock", SP5_START, sp5("C", commit_lsn=1, end_lsn=2, commit_ts=TS), offset=8),
    Case("spock T outside a transaction", "spock", SP5_START + [sp5("R", relid=0x10, namespace="public", name="t",
                                                                        columns=REL_COLS)],
         sp5("T", relids=[0x10]), offset=8),
    Case("pglogical C outside a transaction", "pglogical", PGL_START,
         pgl("C", commit_lsn=1, end_lsn=2, commit_ts=TS), offset=0),
    Case("pgoutput I in a stream after stream stop", "pgoutput", PGO_STREAM + [pgo("E")],
         pgo("I", relid=0x10, new=["1", "x"]), offset=0),
    # unknown tuple kinds, named by column: I = type, relid, 'N', u16 ncols, then column 0 at 8
    Case("pgoutput unknown kind 'x'", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=["1", Raw(b"x")]),
         offset=14, column=1),
    Case("pgoutput has no kind 'i'", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=[Raw(b"i", bytes(8))]
                                                            + ["x"]), offset=8, column=0),
    Case("spock unknown kind 'x'", "spock", SP5_TXN, sp5("I", relid=0x10, new=[Raw(b"x"), None]),
         offset=8 + 10, column=0),
    Case("pglogical unknown kind 'N' in a tuple", "pglogical", PGL_TXN, pgl("I", relid=0x10, new=[None, Raw(b"N")]),
         offset=11, column=1),
    Case("spock unknown kind in the old tuple", "spock", SP5_TXN,
         sp5("U", relid=0x10, old=["1", Raw(b"\0")], new=["1", "y"]), offset=8 + 17, column=1),
    # text without its NUL (spock/pglogical): not a truncation
    Case("pglogical 't' without NUL", "pglogical", PGL_TXN, pgl("I", relid=0x10, new=[None, Raw(b"t", b"\0\0\0\2ab")]),
         column=1),
    Case("pglogical 't' of length 0", "pglogical", PGL_TXN, pgl("I", relid=0x10, new=[None, Raw(b"t", b"\0\0\0\0")]),
         column=1),
    Case("spock 't' without NUL", "spock", SP5_TXN, sp5("I", relid=0x10, new=[Raw(b"t", b"\0\0\0\1x"), None]),
         column=0),
    Case("spock 't' of length 0", "spock", SP5_TXN, sp5("I", relid=0x10, new=[Raw(b"t", b"\0\0\0\0"), None]),
         column=0),
    # rows for undescribed relations, column-count mismatches
    Case("pgoutput relid never described", "pgoutput", PGO_TXN, pgo("I", relid=0x99, new=["1", "x"]), offset=1),
    Case("spock relid never described", "spock", SP5_TXN, sp5("D", relid=0x99, old=["1", None]), offset=10),
    Case("pglogical relid never described", "pglogical", PGL_TXN, pgl("U", relid=0x99, new=["1", "x"]), offset=2),
    Case("pgoutput truncate of an undescribed relid", "pgoutput", PGO_TXN, pgo("T", relids=[0x10, 0x99])),
    Case("pgoutput too many columns", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=["1", "x", "y"]), offset=6),
    Case("pgoutput too few columns", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=["1"]), offset=6),
    Case("spock too few columns", "spock", SP5_TXN, sp5("I", relid=0x10, new=["1"]), offset=8 + 8),
    Case("pglogical too many columns in the key", "pglogical", PGL_TXN,
         pgl("D", relid=0x10, old=["1", None, None]), offset=8),
    # commit LSN must match the BEGIN's final LSN (the commit_lsn field follows the flags byte)
    Case("pgoutput commit LSN mismatch", "pgoutput", PGO_TXN, pgo("C", commit_lsn=0x101, end_lsn=0x110, commit_ts=TS),
         offset=2),
    Case("spock commit LSN mismatch", "spock", SP5_TXN, sp5("C", commit_lsn=0x99, end_lsn=0x110, commit_ts=TS),
         offset=10),
    Case("pglogical commit LSN mismatch", "pglogical", PGL_TXN, pgl("C", commit_lsn=0, end_lsn=0x110, commit_ts=TS),
         offset=2),
    # placement of ORIGIN and LAST-COMMIT
    Case("pgoutput O after a change", "pgoutput", PGO_TXN + [pgo("I", relid=0x10, new=["1", "x"])],
         pgo("O", origin_lsn=1, name="x")),
    Case("pgoutput O outside a transaction", "pgoutput", [], pgo("O", origin_lsn=1, name="x")),
    Case("pgoutput O after a continued stream start", "pgoutput",
         PGO_STREAM + [pgo("E"), pgo("S", xid=7, first_segment=0)], pgo("O", origin_lsn=1, name="x")),
    Case("pglogical O after R", "pglogical", PGL_TXN, pgl("O", origin_lsn=1, name="x")),
    Case("spock O after L", "spock", SP5_TXN[:-1], sp5("O", origin_lsn=1, origin_id=3)),
    Case("spock L right after B", "spock", SP5_TXN[:2], sp5("L", last_commit_ts=0)),
    Case("spock L after R", "spock", SP5_TXN, sp5("L", last_commit_ts=0)),
    # two-phase and streams
    Case("K for a gid never prepared", "pgoutput", [],
         pgo("K", lsn=0x100, end_lsn=0x110, ts=TS, xid=5, gid="nope")),
    Case("c for a transaction never streamed", "pgoutput", [],
         pgo("c", xid=5, commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)),
    Case("stream continued before it started", "pgoutput", [], pgo("S", xid=5, first_segment=0)),
    # spock startup
    Case("spock without 'S' and without a version", "spock", [],
         W.spock("B", proto=4, final_lsn=1, commit_ts=0, xid=1), offset=0),
    Case("spock startup format 2", "spock", [], W.spock("S", format=2, params={"proto_version": "5"}), offset=1),
    # counts far beyond the message: truncated, never allocated
    Case("pgoutput R with 65535 columns", "pgoutput", [], pgo("R", relid=1, namespace="p", name="t", columns=[],
                                                              natts=0xFFFF), TruncatedMessage, offset=12),
    Case("pgoutput T with 2^32-1 relids", "pgoutput", PGO_TXN, pgo("T", nrelids=0xFFFFFFFF, relids=[0x10]),
         TruncatedMessage),
    Case("pgoutput text of 2^32-1 bytes", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=["1", Raw(b"t", b"\xff" * 4)]),
         TruncatedMessage, offset=19, column=1),
    Case("pgoutput binary of 2^32-1 bytes", "pgoutput", PGO_TXN,
         pgo("I", relid=0x10, new=[Raw(b"b", b"\xff\xff\xff\xfe\0"), None]), TruncatedMessage, offset=13, column=0),
    Case("pgoutput message of 2^32-1 bytes", "pgoutput", PGO_TXN,
         pgo("M", flags=1, lsn=1, prefix="p", size=0xFFFFFFFF, content=b"abc"), TruncatedMessage, offset=16),
    Case("spock R with 65535 columns", "spock", SP5_START,
         sp5("R", relid=1, namespace="p", name="t", columns=[], natts=0xFFFF), TruncatedMessage),
    Case("spock column name of 65535 bytes", "spock", SP5_START,
         sp5("R", relid=1, namespace="p", name="t", columns=[])[:-2] + b"\0\1C\0N\xff\xffab", TruncatedMessage),
    Case("spock T with 2^32-1 relids", "spock", SP5_TXN, sp5("T", nrelids=0xFFFFFFFF, relids=[0x10]),
         TruncatedMessage, offset=8 + 6),
    Case("spock M of 2^32-1 bytes", "spock", SP5_TXN, sp5("M", xid=5, lsn=1, size=0xFFFFFFFF, content=b""),
         TruncatedMessage),
    Case("spock 'i' of 2^32-1 bytes", "spock", SP5_TXN,
         sp5("I", relid=0x10, new=[Raw(b"i", b"\xff\xff\xff\xff"), None]), TruncatedMessage, offset=8 + 15, column=0),
    Case("pglogical namespace of 255 bytes", "pglogical", PGL_START,
         pgl("R", relid=1, namespace="p", name="t", columns=[])[:6] + b"\xff" + b"ab", TruncatedMessage, offset=7),
]

# --- reserved flag bits: every bit that is not allowed, in every flags byte -------------------------------------
_FLAG_SITES = [
    # (name, protocol, context, good message, flags offset, allowed bits)
    ("spock B", "spock", SP5_START, sp5("B", final_lsn=0x100, commit_ts=TS, xid=5), 9, 0),
    ("spock C", "spock", SP5_TXN, sp5("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS), 9, 0),
    ("spock R", "spock", SP5_TXN, sp5("R", relid=0x11, namespace="p", name="u", columns=REL_COLS), 9, 0),
    ("spock I", "spock", SP5_TXN, sp5("I", relid=0x10, new=["1", None]), 9, 0),
    ("spock U", "spock", SP5_TXN, sp5("U", relid=0x10, new=["1", None]), 9, 0),
    ("spock D", "spock", SP5_TXN, sp5("D", relid=0x10, old=["1", None]), 9, 0),
    ("spock O", "spock", SP5_TXN[:2], sp5("O", origin_lsn=3, origin_id=3), 9, 0x01),
    ("spock column", "spock", SP5_TXN, sp5("R", relid=0x11, namespace="p", name="u", columns=REL_COLS), 8 + 16, 0x01),
    ("spock T", "spock", SP5_TXN, sp5("T", relids=[0x10]), 8 + 5, 0x03),
    ("pglogical B", "pglogical", PGL_START, pgl("B", final_lsn=0x100, commit_ts=TS, xid=5), 1, 0),
    ("pglogical C", "pglogical", PGL_TXN, pgl("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS), 1, 0),
    ("pglogical R", "pglogical", PGL_TXN, pgl("R", relid=0x11, namespace="p", name="u", columns=REL_COLS), 1, 0),
    ("pglogical I", "pglogical", PGL_TXN, pgl("I", relid=0x10, new=["1", None]), 1, 0),
    ("pglogical U", "pglogical", PGL_TXN, pgl("U", relid=0x10, new=["1", None]), 1, 0),
    ("pglogical D", "pglogical", PGL_TXN, pgl("D", relid=0x10, old=["1", None]), 1, 0),
    ("pglogical column", "pglogical", PGL_TXN, pgl("R", relid=0x11, namespace="p", name="u", columns=REL_COLS), 16,
     0x01),
    ("pgoutput C", "pgoutput", PGO_TXN, pgo("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS), 1, 0),
    ("pgoutput T", "pgoutput", PGO_TXN, pgo("T", relids=[0x10]), 5, 0x03),
    ("pgoutput M", "pgoutput", PGO_TXN, pgo("M", flags=1, lsn=1, prefix="p", content=b"x"), 1, 0x01),
    ("pgoutput column", "pgoutput", PGO_TXN, pgo("R", relid=0x11, namespace="p", name="u", columns=REL_COLS), 12, 0x01),
]
for _name, _proto, _ctx, _good, _at, _allowed in _FLAG_SITES:
    for _bit in range(8):
        if not (1 << _bit) & _allowed:
            CASES.append(Case(f"{_name} flag bit 0x{1 << _bit:02x}", _proto, _ctx,
                              _with(_good, _at, _good[_at] | (1 << _bit)), offset=_at))

# --- trailing bytes after complete messages -------------------------------------------------------------------
_TRAILING = [
    ("pgoutput B", "pgoutput", [], pgo("B", final_lsn=0x100, commit_ts=TS, xid=5)),
    ("pgoutput C", "pgoutput", PGO_TXN, pgo("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)),
    ("pgoutput R", "pgoutput", [], PGO_REL[0]),
    ("pgoutput Y", "pgoutput", [], pgo("Y", type_oid=16744, name="int4")),
    ("pgoutput I", "pgoutput", PGO_TXN, pgo("I", relid=0x10, new=["1", "x"])),
    ("pgoutput U", "pgoutput", PGO_TXN, pgo("U", relid=0x10, old=["1", None], new=["1", "x"])),
    ("pgoutput D", "pgoutput", PGO_TXN, pgo("D", relid=0x10, old=["1", None])),
    ("pgoutput T", "pgoutput", PGO_TXN, pgo("T", relids=[0x10])),
    ("pgoutput M", "pgoutput", PGO_TXN, pgo("M", flags=1, lsn=1, prefix="p", content=b"x")),
    ("pgoutput S", "pgoutput", [], pgo("S", xid=7)),
    ("pgoutput E", "pgoutput", PGO_STREAM, pgo("E")),
    ("pgoutput A with abort lsn and ts", "pgoutput", PGO_STREAM + [pgo("E")],
     pgo("A", xid=7, subxid=8, abort_lsn=1, abort_ts=2)),
    ("pgoutput b", "pgoutput", [], pgo("b", lsn=0x100, end_lsn=0x110, ts=TS, xid=5, gid="g")),
    ("spock B", "spock", SP5_START, sp5("B", final_lsn=0x100, commit_ts=TS, xid=5)),
    ("spock O", "spock", SP5_TXN[:2], sp5("O", origin_lsn=3, origin_id=3, name="n3")),
    ("spock L", "spock", SP5_TXN[:3], sp5("L", last_commit_ts=0)),
    ("spock I", "spock", SP5_TXN, sp5("I", relid=0x10, new=["1", None])),
    ("spock M", "spock", SP5_TXN, sp5("M", xid=5, lsn=1, content=b"x")),
    ("spock C", "spock", SP5_TXN, sp5("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)),
    ("spock v4 C", "spock", [], W.spock("C", proto=4, commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)),
    ("pglogical O", "pglogical", PGL_TXN[:2], pgl("O", origin_lsn=3, name="x")),
    ("pglogical R", "pglogical", PGL_TXN, pgl("R", relid=0x11, namespace="p", name="u", columns=REL_COLS)),
    ("pglogical D", "pglogical", PGL_TXN, pgl("D", relid=0x10, old=[Internal(b"\1\0\0\0"), None])),
]
for _name, _proto, _ctx, _good in _TRAILING:
    _kwargs = {"proto_version": 4} if _name == "spock v4 C" else {}
    if _name == "spock v4 C":   # a v4 decoder inside a transaction
        _ctx = [W.spock("B", proto=4, final_lsn=0x100, commit_ts=TS, xid=5)]
    CASES.append(Case(f"{_name} with a trailing byte", _proto, _ctx, _good + b"\0", offset=len(_good), kwargs=_kwargs))


def _run(impl, case):
    dec = impl.Decoder(protocol=case.protocol, **{"types": "raw", **case.kwargs})
    for message in case.context:
        dec.feed(message)
    with pytest.raises(ProtocolError) as info:
        dec.feed(case.bad)
    return info.value


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed(both_impls, case):
    c_exc, py_exc = (_run(impl, case) for impl in both_impls)
    for exc in (py_exc, c_exc):
        assert type(exc) is case.error, f"{type(exc).__name__}: {exc}"
        if case.offset is not None:
            assert exc.offset == case.offset, str(exc)
        if case.column is not None:
            assert exc.column == case.column, str(exc)
    assert (type(c_exc), str(c_exc), c_exc.offset, c_exc.needed, c_exc.remaining, c_exc.column) == \
           (type(py_exc), str(py_exc), py_exc.offset, py_exc.needed, py_exc.remaining, py_exc.column)


@pytest.mark.parametrize("case", [c for c in CASES if c.column is not None], ids=lambda c: c.name)
def test_column_errors_name_the_column(both_impls, case):
    for impl in both_impls:
        exc = _run(impl, case)
        assert exc.column_name in ("a", "b")
        assert f'of column {case.column} ("{exc.column_name}")' in str(exc)


def test_context_is_valid(both_impls):
    """Each context alone decodes without error (so the failures above come from the bad message)."""
    seen = set()
    for case in CASES:
        key = (case.protocol, tuple(case.context), tuple(case.kwargs.items()))
        if key in seen:
            continue
        seen.add(key)
        for impl in both_impls:
            dec = impl.Decoder(protocol=case.protocol, **{"types": "raw", **case.kwargs})
            for message in case.context:
                dec.feed(message)


def test_spock_version_given_up_front(both_impls):
    for impl in both_impls:
        for version, begin in ((4, W.spock("B", proto=4, final_lsn=1, commit_ts=0, xid=1)),
                               (5, sp5("B", final_lsn=1, commit_ts=0, xid=1))):
            dec = impl.Decoder(protocol="spock", proto_version=version, types="raw")
            dec.feed(begin)


# --- the decoder after a rejected message ---------------------------------------------------------------------
_R5 = sp5("R", relid=0x10, namespace="public", name="t", columns=REL_COLS)
_PGL_R = pgl("R", relid=0x10, namespace="public", name="t", columns=REL_COLS)


def _v4(t, **f):
    return W.spock(t, proto=4, **f)


# valid continuations of a context: the open transaction (or stream) finished, or a whole new transaction; each
# context has at least one under which the decoder emits rows (asserted below)
CONTINUATIONS = {
    "pgoutput": [
        [pgo("I", relid=0x10, new=["2", "y"]), pgo("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
        [pgo("B", final_lsn=0x200, commit_ts=TS, xid=6), *PGO_REL, pgo("I", relid=0x10, new=["3", "z"]),
         pgo("C", commit_lsn=0x200, end_lsn=0x210, commit_ts=TS)],
        [pgo("I", xid=7, relid=0x10, new=["4", "s"]), pgo("E"),
         pgo("c", xid=7, commit_lsn=0x300, end_lsn=0x310, commit_ts=TS)],
        [pgo("E"), pgo("c", xid=7, commit_lsn=0x300, end_lsn=0x310, commit_ts=TS)],
        [pgo("c", xid=7, commit_lsn=0x300, end_lsn=0x310, commit_ts=TS)],
    ],
    "spock": [
        [sp5("I", relid=0x10, new=["2", "y"]), sp5("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
        [_R5, sp5("I", relid=0x10, new=["2", "y"]), sp5("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
        [sp5("B", final_lsn=0x200, commit_ts=TS, xid=6), _R5, sp5("I", relid=0x10, new=["3", "z"]),
         sp5("C", commit_lsn=0x200, end_lsn=0x210, commit_ts=TS)],
        [*SP5_START, sp5("B", final_lsn=0x200, commit_ts=TS, xid=6), _R5, sp5("I", relid=0x10, new=["3", "z"]),
         sp5("C", commit_lsn=0x200, end_lsn=0x210, commit_ts=TS)],
        [_v4("R", relid=0x10, namespace="public", name="t", columns=REL_COLS), _v4("I", relid=0x10, new=["2", "y"]),
         _v4("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
    ],
    "pglogical": [
        [pgl("I", relid=0x10, new=["2", "y"]), pgl("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
        [_PGL_R, pgl("I", relid=0x10, new=["2", "y"]), pgl("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=TS)],
        [pgl("B", final_lsn=0x200, commit_ts=TS, xid=6), _PGL_R, pgl("I", relid=0x10, new=["3", "z"]),
         pgl("C", commit_lsn=0x200, end_lsn=0x210, commit_ts=TS)],
    ],
}


def _outcome(dec, messages):
    """What a decoder makes of `messages`: its events (as values) or its error (class, text, offset)."""
    try:
        for message in messages:
            dec.feed(message)
        return "events", [e.to_pylist() if hasattr(e, "to_pylist") else repr(e) for e in dec.drain()]
    except ProtocolError as exc:
        return "error", type(exc), str(exc), exc.offset


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_rejected_message_changes_nothing(impl, case):
    """After the error the same decoder goes on exactly like one that never saw the bad message: under every
    continuation it emits the same events (or raises the same error) as a decoder fed only the context."""
    rows_seen = False
    for continuation in CONTINUATIONS[case.protocol]:
        after_error, clean = (impl.Decoder(protocol=case.protocol, **{"types": "raw", **case.kwargs})
                              for _ in range(2))
        for message in case.context:
            after_error.feed(message)
            clean.feed(message)
        with pytest.raises(ProtocolError):
            after_error.feed(case.bad)
        assert _outcome(after_error, []) == _outcome(clean, [])   # the context's own events
        expected = _outcome(clean, continuation)
        assert _outcome(after_error, continuation) == expected
        rows_seen |= expected[0] == "events" and any(isinstance(e, list) and e for e in expected[1])
    assert rows_seen, "no continuation of this context decodes rows: the check above proves too little"
