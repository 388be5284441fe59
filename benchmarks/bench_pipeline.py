"""The Spark pipeline into Delta, run as users run it, against anchors measured in the same run.

    python -m pytest benchmarks/bench_pipeline.py -o python_files='bench_*.py'

Every measurement runs ``python -m spockwire.spark.job ... --master local[2]`` as a child process in its own process
group (the Python driver, its JVM and Spark's Python workers) and reads its JSON lines on stdout, each stamped
with the time this process read it (a batch's line is printed right after the batch's Delta commits). One
throwaway PostgreSQL 15 holds the table ``t`` (a bigint key and 6 typed columns: int, numeric(12,2), text,
timestamptz, bool, float8; SPOCKWIRE_BENCH_PIPELINE_ROWS rows written with generate_series), an empty table ``e``
of the same shape (the empty source), and ``t_other`` (in t's publication, not in the job's tables: a change to it
makes a micro-batch that holds no row of ``t``).

How the figures are timed (one definition for the job and for the readers it is compared with):

* **ready to done**, the time every rate is taken over (rows or changes / ready to done): from the moment the tool
  is ready to read to the durable commit of the last row or change in its target. The job is ready at its
  streaming query's start (its ``{"started": true}`` line less the ``query_started_s_ago`` it reports) and done at
  the line of its last micro-batch holding rows of its table. ``spockwire ingest`` is ready at its ``start`` log
  line (written once its staging folder is open, right before it opens the replication stream; the worker's own
  clock, to the millisecond) and done at the ``created_at`` of its last staging commit that wrote files (stamped
  once the commit's Parquet files are durable, as its log entry, the commit point, is written).
  ``spockwire.read_table`` and ``deltalake.write_deltalake``: the call, in this process. A run of the job fails the
  benchmark when its ready to done is less than the work its micro-batches report (their ``seconds``, each from
  the call of the micro-batch's function to its Delta commits; of a snapshot micro-batch written while Spark reads
  the next one, ``deferred``, its ``read_seconds``; to the millisecond rounding of the job's figures): see
  ``_loaded``.
* **gross**: from the launch of the process to the same last commit; **start to exit**: to the process's exit
  (spockwire ingest's includes the 5 s of ``--idle-exit 5`` it waits with nothing to read).
* **the job's fixed cost**, from its runs on an empty source: **start to ready** (launch to the streaming query's
  start: the JVM, the Spark session, registering the sources) and **stop** (the line of its last micro-batch to
  the process's exit), medians of the runs (``_fixed``). Beside them the part of the job's start that comes after
  its query's start and so is inside every ready to done: from the query's start to the call of its first
  micro-batch's function (Spark starting the source, the job's check of Spark's Python workers, which the first
  micro-batch waits for, and the micro-batch's planning); recorded for the loaded runs too.

The rates that lead (each job against its reader) are at sizes where the job's fixed cost is small beside its work:
the snapshot of SPOCKWIRE_BENCH_PIPELINE_BIG_ROWS rows (10M) against ``spockwire.read_table``, the backlog of
SPOCKWIRE_BENCH_PIPELINE_CHANGES changes (2M) with and without ``--history`` against ``spockwire ingest``. The
snapshot of ``t`` and the backlog of SPOCKWIRE_BENCH_PIPELINE_SMALL_CHANGES changes (500k; 0: not run) are
secondary figures, without a target. Medians over the runs (``_timed``). The tests run in this order, each
building on the last:

* ``test_snapshot``: the job with ``--starting-position snapshot --until-caught-up`` on ``t`` (SCD 1),
  SPOCKWIRE_BENCH_PIPELINE_SNAPSHOT_ROUNDS times, each right after the same command on ``e`` (a first start's
  fixed cost), each run with its own slot and target (the last one's are kept for the later phases). Anchors:
  ``spockwire.read_table(dsn, "t", workers=2)`` and ``deltalake.write_deltalake`` of the rows it read (median of
  SPOCKWIRE_BENCH_PIPELINE_ANCHOR_ROUNDS each). A second job (``--history``, its own slot, checkpoint and target)
  snapshots ``t`` too, for the backlogs.
* ``test_changes_small``: a twin of the SCD 1 job's slot (``pg_copy_logical_replication_slot``: the same position,
  so it sees the same WAL), then SPOCKWIRE_BENCH_PIPELINE_SMALL_CHANGES changes written while no job runs, in
  transactions of 1,000 (600 updates of keys spread over the table, 200 deletes of the oldest keys, 200 inserts of
  new keys; the table keeps its size); the SCD 1 job restarted from its checkpoint with ``--until-caught-up``,
  SPOCKWIRE_BENCH_PIPELINE_CHANGE_ROUNDS runs (all but the last from copies of the job's slot, checkpoint and
  tables made before the backlog was written; the last goes on to the later phases). Anchor: ``python -m spockwire
  ingest`` from the twin slot. The ``--history`` job then reads the backlog once, not timed, to stay at the SCD 1
  job's position.
* ``test_changes``: both jobs restarted from their checkpoints with no change of ``t`` to read,
  SPOCKWIRE_BENCH_PIPELINE_EMPTY_ROUNDS times each (a restart's fixed cost; one change of ``t_other`` gives them a
  micro-batch to end on: with nothing at all to read, the job's ``--until-caught-up`` runs no micro-batch and waits
  for its ``--timeout``), then SPOCKWIRE_BENCH_PIPELINE_CHANGES changes measured as in ``test_changes_small``.
* ``test_changes_history``: the ``--history`` job (SCD 2 beside SCD 1) over the same backlog (as many runs, from
  copies as well). Anchors: spockwire ingest's rate on it and the SCD 1 job's.
* ``test_batch_fixed_cost``: the SCD 1 job left running (no ``--until-caught-up``);
  SPOCKWIRE_BENCH_PIPELINE_FIXED_ROUNDS times (after a round that warms the job up, not counted), a one-row update
  of ``t`` (a micro-batch holding one change) and an insert into ``t_other`` (an empty micro-batch), each waited
  for. Measured: the median of the batches' own ``seconds`` (the job's time from reading the micro-batch to its
  Delta commits); also the latency from the source commit to the batch's line.
* ``test_lag``: the SCD 1 job running (warmed up by one change first) while a writer commits 1,000-change
  transactions paced to SPOCKWIRE_BENCH_PIPELINE_LAG_RATE changes/s for SPOCKWIRE_BENCH_PIPELINE_LAG_SECONDS.
  Commit-to-Delta lag of a transaction: the time its micro-batch's line was read (right after the Delta commit)
  minus the time its COMMIT returned to the writer. Batches hold whole transactions in commit order and every
  transaction holds 1,000 rows of ``t``, so transaction i is in the first batch after which the job reported at
  least 1,000 * (i + 1) rows. p50/p95 over the transactions; the job's own "lag_p50"/"lag_p95" are recorded too when
  it prints them.
* ``test_memory``: SPOCKWIRE_BENCH_PIPELINE_BIG_CHANGES changes written, then the SCD 1 job with the batch bound
  ``maxWalBytesPerBatch`` (SPOCKWIRE_BENCH_PIPELINE_MAX_WAL_BYTES; the source applies it only under a read limit, so
  ``--max-changes-per-batch`` is set too, high enough not to bind first). Measured: the peak over the run of the sum
  of the resident set sizes of the job's processes (its process group and every descendant, sampled every 0.2 s from
  /proc); beside it the peak of the sum of their PSS (a page shared by Spark's forked Python workers counted once,
  not once per worker; read at each new peak of the RSS and once a second, as it costs the kernel a walk of each
  process's page tables). Its ready to done and gross are recorded too (one run).
* ``test_big_snapshot``: a table ``big`` of SPOCKWIRE_BENCH_PIPELINE_BIG_ROWS rows (as ``t``, its own
  publication), snapshotted as in ``test_snapshot``, SPOCKWIRE_BENCH_PIPELINE_BIG_SNAPSHOT_ROUNDS runs (each on a
  slot and target of its own). Anchors: ``spockwire.read_table(dsn, "big", workers=2)`` (median of
  SPOCKWIRE_BENCH_PIPELINE_ANCHOR_ROUNDS) and the rate of ``test_snapshot``.

After every phase the Delta table (the current versions of the SCD 2 table too) must equal the source table
(read with ``spockwire.read_table``): a mismatch fails the benchmark. ``extra_info["pipeline"]`` of each benchmark
holds the measurement, its target and anchors; benchmarks/report.py makes the "Pipeline into Delta" section.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def _env(name: str, default: str) -> str:
    return os.environ.get("SPOCKWIRE_BENCH_PIPELINE_" + name, default)


ROWS = int(_env("ROWS", "1000000"))
CHANGES = int(_env("CHANGES", "2000000"))
#: the secondary backlog, measured before CHANGES (0: not measured)
SMALL_CHANGES = int(_env("SMALL_CHANGES", "500000"))
BIG_ROWS = int(_env("BIG_ROWS", "10000000"))
BIG_CHANGES = int(_env("BIG_CHANGES", "5000000"))
LAG_SECONDS = float(_env("LAG_SECONDS", "180"))
LAG_RATE = float(_env("LAG_RATE", "20000"))
MAX_WAL_BYTES = int(_env("MAX_WAL_BYTES", str(64 << 20)))
FIXED_ROUNDS = int(_env("FIXED_ROUNDS", "5"))
ANCHOR_ROUNDS = int(_env("ANCHOR_ROUNDS", "3"))
#: runs of each restart on an empty source (their medians: the job's fixed cost of a restart)
EMPTY_ROUNDS = int(_env("EMPTY_ROUNDS", "5"))
#: pairs of runs (the empty source, then the table) of the ROWS-row snapshot
SNAPSHOT_ROUNDS = int(_env("SNAPSHOT_ROUNDS", "7"))
#: runs of the BIG_ROWS-row snapshot (all but the last on slots and targets of their own)
BIG_SNAPSHOT_ROUNDS = int(_env("BIG_SNAPSHOT_ROUNDS", "3"))
#: runs of each backlog job (SCD 1, --history): all but the last from copies of its slot, checkpoint and tables
CHANGE_ROUNDS = int(_env("CHANGE_ROUNDS", "5"))
MASTER = _env("MASTER", "local[2]")
JOB_TIMEOUT = float(_env("JOB_TIMEOUT", "3600"))
#: per test (pyproject's 900 s is too short for the full-scale phases)
pytestmark = pytest.mark.timeout(int(2 * JOB_TIMEOUT))
TXN = 1000                     # changes per transaction: 600 updates, 200 deletes, 200 inserts
GROUP = "pipeline into Delta"
#: how the rates are timed (extra_info["pipeline"]["timing"]; benchmarks/report.py words its text by it)
TIMING = "ready_to_done"
COLUMNS = ["id", "b", "c", "d", "e", "f", "g"]
TABLE_SQL = ("CREATE TABLE {name} (id bigint PRIMARY KEY, b int, c numeric(12,2), d text, e timestamptz, f bool, "
             "g float8)")
ROWS_SQL = ("INSERT INTO {name} SELECT i, (i * 7) % 1000000, (i % 100000) / 100.0, 'customer ' || (i % 9973), "
            "timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', i % 3 = 0, i / 7.0 "
            "FROM generate_series(1, {rows}) i")
# one transaction of the change workload, number k, on a table of n rows holding the keys (200 k, n + 200 k]:
# 600 updates of keys spread over the live range (distinct: the prime 1000003 does not divide the span), 200
# deletes of the oldest keys, 200 inserts of new keys
CHANGES_SQL = """
CREATE FUNCTION bench_txn(tbl regclass, k bigint, n bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE span bigint := n - 200; lo bigint := 200 * (k + 1);
BEGIN
  EXECUTE format('UPDATE %s SET b = b + 1, c = c + 0.01, d = ''update '' || $1, e = e + interval ''1 second'', '
                 'f = NOT f, g = g * 1.5 WHERE id IN (SELECT $2 + 1 + ((j * 1000003 + $1 * 7919) %% $3) '
                 'FROM generate_series(0, 599) j)', tbl) USING k, lo, span;
  EXECUTE format('DELETE FROM %s WHERE id > $1 AND id <= $1 + 200', tbl) USING 200 * k;
  EXECUTE format('INSERT INTO %s SELECT $1 + i, i, i / 100.0, ''insert '' || $2, now(), true, i / 3.0 '
                 'FROM generate_series(1, 200) i', tbl) USING n + 200 * k, k;
END $$;
CREATE PROCEDURE bench_changes(tbl regclass, k0 bigint, count bigint, n bigint) LANGUAGE plpgsql AS $$
BEGIN
  FOR k IN k0 .. k0 + count - 1 LOOP
    PERFORM bench_txn(tbl, k, n);
    COMMIT;
  END LOOP;
END $$;
"""


# ---------------------------------------------------------------------------------------------------------------
# the job as a child process

def _tree_rss(root: int) -> tuple[int, list[int]]:
    """Resident bytes (RSS) of `root`'s process group and of every descendant of `root` (Spark's Python workers are
    the JVM's children), and the processes counted. The sum counts a page shared by forked Python workers once per
    worker (:func:`_tree_pss` counts it once). A process that shares another member's address space is counted
    once: the JVM starts each Python worker through posix_spawn, whose child runs in the JVM's own memory until it
    execs, and /proc then shows that child with the JVM's whole RSS."""
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            procs[int(name)] = (int(fields[1]), int(fields[2]))      # ppid, pgrp
        except (OSError, IndexError, ValueError):
            continue
    members = {pid for pid, (_pp, pgrp) in procs.items() if pgrp == root} | {root}
    grew = True
    while grew:
        more = {pid for pid, (pp, _g) in procs.items() if pp in members} - members
        members |= more
        grew = bool(more)
    rss = 0
    page = os.sysconf("SC_PAGE_SIZE")
    spaces: set[tuple[str, ...]] = set()
    counted: list[int] = []
    for pid in sorted(members):
        try:
            with open(f"/proc/{pid}/statm") as fh:
                statm = fh.read().split()
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            # the address space's layout (code, stack, data, brk, arguments, environment) and its sizes: equal
            # for two processes in one address space
            space = (*statm, *fields[23:26], *fields[42:49])
            if space in spaces:
                continue
            rss += int(statm[1]) * page
            spaces.add(space)
            counted.append(pid)
        except (OSError, IndexError, ValueError):
            continue
    return rss, counted


def _tree_pss(pids: list[int]) -> int:
    """The sum of the processes' PSS (proportional set size: a page shared by n processes counts 1/n in each).
    The kernel walks a process's page tables for it: tens of milliseconds of CPU for a JVM of a gigabyte, so the
    sampler reads it at the peaks of RSS and once a second, not at every sample."""
    pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                pss += next((int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:")), 0)
        except (OSError, IndexError, ValueError):
            continue
    return pss


class Job:
    """``python -m spockwire.spark.job`` in its own process group: its stdout's JSON lines with the time each was
    read, the peak resident size of its processes, its wall time."""

    def __init__(self, pl: "Pipeline", name: str, table: str, *, slot: str, history: bool = False,
                 until_caught_up: bool = True, extra: tuple[str, ...] = (), dsn: str | None = None,
                 publication: str = "pub") -> None:
        self.name = name
        self.table = f"public.{table}"
        target = os.path.join(pl.work, name, "delta")
        self.checkpoint = os.path.join(pl.work, name, "checkpoint")
        self.target = target
        self.cmd = [sys.executable, "-m", "spockwire.spark.job", "--dsn", dsn or pl.dsn, "--slot", slot,
                    "--publication", publication, "--table", f"public.{table}=id", "--target", target,
                    "--checkpoint", self.checkpoint, "--starting-position", "snapshot", "--master", MASTER,
                    "--timeout", str(int(JOB_TIMEOUT)), *(("--history",) if history else ()),
                    *(("--until-caught-up",) if until_caught_up else ()), *extra]
        self.log = os.path.join(pl.work, f"{name}.stderr.log")
        self.lines: list[tuple[float, dict]] = []
        self.peak_rss = self.peak_pss = 0
        self.wall = 0.0
        # epoch seconds of the last run: its launch, its query's start (ready to read), its exit
        self.launched = 0.0
        self.ready_at: float | None = None
        self.exited_at: float | None = None
        self._cond = threading.Condition()
        self.proc: subprocess.Popen | None = None

    def path(self, table: str = "t", history: bool = False) -> str:
        return os.path.join(self.target, f"public.{table}" + ("_history" if history else ""))

    def start(self) -> "Job":
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
        self.lines = []
        self.peak_rss = self.peak_pss = 0
        self.ready_at = self.exited_at = None
        self.launched = time.time()
        self._t0 = time.perf_counter()
        self._err = open(self.log, "a")
        self._err.write(f"\n=== {' '.join(self.cmd)}\n")
        self._err.flush()
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            line = line.strip()
            try:                     # the job's lines beside its stderr, for post-mortems
                self._err.write(f"[stdout {now:.3f}] {line}\n")
                self._err.flush()
            except (OSError, ValueError):
                pass
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("started") and self.ready_at is None:
                # the line comes once the worker check passed; the query started query_started_s_ago before it
                self.ready_at = now - float(rec.get("query_started_s_ago") or 0.0)
            with self._cond:
                self.lines.append((now, rec))
                self._cond.notify_all()

    def _sample(self) -> None:
        assert self.proc is not None
        next_pss = 0.0
        while self.proc.poll() is None:
            rss, pids = _tree_rss(self.proc.pid)
            if rss > self.peak_rss or time.monotonic() >= next_pss:
                self.peak_pss = max(self.peak_pss, _tree_pss(pids))
                next_pss = time.monotonic() + 1.0
            self.peak_rss = max(self.peak_rss, rss)
            time.sleep(0.2)

    def wait_line(self, pred: Any, after: int, timeout: float) -> tuple[int, float, dict]:
        """The first line at index >= `after` that satisfies `pred`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if pred(self.lines[i][1]):
                        return i, *self.lines[i]
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(f"job {self.name} exited ({self.proc.returncode}); see {self.log}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"job {self.name}: no expected line within {timeout:.0f}s; see {self.log}")
                self._cond.wait(min(left, 0.5))

    def wait(self, timeout: float = JOB_TIMEOUT + 120) -> "Job":
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job {self.name} did not finish within {timeout:.0f}s; see {self.log}")
        self.exited_at = time.time()
        self.wall = time.perf_counter() - self._t0
        self._reader.join(10)
        self._sampler.join(10)
        self._err.close()
        if rc != 0:
            raise AssertionError(f"job {self.name} exited with {rc}; see {self.log}:\n{_tail(self.log)}")
        if not any(rec.get("caught_up") for _t, rec in self.lines) and "--until-caught-up" in self.cmd:
            raise AssertionError(f"job {self.name} ended without catching up; see {self.log}")
        return self

    def run(self) -> "Job":
        return self.start().wait()

    def timing(self) -> dict[str, float | None]:
        """The last run's times, in seconds from its launch: ``ready``, its streaming query's start;
        ``first_batch``, the call of its first micro-batch's function (a line's time less its ``seconds``: Spark
        calls it once the micro-batch is planned, and the job's check of Spark's Python workers has passed);
        ``done``, the line of its last micro-batch holding rows of its table (printed right after that
        micro-batch's Delta commits); ``last_line``, the line of its last micro-batch of any kind; ``exit``, its
        exit. ``work``: the job's own time for the micro-batches up to ``done``, the least the time from ``ready``
        to ``done`` can be: their ``seconds`` (each from the call of the micro-batch's function to its Delta
        commits; Spark calls it for one micro-batch at a time), but of a snapshot micro-batch written while Spark
        reads the next one (``deferred``) only its ``read_seconds`` (the next micro-batch's call waits for that
        read; the last micro-batch's ``seconds`` include the wait for the deferred writes). ``batches``: how many
        micro-batches it printed. None: the run printed no such line."""
        batches = self.batches()
        data = [t for t, r in batches if int(r.get("rows", {}).get(self.table, 0)) > 0]
        done = max(data) if data else None
        work = sum(float(r.get("read_seconds") or 0) if r.get("deferred") else float(r.get("seconds") or 0)
                   for t, r in batches if done is not None and t <= done)

        def since(at: float | None) -> float | None:
            return None if at is None else at - self.launched

        return {"ready": since(self.ready_at), "done": since(done),
                "first_batch": since(min(t - float(r.get("seconds") or 0) for t, r in batches)) if batches else None,
                "last_line": since(max(t for t, _r in batches)) if batches else None,
                "exit": since(self.exited_at), "work": work, "batches": len(batches)}

    def interrupt(self, timeout: float = 120) -> "Job":
        """Ctrl-C to the driver (it stops the query and Spark), the process group killed if it hangs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.exited_at = time.time()
        self.wall = time.perf_counter() - self._t0
        self._reader.join(10)
        self._sampler.join(10)
        self._err.close()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    # what its lines say
    def batches(self) -> list[tuple[float, dict]]:
        return [(t, r) for t, r in self.lines if "batch" in r]

    def rows(self, table: str = "public.t") -> int:
        return sum(int(r.get("rows", {}).get(table, 0)) for _t, r in self.batches())

    def batch_seconds(self) -> float:
        return sum(float(r.get("seconds", 0)) for _t, r in self.batches())

    def reported(self) -> dict[str, Any]:
        """What the job printed beyond rows and seconds (lag, Spark jobs), when it printed it."""
        out: dict[str, Any] = {"batches": len(self.batches()), "batch_seconds": round(self.batch_seconds(), 3)}
        for key in ("lag_p50", "lag_p95", "spark_jobs"):
            vals = [r[key] for _t, r in self.batches() if isinstance(r.get(key), (int, float))]
            if vals:
                out[key] = {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3)}
        return out


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path) as fh:
            return fh.read()[-n:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------------------------
# the source, its changes and the checks

class Pipeline:
    def __init__(self, pg: Any, db: str, work: str) -> None:
        self.pg, self.db, self.work = pg, db, work
        self.dsn = pg.dsn(dbname=db)
        self.next_txn = 0          # the change workload's next transaction number
        self.results: dict[str, Any] = {}
        self.jobs: dict[str, Job] = {}
        self.failed: str | None = None

    def changes(self, count: int, table: str = "t", rows: int | None = None) -> float:
        """`count` changes in 1,000-change transactions (server-side, one COMMIT each); the seconds it took."""
        n = count // TXN
        t0 = time.perf_counter()
        conn = self.pg.connect(self.db)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CALL bench_changes(%s, %s, %s, %s)", (table, self.next_txn, n, rows or ROWS))
        finally:
            conn.close()
        self.next_txn += n
        return time.perf_counter() - t0


def _arrow_source(dsn: str, table: str, columns: Sequence[str] = COLUMNS, key: Sequence[str] = ("id",)) -> Any:
    import spockwire

    return spockwire.read_table(dsn, table, workers=2).select(list(columns)).sort_by([(k, "ascending") for k in key])


def check_equal(dsn: str, table: str, path: str, history: bool = False, columns: Sequence[str] = COLUMNS,
                key: Sequence[str] = ("id",)) -> int:
    """The Delta table (the current versions of an SCD 2 table) equals the source table; the row count. `columns`
    and `key`: a table of another shape than ``t`` (every column compared, the rows in key order)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    columns = list(columns)
    src = _arrow_source(dsn, table, columns, key)
    got = DeltaTable(path).to_pyarrow_table()
    if history:
        got = got.filter(pc.is_null(got["_end_commit_lsn"]))
    got = got.select(columns).sort_by([(k, "ascending") for k in key])
    got = pa.table([got[c].cast(src.schema.field(c).type) for c in columns], schema=src.schema)
    if got.num_rows != src.num_rows or not got.equals(src):
        detail = f"{got.num_rows:,} rows in {path}, {src.num_rows:,} in {table}"
        if got.num_rows == src.num_rows:
            for c in columns:
                if not got[c].equals(src[c]):
                    diff = pc.not_equal(got[c], src[c])
                    i = next((k for k, v in enumerate(diff.to_pylist()) if v is not False), None)
                    detail += f"; column {c} differs first at row {i}: {got[c][i]} != {src[c][i]}"
                    break
        raise AssertionError(f"MISMATCH: the Delta table does not equal the source table: {detail}")
    return src.num_rows


def _loaded(job: Job) -> dict:
    """The last run's Job.timing() of `job`, a run that read rows of its table. Checked: the time from its query's
    start to its last micro-batch's line is at least the work its micro-batches report (``work``; to the rounding of
    the job's figures, which it prints to the millisecond)."""
    t = job.timing()
    assert t["ready"] is not None, f"job {job.name} printed no start line; see {job.log}"
    assert t["done"] is not None, f"job {job.name} printed no micro-batch holding rows of {job.table}; see {job.log}"
    span = t["done"] - t["ready"]
    assert span + 0.0005 * (t["batches"] + 1) >= t["work"], (
        f"job {job.name}: {span:.3f} s from its query's start to the line of its last micro-batch, less than the "
        f"{t['work']:.3f} s its micro-batches report; see {job.log}")
    return t


def _timed(runs: list[dict], n: int) -> dict:
    """The figures of loaded runs (each `_loaded`'s) that applied `n` rows or changes, medians over the runs:
    ``ready_to_done_s`` (the query's start to the last micro-batch's line: the measured time, its rate
    n / ready_to_done_s), ``start_to_ready_s`` (launch to the query's start), ``ready_to_first_batch_s`` (the
    query's start to its first micro-batch's call, a part of ready to done), ``gross_s`` (launch to the last
    micro-batch's line) and its rate, ``wall_s`` (launch to exit); each run's too."""
    med = statistics.median
    spans = [t["done"] - t["ready"] for t in runs]
    gross = med(t["done"] for t in runs)
    return {"ready_to_done_s": round(med(spans), 3), "start_to_ready_s": round(med(t["ready"] for t in runs), 3),
            "ready_to_first_batch_s": round(med(t["first_batch"] - t["ready"] for t in runs), 3),
            "gross_s": round(gross, 3), "gross_rate": round(n / gross),
            "wall_s": round(med(t["exit"] for t in runs), 3),
            "ready_to_done_runs_s": [round(x, 3) for x in spans],
            "start_to_ready_runs_s": [round(t["ready"], 3) for t in runs],
            "gross_runs_s": [round(t["done"], 3) for t in runs], "wall_runs_s": [round(t["exit"], 3) for t in runs],
            "work_runs_s": [round(t["work"], 3) for t in runs]}


def _fixed(runs: list[dict]) -> dict:
    """The job's fixed cost from its runs on an empty source (each a Job.timing()), medians over the runs:
    ``start_to_ready_s``, its launch to its streaming query's start; ``stop_s``, the line of its last micro-batch
    to its exit; ``ready_to_first_batch_s``, the query's start to its first micro-batch's call (a part of every
    ready to done). None: the runs printed no micro-batch."""
    med = statistics.median
    assert all(t["ready"] is not None for t in runs), "a run on the empty source printed no start line"
    stops = [t["exit"] - t["last_line"] for t in runs if t["last_line"] is not None]
    firsts = [t["first_batch"] - t["ready"] for t in runs if t["first_batch"] is not None]
    return {"runs": len(runs), "start_to_ready_s": round(med(t["ready"] for t in runs), 3),
            "stop_s": round(med(stops), 3) if stops else None,
            "ready_to_first_batch_s": round(med(firsts), 3) if firsts else None,
            "start_to_ready_runs_s": [round(t["ready"], 3) for t in runs], "stop_runs_s": [round(x, 3) for x in stops]}


def _anchor(label: str, value: float, unit: str, measured: float | None) -> dict:
    """An anchor and the ratio measured / anchor (a rate: the fraction of the anchor's rate; a time: the multiple
    of the anchor's time)."""
    ratio = measured / value if value and measured else None
    return {"label": label, "value": None if value is None else round(value, 3), "unit": unit,
            "ratio": round(ratio, 3) if ratio else None}


def _record(benchmark: Any, key: str, label: str, target: str, target_value: float | None, better: str,
            measured: float, unit: str, anchors: list[dict], **details: Any) -> None:
    """extra_info["pipeline"] of a measurement; `target_value` None: a secondary figure, without a target."""
    met = (None if target_value is None else
           measured >= target_value if better == "higher" else measured <= target_value)
    info = {"key": key, "label": label, "target": target, "target_value": target_value, "better": better,
            "measured": round(measured, 3), "unit": unit, "anchors": anchors, "met": met, "master": MASTER,
            **details}
    benchmark.extra_info.update({"pipeline": info})
    aim = "" if target_value is None else f" (target {target}: {'met' if met else 'not met'})"
    print(f"\n{label}: {measured:,.3f} {unit}{aim}; "
          + "; ".join(f"{a['label']} {a['value']} {a['unit']} (ratio {a['ratio']})" for a in anchors))
    if "ready_to_done_s" in details:
        print(f"  ready to done {details['ready_to_done_s']} s (of which before the first micro-batch "
              f"{details['ready_to_first_batch_s']} s), start to ready {details['start_to_ready_s']} s, "
              f"gross (start to done) {details['gross_s']} s = {details['gross_rate']:,}/s, start to exit "
              f"{details['wall_s']} s; the job's own seconds {details['work_runs_s']}")
    for name in ("fixed_first_start", "fixed_restart"):
        if details.get(name):
            f = details[name]
            print(f"  the job's fixed cost, {name[6:].replace('_', ' ')} ({f['runs']} runs on an empty source): "
                  f"start to ready {f['start_to_ready_s']} s, stop {f['stop_s']} s; the query's start to its first "
                  f"micro-batch {f['ready_to_first_batch_s']} s")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    from spockwire.testing import PostgresCluster

    work = str(tmp_path_factory.mktemp("pipeline"))
    with PostgresCluster({"shared_buffers": "512MB", "max_wal_size": "8GB", "logical_decoding_work_mem": "64MB"},
                         major=15) as pg:
        db = pg.create_database("bench_pipeline")
        for name in ("t", "e", "t_other"):
            pg.execute(TABLE_SQL.format(name=name), dbname=db)
        pg.execute(ROWS_SQL.format(name="t", rows=ROWS), dbname=db)
        pg.execute("VACUUM (FREEZE, ANALYZE) t", dbname=db)
        pg.execute(CHANGES_SQL, dbname=db)
        pg.execute("CREATE PUBLICATION pub FOR TABLE t, t_other; CREATE PUBLICATION pub_e FOR TABLE e", dbname=db)
        pl = Pipeline(pg, db, work)
        pl.server_version = pg.query("SHOW server_version", dbname=db)[0][0]
        try:
            yield pl
        finally:
            for job in pl.jobs.values():
                job.kill()
            if not os.environ.get("SPOCKWIRE_BENCH_PIPELINE_KEEP"):
                shutil.rmtree(work, ignore_errors=True)


def _other_change(pl: Pipeline, cur: Any = None) -> None:
    """A change to t_other (in the slot's publication, not among the job's tables): a micro-batch without a row
    of t."""
    sql = "INSERT INTO t_other (id) SELECT coalesce(max(id), 0) + 1 FROM t_other"
    if cur is not None:
        cur.execute(sql)
    else:
        pl.pg.execute(sql, dbname=pl.db)


def _drop_slot(pl: Pipeline, slot: str, db: str | None = None) -> None:
    for _ in range(100):     # a walsender or a backend that just read the slot lets go of it a moment later
        if pl.pg.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND NOT active", (slot,),
                       dbname=db or pl.db)[0][0]:
            pl.pg.query("SELECT pg_drop_replication_slot(%s)", (slot,), dbname=db or pl.db)
            return
        time.sleep(0.1)


def _need(pl: Pipeline, *keys: str) -> None:
    missing = [k for k in keys if k not in pl.results]
    if missing:
        pytest.fail(f"an earlier phase of the pipeline did not complete ({', '.join(missing)})")


def _common(pl: Pipeline) -> dict:
    return {"server_version": pl.server_version, "rows": ROWS, "timing": TIMING}


# ---------------------------------------------------------------------------------------------------------------
# the measurements

@pytest.mark.benchmark(group=GROUP)
def test_snapshot(benchmark, pipeline):
    pl = pipeline

    def run() -> None:
        empties, loaded = [], []
        for r in range(SNAPSHOT_ROUNDS):
            empties.append(Job(pl, f"empty{r}", "e", slot=f"s_empty{r}", publication="pub_e").run().timing())
            _drop_slot(pl, f"s_empty{r}")      # it would hold back the WAL of every later phase
            last = r == SNAPSHOT_ROUNDS - 1
            job = Job(pl, "scd1", "t", slot="s_scd1") if last else Job(pl, f"scd1_{r}", "t", slot=f"s_scd1_{r}")
            job.run()
            assert check_equal(pl.dsn, "t", job.path()) == ROWS
            snap_rows = sum(int(r.get("snapshot_rows", 0)) for _t, r in job.batches())
            assert snap_rows == ROWS, f"the job reported {snap_rows:,} snapshot rows, not {ROWS:,}"
            loaded.append(_loaded(job))
            if not last:
                _drop_slot(pl, f"s_scd1_{r}")
                shutil.rmtree(os.path.join(pl.work, f"scd1_{r}"), ignore_errors=True)
        pl.jobs["scd1"] = job
        hist = pl.jobs["scd2"] = Job(pl, "scd2", "t", slot="s_scd2", history=True)
        hist.run()
        assert check_equal(pl.dsn, "t", hist.path()) == ROWS
        assert check_equal(pl.dsn, "t", hist.path(history=True), history=True) == ROWS
        # anchors, in this process: the table into Arrow, and those rows into a fresh Delta table
        import spockwire
        from deltalake import write_deltalake

        reads, writes = [], []
        for r in range(ANCHOR_ROUNDS):
            t0 = time.perf_counter()
            table = spockwire.read_table(pl.dsn, "t", workers=2)
            reads.append(time.perf_counter() - t0)
            assert table.num_rows == ROWS
            out = os.path.join(pl.work, f"anchor_delta_{r}")
            t0 = time.perf_counter()
            write_deltalake(out, table)
            writes.append(time.perf_counter() - t0)
            shutil.rmtree(out, ignore_errors=True)
            del table
        pl.results["snapshot"] = {"runs": loaded, "empty_runs": empties,
                                  "read_table": statistics.median(reads),
                                  "write_deltalake": statistics.median(writes), "job": job.reported(),
                                  "peak_rss": job.peak_rss, "peak_pss": job.peak_pss, "history_gross": hist.wall}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["snapshot"]
    timed = _timed(res["runs"], ROWS)
    rate = ROWS / timed["ready_to_done_s"]
    pl.results["snapshot_rate"] = rate
    _record(benchmark, "snapshot", f"snapshot of a {ROWS:,}-row table into Delta (SCD 1)", "none (secondary)", None,
            "higher", rate, "rows/s",
            [_anchor("spockwire.read_table (2 workers)", ROWS / res["read_table"], "rows/s", rate),
             _anchor("deltalake.write_deltalake of the same rows", ROWS / res["write_deltalake"], "rows/s", rate)],
            **timed, fixed_first_start=_fixed(res["empty_runs"]), job=res["job"], peak_rss_bytes=res["peak_rss"],
            peak_pss_bytes=res["peak_pss"], history_snapshot_wall_s=round(res["history_gross"], 3),
            seconds=timed["ready_to_done_s"], **_common(pl))


def _copy_job(pl: Pipeline, name: str) -> None:
    """CHANGE_ROUNDS - 1 copies of a job's slot (at its position: the same WAL to read), checkpoint and tables."""
    for k in range(CHANGE_ROUNDS - 1):
        pl.pg.query(f"SELECT pg_copy_logical_replication_slot('s_{name}', 's_{name}_rep{k}')", dbname=pl.db)
        shutil.copytree(os.path.join(pl.work, name), os.path.join(pl.work, f"{name}_rep{k}"))


def _backlog(pl: Pipeline, job: Job, changes: int) -> dict:
    """`job` run over a backlog of `changes` changes of t, its tables checked: its timing (`_loaded`)."""
    job.run()
    assert job.rows() == changes, f"the job applied {job.rows():,} changes, {changes:,} were written"
    check_equal(pl.dsn, "t", job.path())
    if "--history" in job.cmd:
        check_equal(pl.dsn, "t", job.path(history=True), history=True)
    return _loaded(job)


def _replays(pl: Pipeline, name: str, changes: int, history: bool = False) -> list[dict]:
    """The backlog job `name` run from each of its copies (each checked, then dropped): their timings."""
    runs = []
    for k in range(CHANGE_ROUNDS - 1):
        runs.append(_backlog(pl, Job(pl, f"{name}_rep{k}", "t", slot=f"s_{name}_rep{k}", history=history), changes))
        _drop_slot(pl, f"s_{name}_rep{k}")
        shutil.rmtree(os.path.join(pl.work, f"{name}_rep{k}"), ignore_errors=True)
    return runs


def _ingest_ready(path: str) -> float:
    """The time (epoch seconds, to the millisecond) of the ``start`` event in `spockwire ingest`'s log at `path`."""
    with open(path) as fh:
        for line in fh:
            if '"event": "start"' in line:      # 2026-01-02 03:04:05,678 INFO spockwire.ingest: {"event": "start", ...
                stamp, ms = line[:23].split(",")
                return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
    raise AssertionError(f"spockwire ingest logged no start event; see {path}")


def _ingest(pl: Pipeline, slot: str, changes: int) -> dict:
    """`spockwire ingest` from `slot` until idle (--idle-exit 5), timed as the job is. Ready: its ``start`` log
    line, written once its staging folder is open and right before it opens the replication stream (the worker's
    own clock). Done: the ``created_at`` of its last staging commit that wrote files, stamped once the commit's
    files are durable, as its log entry (the commit point) is written."""
    from spockwire.ingest.staging import StagingState, read_log

    out = os.path.join(pl.work, "ingest")
    log_path = os.path.join(pl.work, f"ingest_{slot}_{changes}.stderr.log")
    env = dict(os.environ, PYTHONPATH=ROOT)
    launched = time.time()
    with open(log_path, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "spockwire", "ingest", "--dsn", pl.dsn, "--slot", slot,
                               "--publication", "pub", "--out", out, "--idle-exit", "5", "--flush-seconds", "0.5",
                               "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                              timeout=JOB_TIMEOUT)
    exited = time.time()
    assert proc.returncode == 0, f"spockwire ingest exited with {proc.returncode}; see {log_path}"
    ready = _ingest_ready(log_path)
    log = read_log(out)
    done = max(_dt.datetime.fromisoformat(e["created_at"]).timestamp() for e in log if e["files"])
    state = StagingState.load(out)
    rows = sum(f.rows for fs in state.files.values() for f in fs)
    shutil.rmtree(out, ignore_errors=True)
    assert rows == changes, f"ingest staged {rows:,} rows, {changes:,} changes were written"
    return {"ready_to_done_s": round(done - ready, 3), "start_to_ready_s": round(ready - launched, 3),
            "gross_s": round(done - launched, 3), "gross_rate": round(changes / (done - launched)),
            "wall_s": round(exited - launched, 3), "commits": sum(1 for e in log if e["files"]),
            "rate": changes / (done - ready)}


def _record_backlog(benchmark: Any, pl: Pipeline, key: str, label: str, target: str, target_value: float | None,
                    changes: int, res: dict, anchors: list[dict], **details: Any) -> float:
    """_record of a backlog's runs (`res`: runs, job, peak_rss, peak_pss); returns its rate."""
    timed = _timed(res["runs"], changes)
    rate = changes / timed["ready_to_done_s"]
    _record(benchmark, key, label, target, target_value, "higher", rate, "changes/s",
            [_anchor(a, v, "changes/s", rate) for a, v in anchors], **timed, changes=changes, job=res["job"],
            peak_rss_bytes=res["peak_rss"], peak_pss_bytes=res["peak_pss"], seconds=timed["ready_to_done_s"],
            **details, **_common(pl))
    return rate


INGEST_ANCHOR = "spockwire ingest from a twin slot"


@pytest.mark.benchmark(group=GROUP)
def test_changes_small(benchmark, pipeline):
    pl = pipeline
    if not SMALL_CHANGES:
        pytest.skip("SPOCKWIRE_BENCH_PIPELINE_SMALL_CHANGES=0: no secondary backlog")
    _need(pl, "snapshot")
    job, hist = pl.jobs["scd1"], pl.jobs["scd2"]

    def run() -> None:
        pl.pg.query("SELECT pg_copy_logical_replication_slot('s_scd1', 's_twin_small')", dbname=pl.db)
        _copy_job(pl, "scd1")
        write_s = pl.changes(SMALL_CHANGES)
        runs = _replays(pl, "scd1", SMALL_CHANGES)
        runs.append(_backlog(pl, job, SMALL_CHANGES))
        ingest = _ingest(pl, "s_twin_small", SMALL_CHANGES)
        _drop_slot(pl, "s_twin_small")
        _backlog(pl, hist, SMALL_CHANGES)      # the --history job to the same position, not measured
        pl.results["changes_small"] = {"runs": runs, "write_s": write_s, "ingest": ingest, "job": job.reported(),
                                       "peak_rss": job.peak_rss, "peak_pss": job.peak_pss}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["changes_small"]
    _record_backlog(benchmark, pl, "changes_small", f"{SMALL_CHANGES:,}-change backlog (SCD 1)", "none (secondary)",
                    None, SMALL_CHANGES, res, [(INGEST_ANCHOR, res["ingest"]["rate"])],
                    backlog_write_s=round(res["write_s"], 3), ingest=res["ingest"])


@pytest.mark.benchmark(group=GROUP)
def test_changes(benchmark, pipeline):
    pl = pipeline
    _need(pl, "snapshot", *(("changes_small",) if SMALL_CHANGES else ()))
    job, hist = pl.jobs["scd1"], pl.jobs["scd2"]

    def run() -> None:
        # the empty source: a restart from the checkpoint with no change of t to read, only one of t_other (with
        # nothing at all to read the job runs no micro-batch, and --until-caught-up then waits for its --timeout)
        empties, hist_empties = [], []
        for _r in range(EMPTY_ROUNDS):
            _other_change(pl)
            empties.append(job.run().timing())
            assert job.rows() == 0, f"the restart with nothing written read {job.rows()} rows"
            hist_empties.append(hist.run().timing())
        pl.results["history_empty_runs"] = hist_empties
        pl.pg.query("SELECT pg_copy_logical_replication_slot('s_scd1', 's_twin')", dbname=pl.db)
        for name in ("scd1", "scd2"):
            _copy_job(pl, name)
        write_s = pl.changes(CHANGES)
        runs = _replays(pl, "scd1", CHANGES)
        runs.append(_backlog(pl, job, CHANGES))
        ingest = _ingest(pl, "s_twin", CHANGES)
        _drop_slot(pl, "s_twin")
        pl.results["changes"] = {"runs": runs, "empty_runs": empties, "write_s": write_s, "ingest": ingest,
                                 "job": job.reported(), "peak_rss": job.peak_rss, "peak_pss": job.peak_pss}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["changes"]
    pl.results["changes_rate"] = _record_backlog(
        benchmark, pl, "changes", f"{CHANGES:,}-change backlog into the {ROWS:,}-row table (SCD 1)",
        ">= 250,000 changes/s", 250_000, CHANGES, res, [(INGEST_ANCHOR, res["ingest"]["rate"])],
        fixed_restart=_fixed(res["empty_runs"]), backlog_write_s=round(res["write_s"], 3), ingest=res["ingest"])


@pytest.mark.benchmark(group=GROUP)
def test_changes_history(benchmark, pipeline):
    pl = pipeline
    _need(pl, "changes", "history_empty_runs")
    hist = pl.jobs["scd2"]

    def run() -> None:
        runs = _replays(pl, "scd2", CHANGES, history=True)
        runs.append(_backlog(pl, hist, CHANGES))
        pl.results["history"] = {"runs": runs, "job": hist.reported(), "peak_rss": hist.peak_rss,
                                 "peak_pss": hist.peak_pss}
        _drop_slot(pl, "s_scd2")       # not read again

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["history"]
    _record_backlog(benchmark, pl, "changes_history", "the same backlog with --history (SCD 2 beside SCD 1)",
                    ">= 150,000 changes/s", 150_000, CHANGES, res,
                    [(INGEST_ANCHOR, pl.results["changes"]["ingest"]["rate"]),
                     ("the SCD 1 job on the same backlog", pl.results["changes_rate"])],
                    fixed_restart=_fixed(pl.results["history_empty_runs"]))


def _running(pl: Pipeline, name: str) -> Job:
    """The SCD 1 job from its checkpoint, left running; returned once it has applied a first change."""
    base = pl.jobs["scd1"]
    job = Job(pl, "scd1", "t", slot="s_scd1", until_caught_up=False)
    assert job.checkpoint == base.checkpoint
    pl.jobs[name] = job
    job.start()
    job.wait_line(lambda r: r.get("started"), 0, 600)
    # a warm-up: one change, waited for (a fresh job's first apply takes many times longer than the next ones)
    after = len(job.lines)
    pl.pg.execute("UPDATE t SET b = b + 1 WHERE id = (SELECT max(id) FROM t)", dbname=pl.db)
    job.wait_line(lambda r: "batch" in r and int(r.get("rows", {}).get("public.t", 0)) >= 1, after, 600)
    time.sleep(1.0)
    return job


@pytest.mark.benchmark(group=GROUP)
def test_batch_fixed_cost(benchmark, pipeline):
    pl = pipeline
    _need(pl, "changes")

    def run() -> None:
        job = _running(pl, "fixed")
        one, empty, one_latency, empty_latency = [], [], [], []
        conn = pl.pg.connect(pl.db)
        conn.autocommit = True
        try:
            warm = {}
            for r in range(FIXED_ROUNDS + 1):         # round 0 warms the empty micro-batch up too
                for kind in ("one", "empty"):
                    after = len(job.lines)
                    with conn.cursor() as cur:
                        if kind == "one":
                            cur.execute("UPDATE t SET b = b + 1 WHERE id = (SELECT max(id) FROM t)")
                        else:
                            _other_change(pl, cur)
                    committed = time.time()
                    want = 1 if kind == "one" else 0
                    _i, seen, rec = job.wait_line(lambda rec: "batch" in rec and int(rec.get("rows", {}).get(
                        "public.t", 0)) == want, after, 300)
                    if r == 0:
                        warm[kind] = round(float(rec["seconds"]), 3)
                    else:
                        (one if kind == "one" else empty).append(float(rec["seconds"]))
                        (one_latency if kind == "one" else empty_latency).append(seen - committed)
                    time.sleep(1.0)
        finally:
            conn.close()
            job.interrupt()
        check_equal(pl.dsn, "t", job.path())
        pl.results["fixed"] = {"one": one, "empty": empty, "one_latency": one_latency, "warm_up": warm,
                               "empty_latency": empty_latency, "job": job.reported()}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["fixed"]
    one, empty = statistics.median(res["one"]), statistics.median(res["empty"])
    _record(benchmark, "fixed_cost", "fixed cost of a micro-batch holding one change (the batch's own seconds)",
            "<= 0.5 s", 0.5, "lower", one, "s",
            [_anchor("an empty micro-batch", empty, "s", one)],
            rounds=FIXED_ROUNDS, warm_up_s=res["warm_up"], one_change_s=[round(x, 3) for x in res["one"]],
            empty_s=[round(x, 3) for x in res["empty"]],
            one_change_commit_to_line_s=round(statistics.median(res["one_latency"]), 3),
            empty_commit_to_line_s=round(statistics.median(res["empty_latency"]), 3), job=res["job"],
            seconds=one, **_common(pl))


@pytest.mark.benchmark(group=GROUP)
def test_lag(benchmark, pipeline):
    pl = pipeline
    _need(pl, "changes")

    def run() -> None:
        job = _running(pl, "lag")
        start_line = len(job.lines)
        interval = TXN / LAG_RATE
        commits: list[float] = []
        conn = pl.pg.connect(pl.db)
        conn.autocommit = False
        t_start = time.time()
        try:
            with conn.cursor() as cur:
                i = 0
                while True:
                    due = t_start + i * interval
                    if due - t_start >= LAG_SECONDS:
                        break
                    pause = due - time.time()
                    if pause > 0:
                        time.sleep(pause)
                    cur.execute("SELECT bench_txn('t', %s, %s)", (pl.next_txn, ROWS))
                    conn.commit()
                    commits.append(time.time())
                    pl.next_txn += 1
                    i += 1
            written_s = commits[-1] - t_start
            need = TXN * len(commits)
            deadline_s = JOB_TIMEOUT
            t_wait = time.monotonic()
            while sum(int(r.get("rows", {}).get("public.t", 0)) for _t, r in job.lines[start_line:]
                      if "batch" in r) < need:
                if time.monotonic() - t_wait > deadline_s:
                    raise AssertionError(f"the job did not apply the writers' {need:,} changes within "
                                         f"{deadline_s:.0f}s after they stopped; see {job.log}")
                if job.proc.poll() is not None:
                    raise AssertionError(f"job exited ({job.proc.returncode}); see {job.log}")
                time.sleep(0.2)
        finally:
            conn.close()
            job.interrupt()
        # transaction i (1,000 rows of t) is in the first batch after which the job reported >= 1,000 (i + 1) rows
        lags, cum, k = [], 0, 0
        for seen, rec in job.lines[start_line:]:
            if "batch" not in rec:
                continue
            cum += int(rec.get("rows", {}).get("public.t", 0))
            while k < len(commits) and TXN * (k + 1) <= cum:
                lags.append(seen - commits[k])
                k += 1
        assert k == len(commits), (k, len(commits))
        check_equal(pl.dsn, "t", job.path())
        pl.results["lag"] = {"lags": lags, "written_s": written_s, "txns": len(commits), "job": job.reported(),
                             "peak_rss": job.peak_rss, "peak_pss": job.peak_pss}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["lag"]
    lags = sorted(res["lags"])
    p95 = lags[min(len(lags) - 1, int(round(0.95 * (len(lags) - 1))))]
    p50 = statistics.median(lags)
    achieved = TXN * res["txns"] / res["written_s"] if res["written_s"] else 0.0
    _record(benchmark, "lag", f"writers at {LAG_RATE:,.0f} changes/s for {LAG_SECONDS:g} s: p95 commit-to-Delta lag",
            "<= 3 s", 3.0, "lower", p95, "s", [],
            lag_p50_s=round(p50, 3), lag_max_s=round(lags[-1], 3), transactions=res["txns"],
            write_rate_target=LAG_RATE, write_rate_achieved=round(achieved), write_seconds=round(res["written_s"], 3),
            job=res["job"], peak_rss_bytes=res["peak_rss"], peak_pss_bytes=res["peak_pss"], seconds=p95,
            **_common(pl))


@pytest.mark.benchmark(group=GROUP)
def test_memory(benchmark, pipeline):
    pl = pipeline
    _need(pl, "changes")

    def run() -> None:
        write_s = pl.changes(BIG_CHANGES)
        job = Job(pl, "scd1", "t", slot="s_scd1", extra=(
            "--option", f"maxWalBytesPerBatch={MAX_WAL_BYTES}", "--max-changes-per-batch", str(10 * BIG_CHANGES)))
        pl.jobs["memory"] = job
        job.run()
        assert job.rows() == BIG_CHANGES, f"the job applied {job.rows():,} changes, {BIG_CHANGES:,} were written"
        check_equal(pl.dsn, "t", job.path())
        pl.results["memory"] = {"peak_rss": job.peak_rss, "peak_pss": job.peak_pss, "run": _loaded(job),
                                "write_s": write_s, "job": job.reported()}

    benchmark.pedantic(run, rounds=1, iterations=1)
    res = pl.results["memory"]
    gb = res["peak_rss"] / 1e9
    _record(benchmark, "memory", f"{BIG_CHANGES:,}-change backlog with maxWalBytesPerBatch={MAX_WAL_BYTES:,}: "
            "peak RSS of the job's processes", "<= 2 GB", 2.0, "lower", gb, "GB", [],
            changes=BIG_CHANGES, max_wal_bytes=MAX_WAL_BYTES, peak_rss_bytes=res["peak_rss"],
            peak_pss_bytes=res["peak_pss"], **_timed([res["run"]], BIG_CHANGES),
            backlog_write_s=round(res["write_s"], 3), job=res["job"], seconds=round(res["run"]["exit"], 3),
            **_common(pl))


@pytest.mark.benchmark(group=GROUP)
def test_big_snapshot(benchmark, pipeline):
    pl = pipeline
    _need(pl, "snapshot_rate")
    names = ["big" if r == BIG_SNAPSHOT_ROUNDS - 1 else f"big_{r}" for r in range(BIG_SNAPSHOT_ROUNDS)]

    def run() -> None:
        # beside t in the same database (DROP DATABASE afterwards would wait on the pglogical supervisor, which
        # answers the barrier it raises only when its latch times out)
        t0 = time.perf_counter()
        pl.pg.execute(TABLE_SQL.format(name="big"), dbname=pl.db)
        pl.pg.execute(ROWS_SQL.format(name="big", rows=BIG_ROWS), dbname=pl.db)
        pl.pg.execute("VACUUM (FREEZE, ANALYZE) big", dbname=pl.db)
        pl.pg.execute("CREATE PUBLICATION pub_big FOR TABLE big", dbname=pl.db)
        load_s = time.perf_counter() - t0
        loaded = []
        for name in names:        # each on a slot and target of its own; the last one's tables are checked
            job = pl.jobs["big"] = Job(pl, name, "big", slot=f"s_{name}", publication="pub_big")
            job.run()
            snap_rows = sum(int(r.get("snapshot_rows", 0)) for _t, r in job.batches())
            assert snap_rows == BIG_ROWS, f"the job reported {snap_rows:,} snapshot rows, not {BIG_ROWS:,}"
            loaded.append(_loaded(job))
            if name != "big":
                _drop_slot(pl, f"s_{name}")
                shutil.rmtree(os.path.join(pl.work, name), ignore_errors=True)
        assert check_equal(pl.dsn, "big", job.path("big")) == BIG_ROWS
        # the anchor: the same table into Arrow, as for the ROWS-row snapshot
        import spockwire

        reads = []
        for _r in range(ANCHOR_ROUNDS):
            t0 = time.perf_counter()
            rows = spockwire.read_table(pl.dsn, "big", workers=2).num_rows
            reads.append(time.perf_counter() - t0)
            assert rows == BIG_ROWS
        pl.results["big"] = {"runs": loaded, "load_s": load_s, "job": job.reported(), "peak_rss": job.peak_rss,
                             "peak_pss": job.peak_pss, "read_table": statistics.median(reads)}

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        for name in names:
            _drop_slot(pl, f"s_{name}")
            shutil.rmtree(os.path.join(pl.work, name), ignore_errors=True)
        pl.pg.execute("DROP PUBLICATION IF EXISTS pub_big; DROP TABLE IF EXISTS big", dbname=pl.db)
    res = pl.results["big"]
    timed = _timed(res["runs"], BIG_ROWS)
    rate = BIG_ROWS / timed["ready_to_done_s"]
    _record(benchmark, "big_snapshot", f"snapshot of a {BIG_ROWS:,}-row table into Delta (SCD 1)",
            ">= 1,000,000 rows/s", 1_000_000, "higher", rate, "rows/s",
            [_anchor("spockwire.read_table (2 workers) of the same table", BIG_ROWS / res["read_table"], "rows/s",
                     rate),
             _anchor(f"the {ROWS:,}-row snapshot", pl.results["snapshot_rate"], "rows/s", rate)],
            big_rows=BIG_ROWS, **timed, table_load_s=round(res["load_s"], 3), job=res["job"],
            peak_rss_bytes=res["peak_rss"], peak_pss_bytes=res["peak_pss"], seconds=timed["ready_to_done_s"],
            **_common(pl))
