"""The binary COPY framing (CopyBinaryDecoder): rows cut anywhere, malformed data refused the same way by both twins.

The values themselves go through the stream decoder's kernels; tests/test_snapshot_read.py compares whole tables
read from a server with the stream's decode of the same rows.
"""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from spockwire.errors import ProtocolError, TruncatedMessage
from spockwire.model import Column, Relation
from tests.conftest import load_impl

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
NUMERIC_12_2 = ((12 << 16) | 2) + 4

REL = Relation(1, "public", "t", (Column("id", 20, -1, True), Column("name", 25, -1, False),
                                  Column("amount", 1700, NUMERIC_12_2, False), Column("flag", 16, -1, False)), None, 1)


def header(flags: int = 0, extension: bytes = b"") -> bytes:
    return SIGNATURE + struct.pack(">ii", flags, len(extension)) + extension


def row(*fields: bytes | None) -> bytes:
    out = struct.pack(">h", len(fields))
    for f in fields:
        out += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return out


def numeric(ndigits_weight_sign_dscale: tuple[int, int, int, int], *digits: int) -> bytes:
    return struct.pack(">hhHh", *ndigits_weight_sign_dscale) + b"".join(struct.pack(">h", d) for d in digits)


TRAILER = struct.pack(">h", -1)
ROWS = [
    row(struct.pack(">q", 1), "één".encode(), numeric((2, 0, 0, 2), 12, 3400), b"\x01"),
    row(struct.pack(">q", -2), b"", numeric((0, 0, 0, 2)), b"\x00"),
    row(None, None, None, None),
    row(struct.pack(">q", 2 ** 63 - 1), b"x" * 300, numeric((1, 0, 0x4000, 0), 7), None),
]
DATA = header(extension=b"ext!") + b"".join(ROWS) + TRAILER
EXPECTED = {
    "id": [1, -2, None, 2 ** 63 - 1],
    "name": ["één", "", None, "x" * 300],
    "amount": ["12.34", "0.00", None, "-7.00"],
    "flag": [True, False, None, None],
}


def decode(impl, data: bytes, cut: int | None = None, **options) -> pa.Table:
    dec = impl.CopyBinaryDecoder(REL, **options)
    batches = []
    if cut is None:
        dec.feed(data)
    else:
        for i in range(0, len(data), cut):
            dec.feed(memoryview(data)[i:i + cut])
            batches += dec.drain()
    batches += dec.drain() + dec.finish()
    return pa.Table.from_batches(batches)


def failure(impl, data: bytes, cut: int | None = None, **options) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(impl, data, cut, **options)
    return info.value


@pytest.mark.parametrize("name", ["c", "python"])
@pytest.mark.parametrize("cut", [None, 1, 2, 3, 7, 19, 64])
def test_rows_cut_anywhere_decode_the_same(name, cut) -> None:
    table = decode(load_impl(name), DATA, cut, batch_rows=3)
    assert table.schema.types == [pa.int64(), pa.string(), pa.decimal128(12, 2), pa.bool_()]
    got = table.to_pydict()
    got["amount"] = [None if v is None else str(v) for v in got["amount"]]
    assert got == EXPECTED


def test_batches_are_bounded_by_rows_and_bytes() -> None:
    for name in ("c", "python"):
        impl = load_impl(name)
        dec = impl.CopyBinaryDecoder(REL, batch_rows=2)
        dec.feed(DATA)
        assert [b.num_rows for b in dec.drain() + dec.finish()] == [2, 2]
        # a batch closes after the row that takes its value bytes to batch_bytes: rows 1-2 hold 43, row 4 alone 318
        dec = impl.CopyBinaryDecoder(REL, batch_bytes=40)
        dec.feed(DATA)
        assert [b.num_rows for b in dec.drain() + dec.finish()] == [2, 2]


def test_an_empty_copy_has_no_batch() -> None:
    for name in ("c", "python"):
        dec = load_impl(name).CopyBinaryDecoder(REL)
        dec.feed(header() + TRAILER)
        assert dec.done and dec.drain() == [] and dec.finish() == []


def test_raw_columns_are_binary() -> None:
    for name in ("c", "python"):
        table = decode(load_impl(name), DATA, types="raw")
        assert table.column("id").type == pa.binary()
        assert table.column("id")[0].as_py() == struct.pack(">q", 1)


def test_unrepresentable_value_switches_the_column_to_text() -> None:
    nan = numeric((0, 0, 0xC000, 0))
    data = header() + ROWS[0] + row(struct.pack(">q", 5), b"n", nan, b"\x01") + ROWS[1] + TRAILER
    for name in ("c", "python"):
        impl = load_impl(name)
        dec = impl.CopyBinaryDecoder(REL)
        dec.feed(data)
        batches = dec.drain() + dec.finish()
        assert [b.num_rows for b in batches] == [1, 2]
        assert batches[0].schema.field("amount").type == pa.decimal128(12, 2)
        assert batches[1].schema.field("amount").type == pa.string()
        assert batches[1].column(2).to_pylist() == ["NaN", "0.00"]
        err = failure(impl, data, on_unrepresentable="error")
        assert err.offset == len(header()) + len(ROWS[0]) + 2 + 12 + 5 + 4 and err.column == 2


# (what is broken, the bytes) -> both twins raise the same class, text and offset, whatever the cuts
MALFORMED = {
    "signature": b"PGCOPY\n\xff\r\n\x01" + DATA[11:],
    "oids flag": header(flags=1 << 16) + TRAILER,
    "critical flag": header(flags=1) + TRAILER,
    "negative extension": SIGNATURE + struct.pack(">ii", 0, -5) + TRAILER,
    "field count": header() + row(struct.pack(">q", 1)) + TRAILER,
    "negative length": header() + struct.pack(">hi", 4, -7) + TRAILER,
    "bad int8": header() + row(struct.pack(">i", 1), b"", None, None) + TRAILER,
    "bad bool": header() + row(None, None, None, b"\x02") + TRAILER,
    "bad utf8": header() + row(None, b"\xff\xfe", None, None) + TRAILER,
    "bad numeric": header() + row(None, None, b"\x00\x01", None) + TRAILER,
    "after trailer": DATA + b"\x00",
    "no trailer": header() + ROWS[0],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_copy_data_same_error_in_both_twins(case) -> None:
    data = MALFORMED[case]
    c, py = load_impl("c"), load_impl("python")
    reference = failure(c, data)
    assert "COPY data at byte" in str(reference)
    for impl in (c, py):
        for cut in (None, 1, 5, 16):
            err = failure(impl, data, cut)
            assert (type(err), str(err), err.offset, err.column) == \
                   (type(reference), str(reference), reference.offset, reference.column), (impl, cut)


def test_every_prefix_is_truncated_in_both_twins() -> None:
    c, py = load_impl("c"), load_impl("python")
    for n in range(len(DATA) - 1):
        errors = [failure(impl, DATA[:n]) for impl in (c, py)]
        assert all(isinstance(e, TruncatedMessage) for e in errors), n
        assert len({(str(e), e.offset, e.needed, e.remaining) for e in errors}) == 1, (n, errors)
        assert errors[0].offset <= n


def test_a_length_past_the_end_allocates_nothing() -> None:
    data = header() + struct.pack(">hi", 4, 0x7FFFFFF0)
    for name in ("c", "python"):
        err = failure(load_impl(name), data)
        assert isinstance(err, TruncatedMessage) and err.needed == 0x7FFFFFF0 and err.remaining == 0


def test_fuzz_harness_copy_seeds_agree(tmp_path) -> None:
    """The fuzz harness's "copy" entry on every COPY seed, in-process (the sanitizer run is test_fuzz_short.py):
    both implementations give the same rows, schemas, errors and offsets, whatever size the pieces fed."""
    import importlib.util
    import sys
    from pathlib import Path

    fuzz = Path(__file__).resolve().parents[1] / "fuzz"
    sys.path.insert(0, str(fuzz))
    try:
        spec = importlib.util.spec_from_file_location("fuzz_decoder", fuzz / "fuzz_decoder.py")
        harness = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_decoder"] = harness
        spec.loader.exec_module(harness)
        seeds_spec = importlib.util.spec_from_file_location("fuzz_seeds", fuzz / "seeds.py")
        seeds = importlib.util.module_from_spec(seeds_spec)
        seeds_spec.loader.exec_module(seeds)
        corpus = seeds.Corpus(tmp_path)
        seeds.copy_seeds(corpus)
        files = sorted(tmp_path.iterdir())
        assert len(files) >= 20
        outcomes = set()
        for path in files:
            data = path.read_bytes()
            harness.check(data)          # raises a Finding when the implementations disagree
            case = harness.parse_input(data)
            assert case.entry == "copy"
            result = harness.run(load_impl("python"), case, guard=False)
            outcomes.add("error" if result["error"] else "rows")
        assert outcomes == {"error", "rows"}
    finally:
        sys.path.remove(str(fuzz))
        sys.modules.pop("fuzz_decoder", None)
