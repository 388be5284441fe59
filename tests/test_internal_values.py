"""Internal-format ('i') datums built by hand (tests/internal_datums.py, written from the formats, not from the
decoders): varlena headers in both byte orders, pglz and LZ4 data, numeric's short, long and special forms,
interval, timetz and the types kept as text; and every way a datum can be refused -- both implementations give the
same error class, text, byte offset and column. Also the options and the startup check of binary="internal"."""
from __future__ import annotations

import random
import struct
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests.internal_datums as D
from spockwire.connection.errors import StartupRejected
from spockwire.connection.options import check_startup, native_options
from spockwire.errors import ProtocolError
from tests.conftest import load_impl
from tests.wire_encoder import Internal

TEXT = ("spock internal datum " * 40).encode()
ORDERS = [False, True]   # little-endian, big-endian server


_both = D.decode_both
_error = D.error_both


# ------------------------------------------------------------------------------------------------------------------
# values

@pytest.mark.parametrize("big", ORDERS)
def test_varlena_text_in_every_header_form(big: bool) -> None:
    values = [Internal(D.varlena(b"", big)), Internal(D.varlena("ünï ✓".encode(), big)),
              Internal(D.varlena(b"x" * 126, big)), Internal(D.varlena(b"abc", big, short=False)),
              Internal(D.varlena(TEXT, big)),
              Internal(D.compressed(D.pglz(TEXT), len(TEXT), 0, big)),
              Internal(D.compressed(D.lz4(TEXT), len(TEXT), 1, big))]
    assert _both(values, "text", big) == ["", "ünï ✓", "x" * 126, "abc"] + [TEXT.decode()] * 3


@pytest.mark.parametrize("big", ORDERS)
def test_compressed_data_of_every_shape(big: bool) -> None:
    """Overlapping matches, long lengths (pglz's third byte, LZ4's 255-continued lengths), literals only."""
    rng = random.Random(7)
    samples = [b"a" * 5000, bytes(rng.randrange(256) for _ in range(600)), b"ab" * 3000 + b"tail",
               bytes(rng.choice(b"xyz") for _ in range(4000)), b"0123456789" * 500, b"q"]
    for data in samples:
        for method, compress in ((0, D.pglz), (1, D.lz4)):
            datum = D.compressed(compress(data), len(data), method, big)
            assert _both([Internal(datum)], "bytea", big) == [data]


@pytest.mark.parametrize("big", ORDERS)
def test_numeric_short_long_and_special(big: bool) -> None:
    values = [Internal(D.varlena(D.numeric_short(0, True, 2, [12, 3400], big), big)),           # -12.34
              Internal(D.varlena(D.numeric_short(-1, False, 6, [12, 3400], big), big)),       # 0.001234
              Internal(D.varlena(D.numeric_long((2, 40, 0, 0), [1, 2], big), big)),             # 1 0002 * 10^156
              Internal(D.varlena(D.numeric_long((1, 0, 0x4000, 3), [7], big), big)),             # -7.000
              Internal(D.varlena(struct.pack(">H" if big else "<H", 0xC000), big)),               # NaN
              Internal(D.varlena(struct.pack(">H" if big else "<H", 0xF000), big))]               # -Infinity
    assert _both(values, "numeric", big) == ["-12.34", "0.001234", "1" + "0002" + "0" * 156, "-7.000", "NaN",
                                             "-Infinity"]
    assert _both(values[:2] + values[3:4], "numeric(12,6)", big) == \
        [Decimal("-12.340000"), Decimal("0.001234"), Decimal("-7.000000")]


NUMERIC_TYPES = {"numeric(12,2)": (12, 2), "numeric(38,0)": (38, 0), "numeric(20,10)": (20, 10),
                 "numeric(38,18)": (38, 18), "numeric(38,30)": (38, 30)}


@settings(max_examples=300, deadline=None)
@given(type_name=st.sampled_from(sorted(NUMERIC_TYPES)), negative=st.booleans(),
       digits=st.lists(st.integers(0, 9999), max_size=10), weight=st.integers(-12, 12), dscale=st.integers(0, 40))
def test_numeric_into_decimal_columns_is_exact(type_name: str, negative: bool, digits: list[int], weight: int,
                                               dscale: int) -> None:
    """Every numeric of up to ten base-10000 digits at any weight, into decimal128 columns of several precisions and
    scales: the exact value when it has no digits below the scale and fits the precision, else the same error from
    both implementations."""
    precision, scale = NUMERIC_TYPES[type_name]
    with localcontext() as exact:
        exact.prec = 200
        value = sum((Decimal(d) * Decimal(10000) ** (weight - k) for k, d in enumerate(digits)), Decimal(0))
        value = -value if negative else value
        unscaled = value.scaleb(scale)
        fits = unscaled == unscaled.to_integral_value() and abs(unscaled) < Decimal(10) ** precision
        expected = value.quantize(Decimal(1).scaleb(-scale))
    datum = Internal(D.varlena(D.numeric_long((len(digits), weight, 0x4000 if negative else 0, dscale), digits)))
    if fits:
        assert _both([datum], type_name) == [expected]
    else:
        assert type_name in str(_error([datum], type_name))


@pytest.mark.parametrize("big", ORDERS)
def test_fixed_length_datums(big: bool) -> None:
    e = ">" if big else "<"
    interval = struct.pack(e + "qii", 3_723_000_001, -2, 14)
    assert _both([Internal(interval)], "interval", big) == [(14, -2, 3_723_000_001_000)]
    timetz = struct.pack(e + "qi", 45_296_500_000, -19_800)
    assert _both([Internal(timetz)], "timetz", big) == ["12:34:56.5+05:30"]
    tid = struct.pack(e + "HHH", 1, 2, 3)
    assert _both([Internal(tid)], "tid", big) == ["(65538,3)"]
    assert _both([Internal(bytes.fromhex("0800 2b01 0203"))], "macaddr", big) == ["08:00:2b:01:02:03"]
    assert _both([Internal(struct.pack(e + "q", 123456))], "money", big) == ["$1,234.56"]


@pytest.mark.parametrize("big", ORDERS)
def test_varlena_types_kept_as_text(big: bool) -> None:
    e = ">" if big else "<"
    inet = D.varlena(bytes((2, 24, 192, 168, 1, 0)), big)
    assert _both([Internal(inet)], "inet", big) == ["192.168.1.0/24"]
    assert _both([Internal(inet)], "cidr", big) == ["192.168.1.0/24"]
    bits = D.varlena(struct.pack(e + "i", 10) + bytes((0b10110000, 0b01000000)), big)
    assert _both([Internal(bits)], "varbit", big) == ["1011000001"]
    path = D.varlena(struct.pack(e + "iii", 2, 1, 0) + struct.pack(e + "dddd", 1.5, 2, -3, 4), big)
    assert _both([Internal(path)], "path", big) == ["((1.5,2),(-3,4))"]


def test_unread_layout_is_a_clear_error() -> None:
    """A reg* type (an OID whose text is a catalog lookup) kept as text has no internal reader: a clear error."""
    err = _error([Internal(struct.pack("<I", 1259))], (2205, -1), column_types={"public.h.v": "text"})
    assert "internal-format value of type 2205 cannot be decoded: its internal layout is not read" in str(err)
    assert err.offset == D.insert_value_offset(b"")


def test_byte_order_must_be_announced() -> None:
    err = _error([Internal(D.varlena(b"abc"))], "text", startup=False)
    assert "needs the server's byte order" in str(err)


# ------------------------------------------------------------------------------------------------------------------
# refused datums: (type, datum, where the error points inside the datum, words of the sentence)

def _le32(v: int) -> bytes:
    return struct.pack("<I", v)


_PGLZ = D.pglz(TEXT)
_LZ4 = D.lz4(TEXT)
_RAW = len(TEXT)


def _c(payload: bytes, raw: int = _RAW, method: int = 0) -> bytes:
    return D.compressed(payload, raw, method)


REFUSED = {
    "empty": (b"", 0, "is empty"),
    "short header too long": (bytes((7 << 1 | 1,)) + b"ab", 0, "1-byte varlena header of 7 bytes but 3"),
    "external pointer": (b"\x01\x12" + bytes(16), 0, "external TOAST pointer"),
    "4-byte header cut": (b"\x00\x01", 0, "shorter than its 4-byte varlena header"),
    "4-byte header too long": (_le32(40 << 2) + b"abcd", 0, "4-byte varlena header of 40 bytes but 8"),
    "compressed header cut": (_le32(6 << 2 | 2) + b"ab", 0, "shorter than the 8-byte header of a compressed"),
    "unknown method": (_c(_PGLZ, method=2), 4, "compression method 2 is neither pglz (0) nor lz4 (1)"),
    "impossible raw size": (_c(b"\x00abc", raw=1 << 29), 4, "cannot come from 4 compressed bytes"),
    "pglz tag cut": (_c(b"\x01\x0f", raw=3), 9, "a match tag is cut off"),
    "pglz long tag cut": (_c(b"\x02a\x0f\x01", raw=30), 10, "a match tag is cut off"),
    "pglz offset before start": (_c(b"\x02a\x00\x05", raw=4), 10, "a match refers 5 bytes back with 1 bytes"),
    "pglz offset zero": (_c(b"\x02a\x00\x00", raw=4), 10, "a match refers 0 bytes back"),
    "pglz match past raw size": (_c(b"\x02a\x05\x01", raw=4), 10, "a match runs past the declared raw size of 4"),
    "pglz literal past raw size": (_c(b"\x00abc", raw=2), 11, "a literal runs past the declared raw size of 2"),
    "pglz bytes left over": (_c(b"\x00abcdefgh\x00", raw=8), 17, "1 bytes are left over"),
    "pglz raw size too large": (_c(_PGLZ, raw=_RAW + 5), 8 + len(_PGLZ), f"decompresses to {_RAW} bytes, not"),
    "lz4 empty block": (_c(b"", raw=0, method=1), 8, "the block ends where a sequence should start"),
    "lz4 literal length cut": (_c(b"\xf0\xff", raw=300, method=1), 8, "a length is cut off"),
    "lz4 literals past the block": (_c(b"\x50abc", raw=5, method=1), 8, "a run of 5 literals passes the end"),
    "lz4 literals past raw size": (_c(b"\x30abc", raw=2, method=1), 8, "literals run past the declared raw size"),
    "lz4 offset cut": (_c(b"\x10a\x01", raw=6, method=1), 10, "a match offset is cut off"),
    "lz4 offset zero": (_c(b"\x10a\x00\x00", raw=6, method=1), 10, "a match refers 0 bytes back"),
    "lz4 offset before start": (_c(b"\x10a\x02\x00", raw=6, method=1), 10, "a match refers 2 bytes back with 1"),
    "lz4 match past raw size": (_c(b"\x10a\x01\x00", raw=3, method=1), 8, "a match runs past the declared raw"),
    "lz4 block ends after a match": (_c(b"\x10a\x01\x00", raw=5, method=1), 12, "the block ends where a sequence"),
    "lz4 raw size too large": (_c(_LZ4, raw=_RAW + 1, method=1), 8 + len(_LZ4), f"decompresses to {_RAW} bytes"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_datums_same_error_in_both(name: str) -> None:
    datum, pos, words = REFUSED[name]
    err = _error([Internal(datum)], "text")
    assert words in str(err), str(err)
    assert err.offset == D.insert_value_offset(datum) + pos, str(err)
    assert "internal-format value of type text" in str(err) and 'column 0 ("v")' in str(err)


def test_refused_big_endian_headers() -> None:
    err = _error([Internal(bytes((0x80 | 9,)) + b"abc")], "text", big=True)
    assert "1-byte varlena header of 9 bytes but 4 bytes arrived" in str(err)
    err = _error([Internal(b"\x80\x12" + bytes(16))], "bytea", big=True)
    assert "external TOAST pointer" in str(err)
    bad = bytearray(D.compressed(_PGLZ, _RAW, 0, big=True))
    bad[4] |= 0x80                      # method 2 in a big-endian va_tcinfo
    err = _error([Internal(bytes(bad))], "text", big=True)
    assert "compression method 2" in str(err) and err.offset == D.insert_value_offset(b"") + 4


@pytest.mark.parametrize("type_name, data", [("numeric", b"\x01"), ("numeric", b"\x00\xc0\x00"),
                                             ("numeric", b"\x01\xc0"), ("numeric", b"\x00\x00"),
                                             ("interval", bytes(15)), ("timetz", bytes(13)), ("tid", bytes(5))])
def test_invalid_layouts_same_error_in_both(type_name: str, data: bytes) -> None:
    datum = D.varlena(data) if type_name == "numeric" else data
    err = _error([Internal(datum)], type_name)
    assert err.offset == D.insert_value_offset(datum) and "cannot decode internal value" in str(err)


def test_corrupted_compressed_datums_agree() -> None:
    """Random damage to valid pglz and LZ4 datums: both implementations decode the same value or raise the same
    error; nothing reads or writes out of bounds (the C twin runs under the same inputs)."""
    rng = random.Random(2024)
    bases = [D.compressed(D.pglz(TEXT), _RAW, 0), D.compressed(D.lz4(TEXT), _RAW, 1),
             D.compressed(D.pglz(b"xy" * 900), 1800, 0), D.compressed(D.lz4(b"xy" * 900), 1800, 1)]
    outcomes = set()
    for k in range(400):
        datum = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(8, len(datum))
            datum[at] = rng.randrange(256)
        if rng.random() < 0.3:   # cut the data, keeping the header consistent
            cut = rng.randrange(9, len(datum))
            datum = datum[:cut]
            datum[:4] = _le32(len(datum) << 2 | 2)
        results = []
        for name in ("c", "python"):
            try:
                results.append(("ok", D.decode(load_impl(name), [Internal(bytes(datum))], "bytea")))
            except ProtocolError as exc:
                results.append(("error", str(exc), exc.offset))
        assert results[0] == results[1], (k, bytes(datum).hex())
        outcomes.add(results[0][0])
    assert outcomes == {"ok", "error"}


# ------------------------------------------------------------------------------------------------------------------
# negotiation

def test_internal_options_are_spocks_subscribers() -> None:
    opts = native_options("spock", 180006, binary="internal")
    assert opts["binary.want_internal_basetypes"] == opts["binary.want_binary_basetypes"] == "1"
    assert opts["binary.basetypes_major_version"] == "1800"
    assert opts["binary.float4_byval"] == opts["binary.integer_datetimes"] == "0"
    for key in ("binary.bigendian", "binary.sizeof_datum", "binary.sizeof_int", "binary.sizeof_long",
                "binary.float8_byval"):
        assert key in opts
    assert native_options("pglogical", 120010, binary="internal")["binary.float4_byval"] == "1"
    assert native_options("spock", 180006, binary=True)["binary.want_internal_basetypes"] == "0"
    with pytest.raises(ValueError):
        native_options("spock", 180006, binary="yes")


def test_startup_check_of_internal_datums() -> None:
    params = {"proto_version": "5", "binary.internal_basetypes": "t", "binary.binary_basetypes": "t",
              "binary.basetypes_major_version": "1800", "binary.bigendian": "f", "database_encoding": "UTF8",
              "encoding": "UTF8"}
    assert check_startup("spock", params, binary_asked=True, basetypes_major=1800, internal_asked=True) == 5
    with pytest.raises(StartupRejected, match="binary='internal' was not asked for"):
        check_startup("spock", params, binary_asked=True, basetypes_major=1800)
    no_order = {k: v for k, v in params.items() if k != "binary.bigendian"}
    with pytest.raises(StartupRejected, match="does not say its byte order"):
        check_startup("spock", no_order, binary_asked=True, basetypes_major=1800, internal_asked=True)
    latin1 = dict(params, database_encoding="LATIN1", encoding="LATIN1")
    with pytest.raises(StartupRejected, match="UTF-8 databases only"):
        check_startup("spock", latin1, binary_asked=True, basetypes_major=1800, internal_asked=True,
                      encoding="LATIN1")


@pytest.mark.parametrize("big", ORDERS)
def test_unrepresentable_internal_values_switch_to_text(big: bool) -> None:
    """A valid internal value its Arrow type cannot hold (NaN in numeric(p,s), an interval whose microseconds
    overflow nanoseconds) keeps the column as PostgreSQL's text, rendered from the same datum, as for 'b' values."""
    e = ">" if big else "<"
    nan = Internal(D.varlena(struct.pack(e + "H", 0xC000), big))
    one = Internal(D.varlena(D.numeric_short(0, False, 2, [1], big), big))
    assert _both([one, nan], "numeric(10,2)", big) == [Decimal("1.00"), "NaN"]
    huge = Internal(struct.pack(e + "qii", 1 << 60, 0, 0))
    secs, micros = divmod(1 << 60, 1_000_000)
    expected = f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}.{micros:06d}"   # interval_out, no days
    assert _both([huge], "interval", big) == [expected]
    with pytest.raises(ProtocolError, match="NaN or infinite value"):
        D.decode(load_impl("c"), [nan], "numeric(10,2)", big, on_unrepresentable="error")
