"""The ingest worker acknowledges a position only after everything up to it is durable on disk.

The worker encodes and fsyncs each staging commit on a writer thread while the stream goes on being decoded, so
an acknowledgement sent too early would not show up as lost data unless a crash hit exactly that window. These
tests check the order itself against a real server: every fsync is recorded (slowed down, so that an
acknowledgement racing ahead of the writer thread would see the log entry missing), and at every acknowledgement
the worker sends, the staging log on disk must already hold an entry whose `committed_lsn` covers it, written and
fsynced together with every file the log names up to it. A failing writer thread must stop the worker with the
same StagingError, and the slot must not be acknowledged past the last durable entry.
"""
from __future__ import annotations

import errno
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spockwire.connection import connect as real_connect
from spockwire.connection import create_publication, create_slot
from spockwire.ingest.staging import StagingError, StagingState, read_log
from spockwire.ingest.worker import IngestConfig, IngestWorker
from tests.test_ingest import spaced_transactions


class FsyncRecorder:
    """os.fsync that records the path of every file and folder it made durable (and takes `delay` s longer)."""

    def __init__(self, delay: float) -> None:
        self.real = os.fsync
        self.delay = delay
        self.lock = threading.Lock()
        self.paths: dict[str, int] = {}

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        time.sleep(self.delay)
        self.real(fd)
        with self.lock:
            self.paths[path] = self.paths.get(path, 0) + 1

    def synced(self, path: Path) -> int:
        with self.lock:
            return self.paths.get(str(path.resolve()), 0)


def _checked_connect(out: Path, fsyncs: FsyncRecorder, acks: list[int]):
    """`connect` whose stream checks, at every acknowledgement the worker sends, that the position is covered by
    a log entry on disk that was fsynced (file and log folder), with every file it and older entries name."""

    def connect(dsn: str, **kwargs: Any):
        stream = real_connect(dsn, **kwargs)
        ack = stream.ack

        def checked_ack(lsn: Any = None, *, send: bool = False) -> int:
            if sys._getframe(1).f_globals.get("__name__") == "spockwire.ingest.worker":
                target = stream.delivered_lsn if lsn is None else int(lsn)
                if target > stream.acked_lsn:
                    entries = read_log(out)
                    covering = [e for e in entries if e["committed_lsn"] >= target]
                    assert covering, f"acknowledging {target:X}: no log entry on disk covers it"
                    entry = covering[0]
                    log_dir = out / "_spockwire" / "log"
                    assert fsyncs.synced(log_dir / f".{entry['commit']:020d}.json.tmp"), \
                        f"acknowledging {target:X}: log entry {entry['commit']} was not fsynced"
                    assert fsyncs.synced(log_dir) >= entry["commit"], \
                        f"acknowledging {target:X}: the log folder was not fsynced after entry {entry['commit']}"
                    for older in entries[:entries.index(entry) + 1]:
                        for f in older["files"]:
                            path = out / f["path"]
                            assert fsyncs.synced(path.parent / f".{path.name}.tmp"), \
                                f"acknowledging {target:X}: {f['path']} was not fsynced"
                            assert fsyncs.synced(path.parent), \
                                f"acknowledging {target:X}: the folder of {f['path']} was not fsynced"
                    acks.append(target)
            return ack(lsn, send=send)

        stream.ack = checked_ack
        return stream

    return connect


def _confirmed(pg_db: Any, slot: str) -> int:
    return int(pg_db.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,))[0][0])


def test_every_acknowledgement_follows_the_fsync_of_what_it_covers(pg_db, tmp_path, monkeypatch):
    pg_db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    pg_db.execute("CREATE TABLE b (id bigint PRIMARY KEY, n numeric)")
    create_publication(pg_db.dsn, "pub")
    slot = f"{pg_db.name}_s"
    create_slot(pg_db.dsn, slot, "pgoutput")
    out = tmp_path / "staging"
    fsyncs = FsyncRecorder(delay=0.02)
    monkeypatch.setattr(os, "fsync", fsyncs)
    acks: list[int] = []
    stop = threading.Event()
    written = {"txns": 0}

    def writes() -> None:          # transactions keep arriving while commits are written and acknowledged
        conn = pg_db.connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            for k in range(60):
                if stop.is_set():
                    break
                cur.execute("INSERT INTO a SELECT g, 'v' || g FROM generate_series(%s, %s) g",
                            (k * 300, k * 300 + 299))
                cur.execute("INSERT INTO b SELECT g, g * 0.5 FROM generate_series(%s, %s) g",
                            (k * 100, k * 100 + 99))
                written["txns"] += 2
                time.sleep(0.01)
                if k % 5 == 4:
                    # however loaded the machine, the worker stages (and acknowledges) at least once every five
                    # pairs: wait until the slot has confirmed these writes before going on
                    cur.execute("SELECT pg_current_wal_lsn() - '0/0'")
                    target = int(cur.fetchone()[0])
                    deadline = time.monotonic() + 60
                    while _confirmed(pg_db, slot) < target and time.monotonic() < deadline and not stop.is_set():
                        time.sleep(0.02)
        conn.close()

    writer = threading.Thread(target=writes)
    writer.start()
    worker = IngestWorker(IngestConfig(dsn=pg_db.dsn, slot=slot, out=str(out), publication=["pub"],
                                       # a loaded machine may pause the writes for a second or two
                                       idle_exit=6.0, flush_rows=700, flush_seconds=0.05, progress=False),
                          connect=_checked_connect(out, fsyncs, acks))
    try:
        assert worker.run() == 0
    finally:
        stop.set()
        writer.join()
    state = StagingState.load(out)
    assert written["txns"] == 120
    assert sum(f.rows for fs in state.files.values() for f in fs) == 60 * 400
    assert len([e for e in read_log(out) if e["files"]]) >= 12   # many commits, each acknowledged after its fsync
    assert len(acks) >= 5 and acks == sorted(acks)
    # the worker acknowledged every staged change itself; a last entry with no files may record WAL without
    # published changes that the stream, idle, had already confirmed (docs/connection.md, "Idle slots")
    data_lsn = max(e["committed_lsn"] for e in read_log(out) if e["files"])
    assert data_lsn <= acks[-1] <= state.committed_lsn, (acks[-1], data_lsn, state.committed_lsn)
    assert _confirmed(pg_db, slot) >= state.committed_lsn  # the last one reached the server


def test_a_failing_writer_thread_stops_the_worker_and_nothing_unwritten_is_acknowledged(pg_db, tmp_path,
                                                                                          monkeypatch):
    pg_db.execute("CREATE TABLE f (id int PRIMARY KEY, v text)")
    create_publication(pg_db.dsn, "pub")
    slot = f"{pg_db.name}_s"
    create_slot(pg_db.dsn, slot, "pgoutput")
    before = _confirmed(pg_db, slot)
    out = tmp_path / "staging"
    fsyncs = FsyncRecorder(delay=0.0)
    monkeypatch.setattr(os, "fsync", fsyncs)
    import spockwire.ingest.staging as staging

    real = staging._write_durable
    calls = {"parquet": 0}

    def full_after_three(path: Path, data: Any) -> None:
        if ".parquet" in str(path):
            calls["parquet"] += 1
            if calls["parquet"] > 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(staging, "_write_durable", full_after_three)
    acks: list[int] = []
    worker = IngestWorker(IngestConfig(dsn=pg_db.dsn, slot=slot, out=str(out), publication=["pub"], idle_exit=2,
                                       flush_rows=1000, flush_seconds=0.05, progress=False),
                          connect=_checked_connect(out, fsyncs, acks))
    writes = spaced_transactions(pg_db, 8, gap=0.3)
    with pytest.raises(StagingError, match=r"staging commit \d+ .* failed while writing the Parquet files: "
                                           r".*No space left on device"):
        worker.run()
    writes.join()
    state = StagingState.load(out)
    staged = sum(f.rows for fs in state.files.values() for f in fs)
    assert 1 <= state.commit <= 3 and 0 < staged < 8000 and staged % 1000 == 0   # whole transactions only
    # the slot was never told more than the durable log covers
    assert _confirmed(pg_db, slot) <= max(before, state.committed_lsn)
    assert all(a <= state.committed_lsn for a in acks)
    # nothing of the failed commit stays behind
    leftovers = [p for p in out.rglob("*") if p.is_file() and (p.name.endswith(".tmp") or p.suffix == ".parquet")]
    named = {out / f.path for fs in state.files.values() for f in fs}
    assert set(leftovers) <= named
