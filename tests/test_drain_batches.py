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


def test_both_implementations_cut_alike(both_impls):
    records = _records(2000, truncate_at=999)
    shapes = []
    for impl in both_impls:
        events, drains = _piecewise(impl, records, spill_bytes=16384)
        shapes.append((drains, [(k, name, len(b) if b is not None else None) for k, name, b in _rows(events)]))
        assert pa.Table.from_pylist(_by_seq(events)).num_rows == 2000
    assert shapes[0] == shapes[1]
