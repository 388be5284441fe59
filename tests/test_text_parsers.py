"""The text-format value parsers of both implementations over a grid of tricky inputs, and against PostgreSQL's own.

For each kind with a hand-written text parser (integers, floats, numeric(p,s), date, timestamp, timestamptz, time,
interval, uuid, bytea, arrays and their [lb:ub]= header) the grid holds hand-picked edge cases, valid and invalid
(signs, missing digits, '.5' and '5.', exponents, NaN and the infinities, years past 4 digits, ' BC', fractions of
1 to 7 digits, zone offsets +hh, +hh:mm, +hh:mm:ss, interval forms, uuid spellings, integers past every width,
digit runs longer than Python's int() accepts), plus random byte mutations of valid values (a fixed seed). Every
input is one inserted value of a one-column pgoutput table, decoded by the C decoder and the pure-Python twin with
on_unrepresentable="error": both give the same value, or the same error (class, text, offset, column; the text
names the failure code of spockwire.values.failures), and the twin's own decode_value fails with that code.

The values both accept are anchored on PostgreSQL 15: the same text cast to the column's type by the server
(`SELECT '<text>'::<type>`) must, where the server accepts it, be the value the decoders read, compared through
the server's own numbers (epoch microseconds, days since 1970, interval fields, ::text) rather than through
spockwire.
"""
from __future__ import annotations

import json
import math
import random
import struct
import uuid
from decimal import Decimal
from functools import lru_cache
from typing import Any, Callable

import pyarrow as pa
import pytest

from spockwire.errors import ProtocolError
from spockwire.values import _convert_py as twin
from spockwire.values import failures
from spockwire.values.catalog import _builtin_spec, parse_type_name
from tests.conftest import load_impl

SEED = 20260124
MUTATIONS = 200            # random mutations per kind
ANCHORED = 60              # accepted inputs per kind checked against the server
ALPHABET = b"0123456789-+:. eEBC{}[]=,\"\\xabfNaIy\x00\xff"

INTS = ["0", "-0", "1", "-1", "", "-", "+1", " 1", "1 ", "01", "-01", "--1", "1_000", "1e3", "1.0", "0x10",
        "\uff11", "\u0663", "32767", "32768", "-32768", "-32769", "2147483647", "2147483648", "-2147483648",
        "-2147483649", "4294967295", "4294967296", "9223372036854775807", "9223372036854775808",
        "-9223372036854775808", "-9223372036854775809", "999999999999999999", "1000000000000000000",
        "9999999999999999999", "18446744073709551615", "18446744073709551616", "99999999999999999999",
        "0" * 25 + "1", "-" + "0" * 30 + "7", "1" * 25, "0" * 5000 + "1", "9" * 5000]
FLOATS = ["0", "-0", "1", "1.", ".5", "-.5", "5.", "-5.", ".", "-.", "-", "", "e5", "1e", "1e+", "1e-", "1e5",
          "1E5", "1e+05", "1.5e-10", ".5e1", "5.e1", "1.e", "NaN", "nan", "-NaN", "+NaN", "Infinity", "-Infinity",
          "+Infinity", "infinity", "inf", "-inf", "1e308", "1e309", "-1e309", "1e-400", "3.4028235e38",
          "3.4028236e38", "3.5e38", "-3.5e38", "1.4e-45", "7e-46", "1e-50", "4.9e-324", " 1", "1 ", "+1", "1_0",
          "0x1p3", "1e5.5", "--1", "1" * 400, "0." + "0" * 400 + "1", "1e" + "9" * 30, "0.1", "123456789.123456789",
          "1.7976931348623157e308", "-2.5e-300", "1.1"]
NUMERICS = ["0", "-0", "0.00", "1.5", "1.50", "1.505", "1.", ".5", "-.5", "-", "", "NaN", "Infinity", "-Infinity",
            "nan", "+1", "1e5", " 1", "1 ", "1.2.3", "-1.-2", "9999999999.99", "10000000000.00", "-9999999999.99",
            "12345678.91", "-0.01", "0.000001", "0.0000001", "00012.30", "1" * 17, "1" * 18, "1" * 19, "1" * 20,
            "9" * 32 + ".999999", "1" + "0" * 32, "9" * 38, "-" + "9" * 38, "9" * 39, "1" + "0" * 38,
            "0" * 50 + "1", "0" * 5000 + "1", "0" * 5000 + "1." + "5", "12345678901234567.89", "0.00123",
            "0.000015", "999", "1000"]
DATES = ["2000-01-01", "1970-01-01", "0001-01-01", "0001-01-01 BC", "0000-01-01", "0000-01-01 BC", "9999-12-31",
         "10000-01-01", "294276-12-31", "5874897-12-31", "5874898-01-01", "4714-11-24 BC", "4714-11-23 BC",
         "5874897-12-31 BC", "99999999-12-31", "100000000-01-01", "100000001-01-01", "1000000000-01-01",
         "00002024-02-29", "2024-02-29", "2023-02-29", "2024-02-30", "2024-13-01", "2024-00-01", "2024-01-00",
         "2024-01-32", "2024-1-01", "2024-01-1", "224-01-01", "2024/01/01", "2024-01-01 bc", "2024-01-01 AD",
         "2024-01-01BC", "2024-01-01  BC", "infinity", "-infinity", "+infinity", "Infinity", "", "-2024-01-01",
         "2024-01-01 ", " 2024-01-01", "2024-01-01 00:00:00", "\uff12024-01-01", "0044-03-15 BC"]
STAMP = "2024-02-29 12:34:56"
TIMESTAMPS = [STAMP, STAMP + ".1", STAMP + ".12", STAMP + ".123456", STAMP + ".1234567", STAMP + ".", STAMP + ".-1",
              "2000-01-01 00:00:00", "1970-01-01 00:00:00", "0001-01-01 00:00:00 BC", "0044-03-15 12:00:00.5 BC",
              "294276-12-31 23:59:59.999999", "294277-01-01 00:00:00", "4714-11-24 00:00:00 BC",
              "4714-11-23 23:59:59 BC", "infinity", "-infinity", "2024-01-01 24:00:00", "2024-01-01 23:60:00",
              "2024-01-01 23:59:60", "2024-01-01T00:00:00", "2024-01-01 00:00", "2024-01-01 0:00:00",
              "2024-02-30 00:00:00", "2024-01-01 00:00:00 BC", "2024-01-01 00:00:00 bc", "10000-01-01 00:00:00",
              "99999999-01-01 00:00:00", "100000001-01-01 00:00:00", "0000-01-01 00:00:00", " " + STAMP,
              STAMP + " ", STAMP + "Z"]
ZONES = ["+00", "-08", "+05:30", "+05:30:15", "-00:00:01", "+15", "+16", "+15:59:59", "+14:60", "+14:59:60",
         "+5", "+05:3", "+05:", "+05:30:", "+05:30:1", "+0530", " +05", "+05 BC", "-03:30 BC", "+"]
TIMESTAMPTZ = [STAMP, "infinity", "-infinity", "294276-12-31 23:59:59.999999+00", "294277-01-01 00:00:00+15",
               "4714-11-24 00:00:00+00 BC", "4714-11-24 00:00:00-15:59:59 BC", "0044-03-15 12:00:00.5+00 BC"] + \
              [STAMP + z for z in ZONES] + [STAMP + ".123456" + z for z in ZONES[:6]] + \
              [STAMP + ".1234567+00", STAMP + ".+00"]
TIMES = ["00:00:00", "24:00:00", "24:00:00.000001", "23:59:59.999999", "23:59:59.9999999", "12:34:56.",
         "12:34:56.5", "12:60:00", "12:00:60", "1:00:00", "12:00", "12:00:00 ", "12:00:00+00", "99:00:00",
         "-1:00:00", "12:00:00.1.2", "12-00-00", "", "12:00:00.12345", "ab:cd:ef", "12:00:0a"]
INTERVALS = ["00:00:00", "1 day", "1 days", "-1 days", "+1 days", "-0 days", "1 year 2 mons 3 days 04:05:06.789",
             "-1 years -2 mons +3 days -04:05:06.789", "1 mon", "2 mons", "1 years", "1 day 2 days",
             "04:05:06 1 day", "1 day ", " 1 day", "1  day", "1", "day", "1 week", "1 hour", "1 Day",
             "1 day 00:00:00.1234567", "1 day 00:00:00.", "100:00:00", "1:00:00", ":00:00", "1:0:00", "1:00:60",
             "1:60:00", "1 day -00:00:00.000001", "+00:00:00.5", "-2562047:47:16.854775", "2562047:47:16.854775",
             "2562047:47:16.854776", "2562047788:00:54.775807", "1" * 19 + ":00:00", "0" * 19 + "1:00:00",
             "178956970 years 7 mons", "178956970 years 8 mons", "-178956970 years -8 mons", "2147483647 days",
             "2147483648 days", "-2147483648 days", "-2147483649 days",
             "99999999999999999999 years -99999999999999999999 years", "1" * 31 + " days", "0" * 31 + "1 days",
             "1" * 30 + " days", "00:00:00 00:00:00", "1 day 00:00:00 ", "", " ", "1 mons 1 mons", "3 days 1",
             "3 days x"]
UUIDS = ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
         "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
         "a0eebc999c0b4ef8bb6d6bb9bd380a11", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
         "a0eebc99-9c0b4ef8-bb6d-6bb9bd380a11-", "a0eebc9-99c0b-4ef8-bb6d-6bb9bd380a11",
         "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
         "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1\u00e9",
         "a0eebc99 9c0b 4ef8 bb6d 6bb9bd380a11", "-a0eebc9-9c0b-4ef8-bb6d-6bb9bd380a11", ""]
INT_ARRAYS = ["{}", "{1}", "{1,2,3}", "{NULL}", "{null,NuLl}", "{1,NULL,3}", '{"1","2"}', '{"1\\2"}', '{"-0"}',
              "{1,}", "{,1}", "{1,,2}", "{", "}", "{1}x", "{{1,2},{3,4}}", "[1:3]={1,2,3}", "[0:2]={1,2,3}",
              "[-1:1]={1,2,3}", "[1:1][1:1]={{1}}", "[1:3={1}", "[1:3]{1}", "[a:3]={1}", "[1:]={1}", "[:1]={1}",
              "[01:3]={1,2,3}", "[1:2]={1}", " {1}", "{ 1}", "{1 }", '{"1"x}', "{1\\,2}", "{NULLx}", "{NUL}",
              "{2147483648}", "{1.5}", "[1:0]={}", "[0:0]={}", "[-0:1]={1,2}", "[1:3]=", "[]={1}", '{"1}',
              '{"\\"}', "{1,2,3,4,5,6,7,8,9,10}"]
TEXT_ARRAYS = ["{}", "{a,b}", '{"a b","c,d"}', '{"\\"q\\"","\\\\"}', '{NULL,"NULL"}', "{\u00e9,\u65e5\u672c}",
               '{"unterminated}', '{"a"b}', "{a\\b}", '{"a\\', "{a b}", '{"{x}"}', "{{a}}", "{a,{b}}", '{""}',
               "{ }", "[1:2]={a,b}"]
BYTEAS = ["\\x", "\\x00ff", "\\xABcd", "\\x0", "\\xgg", "abc", "a\\\\b", "\\001\\377", "\\400", "\\08", "\\",
          "\\x 00", "\\X00", "", "\\\\", "\\0010", "\\x" + "0f" * 40, "a\\"]

# kind: (type name for the column and the server cast, hand-written inputs, how the server's value is read)
KINDS: dict[str, tuple[str, list[str], str]] = {
    "int2": ("int2", INTS, "int"), "int4": ("int4", INTS, "int"), "int8": ("int8", INTS, "int"),
    "oid": ("oid", INTS, "int"), "float4": ("float4", FLOATS, "float4"), "float8": ("float8", FLOATS, "float8"),
    "num_12_2": ("numeric(12,2)", NUMERICS, "numeric"), "num_38_6": ("numeric(38,6)", NUMERICS, "numeric"),
    "num_18_0": ("numeric(18,0)", NUMERICS, "numeric"), "num_3_5": ("numeric(3,5)", NUMERICS, "numeric"),
    "num_38_0": ("numeric(38,0)", NUMERICS, "numeric"),
    "date": ("date", DATES, "date"), "timestamp": ("timestamp", TIMESTAMPS, "stamp"),
    "timestamptz": ("timestamptz", TIMESTAMPTZ, "stamp"), "time": ("time", TIMES, "time"),
    "interval": ("interval", INTERVALS, "interval"), "uuid": ("uuid", UUIDS, "uuid"),
    "int4_array": ("int4[]", INT_ARRAYS, "array"), "text_array": ("text[]", TEXT_ARRAYS, "array"),
    "bytea": ("bytea", BYTEAS, "bytea"),
}


def _mutate(rng: random.Random, value: bytes) -> bytes:
    b = bytearray(value)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(6)
        at = rng.randrange(len(b) + 1)
        if op == 0 and b:          # replace a byte
            b[min(at, len(b) - 1)] = rng.choice(ALPHABET)
        elif op == 1:              # insert a byte
            b.insert(at, rng.choice(ALPHABET))
        elif op == 2 and b:        # delete a byte
            del b[min(at, len(b) - 1)]
        elif op == 3:              # cut
            del b[at:]
        elif op == 4 and b:        # repeat a slice
            end = rng.randrange(at, len(b) + 1)
            b[end:end] = b[at:end]
        else:                      # a digit run longer or shorter
            b[at:at] = rng.choice((b"0", b"9", b"00", b"99999", b"0" * 20, b"9" * 20))
    return bytes(b)


@lru_cache(maxsize=None)
def grid(kind: str) -> tuple[bytes, ...]:
    """The kind's hand-written inputs, then random mutations of the valid ones (the same on every run)."""
    typ, texts, _ = KINDS[kind]
    inputs = [t.encode() for t in texts]
    spec = _spec(typ)
    valid = []
    for raw in inputs:
        try:
            twin.decode_value(spec, 0x74, raw, None)
            valid.append(raw)
        except twin.ValueFailure:
            pass
    rng = random.Random(f"{SEED}-{kind}")
    seen = set(inputs)
    for _ in range(MUTATIONS):
        raw = _mutate(rng, rng.choice(valid))
        if raw not in seen:
            seen.add(raw)
            inputs.append(raw)
    return tuple(inputs)


@lru_cache(maxsize=None)
def _spec(typ: str) -> Any:
    return _builtin_spec(*parse_type_name(typ))


RELID = 9


def _messages(typ: str, raw: bytes) -> list[bytes]:
    oid, typmod = parse_type_name(typ)
    begin = b"B" + struct.pack(">QqI", 0x2000, 0, 7)
    relation = b"R" + struct.pack(">I", RELID) + b"public\0t\0d" + struct.pack(">H", 1) + b"\0v\0" + \
        struct.pack(">Ii", oid, typmod)
    insert = b"I" + struct.pack(">I", RELID) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">I", len(raw)) + raw
    commit = b"C" + struct.pack(">BQQq", 0, 0x2000, 0x2001, 0)
    return [begin, relation, insert, commit]


def _canon(value: Any) -> Any:
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", value.hex())
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def _storage(column: pa.Array) -> list[Any]:
    """The column's values; temporal ones as their integers (±infinity has no datetime)."""
    t = column.type
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return column.view(pa.int64()).to_pylist()
    if pa.types.is_date32(t):
        return column.view(pa.int32()).to_pylist()
    return column.to_pylist()


def _code_of(text: str, typ: str, raw: bytes) -> int | None:
    """The failure code whose sentence ends the error text (None: not a value failure)."""
    name = _spec(typ).type_name
    codes = [v for k, v in vars(failures).items() if k.isupper() and isinstance(v, int) and k != "OFFSET_LIMIT"]
    found = [c for c in codes if text.endswith(": " + failures.value_problem(c, 0x74, raw, name))]
    return found[0] if len(found) == 1 else None


def outcome(impl: Any, typ: str, raw: bytes) -> tuple:
    """('value', storage values of the column) or ('error', class, text, offset, column, failure code)."""
    dec = impl.Decoder(protocol="pgoutput", on_unrepresentable="error")
    try:
        for i, m in enumerate(_messages(typ, raw)):
            dec.feed(m, 0x1000 + i)
        (batch,) = [e for e in dec.drain() if hasattr(e, "to_arrow")]
        record = batch.to_arrow()
        return ("value", _canon(_storage(record.column(record.schema.get_field_index("v")))))
    except ProtocolError as exc:
        return ("error", type(exc).__name__, str(exc), exc.offset, exc.column, _code_of(str(exc), typ, raw))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_c_and_twin_parse_every_input_alike(kind: str) -> None:
    typ = KINDS[kind][0]
    c, py = load_impl("c"), load_impl("python")
    spec = _spec(typ)
    for raw in grid(kind):
        got_c, got_py = outcome(c, typ, raw), outcome(py, typ, raw)
        assert got_c == got_py, (kind, raw[:80])
        try:
            twin.decode_value(spec, 0x74, raw, None)
            code = None
        except twin.ValueFailure as failure:
            code = failure.code
        if got_c[0] == "error":
            assert got_c[5] == code, (kind, raw[:80], got_c)      # the twin's own code is the one in the text
        else:
            assert code is None, (kind, raw[:80])


def test_grid_holds_valid_and_invalid_inputs_of_every_kind() -> None:
    """The grid is not degenerate: every kind has accepted and refused inputs, a few thousand in all."""
    total = 0
    for kind, (typ, _, _) in KINDS.items():
        spec = _spec(typ)
        accepted = refused = 0
        for raw in grid(kind):
            try:
                twin.decode_value(spec, 0x74, raw, None)
                accepted += 1
            except twin.ValueFailure:
                refused += 1
        assert accepted >= 5 and refused >= 20, (kind, accepted, refused)
        total += accepted + refused
    assert total >= 3000


@pytest.mark.parametrize("base", ["0123abcd-ef45-6789-ABCD-EF0123456789", "ffffffff-0000-9999-aaaa-FFFFFFFFFFFF"])
def test_uuid_text_every_byte_at_every_position(base: str) -> None:
    """Each of the 256 byte values in each of the 36 places of a UUID (the C kernel tests eight digits at once per
    64-bit word): both implementations accept exactly the hex digits of either case in the digit places and the
    hyphen in the hyphen places, with the value Python's uuid module reads."""
    c, py = load_impl("c"), load_impl("python")
    accepted = 0
    for at in range(36):
        for byte in range(256):
            raw = base.encode()[:at] + bytes((byte,)) + base.encode()[at + 1:]
            got_c, got_py = outcome(c, "uuid", raw), outcome(py, "uuid", raw)
            assert got_c == got_py, raw
            hyphen = at in (8, 13, 18, 23)
            valid = byte == 0x2D if hyphen else chr(byte) in "0123456789abcdefABCDEF"
            assert (got_c[0] == "value") == valid, raw
            if valid:
                assert got_c[1] == [uuid.UUID(raw.decode()).bytes]
                accepted += 1
    assert accepted == 32 * 22 + 4


@pytest.mark.parametrize("typ,text", [("timestamptz", "2024-02-29 12:34:56.123456+05:30"),
                                      ("timestamp", "1999-12-31 23:59:59"), ("timestamptz", "0001-01-01 00:00:00+00")])
def test_timestamp_text_every_byte_at_every_position(typ: str, text: str) -> None:
    """Each of the 256 byte values in each place of a timestamp's text (the C kernel tests the 19 bytes of
    "YYYY-MM-DD HH:MM:SS" as two 64-bit words and three bytes): both implementations give the same value or the same
    error, a byte of the fixed head is accepted only as a digit in a digit place (the range of each field still
    checked) or as its own separator, and an accepted value is the one Python's datetime reads."""
    import datetime as dt

    c, py = load_impl("c"), load_impl("python")
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    accepted = 0
    for at in range(len(text)):
        for byte in range(256):
            raw = text.encode()[:at] + bytes((byte,)) + text.encode()[at + 1:]
            got_c, got_py = outcome(c, typ, raw), outcome(py, typ, raw)
            assert got_c == got_py, raw
            if at < 19:
                separator = text[at] if at in (4, 7, 10, 13, 16) else None
                if separator is not None and byte != ord(separator) or separator is None and not 0x30 <= byte <= 0x39:
                    assert got_c[0] == "error", raw
            if got_c[0] == "value":
                accepted += 1
                iso = raw.decode().replace(" ", "T", 1) + ("" if typ == "timestamptz" else "+00:00")
                try:
                    parsed = dt.datetime.fromisoformat(iso)
                except ValueError:      # a day past its month's end: no datetime (the server never writes one)
                    continue
                assert got_c[1] == [(parsed - epoch) // dt.timedelta(microseconds=1)], raw
    assert accepted >= 19 * 3, accepted


def test_utf8_check_of_every_tail() -> None:
    """Text values of 1 to 40 bytes with one non-ASCII piece at each place (a stray continuation byte, 0xff, a lead
    byte cut short, a whole two-byte and three-byte character): the C check reads the last under-eight bytes of a
    value as one overlapping word. Both implementations accept exactly what Python's UTF-8 decoder accepts."""
    c, py = load_impl("c"), load_impl("python")
    checked = 0
    for length in range(1, 41):
        for at in range(length):
            for piece in (b"\x80", b"\xff", b"\xc3", "\u00e9".encode(), "\u65e5".encode()):
                raw = (b"a" * at + piece + b"b" * length)[:max(length, at + len(piece))]
                got_c, got_py = outcome(c, "text", raw), outcome(py, "text", raw)
                assert got_c == got_py, raw
                try:
                    expected = ("value", [raw.decode("utf-8")])
                except UnicodeDecodeError:
                    expected = ("error",)
                assert got_c[:len(expected)] == expected, raw
                checked += 1
    assert checked == 5 * 40 * 41 // 2


# ---------------------------------------------------------------------------------------------------------------
# the server's own parse of the accepted inputs

def _epoch_us(text: str, lo: int, hi: int) -> int:
    if text == "infinity" or text == "Infinity":
        return hi
    if text == "-infinity" or text == "-Infinity":
        return lo
    return int(Decimal(text))


ORACLES: dict[str, tuple[str, Callable[[tuple], Any]]] = {
    # SQL over x (the input cast by the server), and how its row becomes a storage value of the twin
    "int": ("x::text", lambda r: int(r[0])),
    "float8": ("x::text", lambda r: _canon(float(r[0]))),
    "float4": ("x::float8::text", lambda r: _canon(float(r[0]))),
    "numeric": ("x::text", lambda r: Decimal(r[0])),
    "date": ("CASE WHEN isfinite(x) THEN (x - date '1970-01-01')::text ELSE x::text END",
             lambda r: _epoch_us(r[0], twin.INT32_MIN, twin.INT32_MAX)),
    "stamp": ("CASE WHEN isfinite(x) THEN (extract(epoch FROM x) * 1000000)::text ELSE x::text END",
              lambda r: _epoch_us(r[0], twin.INT64_MIN, twin.INT64_MAX)),
    "time": ("(extract(epoch FROM x) * 1000000)::text", lambda r: int(Decimal(r[0]))),
    "interval": ("(extract(year FROM x) * 12 + extract(month FROM x))::text || ' ' || extract(day FROM x)::text "
                 "|| ' ' || ((extract(hour FROM x) * 60 + extract(minute FROM x)) * 60000000 "
                 "+ extract(microseconds FROM x))::text",
                 lambda r: tuple(int(Decimal(p)) for p in r[0].split(" "))),
    "uuid": ("x::text", lambda r: uuid.UUID(r[0]).bytes),
    "array": ("array_to_json(x)::text || ' ' || coalesce(array_lower(x, 1), 1)::text || ' ' "
              "|| coalesce(array_ndims(x), 1)::text", lambda r: r[0]),
    "bytea": ("encode(x, 'hex')", lambda r: bytes.fromhex(r[0])),
}


def _twin_value(how: str, value: Any) -> Any:
    if how in ("float4", "float8"):
        return _canon(value)
    if how == "interval":
        months, days, nanos = value
        return months, days, nanos // 1000
    return value


def _array_matches(server: str, value: list) -> bool:
    data, lower, ndims = server.rsplit(" ", 2)
    return json.loads(data) == value and lower == "1" and ndims == "1"


def _matches(how: str, read: Callable[[tuple], Any], row: tuple, value: Any) -> bool:
    if how == "array":
        return _array_matches(row[0], value)
    return read(row) == _twin_value(how, value)


def test_accepted_inputs_are_the_servers_values(pg_cluster) -> None:
    """Every input the decoders accept and the server accepts too is the server's value. The one exception is a
    spelling the server never writes: whitespace around an unquoted array element, which array_in trims and the
    kernels keep (array_out quotes such elements); its canonical text, like that of every anchored input, must then
    decode to the server's value."""
    c, py = load_impl("c"), load_impl("python")
    conn = pg_cluster.connect()
    try:
        cur = conn.cursor()
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'")
        checked = 0
        for kind, (typ, _, how) in sorted(KINDS.items()):
            sql, read = ORACLES[how]
            spec = _spec(typ)
            anchored = 0
            for raw in grid(kind):
                if anchored >= ANCHORED:
                    break
                try:
                    value = twin.decode_value(spec, 0x74, raw, None)
                    text = raw.decode("utf-8")
                except (twin.ValueFailure, UnicodeDecodeError):
                    continue
                if "\0" in text:
                    continue
                try:
                    cur.execute(f"SELECT {sql}, x::text FROM (SELECT %s::{typ} AS x) s", (text,))
                except Exception:          # the server refuses the text: nothing to anchor
                    conn.rollback()
                    continue
                (row,) = cur.fetchall()
                canonical = row[-1]
                if not _matches(how, read, row, value):
                    assert how == "array" and canonical != text and " " in text, (kind, text, row, value)
                assert _matches(how, read, row, twin.decode_value(spec, 0x74, canonical.encode(), None)), \
                    (kind, text, row)
                assert outcome(c, typ, canonical.encode()) == outcome(py, typ, canonical.encode()), (kind, canonical)
                anchored += 1
            assert anchored >= 3, kind
            checked += anchored
        assert checked >= 300
    finally:
        conn.close()


def test_the_twin_has_no_regular_expressions() -> None:
    import inspect

    assert "import re\n" not in inspect.getsource(twin)
