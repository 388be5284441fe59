"""strings="view": string and binary columns as string_view / binary_view over the input (spockwire/wire/views.py).

The expected values are the source values the streams are built from (and, in the live test, the server's own
text of the table); both implementations must give the same batches, the same values and the same errors.
"""
from __future__ import annotations

import gc
import json
import os
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spockwire.errors import ProtocolError
from spockwire.wire.views import pin_source, to_plain
from tests import wire_encoder as W
from tests.test_spill import open_spill_fds

# id int4, body text, name varchar, doc jsonb, js json, data bytea
COLS = [W.Col("id", 23, -1, True), W.Col("body", 25), W.Col("name", 1043), W.Col("doc", 3802), W.Col("js", 114),
        W.Col("data", 17)]
VIEW_TYPES = {"id": pa.int32(), "body": pa.string_view(), "name": pa.string_view(), "doc": pa.string_view(),
              "js": pa.string_view(), "data": pa.binary_view()}
# empty, inline (<= 12 bytes), the 12/13-byte boundary, long values, non-ASCII
BODIES = ["", "a", "x" * 12, "y" * 13, "héllo wörld!", "z" * 5000, "long " * 40 + "ü"]


def _source_rows(n: int = 40):
    """(id, body, name, doc, js, data) of each row; None is NULL."""
    rows = []
    for i in range(n):
        body = BODIES[i % len(BODIES)] if i % 9 != 8 else None
        name = f"n{i}" * (i % 5)
        doc = {"i": i, "pad": "p" * (i % 15)}
        js = f'{{"k": {i}}}' if i % 4 else None
        data = bytes(range(i % 30)) if i % 6 else None
        rows.append((i, body, name, doc, js, data))
    return rows


def _wire(row, binary: bool):
    i, body, name, doc, js, data = row
    doc_text = json.dumps(doc, separators=(", ", ": "))
    if binary:
        return [struct.pack(">i", i), None if body is None else body.encode(), name.encode(),
                b"\x01" + doc_text.encode(), None if js is None else js.encode(), data]
    return [str(i), body, name, doc_text, js, None if data is None else "\\x" + data.hex()]


def _records(rows, binary: bool, *, toast_updates: bool = True):
    """One transaction: the rows inserted, then updated leaving body unchanged ('u')."""
    recs = [W.pgoutput("R", relid=1, namespace="public", name="docs", replident="d", columns=COLS),
            W.pgoutput("B", final_lsn=0x9000, commit_ts=0, xid=700)]
    for row in rows:
        recs.append(W.pgoutput("I", relid=1, new=_wire(row, binary)))
    if toast_updates:
        for row in rows:
            values = _wire(row, binary)
            values[1] = W.UNCHANGED
            recs.append(W.pgoutput("U", relid=1, new=values))
    recs.append(W.pgoutput("C", commit_lsn=0x9000, end_lsn=0x9040, commit_ts=0))
    return [(0x1000 + 8 * k, r) for k, r in enumerate(recs)]


def _expected(rows, toast_updates: bool = True):
    out = []
    for i, body, name, doc, js, data in rows:
        out.append({"id": i, "body": body, "name": name, "doc": json.dumps(doc, separators=(", ", ": ")), "js": js,
                    "data": data, "_unchanged_toast": None})
    if toast_updates:
        for r in list(out):
            out.append(dict(r, body=None, _unchanged_toast=["body"]))
    return out


def _rows(batches):
    names = ["id", "body", "name", "doc", "js", "data", "_unchanged_toast"]
    return [{k: r[k] for k in names} for b in batches for r in b.to_pylist()]


def _decode(impl, body, entry: str = "frames", **kwargs):
    dec = impl.Decoder("pgoutput", strings="view", **kwargs)
    if entry == "frames":
        dec.feed_frames(body)
    else:
        for _lsn, payload in body:
            dec.feed(payload)
    return [e.to_arrow() for e in dec.drain()]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("entry", ["bytes", "bytearray", "messages"])
def test_view_values_are_the_source_values(impl, binary, entry):
    rows = _source_rows()
    records = _records(rows, binary)
    body = W.frames(records)
    if entry == "bytes":
        batches = _decode(impl, body)
    elif entry == "bytearray":
        batches = _decode(impl, bytearray(body))
    else:
        batches = _decode(impl, [(lsn, bytes(p)) for lsn, p in records], entry="messages")
    for b in batches:
        b.validate(full=True)
        for name, typ in VIEW_TYPES.items():
            assert b.schema.field(name).type == typ
    assert _rows(batches) == _expected(rows)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_raw_columns_are_views(impl, binary):
    rows = _source_rows(12)
    (batch,) = _decode(impl, W.frames(_records(rows, binary)), types="raw")
    kind = pa.binary_view() if binary else pa.string_view()
    assert {batch.schema.field(c.name).type for c in COLS} == {kind}
    got = batch.column("body").to_pylist()[:12]
    want = [None if r[1] is None else (r[1].encode() if binary else r[1]) for r in rows]
    assert got == want


def test_both_implementations_cut_and_copy_alike(both_impls):
    """Chunks fed one by one, each its own bytes object, with pin_bytes a little over two chunks: a batch that
    would pin a third one is cut (rows spanning the cut come out whole on either side), identically in both."""
    rows = _source_rows(60)
    records = _records(rows, binary=True)
    head, rest = records[:2], records[2:]
    chunks = [W.frames(head)] + [W.frames(rest[k:k + 10]) for k in range(0, len(rest), 10)]
    limit = int(max(len(c) for c in chunks) * 2.5)
    results = []
    for impl in both_impls:
        dec = impl.Decoder("pgoutput", strings="view", pin_bytes=limit)
        for chunk in chunks:
            dec.feed_frames(chunk)
        results.append([e.to_arrow() for e in dec.drain()])
    c_batches, py_batches = results
    assert [b.num_rows for b in c_batches] == [b.num_rows for b in py_batches]
    assert len(c_batches) > 1
    for x, y in zip(c_batches, py_batches):
        x.validate(full=True)
        assert x.equals(y)
    assert _rows(c_batches) == _expected(rows)
    # an input larger than pin_bytes on its own is copied, never a reason to cut
    for impl in both_impls:
        assert len(_decode(impl, W.frames(records), pin_bytes=1000)) == 1


def test_pinned_input_is_not_copied_and_outlives_its_owner():
    from spockwire.wire import _decoder

    rows = _source_rows(14)
    body = W.frames(_records(rows, binary=True, toast_updates=False))
    address, size = pa.py_buffer(body).address, len(body)
    (batch,) = _decode(_decoder, body)
    del body
    gc.collect()
    buffers = batch.column("body").buffers()
    # validity, views, the column's own buffer (values not in the input: none here), then the pinned input
    assert buffers[2].size == 0
    assert buffers[3].address == address and buffers[3].size == size
    assert batch.column("body").to_pylist() == [r[1] for r in rows]


def test_mutable_input_is_copied(impl):
    rows = _source_rows(14)
    buf = bytearray(W.frames(_records(rows, binary=True)))
    dec = impl.Decoder("pgoutput", strings="view")
    dec.feed_frames(buf)
    events = dec.drain()
    buf[:] = bytes(len(buf))           # the owner reuses its buffer
    assert _rows([e.to_arrow() for e in events]) == _expected(rows)


@pytest.mark.parametrize("strings", ["plain", "view"])
@pytest.mark.parametrize("bad", ["utf8", "jsonb-version"])
def test_errors_are_identical(both_impls, strings, bad):
    rows = _source_rows(3)
    values = _wire(rows[1], binary=True)
    if bad == "utf8":
        values[1] = b"fine so far \xff\xfe"
    else:
        values[3] = b"\x02{}"
    records = _records(rows[:1], binary=True, toast_updates=False)
    records.insert(-1, (0x3000, W.pgoutput("I", relid=1, new=values)))
    errors = []
    for impl in both_impls:
        dec = impl.Decoder("pgoutput", strings=strings)
        with pytest.raises(ProtocolError) as info:
            dec.feed_frames(W.frames(records))
        e = info.value
        errors.append((type(e), str(e), e.offset, e.column, e.column_name, getattr(e, "frame_offset", None)))
    assert errors[0] == errors[1]
    assert errors[0][3] == (1 if bad == "utf8" else 3)


def test_option_checks(impl):
    with pytest.raises(ValueError, match="strings must be 'plain' or 'view'"):
        impl.Decoder("pgoutput", strings="views")
    with pytest.raises(ValueError, match="pin_bytes must not be negative"):
        impl.Decoder("pgoutput", strings="view", pin_bytes=-1)
    dec = impl.Decoder("pgoutput", strings="view", pin_bytes=123)
    assert (dec.strings, dec.pin_bytes) == ("view", 123)


def test_what_is_pinned():
    data = b"abc" * 10
    assert pin_source(data) is data
    view = memoryview(data)[3:]
    assert pin_source(view) is view
    assert pin_source(bytearray(data)) is None
    assert pin_source(memoryview(bytearray(data))) is None


def _spill_file_sizes(folder) -> list[int]:
    return [os.fstat(fd).st_size for fd in open_spill_fds(folder)]


def test_spilled_views_come_back_as_views(impl, tmp_path):
    """A streamed transaction spilled to disk: the view columns are stored as their bytes, not as the whole
    pinned input (here 4 MB of a logical message in the same buffer), and come back as views."""
    rows = _source_rows(30)
    recs = [W.pgoutput("R", relid=1, namespace="public", name="docs", replident="d", columns=COLS),
            W.pgoutput("M", flags=0, lsn=0x500, prefix="pad", content=b"\0" * (4 << 20)),
            W.pgoutput("S", xid=900, first_segment=1)]
    for row in rows:
        recs.append(W.pgoutput("I", xid=900, relid=1, new=_wire(row, binary=True)))
    recs += [W.pgoutput("E"), W.pgoutput("c", xid=900, commit_lsn=0x900, end_lsn=0x940, commit_ts=0)]
    body = W.frames([(0x100 + i, r) for i, r in enumerate(recs)])
    dec = impl.Decoder("pgoutput", strings="view", batch_rows=8, spill_bytes=0, spill_dir=str(tmp_path))
    dec.feed_frames(body)
    events = [e for e in dec.drain() if hasattr(e, "to_arrow")]
    sizes = _spill_file_sizes(tmp_path)
    assert sizes and sum(sizes) < (1 << 20)
    batches = [e.to_arrow() for e in events]
    for b in batches:
        assert b.schema.field("body").type == pa.string_view()
        assert b.schema.field("data").type == pa.binary_view()
    assert _rows(batches) == _expected(rows, toast_updates=False)


def test_staging_and_spark_conform_take_views(impl, tmp_path):
    from spockwire.ingest.staging import StagingWriter
    from spockwire.spark.schema import conform_array

    rows = _source_rows(20)
    dec = impl.Decoder("pgoutput", strings="view")
    dec.feed_frames(W.frames(_records(rows, binary=True)))
    events = dec.drain()
    with StagingWriter(tmp_path / "out", protocol="pgoutput") as writer:
        writer.add_all(events)
        writer.commit(dec.committed_lsn)
    (path,) = (tmp_path / "out").glob("public.docs/v*/*.parquet")
    table = pq.read_table(path)
    assert table.schema.field("body").type == pa.string()
    assert table.schema.field("data").type == pa.binary()
    assert _rows(table.to_batches()) == _expected(rows)
    column = events[0].to_arrow().column("body")
    assert conform_array(column, pa.string()).equals(column.cast(pa.string()))
    plain, positions = to_plain(events[0].to_arrow())
    assert [plain.schema.field(i).name for i in positions] == ["body", "name", "doc", "js", "data"]


# ---------------------------------------------------------------------------------------------------------------
# a TOAST-heavy table on a real server

@pytest.mark.pg
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_toast_heavy_table_matches_the_server(impl, pg_db, binary):
    pg_db.execute("""
        CREATE TABLE docs (id int PRIMARY KEY, title text, body text, data bytea, doc jsonb);
        ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL, ALTER COLUMN data SET STORAGE EXTERNAL;
        CREATE PUBLICATION pub FOR TABLE docs;
    """)
    slot = f"views_{'b' if binary else 't'}"
    pg_db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg_db.execute("""
        INSERT INTO docs
        SELECT g, 'doc ' || g,
               CASE g % 5 WHEN 0 THEN '' WHEN 1 THEN repeat('x', 12) WHEN 2 THEN repeat('y', 13)
                          ELSE (SELECT string_agg(md5(g::text || i::text), 'ü') FROM generate_series(1, 700) i) END,
               CASE WHEN g % 7 = 0 THEN NULL ELSE decode(repeat(md5(g::text), 200 * (g % 3)), 'hex') END,
               jsonb_build_object('g', g, 'tag', repeat('t', g % 20))
        FROM generate_series(1, 60) g;
        UPDATE docs SET title = title || ' (reviewed)';
    """)
    opts = ", 'binary', 'true'" if binary else ""
    records = pg_db.query(f"SELECT lsn - '0/0', data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, "
                          f"'proto_version', '1', 'publication_names', 'pub'{opts})")
    body = W.frames([(int(lsn), bytes(data)) for lsn, data in records])
    batches = _decode(impl, body)
    got = [r for b in batches for r in b.to_pylist()]
    assert len(got) == 120
    server = {r[0]: {"title": r[1], "body": r[2], "data": None if r[3] is None else bytes(r[3]), "doc": r[4]}
              for r in pg_db.query("SELECT id, title::text, body::text, data, doc::text FROM docs")}
    for b in batches:
        b.validate(full=True)
        assert b.schema.field("body").type == pa.string_view()
        assert b.schema.field("data").type == pa.binary_view()
    toasted = set()
    for r in got:
        want = server[r["id"]]
        unchanged = r["_unchanged_toast"] or []
        for name in ("body", "data", "doc"):
            if name in unchanged:
                # left out by the server: only values stored out of line are (STORAGE EXTERNAL, over about 2 KB)
                assert r["_change_type"] == "update_postimage" and r[name] is None and len(want[name]) > 2000
                toasted.add(name)
            else:
                assert r[name] == want[name], (r["id"], name)
        if r["_change_type"] != "insert":
            assert r["title"] == want["title"]
    assert toasted == {"body", "data"}


@pytest.mark.parametrize("spill_bytes", [None, 0], ids=["in-memory", "spilled"])
def test_aborted_subtransaction_rows_are_dropped(impl, tmp_path, spill_bytes):
    """Dropping the rows of an aborted subtransaction filters the batch (pyarrow has no filter kernel for views)."""
    rows = _source_rows(10)
    recs = [W.pgoutput("R", relid=1, namespace="public", name="docs", replident="d", columns=COLS),
            W.pgoutput("S", xid=40, first_segment=1)]
    for row in rows:
        recs.append(W.pgoutput("I", xid=41 if row[0] % 3 == 0 else 40, relid=1, new=_wire(row, binary=True)))
    recs += [W.pgoutput("E"), W.pgoutput("A", xid=40, subxid=41),
             W.pgoutput("c", xid=40, commit_lsn=0x500, end_lsn=0x540, commit_ts=0)]
    kwargs = {} if spill_bytes is None else {"spill_bytes": spill_bytes, "spill_dir": str(tmp_path)}
    batches = _decode(impl, W.frames([(0x100 + i, r) for i, r in enumerate(recs)]), batch_rows=4, **kwargs)
    kept = [r for r in rows if r[0] % 3]
    for b in batches:
        assert b.schema.field("body").type == pa.string_view()
    assert _rows(batches) == _expected(kept, toast_updates=False)


@pytest.mark.parametrize("length", [32, 64, 40])
@pytest.mark.parametrize("types", ["typed", "raw"])
def test_utf8_check_stops_at_the_value_end(impl, length, types):
    """A text value whose ASCII run ends exactly where a 32-byte step of the UTF-8 check ends, followed in the
    buffer by a byte that is not UTF-8 (here the first byte of an incomplete next frame header): the check reads
    nothing past the value (fuzz/regressions/asan-utf8-check-past-ascii-run)."""
    cols = [W.Col("id", 23, -1, True), W.Col("note", 25)]
    recs = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
            W.pgoutput("B", final_lsn=0x900, commit_ts=0, xid=5),
            W.pgoutput("I", relid=1, new=["1", "a" * length]),
            W.pgoutput("C", commit_lsn=0x900, end_lsn=0x940, commit_ts=0)]
    body = W.frames([(0x100 + i, r) for i, r in enumerate(recs[:3])])
    dec = impl.Decoder("pgoutput", types=types)
    assert dec.feed_frames(body + b"\x80", partial_ok=True) == len(body)
    dec.feed(recs[3])
    (batch,) = [e.to_arrow() for e in dec.drain()]
    assert batch.column("note").to_pylist() == ["a" * length]


def test_a_fed_slice_pins_its_whole_bytes_object(both_impls):
    """pin_bytes counts what a batch keeps alive: the whole bytes object behind a memoryview slice. Two small
    slices of one 3 MB object: with a 1 MB limit it is never pinned (copies, no cut); with 5 MB the first slice
    pins it and the second (another memoryview, pinned on its own) would take the batch to 6 MB: a cut."""
    rows = _source_rows(8)
    records = _records(rows, binary=True, toast_updates=False)
    first, second = W.frames(records[:5]), W.frames(records[5:])
    whole = first + b"\0" * (3 << 20) + second
    results = []
    for limit in (1 << 20, 5 << 20):
        for impl in both_impls:
            dec = impl.Decoder("pgoutput", strings="view", pin_bytes=limit)
            view = memoryview(whole)
            dec.feed_frames(view[:len(first)])
            dec.feed_frames(view[len(whole) - len(second):])
            batches = [e.to_arrow() for e in dec.drain()]
            assert _rows(batches) == _expected(rows, toast_updates=False)
            results.append((limit, impl.IMPLEMENTATION, [b.num_rows for b in batches]))
    assert [r[2] for r in results] == [[8], [8], [3, 5], [3, 5]]
