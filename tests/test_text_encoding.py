"""pglogical/spock streams of a non-UTF8 database: text values and names arrive in the encoding the startup message
names, and both decoders hand them out as UTF-8 (LATIN1 through the C decoder's own fast path, other encodings
through Python's codecs); text that is not valid in that encoding is the same error in both."""
from __future__ import annotations

import struct

import pytest

from spockwire.errors import ProtocolError
from spockwire.wire.encodings import text_codec
from tests.conftest import load_impl
from tests.wire_encoder import Col, Raw, frames, pglogical

IMPLS = ["c", "python"]


def _text_datum(raw: bytes) -> Raw:
    data = raw + b"\0"
    return Raw(b"t", struct.pack(">I", len(data)) + data)


def _stream(encoding: str, namespace: bytes, relname: bytes, colname: bytes, values: list[bytes]) -> bytes:
    msgs = [pglogical("S", params={"max_proto_version": "1", "min_proto_version": "1",
                                   "database_encoding": encoding, "encoding": encoding}),
            pglogical("B", final_lsn=0x100, commit_ts=0, xid=7),
            pglogical("R", relid=1, namespace=namespace, name=relname,
                      columns=[Col("id", key=True), Col(colname)])]
    for i, raw in enumerate(values):
        msgs.append(pglogical("I", relid=1, new=[str(i), _text_datum(raw)]))
    msgs.append(pglogical("C", commit_lsn=0x100, end_lsn=0x108, commit_ts=0))
    return frames([(0x100 + i, m) for i, m in enumerate(msgs)])


@pytest.mark.parametrize("impl_name", IMPLS)
@pytest.mark.parametrize("encoding, samples", [
    ("LATIN1", ["café crème", "ÿ ß Ø ½ «»", "plain", "", "\x80\x9f control range"]),
    ("WIN1251", ["Привет, мир", "ёЁ №", "ascii"]),
    ("EUC_JP", ["日本語のテキスト", "カタカナ", "x"]),
])
@pytest.mark.parametrize("types", ["typed", "raw"])
def test_text_and_names_become_utf8(impl_name, encoding, samples, types):
    codec = text_codec(encoding)
    dec = load_impl(impl_name).Decoder("pglogical", types=types)
    nsp, rel, col = "schéma", "tâble", "nämé"
    if encoding == "WIN1251":
        nsp, rel, col = "схема", "таблица", "имя"
    elif encoding == "EUC_JP":
        nsp, rel, col = "スキーマ", "表", "名前"
    data = _stream(encoding, nsp.encode(codec), rel.encode(codec), col.encode(codec),
                   [s.encode(codec) for s in samples])
    dec.feed_frames(data)
    (batch,) = dec.drain()
    assert (batch.relation.namespace, batch.relation.name) == (nsp, rel)
    assert batch.relation.column_names[-1] == col
    out = batch.to_arrow()
    assert out.column(col).to_pylist() == samples


@pytest.mark.parametrize("impl_name", IMPLS)
def test_utf8_stream_is_unchanged(impl_name):
    dec = load_impl(impl_name).Decoder("pglogical")
    dec.feed_frames(_stream("UTF8", b"public", "tâble".encode(), b"v", ["café".encode()]))
    (batch,) = dec.drain()
    assert batch.relation.name == "tâble"
    assert batch.to_arrow().column("v").to_pylist() == ["café"]


def test_invalid_text_is_the_same_error_in_both():
    bad = b"ok \x8e\xff"  # not a valid EUC_JP sequence
    errors = []
    for name in IMPLS:
        dec = load_impl(name).Decoder("pglogical")
        with pytest.raises(ProtocolError) as info:
            dec.feed_frames(_stream("EUC_JP", b"public", b"t", b"v", [bad]))
        errors.append((str(info.value), info.value.offset, info.value.column))
    assert errors[0] == errors[1]
    assert "text value is not valid EUCJP" in errors[0][0] and 'column 1 ("v")' in errors[0][0]


def test_unknown_encoding_is_refused_at_the_startup_message():
    errors = []
    for name in IMPLS:
        dec = load_impl(name).Decoder("pglogical")
        with pytest.raises(ProtocolError) as info:
            dec.feed_frames(_stream("MULE_INTERNAL", b"public", b"t", b"v", [b"x"]))
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "MULE_INTERNAL" in errors[0]
