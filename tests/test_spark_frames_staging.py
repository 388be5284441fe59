"""Distributed decoding of frame files (mapInArrow) and the Parquet staging as Spark DataFrames, from real
PostgreSQL 15 streams."""
from __future__ import annotations

import json

import pytest

import spockwire
from spockwire.connection.slots import parse_lsn
from spockwire.frames import FrameWriter
from spockwire.ingest import StagingWriter
from spockwire.spark import apply_changes, decode_frame_file, read_staging, read_staging_stream
from spockwire.spark.distributed import plan_chunks
from tests.spark_session import spark_session

pytestmark = pytest.mark.pg

KEY = ["_commit_lsn", "_seq", "_change_type", "id", "v", "amount"]


@pytest.fixture(scope="module")
def spark():
    return spark_session()


def _capture(db, path, options: dict[str, str]) -> list[tuple[int, bytes]]:
    """Every message of the slot (peeked, not consumed) into a frame file."""
    slot = f"{db.name}_s1"[:63]
    flat = [x for kv in options.items() for x in kv]
    rows = db.query("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                    "VARIADIC %s::text[])", (slot, flat))
    frames = [(parse_lsn(lsn), bytes(data)) for lsn, data in rows]
    with FrameWriter(path, "pgoutput", options=options) as w:
        for lsn, payload in frames:
            w.write(lsn, payload)
    return frames


def _workload(db) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, amount numeric(10,2))")
    db.execute("CREATE TABLE other (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE t, other")
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{db.name}_s1"[:63],))
    for i in range(40):
        db.execute("INSERT INTO t SELECT g, 'v' || g, g / 4.0 FROM generate_series(%s, %s) g", (i * 25, i * 25 + 24))
        db.execute("INSERT INTO other VALUES (%s)", (i,))
        db.execute("UPDATE t SET amount = amount + 1 WHERE id %% 7 = %s", (i % 7,))
    # one large transaction, streamed in pieces with streaming=on (logical_decoding_work_mem is 64kB)
    db.execute("INSERT INTO t SELECT g, repeat('w', 200), 1 FROM generate_series(5000, 7000) g")
    db.execute("ALTER TABLE t ADD COLUMN extra int")   # a new relation message mid-stream
    db.execute("UPDATE t SET extra = 1, v = 'changed' WHERE id < 50")
    db.execute("DELETE FROM t WHERE id BETWEEN 100 AND 150")


def test_distributed_decode_equals_sequential_decode(spark, pg_db, tmp_path):
    _workload(pg_db)
    path = str(tmp_path / "cap.spwf")
    frames = _capture(pg_db, path, {"proto_version": "2", "publication_names": "pub", "streaming": "on"})
    assert any(p[:1] == b"S" for _, p in frames), "the large transaction should have been streamed"
    header, chunks, _scan = plan_chunks(path, chunk_bytes=16 << 10)
    assert len(chunks) >= 5
    # sequential decode of the whole file: the reference
    dec = spockwire.Decoder("pgoutput")
    for _lsn, payload in frames:
        dec.feed(payload)
    expected = sorted(
        (r["_commit_lsn"], r["_seq"], r["_change_type"], r["id"], r["v"], r["amount"])
        for e in dec.drain() if hasattr(e, "to_arrow") and e.relation.name == "t"
        for r in e.to_arrow().to_pylist())
    df = decode_frame_file(spark, path, "public.t", chunk_bytes=16 << 10)
    assert df.rdd.getNumPartitions() == len(chunks)
    assert sorted(tuple(r) for r in df.select(*KEY).collect()) == expected
    assert "extra" in df.columns  # the schema of the table's newest relation message
    applied = apply_changes(df, None, format="memory", keys=["id"])
    assert sorted(tuple(r) for r in applied.select("id", "v", "amount", "extra").collect()) == \
        sorted(pg_db.query("SELECT id, v, amount, extra FROM t"))


def test_staging_as_batch_and_stream(spark, pg_db, tmp_path):
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, amount numeric(10,2))")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = f"{pg_db.name}_s1"[:63]
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    out = tmp_path / "staging"

    def stage_round(sql_statements):
        for sql in sql_statements:
            pg_db.execute(sql)
        rows = pg_db.query("SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                           "'proto_version', '1', 'publication_names', 'pub')", (slot,))
        dec = spockwire.Decoder("pgoutput")
        for _lsn, data in rows:
            dec.feed(bytes(data))
        with StagingWriter(out, protocol="pgoutput") as staging:
            staging.add_all(dec.drain())
            staging.commit(dec.committed_lsn)

    stage_round(["INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 50) g",
                 "UPDATE t SET amount = NULL WHERE id = 3"])
    stage_round(["TRUNCATE t", "INSERT INTO t VALUES (100, 'after', 1.5)", "DELETE FROM t WHERE id = 100",
                 "INSERT INTO t VALUES (101, 'kept', 2.5)"])
    batch = read_staging(spark, str(out), "public.t")
    types = {f.name: f.dataType.simpleString() for f in batch.schema.fields}
    assert types["_commit_lsn"] == "bigint" and types["amount"] == "decimal(10,2)"
    assert batch.filter("_change_type = 'truncate'").count() == 1
    assert batch.count() == 50 + 1 + 1 + 3
    assert [tuple(r) for r in apply_changes(batch, None, format="memory", keys=["id"])
            .select("id", "v", "amount").collect()] == \
        [(101, "kept", pg_db.query("SELECT amount FROM t")[0][0])]

    query = (read_staging_stream(spark, str(out), "public.t", maxCommitsPerBatch=1)
             .writeStream.format("memory").queryName("staged_t")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    offsets = [p["sources"][0]["endOffset"] for p in query.recentProgress if p["numInputRows"]]
    assert [json.loads(o)["commit"] if isinstance(o, str) else o["commit"] for o in offsets] == [1, 2]
    assert spark.table("staged_t").count() == batch.count()


def test_a_commit_written_as_several_part_files_reads_as_one(spark, pg_db, tmp_path, monkeypatch):
    """A staging commit large enough to be written as several part files (row-ordered, a transaction spanning
    two, encoded side by side) reads back in Spark, batch and stream, as the rows staged; applied, it gives the
    server's table, including a key change whose preimage and postimage lie on both sides of a file boundary."""
    from spockwire.ingest import staging as staging_mod

    monkeypatch.setattr(staging_mod, "PART_MIN_ROWS", 32)
    monkeypatch.setattr(staging_mod, "ENCODE_THREADS", 3)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, amount numeric(10,2))")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    slot = f"{pg_db.name}_s1"[:63]
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    # 97 rows in one commit, three files of 33, 33 and 31 rows: the 50 inserts and 15 updates are rows 0-64, the
    # key change's preimage row 65 (the last of file 2) and its postimage row 66 (the first of file 3)
    pg_db.execute("INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 50) g")
    pg_db.execute("UPDATE t SET amount = amount + 1 WHERE id <= 15")
    pg_db.execute("UPDATE t SET id = 1000 WHERE id = 50")
    pg_db.execute("DELETE FROM t WHERE id BETWEEN 16 AND 45")
    rows = pg_db.query("SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                       "'proto_version', '1', 'publication_names', 'pub')", (slot,))
    dec = spockwire.Decoder("pgoutput")
    for _lsn, data in rows:
        dec.feed(bytes(data))
    out = tmp_path / "staging"
    with StagingWriter(out, protocol="pgoutput") as staging:
        staging.add_all(dec.drain())
        entry = staging.commit(dec.committed_lsn)
    files = entry["files"]
    staged = sum(f["rows"] for f in files)
    assert staged == 50 + 15 + 2 + 30 and [f["rows"] for f in files] == [33, 33, 31]
    assert [f["path"].rsplit("-", 1)[1] for f in files] == ["1.parquet", "2.parquet", "3.parquet"]
    # the key change: preimage the last row of file 2, postimage the first of file 3
    assert (files[1]["last_commit_lsn"], files[1]["last_seq"] + 1) == (files[2]["first_commit_lsn"],
                                                                        files[2]["first_seq"])
    batch = read_staging(spark, str(out), "public.t")
    assert batch.count() == staged
    changes = batch.filter("_change_type LIKE 'update_%'").orderBy("_commit_lsn", "_seq").collect()
    assert [(r["_change_type"], r["id"]) for r in changes[-2:]] == [("update_preimage", 50),
                                                                    ("update_postimage", 1000)]
    applied = apply_changes(batch, None, format="memory", keys=["id"]).select("id", "v", "amount")
    assert sorted(tuple(r) for r in applied.collect()) == \
        sorted(tuple(r) for r in pg_db.query("SELECT id, v, amount FROM t"))
    query = (read_staging_stream(spark, str(out), "public.t", maxCommitsPerBatch=1)
             .writeStream.format("memory").queryName("staged_parts")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert spark.table("staged_parts").count() == staged
