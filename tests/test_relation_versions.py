"""A relation described again in the middle of an open transaction.

pgoutput sends a Relation message again whenever the server's cache entry for the table is invalidated -- also in
the middle of a large streamed transaction (for example when autovacuum analyzes the table while it is decoded).
Rows decoded before the message belong to the previous version, rows after it to the new one; both must come out
at commit in (`_commit_lsn`, `_seq`) order, per table, whatever the batch size and whether closed batches were
spilled to disk. The staging writer relies on that order: it drops a row whose key is not above the table's
high-water mark as already staged, so a batch of the previous version released after batches of the new one
would be lost there.
"""
from __future__ import annotations

import pytest

from spockwire.ingest.staging import StagingState, StagingWriter
from tests import wire_encoder as W
from tests.normalize import check_ordering

COLS = [W.Col("id", 20, -1, True), W.Col("msg", 25, -1, False)]
ROWS = 40
RESENT_AT = (3, 17, 18, 31)      # the Relation message comes again before these rows
XID, COMMIT_LSN, END_LSN = 900, 0x9000, 0x9100


def _relation(**xid):
    return W.pgoutput("R", relid=7, namespace="public", name="log", replident="d", columns=COLS, **xid)


def _rows(xid_field: dict) -> list[bytes]:
    out = []
    for i in range(ROWS):
        if i in RESENT_AT:
            out.append(_relation(**xid_field))
        out.append(W.pgoutput("I", relid=7, new=[str(i), f"row {i}"], **xid_field))
    return out


def _stream(kind: str) -> list[bytes]:
    """The records of one transaction of `kind` holding ROWS inserts, with the relation re-described inside."""
    records = [_relation()]
    if kind == "plain":
        records.append(W.pgoutput("B", final_lsn=COMMIT_LSN, commit_ts=0, xid=XID))
        records += _rows({})
        records.append(W.pgoutput("C", commit_lsn=COMMIT_LSN, end_lsn=END_LSN, commit_ts=0))
    elif kind == "prepared":
        records.append(W.pgoutput("b", lsn=COMMIT_LSN - 0x100, end_lsn=COMMIT_LSN - 0x80, ts=0, xid=XID, gid="g"))
        records += _rows({})
        records.append(W.pgoutput("P", lsn=COMMIT_LSN - 0x100, end_lsn=COMMIT_LSN - 0x80, ts=0, xid=XID, gid="g"))
        records.append(W.pgoutput("K", lsn=COMMIT_LSN, end_lsn=END_LSN, ts=0, xid=XID, gid="g"))
    else:  # streamed in segments of 7 changes, committed or prepared then committed
        rows = _rows({"xid": XID})
        for k in range(0, len(rows), 7):
            records.append(W.pgoutput("S", xid=XID, first_segment=1 if k == 0 else 0))
            records += rows[k:k + 7]
            records.append(W.pgoutput("E"))
        if kind == "streamed":
            records.append(W.pgoutput("c", xid=XID, commit_lsn=COMMIT_LSN, end_lsn=END_LSN, commit_ts=0))
        else:
            records.append(W.pgoutput("p", lsn=COMMIT_LSN - 0x100, end_lsn=COMMIT_LSN - 0x80, ts=0, xid=XID,
                                      gid="g"))
            records.append(W.pgoutput("K", lsn=COMMIT_LSN, end_lsn=END_LSN, ts=0, xid=XID, gid="g"))
    return records


def _decode(impl, kind: str, batch_rows: int, spill_bytes: int | None, tmp_path) -> list:
    kwargs = {} if spill_bytes is None else {"spill_bytes": spill_bytes, "spill_dir": str(tmp_path)}
    dec = impl.Decoder("pgoutput", types="raw", batch_rows=batch_rows, **kwargs)
    dec.feed_frames(W.frames([(0x1000 + i, r) for i, r in enumerate(_stream(kind))]))
    return dec.drain()


KINDS = ["plain", "prepared", "streamed", "stream-prepared"]


@pytest.mark.parametrize("spill_bytes", [None, 0], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("batch_rows", [1, 2, 5, 1000])
@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_both_versions_come_out_in_order(impl, kind, batch_rows, spill_bytes, tmp_path):
    events = _decode(impl, kind, batch_rows, spill_bytes, tmp_path)
    check_ordering(events)
    rows = [(e.relation.version, r) for e in events for r in e.to_arrow().to_pylist()]
    assert [int(r["id"]) for _, r in rows] == list(range(ROWS))
    assert [r["_seq"] for _, r in rows] == list(range(ROWS))
    assert {r["_commit_lsn"] for _, r in rows} == {COMMIT_LSN}
    # each row carries the version that was current when it was sent
    versions = [1 + sum(1 for at in RESENT_AT if at <= i) for i in range(ROWS)]
    assert [v for v, _ in rows] == versions


@pytest.mark.parametrize("kind", KINDS)
def test_staging_keeps_every_row_across_relation_versions(impl, kind, tmp_path):
    """End to end through the staging writer: every row of the transaction is staged exactly once."""
    events = _decode(impl, kind, 2, 0, tmp_path)
    out = tmp_path / "staging"
    with StagingWriter(out, protocol="pgoutput") as writer:
        for event in events:
            writer.add(event)
        writer.commit(END_LSN)
    state = StagingState.load(out)
    assert sum(f.rows for f in state.files["public.log"]) == ROWS
    assert len(state.schemas["public.log"]) == 1     # the same columns every time: one staged schema


# ---------------------------------------------------------------------------------------------------------------
# the same against a real server: ANALYZE of the table while a large transaction writes to it

def test_analyze_in_the_middle_of_a_streamed_transaction(pg_db, impl, tmp_path):
    """PostgreSQL 15 streams a large transaction (logical_decoding_work_mem is 64 kB here) and re-sends the
    Relation message inside it after an ANALYZE of the table committed in the middle (pgoutput's cache entry was
    invalidated). With batches smaller than the transaction, every row still comes out in order and lands in
    staging exactly once."""
    from spockwire.connection.slots import create_publication, create_slot

    pg_db.execute("CREATE TABLE log (id bigserial PRIMARY KEY, msg text)")
    create_publication(pg_db.dsn, "pub")
    slot = f"s_{pg_db.name}"[:63]    # slot names are cluster-wide
    create_slot(pg_db.dsn, slot, "pgoutput")
    writer_conn, other = pg_db.connect(), pg_db.connect()
    writer_conn.autocommit = False    # one transaction around both INSERTs
    other.autocommit = True
    try:
        with writer_conn.cursor() as cur, other.cursor() as cur2:
            cur.execute("INSERT INTO log (msg) SELECT 'row ' || g FROM generate_series(1, 3000) g")
            cur2.execute("ANALYZE log")
            cur.execute("INSERT INTO log (msg) SELECT 'row ' || g FROM generate_series(3001, 6000) g")
        writer_conn.commit()
    finally:
        writer_conn.close()
        other.close()
    records = pg_db.query("SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                          "'publication_names', 'pub', 'proto_version', '2', 'streaming', 'on')", (slot,))
    kinds = [bytes(data)[:1] for _, data in records]
    assert kinds.count(b"R") == 2, "the server did not describe the table again after the ANALYZE"
    assert kinds.count(b"c") == 1 and kinds.count(b"S") > 2      # one transaction, streamed in segments
    dec = impl.Decoder("pgoutput", types="typed", batch_rows=1000, spill_bytes=0, spill_dir=str(tmp_path))
    for lsn, data in records:
        dec.feed(bytes(data), int(lsn))
    events = dec.drain()
    check_ordering(events)
    ids = [i for e in events for i in e.to_arrow().column("id").to_pylist()]
    assert ids == list(range(1, 6001))
    assert {e.relation.version for e in events} == {1, 2}
    out = tmp_path / "staging"
    with StagingWriter(out, protocol="pgoutput") as writer:
        for event in events:
            writer.add(event)
        writer.commit(dec.committed_lsn)
    assert sum(f.rows for f in StagingState.load(out).files["public.log"]) == 6000
