#!/usr/bin/env python3
"""Re-create tests/data/internal_layouts.json: internal ('i') datums of jsonb, tsvector, tsquery, jsonpath and
aclitem made by real servers, each with the text the server's output function gives (`::text`).

Re-run (from the repository root):

    python tests/data/capture_internal_layouts.py

It starts its own throwaway clusters (spockwire.testing.PostgresCluster): PostgreSQL 15 with pglogical, and
PostgreSQL 18 with the Spock output plugin (/work/shared/spock, see tests/pg_fixtures.py). Each value is inserted
into a one-column table of a replicated set; the table is read through `pg_logical_slot_peek_binary_changes` with
internal datums negotiated (pglogical_output / spock_output), and the 'i' datum of every insert is kept with the
server's text of the same row. Both servers are little-endian here (`binary.bigendian` f).
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spockwire.testing import PostgresCluster  # noqa: E402

OUT = Path(__file__).resolve().parent / "internal_layouts.json"

#: (type, SQL expressions of the values)
VALUES: dict[str, list[str]] = {
    "jsonb": [
        "'{}'", "'[]'", "'null'", "'true'", "'false'", "'0'", "'\"\"'", "'\"a\\\\b\\\"c\\u0001\\n\\t\"'",
        "'-1.50'", "'1e-7'", "'123456789012345678901234567890.000000000000000000001'",
        "'[1, \"two\", null, true, false, 1.0, [], {}, [[[]]]]'",
        """'{"b": 1, "a": {"x": [1, 2, {"y": null}]}, "aa": "ü ✓", "": ""}'""",
        "(SELECT jsonb_agg(g) FROM generate_series(1, 70) g)",
        "(SELECT jsonb_object_agg('k' || g, g * 1.5) FROM generate_series(1, 40) g)",
        "'[-0, 1e100, -1e-100, 9223372036854775807, 0.000001]'",
        "(SELECT jsonb_build_object('n', 'NaN'::numeric::text, 'big', 1e1000::numeric, 'tiny', 1e-1000::numeric))",
        "to_jsonb(12.5::numeric)", "to_jsonb('x'::text)",
        "(SELECT jsonb_agg(jsonb_build_object('id', g, 'tags', jsonb_build_array('a', g, g * 0.25))) "
        "FROM generate_series(1, 40) g)",
    ],
    "tsvector": [
        "''", "'a'", "'a:1A b:2,3 c:4C,5D it''s:6B'", "'\\\\back slash'", "to_tsvector('english', "
        "'The quick brown foxes jumped over the lazy dogs, jumping and jumped again')",
        "setweight(to_tsvector('simple', 'alpha beta gamma alpha'), 'B')", "'x:16383 y:1,2,3,4,5,6,7,8'",
        "strip(to_tsvector('simple', 'one two three'))", "'ab abc abcd:3 b'",
    ],
    "tsquery": [
        "''", "'a'", "'a & b'", "'a | b'", "'!a'", "'a <-> b'", "'a <3> b'", "'ab:*'", "'a:AB'", "'a:*CD'",
        "'(a | b) & !c <-> d:*'", "'!(a & b) | c'", "'a <-> (b | c) <2> !d'", "'((a <-> b) <-> c) & (d <-> e)'",
        "'a & (b | (c & !(d | e)))'", "'''it''''s'' & \\\\x'", "to_tsquery('english', 'running & (jumps | foxes)')",
        "phraseto_tsquery('english', 'the quick brown fox')", "websearch_to_tsquery('english', '\"a b\" -c or d')",
    ],
    "jsonpath": [
        "'$'", "'strict $.a'", "'$.a[*] ? (@ > 1)'", "'$.\"key with space\".b[1 to 3, 5, last]'", "'$.**{2 to last}'",
        "'$.** ? (@ == \"x\")'", "'$.a.type()'", "'$.a.size() + 3 * -$.b'", "'($.a + 1) * 2'",
        "'$ ? (@.a like_regex \"^x.*\" flag \"ism\")'", "'$ ? (@ starts with \"ab\")'",
        "'$ ? (exists (@.a) && !(@.b == null) || (@.c < 1) is unknown)'", "'$.datetime(\"yyyy-MM-dd\")'",
        "'$var.x ? (@ != $y)'", "'$.*'", "'$[*].keyvalue()'", "'$.a.floor().ceiling().abs().double()'",
        "'1 + 2.5'", "'\"str\"'", "'true'", "'null'", "'$.a ? (@ >= 1 && @ <= 2.5e3)'", "'- ($.a - 1)'",
        "'$.a % 2 / 3'", "'$.**{1}'", "'$.**{last}'", "'$.**{3 to 5}'", "'$[last - 1]'",
        "'($\"x\" + -1.5) * -$.*'", "'$ ? (@ == true && !(@ == null) || (@ < false) is unknown)'", "'(1.50).a'",
    ],
}
PG18_ONLY = {"jsonpath": ["'$.a.bigint().boolean().date().decimal(4, 2).integer().number().string()'",
                          "'$.datetime(\"yyyy\\\\n\").decimal(4,2).time()'",
                          "'$.time(3).time_tz().timestamp().timestamp_tz(1)'", "'$.decimal()'"]}

ROLES_SQL = ("CREATE ROLE alice; CREATE ROLE \"Bob Smith\"; CREATE ROLE \"we\"\"ird\"; "
             "CREATE ROLE carol_2")
ACLITEMS = ["'alice=r/postgres'", "'=arwdDxtm/postgres'", "'\"Bob Smith\"=r*w*/alice'",
            "'carol_2=U*C*T/\"we\"\"ird\"'", "'alice=arwdDxt*/postgres'", "'\"we\"\"ird\"=/alice'"]
PG15_ACLITEMS = ["'alice=r/postgres'", "'=arwdDxt/postgres'", "'\"Bob Smith\"=r*w*/alice'",
                 "'carol_2=U*C*T/\"we\"\"ird\"'", "'alice=sA/postgres'", "'\"we\"\"ird\"=/alice'"]


def _datums(payloads: list[bytes], proto: int) -> list[bytes]:
    """The 'i' datum of the last column of each insert (tables: id int, v TYPE)."""
    out = []
    for p in payloads:
        body = p[8:] if proto == 5 and p[:1] != b"S" else p
        if body[:1] != b"I":
            continue
        pos = 8
        (natts,) = struct.unpack_from(">H", body, pos)
        pos += 2
        datum = None
        for _ in range(natts):
            kind = body[pos:pos + 1]
            pos += 1
            datum = None
            if kind in (b"n", b"u"):
                continue
            (n,) = struct.unpack_from(">I", body, pos)
            pos += 4
            datum = bytes(body[pos:pos + n]) if kind == b"i" else None
            pos += n
        out.append(datum)
    return out


def capture(pg: PostgresCluster, server: str, values: dict[str, list[str]]) -> list[dict]:
    dbname = pg.create_database(pg.new_database_name(f"layouts_{server}"))
    dsn = pg.dsn(dbname=dbname)

    def sql(text: str, params: tuple = ()) -> None:
        pg.execute(text, params or None, dbname=dbname)

    spock = server == "pg18"
    if spock:
        sql("CREATE EXTENSION spock")
        sql("SELECT spock.node_create(node_name := 'n1', dsn := %s)", (dsn,))
    else:
        sql("CREATE EXTENSION pglogical")
        sql("SELECT pglogical.create_node(node_name := 'n1', dsn := %s)", (dsn,))
    for stmt in ROLES_SQL.split("; "):
        try:
            pg.execute(stmt)
        except Exception:  # noqa: BLE001 - roles are cluster-wide: made by an earlier run of this cluster
            pass
    rows: list[tuple[str, str]] = []
    for type_name, exprs in values.items():
        table = f"t_{type_name}"
        sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v {type_name})")
        if spock:
            sql("SELECT spock.repset_add_table('default', %s)", (table,))
        else:
            sql("SELECT pglogical.replication_set_add_table('default', %s)", (table,))
    slot = f"{dbname}_slot"
    sql(f"SELECT pg_create_logical_replication_slot('{slot}', '{'spock_output' if spock else 'pglogical_output'}')")
    for type_name, exprs in values.items():
        for k, expr in enumerate(exprs):
            sql(f"INSERT INTO t_{type_name} VALUES ({k}, {expr})")
            rows.append((type_name, expr))
    major = "1800" if spock else "1500"
    opts = {"startup_params_format": "1", "expected_encoding": "UTF8",
            "binary.want_internal_basetypes": "1", "binary.want_binary_basetypes": "1",
            "binary.basetypes_major_version": major}
    if spock:
        opts.update({"min_proto_version": "5", "max_proto_version": "5", "spock.replication_set_names": "default",
                     "proto_format": "native"})
    else:
        opts.update({"min_proto_version": "1", "max_proto_version": "1",
                     "pglogical.replication_set_names": "default"})
    flat: list[str] = []
    for key, value in opts.items():
        flat += [key, value]
    args = ", ".join(["%s"] * len(flat))
    payloads = [bytes(r[0]) for r in pg.query(
        f"SELECT data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, {args})", tuple(flat),
        dbname=dbname)]
    datums = _datums(payloads, 5 if spock else 1)
    assert len(datums) == len(rows), (len(datums), len(rows))
    out = []
    for (type_name, expr), datum in zip(rows, datums):
        (text,) = pg.query(f"SELECT ({expr})::{type_name}::text", dbname=dbname)[0]
        out.append({"server": server, "type": type_name, "sql": expr, "text": text,
                    "datum": datum.hex() if datum is not None else None})
    roles = dict(pg.query("SELECT oid::int, rolname FROM pg_roles", dbname=dbname))
    for rec in out:
        rec["roles"] = {str(k): v for k, v in roles.items()} if rec["type"] == "aclitem" else None
    sql(f"SELECT pg_drop_replication_slot('{slot}')")
    return out


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.pg_fixtures import spock_settings

    records: list[dict] = []
    with PostgresCluster(major=15) as pg:
        records += capture(pg, "pg15", dict(VALUES, aclitem=PG15_ACLITEMS))
    with PostgresCluster(spock_settings(), major=18) as pg:
        records += capture(pg, "pg18", dict({k: v + PG18_ONLY.get(k, []) for k, v in VALUES.items()},
                                            aclitem=ACLITEMS))
    OUT.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(records)} datums -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
