"""Huge transactions: rows of open transactions spill to disk past `spill_bytes` and come back exactly at commit."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from spockwire.frames import read_frame_file
from spockwire.wire.spill import SpilledChangeBatch
from tests.normalize import plain_events

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent


def open_spill_fds(folder: Path) -> dict[int, str]:
    """The unnamed files in `folder` this process holds open, by descriptor: its spill files (Linux:
    /proc/self/fd)."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{folder}/") and target.endswith(" (deleted)"):
            found[int(fd)] = target
    return found


def _open_spill_files(folder: Path) -> list[str]:
    return list(open_spill_fds(folder).values())


@pytest.mark.parametrize("name", ["pgoutput_v2_binary_stream", "pgoutput_v3_twophase", "pgoutput_v1_text",
                                  "pglogical_binary"])
def test_spilled_output_equals_in_memory_output(impl, tmp_path, name):
    """Spilling every closed batch (spill_bytes=0, small batches) changes where rows wait, never what comes out:
    streamed transactions with an aborted subtransaction, prepared ones, truncates and messages included."""
    header, body = read_frame_file(DATA / f"{name}.spwf")
    kwargs = dict(protocol=header["protocol"], types="raw", batch_rows=64)
    reference = impl.Decoder(**kwargs)
    reference.feed_frames(body)
    expected = plain_events(reference.drain())

    spilling = impl.Decoder(**kwargs, spill_bytes=0, spill_dir=str(tmp_path))
    spilling.feed_frames(body)
    events = spilling.drain()
    if name in ("pgoutput_v2_binary_stream", "pgoutput_v3_twophase"):
        assert any(isinstance(e, SpilledChangeBatch) for e in events)
        # open, but without a name from the start: a killed process leaves nothing behind
        assert _open_spill_files(tmp_path) and not os.listdir(tmp_path)
    assert plain_events(events) == expected
    assert spilling.committed_lsn == reference.committed_lsn
    del events
    import gc
    gc.collect()
    assert not _open_spill_files(tmp_path), "spill files outlive their batches"


HUGE = textwrap.dedent("""
    import struct, sys
    sys.path.insert(0, {root!r})
    from spockwire.wire import {module} as m

    ROWS = {rows}
    CHUNK = 100_000
    def cs(x): return x.encode() + b"\\0"
    def frame(p): return struct.pack(">IQ", len(p), 0) + p
    R = (b"R" + struct.pack(">I", 16384) + cs("public") + cs("big") + b"d" + struct.pack(">H", 2)
         + b"\\x01" + cs("id") + struct.pack(">Ii", 20, -1) + b"\\x00" + cs("note") + struct.pack(">Ii", 25, -1))
    dec = m.Decoder("pgoutput", spill_bytes=64 << 20, spill_dir={tmp!r})
    dec.feed_frames(frame(b"B" + struct.pack(">QqI", 1 << 40, 0, 7)) + frame(R))
    head = b"I" + struct.pack(">I", 16384) + b"N" + struct.pack(">H", 2)
    note = b"t" + struct.pack(">I", 24) + b"a note of 24 bytes here."
    for lo in range(0, ROWS, CHUNK):
        parts = []
        for i in range(lo, min(lo + CHUNK, ROWS)):
            v = str(i).encode()
            p = head + b"t" + struct.pack(">I", len(v)) + v + note
            parts.append(struct.pack(">IQ", len(p), 0) + p)
        dec.feed_frames(b"".join(parts))
        assert dec.drain() == []          # nothing comes out before the commit
    dec.feed_frames(frame(b"C" + struct.pack(">BQQq", 0, 1 << 40, (1 << 40) + 8, 0)))
    rows = total = 0
    for ev in dec.drain():
        rb = ev.to_arrow()
        rows += rb.num_rows
        total += sum(rb.column("id").to_pylist())
        del rb
    # VmHWM is this process's own high-water mark (ru_maxrss would carry the parent's across exec)
    peak_mb = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024
    print(rows, total, round(peak_mb))
""")


@pytest.mark.parametrize("module,rows", [pytest.param("_decoder", 10_000_000, marks=pytest.mark.slow),
                                         ("_decoder_py", 300_000)])
def test_huge_transaction_memory_is_bounded(tmp_path, module, rows):
    """One transaction of 10 million rows (C; 300k for the slower twin) decodes with peak RSS under 512 MB and
    every row comes out exactly, only at COMMIT."""
    script = HUGE.format(root=str(ROOT), module=module, rows=rows, tmp=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    got_rows, got_total, peak_mb = (int(x) for x in done.stdout.split())
    assert got_rows == rows
    assert got_total == rows * (rows - 1) // 2
    assert peak_mb < 512, f"peak RSS {peak_mb} MB"
    assert not glob.glob(str(tmp_path / "spockwire-spill-*"))


@pytest.mark.parametrize("spill_bytes", [None, 0], ids=["in-memory", "spilled"])
def test_untyped_column_type_after_an_aborted_subtransaction(impl, tmp_path, spill_bytes):
    """An untyped column is binary in a batch only when one of the batch's kept values did not arrive as text:
    once the rows of an aborted subtransaction are dropped, a spilled batch decides it like an in-memory one."""
    from tests import wire_encoder as W

    cols = [W.Col("id", 23, -1, True), W.Col("note", 25, -1, False)]
    records = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
               W.pgoutput("S", xid=40, first_segment=1),
               W.pgoutput("I", xid=41, relid=1, new=["1", b"\x00\xff binary"]),     # subtransaction 41, 'b' values
               W.pgoutput("I", xid=40, relid=1, new=["2", "text"]),
               W.pgoutput("I", xid=40, relid=1, new=["3", None]),
               W.pgoutput("E"),
               W.pgoutput("A", xid=40, subxid=41),
               W.pgoutput("c", xid=40, commit_lsn=0x500, end_lsn=0x540, commit_ts=0)]
    kwargs = {} if spill_bytes is None else {"spill_bytes": spill_bytes, "spill_dir": str(tmp_path)}
    dec = impl.Decoder("pgoutput", types="raw", batch_rows=8, **kwargs)
    dec.feed_frames(W.frames([(0x100 + i, r) for i, r in enumerate(records)]))
    (batch,) = [e.to_arrow() for e in dec.drain()]
    assert batch.column("id").to_pylist() == ["2", "3"]
    assert batch.schema.field("note").type == pa.string()
    assert batch.column("note").to_pylist() == ["text", None]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_batches_are_sealed_at_a_quarter_of_spill_bytes(impl, tmp_path, streamed):
    """A large open transaction's rows are sealed (and spilled) in pieces of a quarter of spill_bytes, not in
    batch_rows-row batches: 5,000 rows of 1,000-byte values with spill_bytes = 4 MiB come out, in order and
    complete, as batches of about 1 MiB, some of them read back from disk."""
    from tests import wire_encoder as W

    cols = [W.Col("id", 23, -1, True), W.Col("note", 25, -1, False)]
    rows = 5000
    records = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols)]
    if streamed:
        records.append(W.pgoutput("S", xid=40, first_segment=1))
        records += [W.pgoutput("I", xid=40, relid=1, new=[str(i), f"{i:08d}" * 125]) for i in range(rows)]
        records += [W.pgoutput("E"), W.pgoutput("c", xid=40, commit_lsn=0x900000, end_lsn=0x900040, commit_ts=0)]
    else:
        records.append(W.pgoutput("B", final_lsn=0x900000, commit_ts=0, xid=40))
        records += [W.pgoutput("I", relid=1, new=[str(i), f"{i:08d}" * 125]) for i in range(rows)]
        records.append(W.pgoutput("C", commit_lsn=0x900000, end_lsn=0x900040, commit_ts=0))
    dec = impl.Decoder("pgoutput", types="typed", spill_bytes=4 << 20, spill_dir=str(tmp_path))
    dec.feed_frames(W.frames([(0x100 + i, r) for i, r in enumerate(records)]))
    events = dec.drain()
    batches = [e.to_arrow() for e in events]
    assert [i for b in batches for i in b.column("id").to_pylist()] == list(range(rows))
    assert all(b.column("note").to_pylist() == [f"{i:08d}" * 125 for i in b.column("id").to_pylist()]
               for b in batches)
    assert len(batches) >= 4
    assert max(b.num_rows for b in batches) <= (1 << 20) // 1000 + 1       # 1 MiB of values at most, plus one
    assert any(isinstance(e, SpilledChangeBatch) for e in events)


@pytest.mark.parametrize("entry", ["feed", "feed_frames"])
def test_a_refused_row_counts_nothing_toward_its_batch(impl, entry):
    """A row message refused at its last value leaves its batch's byte count as it was: 900 rows of 1,000-byte
    values (under the 1 MiB a batch holds with spill_bytes = 4 MiB) come out in one batch, as from a decoder that
    never saw the refused 600 KB row; counting the refused row's bytes would seal the batch early."""
    from spockwire.errors import ProtocolError
    from tests import wire_encoder as W

    cols = [W.Col("id", 23, -1, True), W.Col("note", 25, -1, False), W.Col("n", 23, -1, False)]
    head = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
            W.pgoutput("B", final_lsn=0x900000, commit_ts=0, xid=40)]
    first = [W.pgoutput("I", relid=1, new=[str(i), f"{i:08d}" * 125, "1"]) for i in range(450)]
    second = [W.pgoutput("I", relid=1, new=[str(i), f"{i:08d}" * 125, "1"]) for i in range(450, 900)]
    tail = [W.pgoutput("C", commit_lsn=0x900000, end_lsn=0x900040, commit_ts=0)]
    refused = W.pgoutput("I", relid=1, new=["-1", "x" * 600_000, "one"])

    def decode(parts: list[list[bytes]]) -> list[int]:
        dec = impl.Decoder("pgoutput", types="typed", spill_bytes=4 << 20)
        for part in parts:
            try:
                if entry == "feed":
                    for message in part:
                        dec.feed(message)
                else:
                    dec.feed_frames(W.frames([(0x100 + i, m) for i, m in enumerate(part)]))
            except ProtocolError as exc:
                assert part == [refused] and "column 2" in str(exc), exc
        batches = [e.to_arrow() for e in dec.drain()]
        assert [i for b in batches for i in b.column("id").to_pylist()] == list(range(900))
        return [b.num_rows for b in batches]

    assert decode([head + first, [refused], second + tail]) == decode([head + first + second + tail]) == [900]
