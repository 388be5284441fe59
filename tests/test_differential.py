"""Differential tests: mutated real captures and golden streams through both implementations.

Streams: transactions of the real captures (tests/data/*.spwf, each with the startup and relation messages before
it), the golden streams (tests/golden_vectors.py) and synthetic transactions over relations that cover every typed
value kind (fuzz/seeds.py); and the internal datums of jsonb, tsvector, tsquery, jsonpath and aclitem made by real
servers (tests/data/internal_layouts.json), one per insert. Hypothesis mutates them -- bytes flipped, set to boundary values, inserted, deleted,
cut; 16- and 32-bit fields set to 0, 1, 0x7FFF..., 0xFFFF...; records dropped, duplicated, swapped or spliced;
frame headers damaged -- and feeds the result to both implementations in typed and raw modes, message by message
(`feed`) or as frame records (`feed_frames`). They must give the same events (Arrow schemas and values, truncates,
messages), relations, committed_lsn, startup parameters and bytes consumed, or the same exception class with the
same text, offset and other attributes; anything but a ProtocolError fails.

The comparison is fuzz/fuzz_decoder.py's, the one the coverage-guided fuzzer uses.
"""
from __future__ import annotations

import os

import struct
import sys
from functools import lru_cache
from pathlib import Path

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

# the source tree (fuzz/ lives there): the test command sets SPOCKWIRE_SOURCE_DIR when it runs the suite against
# the installed wheel from a copy of tests/
ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT / "fuzz"))
import fuzz_decoder as F  # noqa: E402
import seeds as S  # noqa: E402

from tests import golden_vectors as G  # noqa: E402
from tests import wire_encoder as W  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
INTERESTING_BYTES = [0, 1, 0x7F, 0x80, 0xFF, ord("n"), ord("u"), ord("t"), ord("b"), ord("i"), ord("K"), ord("O"),
                     ord("N"), ord("T"), ord("B"), ord("C"), ord("S"), ord("E")]
INTERESTING_U16 = [0, 1, 2, 0x7FFF, 0x8000, 0xFFFF]
INTERESTING_U32 = [0, 1, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]


class Stream:
    """A valid stream to mutate: the protocol, the decoder settings it needs, and its records (lsn, payload)."""

    def __init__(self, name, protocol, records, spock_variant=0):
        self.name, self.protocol, self.records, self.spock_variant = name, protocol, records, spock_variant

    def __repr__(self):
        return f"Stream({self.name}, {len(self.records)} records)"


@lru_cache(maxsize=None)
def capture_streams() -> list:
    out = []
    for path in sorted(S.DATA.glob("*.spwf")):
        windows = list(S.capture_windows(path))
        step = max(1, len(windows) // 12)      # at most about a dozen transactions of each capture
        for k, (protocol, records) in enumerate(windows[::step]):
            if sum(len(p) for _, p in records) <= 24_000:
                out.append(Stream(f"{path.stem}#{k}", protocol, records))
    return out


@lru_cache(maxsize=None)
def golden_streams() -> list:
    out = []
    for g in G.GOLDEN:
        variant = 0
        if g.protocol == "spock":
            variant = 1 if g.decoder_kwargs.get("proto_version") == 4 else 2
        out.append(Stream(g.name, g.protocol, [(0x1000 + 8 * i, v.data) for i, v in enumerate(g.vectors)], variant))
    return out


@lru_cache(maxsize=None)
def synthetic_streams() -> list:
    """Startup, the three preamble relations and one transaction with every message the seeds know."""
    out = []
    for protocol, variant, version in S.variants():
        case = F.Case(protocol, {}, "message", version, F.parse_input(F.make_input(
            protocol, "message", b"", spock_variant=variant)).startup, 0, False, b"")
        pre, post = F.around(case)
        body = [m for _tag, m in S.single_messages(protocol, version, None)]
        messages = pre + body + post
        out.append(Stream(f"synthetic-{protocol}{version or ''}", protocol,
                          [(0x2000 + 8 * i, m) for i, m in enumerate(messages)], variant))
    return out


# -------------------------------------------------------------------------------------------------------------
# mutations

def _mutate_bytes(data, buf: bytearray) -> None:
    how = data.draw(st.sampled_from(["flip", "set", "u16", "u32", "insert", "delete", "cut", "repeat"]))
    if not buf:
        buf.extend(data.draw(st.binary(min_size=1, max_size=4)))
        return
    at = data.draw(st.integers(0, len(buf) - 1))
    if how == "flip":
        buf[at] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "set":
        buf[at] = data.draw(st.sampled_from(INTERESTING_BYTES))
    elif how == "u16" and at + 2 <= len(buf):
        buf[at:at + 2] = struct.pack(">H", data.draw(st.sampled_from(INTERESTING_U16)))
    elif how == "u32" and at + 4 <= len(buf):
        buf[at:at + 4] = struct.pack(">I", data.draw(st.sampled_from(INTERESTING_U32)))
    elif how == "insert":
        buf[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    elif how == "delete":
        del buf[at:at + data.draw(st.integers(1, 4))]
    elif how == "cut":
        del buf[at:]
    elif how == "repeat":
        end = min(len(buf), at + data.draw(st.integers(1, 16)))
        buf[at:at] = buf[at:end]


def mutate_records(data, records: list) -> list:
    records = list(records)
    if not records:
        return records
    i = data.draw(st.integers(0, len(records) - 1))
    how = data.draw(st.sampled_from(["bytes", "bytes", "bytes", "bytes", "drop", "duplicate", "swap", "splice"]))
    lsn, payload = records[i]
    if how == "bytes":
        buf = bytearray(payload)
        _mutate_bytes(data, buf)
        records[i] = (lsn, bytes(buf))
    elif how == "drop":
        del records[i]
    elif how == "duplicate":
        records.insert(i, records[i])
    elif how == "swap" and i + 1 < len(records):
        records[i], records[i + 1] = records[i + 1], records[i]
    elif how == "splice":
        other = records[data.draw(st.integers(0, len(records) - 1))][1]
        cut_at = data.draw(st.integers(0, len(payload)))
        from_at = data.draw(st.integers(0, len(other)))
        records[i] = (lsn, payload[:cut_at] + other[from_at:])
    return records


def build_input(data, stream: Stream, typed: bool) -> bytes:
    records = stream.records
    for _ in range(data.draw(st.integers(1, 4))):
        records = mutate_records(data, records)
    entry = data.draw(st.sampled_from(["messages", "frames", "partial"]))
    if entry == "messages":
        body = F.join_messages([p for _lsn, p in records])
    else:
        buf = bytearray(W.frames(records))
        if data.draw(st.integers(0, 5)) == 0:      # damage the framing itself now and then
            _mutate_bytes(data, buf)
        body = bytes(buf)
    return F.make_input(stream.protocol, entry, body, raw=not typed, numeric_text=data.draw(st.booleans()),
                        spock_variant=stream.spock_variant, batch_rows=data.draw(st.integers(0, 3)),
                        drain_each=data.draw(st.booleans()), views=data.draw(st.booleans()))


def check_same(both_impls, fuzz_input: bytes, in_hypothesis: bool = True) -> None:
    """Both implementations, compared as the fuzzer compares them; a Finding fails with its description."""
    c_impl, py_impl = both_impls
    case = F.parse_input(fuzz_input)
    if in_hypothesis:
        note(f"input (fuzz/fuzz_decoder.py --replay format, hex): {fuzz_input.hex()}")
    c_result = F.run(c_impl, case, guard=False)
    py_result = F.run(py_impl, case, guard=False)
    assert c_result == py_result, F.first_difference(c_result, py_result)


# -------------------------------------------------------------------------------------------------------------
# the tests (about 30 s together)

@settings(max_examples=600, **SETTINGS)
@given(data=st.data(), typed=st.booleans())
def test_mutated_captures_same_in_both(both_impls, data, typed):
    stream = data.draw(st.sampled_from(capture_streams()))
    check_same(both_impls, build_input(data, stream, typed))


@settings(max_examples=600, **SETTINGS)
@given(data=st.data(), typed=st.booleans())
def test_mutated_golden_streams_same_in_both(both_impls, data, typed):
    stream = data.draw(st.sampled_from(golden_streams()))
    check_same(both_impls, build_input(data, stream, typed))


@settings(max_examples=500, **SETTINGS)
@given(data=st.data(), typed=st.booleans())
def test_mutated_typed_values_same_in_both(both_impls, data, typed):
    """Every value kind in text, binary and internal form, mutated."""
    stream = data.draw(st.sampled_from(synthetic_streams()))
    check_same(both_impls, build_input(data, stream, typed))


class _Seeds:
    """A corpus that keeps the seeds fuzz/seeds.py adds to it."""

    def __init__(self) -> None:
        self.inputs: list[bytes] = []

    def add(self, _tag: str, data: bytes) -> None:
        self.inputs.append(data)


@lru_cache(maxsize=None)
def datum_inputs() -> list:
    seeds = _Seeds()
    S.datum_seeds(seeds)
    return seeds.inputs


@settings(max_examples=500, **SETTINGS)
@given(data=st.data())
def test_mutated_internal_layouts_same_in_both(both_impls, data):
    """jsonb, tsvector, tsquery, jsonpath and aclitem datums made by real servers (the fuzzer's "datum" entry),
    mutated, in either byte order, compressed or not, jsonb also kept as text, as plain strings or views."""
    seed = data.draw(st.sampled_from(datum_inputs()))
    body = bytearray(seed[2:])
    _mutate_bytes(data, body)
    options = seed[1] ^ data.draw(st.sampled_from([0, 0, 0x08, 0x10, 0x18])) ^ data.draw(st.sampled_from([0, 0x80]))
    check_same(both_impls, seed[:1] + bytes([options]) + bytes(body))


def test_unmutated_streams_decode_the_same(both_impls):
    """The sources themselves, typed and raw: the baseline the mutations start from."""
    for stream in capture_streams() + golden_streams() + synthetic_streams():
        for typed in (True, False):
            for entry in ("messages", "frames"):
                body = (F.join_messages([p for _l, p in stream.records]) if entry == "messages"
                        else W.frames(stream.records))
                for views in (False, True):
                    check_same(both_impls, F.make_input(stream.protocol, entry, body, raw=not typed,
                                                        spock_variant=stream.spock_variant, views=views),
                               in_hypothesis=False)


# -------------------------------------------------------------------------------------------------------------
# the decoder after a refused message

def _events(dec) -> tuple[list, list]:
    """The drained events as text (repr: NaN equals NaN there): truncates and messages in order, and every row with
    its relation (and version) in (_commit_lsn, _seq) order, whichever batch carried it."""
    others, rows = [], []
    for e in dec.drain():
        if hasattr(e, "to_pylist"):
            rows += [((r["_commit_lsn"], r["_seq"]), repr(e.relation), repr(r)) for r in e.to_pylist()]
        else:
            others.append(repr(e))
    return others, sorted(rows)


@settings(max_examples=300, **SETTINGS)
@given(data=st.data(), typed=st.booleans())
def test_refused_messages_leave_no_trace(impl, data, typed):
    """Mutated streams fed message by message to one decoder that goes on after each refused message: it ends
    exactly where a decoder fed only the messages it accepted ends (the same rows under the same relation
    versions, truncates, messages and committed_lsn), and that second decoder accepts every one of them. So a
    refused message changes nothing, and the decoder keeps decoding valid input correctly after any error."""
    from spockwire.errors import ProtocolError

    stream = data.draw(st.sampled_from(golden_streams() + capture_streams() + synthetic_streams()))
    records = stream.records
    for _ in range(data.draw(st.integers(1, 4))):
        records = mutate_records(data, records)
    case = F.parse_input(F.make_input(stream.protocol, "messages", b"", raw=not typed,
                                      numeric_text=data.draw(st.booleans()), spock_variant=stream.spock_variant))
    going_on, clean = (impl.Decoder(case.protocol, **case.kwargs) for _ in range(2))
    for message in F.setup_messages(case):
        going_on.feed(message)
        clean.feed(message)
    accepted, refused = [], 0
    for _lsn, message in records:
        try:
            going_on.feed(message)
        except ProtocolError:
            refused += 1
            continue
        accepted.append(message)
    note(f"{len(accepted)} messages accepted, {refused} refused")
    for message in accepted:
        clean.feed(message)
    assert _events(going_on) == _events(clean)
    assert going_on.committed_lsn == clean.committed_lsn
