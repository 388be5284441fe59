"""`spockwire pipeline`: the pipeline job as a command, run for real (a child process, its own JVM) against a role that
must give a password (scram-sha-256), with Spark's event log on.

* It is stopped with SIGTERM while writers change the source: it finishes the micro-batch being applied, Spark
  commits it, it exits 0; a second run goes on from the checkpoint and the Delta tables equal the source, every
  change applied exactly once (the SCD 2 table holds one version per change).
* While it runs it prints a progress line per micro-batch and serves Prometheus metrics.
* The password is in no file either run wrote: checkpoint, Delta tables, staging folder, event logs, Spark's
  scratch folders, the captured output.
* Errors found before Spark starts (a wrong password, a table without a key, a password in the dsn) are one line.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from spockwire.cli import build_parser, main as cli_main
from spockwire.cli.config import resolve
from spockwire.cli.pipeline_cmd import job_config
from spockwire.spark import job
from spockwire.spark.job import LOCAL_DRIVER_JAVA_OPTIONS
from tests.delta_check import checked_table
from tests.spark_session import spark_session

ROOT = Path(__file__).resolve().parents[1]


def _role(pg_db, password: str) -> str:
    """A login role that must authenticate with `password` over TCP (the cluster's other roles keep trust)."""
    role = f"cdc_{secrets.token_hex(4)}"
    pg_db.execute(f"SET password_encryption = 'scram-sha-256'; CREATE ROLE {role} LOGIN REPLICATION PASSWORD %s",
                  (password,))
    assert pg_db.query("SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = %s", (role,)) \
        == [(True,)]
    pg_db.cluster.require_password(role)
    return role


def _dsn(pg_db, role: str) -> str:
    return f"host=127.0.0.1 port={pg_db.cluster.port} dbname={pg_db.name} user={role}"


def _config(path: Path, run: Path, dsn: str, slot: str, password: str, **extra: object) -> Path:
    """The command's TOML file (kept outside `run`: it holds the password)."""
    settings = {"dsn": dsn, "password": password, "slot": slot, "publication": "pub",
                "table": ["public.orders=id"], "target": str(run / "delta"), "checkpoint": str(run / "ck"),
                "starting_position": "snapshot", "history": True, "trigger_seconds": 0.2, "master": "local[1]",
                "option": ["snapshotChunkPages=1", "snapshotChunksPerBatch=2"],
                "spark_conf": ["spark.eventLog.enabled=true", f"spark.eventLog.dir=file://{run}/events",
                               f"spark.local.dir={run}/scratch",
                               f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={run}/tmp"], **extra}

    def toml(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(toml(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    path.write_text("[pipeline]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in settings.items()))
    return path


def _start(config: Path, run: Path, name: str, *extra: str) -> subprocess.Popen:
    for d in ("events", "tmp", "scratch"):
        (run / d).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOCKWIRE_", "PG"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), TMPDIR=str(run / "tmp"))
    return subprocess.Popen([sys.executable, "-m", "spockwire", "pipeline", "--config", str(config), *extra],
                            stdout=open(run / f"{name}.out", "wb"), stderr=open(run / f"{name}.err", "wb"),
                            env=env, cwd=run, start_new_session=True)


def _writer(pg_db, stop: threading.Event, written: list[int]) -> None:
    """Inserts and updates of orders until `stop`: every change adds 1 to the row's `n` (an insert sets 1)."""
    conn = pg_db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            next_id = 1000
            while not stop.is_set():
                cur.execute("INSERT INTO orders VALUES (%s, 1)", (next_id,))
                cur.execute("UPDATE orders SET n = n + 1 WHERE id IN (%s, %s)", (next_id // 2, next_id - 7))
                next_id += 1
                written[0] += 1
                time.sleep(0.01)
    finally:
        conn.close()



def _end(stop: threading.Event, writer: threading.Thread, proc: subprocess.Popen) -> None:
    """Stop the writer (if it started), and kill the job's process group if it is still running."""
    stop.set()
    if writer.ident is not None:
        writer.join(30)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


#: the progress line of a micro-batch with changes (the lag of snapshot rows is not reported)
CHANGES = re.compile(r"rows/s, [\d.]+ s\), lag \d")


def _progress(path: Path) -> list[str]:
    return [ln for ln in _lines(path) if ln.startswith("spockwire pipeline: batch ")]


def _committed(ck: Path) -> list[int]:
    return sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())


def _offsets(ck: Path) -> list[int]:
    return sorted(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert proc.poll() is None, f"the pipeline ended ({proc.returncode}): {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out: {log.read_text()[-3000:]}"
        time.sleep(0.1)


def _contents(path: Path) -> bytes:
    """A file's bytes, and what they hold decompressed: a zstd stream (Spark's event logs), a Parquet file's rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = path.read_bytes()
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        data += pa.CompressedInputStream(pa.BufferReader(data), "zstd").read()
    elif data.startswith(b"PAR1"):
        data += repr(pq.read_table(path).to_pylist()).encode()
    return data


def _files_holding(root: Path, needles: list[bytes]) -> tuple[list[str], int]:
    """The files under `root` that hold one of `needles`, and how many files were searched."""
    found, searched = [], 0
    for path in root.rglob("*"):
        if path.is_file():
            data = _contents(path)
            searched += 1
            found += [f"{path} ({n!r})" for n in needles if n in data]
    return found, searched


def _java_command(group: int) -> list[str]:
    """The command line of the java process in process group `group`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == group and os.path.basename(args[0]) == "java":
            return args
    raise AssertionError(f"no java process in process group {group}")


@pytest.mark.timeout(600)
def test_sigterm_finishes_the_batch_then_restart_exactly_once_and_the_password_is_in_no_file(pg_db, tmp_path):
    password = "pw-" + secrets.token_urlsafe(18)
    role = _role(pg_db, password)
    pg_db.execute("CREATE TABLE orders (id int PRIMARY KEY, n int NOT NULL)")
    pg_db.execute("INSERT INTO orders SELECT g, 1 FROM generate_series(1, 500) g")
    pg_db.execute(f"CREATE PUBLICATION pub FOR TABLE orders; GRANT SELECT ON orders TO {role}")
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "secret").mkdir()
    port = _free_port()
    config = _config(tmp_path / "secret" / "pipeline.toml", run, _dsn(pg_db, role), f"{pg_db.name}_s"[:63],
                     password, metrics_port=port)

    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(pg_db, stop, written), daemon=True)
    first = _start(config, run, "first")
    try:
        # the writers start once the snapshot is exported (its first micro-batch applied): every later change of a
        # row is one more SCD 2 version
        _wait(lambda: _progress(run / "first.err"), 240, first, run / "first.err")
        writer.start()
        # changes keep arriving: the job is past the snapshot and has applied a micro-batch of changes
        _wait(lambda: any(CHANGES.search(ln) for ln in _progress(run / "first.err")), 240, first, run / "first.err")
        # its local driver JVM compiles with the quick compiler only (job.spark_session), and has the options the
        # configuration adds (spark.driver.extraJavaOptions: java.io.tmpdir) too
        jvm = _java_command(first.pid)
        assert set(LOCAL_DRIVER_JAVA_OPTIONS.split()) | {f"-Djava.io.tmpdir={run}/tmp"} <= set(jvm), jvm
        _wait(lambda: _metrics(port)["spockwire_pipeline_snapshot_complete"] == 1
              and _metrics(port)["spockwire_pipeline_slot_lag_bytes"] >= 0, 60, first, run / "first.err")
        metrics = _metrics(port)
        first.send_signal(signal.SIGTERM)
        assert first.wait(120) == 0, (run / "first.err").read_text()[-3000:]
    finally:
        _end(stop, writer, first)
    assert written[0] > 0
    assert metrics["spockwire_pipeline_batches_total"] >= 2
    assert metrics['spockwire_pipeline_rows_total{table="public.orders"}'] > 500
    assert metrics['spockwire_pipeline_snapshot_rows_total{table="public.orders"}'] == 500
    assert metrics["spockwire_pipeline_snapshot_complete"] == 1
    chunks = metrics["spockwire_pipeline_snapshot_chunks_total"]
    assert metrics["spockwire_pipeline_snapshot_chunks_done"] == chunks >= 2
    assert metrics["spockwire_pipeline_apply_seconds_total"] > 0
    assert 0 <= metrics['spockwire_pipeline_lag_seconds{quantile="0.5"}'] < 120
    assert metrics["spockwire_pipeline_slot_lag_bytes"] >= 0

    out = [json.loads(ln) for ln in _lines(run / "first.out")]
    applied = [ln["batch"] for ln in out if "batch" in ln]
    stopped = [ln for ln in out if "stopped" in ln]
    assert stopped and stopped[0]["last_batch"] == applied[-1]
    # the micro-batch in flight at SIGTERM was finished: the last one applied is the last one committed, and no
    # later one was applied (one Spark logged but refused to apply is read again by the next run)
    assert _committed(run / "ck")[-1] == applied[-1]
    assert _offsets(run / "ck")[-1] in (applied[-1], applied[-1] + 1)
    err = _lines(run / "first.err")
    progress = _progress(run / "first.err")
    assert len(progress) == len(applied)
    assert re.fullmatch(r"spockwire pipeline: batch \d+: [\d,]+ rows \([\d,]+ rows/s, [\d.]+ s\), lag [\d.]+ s "
                        r"\(p95 [\d.]+ s\)", progress[-1]), progress[-1]
    # A micro-batch Spark started after the signal is refused before anything of it is applied (it is in the offsets
    # log, not committed: the next run reads it again), and Spark reports that refusal as the query's error. It is
    # the only Python error allowed in the report, and only for the batch after the last one applied.
    refused = f"RuntimeError: micro-batch {applied[-1] + 1} {job.STOPPING}"
    python_errors = {ln.strip() for ln in err if re.match(r"[A-Z]\w*(Error|Exception)(: |$)", ln.strip())}
    if python_errors:
        assert python_errors == {refused}, err
        assert _offsets(run / "ck")[-1] == applied[-1] + 1
    elif not any("did not connect back in time" in ln for ln in err):
        # (Spark's report of a Python worker that did not connect back in time on a loaded machine, after which the
        # job started its query again from the checkpoint, is the one other report allowed)
        assert not [ln for ln in err if "Traceback" in ln or "Exception" in ln], err

    # the next run (in this process, on the suite's Spark session: the same job, without a second JVM start) goes on
    # from the checkpoint
    with open(run / "second.out", "w") as out:
        assert job.run(job_config(resolve(build_parser().parse_args(["pipeline", "--config", str(config)]),
                                          "pipeline")),
                       until_caught_up=True, timeout=300, out=out, spark=spark_session()) == 0
    assert any('"caught_up": true' in ln for ln in _lines(run / "second.out"))
    # caught up, the job stops like a signal stops it: every micro-batch it applied is committed (a later run does not
    # read it again)
    second = [json.loads(ln)["batch"] for ln in _lines(run / "second.out") if '"batch"' in ln]
    assert second and max(second) <= _committed(run / "ck")[-1]

    source = dict(pg_db.query("SELECT id, n FROM orders"))
    scd1 = checked_table(run / "delta" / "public.orders").select(["id", "n"])
    assert dict(zip(*scd1.to_pydict().values())) == source
    # exactly once: one SCD 2 version per change of each row (the insert and each update added 1 to n)
    history = checked_table(run / "delta" / "public.orders_history").select(["id"])
    versions: dict[int, int] = {}
    for key in history.column("id").to_pylist():
        versions[key] = versions.get(key, 0) + 1
    assert versions == source

    # the password is in no file either run wrote, in plain text, base64 or hex
    needles = [password.encode(), base64.b64encode(password.encode()), password.encode().hex().encode()]
    logs = list((run / "events").rglob("events_*"))
    assert logs and all(b"SparkListenerApplicationStart" in _contents(p) for p in logs), "no event log to search"
    found, searched = _files_holding(run, needles)
    assert found == [] and searched > 20


def _one_line_error(capsys, *argv: str) -> tuple[int, str]:
    status = cli_main(["pipeline", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spockwire pipeline: error: "), err
    assert "Traceback" not in err[0]
    return status, err[0]


def test_errors_before_spark_starts_are_one_line(pg_db, tmp_path, capsys, monkeypatch):
    password = "pw-" + secrets.token_urlsafe(18)
    role = _role(pg_db, password)
    pg_db.execute("CREATE TABLE logs (at timestamptz, line text)")      # no primary key: no replica identity
    pg_db.execute(f"CREATE PUBLICATION pub FOR TABLE logs; GRANT SELECT ON logs TO {role}")
    for key in [k for k in os.environ if k.startswith(("SPOCKWIRE_", "PG"))]:
        monkeypatch.delenv(key)
    common = ["--dsn", _dsn(pg_db, role), "--slot", "s", "--publication", "pub", "--table", "public.logs",
              "--target", str(tmp_path / "delta"), "--checkpoint", str(tmp_path / "ck")]

    monkeypatch.setenv("SPOCKWIRE_PASSWORD", "not-" + password)
    status, line = _one_line_error(capsys, *common)
    assert status == 1 and "cannot connect to the source database" in line
    assert "password authentication failed" in line and password not in line

    (tmp_path / "pw").write_text(password + "\n")
    monkeypatch.delenv("SPOCKWIRE_PASSWORD")
    missing = [a if a != "public.logs" else "public.no_such_table" for a in common]
    status, line = _one_line_error(capsys, *missing, "--password-file", str(tmp_path / "pw"))
    assert status == 1 and "table public.no_such_table does not exist upstream" in line, line

    status, line = _one_line_error(capsys, *common[:1], f"{_dsn(pg_db, role)} password={password}", *common[2:])
    assert status == 1 and "the dsn holds a password" in line and password not in line

    status, line = _one_line_error(capsys, *common, "--option", f"password={password}")
    assert status == 2 and "--password-file" in line and password not in line
    assert not (tmp_path / "ck").exists()


def test_the_source_keeps_the_password_out_of_the_dsn():
    from spockwire.spark.datasource import options_to_spec

    spec = options_to_spec({"dsn": "host=db dbname=shop user=cdc", "slot": "s", "PASSWORD": "pw 'x"})
    assert spec.dsn == "host=db dbname=shop user=cdc" and "pw" not in repr(spec)
    from psycopg2.extensions import parse_dsn

    assert parse_dsn(spec.conninfo) == {"host": "db", "dbname": "shop", "user": "cdc", "password": "pw 'x"}
    assert options_to_spec({"dsn": "host=db", "slot": "s"}).conninfo == "host=db"
    for dsn in ("host=db user=cdc password=s3cret", "postgresql://cdc:s3cret@db/shop", "host=db password=a s3cret"):
        with pytest.raises(ValueError, match="the dsn option holds a password") as raised:
            options_to_spec({"dsn": dsn, "slot": "s"})
        assert "s3cret" not in str(raised.value)


@pytest.mark.timeout(600)
def test_sigint_stops_the_job_as_sigterm_does(pg_db, tmp_path):
    """PySpark's SparkContext installs a SIGINT handler of its own (it cancels every Spark job and raises
    KeyboardInterrupt); the job takes SIGINT back once its session has started: Ctrl-C finishes and commits the
    micro-batch being applied, prints the stop line and exits 0, and the next run reads nothing twice."""
    pg_db.execute("CREATE TABLE orders (id int PRIMARY KEY, n int NOT NULL)")
    pg_db.execute("INSERT INTO orders SELECT g, 1 FROM generate_series(1, 200) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE orders")
    ck, target = tmp_path / "ck", tmp_path / "delta"
    command = [sys.executable, "-m", "spockwire.spark.job", "--dsn", pg_db.dsn, "--slot", f"{pg_db.name}_i"[:63],
               "--publication", "pub", "--table", "public.orders", "--target", str(target), "--checkpoint", str(ck),
               "--starting-position", "snapshot", "--no-maintenance"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out, err = tmp_path / "out", tmp_path / "err"
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(pg_db, stop, written), daemon=True)
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=o, stderr=e, start_new_session=True)
    try:
        def batches() -> list[dict]:
            return [json.loads(ln) for ln in _lines(out) if '"batch"' in ln]

        _wait(lambda: batches(), 240, proc, err)                      # the snapshot is in
        writer.start()
        _wait(lambda: len(batches()) >= 3, 240, proc, err)            # micro-batches of changes follow
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0, err.read_text()[-3000:]
    finally:
        _end(stop, writer, proc)
    lines = [json.loads(ln) for ln in _lines(out)]
    applied = [ln["batch"] for ln in lines if "batch" in ln]
    assert [ln for ln in lines if "stopped" in ln] == [{"stopped": True, "last_batch": applied[-1]}]
    assert "KeyboardInterrupt" not in err.read_text()
    # the last batch applied is committed; one Spark logged after the signal was refused (read again next run)
    assert _committed(ck)[-1] == applied[-1]
    assert _offsets(ck)[-1] in (applied[-1], applied[-1] + 1)
    # the next run: every change once (the rows counted equal what the first run left)
    again = subprocess.run([*command, "--until-caught-up"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    first_ids = {ln["batch"] for ln in lines if "batch" in ln}
    second_ids = {json.loads(ln)["batch"] for ln in again.stdout.splitlines() if '"batch"' in ln}
    assert not first_ids & second_ids
    got = checked_table(target / "public.orders").select(["id", "n"]).to_pylist()
    assert sorted((r["id"], r["n"]) for r in got) == sorted(pg_db.query("SELECT id, n FROM orders"))
