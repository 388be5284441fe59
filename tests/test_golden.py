"""Golden vectors: the encoder reproduces the hand-written bytes, and the golden streams decode to what they mean."""
from __future__ import annotations

import pytest

from spockwire.errors import ProtocolError, TruncatedMessage
from tests import golden_vectors as G
from tests import normalize as N
from tests import wire_encoder as W

VECTORS = G.all_vectors()


@pytest.mark.parametrize("golden,index,vector", VECTORS, ids=[f"{g.name}:{v.name}" for g, _, v in VECTORS])
def test_encoder_reproduces_golden_bytes(golden, index, vector):
    assert vector.encode().hex(" ") == vector.data.hex(" ")


def test_golden_streams_cover_every_message_type():
    assert G.wire_types() == {
        "pglogical": set("SBORIUDC"),
        "spock5": set("SBOLRIUDTMC"),
        "spock4": set("BOLRIC") | {"S"},
        "pgoutput": set("BCOYRIUDTMSEcAbPKrp"),
    }


def test_every_tuple_kind_is_covered():
    payloads = {g.protocol: b"" for g in G.GOLDEN}
    for g, _, v in VECTORS:
        payloads[g.protocol] += v.data
    for kind in b"nutbi":
        assert bytes([kind]) in payloads["pglogical"]
    for kind in b"nutb":
        assert bytes([kind]) in payloads["pgoutput"]


def test_frames_layout():
    body = W.frames([(0x10, b"ab"), (0x0102030405060708, b"")])
    assert body == bytes.fromhex("00000002 0000000000000010 6162 00000000 0102030405060708".replace(" ", ""))


def _decode(impl, golden, *, drain_each=True):
    dec = impl.Decoder(protocol=golden.protocol, **{"types": "raw", **golden.decoder_kwargs})
    assert dec.committed_lsn == 0
    events, trace = [], []
    for lsn, vector in enumerate(golden.vectors, start=1):
        dec.feed(vector.data, lsn * 0x10)
        trace.append(dec.committed_lsn)
        if drain_each:
            events.extend(dec.drain())
    events.extend(dec.drain())
    return dec, events, trace


def _check_result(dec, events, golden):
    N.check_ordering(events)
    # a batch's column is binary when any value in it was not text, so compare values as bytes, then the types
    assert N.values_as_bytes(N.changes(events)) == N.values_as_bytes(golden.changes)
    N.check_text_columns(events, golden.changes)
    for event in events:
        if hasattr(event, "to_arrow"):
            N.check_batch_schema(event)
    assert N.nontransactional(events) == golden.nontransactional
    assert {relid: N.relation_data(rel) for relid, rel in dec.relations.items()} == golden.relations
    assert dict(dec.startup_params) == golden.startup_params


@pytest.mark.parametrize("golden", G.GOLDEN, ids=[g.name for g in G.GOLDEN])
def test_golden_stream_decodes(impl, golden):
    dec, events, trace = _decode(impl, golden)
    assert trace == golden.committed_lsn
    _check_result(dec, events, golden)


@pytest.mark.parametrize("golden", G.GOLDEN, ids=[g.name for g in G.GOLDEN])
def test_golden_stream_decodes_from_frames(impl, golden):
    body = W.frames((0x1000 + i, v.data) for i, v in enumerate(golden.vectors))
    dec = impl.Decoder(protocol=golden.protocol, **{"types": "raw", **golden.decoder_kwargs})
    assert dec.feed_frames(body) == len(body)
    assert dec.committed_lsn == golden.committed_lsn[-1]
    _check_result(dec, dec.drain(), golden)


@pytest.mark.parametrize("golden", G.GOLDEN, ids=[g.name for g in G.GOLDEN])
def test_golden_stream_drained_once_gives_the_same_changes(impl, golden):
    dec, events, _ = _decode(impl, golden, drain_each=False)
    _check_result(dec, events, golden)


def test_spock_stream_without_startup_needs_a_version(impl):
    dec = impl.Decoder(protocol="spock", types="raw")
    with pytest.raises(ProtocolError) as info:
        dec.feed(G.SPOCK4_VECTORS[0].data)
    assert info.value.offset == 0
    assert not isinstance(info.value, TruncatedMessage)
