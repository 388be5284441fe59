#!/usr/bin/env python3
"""Re-create the real replication captures in tests/data/ from a throwaway PostgreSQL 15 cluster.

Re-run (from the repository root; needs postgresql-15, postgresql-15-pglogical, postgresql-15-wal2json):

    python tests/data/capture_streams.py                 # all captures, into tests/data/
    python tests/data/capture_streams.py --only pgoutput_v1_text --out /tmp/caps

Every run starts its own cluster (spockwire.testing.PostgresCluster), so nothing else is touched. Each capture runs
in a fresh database: schema first, then the slots (the captured plugin plus the oracle slots, all created at the
same point), then the workload, then every slot is read with the replayable SQL interface
``pg_logical_slot_peek_binary_changes(slot, NULL, NULL, VARIADIC options)`` (one row = one plugin message and its
LSN). Files per capture ``<name>``:

* ``<name>.spwf``                 frame file (docs/architecture.md) with header {"protocol", "options",
                                  "server_version", "slot", "plugin", "created_at", "origins"} ("origins" maps
                                  the replication origin ids wal2json prints to their names)
* ``<name>.test_decoding.txt``    test_decoding (include-xids=1, include-timestamp=0, skip-empty-xacts=0; a
                                  two_phase slot where the capture prepares), format in tests/oracles.py
* ``<name>.test_decoding_stream.txt``  (streaming captures) the same with stream-changes=1: the stream structure
                                  (test_decoding does not print the data of streamed changes)
* ``<name>.wal2json.jsonl``       wal2json format-version 2 (include-xids, include-lsn, include-timestamp,
                                  include-origin, include-type-oids, include-typmod, include-pk); wal2json has no
                                  two-phase or streaming, so it sees prepared transactions at COMMIT PREPARED.

Commit LSNs, xids and timestamps differ from run to run; the oracles are captured from the same WAL, so they
always agree with their capture.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spockwire.frames import write_frame_file  # noqa: E402
from spockwire.testing import PostgresCluster  # noqa: E402
from tests.oracles import escape_row, parse_lsn  # noqa: E402

DATA = Path(__file__).resolve().parent

TD_OPTIONS = {"include-xids": "1", "include-timestamp": "0", "skip-empty-xacts": "0"}
WJ_OPTIONS = {"format-version": "2", "include-xids": "1", "include-lsn": "1", "include-timestamp": "1",
              "include-origin": "1", "include-type-oids": "1", "include-typmod": "1", "include-pk": "1"}
WJ_OPTIONS_SMALL = {"format-version": "2", "include-xids": "1", "include-lsn": "1", "include-timestamp": "1",
                    "include-origin": "1"}


def _flatten(options: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        out += [key, value]
    return out


class Db:
    """A database of the capture cluster with small helpers."""

    def __init__(self, pg: PostgresCluster, name: str) -> None:
        self.pg, self.name = pg, name

    def sql(self, sql: str, params: Any = None) -> None:
        self.pg.execute(sql, params, dbname=self.name)

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.pg.query(sql, params, dbname=self.name)

    def connect(self) -> Any:
        return self.pg.connect(self.name)

    def slot(self, name: str, plugin: str, two_phase: bool = False) -> None:
        self.sql("SELECT pg_create_logical_replication_slot(%s, %s, false, %s)", (name, plugin, two_phase))

    def peek(self, slot: str, options: dict[str, str]) -> list[tuple[int, bytes]]:
        rows = self.rows("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                         "VARIADIC %s::text[])", (slot, _flatten(options)))
        return [(parse_lsn(lsn), bytes(data)) for lsn, data in rows]


class Capture:
    """One capture: the plugin slot plus oracle slots, created together before the workload."""

    def __init__(self, db: Db, name: str, *, two_phase: bool = False, stream_oracle: bool = False,
                 wal2json_options: dict[str, str] | None = None) -> None:
        self.db, self.name, self.two_phase, self.stream_oracle = db, name, two_phase, stream_oracle
        self.wj_options = wal2json_options or WJ_OPTIONS
        self.td_slot, self.wj_slot = f"{name}_td", f"{name}_wj"

    def create_oracle_slots(self) -> None:
        self.db.slot(self.td_slot, "test_decoding", two_phase=self.two_phase)
        self.db.slot(self.wj_slot, "wal2json")

    def write(self, out: Path, protocol: str, slot: str, plugin: str, options: dict[str, str],
              name: str | None = None) -> dict[str, int]:
        name = name or self.name
        frames = self.db.peek(slot, options)
        origins = {str(ident): oname for ident, oname in self.db.rows(
            "SELECT roident, roname FROM pg_replication_origin ORDER BY roident")}
        write_frame_file(out / f"{name}.spwf", protocol, frames, options=options,
                         server_version=self.db.pg.server_version, slot=slot, plugin=plugin,
                         origins=origins or None)
        td = self.db.peek(self.td_slot, TD_OPTIONS)
        _write_lines(out / f"{name}.test_decoding.txt", (f"{_lsn(l)}\t{escape_row(d)}" for l, d in td))
        if self.stream_oracle:
            tds = self.db.peek(self.td_slot, dict(TD_OPTIONS, **{"stream-changes": "1"}))
            _write_lines(out / f"{name}.test_decoding_stream.txt",
                         (f"{_lsn(l)}\t{escape_row(d)}" for l, d in tds))
        wj = self.db.peek(self.wj_slot, self.wj_options)
        _write_lines(out / f"{name}.wal2json.jsonl", (d.decode("utf-8") for _, d in wj))
        counts: dict[str, int] = {}
        for _, payload in frames:
            key = chr(payload[0]) if payload else "?"
            counts[key] = counts.get(key, 0) + 1
        return counts


def _lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _write_lines(path: Path, lines: Any) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for line in lines:
            if "\n" in line:
                raise ValueError(f"a row of {path.name} spans lines: {line[:80]!r}")
            fh.write(line + "\n")


def _noise(rng: random.Random, n: int) -> str:
    """n characters of incompressible printable text."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:-_+=!?"
    return "".join(rng.choice(alphabet) for _ in range(n))


def in_origin(db: Db, origin: str, origin_lsn: str, origin_ts: str, statements: Sequence[str]) -> None:
    """Run statements as one transaction replayed from a replication origin (so the WAL records the origin)."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
            cur.execute("BEGIN")
            cur.execute("SELECT pg_replication_origin_xact_setup(%s, %s)", (origin_lsn, origin_ts))
            for stmt in statements:
                cur.execute(stmt)
            cur.execute("COMMIT")
            cur.execute("SELECT pg_replication_origin_session_reset()")
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------------------------
# a. pgoutput proto 1, text

MIXED_DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE kinds (
    id int PRIMARY KEY, big bigint, num numeric(14,3), txt text, ts timestamptz, doc jsonb, uid uuid, flag bool,
    raw bytea, tags text[], nums int[], m mood, p posint, r real, d double precision, c char(4), vc varchar(12),
    dt date, iv interval, sm smallint);
CREATE TABLE full_ident (a int, b text, c int);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE t1 (id int PRIMARY KEY, v text);
CREATE TABLE t2 (id int PRIMARY KEY, v text);
CREATE TABLE t3 (id bigint PRIMARY KEY, v text);
CREATE TABLE evolving (id int PRIMARY KEY, v text);
"""

KINDS_ROWS = [
    "(1, 9000000000, 12345.678, 'it''s a \"quote\" and a backslash \\ here', '2024-02-29 23:59:59.999999+00', "
    "'{\"a\": [1, \"x\", null], \"b\": {\"c\": true}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', true, "
    "'\\x00ff10'::bytea, ARRAY['a b', NULL, 'c\"d', ''], '{1,NULL,-3}', 'happy', 7, 1.5, -2.25e-10, 'ab', "
    "'varchar', '2000-01-01', '1 day 02:03:04', -32768)",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL)",
    "(3, -1, 'NaN', E'line1\\nline2\\ttab \u00fcn\u00ef\u00e7\u00f8d\u00e9 \U0001F600', '-infinity', '[]', "
    "'00000000-0000-0000-0000-000000000000', false, ''::bytea, '{}', '{}', 'sad', 1, 'Infinity', 'NaN', '', '', "
    "'infinity', '-1 mons', 0)",
    "(4, 0, 0, '', '1999-12-31 23:59:59+00', 'null', 'ffffffff-ffff-ffff-ffff-ffffffffffff', NULL, "
    "'\\x'::bytea, '{NULL}', '{0}', 'ok', 2147483647, -0.0, 1e308, 'abcd', 'x', '0001-01-01 BC', "
    "'0 seconds', 32767)",
]


def capture_pgoutput_v1_text(pg: PostgresCluster, out: Path) -> dict[str, int]:
    db = Db(pg, pg.create_database("cap_pgoutput_v1_text"))
    db.sql(MIXED_DDL)
    db.sql("CREATE PUBLICATION pub_all FOR ALL TABLES")
    db.sql("SELECT pg_replication_origin_create('upstream_a')")
    cap = Capture(db, "pgoutput_v1_text")
    db.slot("pgoutput_v1_text", "pgoutput")
    cap.create_oracle_slots()
    rng = random.Random(1)
    body = _noise(rng, 20000)

    for row in KINDS_ROWS:
        db.sql(f"INSERT INTO kinds VALUES {row}")
    db.sql("INSERT INTO kinds (id, txt, nums) VALUES (5, 'five', '{5}'), (6, 'six', '{6,6}'), (7, 'seven', NULL)")
    db.sql("UPDATE kinds SET txt = 'updated', num = 1.5 WHERE id = 1")
    db.sql("UPDATE kinds SET id = 200, txt = 'moved' WHERE id = 2")  # key change: old key 'K'
    db.sql("DELETE FROM kinds WHERE id = 3")
    db.sql("INSERT INTO full_ident VALUES (1, 'one', NULL), (2, NULL, 20)")
    db.sql("UPDATE full_ident SET b = 'uno' WHERE a = 1")  # old tuple 'O'
    db.sql("DELETE FROM full_ident WHERE a = 2")
    db.sql("INSERT INTO docs VALUES (1, 'big', %s), (2, 'small', 'tiny body')", (body,))
    db.sql("UPDATE docs SET title = 'big, retitled' WHERE id = 1")  # toasted body unchanged: 'u'
    db.sql("UPDATE docs SET title = 'both', body = 'tiny body 2' WHERE id = 2")
    # one transaction touching three tables, interleaved
    db.sql("BEGIN; INSERT INTO t1 VALUES (1, 'a'); INSERT INTO t2 VALUES (1, 'b'); INSERT INTO t3 VALUES (1, 'c');"
           " UPDATE t1 SET v = 'a2' WHERE id = 1; INSERT INTO t2 VALUES (2, 'b2'); DELETE FROM t3 WHERE id = 1;"
           " INSERT INTO t3 VALUES (9223372036854775807, 'max'); INSERT INTO t1 VALUES (2, NULL); COMMIT")
    # a savepoint rolled back inside a committed transaction, and a fully rolled-back transaction
    db.sql("BEGIN; INSERT INTO t1 VALUES (3, 'kept'); SAVEPOINT s; INSERT INTO t1 VALUES (4, 'rolled back');"
           " ROLLBACK TO SAVEPOINT s; INSERT INTO t1 VALUES (5, 'kept too'); COMMIT")
    db.sql("BEGIN; INSERT INTO t1 VALUES (6, 'never'); DELETE FROM t2; ROLLBACK")
    # schema change mid-stream: a second 'R' for the same relation
    db.sql("INSERT INTO evolving VALUES (1, 'before')")
    db.sql("ALTER TABLE evolving ADD COLUMN extra int DEFAULT 7")
    db.sql("INSERT INTO evolving VALUES (2, 'after', 8), (3, 'after default', DEFAULT)")
    db.sql("UPDATE evolving SET v = 'before, updated' WHERE id = 1")
    # logical messages
    db.sql("BEGIN; INSERT INTO t2 VALUES (10, 'with message');"
           " SELECT pg_logical_emit_message(true, 'spockwire.test', 'transactional payload'); COMMIT")
    db.sql("SELECT pg_logical_emit_message(false, 'spockwire.test', 'non-transactional')")
    db.sql("SELECT pg_logical_emit_message(false, 'bin', '\\x00ff0a5c'::bytea)")
    # a transaction replayed from a replication origin: 'O'
    in_origin(db, "upstream_a", "0/ABCDEF", "2024-01-01 00:00:00+00",
              ["INSERT INTO t1 VALUES (100, 'from upstream_a')", "UPDATE t2 SET v = 'origin update' WHERE id = 1"])
    # truncate (the 'T' message), then more rows
    db.sql("TRUNCATE t2, t3")
    db.sql("INSERT INTO t2 VALUES (1, 'after truncate')")
    db.sql("INSERT INTO kinds (id, m, p) VALUES (8, 'ok', 42)")

    options = {"proto_version": "1", "publication_names": "pub_all", "messages": "true"}
    return cap.write(out, "pgoutput", "pgoutput_v1_text", "pgoutput", options)


# ---------------------------------------------------------------------------------------------------------------
# b. pgoutput proto 2, binary, streaming

def capture_pgoutput_v2_binary_stream(pg: PostgresCluster, out: Path) -> dict[str, int]:
    db = Db(pg, pg.create_database("cap_pgoutput_v2_binary_stream"))
    db.sql("CREATE TABLE big (id int PRIMARY KEY, grp int NOT NULL, payload text);"
           "CREATE TABLE small (id int PRIMARY KEY, v text, at timestamptz, amount numeric(10,2));"
           "CREATE PUBLICATION pub_all FOR ALL TABLES")
    cap = Capture(db, "pgoutput_v2_binary_stream", stream_oracle=True, wal2json_options=WJ_OPTIONS_SMALL)
    db.slot("pgoutput_v2_binary_stream", "pgoutput")
    cap.create_oracle_slots()

    db.sql("INSERT INTO small VALUES (1, 'before', '2024-05-01 12:00:00+00', 10.50)")
    a = db.connect()
    a.autocommit = False
    try:
        with a.cursor() as cur:
            cur.execute("INSERT INTO big SELECT g, 1, 'row ' || g FROM generate_series(1, 2000) g")
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO big SELECT g, 9, 'rolled back ' || g FROM generate_series(2001, 2600) g")
            cur.execute("ROLLBACK TO SAVEPOINT s1")
            # another session commits while the big transaction is open
            db.sql("INSERT INTO small VALUES (2, 'interleaved', '2024-05-01 12:00:01+00', -3.25)")
            cur.execute("SAVEPOINT s2")
            cur.execute("UPDATE big SET grp = 2 WHERE id <= 300")
            cur.execute("RELEASE SAVEPOINT s2")
            cur.execute("INSERT INTO big SELECT g, 3, 'row ' || g FROM generate_series(2601, 3000) g")
            cur.execute("DELETE FROM big WHERE id BETWEEN 10 AND 19")
            db.sql("UPDATE small SET v = 'interleaved, updated' WHERE id = 1")
        a.commit()
        # a streamed transaction that is rolled back entirely
        with a.cursor() as cur:
            cur.execute("INSERT INTO big SELECT g, 4, 'aborted ' || g FROM generate_series(10001, 11500) g")
        a.rollback()
    finally:
        a.close()
    db.sql("INSERT INTO small VALUES (3, 'after', NULL, NULL)")

    options = {"proto_version": "2", "publication_names": "pub_all", "binary": "true", "streaming": "true"}
    return cap.write(out, "pgoutput", "pgoutput_v2_binary_stream", "pgoutput", options)


# ---------------------------------------------------------------------------------------------------------------
# c. pgoutput proto 3, two-phase (and a streamed prepared transaction)

def capture_pgoutput_v3_twophase(pg: PostgresCluster, out: Path) -> dict[str, int]:
    db = Db(pg, pg.create_database("cap_pgoutput_v3_twophase"))
    db.sql("CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2));"
           "CREATE TABLE bulk (id int PRIMARY KEY, v text);"
           "CREATE PUBLICATION pub_all FOR ALL TABLES")
    cap = Capture(db, "pgoutput_v3_twophase", two_phase=True, stream_oracle=True,
                  wal2json_options=WJ_OPTIONS_SMALL)
    db.slot("pgoutput_v3_twophase", "pgoutput", two_phase=True)
    cap.create_oracle_slots()

    db.sql("INSERT INTO acct VALUES (1, 'alice', 100), (2, 'bob', 50)")
    db.sql("BEGIN; UPDATE acct SET balance = balance - 10 WHERE id = 1;"
           " UPDATE acct SET balance = balance + 10 WHERE id = 2; PREPARE TRANSACTION 'xfer-commit'")
    db.sql("INSERT INTO acct VALUES (3, 'carol', 0)")  # commits while xfer-commit is prepared
    db.sql("COMMIT PREPARED 'xfer-commit'")
    db.sql("BEGIN; INSERT INTO acct VALUES (4, 'mallory', 1000000); DELETE FROM acct WHERE id = 2;"
           " PREPARE TRANSACTION 'fraud-rollback'")
    db.sql("ROLLBACK PREPARED 'fraud-rollback'")
    # larger than logical_decoding_work_mem: streamed, then stream-prepared ('p')
    db.sql("BEGIN; INSERT INTO bulk SELECT g, 'bulk ' || g FROM generate_series(1, 1500) g;"
           " PREPARE TRANSACTION 'bulk-commit'")
    db.sql("COMMIT PREPARED 'bulk-commit'")
    db.sql("BEGIN; INSERT INTO bulk SELECT g, 'gone ' || g FROM generate_series(5001, 6500) g;"
           " PREPARE TRANSACTION 'bulk-rollback'")
    db.sql("ROLLBACK PREPARED 'bulk-rollback'")
    db.sql("UPDATE acct SET owner = 'alice b.' WHERE id = 1")

    options = {"proto_version": "3", "publication_names": "pub_all", "two_phase": "true", "streaming": "true"}
    return cap.write(out, "pgoutput", "pgoutput_v3_twophase", "pgoutput", options)


# ---------------------------------------------------------------------------------------------------------------
# d. pglogical_output: text, binary, internal

PGL_BASE = {"startup_params_format": "1", "min_proto_version": "1", "max_proto_version": "1",
            "pglogical.replication_set_names": "default,default_insert_only,ddl_sql",
            "pglogical.forward_origins": "all"}
PGL_BINARY = dict(PGL_BASE, **{"binary.want_binary_basetypes": "1", "binary.basetypes_major_version": "1500"})
PGL_INTERNAL = dict(PGL_BINARY, **{"binary.want_internal_basetypes": "1"})


def capture_pglogical(pg: PostgresCluster, out: Path) -> dict[str, dict[str, int]]:
    db = Db(pg, pg.create_database("cap_pglogical"))
    db.sql("CREATE EXTENSION pglogical")
    db.sql("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (pg.dsn(db.name),))
    db.sql(MIXED_DDL)
    db.sql("CREATE TABLE log_only (at int, msg text)")  # no primary key: insert-only set
    db.sql("SELECT pglogical.replication_set_add_table('default', t) FROM unnest(ARRAY['kinds',"
           " 'docs', 't1', 't2', 't3', 'evolving']::regclass[]) t")
    db.sql("SELECT pglogical.replication_set_add_table('default_insert_only', t) FROM"
           " unnest(ARRAY['log_only', 'full_ident']::regclass[]) t")
    db.sql("SELECT pg_replication_origin_create('upstream_b')")
    cap = Capture(db, "pglogical")
    db.slot("pglogical", "pglogical_output")
    cap.create_oracle_slots()
    rng = random.Random(2)

    for row in KINDS_ROWS:
        db.sql(f"INSERT INTO kinds VALUES {row}")
    db.sql("UPDATE kinds SET txt = 'updated', num = 1.5 WHERE id = 1")
    db.sql("UPDATE kinds SET id = 200 WHERE id = 2")
    db.sql("DELETE FROM kinds WHERE id = 3")
    db.sql("INSERT INTO full_ident VALUES (1, 'one', NULL)")
    db.sql("INSERT INTO log_only VALUES (1, 'insert only'), (2, NULL)")
    db.sql("INSERT INTO docs VALUES (1, 'big', %s)", (_noise(rng, 20000),))
    db.sql("UPDATE docs SET title = 'big, retitled' WHERE id = 1")  # 'u'
    db.sql("BEGIN; INSERT INTO t1 VALUES (1, 'a'); INSERT INTO t2 VALUES (1, 'b'); UPDATE t1 SET v = 'a2';"
           " INSERT INTO t3 VALUES (1, 'c'); COMMIT")
    db.sql("BEGIN; INSERT INTO t1 VALUES (2, 'never'); ROLLBACK")
    db.sql("INSERT INTO evolving VALUES (1, 'before')")
    db.sql("ALTER TABLE evolving ADD COLUMN extra int DEFAULT 7")
    db.sql("INSERT INTO evolving VALUES (2, 'after', 8)")
    in_origin(db, "upstream_b", "0/ABCDEF", "2024-01-01 00:00:00+00",
              ["INSERT INTO t1 VALUES (100, 'from upstream_b')"])
    db.sql("TRUNCATE t3")
    db.sql("INSERT INTO t3 VALUES (2, 'after truncate')")

    counts = {}
    for name, options in (("pglogical_text", PGL_BASE), ("pglogical_binary", PGL_BINARY),
                          ("pglogical_internal", PGL_INTERNAL)):
        counts[name] = cap.write(out, "pglogical", "pglogical", "pglogical_output", options, name=name)
    return counts


CAPTURES: dict[str, Callable[[PostgresCluster, Path], Any]] = {
    "pgoutput_v1_text": capture_pgoutput_v1_text,
    "pgoutput_v2_binary_stream": capture_pgoutput_v2_binary_stream,
    "pgoutput_v3_twophase": capture_pgoutput_v3_twophase,
    "pglogical": capture_pglogical,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(CAPTURES), help="capture only this (repeatable)")
    parser.add_argument("--out", type=Path, default=DATA, help="output directory (default: tests/data)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with PostgresCluster() as pg:
        print(f"PostgreSQL {pg.server_version} on port {pg.port}")
        for name in args.only or list(CAPTURES):
            result = CAPTURES[name](pg, args.out)
            print(f"{name}: {json.dumps(result, sort_keys=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
