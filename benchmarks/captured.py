"""Fixed benchmark workloads captured from a throwaway PostgreSQL 15 (`spockwire.testing.PostgresCluster`).

Each workload runs in its own database. Two logical slots are created back to back before the workload's
changes, so both start at the same LSN: one for pgoutput, one for wal2json. After the changes, the pgoutput slot is
read twice with ``pg_logical_slot_peek_binary_changes`` (text format, then ``binary 'true'``) and the wal2json
slot once (format-version 2, with xids, timestamps and LSNs: the facts spockwire puts in every row). Peeking does
not consume, so all three outputs describe the same committed changes.

============  ====================================================================================================
narrow        200,000 INSERTs into a 7-column table (bigint, int, numeric(12,2), timestamptz, text, jsonb, uuid),
              200 transactions of 1,000 rows
wide          20,000 INSERTs into a 64-column table (bigint key + 63 columns of int, bigint, numeric, text,
              timestamptz, bool, float8, date), 20 transactions of 1,000 rows
toast         2,000 INSERTs of a 20,000-byte out-of-line text value, then 2,000 UPDATEs that leave it unchanged
              (pgoutput sends 'u' for it), transactions of 100 rows
update_heavy  100,000 UPDATEs of a 5-column table with REPLICA IDENTITY FULL (every message carries the old and
              the new row), 100 transactions of 1,000 rows; the rows are inserted before the slots exist
small_txns    50,000 one-row INSERT transactions into the narrow table
huge_txn      one transaction of 300,000 INSERTs into the narrow table
============  ====================================================================================================

The captures are cached under ``out/bench-cache/v<WORKLOAD_VERSION>-x<scale>/`` (frame files and a JSON-lines file
per workload) so a rerun starts at once; bump ``WORKLOAD_VERSION`` whenever a definition below changes.
``SPOCKWIRE_BENCH_SCALE`` (default 1) multiplies every row count, for a quick look at the harness.

    python -m benchmarks.captured          # capture (or load) and print the sizes
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import pytest

from spockwire.frames import FrameWriter, iter_frames, read_frame_file

__all__ = ["WORKLOAD_VERSION", "WORKLOADS", "Captured", "load_or_capture", "captured_workloads", "cache_dir"]

WORKLOAD_VERSION = 1
ROOT = Path(__file__).resolve().parents[1]

PGOUTPUT_OPTIONS = {"proto_version": "1", "publication_names": "bench_pub"}
PGOUTPUT_BINARY_OPTIONS = dict(PGOUTPUT_OPTIONS, binary="true")
WAL2JSON_OPTIONS = {"format-version": "2", "include-xids": "1", "include-timestamp": "1", "include-lsn": "1"}

# Settings of the capture cluster: big enough decoding memory that the huge transaction is not spilled to disk
# three times over, and no checkpoints in the middle of a capture.
CAPTURE_SETTINGS = {"logical_decoding_work_mem": "512MB", "max_wal_size": "8GB", "checkpoint_timeout": "1h"}


def scale() -> float:
    return float(os.environ.get("SPOCKWIRE_BENCH_SCALE", "1"))


def cache_dir() -> Path:
    return ROOT / "out" / "bench-cache" / f"v{WORKLOAD_VERSION}-x{scale():g}"


def _n(rows: int) -> int:
    return max(1, int(rows * scale()))


# ---------------------------------------------------------------------------------------------------------------
# the workloads (SQL)

ORDERS_DDL = r"""
CREATE TABLE orders (id bigint PRIMARY KEY, quantity int, price numeric(12,2), created_at timestamptz,
                     note text, attributes jsonb, ref uuid);
CREATE FUNCTION order_rows(lo bigint, hi bigint) RETURNS SETOF orders LANGUAGE sql AS $$
    SELECT g,
           (g * 37 % 500 + 1)::int,
           ((g * 7919) % 99999999 / 100.0)::numeric(12,2),
           timestamptz '2024-05-01 00:00:00+00' + g * interval '1.379 seconds',
           (ARRAY['Order shipped', 'Customer invoice pending', 'Delivered to the north depot',
                  'Express return, refund confirmed', 'Gift wrap, fragile, handle with care',
                  'Backorder with partial payment'])[1 + g % 6] || ' #' || (g % 997),
           jsonb_build_object(
               'city', (ARRAY['Lisbon', 'Oslo', 'Denver', 'Osaka', 'Nairobi', 'Lima', 'Perth', 'Quebec',
                              'Tallinn', 'Porto'])[1 + g % 10],
               'rush', g % 3 = 0,
               'tags', (ARRAY['[]', '["vip"]', '["bulk", "eu"]', '["promo", "apac", "b2b"]'])[1 + g % 4]::jsonb),
           md5(g::text)::uuid
    FROM generate_series(lo, hi) AS g
$$;
CREATE PROCEDURE fill_orders(first bigint, n bigint, per_txn bigint) LANGUAGE plpgsql AS $$
DECLARE lo bigint := first;
BEGIN
    WHILE lo < first + n LOOP
        INSERT INTO orders SELECT * FROM order_rows(lo, least(lo + per_txn, first + n) - 1);
        COMMIT;
        lo := lo + per_txn;
    END LOOP;
END $$;
"""

WIDE_TYPES = ("int", "bigint", "numeric(12,2)", "text", "timestamptz", "bool", "float8", "date")
WIDE_EXPR = {
    "int": "((g * {k}) % 100000)::int",
    "bigint": "g * 1000003 + {k}",
    "numeric(12,2)": "((g * {k}) % 10000000 / 100.0)::numeric(12,2)",
    "text": "'v' || (g * {k}) % 100000 || '-' || left(md5((g + {k})::text), 8)",
    "timestamptz": "timestamptz '2024-01-01 00:00:00+00' + (g * {k}) * interval '1 second'",
    "bool": "(g + {k}) % 2 = 0",
    "float8": "(g * {k})::float8 / 7",
    "date": "date '2020-01-01' + ((g + {k}) % 2000)::int",
}


def _wide_ddl() -> str:
    cols = ["id bigint PRIMARY KEY"] + [f"c{i:02d} {WIDE_TYPES[i % 8]}" for i in range(1, 64)]
    exprs = ["g"] + [WIDE_EXPR[WIDE_TYPES[i % 8]].format(k=i + 2) for i in range(1, 64)]
    return f"""
CREATE TABLE wide ({', '.join(cols)});
CREATE PROCEDURE fill_wide(n bigint, per_txn bigint) LANGUAGE plpgsql AS $$
DECLARE lo bigint := 1;
BEGIN
    WHILE lo <= n LOOP
        INSERT INTO wide SELECT {', '.join(exprs)} FROM generate_series(lo, least(lo + per_txn - 1, n)) AS g;
        COMMIT;
        lo := lo + per_txn;
    END LOOP;
END $$;
"""


TOAST_DDL = r"""
CREATE TABLE docs (id int PRIMARY KEY, title text, revision int, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE PROCEDURE fill_docs(n int, per_txn int) LANGUAGE plpgsql AS $$
DECLARE lo int := 1;
BEGIN
    WHILE lo <= n LOOP
        INSERT INTO docs
        SELECT g, 'Document ' || g, 1,
               (SELECT string_agg(md5(g::text || ':' || i::text), '') FROM generate_series(1, 625) AS i)
        FROM generate_series(lo, least(lo + per_txn - 1, n)) AS g;
        COMMIT;
        lo := lo + per_txn;
    END LOOP;
    lo := 1;
    WHILE lo <= n LOOP
        UPDATE docs SET revision = revision + 1, title = title || ' (reviewed)'
        WHERE id BETWEEN lo AND lo + per_txn - 1;
        COMMIT;
        lo := lo + per_txn;
    END LOOP;
END $$;
"""

ACCOUNTS_DDL = r"""
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2), status text, updated_at timestamptz, note text);
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE PROCEDURE touch_accounts(n int, per_txn int) LANGUAGE plpgsql AS $$
DECLARE lo int := 1;
BEGIN
    WHILE lo <= n LOOP
        UPDATE accounts SET balance = balance + 1.25,
                            status = CASE status WHEN 'open' THEN 'active' ELSE 'open' END,
                            updated_at = updated_at + interval '1 minute'
        WHERE id BETWEEN lo AND lo + per_txn - 1;
        COMMIT;
        lo := lo + per_txn;
    END LOOP;
END $$;
"""


@dataclass(frozen=True)
class Definition:
    name: str
    description: str
    ddl: str                        # schema, run before the slots exist
    before: Callable[[], str]       # data loaded before the slots exist (not captured)
    changes: Callable[[], str]      # the captured changes


WORKLOADS: dict[str, Definition] = {d.name: d for d in (
    Definition("narrow", "{rows:,} INSERTs, 7 mixed columns, transactions of 1,000 rows", ORDERS_DDL,
               lambda: "", lambda: f"CALL fill_orders(1, {_n(200_000)}, 1000)"),
    Definition("wide", "{rows:,} INSERTs, 64 columns, transactions of 1,000 rows", _wide_ddl(),
               lambda: "", lambda: f"CALL fill_wide({_n(20_000)}, 1000)"),
    Definition("toast", "{rows:,} changes: INSERTs of a 20 KB out-of-line text, then UPDATEs leaving it unchanged",
               TOAST_DDL, lambda: "", lambda: f"CALL fill_docs({_n(2_000)}, 100)"),
    Definition("update_heavy", "{rows:,} UPDATEs, REPLICA IDENTITY FULL (old + new row), 5 columns",
               ACCOUNTS_DDL,
               lambda: (f"INSERT INTO accounts SELECT g, g % 10000 / 4.0, 'open', "
                        f"timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', "
                        f"'account ' || g FROM generate_series(1, {_n(100_000)}) AS g"),
               lambda: f"CALL touch_accounts({_n(100_000)}, 1000)"),
    Definition("small_txns", "{rows:,} one-row INSERT transactions, 7 mixed columns", ORDERS_DDL,
               lambda: "", lambda: f"CALL fill_orders(1, {_n(50_000)}, 1)"),
    Definition("huge_txn", "one transaction of {rows:,} INSERTs, 7 mixed columns", ORDERS_DDL,
               lambda: "", lambda: f"INSERT INTO orders SELECT * FROM order_rows(1, {_n(300_000)})"),
)}


# ---------------------------------------------------------------------------------------------------------------
# a captured workload

@dataclass
class Captured:
    """One workload's changes in three encodings, all held in memory."""

    name: str
    description: str
    text: bytes                     # pgoutput text format, as frame records (what Decoder.feed_frames takes)
    binary: bytes                   # pgoutput binary format, frame records
    wal2json: bytes                 # wal2json format-version 2: one JSON document per line
    meta: dict = field(default_factory=dict)

    @property
    def changes(self) -> int:
        """Row changes in the stream (INSERT, UPDATE and DELETE messages)."""
        return int(self.meta["changes"])

    @property
    def output_rows(self) -> int:
        """Rows spockwire emits: an UPDATE that carries the old row gives a preimage and a postimage."""
        return int(self.meta["output_rows"])

    def path(self, fmt: str) -> Path:
        """The cache file of one encoding ('text', 'binary' or 'wal2json')."""
        return cache_dir() / (f"{self.name}.wal2json.jsonl" if fmt == "wal2json" else f"{self.name}.{fmt}.spwf")

    def body(self, fmt: str) -> bytes:
        return {"text": self.text, "binary": self.binary, "wal2json": self.wal2json}[fmt]

    def payload_bytes(self, fmt: str) -> int:
        return int(self.meta[f"{fmt}_payload_bytes"])

    @cached_property
    def text_payloads(self) -> list[bytes]:
        """The text-format messages one by one, as a replication client hands them over."""
        return [bytes(p) for _, p in iter_frames(self.text)]

    @cached_property
    def binary_payloads(self) -> list[bytes]:
        return [bytes(p) for _, p in iter_frames(self.binary)]

    @cached_property
    def wal2json_lines(self) -> list[bytes]:
        return self.wal2json.splitlines()


def _count(frames: list[tuple[int, bytes]]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    old_rows = 0
    for _, payload in frames:
        kind = chr(payload[0])
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "U" and payload[5:6] in (b"O", b"K"):
            old_rows += 1
    changes = kinds.get("I", 0) + kinds.get("U", 0) + kinds.get("D", 0)
    return {"messages": len(frames), "message_kinds": kinds, "changes": changes, "output_rows": changes + old_rows,
            "payload_bytes": sum(len(p) for _, p in frames)}


def _flatten(options: dict[str, str]) -> list[str]:
    return [item for pair in options.items() for item in pair]


def _peek(pg, db: str, slot: str, options: dict[str, str]) -> list[tuple[int, bytes]]:
    conn = pg.connect(db, autocommit=False)
    try:
        with conn.cursor(name="peek") as cur:
            cur.itersize = 20_000
            cur.execute("SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM pg_logical_slot_peek_binary_changes("
                        "%s, NULL, NULL, VARIADIC %s::text[])", (slot, _flatten(options)))
            return [(int(lsn), bytes(data)) for lsn, data in cur]
    finally:
        conn.rollback()
        conn.close()


def _capture_one(pg, definition: Definition, out: Path) -> None:
    t0 = time.perf_counter()
    db = pg.create_database(f"bench_{definition.name}")
    pg.execute(definition.ddl, dbname=db)
    before = definition.before()
    if before:
        pg.execute(before, dbname=db)
    pg.execute("CREATE PUBLICATION bench_pub FOR ALL TABLES", dbname=db)
    # both slots start here, with no change of this database in between
    pg.execute("SELECT pg_create_logical_replication_slot('bench_pgoutput', 'pgoutput')", dbname=db)
    pg.execute("SELECT pg_create_logical_replication_slot('bench_wal2json', 'wal2json')", dbname=db)
    pg.execute(definition.changes(), dbname=db)
    common = {"server_version": pg.server_version, "workload": definition.name, "workload_version": WORKLOAD_VERSION}
    counts: dict[str, dict] = {}
    for fmt, options in (("text", PGOUTPUT_OPTIONS), ("binary", PGOUTPUT_BINARY_OPTIONS)):
        frames = _peek(pg, db, "bench_pgoutput", options)
        counts[fmt] = _count(frames)
        with FrameWriter(out / f"{definition.name}.{fmt}.spwf.tmp", "pgoutput", options=options,
                         slot="bench_pgoutput", plugin="pgoutput", **common) as writer:
            writer.write_many(frames)
        del frames
    lines = _peek(pg, db, "bench_wal2json", WAL2JSON_OPTIONS)
    with open(out / f"{definition.name}.wal2json.jsonl.tmp", "wb") as fh:
        for _, line in lines:
            if b"\n" in line:
                raise ValueError(f"a wal2json document of {definition.name} spans lines: {line[:80]!r}")
            fh.write(line + b"\n")
    wal2json_changes = sum(1 for _, line in lines if json.loads(line).get("action") in ("I", "U", "D"))
    for fmt in ("text", "binary"):
        if counts[fmt]["changes"] != counts["text"]["changes"]:
            raise RuntimeError(f"{definition.name}: the text and binary captures disagree: {counts}")
    if wal2json_changes != counts["text"]["changes"]:
        raise RuntimeError(f"{definition.name}: wal2json saw {wal2json_changes} changes, pgoutput "
                           f"{counts['text']['changes']}")
    meta = dict(common, description=definition.description.format(rows=counts["text"]["changes"]),
                changes=counts["text"]["changes"], output_rows=counts["text"]["output_rows"],
                text_messages=counts["text"]["messages"], message_kinds=counts["text"]["message_kinds"],
                text_payload_bytes=counts["text"]["payload_bytes"],
                binary_payload_bytes=counts["binary"]["payload_bytes"],
                wal2json_payload_bytes=sum(len(line) for _, line in lines), wal2json_documents=len(lines),
                pgoutput_options=PGOUTPUT_OPTIONS, wal2json_options=WAL2JSON_OPTIONS,
                capture_seconds=round(time.perf_counter() - t0, 1))
    pg.execute("SELECT pg_drop_replication_slot('bench_pgoutput')", dbname=db)
    pg.execute("SELECT pg_drop_replication_slot('bench_wal2json')", dbname=db)
    for suffix in (".text.spwf", ".binary.spwf", ".wal2json.jsonl"):
        os.replace(out / f"{definition.name}{suffix}.tmp", out / f"{definition.name}{suffix}")
    tmp = out / f"{definition.name}.meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, out / f"{definition.name}.meta.json")      # written last: marks the capture complete


def _load(name: str) -> Captured:
    out = cache_dir()
    meta = json.loads((out / f"{name}.meta.json").read_text())
    _, text = read_frame_file(out / f"{name}.text.spwf")
    _, binary = read_frame_file(out / f"{name}.binary.spwf")
    return Captured(name, meta["description"], bytes(text), bytes(binary),
                    (out / f"{name}.wal2json.jsonl").read_bytes(), meta)


def load_or_capture(names: tuple[str, ...] | None = None) -> dict[str, Captured]:
    """The workloads, captured from a new throwaway cluster when the cache does not hold them yet."""
    names = tuple(names or WORKLOADS)
    out = cache_dir()
    missing = [n for n in names if not (out / f"{n}.meta.json").exists()]
    if missing:
        from spockwire.testing import PostgresCluster

        out.mkdir(parents=True, exist_ok=True)
        with PostgresCluster(CAPTURE_SETTINGS) as pg:
            for name in missing:
                _capture_one(pg, WORKLOADS[name], out)
    return {name: _load(name) for name in names}


@pytest.fixture(scope="session")
def captured_workloads() -> dict[str, Captured]:
    """All six workloads (captured once per workload version, then read from out/bench-cache/), or those named in
    SPOCKWIRE_BENCH_WORKLOADS (comma-separated, e.g. ``toast,wide``)."""
    names = tuple(n for n in os.environ.get("SPOCKWIRE_BENCH_WORKLOADS", "").split(",") if n) or None
    try:
        return load_or_capture(names)
    except Exception as exc:  # PostgresNotFound, ClusterError: say why the peer benchmarks cannot run
        if type(exc).__name__ in ("PostgresNotFound", "ClusterError"):
            pytest.skip(f"cannot capture the benchmark workloads: {exc}")
        raise


if __name__ == "__main__":  # pragma: no cover - capture and show the sizes
    for w in load_or_capture().values():
        m = w.meta
        print(f"{w.name:13} {w.changes:>8,} changes {m['text_messages']:>8,} msgs  text {len(w.text) / 1e6:7.1f} MB"
              f"  binary {len(w.binary) / 1e6:7.1f} MB  wal2json {len(w.wal2json) / 1e6:7.1f} MB"
              f"  (captured in {m['capture_seconds']} s)")
