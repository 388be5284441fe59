"""Every proper prefix of every golden message raises TruncatedMessage, identically in both implementations."""
from __future__ import annotations

import pytest

from spockwire.errors import ProtocolError, TruncatedMessage
from tests import golden_vectors as G

CASES = [(g, i, v) for g in G.GOLDEN for i, v in enumerate(g.vectors)]


def _type_offset(golden, vector) -> int:
    """Where the type byte sits: after the 8-byte remote_insert_lsn in spock v5 (but never in 'S')."""
    if golden.protocol == "spock" and golden.startup_params.get("proto_version") == "5" and vector.data[:1] != b"S":
        return 8
    return 0


def _feed_prefix(impl, golden, index, prefix):
    dec = impl.Decoder(protocol=golden.protocol, **{"types": "raw", **golden.decoder_kwargs})
    for earlier in golden.vectors[:index]:
        dec.feed(earlier.data)
    try:
        dec.feed(prefix)
    except ProtocolError as exc:
        return exc
    return None


def _describe(exc):
    if exc is None:
        return None
    return (type(exc), str(exc), exc.msg_type, exc.offset, exc.needed, exc.remaining, exc.column)


@pytest.mark.parametrize("golden,index,vector", CASES, ids=[f"{g.name}:{i}:{v.name}" for g, i, v in CASES])
def test_every_prefix_is_truncated(both_impls, golden, index, vector):
    c_impl, py_impl = both_impls
    type_at = _type_offset(golden, vector)
    msg_type = chr(vector.data[type_at])
    for size in range(len(vector.data)):
        prefix = vector.data[:size]
        c_exc = _feed_prefix(c_impl, golden, index, prefix)
        py_exc = _feed_prefix(py_impl, golden, index, prefix)
        assert _describe(c_exc) == _describe(py_exc), f"prefix of {size} bytes: C and Python disagree"
        if size in vector.complete_prefixes:
            assert py_exc is None, f"prefix of {size} bytes is a complete message: {py_exc}"
            continue
        assert isinstance(py_exc, TruncatedMessage), f"prefix of {size} bytes: {py_exc!r}"
        exc = py_exc
        assert exc.offset is not None and 0 <= exc.offset <= size, (size, str(exc))
        assert exc.remaining == size - exc.offset, (size, str(exc))
        assert exc.needed > exc.remaining, (size, str(exc))
        assert exc.msg_type == (msg_type if size > type_at else None), (size, str(exc))
        assert str(exc).startswith("truncated "), str(exc)


def _events(dec):
    return [e.to_pylist() if hasattr(e, "to_pylist") else repr(e) for e in dec.drain()]


@pytest.mark.parametrize("golden,index,vector", CASES, ids=[f"{g.name}:{i}:{v.name}" for g, i, v in CASES])
def test_a_truncated_message_leaves_the_decoder_as_it_was(impl, golden, index, vector):
    """After a prefix is refused, the same decoder takes the whole message and the rest of the golden stream and
    emits exactly what a decoder that never saw the prefix emits."""
    clean = impl.Decoder(protocol=golden.protocol, **{"types": "raw", **golden.decoder_kwargs})
    for message in golden.vectors:
        clean.feed(message.data)
    expected = _events(clean)
    sizes = [size for size in range(len(vector.data)) if size not in vector.complete_prefixes]
    for size in sizes[:: max(1, len(sizes) // 8)] + sizes[-1:]:   # a spread of cuts, the longest one included
        dec = impl.Decoder(protocol=golden.protocol, **{"types": "raw", **golden.decoder_kwargs})
        for earlier in golden.vectors[:index]:
            dec.feed(earlier.data)
        with pytest.raises(TruncatedMessage):
            dec.feed(vector.data[:size])
        for message in golden.vectors[index:]:
            dec.feed(message.data)
        assert _events(dec) == expected, f"after a prefix of {size} bytes"
        assert dec.committed_lsn == clean.committed_lsn
