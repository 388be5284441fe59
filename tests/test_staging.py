"""The Parquet staging layout: commit and read back, atomic log, crash leftovers, resume deduplication, errors."""
from __future__ import annotations

import datetime as dt
import errno
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from spockwire import SpockwireError
from spockwire.export.arrow import finish_batch
from spockwire.frames import read_frame_file
from spockwire.ingest import (StagingError, StagingState, StagingWriter, list_tables, read_log, read_messages,
                              read_staging, table_folder_name)
from spockwire.ingest import staging as staging_mod
from spockwire.ingest import staging_files
from spockwire.model import ChangeBatch, Column, LogicalMessage, Relation, Truncate

DATA = Path(__file__).parent / "data"
PGOUTPUT = DATA / "pgoutput_v1_text.spwf"
PGLOGICAL = DATA / "pglogical_text.spwf"
KEY = ["_commit_lsn", "_seq"]


def decode_events(impl, path: Path, **kwargs) -> tuple[list, int]:
    """Decode a capture; values raw (text as sent) unless kwargs say otherwise."""
    header, body = read_frame_file(path)
    dec = impl.Decoder(protocol=header["protocol"], **{"types": "raw", **kwargs})
    dec.feed_frames(body)
    return dec.drain(), dec.committed_lsn


def rows_by_table(events) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in events:
        if isinstance(e, ChangeBatch):
            out.setdefault(e.relation.qualified_name, []).extend(e.to_arrow().to_pylist())
    return out


def staged_files(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def stage_all(out: Path, events, lsn: int, protocol: str = "pgoutput") -> dict:
    with StagingWriter(out, protocol=protocol) as w:
        w.add_all(events)
        return w.commit(lsn)


# ----------------------------------------------------------------------------------------- synthetic events

def relation(name="t", cols=("id", "v"), version=1, relid=100, namespace="public") -> Relation:
    return Relation(relid, namespace, name, tuple(Column(c, 25, -1, i == 0) for i, c in enumerate(cols)), "d",
                    version)


def batch(rel: Relation, rows: list[tuple[int, int, tuple]]) -> ChangeBatch:
    """rows: (commit_lsn, seq, values) inserts."""
    n = len(rows)
    values = [pa.array([r[2][c] for r in rows], pa.string()) for c in range(len(rel.columns))]
    rb = finish_batch(rel, pa.array([0] * n, pa.int8()), pa.array([r[0] for r in rows], pa.uint64()),
                      pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                      pa.array([7] * n, pa.uint32()), pa.array([r[1] for r in rows], pa.int64()),
                      pa.array([None] * n, pa.string()), None, None, None, values)
    return ChangeBatch(rel, rb)


TS = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


# ----------------------------------------------------------------------------------------- write and read back

def test_commit_and_read_back(tmp_path, impl):
    events, lsn = decode_events(impl, PGOUTPUT)
    out = tmp_path / "out"
    entry = stage_all(out, events, lsn)
    assert entry["commit"] == 1 and entry["committed_lsn"] == lsn and entry["protocol"] == "pgoutput"
    expected = rows_by_table(events)
    assert list_tables(out) == sorted(expected)
    for table, rows in expected.items():
        got = read_staging(out, table).to_pylist()
        assert [(r["_commit_lsn"], r["_seq"], r["_change_type"]) for r in got] == \
               [(r["_commit_lsn"], r["_seq"], r["_change_type"]) for r in rows]
        names = [c for c in rows[0] if not c.startswith("_")]
        assert [[r.get(c) for c in names] for r in got] == [[r[c] for c in names] for r in rows]
    # every file the entry names exists, with the documented name, and nothing else is in the folder
    named = {f["path"] for f in entry["files"]} | {m["path"] for m in entry["messages"]}
    assert staged_files(out) == named | {"_spockwire/lock", "_spockwire/log/00000000000000000001.json"}
    for f in entry["files"]:
        folder, version, name = f["path"].split("/")
        assert folder == table_folder_name(*f["table"].split(".", 1))
        assert version == f"v{f['schema_version']}"
        assert name == f"part-{f['first_commit_lsn']:016X}-{f['last_commit_lsn']:016X}-00000001.parquet"
        assert f["bytes"] == (out / f["path"]).stat().st_size
    # relation versions: t2 was re-described unchanged (decoder v1, v3) -> one folder; evolving changed -> v1, v2
    assert sorted(p.name for p in (out / "public.t2").iterdir()) == ["v1"]
    assert sorted(p.name for p in (out / "public.evolving").iterdir()) == ["v1", "v2"]
    evolving = read_staging(out, "public.evolving")
    assert "extra" in evolving.column_names and evolving.column("extra").to_pylist()[0] is None
    # truncates and messages
    assert [t["tables"] for t in entry["truncates"]] == [["public.t2", "public.t3"]]
    msgs = read_messages(out).to_pylist()
    assert [(m["prefix"], m["transactional"]) for m in msgs] == \
           [(e.prefix, e.transactional) for e in events if isinstance(e, LogicalMessage)]
    everything = read_staging(out)
    assert everything.column_names[0] == "_table"
    assert everything.num_rows == sum(len(r) for r in expected.values())


def test_dictionary_only_for_columns_of_few_values(tmp_path):
    """A staged file dictionary-encodes the change columns that hold a few values per file and the table columns
    with few distinct values among the rows it samples (a status column); a column of distinct values (a key, a
    free text) is written with plain pages, and every value reads back."""
    import pyarrow.parquet as pq

    rel = relation(cols=("id", "status", "note"))
    n = 20_000
    rows = [(1000 + i // 500, i, (str(i), ("new", "paid", "sent")[i % 3], f"note {i * 7919}"))
            for i in range(n)]
    entry = stage_all(tmp_path, [batch(rel, rows[:n // 2]), batch(rel, rows[n // 2:])], 1000 + n // 500)
    (f,) = entry["files"]
    meta = pq.ParquetFile(tmp_path / f["path"]).metadata
    chunks = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i)
              for i in range(meta.num_columns)}

    def has_dictionary(name: str) -> bool:
        return chunks[name].dictionary_page_offset is not None

    for name in ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_origin", "status"):
        assert has_dictionary(name), name
    for name in ("_seq", "id", "note"):
        assert not has_dictionary(name), name
    got = read_staging(tmp_path, "public.t").to_pylist()
    assert [(r["_commit_lsn"], r["_seq"], r["id"], r["status"], r["note"]) for r in got] == \
           [(lsn, seq, *values) for lsn, seq, values in rows]
    # an empty table: nothing to sample
    assert staging_files.dictionary_columns(pa.table({"a": pa.array([], pa.string())})) == ["a"]
    # the sample is taken chunk by chunk, at the same rows as over one chunk
    chunked = pa.chunked_array([list(range(7)), [7], [], list(range(8, 30))])
    for step in (1, 2, 3, 5, 40):
        assert staging_files._every_nth(chunked, step).to_pylist() == list(range(0, 30, step))


def test_state_reports_resume_point_and_high_water(tmp_path, impl):
    events, lsn = decode_events(impl, PGOUTPUT)
    out = tmp_path / "out"
    stage_all(out, events, lsn)
    state = StagingState.open(out)
    assert state.committed_lsn == lsn and state.commit == 1 and state.removed == []
    for table, rows in rows_by_table(events).items():
        top = max((r["_commit_lsn"], r["_seq"]) for r in rows)
        truncs = [(t.commit_lsn, t.seq) for t in events if isinstance(t, Truncate)
                  and table in [r.qualified_name for r in t.relations]]
        assert state.high_water[table] == max([top, *truncs])
        assert sum(f.rows for f in state.files[table]) == len(rows)


def test_log_entries_are_written_atomically(tmp_path):
    out = tmp_path / "out"
    rel = relation()
    with StagingWriter(out, protocol="pgoutput") as w:
        w.add(batch(rel, [(10, 0, ("1", "a"))]))
        w.commit(20)
        assert w.commit(20) is None  # nothing new, LSN unchanged: no entry
        e2 = w.commit(30)            # nothing new, LSN moved: an entry that only moves committed_lsn
        assert e2["files"] == [] and e2["committed_lsn"] == 30
        assert w.commit(25) is None  # an older LSN never moves committed_lsn back
    log = sorted(os.listdir(out / "_spockwire" / "log"))
    assert log == ["00000000000000000001.json", "00000000000000000002.json"]
    entries = read_log(out)
    assert [e["commit"] for e in entries] == [1, 2]
    assert [e["previous_committed_lsn"] for e in entries] == [0, 20]
    assert all(not n.endswith(".tmp") for n in log)


def test_folder_names_are_escaped():
    assert table_folder_name("public", "orders") == "public.orders"
    assert table_folder_name("Sales", "order.lines") == "Sales.order%2Elines"
    assert table_folder_name("_audit", "a/b") == "%5Faudit.a%2Fb"
    assert table_folder_name("s", "ünï") == "s.%C3%BCn%C3%AF"


# ----------------------------------------------------------------------------------------- crashes

class Crash(BaseException):
    """Stands for kill -9: no `except Exception` cleanup runs."""


def test_statistics_only_where_they_can_prune(tmp_path):
    """Min/max statistics for the change columns and numeric ones, none for text (a change file's rows come in
    commit order: a text range prunes nothing, and it is the dearest to compute)."""
    import pyarrow.parquet as pq

    rel = Relation(100, "public", "t", (Column("id", 20, -1, True), Column("note", 25, -1, False)), "d", 1)
    rb = finish_batch(rel, pa.array([0, 0], pa.int8()), pa.array([5, 5], pa.uint64()),
                      pa.array([0, 0], pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array([7, 7], pa.uint32()),
                      pa.array([0, 1], pa.int64()), pa.array([None, None], pa.string()), None, None, None,
                      [pa.array([1, 2], pa.int64()), pa.array(["a", "b"], pa.string())])
    (f,) = stage_all(tmp_path, [ChangeBatch(rel, rb)], 5)["files"]
    group = pq.ParquetFile(tmp_path / f["path"]).metadata.row_group(0)
    stats = {group.column(i).path_in_schema: group.column(i).is_stats_set for i in range(group.num_columns)}
    assert {name for name, on in stats.items() if on} == {"_commit_lsn", "_commit_ts", "_xid", "_seq", "id"}
    assert group.column(1).statistics.min == 5 and group.column(4).statistics.max == 1


def test_a_large_commit_is_written_as_several_files_encoded_side_by_side(tmp_path, monkeypatch):
    """With at least 2 x PART_MIN_ROWS rows of one table schema version a commit writes up to ENCODE_THREADS part
    files, in row order, encoded at the same time on threads of their own; a transaction may span two files. They
    read back as the rows staged and survive a reopen (the crash-leftover sweep knows their names); a failure in
    one of them takes back the commit's files, and a transaction larger than a file gets files told apart by their
    number alone."""
    import threading

    monkeypatch.setattr(staging_mod, "PART_MIN_ROWS", 100)
    monkeypatch.setattr(staging_mod, "ENCODE_THREADS", 3)
    together = threading.Barrier(3, timeout=30)
    failing: list[int] = []
    real = StagingWriter._encode_parquet

    def encode(self, table):
        together.wait()      # all three files are being encoded at once, or this times out
        if table.column("_seq")[0].as_py() in failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(self, table)

    monkeypatch.setattr(StagingWriter, "_encode_parquet", encode)
    rel = relation()
    rows = [(1000 + i // 40, i, (str(i), f"v{i}")) for i in range(350)]   # transactions of 40 rows
    out = tmp_path / "out"
    entry = stage_all(out, [batch(rel, rows[:200]), batch(rel, rows[200:])], 1008)
    files = entry["files"]
    assert [f["rows"] for f in files] == [117, 117, 116]
    assert [(f["first_commit_lsn"], f["first_seq"], f["last_commit_lsn"], f["last_seq"]) for f in files] == \
           [(1000, 0, 1002, 116), (1002, 117, 1005, 233), (1005, 234, 1008, 349)]
    assert [f["path"].rsplit("/", 1)[1] for f in files] == [
        "part-00000000000003E8-00000000000003EA-00000001-1.parquet",
        "part-00000000000003EA-00000000000003ED-00000001-2.parquet",
        "part-00000000000003ED-00000000000003F0-00000001-3.parquet"]
    assert [f["change_counts"] for f in files] == [{"insert": 117}, {"insert": 117}, {"insert": 116}]
    got = read_staging(out, "public.t").to_pylist()
    assert [(r["_commit_lsn"], r["_seq"], r["id"]) for r in got] == [(lsn, seq, v[0]) for lsn, seq, v in rows]
    state = StagingState.open(out)
    assert state.removed == [] and [f.rows for f in state.files["public.t"]] == [117, 117, 116]

    before, log_before = staged_files(out), read_log(out)
    one_transaction = [(2000, i, (str(i), "x")) for i in range(300)]
    with StagingWriter(out, protocol="pgoutput") as w:
        w.add(batch(rel, one_transaction))
        failing.append(100)       # the second file fails; the other two were written and are taken back
        with pytest.raises(StagingError, match="Input/output error"):
            w.commit(2000)
        assert staged_files(out) == before and read_log(out) == log_before
        failing.clear()
        entry = w.commit(2000)
    assert [f["path"].rsplit("/", 1)[1] for f in entry["files"]] == [
        f"part-00000000000007D0-00000000000007D0-00000002-{n}.parquet" for n in (1, 2, 3)]
    assert read_staging(out, "public.t").num_rows == 650


def test_leftovers_of_a_crash_between_parquet_and_log_are_removed(tmp_path, monkeypatch):
    out = tmp_path / "out"
    rel = relation()
    stage_all(out, [batch(rel, [(10, 0, ("1", "a"))])], 20)
    before = staged_files(out)

    real = staging_mod._write_durable

    def crash_on_log(path, data):
        if path.parent.name == "log":
            real(path, bytes(data)[:10])   # a torn tmp file, then the process dies
            raise Crash()
        real(path, data)

    monkeypatch.setattr(staging_mod, "_write_durable", crash_on_log)
    w = StagingWriter(out, protocol="pgoutput")
    w.add(batch(rel, [(30, 0, ("2", "b"))]))
    w.add(LogicalMessage("p", b"x", False, 35, None, None, None, None, None))
    with pytest.raises(Crash):
        w.commit(40)
    w.close()
    monkeypatch.undo()
    leftovers = staged_files(out) - before
    assert any(p.endswith(".parquet") for p in leftovers)   # complete Parquet files no entry names
    assert any(p.endswith(".tmp") for p in leftovers)       # the log entry's tmp file
    assert [e["commit"] for e in read_log(out)] == [1]
    assert read_staging(out, "public.t").num_rows == 1      # readers ignore unnamed files

    state = StagingState.open(out)
    assert staged_files(out) == before
    assert {p.relative_to(out).as_posix() for p in state.removed} == leftovers
    assert state.committed_lsn == 20
    # the changes were never acknowledged: the server delivers them again and they are staged once
    entry = stage_all(out, [batch(rel, [(10, 0, ("1", "a")), (30, 0, ("2", "b"))])], 40)
    assert entry["commit"] == 2
    assert read_staging(out, "public.t").column("id").to_pylist() == ["1", "2"]


def test_leftovers_of_a_killed_process(tmp_path):
    """A real kill: the child exits with os._exit right after the Parquet files, before the log entry."""
    import subprocess
    import sys

    out = tmp_path / "out"
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from tests.test_staging import relation, batch
from spockwire.ingest import StagingWriter, staging
real = staging._write_durable
def die(path, data):
    if path.parent.name == "log":
        os._exit(9)
    real(path, data)
staging._write_durable = die
w = StagingWriter({str(out)!r}, protocol="pgoutput")
w.add(batch(relation(), [(10, 0, ("1", "a"))]))
w.commit(20)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert any(p.name.endswith(".parquet") for p in out.rglob("*"))
    state = StagingState.open(out)
    assert state.commit == 0 and state.committed_lsn == 0 and len(state.removed) == 1
    assert not any(p.name.endswith(".parquet") for p in out.rglob("*"))


# ----------------------------------------------------------------------------------------- resume / dedup

def test_restart_drops_redelivered_changes(tmp_path, impl):
    events, lsn = decode_events(impl, PGOUTPUT)
    once = tmp_path / "once"
    stage_all(once, events, lsn)

    # first run staged the first half of the events (committed at the last commit LSN among them)
    out = tmp_path / "twice"
    half = len(events) // 2
    first = events[:half]
    cut = max(e.to_arrow().column("_commit_lsn").to_pylist()[-1] if isinstance(e, ChangeBatch)
              else (e.commit_lsn or e.lsn) for e in first)
    stage_all(out, first, cut)
    # after a restart the server re-delivers everything (a fresh decoder over the whole stream)
    events2, lsn2 = decode_events(impl, PGOUTPUT)
    with StagingWriter(out, protocol="pgoutput") as w:
        assert w.resume_lsn == cut
        w.add_all(events2)
        assert w.skipped_rows == sum(e.num_rows for e in first if isinstance(e, ChangeBatch))
        w.commit(lsn2)
    for table in list_tables(once):
        a = read_staging(once, table).select(KEY).to_pylist()
        b = read_staging(out, table).select(KEY).to_pylist()
        assert a == b, table
    assert read_messages(out).num_rows == read_messages(once).num_rows
    assert sum(len(e["truncates"]) for e in read_log(out)) == 1

    # and a third delivery adds nothing at all
    events3, lsn3 = decode_events(impl, PGOUTPUT)
    with StagingWriter(out, protocol="pgoutput") as w:
        assert w.add_all(events3) == 0
        assert w.commit(lsn3) is None


def test_dedup_rule_at_the_resume_lsn(tmp_path):
    """A transaction whose commit starts exactly at the resume LSN is kept unless already staged."""
    out = tmp_path / "out"
    t, u = relation("t", relid=1), relation("u", relid=2)
    stage_all(out, [batch(t, [(100, 0, ("1", "a")), (100, 1, ("2", "b"))])], 100)
    with StagingWriter(out, protocol="pgoutput") as w:
        assert w.resume_lsn == 100
        # re-delivered: the same rows of t at LSN 100, then a later row; u's row at LSN 100 was never staged
        kept = w.add(batch(t, [(90, 0, ("0", "z")), (100, 0, ("1", "a")), (100, 1, ("2", "b")),
                               (100, 2, ("3", "c")), (150, 0, ("4", "d"))]))
        assert kept == 2 and w.skipped_rows == 3
        assert w.add(batch(u, [(100, 3, ("9", "u"))])) == 1
        assert w.add(Truncate((t,), False, False, 100, TS, 7, 1, None)) == 0    # at t's mark: staged
        assert w.add(Truncate((t,), False, False, 160, TS, 8, 0, None)) == 1
        assert w.add(Truncate((t,), False, False, 160, TS, 8, 0, None)) == 0    # added twice: dropped
        assert w.add(LogicalMessage("p", b"1", False, 99, None, None, None, None, None)) == 0  # below resume
        assert w.add(LogicalMessage("p", b"2", False, 120, None, None, None, None, None)) == 1
        assert w.add(LogicalMessage("p", b"2", False, 120, None, None, None, None, None)) == 0
        w.commit(200)
    assert read_staging(out, "public.t").select(KEY).to_pylist() == [
        {"_commit_lsn": 100, "_seq": 0}, {"_commit_lsn": 100, "_seq": 1}, {"_commit_lsn": 100, "_seq": 2},
        {"_commit_lsn": 150, "_seq": 0}]
    assert read_staging(out, "public.u").column("id").to_pylist() == ["9"]


def test_schema_versions_survive_a_restart(tmp_path):
    out = tmp_path / "out"
    stage_all(out, [batch(relation(version=1), [(10, 0, ("1", "a"))])], 10)
    # a new decoder numbers relations from 1 again; same columns -> same folder, new columns -> v2
    stage_all(out, [batch(relation(version=1), [(20, 0, ("2", "b"))])], 20)
    stage_all(out, [batch(relation(cols=("id", "v", "w"), version=1), [(30, 0, ("3", "c", "x"))])], 30)
    assert sorted(p.name for p in (out / "public.t").iterdir()) == ["v1", "v2"]
    state = StagingState.open(out)
    assert [s.schema_version for s in state.schemas["public.t"]] == [1, 2]
    assert read_staging(out, "public.t", schema_version=1).num_rows == 2
    assert read_staging(out, "public.t").column("w").to_pylist() == [None, None, "x"]


# ----------------------------------------------------------------------------------------- flush policy

def test_flush_policy(tmp_path):
    rel = relation()
    with StagingWriter(tmp_path / "a", protocol="pgoutput", max_rows=3, max_bytes=1 << 30, max_age=60) as w:
        assert not w.should_flush() and w.buffered_bytes == 0 and w.buffered_age() == 0
        w.add(batch(rel, [(10, 0, ("1", "a")), (10, 1, ("2", "b"))]))
        assert not w.should_flush() and w.buffered_rows == 2 and w.buffered_bytes > 0
        w.add(batch(rel, [(11, 0, ("3", "c"))]))
        assert w.flush_reason() == "rows"
        w.commit(12)
        assert w.buffered_rows == 0 and w.buffered_bytes == 0 and not w.should_flush()
    with StagingWriter(tmp_path / "b", protocol="pgoutput", max_bytes=100, max_age=60) as w:
        w.add(LogicalMessage("p", b"x" * 200, False, 5, None, None, None, None, None))
        assert w.flush_reason() == "bytes"
    with StagingWriter(tmp_path / "c", protocol="pgoutput", max_age=5) as w:
        import time

        w.add(batch(rel, [(10, 0, ("1", "a"))]))
        assert not w.should_flush()
        assert w.flush_reason(now=time.monotonic() + 6) == "age"


# ----------------------------------------------------------------------------------------- errors

def test_out_dir_that_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a folder")
    with pytest.raises(StagingError, match="cannot create the staging folder") as info:
        StagingWriter(target, protocol="pgoutput")
    assert isinstance(info.value, SpockwireError)


def test_file_in_the_way_of_a_table_folder(tmp_path):
    out = tmp_path / "out"
    rel = relation()
    stage_all(out, [batch(relation("first", relid=5), [(5, 0, ("1", "a"))])], 5)
    log_before = read_log(out)
    (out / "public.t").write_text("in the way")
    with StagingWriter(out, protocol="pgoutput") as w:
        w.add(batch(rel, [(10, 0, ("1", "a"))]))
        with pytest.raises(StagingError, match=r"staging commit 2 .* failed .*nothing was committed"):
            w.commit(20)
        assert read_log(out) == log_before and w.committed_lsn == 5 and w.buffered_rows == 1
        (out / "public.t").unlink()
        assert w.commit(20)["commit"] == 2    # the buffered changes were kept: a retry succeeds
    assert read_staging(out, "public.t").num_rows == 1


@pytest.mark.parametrize("fail_on", ["parquet", "log"])
def test_disk_full_leaves_the_log_unchanged(tmp_path, monkeypatch, fail_on):
    out = tmp_path / "out"
    rel = relation()
    stage_all(out, [batch(rel, [(10, 0, ("1", "a"))])], 10)
    before_files = staged_files(out)
    log_before = read_log(out)
    real_write, real_open = os.write, os.open
    log_fds: set[int] = set()

    def tracking_open(path, flags, *args):
        fd = real_open(path, flags, *args)
        if "/log/" in str(path):
            log_fds.add(fd)
        return fd

    def full_disk(fd, data):
        if fail_on == "parquet" or fd in log_fds:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    with StagingWriter(out, protocol="pgoutput") as w:
        w.add(batch(rel, [(20, 0, ("2", "b"))]))
        w.add(batch(relation("other", relid=9), [(20, 1, ("3", "c"))]))
        monkeypatch.setattr(os, "open", tracking_open)
        monkeypatch.setattr(os, "write", full_disk)
        with pytest.raises(StagingError, match="No space left on device") as info:
            w.commit(30)
        monkeypatch.undo()
        assert "nothing was committed" in str(info.value) and "commit 1" in str(info.value)
        assert read_log(out) == log_before
        assert staged_files(out) == before_files   # the files of the failed commit were taken back
        assert w.committed_lsn == 10
        entry = w.commit(30)
    assert entry["commit"] == 2 and read_staging(out, "public.t").num_rows == 2


def _held_commits(monkeypatch, w: StagingWriter, fail_first: bool = False, held_lsn: int = 10):
    """Hold the encoding of the commit whose rows start at `held_lsn` until the returned event is set (then fail it,
    with `fail_first`). Chosen by its rows, not by which writer thread gets to the encoder first: two commits in
    flight start at the same moment."""
    import threading

    release = threading.Event()
    real = w._encode_parquet

    def encode(table):
        if table.column("_commit_lsn")[0].as_py() == held_lsn:
            assert release.wait(30)
            if fail_first:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(table)

    monkeypatch.setattr(w, "_encode_parquet", encode)
    return release


def _wait_until(condition, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_two_commits_in_flight_publish_in_order(tmp_path, monkeypatch):
    """commit_async keeps two commits in flight: the newer one's file is written while the older one is still
    encoding, but its log entry waits for the older one's; a third waits for the oldest (back-pressure)."""
    import threading

    out = tmp_path / "out"
    rel = relation()
    with StagingWriter(out, protocol="pgoutput") as w:
        release = _held_commits(monkeypatch, w)
        w.add(batch(rel, [(10, 0, ("1", "a"))]))
        assert w.commit_async(10)
        w.add(batch(rel, [(20, 0, ("2", "b"))]))
        assert w.commit_async(20)
        part2 = out / "public.t" / "v1" / "part-0000000000000014-0000000000000014-00000002.parquet"
        _wait_until(part2.exists)                # commit 2's file is written and fsynced ...
        assert read_log(out) == [] and w.poll() is None and w.committed_lsn == 0   # ... but nothing published
        w.add(batch(rel, [(30, 0, ("3", "c"))]))
        third = threading.Thread(target=w.commit_async, args=(30,))
        third.start()
        third.join(0.3)
        assert third.is_alive()                  # two in flight: the third waits for the oldest
        release.set()
        third.join(30)
        assert not third.is_alive()
        w.wait()
        assert [e["commit"] for e in w.completed] == [1, 2, 3]
        assert [e["committed_lsn"] for e in read_log(out)] == [10, 20, 30] and w.committed_lsn == 30
    assert read_staging(out, "public.t").column("id").to_pylist() == ["1", "2", "3"]


def test_a_failed_commit_takes_the_newer_one_in_flight_with_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    rel = relation()
    stage_all(out, [batch(rel, [(5, 0, ("0", "z"))])], 5)
    before = staged_files(out)
    with StagingWriter(out, protocol="pgoutput") as w:
        release = _held_commits(monkeypatch, w, fail_first=True)
        w.add(batch(rel, [(10, 0, ("1", "a"))]))
        assert w.commit_async(10)
        w.add(batch(rel, [(20, 0, ("2", "b"))]))
        assert w.commit_async(20)
        part2 = out / "public.t" / "v1" / "part-0000000000000014-0000000000000014-00000003.parquet"
        _wait_until(part2.exists)
        release.set()
        with pytest.raises(StagingError, match="Input/output error"):
            w.wait()
        assert staged_files(out) == before       # neither commit left a file, the log ends at commit 1
        assert [e["commit"] for e in read_log(out)] == [1] and w.committed_lsn == 5
        with pytest.raises(StagingError, match="an earlier staging commit"):
            w.commit_async(30)


def test_one_writer_per_folder(tmp_path):
    out = tmp_path / "out"
    with StagingWriter(out, protocol="pgoutput"):
        with pytest.raises(StagingError, match="in use by another writer"):
            StagingWriter(out, protocol="pgoutput")
        with pytest.raises(StagingError, match="in use by another writer"):
            StagingState.open(out)
    StagingWriter(out, protocol="pgoutput").close()


def test_protocol_mismatch_and_damaged_log(tmp_path):
    out = tmp_path / "out"
    stage_all(out, [batch(relation(), [(10, 0, ("1", "a"))])], 10)
    with pytest.raises(StagingError, match="holds a pgoutput stream"):
        StagingWriter(out, protocol="pglogical")
    (out / "_spockwire" / "log" / "00000000000000000003.json").write_text("{}")
    with pytest.raises(StagingError, match="commit 2 is missing"):
        read_log(out)
    (out / "_spockwire" / "log" / "00000000000000000002.json").write_text("{not json")
    with pytest.raises(StagingError, match="not valid JSON"):
        StagingState.open(out)
    with pytest.raises(StagingError, match="no table 'public.nope'"):
        os.unlink(out / "_spockwire" / "log" / "00000000000000000002.json")
        os.unlink(out / "_spockwire" / "log" / "00000000000000000003.json")
        read_staging(out, "public.nope")


def test_typed_capture_stages(tmp_path, impl):
    events, lsn = decode_events(impl, PGLOGICAL, types="typed")
    out = tmp_path / "out"
    entry = stage_all(out, events, lsn, protocol="pglogical")
    assert entry["committed_lsn"] == lsn
    assert sum(f["rows"] for f in entry["files"]) == sum(e.num_rows for e in events if isinstance(e, ChangeBatch))
    assert json.loads((out / "_spockwire" / "log" / "00000000000000000001.json").read_text()) == entry
    for table, rows in rows_by_table(events).items():
        staged = read_staging(out, table)
        assert staged.select(KEY).to_pylist() == [{k: r[k] for k in KEY} for r in rows]
        # every schema version read on its own: the typed columns round-trip, each row in the version it was
        # decoded under (a table described again with another column list has two)
        by_key = {(r["_commit_lsn"], r["_seq"]): {k: v for k, v in r.items() if k != "_commit_ts"} for r in rows}
        seen = []
        for version in StagingState.load(out).schemas[table]:
            part = read_staging(out, table, schema_version=version.schema_version)
            part = part.drop_columns(["_commit_ts"]).to_pylist()
            assert part, f"{table}: schema version {version.schema_version} has no rows"
            assert part == [by_key[(r["_commit_lsn"], r["_seq"])] for r in part]
            seen += [(r["_commit_lsn"], r["_seq"]) for r in part]
        assert sorted(seen) == sorted(by_key) and len(seen) == len(by_key)
