"""The internal ('i') layouts of jsonb, tsvector, tsquery, jsonpath and aclitem (spockwire.values.internal_types and
its C twin include/sw_internal_types.h), in both implementations: datums made by real servers (PostgreSQL 15 through
pglogical, 18 through Spock: tests/data/internal_layouts.json, re-created by tests/data/capture_internal_layouts.py)
decode to the server's own text; the same values in the other byte order, compressed, with either varlena header
and in columns kept as text; and every refusal is the same error, at the same byte, in both."""
from __future__ import annotations

import json
import random
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import tests.internal_datums as D
from spockwire.errors import ProtocolError
from spockwire.values import StaticTypeCatalog
from spockwire.values.internal import internal_send_form, unpack_varlena
from tests.conftest import load_impl
from tests.wire_encoder import Internal

RECORDS = json.loads((Path(__file__).parent / "data" / "internal_layouts.json").read_text())
GROUPS = sorted({(r["server"], r["type"]) for r in RECORDS})


def _records(server: str, type_name: str) -> list[dict]:
    return [r for r in RECORDS if (r["server"], r["type"]) == (server, type_name)]


def _roles(records: list[dict]) -> dict[int, str]:
    return {int(k): v for r in records for k, v in (r["roles"] or {}).items()}


def _data(rec: dict) -> bytes:
    return unpack_varlena(bytes.fromhex(rec["datum"]), False)


def _doc(text: str) -> Any:
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


@pytest.mark.parametrize("server, type_name", GROUPS)
def test_server_datums_decode_to_the_servers_text(server: str, type_name: str) -> None:
    records = _records(server, type_name)
    values = [Internal(bytes.fromhex(r["datum"])) for r in records]
    got = D.decode_both(values, type_name, roles=_roles(records))
    assert got == [r["text"] for r in records]


def test_jsonb_writer_matches_the_server() -> None:
    """tests/internal_datums.jsonb (used below for the other byte order) writes what the servers wrote."""
    checked = 0
    for rec in RECORDS:
        if rec["type"] == "jsonb" and "NaN" not in rec["text"]:
            assert D.jsonb(_doc(rec["text"])) == _data(rec), rec["sql"]
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("big", [False, True])
def test_jsonb_in_both_byte_orders_and_every_header_form(big: bool) -> None:
    docs = [_doc(r["text"]) for r in _records("pg18", "jsonb")]
    texts = [r["text"] for r in _records("pg18", "jsonb")]
    values = [Internal(D.varlena(D.jsonb(doc, big), big)) for doc in docs]
    assert D.decode_both(values, "jsonb", big) == texts
    big_doc = docs[-1]
    data = D.jsonb(big_doc, big)
    assert len(data) > 2000
    forms = [D.varlena(data, big, short=False), D.compressed(D.pglz(data), len(data), 0, big),
             D.compressed(D.lz4(data), len(data), 1, big)]
    assert D.decode_both([Internal(f) for f in forms], "jsonb", big) == [texts[-1]] * 3
    small = D.jsonb({"a": [1, None]}, big)
    assert D.decode_both([Internal(D.varlena(small, big, short=True))], "jsonb", big) == ['{"a": [1, null]}']


def test_jsonb_numbers_at_the_limits() -> None:
    numbers = ["0", "-0.000001", "1e-16383", "1e40000", "9" * 4000, "-" + "1" * 1000 + "." + "2" * 16383,
               "12345.678900", "1e300", "-9223372036854775808"]
    values = [Internal(D.varlena(D.jsonb([Decimal(n)]))) for n in numbers]
    assert D.decode_both(values, "jsonb") == [f"[{Decimal(n):f}]" for n in numbers]


def test_jsonb_kept_as_text_and_into_its_string_column_alike() -> None:
    records = _records("pg15", "jsonb")
    values = [Internal(bytes.fromhex(r["datum"])) for r in records]
    as_text = D.decode_both(values, "jsonb", column_types={"public.h.v": "text"})
    assert as_text == [r["text"] for r in records]


@pytest.mark.parametrize("big", [False, True])
def test_tsvector_and_tsquery_in_both_byte_orders(big: bool) -> None:
    vec = D.tsvector([("a", []), ("back\\slash", [(1, 3), (16383, 0)]), ("it's", [(2, 2), (3, 1)]), ("zz", [])],
                     big)
    assert D.decode_both([Internal(D.varlena(vec, big))], "tsvector", big) == \
        ["'a' 'back\\\\slash':1A,16383 'it''s':2B,3C 'zz'"]
    v = ("v", "a", 0, 0)
    tree = ("|", ("&", ("v", "x", 8, 1), ("!", ("v", "y", 3, 0))), ("<N>", 3, v, ("<N>", 1, ("v", "b", 0, 1), v)))
    assert D.decode_both([Internal(D.varlena(D.tsquery(tree, big), big)), Internal(D.varlena(D.tsquery(None, big),
                                                                                           big))], "tsquery", big) \
        == ["'x':*A & !'y':CD | 'a' <3> ( 'b':* <-> 'a' )", ""]


#: jsonpath chains (tests/internal_datums.jsonpath) and the text the servers print for them; each is byte for byte
#: the datum PostgreSQL 18 made for that text
JSONPATHS = [
    ([("$",), ("key", "a"), ("[*]",), ("un", 29, [("bin", 11, [("@",)], [("num", 1)])])], '$."a"[*]?(@ > 1)'),
    ([("$",), ("key", "key with space"), ("key", "b"),
      ("index", [([("num", 1)], [("num", 3)]), ([("num", 5)], None), ([("method", 40)], None)])],
     '$."key with space"."b"[1 to 3,5,last]'),
    ([("$",), ("un", 29, [("regex", 7, [("@",), ("key", "a")], "^x.*")])], '$?(@."a" like_regex "^x.*" flag "ism")'),
    ([("$",), ("any", 2, 0xFFFFFFFF)], "$.**{2 to last}"),
    ([("bin", 16, [("bin", 14, [("var", "x")], [("num", "-1.5")])], [("un", 20, [("$",), (".*",)])])],
     '(($"x" + -1.5) * -$.*)'),
    ([("$",), ("un", 29, [("bin", 5, [("bin", 4, [("bin", 8, [("@",)], [("bool", True)])],
                                              [("un", 6, [("bin", 8, [("@",)], [("null",)])])])],
                                   [("un", 7, [("bin", 10, [("@",)], [("bool", False)])])])])],
     '$?(@ == true && !(@ == null) || (@ < false) is unknown)'),
    ([("num", "1.50"), ("key", "a")], '(1.50)."a"'),
    ([("$",), ("opt", 37, [("str", "yyyy\\n")]), ("decimal", [("num", 4)], [("num", 2)]), ("opt", 50, None)],
     '$.datetime("yyyy\\\\n").decimal(4,2).time()'),
]


@pytest.mark.parametrize("big", [False, True])
def test_jsonpath_in_both_byte_orders(big: bool) -> None:
    servers = {r["text"]: _data(r) for r in _records("pg18", "jsonpath")}
    for chain, text in JSONPATHS:
        assert D.jsonpath(chain) == servers[text], text
    values = [Internal(D.varlena(D.jsonpath(chain, big=big), big)) for chain, _text in JSONPATHS]
    values.append(Internal(D.varlena(D.jsonpath([("$",), ("key", "a")], lax=False, big=big), big)))
    assert D.decode_both(values, "jsonpath", big) == [text for _chain, text in JSONPATHS] + ['strict $."a"']


# ------------------------------------------------------------------------------------------------------------------
# aclitem

def test_aclitem_needs_role_names() -> None:
    """Without a catalog that reads role names the text cannot be made: a clear error, alike in both."""
    rec = _records("pg18", "aclitem")[0]

    class TypesOnly:
        def type_info(self, oid: int) -> None:
            return None

        def column_types(self, relation: Any) -> list[tuple[int, int]]:
            return [(1033, -1)]

    errors = []
    for name in ("c", "python"):
        dec = load_impl(name).Decoder(protocol="pglogical", type_catalog=TypesOnly())
        with pytest.raises(ProtocolError) as info:
            for k, m in enumerate(D.stream([Internal(bytes.fromhex(rec["datum"]))], "aclitem")):
                dec.feed(m, 0x1000 + k)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "value of type aclitem names its roles by OID" in errors[0] and "PostgresTypeCatalog" in errors[0]


@pytest.mark.parametrize("big", [False, True])
def test_aclitem_fields_bits_and_unknown_roles(big: bool) -> None:
    e = ">" if big else "<"
    roles = {10: "postgres", 20: "a b"}
    values = [Internal(struct.pack(e + "IIQ", 0, 10, (1 << 15) - 1 | 1 << 32)),          # PUBLIC, every right
              Internal(struct.pack(e + "IIQ", 20, 99, 1 << 1 | 1 << 33)),                  # an unknown grantor
              Internal(struct.pack(e + "III", 10, 20, 1 << 13 | 1 << 12 | 1 << 29))]       # PostgreSQL 15
    assert D.decode_both(values, "aclitem", big, roles=roles) == \
        ["=a*rwdDxtXUCTcsAm/postgres", '"a b"=r*/99', 'postgres=sA*/"a b"']
    assert internal_send_form(1033, bytes(values[1]), big) == struct.pack(">IIQ", 20, 99, 1 << 1 | 1 << 33)
    for bad in (struct.pack(e + "IIQ", 0, 10, 1 << 15), struct.pack(e + "III", 0, 10, 1 << 14),
                struct.pack(e + "III", 0, 10, 1 << 30), struct.pack(e + "II", 0, 10)):
        err = D.error_both([Internal(bad)], "aclitem", big, roles=roles)
        assert "cannot decode internal value" in str(err) and err.offset == D.insert_value_offset(bad)


# ------------------------------------------------------------------------------------------------------------------
# refusals: (type, datum, byte of the datum the error points at, words of the sentence)

def _jsonb_bad(data: bytes, at: int, value: bytes) -> bytes:
    out = bytearray(data)
    out[at:at + len(value)] = value
    return bytes(out)


_OBJ = D.jsonb({"k": 1.5, "list": [True]})            # header, 4 JEntries, "k", "list", pad, numeric, pad, array
_LE = struct.Struct("<I")
_NUM_AT = 4 + 16 + 5                                  # the numeric entry's data: padding (3 bytes), then the datum
_VEC = D.tsvector([("ab", [(1, 0)]), ("c", [])])
_QUERY = D.tsquery(("&", ("v", "a", 0, 0), ("v", "b", 0, 0)))

REFUSED = {
    "jsonb empty": ("jsonb", b"", 4, "a container's header needs 4 bytes at byte 0, 0 remaining"),
    "jsonb flags": ("jsonb", _LE.pack(0x30000000), 4, "neither an object nor an array"),
    "jsonb nested raw scalar": ("jsonb", D.jsonb([[1]])[:8] + _LE.pack(0x50000001) + D.jsonb([[1]])[12:], 12,
                                "raw scalar container that is not the top-level one"),
    "jsonb entries past the end": ("jsonb", _LE.pack(0x40000003) + _LE.pack(0), 4, "a container of 3 entries"),
    "jsonb entry past the data": ("jsonb", _jsonb_bad(_OBJ, 8, _LE.pack(40)), 12, "entry 1 ends at byte 41"),
    "jsonb trailing bytes": ("jsonb", _OBJ + b"\x00\x00\x00\x00", 4 + len(_OBJ), "4 bytes follow the container's"),
    "jsonb key not a string": ("jsonb", _jsonb_bad(_OBJ, 4, _LE.pack(0x90000001)), 4 + 20,
                               "object key 0 is not a string"),
    "jsonb padding not zero": ("jsonb", _jsonb_bad(_OBJ, _NUM_AT, b"\x01"), 4 + _NUM_AT,
                               "a number is preceded by padding that is not zero"),
    "jsonb number header": ("jsonb", _jsonb_bad(_OBJ, _NUM_AT + 3, _LE.pack(9 << 2)), 4 + _NUM_AT + 3,
                            "a number's varlena header says 9 bytes but its entry has 10"),
    "jsonb number digits": ("jsonb", _jsonb_bad(_OBJ, _NUM_AT + 3 + 6, b"\xff\xff"), 4 + _NUM_AT + 3,
                            "a number is not a valid numeric datum"),
    "jsonb unknown entry type": ("jsonb", D.jsonb([None])[:4] + _LE.pack(0xE0000000), 12,
                                 "an element has type 6, which is not a JEntry type"),
    "jsonb null with data": ("jsonb", D.jsonb([None])[:4] + _LE.pack(0xC0000001) + b"x", 12, "a null has 1 bytes"),
    "tsvector count": ("tsvector", struct.pack("<i", 5) + bytes(8), 4, "5 lexemes cannot fit 12 bytes"),
    "tsvector gap": ("tsvector", _VEC[:8] + _LE.pack(_LE.unpack_from(_VEC, 8)[0] + (1 << 12)) + _VEC[12:], 12,
                     "lexeme 1 starts at byte 7 of the lexemes, not 6"),
    "tsvector trailing": ("tsvector", _VEC + b"\x00", 4 + len(_VEC), "1 bytes follow the last lexeme"),
    "tsvector positions cut": ("tsvector", D.tsvector([("abc", [(1, 0), (2, 0)])])[:-2], 4 + 14,
                               "the positions of lexeme 0 needs 4 bytes at byte 14, 2 remaining"),
    "tsquery operator": ("tsquery", _QUERY[:5] + b"\x07" + _QUERY[6:], 9, "operator 0 is 7"),
    "tsquery left": ("tsquery", _QUERY[:8] + _LE.pack(1) + _QUERY[12:], 12,
                     "operator 0 says its left operand is 1 items on, not 2"),
    "tsquery text NUL": ("tsquery", _QUERY[:-1] + b"x", 4 + 4 + 36 + 2, "the text of operand 1 is not 1 bytes and"),
    "tsquery text cut": ("tsquery", _QUERY[:-2], 4 + 4 + 36 + 2, "the text of operand 1 needs 2 bytes at byte 42, 0"),
    "tsquery texts overlap": ("tsquery", _QUERY[:24] + _LE.pack(1) + _QUERY[28:], 4 + 4 + 36,
                              "operand texts are not one after another at byte 2"),
    "tsquery item type": ("tsquery", _QUERY[:16] + b"\x03" + _QUERY[17:], 4 + 16,
                          "query item 1 has type 3"),
    "tsquery weight": ("tsquery", _QUERY[:17] + b"\x10" + _QUERY[18:], 4 + 17, "operand 1 has weight bits 0x10"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_layouts_same_error_in_both(name: str) -> None:
    type_name, data, at, words = REFUSED[name]
    datum = D.varlena(data, short=False)
    err = D.error_both([Internal(datum)], type_name)
    assert words in str(err), str(err)
    assert f"internal-format value of type {type_name} has a corrupt layout at byte {at} of the datum" in str(err)
    assert err.offset == D.insert_value_offset(datum) + at, str(err)


def test_refused_compressed_layout_names_the_byte_of_the_data() -> None:
    data = D.jsonb(list(range(40)))[:-1] + b"\x00\x00"
    datum = D.compressed(D.pglz(data), len(data), 0)
    err = D.error_both([Internal(datum)], "jsonb")
    assert "has a corrupt layout at byte" in str(err) and "of its decompressed data" in str(err)
    assert err.offset == D.insert_value_offset(datum)


def test_damaged_server_datums_agree() -> None:
    """Random damage to the servers' datums: both implementations decode the same value or raise the same error
    at the same byte (the C twin runs on every one of them; the sanitizer build runs them in fuzz/)."""
    rng = random.Random(1843)
    bases = [(r["type"], _data(r)) for r in RECORDS if r["type"] in ("jsonb", "tsvector", "tsquery")]
    outcomes = set()
    for k in range(600):
        type_name, data = rng.choice(bases)
        data = bytearray(data)
        if data and rng.random() < 0.8:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.choice((0, 1, 0xFF, 0x80, rng.randrange(256)))
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data) + 1)]
        datum = Internal(D.varlena(bytes(data), short=False))
        results = []
        for name in ("c", "python"):
            try:
                results.append(("ok", D.decode(load_impl(name), [datum], type_name)))
            except ProtocolError as exc:
                results.append(("error", str(exc), exc.offset))
        assert results[0] == results[1], (k, type_name, bytes(data).hex())
        outcomes.add(results[0][0])
    assert outcomes == {"ok", "error"}


def test_catalog_reads_role_names() -> None:
    catalog = StaticTypeCatalog({}, roles={10: "postgres"})
    assert catalog.role_name(10) == "postgres" and catalog.role_name(11) is None


def _minus_chain(depth: int) -> bytes:
    """A jsonpath of `depth` nested unary minus items around null (each argument one level deeper)."""
    items = b"".join(struct.pack("<BxxxiI", 20, 0, 12) for _ in range(depth)) + struct.pack("<Bxxxi", 0, 0)
    return struct.pack("<I", 0x80000001) + items


def test_jsonpath_nesting_limit() -> None:
    from spockwire.values.internal_types import JSONPATH_MAX_DEPTH
    deepest = D.varlena(_minus_chain(JSONPATH_MAX_DEPTH), short=False)
    assert D.decode_both([Internal(deepest)], "jsonpath") == ["(-" * JSONPATH_MAX_DEPTH + "null" + ")" *
                                                             JSONPATH_MAX_DEPTH]
    err = D.error_both([Internal(D.varlena(_minus_chain(JSONPATH_MAX_DEPTH + 1), short=False))], "jsonpath")
    assert f"the items nest deeper than {JSONPATH_MAX_DEPTH} levels" in str(err)


def test_other_internal_base_types_stay_as_they_arrived() -> None:
    """The base types the plugins may still send as internal datums without a reader here (the reg* types, whose
    text is a catalog lookup; the statistics types) are OTHER columns holding the datum's bytes, not errors."""
    regclass = struct.pack("<I", 1259)
    ndistinct = D.varlena(b"\xa3\x5b\x17\xa3\x00\x00\x00\x00")
    assert D.decode_both([Internal(regclass)], (2205, -1)) == [regclass]
    assert D.decode_both([Internal(regclass)], (4096, -1)) == [regclass]
    assert D.decode_both([Internal(ndistinct)], (3361, -1)) == [ndistinct]


def test_expanding_datums_close_batches_alike() -> None:
    """A compressed jsonb datum (one a server made) whose text is several times its bytes counts by its text toward
    the batch size, in both implementations (the batches close after the same rows)."""
    (rec,) = [r for r in _records("pg18", "jsonb") if bytes.fromhex(r["datum"])[0] & 0x03 == 0x02]
    assert len(rec["text"]) > 2 * (len(rec["datum"]) // 2)       # hex: two characters a byte
    sizes = []
    for name in ("c", "python"):
        dec = load_impl(name).Decoder(protocol="pglogical", spill_bytes=4 << 20,
                                      type_catalog=StaticTypeCatalog({"public.h": {"v": "jsonb"}}))
        for k, m in enumerate(D.stream([Internal(bytes.fromhex(rec["datum"]))] * 900, "jsonb")):
            dec.feed(m, 0x1000 + k)
        sizes.append([len(ev.to_pylist()) for ev in dec.drain() if hasattr(ev, "to_arrow")])
    assert sizes[0] == sizes[1] and len(sizes[0]) > 1, sizes
