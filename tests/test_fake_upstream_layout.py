"""The scripted Spock upstream writes the same bytes as the test encoder and the golden vectors.

The Spock connection tests (tests/test_connection_spock.py) stream from `spockwire.testing.fake_upstream`; the
decoder tests rest on the golden vectors (written by hand from docs/protocols.md) and on the test encoder, which
tests/test_golden.py checks against them. Here the third encoder is tied to the other two: every kind of message
the scripted upstream can send, in protocol 4 and 5, is compared byte for byte with the test encoder's message
for the same fields, and the golden Spock transactions replayed by a script give the golden vectors' bytes.
"""
from __future__ import annotations

import pytest

from spockwire.testing.fake_upstream import ScriptTransaction, SpockScript
from tests import golden_vectors as G
from tests import wire_encoder as W

ONE, TWO, THREE = (n.to_bytes(8, "big") for n in (1, 2, 3))


def _payloads(frames):
    return [payload for _lsn, payload in frames]


def test_startup_message_matches_encoder_and_golden():
    params = {"max_proto_version": "5", "min_proto_version": "4", "proto_version": "5", "coltypes": "f",
              "spock_version_num": "60000"}
    assert SpockScript.startup_message(params) == W.spock("S", params=params)
    assert SpockScript.startup_message(params) == G.SPOCK5.vectors[0].data


def test_golden_spock4_transaction_replayed_by_a_script():
    script = SpockScript(4)
    kv = script.relation(0x4003, "public", "kv", [("k", 23, True), ("v", 25, False)])
    txn = ScriptTransaction(xid=0x500, begin_lsn=0x3000000, commit_lsn=0x3000100, end_lsn=0x3000120,
                            commit_ts=G.TS1, changes=[("insert", kv, ("42", "x"))], origin=(7, None, 0x5678),
                            insert_lsn=0x3000118)
    golden = [v.data for v in G.SPOCK4_VECTORS]          # B O L R I C, no startup
    assert _payloads(script.encode(txn, set())) == golden


def test_golden_spock5_transactions_replayed_by_a_script():
    """Protocol 5: the bodies after the 8-byte LSN prefix equal the golden vectors; the prefix is the frame's LSN.
    (The golden stream's last message, a sync event outside any transaction, is one the script cannot send.)"""
    script = SpockScript(5)
    orders = script.relation(0x4002, "public", "orders",
                             [("id", 20, True), ("total", 1700, False, 0x000C0006), ("memo", 25, False)])
    first = ScriptTransaction(
        xid=1024, begin_lsn=0x2000010, commit_lsn=0x2000100, end_lsn=0x2000140, commit_ts=G.TS1,
        origin=(2, "n2", 0x1234), last_commit_ts=0x0002A1B2C3D4E000,
        changes=[("insert", orders, (ONE, "12.50", None)),
                 ("update", orders, (TWO, "13.00", SpockScript.UNCHANGED), (ONE, None, None)),
                 ("delete", orders, (TWO, None, None)),
                 ("truncate", [orders], 3),
                 ("message", "Spock", G._SYNC2, 0x2000050)])
    second = ScriptTransaction(xid=1025, begin_lsn=0x2000200, commit_lsn=0x2000300, end_lsn=0x2000340,
                               commit_ts=G.TS3, changes=[("insert", orders, (THREE, None, "hi"))])
    sent: set[int] = set()
    frames = script.encode(first, sent) + script.encode(second, sent)
    golden = [v.data for v in G.SPOCK5.vectors[1:-1]]
    assert len(frames) == len(golden)
    for (lsn, payload), expected in zip(frames, golden):
        assert payload[:8] == lsn.to_bytes(8, "big")
        assert payload[8:] == expected[8:], (chr(expected[8]), payload.hex(), expected.hex())


@pytest.mark.parametrize("proto", [4, 5])
def test_every_message_matches_the_test_encoder(proto):
    """Each message kind of the script, field for field through tests/wire_encoder.py."""
    script = SpockScript(proto)
    items = script.relation(16400, "app", "items", [("id", 23, True), ("name", 25, False), ("n", 1700, False, 655366)])
    other = script.relation(16410, "public", "other", [("k", 25, True)])
    forwarded = ScriptTransaction(
        xid=77, begin_lsn=0x5000000, commit_lsn=0x5000200, end_lsn=0x5000230, commit_ts=123456789,
        origin=(9, "remote", 0xABCDEF), last_commit_ts=42, insert_lsn=0x5000228 if proto == 4 else None,
        changes=[("insert", items, (1, "one", "1.50")),
                 ("insert", items, (b"\x00\x00\x00\x02", None, SpockScript.UNCHANGED)),
                 ("update", items, (1, "uno", SpockScript.UNCHANGED), None),
                 ("update", items, (3, "three", None), (1, None, None)),
                 ("delete", items, (3, None, None)),
                 ("insert", other, ("k1",)),
                 ("truncate", [items, other], 1),
                 ("message", "Spock", b"\x03\x00\x00\x00" + b"\x00" * 68)])
    unnamed = ScriptTransaction(xid=78, begin_lsn=0x6000000, commit_lsn=0x6000100, end_lsn=0x6000110,
                                commit_ts=5, origin=(4, None, 0x10), changes=[("delete", other, ("k1",))])
    local = ScriptTransaction(xid=79, begin_lsn=0x7000000, commit_lsn=0x7000100, end_lsn=0x7000110, commit_ts=6,
                              changes=[("insert", other, (True,))])
    sent: set[int] = set()
    frames = [f for txn in (forwarded, unnamed, local) for f in script.encode(txn, sent)]

    def enc(at, msg_type, **fields):
        return W.spock(msg_type, proto=proto, insert_lsn=at, **fields)

    def cols(rel):
        return [W.Col(name, oid, mod[0] if mod else -1, key) for name, oid, key, *mod in rel.columns]

    def rel_msg(lsn, rel):
        return enc(lsn, "R", relid=rel.relid, namespace=rel.namespace, name=rel.name, columns=cols(rel))

    U = W.UNCHANGED
    f = forwarded
    lsn = [f.begin_lsn + 0x20 * (i + 1) for i in range(len(f.changes))]
    origin = (dict(origin_lsn=0xABCDEF, origin_id=9, name="remote") if proto == 5
              else dict(origin_lsn=0xABCDEF, origin_id=9))
    commit_tail = {"trailing_insert_lsn": 0x5000228} if proto == 4 else {}
    expected = [
        enc(f.begin_lsn, "B", final_lsn=f.commit_lsn, commit_ts=f.commit_ts, xid=77),
        enc(f.begin_lsn, "O", **origin),
        enc(f.begin_lsn, "L", last_commit_ts=42),
        rel_msg(lsn[0], items),
        enc(lsn[0], "I", relid=16400, new=["1", "one", "1.50"]),
        enc(lsn[1], "I", relid=16400, new=[b"\x00\x00\x00\x02", None, U]),
        enc(lsn[2], "U", relid=16400, new=["1", "uno", U]),
        enc(lsn[3], "U", relid=16400, old_kind="K", old=["1", None, None], new=["3", "three", None]),
        enc(lsn[4], "D", relid=16400, old_kind="K", old=["3", None, None]),
        rel_msg(lsn[5], other),
        enc(lsn[5], "I", relid=16410, new=["k1"]),
        enc(lsn[6], "T", flags=1, relids=[16400, 16410]),
        enc(lsn[7], "M", xid=77, lsn=lsn[7], content=b"\x03\x00\x00\x00" + b"\x00" * 68),
        enc(f.commit_lsn, "C", commit_lsn=f.commit_lsn, end_lsn=f.end_lsn, commit_ts=f.commit_ts, **commit_tail),
        # a forwarded origin whose node has no name: flags 0, no name, in both versions
        enc(unnamed.begin_lsn, "B", final_lsn=unnamed.commit_lsn, commit_ts=5, xid=78),
        enc(unnamed.begin_lsn, "O", origin_lsn=0x10, origin_id=4),
        enc(unnamed.begin_lsn, "L", last_commit_ts=0),
        enc(unnamed.begin_lsn + 0x20, "D", relid=16410, old_kind="K", old=["k1"]),
        enc(unnamed.commit_lsn, "C", commit_lsn=unnamed.commit_lsn, end_lsn=unnamed.end_lsn, commit_ts=5,
            **({"trailing_insert_lsn": unnamed.end_lsn} if proto == 4 else {})),
        # a local transaction: the local node (id 1, "n1" under protocol 5)
        enc(local.begin_lsn, "B", final_lsn=local.commit_lsn, commit_ts=6, xid=79),
        enc(local.begin_lsn, "O", **(dict(origin_lsn=0, origin_id=1, name="n1") if proto == 5
                                     else dict(origin_lsn=0, origin_id=1))),
        enc(local.begin_lsn, "L", last_commit_ts=0),
        enc(local.begin_lsn + 0x20, "I", relid=16410, new=["t"]),
        enc(local.commit_lsn, "C", commit_lsn=local.commit_lsn, end_lsn=local.end_lsn, commit_ts=6,
            **({"trailing_insert_lsn": local.end_lsn} if proto == 4 else {})),
    ]
    got = _payloads(frames)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, (i, g.hex(), e.hex())
