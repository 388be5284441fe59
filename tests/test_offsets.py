"""Arrow's 32-bit offsets: a column's data in one batch never passes 2 GiB - 1, whatever the values expand to.

Binary numeric decoded to text expands ten thousand fold (1e131068: ten bytes in, 131,069 characters out), so the
batch limit counts the bytes a value adds to its column, and every variable-length append refuses to pass the
offset limit: a row message that would take a column past it with the rows already in the batch starts a new batch,
and a value that alone would pass it is a clear error. Validity and bool bitmaps have their unused trailing bits
zeroed (they reach IPC streams and spill files).

The large cases are real sizes (gigabytes of decoded text): each implementation decodes them in turn.
"""
from __future__ import annotations

import gc
import struct

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spockwire.errors import ProtocolError
from tests import wire_encoder as W

OFFSET_LIMIT = (1 << 31) - 1
# numeric 1e131068: one base-10000 digit (1) of weight 32767, as numeric_send writes it
HUGE = struct.pack(">hhHHh", 1, 32767, 0, 0, 1)
HUGE_TEXT_LEN = 131_069


def _array(elements: list[bytes | None], elem_oid: int = 1700) -> bytes:
    """array_send of a one-dimensional array (lower bound 1)."""
    out = [struct.pack(">iiIii", 1, int(any(e is None for e in elements)), elem_oid, len(elements), 1)]
    for e in elements:
        out.append(struct.pack(">i", -1) if e is None else struct.pack(">i", len(e)) + e)
    return b"".join(out)


def _batches(events) -> list[pa.RecordBatch]:
    return [e.to_arrow() for e in events if hasattr(e, "to_arrow")]


def _data_bytes(col: pa.Array) -> int:
    """Bytes of a string column's values."""
    return pc.sum(pc.binary_length(col)).as_py()


# ------------------------------------------------------------------------------------------------ real server
@pytest.fixture(scope="module")
def huge_numeric_stream(pg_cluster):
    """17,000 inserts of numeric 1e131068 in one transaction, read as pgoutput binary, and the server's text."""
    from tests.pg_fixtures import PgDatabase

    db = PgDatabase(pg_cluster, pg_cluster.create_database(pg_cluster.new_database_name("offsets")))
    db.execute("CREATE TABLE big (id int PRIMARY KEY, v numeric)")
    db.execute("CREATE PUBLICATION pub_big FOR TABLE big")
    db.execute("SELECT pg_create_logical_replication_slot('off_binary', 'pgoutput')")
    db.execute("INSERT INTO big SELECT g, 1e131068 FROM generate_series(1, 17000) g")
    rows = db.query("SELECT data FROM pg_logical_slot_peek_binary_changes('off_binary', NULL, NULL, "
                    "'proto_version', '1', 'publication_names', 'pub_big', 'binary', 'true')")
    stream = [bytes(r[0]) for r in rows]
    (server_text,), = db.query("SELECT DISTINCT v::text FROM big")
    return stream, server_text


def test_expanding_numeric_stream_from_a_real_server(huge_numeric_stream, impl, tmp_path):
    """The reproduction: 17,000 × 1e131068 in one transaction, 2.2 GB of text. Batches close by the bytes they
    hold, no offset wraps, and every value is the server's own text."""
    stream, server_text = huge_numeric_stream
    assert len(server_text) == HUGE_TEXT_LEN
    dec = impl.Decoder("pgoutput", spill_dir=str(tmp_path))
    for payload in stream:
        dec.feed(payload)
    batches = _batches(dec.drain())
    assert sum(b.num_rows for b in batches) == 17000
    assert len(batches) >= 3          # 2.2 GB of text at most 1 GiB (plus one row) a batch
    expected_seq = 0
    for b in batches:
        col = b.column("v")
        assert col.type == pa.string()
        assert _data_bytes(col) <= (1 << 30) + HUGE_TEXT_LEN
        assert col.null_count == 0
        assert pc.all(pc.equal(col, server_text)).as_py()
        assert b.column("_seq").to_pylist() == list(range(expected_seq, expected_seq + b.num_rows))
        expected_seq += b.num_rows
    del batches, dec
    gc.collect()


# ------------------------------------------------------------------------------------------------ test encoder
def _relation(type_oid: int) -> bytes:
    return W.pgoutput("R", relid=1, namespace="public", name="t", replident="d",
                      columns=[W.Col("id", 23, -1, True), W.Col("v", type_oid)])


def _decode(impl, rows: list, type_oid: int = 1231, **kwargs):
    # builders are sealed at a quarter of spill_bytes: 4 GiB puts that at the 1 GiB limit these tests are about
    kwargs.setdefault("spill_bytes", 4 << 30)
    dec = impl.Decoder("pgoutput", **kwargs)
    dec.feed(_relation(type_oid))
    dec.feed(W.pgoutput("B", final_lsn=0x100, commit_ts=0, xid=7))
    for row in rows:
        dec.feed(row if isinstance(row, bytes) else W.pgoutput("I", relid=1, new=row))
    dec.feed(W.pgoutput("C", commit_lsn=0x100, end_lsn=0x180, commit_ts=0))
    return dec.drain()


def test_a_row_that_would_wrap_the_offsets_starts_a_new_batch(impl, tmp_path):
    """Row 1 adds 0.66 GB of text (under the 1 GiB batch limit, so row 2 joins its batch), row 2 another 1.57 GB:
    together past 2 GiB - 1. Row 2 closes row 1's batch first and is decoded again into a batch of its own."""
    first = [struct.pack(">i", 1), _array([HUGE] * 5000)]
    second = [struct.pack(">i", 2), _array([HUGE] * 12000)]
    batches = _batches(_decode(impl, [first, second], spill_dir=str(tmp_path)))
    assert [b.num_rows for b in batches] == [1, 1]
    assert [b.column("id").to_pylist() for b in batches] == [[1], [2]]
    assert [b.column("_seq").to_pylist() for b in batches] == [[0], [1]]
    text = "1" + "0" * 131068
    for b, count in zip(batches, (5000, 12000)):
        values = b.column("v").values
        assert len(values) == count
        assert pc.all(pc.equal(values, text)).as_py()
        assert _data_bytes(values) == count * HUGE_TEXT_LEN
    del batches
    gc.collect()


def test_a_value_that_alone_passes_the_offsets_is_a_clear_error(both_impls):
    """One numeric[] of 17,000 × 1e131068: 2.2 GB of text in one value cannot be one Arrow string column."""
    row = [struct.pack(">i", 1), _array([HUGE] * 17000)]
    errors = []
    for impl in both_impls:
        with pytest.raises(ProtocolError) as info:
            _decode(impl, [row])
        errors.append((type(info.value), str(info.value), info.value.offset, info.value.column))
        del info
        gc.collect()
    assert errors[0] == errors[1]
    assert "does not fit one batch" in errors[0][1] and "2147483647" in errors[0][1]
    assert errors[0][3] == 1


def test_values_that_do_not_expand_keep_the_input_limit(both_impls):
    """Values that do not expand count their wire bytes once, as before: batch boundaries are unchanged and the
    same in both implementations."""
    rows = [W.pgoutput("I", relid=1, new=[struct.pack(">i", 1), b"x" * (300 << 20)])] * 4
    shapes = []
    for impl in both_impls:
        batches = _batches(_decode(impl, rows, type_oid=17))
        shapes.append([b.num_rows for b in batches])
        del batches
        gc.collect()
    assert shapes[0] == shapes[1] == [4]     # 900 MB before the fourth row: under 1 GiB


# ------------------------------------------------------------------------------------------------ trailing bits
def _tail_bits(buf: pa.Buffer | None, offset: int, n: int) -> int:
    """The bits of a bitmap's last byte after bit offset + n."""
    if buf is None or (offset + n) % 8 == 0:
        return 0
    last = buf.to_pybytes()[(offset + n) // 8]
    return last >> ((offset + n) % 8)


@pytest.mark.parametrize("rows", [13, 1021])
def test_unused_trailing_bits_are_zero(impl, rows):
    """Validity and bool bitmaps of a batch whose length is not a multiple of 8: the bits past the last row are 0.
    A row that failed half way (its first values written, then garbage) leaves set bits just past the batch's
    rows; they must not reach the batch."""
    dec = impl.Decoder("pgoutput")
    dec.feed(W.pgoutput("R", relid=1, namespace="public", name="t", replident="d",
                        columns=[W.Col("id", 23, -1, True), W.Col("flag", 16), W.Col("n", 23), W.Col("s", 25)]))
    dec.feed(W.pgoutput("B", final_lsn=0x100, commit_ts=0, xid=7))
    for i in range(rows):
        dec.feed(W.pgoutput("I", relid=1, new=[str(i), "t", None if i % 3 else str(i), "a"]))
    dec.feed(W.pgoutput("U", relid=1, new=[str(rows), "t", "1", W.UNCHANGED]))
    with pytest.raises(ProtocolError):
        dec.feed(W.pgoutput("I", relid=1, new=[str(rows + 1), "t", "1", b"\xff\xfe"]))
    dec.feed(W.pgoutput("C", commit_lsn=0x100, end_lsn=0x180, commit_ts=0))
    (batch,) = _batches(dec.drain())
    n = batch.num_rows
    assert n == rows + 1 and n % 8
    for name in ("flag", "n", "_unchanged_toast"):
        col = batch.column(name)
        for buf in col.buffers()[:1] + (col.buffers()[1:2] if col.type == pa.bool_() else []):
            assert _tail_bits(buf, col.offset, n) == 0, (name, impl.IMPLEMENTATION)
    flag = batch.column("flag")
    assert flag.to_pylist() == [True] * n
