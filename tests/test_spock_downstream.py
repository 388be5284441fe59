"""A real Spock stream (pgEdge Spock 6's `spock_output` on PostgreSQL 18) through the ingest worker and the
connection's restart handling.

* `spockwire ingest --plugin spock` under kill -9: writes keep running (inserts, updates with TOAST changed and left
  unchanged, deletes, large transactions, a table of a replication set the worker does not read) while the worker
  is killed again and again — at random moments, while a large transaction is in flight (its rows spilled to disk)
  and in the middle of a staging commit — and restarted each time. The staged changes must be exactly the committed
  ones (test_decoding on a second slot created at the same LSN, tests/test_ingest.py's comparison: each change once,
  none missing, same xid, order and values), replayed in (_commit_lsn, _seq) order they must equal the source
  tables read with psycopg2, and the slot must cover everything staged.
* Fast shutdown: with a Spock and a pgoutput stream attached and idle, `pg_ctl stop -m fast` completes at once (the
  walsenders wait for the clients to confirm the end of the WAL they decoded; a consumer between reads answers
  through the stream's status thread), and the streams reconnect and deliver everything exactly once.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import spockwire
from spockwire.connection import create_publication
from spockwire.ingest.replay import replay_table
from spockwire.ingest.staging import StagingState
from tests.pg_fixtures import PgDatabase
from tests.test_ingest import _assert_exactly_once, _log_summary, _reference, _staged
from tests.test_connection_pg import collect, row_count
from tests.test_spock_live import _ids, _insert_batches, spock_connect
from tests.test_spock_live import sdb  # noqa: F401 - the fixture: a database with spock and its node

pytestmark = pytest.mark.pg

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------------------------------------------
# ingest under kill -9

DDL = """
CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), note text, at timestamptz);
ALTER TABLE items ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE log (id bigserial PRIMARY KEY, msg text);
CREATE TABLE hidden (id int PRIMARY KEY, v text);
"""
#: replication set per table; the worker reads `default` and `bulk`, not `other`
SETS = {"items": "default", "log": "bulk", "hidden": "other"}
READ_SETS = "default,bulk"
TABLES = ("public.items", "public.log")
#: a transaction this large (rows into `log`) holds more than the worker's --spill-bytes while it arrives
LARGE = 8_000
#: the large transaction a kill aims at: over 4 MiB on the wire, more than one read of the replication pump
#: (`max_batch_bytes`), so it reaches the decoder in several reads and is spilled while still open even when
#: the worker is behind (a backlogged worker can otherwise receive a smaller one whole, with its COMMIT)
AIMED_LARGE = 150_000


def _spock_ingest_cmd(dsn: str, slot: str, out: Path, impl: str, binary: bool, idle_exit: float) -> list[str]:
    return [sys.executable, "-m", "spockwire", "ingest", "--dsn", dsn, "--slot", slot, "--plugin", "spock",
            "--replication-sets", READ_SETS, "--out", str(out), "--impl", impl,
            "--binary" if binary else "--no-binary", "--flush-rows", "4000", "--flush-seconds", "0.2",
            "--spill-bytes", "128KiB", "--log-format", "json", "--idle-exit", str(idle_exit)]


def _writes(db: PgDatabase, rounds: int, stop: threading.Event) -> None:
    """The workload the worker is killed under: per round small transactions of every kind, every third round a
    large one; a transaction mixes a table the worker does not read with one it reads."""
    rng = random.Random(20261123)
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for r in range(rounds):
                if stop.is_set():
                    return
                lo = r * 1000
                cur.execute("INSERT INTO items SELECT g, 'item ' || g, g %% 97, (g * 0.37)::numeric(10,2), "
                            "CASE WHEN g %% 40 = 0 THEN repeat(md5(g::text), 300) END, now() "
                            "FROM generate_series(%s, %s) g", (lo + 1, lo + 300))
                cur.execute("UPDATE items SET qty = qty + 1 WHERE id %% 7 = %s AND id > %s",
                            (rng.randrange(7), lo - 2000))            # unchanged TOAST for the large notes
                cur.execute("UPDATE items SET note = repeat(md5(%s), 200) WHERE id %% 50 = %s AND id > %s",
                            (str(r), rng.randrange(50), lo - 3000))   # TOAST changed
                cur.execute("DELETE FROM items WHERE id %% 11 = %s AND id > %s", (rng.randrange(11), lo - 1000))
                cur.execute("BEGIN")
                cur.execute("INSERT INTO hidden SELECT g, 'h' FROM generate_series(%s, %s) g", (lo, lo + 9))
                cur.execute("UPDATE items SET name = name || '+' WHERE id BETWEEN %s AND %s", (lo + 1, lo + 5))
                cur.execute("INSERT INTO log (msg) VALUES ('mixed ' || %s)", (r,))
                cur.execute("COMMIT")
                cur.execute("INSERT INTO hidden VALUES (%s, 'alone')", (lo + 500,))   # nothing for the worker
                if r % 3 == 1:
                    cur.execute("INSERT INTO log (msg) SELECT 'bulk ' || g FROM generate_series(1, %s) g", (LARGE,))
                time.sleep(rng.uniform(0.02, 0.15))
    finally:
        conn.close()


def _spilling(pid: int, spill_dir: Path) -> bool:
    """True while the worker holds a spill file open: a transaction larger than --spill-bytes is arriving or
    waiting to be staged (the file has no name: /proc/PID/fd shows it as deleted)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{spill_dir}/") and target.endswith(" (deleted)"):
            return True
    return False


def _staging_commit_running(out: Path) -> bool:
    """True while a staging commit is under way: a temporary file exists, or a part file of a commit the log does
    not hold yet (written and fsynced before its log entry)."""
    log_dir = out / "_spockwire" / "log"
    try:
        logged = max((int(p.name[:-5]) for p in log_dir.glob("*.json")), default=0)
        for folder, _dirs, files in os.walk(out):
            for name in files:
                if name.endswith(".tmp"):
                    return True
                if name.startswith("part-") and name.endswith(".parquet") and folder != str(log_dir):
                    if int(name[:-8].rsplit("-", 1)[1]) > logged:
                        return True
    except (OSError, ValueError):
        return False   # the folder changed under the walk: look again
    return False


def _kill_when(proc: subprocess.Popen, condition, timeout: float, log: Path) -> bool:
    """SIGKILL the worker as soon as `condition()` holds (True) or after `timeout` s (False); `log`: its stderr."""
    deadline = time.monotonic() + timeout
    hit = False
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            hit = True
            break
        time.sleep(0.001)
    if proc.poll() is not None:
        pytest.fail(f"the worker ended before it was killed: {_log_summary(log.read_text())}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return hit


def _wait_for_a_commit(out: Path, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    """Until the staging folder holds a commit (the first run's, or an earlier one's)."""
    log_dir = out / "_spockwire" / "log"
    deadline = time.monotonic() + timeout
    while not (log_dir.exists() and any(log_dir.glob("*.json"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no staging commit: {_log_summary(log.read_text())}")
        time.sleep(0.05)


@pytest.mark.parametrize("impl, binary", [("c", False), ("python", True)], ids=["c-text", "python-binary"])
def test_spock_ingest_kill9_stages_every_change_exactly_once(sdb, spock_cluster, tmp_path, impl, binary):
    sdb.execute(DDL)
    for name in ("bulk", "other"):
        sdb.execute("SELECT spock.repset_create(%s)", (name,))
    for table, repset in SETS.items():
        sdb.execute("SELECT spock.repset_add_table(%s, %s)", (repset, table))
    slot, ref_slot = f"{sdb.name}_spock", f"{sdb.name}_oracle"
    sdb.execute("SELECT pg_create_logical_replication_slot(%s, 'spock_output')", (slot,))
    sdb.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (ref_slot,))
    out, spill_dir = tmp_path / "staging", tmp_path / "spill"
    spill_dir.mkdir()
    env = dict(os.environ, TMPDIR=str(spill_dir))
    stop = threading.Event()
    writer = threading.Thread(target=_writes, args=(sdb, 18, stop))
    writer.start()
    rng = random.Random(7)
    hits: list[str] = []
    try:
        for n, kind in enumerate(("random", "large transaction", "staging commit", "random", "large transaction",
                                  "staging commit", "random")):
            log = tmp_path / f"worker-{n}.log"     # a file: a full pipe would stall a worker that logs each commit
            with open(log, "wb") as stderr:
                proc = subprocess.Popen(_spock_ingest_cmd(sdb.dsn, slot, out, impl, binary, 60), cwd=ROOT,
                                        env=env, stdout=subprocess.DEVNULL, stderr=stderr)
            if kind == "random":
                _kill_when(proc, lambda: False, rng.uniform(0.5, 2.0), log)
                hits.append(kind)
                continue
            _wait_for_a_commit(out, proc, log)
            if kind == "large transaction":
                # one of its own, so that there is one to catch whatever the writer is doing
                sdb.execute("INSERT INTO log (msg) SELECT 'large ' || g FROM generate_series(1, %s) g",
                            (AIMED_LARGE,))
                hit = _kill_when(proc, lambda: _spilling(proc.pid, spill_dir), 30, log)
            else:
                # changes of its own to commit, in case the writer has finished its rounds
                sdb.execute("INSERT INTO log (msg) SELECT 'commit ' || g FROM generate_series(1, 2000) g")
                hit = _kill_when(proc, lambda: _staging_commit_running(out), 10, log)
            hits.append(kind if hit else "random")
        writer.join()
    finally:
        stop.set()
        writer.join()
    # a last, uninterrupted run finishes the stream
    done = subprocess.run(_spock_ingest_cmd(sdb.dsn, slot, out, impl, binary, 3), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, _log_summary(done.stderr)
    assert "large transaction" in hits and "staging commit" in hits, hits
    assert not list(spill_dir.iterdir())     # the killed workers' spill files had no names

    # each committed change of the tables read exactly once (the oracle sees every table of the database)
    reference = _reference(spock_cluster, sdb.name, ref_slot)
    for txn in reference:
        txn.changes = [c for c in txn.changes if c.get("table") in TABLES]
    reference = [t for t in reference if t.changes]
    assert sum(len(t.changes) for t in reference) > 50_000
    staged = _staged(out)
    _assert_exactly_once(staged, reference)
    assert all(r["_unchanged_toast"] == ["note"] for r in staged["public.items"] if r["_unchanged_toast"])
    assert any(r["_unchanged_toast"] for r in staged["public.items"])

    # replayed in (_commit_lsn, _seq) order, the staging equals the source tables
    columns = {"public.items": ("id", "name", "qty", "price", "note", "at"), "public.log": ("id", "msg")}
    for table, cols in columns.items():
        replayed = replay_table(out, table, ("id",))
        source = {(row[0],): dict(zip(cols, row)) for row in sdb.query(f"SELECT {', '.join(cols)} FROM {table}")}
        assert replayed.keys() == source.keys(), table
        assert replayed == source, table

    # the slot covers everything staged
    state = StagingState.load(out)
    (confirmed,) = sdb.query("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                             (slot,))[0]
    assert int(confirmed) >= state.committed_lsn > 0


# ------------------------------------------------------------------------------------------------------------------
# fast shutdown with idle streams attached

def _last_shutdown(logfile: Path) -> str:
    """The server log from its last shutdown request on."""
    text = logfile.read_text(errors="replace")
    return text[text.rfind("\n", 0, text.rindex("shutdown request")) + 1:]


def test_fast_shutdown_with_idle_streams_attached_and_exactly_once_after(sdb, spock_cluster, impl):
    """A Spock and a pgoutput stream have handed out and acknowledged everything; their consumers are not reading
    (this thread runs the shutdown). WAL neither stream has anything for is written just before the stop: each
    walsender decodes it and waits for its client to confirm its end before it exits — the status thread answers.
    `pg_ctl stop -m fast` then completes without falling back to an immediate stop (PostgresCluster does so when
    pg_ctl gives up after 60 s), and both streams reconnect and deliver the rest exactly once."""
    sdb.execute("CREATE TABLE t (id int PRIMARY KEY, batch int)")
    sdb.execute("CREATE TABLE elsewhere (id int PRIMARY KEY)")
    sdb.execute("SELECT spock.repset_add_table('default', 't')")
    create_publication(sdb.dsn, "pub", ["t"])
    sdb.execute("SELECT pg_create_logical_replication_slot(%s, 'spock_output')", (f"{sdb.name}_spock",))
    sdb.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{sdb.name}_pgo",))
    _insert_batches(sdb, 0, 20)
    kwargs = dict(max_backoff=0.5, reconnect_timeout=60)
    streams = {"spock": spock_connect(sdb, impl, **kwargs),
               "pgoutput": spockwire.connect(sdb.dsn, slot=f"{sdb.name}_pgo", publication="pub",
                                             decoder_factory=lambda p: impl.Decoder(protocol=p), **kwargs)}
    try:
        got, acked = {}, {}
        for name, stream in streams.items():
            got[name] = _ids(collect(stream, lambda evs: row_count(evs) >= 200))
            acked[name] = stream.ack()
        sdb.execute("INSERT INTO elsewhere SELECT generate_series(1, 5000)")
        started = time.monotonic()
        spock_cluster.restart("fast")
        took = time.monotonic() - started
        log = _last_shutdown(spock_cluster.logfile)
        assert "received fast shutdown request" in log and "immediate shutdown request" not in log, log[-3000:]
        assert "database system is shut down" in log, log[-3000:]
        assert took < 20, f"the fast shutdown took {took:.1f} s"
        _insert_batches(sdb, 20, 30)
        for name, stream in streams.items():
            deadline = time.monotonic() + 60
            while (stream.reconnects == 0 or len({i for _, _, i in got[name]}) < 300) and \
                    time.monotonic() < deadline:
                got[name] += _ids(stream.read(0.3))
            stream.ack()
            assert stream.reconnects >= 1, name
    finally:
        for stream in streams.values():
            stream.close()
    for name, rows in got.items():
        assert sorted(i for _, _, i in rows) == list(range(300)), name      # each row once
        assert len({(lsn, seq) for lsn, seq, _ in rows}) == 300, name
        assert all(lsn > acked[name] for lsn, _, i in rows if i >= 200), name
