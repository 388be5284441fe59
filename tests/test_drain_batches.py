"""A transaction fed in small pieces, with drain() after each (what a live stream does), comes out at its COMMIT
as one batch per relation, with the same rows as when fed whole; bounded by spill_bytes and batch_rows as before.
Both implementations."""
from __future__ import annotations

import pyarrow as pa
import pytest

from tests import wire_encoder as W

pytestmark = pytest.mark.fast

R_COLS = [W.Col("id", 23, -1, True), W.Col("note", 25)]
S_COLS = [W.Col("k", 20, -1, True)]


def _records(rows: int, *, truncate_at: int | None = None):
    recs = [W.pgoutput("R", relid=1, namespace="public", name="r", replident="d", columns=R_COLS),
            W.pgoutput("R", relid=2, namespace="public", name="s", replident="d", columns=S_COLS),
            W.pgoutput("B", final_lsn=0x5000, commit_ts=0, xid=900)]
    for i in range(rows):
        if i == truncate_at:
            recs.append(W.pgoutput("T", relids=[2], flags=0))
        if i % 3 == 2:
            recs.append(W.pgoutput("I", relid=2, new=[str(i * 7)]))
        else:
            recs.append(W.pgoutput("I", relid=1, new=[str(i), f"note {i}"]))
    recs.append(W.pgoutput("C", commit_lsn=0x5000, end_lsn=0x5040, commit_ts=0))
    return [(0x1000 + 8 * k, r) for k, r in enumerate(recs)]


def _rows(events):
    """(kind, relation, rows) per event, rows as Python dicts in _seq order within the event."""
    out = []
    for e in events:
        if hasattr(e, "to_arrow"):
            out.append(("rows", e.relation.name, e.to_arrow().to_pylist()))
        else:
            out.append((type(e).__name__, None, None))
    return out


def _by_seq(events):
    rows = [r for kind, _, batch in _rows(events) if kind == "rows" for r in batch]
    return sorted(rows, key=lambda r: r["_seq"])


def _piecewise(impl, records, **kwargs):
    dec = impl.Decoder("pgoutput", **kwargs)
    events, drains_with_events = [], 0
    for lsn, payload in records:
        dec.feed_frames(W.frames([(lsn, payload)]))
        got = dec.drain()
        drains_with_events += bool(got)
        events.extend(got)
    return events, drains_with_events


def _whole(impl, records, **kwargs):
    dec = impl.Decoder("pgoutput", **kwargs)
    dec.feed_frames(W.frames(records))
    return dec.drain()


def test_one_batch_per_relation_at_commit(impl):
    records = _records(3000)
    events, drains = _piecewise(impl, records)
    assert drains == 1                                # nothing before the COMMIT, everything at it
    assert [(k, name) for k, name, _ in _rows(events)] == [("rows", "r"), ("rows", "s")]
    assert [len(b) for _, _, b in _rows(events)] == [2000, 1000]
    assert _by_seq(events) == _by_seq(_whole(impl, records))


def test_a_truncate_keeps_its_place(impl):
    records = _records(300, truncate_at=150)
    events, _ = _piecewise(impl, records)
    kinds = [(k, name) for k, name, _ in _rows(events)]
    assert kinds.index(("Truncate", None)) > 0       # rows before it come out before it
    before = [r for k, _, b in _rows(events)[:kinds.index(("Truncate", None))] if k == "rows" for r in b]
    assert max(r["_seq"] for r in before) < min(r["_seq"] for r in _by_seq(events) if r not in before)
    assert _by_seq(events) == _by_seq(_whole(impl, records))


@pytest.mark.parametrize("limits", [{"batch_rows": 256}, {"spill_bytes": 4096}], ids=["batch_rows", "spill_bytes"])
def test_limits_still_cut_the_open_transaction(impl, limits, tmp_path):
    records = _records(3000)
    events, _ = _piecewise(impl, records, spill_dir=str(tmp_path), **limits)
    sizes = [len(b) for k, _, b in _rows(events) if k == "rows"]
    assert len(sizes) > 2 and max(sizes) <= limits.get("batch_rows", 3000)
    assert _by_seq(events) == _by_seq(_whole(impl, records))


def test_a_relation_described_again_keeps_its_rows_in_order(impl):
    """The relation is described again in the middle of the transaction: its rows before that stay in a builder of
    the old description that is not full, those after fill a new one (batch_rows=2). A drain then must not keep the
    first builder open while the second one's rows are parked, or they would come out before the earlier rows."""
    again = W.pgoutput("R", relid=1, namespace="public", name="r", replident="d", columns=R_COLS)
    recs = [W.pgoutput("R", relid=1, namespace="public", name="r", replident="d", columns=R_COLS),
            W.pgoutput("B", final_lsn=0x5000, commit_ts=0, xid=900)]
    recs += [W.pgoutput("I", relid=1, new=[str(i), "x"]) for i in range(3)]
    recs += [again] + [W.pgoutput("I", relid=1, new=[str(i), "y"]) for i in range(3, 5)]
    records = [(0x1000 + 8 * k, r) for k, r in enumerate(recs)]
    dec = impl.Decoder("pgoutput", batch_rows=2)
    for lsn, payload in records:
        dec.feed(payload, lsn)
    events = dec.drain()           # the transaction is still open: nothing comes out yet
    assert events == []
    dec.feed(W.pgoutput("C", commit_lsn=0x5000, end_lsn=0x5040, commit_ts=0), 0x2000)
    events = dec.drain()
    ids = [r["id"] for _, _, batch in _rows(events) for r in batch]
    assert ids == [0, 1, 2, 3, 4]
    assert [r["_seq"] for _, _, batch in _rows(events) for r in batch] == sorted(r["_seq"] for r in _by_seq(events))


def test_both_implementations_cut_alike(both_impls):
    records = _records(2000, truncate_at=999)
    shapes = []
    for impl in both_impls:
        events, drains = _piecewise(impl, records, spill_bytes=16384)
        shapes.append((drains, [(k, name, len(b) if b is not None else None) for k, name, b in _rows(events)]))
        assert pa.Table.from_pylist(_by_seq(events)).num_rows == 2000
    assert shapes[0] == shapes[1]


def test_watermark_rows_are_put_in_commit_order():
    """A decoder drains one batch per relation for a read: order_around_watermarks cuts the other tables' batches
    at each watermark row's commit LSN, so every watermark comes after the rows committed before it and before
    those committed after it; a truncate keeps its place."""
    from spockwire.model import Column, Relation, Truncate
    from spockwire.snapshot.chunked import WATERMARK_TABLE, order_around_watermarks

    def batch(schema_table: str, lsns: list[int]):
        nsp, name = schema_table.split(".")
        rel = Relation(hash(name) & 0xFFFF, nsp, name, (Column("id", 20, -1, True),), "d", 1)
        rb = pa.record_batch({"_change_type": ["insert"] * len(lsns), "_commit_lsn": pa.array(lsns, pa.uint64()),
                              "_seq": pa.array(range(len(lsns)), pa.int64()), "id": pa.array(lsns, pa.int64())})
        from spockwire.model import ChangeBatch
        return ChangeBatch(rel, rb)

    items, big = batch("public.items", [10, 20, 30, 40]), batch("public.big", [15, 35])
    marks = batch(WATERMARK_TABLE, [25, 38])
    trunc = Truncate((items.relation,), False, False, 50, None, 900, 0, None)
    tail = batch("public.items", [60])
    out = order_around_watermarks([items, big, marks, trunc, tail])
    shape = [(e.relation.name, e.to_arrow().column("_commit_lsn").to_pylist()) if hasattr(e, "to_arrow")
             else "truncate" for e in out]
    assert shape == [("items", [10, 20]), ("big", [15]), ("spockwire_watermark", [25]),
                     ("items", [30]), ("big", [35]), ("spockwire_watermark", [38]), ("items", [40]),
                     "truncate", ("items", [60])]
    assert order_around_watermarks([items, big]) == [items, big]     # no watermark: untouched
