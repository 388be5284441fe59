"""Typed values against live PostgreSQL 15 and 18 servers: every row of the type mapping table
(spockwire/values/catalog.py).

One session-scoped dataset per server: a database whose tables (one per type case, `t_<case>(id int PRIMARY KEY, v <type>)`)
hold edge values and NULLs. Before the rows are written, pgoutput slots (text and binary) and a pglogical slot are
created; afterwards their streams are read with pg_logical_slot_peek_binary_changes — the text stream several
times, under different session time zones and bytea_output settings. Every stream is decoded with both
implementations in typed mode, and:

1. text and binary decodes give identical Arrow arrays (NaN equal to NaN), for every type but the OTHER ones,
   which are strings from text and binary from binary by contract;
2. the values equal what psycopg2 reads with a SELECT of the same rows (values Python cannot hold — infinity, BC,
   after 9999, 24:00:00 — against the server's `::text`);
3. the C and Python implementations agree exactly.

pglogical streams (binary and internal format) are decoded with a PostgresTypeCatalog. Values whose Arrow type
cannot hold them (multi-dimensional arrays, lower bounds other than 1, NaN in numeric(p,s)) give the documented
errors with on_unrepresentable="error" (tests/test_unrepresentable.py covers the default). Hypothesis round
trips cover the binary formats with values encoded by tests/pg_send.py.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import struct
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Sequence

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spockwire.errors import ProtocolError
from spockwire.export.python import PgInfinity
from tests import pg_send as S
from tests import wire_encoder as W
from tests.conftest import load_impl
from tests.pg_fixtures import PgDatabase
from tests.wire_encoder import Col

UTC = dt.timezone.utc
DEC = pa.decimal128
STR = pa.string()


# ---------------------------------------------------------------------------------------------------------------
# the type cases: table t_<name>, column v of `sqltype`, one row per value (plus a NULL row)

@dataclass(frozen=True)
class Case:
    name: str
    sqltype: str
    values: tuple[Any, ...]            # SQL expressions, or (session time zone, SQL expression)
    arrow: pa.DataType | None          # None: OTHER (string from text, binary from binary)
    check: str = "py"                  # how values are compared with the server, see _expected_sql
                                       # ("other": the output function's text, in both formats)
    array: bool = False
    sets: tuple[str, ...] = ("all",)   # pglogical replication sets ("fixed": readable in the internal form)


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _arr(sqltype: str, *elements: str | None) -> str:
    return "ARRAY[" + ", ".join("NULL" if e is None else e for e in elements) + f"]::{sqltype}"


ALL_BYTES = "decode('" + bytes(range(256)).hex() + "', 'hex')"
NINES = "9" * 38
TEXTS = ("''", _q("plain"), _q("ünïcödé ✓ 日本語 🎉 ﷽"), _q("quote ' and \\ backslash \" dq"), _q("tab\tnew\nline\r"),
         _q("{a,b} NULL \"x\""), "repeat('ab€', 3000)")
JSON_VALUES = (_q('{"a": [1, 2.5, null, true, false], "ü": "日本", "e": "\\u00e9\\n"}'), _q("[]"), _q('"\\ud83c\\udf89"'),
               _q(' {"spaces" :  1 , "dup": 1, "dup": 2} '), _q("null"), _q('{"n": {"deep": [{"x": {}}, [[-1e-5]]]}}'),
               _q("12345678901234567890.5"))
FIXED = ("all", "fixed")

CASES: tuple[Case, ...] = (
    Case("bool", "bool", ("true", "false"), pa.bool_(), sets=FIXED),
    Case("int2", "int2", ("-32768", "32767", "0", "1"), pa.int16(), sets=FIXED),
    Case("int4", "int4", ("-2147483648", "2147483647", "0"), pa.int32(), sets=FIXED),
    Case("int8", "int8", ("-9223372036854775808", "9223372036854775807", "0"), pa.int64(), sets=FIXED),
    # the text kernels' 64-bit fast path ends at 19 integer digits and 18 decimal digits: both sides of the edge
    Case("int8_edges", "int8", ("999999999999999999", "1000000000000000000", "-1000000000000000000",
                                "9223372036854775806", "-9223372036854775807", "4611686018427387904"),
         pa.int64(), sets=FIXED),
    Case("oid", "oid", ("0", "4294967295", "12345"), pa.uint32(), sets=FIXED),
    Case("float4", "float4", ("'NaN'", "'Infinity'", "'-Infinity'", "1.1", "-3.4028235e38", "1.4e-45", "0", "'-0'",
                              "3.14159", "1e-40"), pa.float32(), "f4", sets=FIXED),
    Case("float8", "float8", ("'NaN'", "'Infinity'", "'-Infinity'", "0.1", "1.7976931348623157e308", "5e-324",
                              "'-0'", "-2.5e-300", "123456789.123456789"), pa.float64(), sets=FIXED),
    Case("num_10_2", "numeric(10,2)", ("12345678.91", "-0.01", "0", "-99999999.99", "1.5"), DEC(10, 2)),
    Case("num_18_0", "numeric(18,0)", ("999999999999999999", "-999999999999999999", "100000000000000000"),
         DEC(18, 0)),
    Case("num_19_2", "numeric(19,2)", ("99999999999999999.99", "-10000000000000000.01", "0.01"), DEC(19, 2)),
    Case("num_20_4", "numeric(20,4)", ("9999999999999999.9999", "-1234567890123456.7891", "0.0001"), DEC(20, 4)),
    Case("num_38_0", "numeric(38,0)", (NINES, "-" + NINES, "0", "1"), DEC(38, 0)),
    Case("num_38_38", "numeric(38,38)", ("0." + NINES, "-0." + "0" * 37 + "1", "0"), DEC(38, 38)),
    Case("num_38_6", "numeric(38,6)", ("12345678901234567890123456789012.123456", "-0.000001", "10000"), DEC(38, 6)),
    Case("num_5_m2", "numeric(5,-2)", ("12345", "-9999949", "0", "50", "149"), DEC(7, 0)),
    Case("num_3_5", "numeric(3,5)", ("0.00123", "-0.00999", "0", "0.000015"), DEC(5, 5)),
    Case("num_39_2", "numeric(39,2)", ("1" * 37 + ".25", "-0.01", "0"), pa.string(), "text"),
    Case("num", "numeric", ("'NaN'", "'Infinity'", "'-Infinity'", "1234567890123456789012345678901234567890.0123456789",
                            "-0.000000000000000000000000000000000000000000001", "0", "1e100", "0.10", "-5",
                            "0.000", "10000.0001"), pa.string(), "text"),
    Case("text", "text", TEXTS, pa.string()),
    Case("varchar", "varchar(12)", (_q("héllo"), _q("trailing  "), "''"), pa.string()),
    Case("bpchar", "char(6)", (_q("ab"), _q("ab    "), _q("日本"), "''"), pa.string()),
    Case("name", "name", (_q("pg_catalog"), _q("ünï"), _q("x" * 63)), pa.string()),
    Case("char", '"char"', (_q("a"), _q("Z"), _q(" "), "''", _q("\\200"), _q("é"), _q("\\"), _q("\\377")),
         pa.string(), sets=FIXED),
    Case("bytea", "bytea", (ALL_BYTES, "''", "'\\x5c'::bytea", "'\\x00'::bytea", "'\\x5c30303127'::bytea"),
         pa.binary(), "bytes"),
    Case("date", "date", ("'2000-01-01'", "'1999-12-31'", "'1970-01-01'", "'0001-01-01'", "'9999-12-31'",
                          "'10000-01-01'", "'0044-03-15 BC'", "'4714-11-24 BC'", "'5874897-12-31'", "'infinity'",
                          "'-infinity'", "'2024-02-29'"), pa.date32(), "dt", sets=FIXED),
    Case("timestamp", "timestamp", ("'2000-01-01 00:00:00'", "'1999-12-31 23:59:59.999999'",
                                    "'1900-01-01 00:00:00.000001'", "'0001-01-01 00:00:00'",
                                    "'9999-12-31 23:59:59.999999'", "'10000-01-01 00:00:00'",
                                    "'0044-03-15 12:00:00 BC'", "'4714-11-24 00:00:00 BC'",
                                    "'294246-12-31 23:59:59.999999'", "'infinity'", "'-infinity'",
                                    "'2024-02-29 12:34:56.5'"), pa.timestamp("us"), "dt", sets=FIXED),
    Case("timestamptz", "timestamptz", (("UTC", "'2000-01-01 00:00:00'"), ("Asia/Kolkata", "'2024-06-01 12:00:00'"),
                                        ("America/St_Johns", "'1960-01-01 00:00:00'"),
                                        ("Asia/Kolkata", "'1850-06-01 12:00:00'"),
                                        ("Pacific/Chatham", "'2021-12-25 23:59:59.25'"),
                                        "'1999-12-31 23:59:59.999999+00'", "'0001-01-01 00:00:00+00'",
                                        "'9999-12-31 23:59:59.999999+00'", "'10000-01-01 00:00:00+00'",
                                        "'0044-03-15 12:00:00+00 BC'", "'4714-11-25 00:00:00+00 BC'",
                                        "'294246-12-31 23:59:59.999999+00'", "'infinity'", "'-infinity'",
                                        "'2024-03-10 02:30:00-03:00:15'"), pa.timestamp("us", tz="UTC"), "dt",
         sets=FIXED),
    Case("time", "time", ("'00:00:00'", "'23:59:59.999999'", "'24:00:00'", "'12:34:56.5'", "'00:00:00.000001'"),
         pa.time64("us"), "dt", sets=FIXED),
    Case("timetz", "timetz", ("'04:05:06.5+05:30'", "'00:00:00-03:00:15'", "'24:00:00+00'",
                              "'23:59:59.999999-15:59'", "'12:00:00+14'", "'12:00:00-15:59:59'"),
         pa.string(), "text"),
    Case("interval", "interval", ("'1 year 2 mons 3 days 04:05:06.789'", "'-1 years +2 mons -3 days +04:05:06'",
                                  "'178000000 years'", "'-178000000 years'", "'2147483647 days'",
                                  "'-2147483648 days'", "'2562047 hours 47 min 16.854775 sec'",
                                  "'-2562047:47:16.854775'", "'0'", "'1 mon -1 day 00:00:00.000001'",
                                  "'-00:00:00.000001'", "'-1 year -1 mon'"),
         pa.month_day_nano_interval(), "interval"),
    Case("uuid", "uuid", ("'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                          "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"), pa.binary(16), sets=FIXED),
    Case("json", "json", JSON_VALUES, pa.string(), "json"),
    Case("jsonb", "jsonb", JSON_VALUES, pa.string(), "json"),
    Case("xml", "xml", (_q("<a x='1'>ü &amp; 日本</a>"), _q("text only")), pa.string()),
    # 1-D arrays
    Case("a_int4", "int4[]", ("'{1,NULL,-3}'", "'{}'", "'{7,8,9}'", "'{2147483647,-2147483648}'",
                              "'{NULL}'"), pa.list_(pa.int32()), array=True),
    Case("a_int2", "int2[]", ("'{1,NULL,-32768}'",), pa.list_(pa.int16()), array=True),
    Case("a_int8", "int8[]", ("'{9223372036854775807,NULL}'", "'{5}'"), pa.list_(pa.int64()), array=True),
    Case("a_oid", "oid[]", ("'{4294967295,0,NULL}'",), pa.list_(pa.uint32()), array=True),
    Case("a_bool", "bool[]", ("'{t,f,NULL}'", "'{}'"), pa.list_(pa.bool_()), array=True),
    Case("a_float4", "float4[]", ("'{NaN,Infinity,-Infinity,1.1,NULL,-0}'",), pa.list_(pa.float32()), "f4",
         array=True),
    Case("a_float8", "float8[]", ("'{NaN,Infinity,-Infinity,0.1,NULL,5e-324}'",), pa.list_(pa.float64()),
         array=True),
    Case("a_num_10_2", "numeric(10,2)[]", ("'{1.5,-0.01,NULL,99999999.99}'", "'{}'"), pa.list_(DEC(10, 2)),
         array=True),
    Case("a_num", "numeric[]", ("'{NaN,Infinity,-Infinity,1e50,NULL,-0.5,0.000}'",), pa.list_(pa.string()), "text",
         array=True),
    Case("a_text", "text[]", (_arr("text[]", _q("a b"), _q('with "quote"'), _q("back\\slash"), _q("comma,brace}{"),
                                   None, _q("NULL"), _q(""), _q("ü日本🎉"), _q(" lead trail "), _q("null")),
                              "'{}'", "'{x,y}'", _arr("text[]", None, None)), pa.list_(pa.string()),
         array=True),
    Case("a_varchar", "varchar(5)[]", ("'{a,\"b c\",NULL}'",), pa.list_(pa.string()), array=True),
    Case("a_bpchar", "char(3)[]", ("'{a,\"b  \",NULL,日}'",), pa.list_(pa.string()), array=True),
    Case("a_name", "name[]", ("'{pg_class,\"a b\"}'",), pa.list_(pa.string()), array=True),
    Case("a_char", '"char"[]', (_arr('"char"[]', _q("a"), None, "''", _q("\\200"), _q("\\"), _q('"')),),
         pa.list_(pa.string()), array=True),
    Case("a_bytea", "bytea[]", (_arr("bytea[]", ALL_BYTES, None, "''::bytea", "'\\x5c22'::bytea"), "'{}'"),
         pa.list_(pa.binary()), "bytes", array=True),
    Case("a_date", "date[]", (_arr("date[]", "'2000-01-01'", None, "'infinity'", "'0044-03-15 BC'", "'9999-12-31'",
                                   "'-infinity'", "'5874897-12-31'"), "'{1999-01-01}'"),
         pa.list_(pa.date32()), "dt", array=True),
    Case("a_timestamp", "timestamp[]", (_arr("timestamp[]", "'2000-01-01 00:00:01.5'", None, "'infinity'",
                                             "'0044-03-15 12:00:00 BC'", "'-infinity'", "'1900-02-28 23:00:00'"),),
         pa.list_(pa.timestamp("us")), "dt", array=True),
    Case("a_timestamptz", "timestamptz[]", (_arr("timestamptz[]", "'2000-01-01 00:00:01.5+05:30'", None,
                                                 "'infinity'", "'0044-03-15 12:00:00+00 BC'",
                                                 "'1800-01-01 00:00:00+00'"),),
         pa.list_(pa.timestamp("us", tz="UTC")), "dt", array=True),
    Case("a_time", "time[]", ("'{00:00:00,24:00:00,NULL,12:00:00.5}'",), pa.list_(pa.time64("us")), "dt",
         array=True),
    Case("a_timetz", "timetz[]", ("'{04:05:06+05:30,NULL,00:00:00-03:00:15}'",), pa.list_(pa.string()), "text",
         array=True),
    Case("a_interval", "interval[]", (_arr("interval[]", "'1 year -2 days 00:00:01'", None,
                                           "'-00:00:00.000001'", "'-178000000 years'"), "'{}'"),
         pa.list_(pa.month_day_nano_interval()), "interval", array=True),
    Case("a_uuid", "uuid[]", ("'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'",), pa.list_(pa.binary(16)),
         array=True),
    Case("a_json", "json[]", (_arr("json[]", _q('{"a": "b,c}"}'), None, _q('"\\"q\\""')),), pa.list_(pa.string()),
         "text", array=True),
    Case("a_jsonb", "jsonb[]", (_arr("jsonb[]", _q('{"a": "b,c}", "ü": [1, {}]}'), None, _q("null")),),
         pa.list_(pa.string()), "text", array=True),
    # enums, domains (need the type catalog)
    Case("enum", "mood", ("'happy'", "'sad'", _q("ünï code"), _q("it's {x}")), pa.dictionary(pa.int32(), pa.string())),
    Case("a_enum", "mood[]", ("'{happy,NULL,\"ünï code\"}'", "'{}'"),
         pa.list_(pa.dictionary(pa.int32(), pa.string())), array=True),
    Case("dom_int4", "dom_int4", ("1", "2147483647"), pa.int32()),
    Case("dom_num", "dom_num", ("12345678.91", "-0.01"), DEC(10, 2)),
    Case("dom_text", "dom_text", (_q("ünï"), _q("x y")), pa.string()),
    # every other type: PostgreSQL's text in both formats (binary values rendered by spockwire.values.sendtext)
    Case("inet", "inet", ("'192.168.0.1/24'", "'::1'", "'::ffff:1.2.3.4/96'", "'2001:db8::1:0:0:1'"), STR, "other"),
    Case("cidr", "cidr", ("'10.0.0.0/8'", "'2001:db8::/32'"), STR, "other"),
    Case("macaddr", "macaddr", ("'08:00:2b:01:02:03'",), STR, "other"),
    Case("macaddr8", "macaddr8", ("'08:00:2b:01:02:03:04:05'",), STR, "other"),
    Case("money", "money", ("12.34", "-0.01", "'-92233720368547758.08'", "1234567.89"), STR, "other"),
    Case("bit", "bit(8)", ("B'10101010'",), STR, "other"),
    Case("varbit", "varbit", ("B'101'", "B''", "B'1111111100'"), STR, "other"),
    Case("int4range", "int4range", ("'[1,10)'", "'empty'", "'(,5]'", "'(,)'"), STR, "other"),
    Case("int8range", "int8range", ("'[-9223372036854775808,9223372036854775807)'",), STR, "other"),
    Case("numrange", "numrange", ("'[1.50,2.5]'", "'(,0)'"), STR, "other"),
    Case("tsrange", "tsrange", ("'[2020-01-01 00:00:00,2020-01-02 00:00:00.5)'", "'(0044-03-15 00:00:00 BC,)'"),
         STR, "other"),
    Case("tstzrange", "tstzrange", ("'[2020-01-01 00:00:00+05,infinity)'",
                                    "'(-infinity,0044-03-15 12:00:00.25+00 BC]'"), STR, "other"),
    Case("daterange", "daterange", ("'[2020-01-01,2020-03-01)'", "'empty'", "'[0044-03-15 BC,infinity)'",
                                    "'(-infinity,5874897-12-31)'"), STR, "other"),
    Case("int4multirange", "int4multirange", ("'{[1,3),[5,7)}'", "'{}'"), STR, "other"),
    Case("tstzmultirange", "tstzmultirange", ("'{[2020-01-01 00:00:00+00,2020-01-02 00:00:00+00)}'",), STR,
         "other"),
    Case("composite", "comp", ("ROW(1, 'x y')::comp", "ROW(NULL, '\"q\"')::comp", "ROW(2, '')::comp"), STR,
         "other"),
    Case("rich_comp", "rich", ("ROW('sad', ROW(1, 'a,b')::comp, ARRAY['x y', NULL], '10.0.0.1', "
                               "'[1,2)', 1.5, '2000-01-01 00:00:00+00', '\\x00ff')::rich",), STR, "other"),
    Case("a_comp", "comp[]", ("ARRAY[ROW(1, 'a b')::comp, NULL, ROW(NULL, NULL)::comp]",), STR, "other"),
    Case("dom_inet", "dom_inet", ("'10.1.2.3/16'",), STR, "other"),
    Case("point", "point", ("'(1.5,-2)'", "'(0.1,1e300)'"), STR, "other"),
    Case("line", "line", ("'{1,-1,0.5}'",), STR, "other"),
    Case("lseg", "lseg", ("'[(1,2),(3,4)]'",), STR, "other"),
    Case("box", "box", ("'(3,4),(1,2)'",), STR, "other"),
    Case("path", "path", ("'[(1,2),(3,4)]'", "'((0,0),(1,1),(2,0))'"), STR, "other"),
    Case("polygon", "polygon", ("'((0,0),(1,1),(2,0))'",), STR, "other"),
    Case("circle", "circle", ("'<(1,2),3.5>'",), STR, "other"),
    Case("pg_lsn", "pg_lsn", ("'16/B374D848'", "'0/0'"), STR, "other"),
    Case("tsvector", "tsvector", (_q("a:1A b:2,3 'it''s':4"),), STR, "other"),
    Case("tsquery", "tsquery", ("'(a | b) & !c <-> d:*'",), STR, "other"),
    Case("xid", "xid", ("'4294967295'",), STR, "other"),
    Case("xid8", "xid8", ("'18446744073709551615'",), STR, "other"),
    Case("cid", "cid", ("'7'",), STR, "other"),
    Case("tid", "tid", ("'(4294967295,65535)'",), STR, "other"),
    Case("jsonpath", "jsonpath", ("'$.a[*] ? (@ > 1)'",), STR, "other"),
    Case("oidvector", "oidvector", ("'23 25'",), STR, "other"),
    Case("int2vector", "int2vector", ("'1 2 3'",), STR, "other"),
    Case("snapshot", "pg_snapshot", ("'10:20:10,14,15'",), STR, "other"),
    Case("txid_snapshot", "txid_snapshot", ("'10:20:'",), STR, "other"),
    Case("a_inet", "inet[]", ("'{1.2.3.4,NULL,::1}'", "'[0:1]={10.0.0.1/8,::2}'"), STR, "other"),
    Case("a_int4range", "int4range[]", ("'{\"[1,2)\",empty,NULL}'",), STR, "other"),
    Case("a_money", "money[]", ("'{1.5,-2}'",), STR, "other"),
    Case("a_box", "box[]", ("'{(3,4),(1,2);(1,1),(0,0)}'",), STR, "other"),
    Case("a2_macaddr", "macaddr[]", ("'{{08:00:2b:01:02:03,NULL},{08:00:2b:01:02:04,08:00:2b:01:02:05}}'",), STR,
         "other"),
)
CASE_BY_NAME = {c.name: c for c in CASES}

# values that have no form in their Arrow type (or a typed column): each in a table and publication of its own
ERROR_CASES = {
    "err_md_int4": ("int4[]", "'{{1,2},{3,4}}'", "multi-dimensional"),
    "err_md_text": ("text[]", "'[0:1][1:2]={{a,b},{c,\"d e\"}}'", "multi-dimensional"),
    "err_num_nan": ("numeric(10,2)", "'NaN'", "NaN or infinite value"),
    "err_ts_far": ("timestamp", "'294276-12-31 23:59:59.999999'", "out of range"),
    "err_tstz_far": ("timestamptz", "'294276-12-31 23:59:59.999999+00'", "out of range"),
    "err_iv_big": ("interval", "'2562048 hours'", "out of range"),
    "err_lb_int4": ("int4[]", "'[0:2]={7,8,9}'", "lower bound other than 1"),
    "err_lb_text": ("text[]", "'[-5:-4]={x,\"y z\"}'", "lower bound other than 1"),
}

TEXT_SESSIONS = (("UTC", "hex"), ("Asia/Kolkata", "escape"), ("America/St_Johns", "hex"), ("Pacific/Chatham", "escape"))
PGOUTPUT_TEXT = {"proto_version": "1", "publication_names": "pub_main"}
PGOUTPUT_BINARY = dict(PGOUTPUT_TEXT, binary="true")
PGL_BASE = {"startup_params_format": "1", "min_proto_version": "1", "max_proto_version": "1",
            "pglogical.replication_set_names": "tv_all"}
PGL_BINARY = dict(PGL_BASE, **{"binary.want_binary_basetypes": "1", "binary.basetypes_major_version": "1500"})
PGL_INTERNAL = dict(PGL_BINARY, **{"binary.want_internal_basetypes": "1"})

SCHEMA = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'ünï code', 'it''s {x}');
CREATE DOMAIN dom_int4 AS int4 CHECK (VALUE > 0);
CREATE DOMAIN dom_num AS numeric(10,2);
CREATE DOMAIN dom_text AS text;
CREATE TYPE comp AS (a int, b text);
CREATE DOMAIN dom_inet AS inet;
CREATE TYPE rich AS (m mood, c comp, t text[], i dom_inet, r int4range, f float8, ts timestamptz, b bytea);
"""


def _flatten(options: dict[str, str]) -> list[str]:
    return [x for kv in options.items() for x in kv]


# ---------------------------------------------------------------------------------------------------------------
# the session dataset

@dataclass
class Dataset:
    db: PgDatabase
    streams: dict[str, tuple[str, list[tuple[int, bytes]]]] = field(default_factory=dict)  # name -> (protocol, frames)
    expected: dict[str, list[tuple]] = field(default_factory=dict)     # case -> rows of (id, py, text, extra)
    catalog: Any = None
    _decoded: dict[tuple, Any] = field(default_factory=dict)

    def decode(self, impl_name: str, stream: str, *, catalog: bool = True, **kwargs: Any) -> dict[str, "Decoded"]:
        """{table name: Decoded} of one stream, decoded once per (implementation, stream, options)."""
        key = (impl_name, stream, catalog, tuple(sorted(kwargs.items())))
        if key not in self._decoded:
            protocol, frames = self.streams[stream]
            dec = load_impl(impl_name).Decoder(protocol=protocol, type_catalog=self.catalog if catalog else None,
                                               **kwargs)
            for lsn, payload in frames:
                dec.feed(payload, lsn)
            self._decoded[key] = _collect(dec.drain())
        return self._decoded[key]


@dataclass
class Decoded:
    batches: list[pa.RecordBatch]
    rows: list[dict[str, Any]]

    @property
    def column(self) -> pa.Array:
        return pa.concat_arrays([b.column(b.schema.get_field_index("v")) for b in self.batches])


def _collect(events: list[Any]) -> dict[str, Decoded]:
    out: dict[str, Decoded] = {}
    for ev in events:
        if not hasattr(ev, "to_arrow"):
            continue
        got = out.setdefault(ev.relation.name, Decoded([], []))
        got.batches.append(ev.to_arrow())
        got.rows.extend(ev.to_pylist())
    return out


def _insert_sql(table: str, values: tuple[Any, ...]) -> str:
    stmts = []
    for i, value in enumerate(values, start=1):
        tz, expr = value if isinstance(value, tuple) else (None, value)
        if tz:
            stmts.append(f"SET TimeZone = {_q(tz)}")
        stmts.append(f"INSERT INTO {table} VALUES ({i}, {expr})")
        if tz:
            stmts.append("RESET TimeZone")
    stmts.append(f"INSERT INTO {table} VALUES ({len(values) + 1}, NULL)")
    return ";\n".join(stmts)


def _accepts_xml(db: PgDatabase) -> bool:
    import psycopg2

    try:
        db.query("SELECT '<a/>'::xml")
    except psycopg2.errors.FeatureNotSupported:
        return False
    return True


#: fixtures of this module that reach a server dynamically (tests/conftest.py marks the tests using them `pg`);
#: `dataset` is tests/typed_dataset.py's (one per server and test process, shared with tests/test_json_protocol.py)
SERVER_FIXTURES = frozenset({"dataset"})


def _in_range(case: Case, e: str) -> str:
    base = case.sqltype.rstrip("[]")
    if base == "time":
        return f"{e} < '24:00:00'"
    lo, hi = {"date": ("'0001-01-01'", "'9999-12-31'"),
              "timestamp": ("'0001-01-01'", "'9999-12-31 23:59:59.999999'"),
              "timestamptz": ("'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'")}[base]
    return f"isfinite({e}) AND {e} BETWEEN {lo} AND {hi}"


def _elements(case: Case, expr: str, typ: str) -> str:
    """An array with `expr` applied to every element e of v (NULL when v is)."""
    return (f"CASE WHEN v IS NOT NULL THEN ARRAY(SELECT {expr} FROM unnest(v) WITH ORDINALITY u(e, o) "
            f"ORDER BY o)::{typ} END")


def _expected_sql(case: Case, cur: Any) -> str:
    """Select list after id: (python value, text, extra) of v.

    py: v as psycopg2 reads it; dt: v where Python can hold it, else NULL (compared via the text);
    interval: [months, days, µs]; other: the text and the send() bytes.
    """
    text = "v::text[]" if case.array else "v::text"
    if case.check == "dt":
        if case.array:
            py = _elements(case, f"CASE WHEN {_in_range(case, 'e')} THEN e END", case.sqltype)
        else:
            py = f"CASE WHEN {_in_range(case, 'v')} THEN v END"
    elif case.check == "interval":
        triple = ("ARRAY[(extract(year from {0}) * 12 + extract(month from {0}))::int8, extract(day from {0})::int8, "
                  "(extract(hour from {0}) * 3600000000 + extract(minute from {0}) * 60000000 "
                  "+ extract(microseconds from {0}))::int8]")
        py = _elements(case, triple.format("e"), "int8[]") if case.array else triple.format("v")
    elif case.check == "other":
        py = "NULL"                                            # compared through the text only
    else:
        py = "v::text[]" if case.name == "a_enum" else "v"    # psycopg2 reads no enum arrays
    extra = "NULL"
    if case.check == "other":
        # the output function's text (a cast to text can differ: inet '::1' casts to '::1/128') and send bytes
        cur.execute("SELECT typoutput::regproc::text, typsend::regproc::text FROM pg_type WHERE oid = %s::regtype",
                    (case.sqltype,))
        out, send = cur.fetchone()
        text, extra = f"{out}(v)::text", f"{send}(v)"
    return f"{py}, {text}, {extra}"


# ---------------------------------------------------------------------------------------------------------------
# comparison helpers

def _canon(v: Any) -> Any:
    """NaN made comparable; lists and dicts walked."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and v == 0:
        return ("zero", math.copysign(1, v))
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    return v


def _f32(v: float) -> float:
    return struct.unpack(">f", struct.pack(">f", v))[0]


def assert_same_array(a: pa.Array, b: pa.Array, where: str) -> None:
    """Same type and same values (NaN equal to NaN, -0.0 distinct from 0.0)."""
    assert a.type == b.type, f"{where}: {a.type} != {b.type}"
    assert len(a) == len(b), where
    if a.equals(b):
        return
    assert _canon(_storage(a)) == _canon(_storage(b)), where


def _storage_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(_storage_type(t.value_type))
    return t


def _storage(a: pa.Array) -> list[Any]:
    """Values as stored (dates/timestamps/times as integers), so every value converts to Python."""
    t = _storage_type(a.type)
    return (a.cast(t) if t != a.type else a).to_pylist()


def _compare_element(case: Case, got: Any, py: Any, text: Any, where: str) -> None:
    base = case.sqltype.rstrip("[]")
    if case.check in ("text", "other"):
        assert got == text, where
    elif case.check == "json":
        assert got == text, where
        assert got is None or json.loads(got) == py, where
    elif case.check == "dt":
        if isinstance(got, PgInfinity):                # ±infinity: spockwire.INFINITY / NEG_INFINITY
            assert str(got) == text and py is None, where
        elif isinstance(got, str):
            assert got == text and py is None, where
        else:
            assert got == py, where
    elif case.check == "interval":
        if got is None:
            assert py is None or py == [None, None, None], where
        else:
            assert (got.months, got.days, got.nanoseconds) == (py[0], py[1], py[2] * 1000), where
    elif case.check == "bytes":
        assert got == (None if py is None else bytes(py)), where
    elif case.check == "f4":
        assert _canon(got) == _canon(None if py is None else _f32(py)), where
    elif base == "uuid" or case.name in ("enum", "a_enum", "dom_int4", "dom_num", "dom_text"):
        assert got == py, where
    else:
        assert _canon(got) == _canon(py), where


def assert_matches_server(case: Case, rows: list[dict[str, Any]], expected: list[tuple], where: str) -> None:
    got = sorted(rows, key=lambda r: r["id"])
    assert [r["id"] for r in got] == [e[0] for e in expected], where
    for row, (ident, py, text, _extra) in zip(got, expected):
        value = row["v"]
        at = f"{where} id={ident}: got {value!r}, server {py!r} / {text!r}"
        if case.array and case.check != "other" and value is not None:
            assert isinstance(value, list) and len(value) == len(py) == len(text), at
            for g, p, t in zip(value, py, text):
                _compare_element(case, g, p, t, at)
        else:
            assert (value is None) == (text is None), at
            _compare_element(case, value, py, text, at)


def server_expected(cur: Any, cases: Sequence[Case]) -> dict[str, list[tuple]]:
    """Each case table's rows as the server gives them (its Python values and its text, in UTC): the oracle."""
    import psycopg2.extras

    cur.execute("SET TimeZone = 'UTC'")
    psycopg2.extras.register_uuid(conn_or_curs=cur)
    expected = {}
    for case in cases:
        cur.execute(f"SELECT id, {_expected_sql(case, cur)} FROM t_{case.name} ORDER BY id")
        expected[case.name] = cur.fetchall()
    return expected


def assert_events_match_server(events: Sequence[Any], cases: Sequence[Case], expected: dict[str, list[tuple]],
                               label: str) -> None:
    """Decoded change batches of the case tables hold exactly the server's values, in the mapped Arrow types."""
    by_table: dict[str, list] = {}
    arrays: dict[str, Any] = {}
    for ev in events:
        if hasattr(ev, "to_arrow"):
            by_table.setdefault(ev.relation.name, []).extend(ev.to_pylist())
            arrays[ev.relation.name] = ev.to_arrow().column("v").type
    assert set(by_table) == {f"t_{c.name}" for c in cases}
    for case in cases:
        where = f"{label} {case.name}"
        rows = by_table[f"t_{case.name}"]
        if case.arrow is None:   # OTHER: the output function's text in both formats
            assert arrays[f"t_{case.name}"] == pa.string(), where
            got = [r["v"] for r in sorted(rows, key=lambda r: r["id"])]
            assert got == [e[2] for e in expected[case.name]], where
            continue
        assert arrays[f"t_{case.name}"] == case.arrow, where
        assert_matches_server(case, rows, expected[case.name], where)


TYPED = [c for c in CASES if c.arrow is not None]
IMPLS = ("c", "python")


# ---------------------------------------------------------------------------------------------------------------
# pgoutput: text and binary, both implementations

@pytest.fixture(params=IMPLS)
def impl_name(request) -> str:
    return request.param


def test_arrow_types_follow_the_mapping_table(dataset: Dataset, impl_name: str) -> None:
    for stream in ("text_UTC_hex", "binary"):
        decoded = dataset.decode(impl_name, stream)
        for case in CASES:
            got = decoded[f"t_{case.name}"].column.type
            if case.arrow is None:
                assert got == (pa.string() if stream.startswith("text") else pa.binary()), (stream, case.name)
            else:
                assert got == case.arrow, (stream, case.name)


def test_text_and_binary_decode_to_identical_arrays(dataset: Dataset, impl_name: str) -> None:
    binary = dataset.decode(impl_name, "binary")
    for tz, bytea_output in TEXT_SESSIONS:
        stream = f"text_{tz}_{bytea_output}"
        text = dataset.decode(impl_name, stream)
        for case in TYPED:
            if case.check == "other" and stream != "text_UTC_hex":
                continue   # their text may depend on TimeZone / bytea_output: spockwire pins UTC and hex
            assert_same_array(text[f"t_{case.name}"].column, binary[f"t_{case.name}"].column,
                              f"{stream} vs binary, {case.name}")


@pytest.mark.parametrize("stream", ["text_UTC_hex", "text_Asia/Kolkata_escape", "binary"])
def test_values_match_the_server(dataset: Dataset, impl_name: str, stream: str) -> None:
    decoded = dataset.decode(impl_name, stream)
    for case in TYPED:
        if case.check == "other" and stream == "text_Asia/Kolkata_escape":
            continue
        assert_matches_server(case, decoded[f"t_{case.name}"].rows, dataset.expected[case.name],
                              f"{impl_name} {stream} {case.name}")


def test_other_types_are_the_servers_text_in_both_formats(dataset: Dataset, impl_name: str) -> None:
    """Types without an Arrow kind of their own: text and binary both give the output function's text (the
    server's, selected with the session settings spockwire pins: TimeZone UTC, bytea_output hex)."""
    text = dataset.decode(impl_name, "text_UTC_hex")
    binary = dataset.decode(impl_name, "binary")
    others = [c for c in CASES if c.check == "other"]
    assert len(others) > 40
    for case in others:
        expected = [e[2] for e in dataset.expected[case.name]]
        for stream in (text, binary):
            assert stream[f"t_{case.name}"].column.type == pa.string(), case.name
            got = [r["v"] for r in sorted(stream[f"t_{case.name}"].rows, key=lambda r: r["id"])]
            assert got == expected, case.name


def test_c_and_python_agree_exactly(dataset: Dataset) -> None:
    for stream in dataset.streams:
        if stream.startswith("err_") or stream == "pgl_internal_all":
            continue
        c, py = dataset.decode("c", stream), dataset.decode("python", stream)
        assert c.keys() == py.keys(), stream
        for table in c:
            assert len(c[table].batches) == len(py[table].batches), (stream, table)
            for bc, bp in zip(c[table].batches, py[table].batches):
                assert bc.schema == bp.schema, (stream, table)
                for i, name in enumerate(bc.schema.names):
                    assert_same_array(bc.column(i), bp.column(i), f"{stream} {table}.{name}")
            assert _canon(c[table].rows) == _canon(py[table].rows), (stream, table)


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_values_without_an_arrow_form_are_clear_errors(dataset: Dataset, impl_name: str, name: str,
                                                       fmt: str) -> None:
    _sqltype, _value, message = ERROR_CASES[name]
    with pytest.raises(ProtocolError, match=message) as info:
        dataset.decode(impl_name, f"{name}_{fmt}", on_unrepresentable="error")
    assert info.value.column_name == "v"
    if name != "err_num_nan":
        return
    # numeric="text" keeps NaN as PostgreSQL's text
    decoded = dataset.decode(impl_name, f"{name}_{fmt}", numeric="text", on_unrepresentable="error")
    assert [r["v"] for r in decoded[name].rows] == ["NaN", None]


def test_both_implementations_raise_the_same_error(dataset: Dataset) -> None:
    for name in ERROR_CASES:
        for fmt in ("text", "binary"):
            errors = []
            for impl_name in IMPLS:
                with pytest.raises(ProtocolError) as info:
                    dataset.decode(impl_name, f"{name}_{fmt}", on_unrepresentable="error")
                errors.append((type(info.value), str(info.value), info.value.offset, info.value.column))
            assert errors[0] == errors[1], (name, fmt)


def test_enums_and_domains_without_a_catalog(dataset: Dataset, impl_name: str) -> None:
    text = dataset.decode(impl_name, "text_UTC_hex", catalog=False)
    binary = dataset.decode(impl_name, "binary", catalog=False)
    labels = [e[2] for e in dataset.expected["enum"]]
    # pgoutput names an enum by itself only: its values stay as they arrived
    assert text["t_enum"].column.type == pa.string()
    assert [r["v"] for r in text["t_enum"].rows] == labels
    assert binary["t_enum"].column.type == pa.binary()
    assert [r["v"] for r in binary["t_enum"].rows] == [None if x is None else x.encode() for x in labels]
    # a domain is named by its base type; its base type modifier is in the catalog only
    for stream in (text, binary):
        assert stream["t_dom_int4"].column.type == pa.int32()
        assert [r["v"] for r in stream["t_dom_int4"].rows] == [1, 2147483647, None]
        assert stream["t_dom_num"].column.type == pa.string()
        assert [r["v"] for r in stream["t_dom_num"].rows] == ["12345678.91", "-0.01", None]
        assert [r["v"] for r in stream["t_dom_text"].rows] == ["ünï", "x y", None]


def test_numeric_text_option(dataset: Dataset, impl_name: str) -> None:
    text = dataset.decode(impl_name, "text_UTC_hex", numeric="text")
    binary = dataset.decode(impl_name, "binary", numeric="text")
    for case in CASES:
        if not case.name.startswith(("num", "a_num", "dom_num")):
            continue
        assert_same_array(text[f"t_{case.name}"].column, binary[f"t_{case.name}"].column, case.name)
        expected = [e[2] for e in dataset.expected[case.name]]
        assert [r["v"] for r in binary[f"t_{case.name}"].rows] == expected, case.name


# ---------------------------------------------------------------------------------------------------------------
# pglogical: no types on the wire, so a PostgresTypeCatalog gives them

@pytest.mark.parametrize("stream", ["pgl_binary", "pgl_text", "pgl_internal_fixed"])
@pytest.mark.parametrize("dataset", ["pg15"], indirect=True)
def test_pglogical_with_a_catalog_matches_pgoutput(dataset: Dataset, impl_name: str, stream: str) -> None:
    pgl = dataset.decode(impl_name, stream)
    reference = dataset.decode(impl_name, "text_UTC_hex")
    cases = [c for c in CASES if (stream != "pgl_internal_fixed" or "fixed" in c.sets)]
    assert set(pgl) == {f"t_{c.name}" for c in cases}
    for case in cases:
        got, ref = pgl[f"t_{case.name}"].column, reference[f"t_{case.name}"].column
        if case.arrow is None:
            assert got.type in (pa.string(), pa.binary()), case.name
            continue
        assert_same_array(got, ref, f"{stream} {case.name}")
        assert_matches_server(case, pgl[f"t_{case.name}"].rows, dataset.expected[case.name], f"{stream} {case.name}")


@pytest.mark.parametrize("dataset", ["pg15"], indirect=True)
def test_pglogical_internal_format_decodes_every_type(dataset: Dataset, impl_name: str) -> None:
    """The whole internal-format stream decodes to what pgoutput's text gives: varlena datums with 1- and 4-byte
    headers, numeric, interval, timetz, jsonb, tsvector, tsquery, jsonpath and the types kept as text."""
    internal = dataset.decode(impl_name, "pgl_internal_all")
    reference = dataset.decode(impl_name, "text_UTC_hex")
    assert set(internal) == {f"t_{c.name}" for c in CASES}
    for table, got in internal.items():
        case = CASE_BY_NAME[table[2:]]
        if case.arrow is not None:
            assert_same_array(got.column, reference[table].column, f"internal {table}")
            assert_matches_server(case, got.rows, dataset.expected[case.name], f"internal {table}")
        else:   # OTHER: as it arrived ('b' for these types), like the binary stream
            assert got.column.type in (pa.string(), pa.binary()), f"internal {table}"


@pytest.mark.parametrize("dataset", ["pg15"], indirect=True)
def test_pglogical_without_a_catalog_is_raw(dataset: Dataset, impl_name: str) -> None:
    decoded = dataset.decode(impl_name, "pgl_text", catalog=False)
    assert decoded["t_int4"].column.type == pa.string()
    assert [r["v"] for r in decoded["t_int4"].rows] == ["-2147483648", "2147483647", "0", None]


# ---------------------------------------------------------------------------------------------------------------
# hypothesis: the binary formats, encoded here from PostgreSQL's send functions (tests/pg_send.py)

HYPO = dict(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TEXT_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
JSON_DOCS = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20) | TEXT_VALUES
                         | st.floats(allow_nan=False, allow_infinity=False),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT_VALUES, inner, max_size=4),
                         max_leaves=12)


@dataclass(frozen=True)
class BinType:
    """One column type of a generated stream: OID, type modifier and values as (send bytes, expected storage)."""
    name: str
    oid: int
    typmod: int
    arrow: pa.DataType
    values: st.SearchStrategy


def _fixed(name: str, oid: int, arrow: pa.DataType, strategy: st.SearchStrategy, send: Callable[[Any], bytes],
           expect: Callable[[Any], Any] = lambda v: v) -> BinType:
    return BinType(name, oid, -1, arrow, strategy.map(lambda v: (send(v), expect(v))))


def _date_expect(days: int) -> int:
    return days if days in (S.INT32_MAX, S.INT32_MIN) else days + S.PG_EPOCH_DAYS


def _ts_expect(us: int) -> int:
    return us if us in (S.INT64_MAX, S.INT64_MIN) else us + S.PG_EPOCH_US


NANOS_US = S.INT64_MAX // 1000           # the largest |µs| whose nanoseconds fit month_day_nano_interval
SCALAR_TYPES = [
    _fixed("bool", 16, pa.bool_(), st.booleans(), S.bool_send),
    _fixed("int2", 21, pa.int16(), st.integers(-2**15, 2**15 - 1), S.int2_send),
    _fixed("int4", 23, pa.int32(), st.integers(-2**31, 2**31 - 1), S.int4_send),
    _fixed("int8", 20, pa.int64(), st.integers(-2**63, 2**63 - 1), S.int8_send),
    _fixed("oid", 26, pa.uint32(), st.integers(0, 2**32 - 1), S.oid_send),
    _fixed("float4", 700, pa.float32(), st.floats(width=32), S.float4_send),
    _fixed("float8", 701, pa.float64(), st.floats(), S.float8_send),
    _fixed("text", 25, pa.string(), TEXT_VALUES, S.text_send),
    _fixed("varchar", 1043, pa.string(), TEXT_VALUES, S.text_send),
    _fixed("bpchar", 1042, pa.string(), TEXT_VALUES, S.text_send),
    _fixed("name", 19, pa.string(), TEXT_VALUES, S.text_send),
    _fixed("bytea", 17, pa.binary(), st.binary(max_size=40), S.bytea_send),
    _fixed("json", 114, pa.string(), JSON_DOCS, S.json_send, lambda v: S.json_send(v).decode()),
    _fixed("jsonb", 3802, pa.string(), JSON_DOCS, S.jsonb_send, lambda v: S.json_send(v).decode()),
    _fixed("uuid", 2950, pa.binary(16), st.binary(min_size=16, max_size=16), S.uuid_send),
    _fixed("date", 1082, pa.date32(), st.integers(S.DATE_MIN, S.DATE_MAX) | st.sampled_from([S.INT32_MAX, S.INT32_MIN]),
           S.date_send, _date_expect),
    _fixed("timestamp", 1114, pa.timestamp("us"),
           st.integers(S.TS_MIN, S.INT64_MAX - S.PG_EPOCH_US - 1) | st.sampled_from([S.INT64_MAX, S.INT64_MIN]),
           S.timestamp_send, _ts_expect),
    _fixed("timestamptz", 1184, pa.timestamp("us", tz="UTC"),
           st.integers(S.TS_MIN, S.INT64_MAX - S.PG_EPOCH_US - 1) | st.sampled_from([S.INT64_MAX, S.INT64_MIN]),
           S.timestamp_send, _ts_expect),
    _fixed("time", 1083, pa.time64("us"), st.integers(0, 86_400_000_000), S.time_send),
    _fixed("timetz", 1266, pa.string(), st.tuples(st.integers(0, 86_400_000_000), st.integers(-57599, 57599)),
           lambda v: S.timetz_send(*v), lambda v: S.timetz_text(*v)),
    _fixed("interval", 1186, pa.month_day_nano_interval(),
           st.tuples(st.integers(-NANOS_US, NANOS_US), st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)),
           lambda v: S.interval_send(*v), lambda v: (v[2], v[1], v[0] * 1000)),
]
ARRAY_OIDS = {16: 1000, 17: 1001, 19: 1003, 20: 1016, 21: 1005, 23: 1007, 25: 1009, 26: 1028, 114: 199, 700: 1021,
              701: 1022, 1042: 1014, 1043: 1015, 1082: 1182, 1083: 1183, 1114: 1115, 1184: 1185, 1186: 1187,
              1266: 1270, 1700: 1231, 2950: 2951, 3802: 3807}


@st.composite
def numeric_type(draw) -> BinType:
    """numeric(p,s) with any p <= 38 and s from -10 to p+10 (decimal128, or text past 38 digits), or numeric."""
    if draw(st.booleans()):
        def plain(v):
            if isinstance(v, str):
                return S.numeric_send(v), v
            unscaled, dscale = v
            return S.numeric_send(unscaled, dscale), S.numeric_text(unscaled, dscale)
        values = st.sampled_from(["NaN", "Infinity", "-Infinity"]) | st.tuples(
            st.integers(-10**60, 10**60), st.integers(0, 30))
        return BinType("numeric", 1700, -1, pa.string(), values.map(plain))
    p = draw(st.integers(1, 38))
    s = draw(st.integers(-10, p + 10))
    arrow_p = p - s if s < 0 else max(p, s)

    def constrained(k: int):
        if s >= 0:
            send = S.numeric_send(k, s)
        else:
            send = S.numeric_send(k * 10 ** -s, 0)
        if arrow_p > 38:
            return send, S.numeric_text(k * 10 ** max(-s, 0), max(s, 0))
        return send, Decimal(f"{k}E{-s}")       # exact (Decimal arithmetic would round to 28 digits)
    arrow = pa.string() if arrow_p > 38 else DEC(arrow_p, max(s, 0))
    return BinType(f"numeric({p},{s})", 1700, S.numeric_typmod(p, s), arrow,
                   st.integers(-10**p + 1, 10**p - 1).map(constrained))


@st.composite
def array_type(draw) -> BinType:
    elem = draw(st.sampled_from(SCALAR_TYPES) | numeric_type())
    lower = 1     # other lower bounds have no list form: the column becomes text (tests/test_unrepresentable.py)

    def encode(items):
        return (S.array_send(elem.oid, [None if v is None else v[0] for v in items], lower),
                [None if v is None else v[1] for v in items])
    return BinType(elem.name + "[]", ARRAY_OIDS[elem.oid], elem.typmod, pa.list_(elem.arrow),
                   st.lists(st.none() | elem.values, max_size=6).map(encode))


def _stream(columns: list[BinType], rows: list[list[Any]]) -> list[tuple[int, bytes]]:
    relid, lsn = 16500, 0x1000
    msgs = [W.pgoutput("B", final_lsn=lsn + 100, commit_ts=0, xid=900),
            W.pgoutput("R", relid=relid, namespace="public", name="h", replident="d",
                       columns=[Col("id", 23, -1, key=True)] + [Col(f"c{i}", t.oid, t.typmod)
                                                                for i, t in enumerate(columns)])]
    for i, row in enumerate(rows):
        msgs.append(W.pgoutput("I", relid=relid, new=[S.int4_send(i)] + [None if v is None else v[0] for v in row]))
    msgs.append(W.pgoutput("C", commit_lsn=lsn + 100, end_lsn=lsn + 101, commit_ts=0))
    return [(lsn + i, m) for i, m in enumerate(msgs)]


def _decode_frames(impl_name: str, frames: list[tuple[int, bytes]]) -> pa.RecordBatch:
    dec = load_impl(impl_name).Decoder(protocol="pgoutput")
    for lsn, payload in frames:
        dec.feed(payload, lsn)
    (batch,) = [ev for ev in dec.drain() if hasattr(ev, "to_arrow")]
    return batch.to_arrow()


@st.composite
def generated_table(draw):
    columns = draw(st.lists(st.sampled_from(SCALAR_TYPES) | numeric_type() | array_type(), min_size=1, max_size=5))
    rows = draw(st.lists(st.tuples(*[st.none() | c.values for c in columns]).map(list), min_size=1, max_size=4))
    return columns, rows


@settings(**HYPO)
@given(generated_table())
def test_binary_round_trip(table) -> None:
    columns, rows = table
    frames = _stream(columns, rows)
    batches = {name: _decode_frames(name, frames) for name in IMPLS}
    for name, rb in batches.items():
        for i, col in enumerate(columns):
            got = rb.column(rb.schema.get_field_index(f"c{i}"))
            assert got.type == col.arrow, (name, col.name)
            expected = [None if row[i] is None else row[i][1] for row in rows]
            assert _canon(_storage(got)) == _canon(expected), (name, col.name)
    for i in range(batches["c"].num_columns):
        assert_same_array(batches["c"].column(i), batches["python"].column(i), batches["c"].schema.names[i])


@settings(**HYPO)
@given(kind=st.sampled_from([("date", 1082, 4), ("timestamp", 1114, 8), ("timestamptz", 1184, 8),
                             ("interval", 1186, 16), ("time", 1083, 8), ("timetz", 1266, 12)]),
       raw=st.binary(min_size=16, max_size=16))
def test_binary_edges_decode_or_fail_alike(kind, raw) -> None:
    """Any bytes of the right size decode the same in both implementations, or fail with the same error."""
    name, oid, size = kind
    frames = _stream([BinType(name, oid, -1, pa.null(), st.nothing())], [[(raw[:size], None)]])
    outcomes = []
    for impl_name in IMPLS:
        try:
            rb = _decode_frames(impl_name, frames)
            outcomes.append(("ok", _canon(_storage(rb.column(rb.schema.get_field_index("c0"))))))
        except ProtocolError as exc:
            outcomes.append(("error", str(exc), exc.offset))
    assert outcomes[0] == outcomes[1]


# ---------------------------------------------------------------------------------------------------------------
# regressions (no server needed)

def _one_column(impl: Any, protocol: str, oid_or_type: Any, values: list[Any], **kwargs: Any) -> Any:
    """Decode inserts of `values` into a one-column table; the ChangeBatch."""
    dec = impl.Decoder(protocol=protocol, **kwargs)
    if protocol == "pgoutput":
        msgs = [W.pgoutput("B", final_lsn=0x2000, commit_ts=0, xid=7),
                W.pgoutput("R", relid=9, namespace="public", name="h", replident="d", columns=[Col("v", oid_or_type)])]
        msgs += [W.pgoutput("I", relid=9, new=[v]) for v in values]
        msgs.append(W.pgoutput("C", commit_lsn=0x2000, end_lsn=0x2001, commit_ts=0))
    else:
        msgs = [W.pglogical("B", final_lsn=0x2000, commit_ts=0, xid=7),
                W.pglogical("R", relid=9, namespace="public", name="h", columns=[Col("v")])]
        msgs += [W.pglogical("I", relid=9, new=[v]) for v in values]
        msgs.append(W.pglogical("C", commit_lsn=0x2000, end_lsn=0x2001, commit_ts=0))
    for i, m in enumerate(msgs):
        dec.feed(m, 0x1000 + i)
    (batch,) = [ev for ev in dec.drain() if hasattr(ev, "to_arrow")]
    return batch


@pytest.mark.parametrize("text, expected", [
    ("04:05:06.789", (0, 0, 14_706_789_000_000)),
    ("1 day 00:00:00.5", (0, 1, 500_000_000)),
    ("-1 years +2 mons -00:00:00.000001", (-10, 0, -1000)),
    ("12:00:00.123456", (0, 0, 43_200_123_456_000)),
])
def test_text_interval_fraction(impl: Any, text: str, expected: tuple[int, int, int]) -> None:
    """The C kernel skipped the first digit of an interval's fraction of a second ('.789' read as '.89')."""
    got = _one_column(impl, "pgoutput", 1186, [text]).to_arrow().column(7)[0].as_py()
    assert (got.months, got.days, got.nanoseconds) == expected


def test_bc_dates_and_timestamps_to_pylist(impl: Any) -> None:
    """to_pylist printed the day after an early-era date ('0044-03-15 BC' came out as '0044-03-16 BC')."""
    dates = ["0044-03-15 BC", "0001-12-31 BC", "0401-02-29 BC", "0400-01-01 BC", "4714-11-24 BC", "0001-01-01"]
    rows = _one_column(impl, "pgoutput", 1082, dates).to_pylist()
    assert [r["v"] for r in rows] == dates[:-1] + [dt.date(1, 1, 1)]
    stamps = ["0044-03-15 12:00:00.5 BC", "0401-03-01 00:00:00 BC"]
    assert [r["v"] for r in _one_column(impl, "pgoutput", 1114, stamps).to_pylist()] == stamps


def test_time_2400_to_pylist(impl: Any) -> None:
    """pyarrow turns time64 24:00:00 into 00:00:00; to_pylist keeps PostgreSQL's text instead."""
    rows = _one_column(impl, "pgoutput", 1083, ["24:00:00", "23:59:59.5", None]).to_pylist()
    assert [r["v"] for r in rows] == ["24:00:00", dt.time(23, 59, 59, 500000), None]


def test_uuid_to_pylist_without_type_oids(impl: Any) -> None:
    """uuid[] elements and pglogical uuid columns (no OIDs in the Relation) came out as bytes."""
    u = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    rows = _one_column(impl, "pgoutput", 2951, ["{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}"]).to_pylist()
    assert rows[0]["v"] == [u, None]
    from spockwire.values import StaticTypeCatalog
    catalog = StaticTypeCatalog({"public.h": {"v": "uuid"}})
    rows = _one_column(impl, "pglogical", None, [str(u)], type_catalog=catalog).to_pylist()
    assert rows[0]["v"] == u


@pytest.mark.parametrize("byte, text", [(b"a", "a"), (b"\x00", ""), (b"\x80", "\\200"), (b"\xc3", "\\303"),
                                        (b"\xff", "\\377"), (b"\\", "\\")])
def test_char_binary_and_internal_forms_give_its_text(impl: Any, byte: bytes, text: str) -> None:
    """"char" is one byte in the binary and internal forms: byte 0 failed to match the text form '' and bytes
    0x80-0xff were refused as invalid UTF-8, where the text form is PostgreSQL's octal escape."""
    assert [r["v"] for r in _one_column(impl, "pgoutput", 18, [text, byte]).to_pylist()] == [text, text]
    arrays = _one_column(impl, "pgoutput", 1002, [S.array_send(18, [byte, None])]).to_pylist()
    assert arrays[0]["v"] == [text, None]
    from spockwire.values import StaticTypeCatalog
    catalog = StaticTypeCatalog({"public.h": {"v": "char"}})
    internal = _one_column(impl, "pglogical", None, [W.Internal(byte)], type_catalog=catalog).to_pylist()
    assert internal[0]["v"] == text
    with pytest.raises(ProtocolError, match="cannot decode binary value"):
        _one_column(impl, "pgoutput", 18, [b"ab"])


RENDERED = [("inet", 869), ("cidr", 650), ("macaddr", 829), ("money", 790), ("varbit", 1562), ("int4range", 3904),
            ("tstzrange", 3910), ("int8range", 3926), ("daterange", 3912), ("tsrange", 3908), ("int4multirange", 4451), ("record", 2249), ("inet[]", 1041), ("point", 600),
            ("path", 602), ("tsvector", 3614), ("tsquery", 3615), ("pg_snapshot", 5038), ("oidvector", 30)]


@settings(**HYPO)
@given(kind=st.sampled_from(RENDERED), raw=st.binary(max_size=40))
def test_binary_text_renderings_decode_or_fail_alike(kind, raw) -> None:
    """Types kept as text: any bytes in the binary form render the same text in both implementations, or fail
    with the same error (class, text, offset, column)."""
    name, oid = kind
    frames = _stream([BinType(name, oid, -1, pa.null(), st.nothing())], [[(raw, None)]])
    outcomes = []
    for impl_name in IMPLS:
        try:
            rb = _decode_frames(impl_name, frames)
            outcomes.append(("ok", rb.column(rb.schema.get_field_index("c0")).to_pylist()))
        except ProtocolError as exc:
            outcomes.append(("error", type(exc), str(exc), exc.offset, exc.column))
    assert outcomes[0] == outcomes[1]


def test_malformed_binary_inet_names_offset_and_column() -> None:
    good = b"\x02\x20\x00\x04\x0a\x00\x00\x01"
    frames = _stream([BinType("inet", 869, -1, pa.null(), st.nothing())], [[(good, None)], [(good[:-1], None)]])
    errors = []
    for impl_name in IMPLS:
        with pytest.raises(ProtocolError, match=r"cannot decode binary value .* as inet") as info:
            _decode_frames(impl_name, frames)
        assert info.value.column_name == "c0" and info.value.msg_type == "I"
        errors.append((str(info.value), info.value.offset))
    assert errors[0] == errors[1]


_IPV6_WORDS = st.lists(st.sampled_from([0, 0, 0, 1, 0xFFFF, 0x1234]) | st.integers(0, 0xFFFF), min_size=8, max_size=8)
VALID_NATIVE = st.one_of(
    st.tuples(st.just(("inet", 869)), st.integers(0, 32), st.binary(min_size=4, max_size=4)).map(
        lambda t: (t[0], bytes([2, t[1], 0, 4]) + t[2])),
    st.tuples(st.sampled_from([("inet", 869), ("cidr", 650)]), st.integers(0, 128), _IPV6_WORDS).map(
        lambda t: (t[0], bytes([3, t[1], 1, 16]) + b"".join(w.to_bytes(2, "big") for w in t[2]))),
    st.tuples(st.just(("money", 790)), st.integers(-(1 << 63), (1 << 63) - 1)).map(
        lambda t: (t[0], t[1].to_bytes(8, "big", signed=True))),
    st.tuples(st.sampled_from([("bit", 1560), ("varbit", 1562)]), st.binary(max_size=9), st.integers(0, 7)).map(
        lambda t: (t[0], max(0, 8 * len(t[1]) - t[2]).to_bytes(4, "big") + t[1])),
    st.tuples(st.sampled_from([("macaddr", 829), ("macaddr8", 774)]), st.binary(min_size=8, max_size=8)).map(
        lambda t: (t[0], t[1][:6] if t[0][1] == 829 else t[1])),
    st.builds(lambda kind, flags, lo, hi: (kind, _range_send(kind[1], flags, lo, hi)),
              st.sampled_from([("int4range", 3904), ("int8range", 3926), ("daterange", 3912), ("tsrange", 3908),
                               ("tstzrange", 3910)]),
              st.sampled_from([0x01, 0x00, 0x02, 0x04, 0x06, 0x08, 0x10, 0x0A, 0x14, 0x18]),
              st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([0, -1, 1 << 62, -(1 << 62)]),
              st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([0, 86_400_000_000, -1])),
)


def _range_send(oid: int, flags: int, lo: int, hi: int) -> bytes:
    """range_send of a builtin range: flags, then each finite bound as length + the subtype's send bytes."""
    if flags & 0x01:
        return b"\x01"
    size = 4 if oid in (3904, 3912) else 8
    out = bytes([flags])
    for bound, infinite in ((lo, flags & 0x08), (hi, flags & 0x10)):
        if not infinite:
            v = bound % (1 << 31) - (1 << 30) if size == 4 else bound
            out += size.to_bytes(4, "big") + v.to_bytes(size, "big", signed=True)
    return out


@settings(**HYPO)
@given(value=VALID_NATIVE)
def test_native_text_renderers_match_the_python_renderer(value) -> None:
    """inet, cidr, macaddr(8), money, bit and varbit render in C; the twin (and every other type in C) uses
    spockwire.values.sendtext, which test_sendtext checks against the server: both give the same text."""
    from spockwire.values.sendtext import send_to_text

    (name, oid), raw = value
    frames = _stream([BinType(name, oid, -1, pa.null(), st.nothing())], [[(raw, None)]])
    expected = send_to_text(oid, raw)
    for impl_name in IMPLS:
        rb = _decode_frames(impl_name, frames)
        assert rb.column(rb.schema.get_field_index("c0")).to_pylist() == [expected], (impl_name, raw)


def test_static_catalog_names_types_kept_as_text(impl: Any) -> None:
    """pglogical with a StaticTypeCatalog naming inet and int4range[]: binary and text values give the same text."""
    from spockwire.values import StaticTypeCatalog

    inet_send = bytes([2, 24, 0, 4, 192, 168, 0, 1])
    for type_name, values, expected in (
            ("inet", [inet_send, "192.168.0.1/24"], "192.168.0.1/24"),
            ("int4range[]", [b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x0f\x48\x00\x00\x00\x01\x00\x00\x00\x01"
                             b"\x00\x00\x00\x01\x01", "{empty}"], "{empty}")):
        catalog = StaticTypeCatalog({"public.h": {"v": type_name}})
        batch = _one_column(impl, "pglogical", None, values, type_catalog=catalog).to_arrow()
        assert batch.column(7).type == pa.string()
        assert batch.column(7).to_pylist() == [expected, expected]
