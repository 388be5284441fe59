"""`spockwire ingest` as a user sees it: the progress line (on a pseudo-terminal and on a pipe) and the metrics
endpoint, run as a subprocess against a live server. Positions and row counts are checked against the server's
own view (pg_replication_slots, pg_current_wal_lsn, the source table)."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) spockwire(\.\w+)*: \S.*$")
PROGRESS = re.compile(r"^spockwire ingest: (?P<rows>[\d,]+) rows \([\d,]+/s\), [\d.]+ MB/s written, \d+ tables, "
                      r"acked (?P<acked>[0-9A-F]+/[0-9A-F]+), lag (?P<lag>[\d,]+) B$")


def lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def environment(impl_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOCKWIRE_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["SPOCKWIRE_IMPL"] = impl_name
    return env


def slot_name(pg_db, suffix: str = "") -> str:
    return ("s_" + pg_db.name)[:50] + suffix    # slots are cluster-wide: one name per test database


@pytest.fixture
def db(pg_db):
    """`pg_db`, whose slots are dropped afterwards (they hold WAL for the whole cluster)."""
    yield pg_db
    if pg_db.cluster.running:
        pg_db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      "WHERE database = current_database() AND NOT active")


def ingest_args(pg_db, out: Path, *extra: str, slot: str | None = None) -> list[str]:
    return [sys.executable, "-m", "spockwire", "ingest", "--dsn", pg_db.dsn, "--slot", slot or slot_name(pg_db),
            "--publication", "pub", "--out", str(out), "--flush-seconds", "0.5", *extra]


def prepare(pg_db) -> int:
    """A published table with a backlog, a slot behind it, and WAL the slot has already passed (the slot's
    confirmed position is far from 0/0). Returns the slot's confirmed position."""
    pg_db.execute("CREATE TABLE noise (id int, pad text)")
    pg_db.execute("INSERT INTO noise SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE t")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot_name(pg_db),))
    pg_db.execute("INSERT INTO noise SELECT g, repeat('y', 200) FROM generate_series(1, 20000) g")  # unpublished
    pg_db.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 500) g")
    (confirmed,) = pg_db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                               (slot_name(pg_db),))[0]
    return lsn(confirmed)


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: carriage return, ESC [K (erase to end of line), newline."""
    lines: list[str] = []
    line: list[str] = []
    col = 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        if raw.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        if ch == "\x1b":
            raise AssertionError(f"unexpected escape sequence {raw[i:i + 6]!r}")
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(line))
            line, col = [], 0
        else:
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        i += 1
    if line:
        lines.append("".join(line))
    return lines


def run_on_terminal(args: list[str], env: dict[str, str], *, columns: int, on_output) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a pseudo-terminal `columns` wide; `on_output(text so far)` is called
    as output arrives. Returns (exit status, everything written)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:   # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
                on_output(b"".join(chunks).decode())
            elif proc.poll() is not None:
                break
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return status, b"".join(chunks).decode()


def test_progress_on_a_terminal_starts_at_the_slot_and_never_mixes_with_log_lines(db, impl, tmp_path):
    confirmed = prepare(db)
    out = tmp_path / "staging"
    inserted = []

    def on_output(text: str) -> None:
        # a second transaction while the progress line is shown, once the first one's rows are staged (a stream
        # read can hand both over at once, and then one staging commit takes them): its "staged" log line has to
        # replace the line
        if not inserted and "spockwire ingest: 500 rows" in text and '"event": "staged"' in text:
            db.execute("INSERT INTO t SELECT g, 'late ' || g FROM generate_series(501, 700) g")
            inserted.append(True)

    status, raw = run_on_terminal(ingest_args(db, out, "--idle-exit", "2"), environment(impl.IMPLEMENTATION),
                                  columns=200, on_output=on_output)
    assert status == 0, raw
    assert inserted, raw
    (wal_now,) = db.query("SELECT pg_current_wal_lsn()::text")[0]
    assert "\x1b[K" in raw                                  # redrawn in place, each time erasing the old line
    assert "0/0" not in raw                                  # no position is shown as 0/0
    lines = [line for line in screen(raw) if line.strip()]
    progress = [PROGRESS.match(line) for line in lines if not LOG_LINE.match(line)]
    assert all(progress), [line for line in lines if not LOG_LINE.match(line) and not PROGRESS.match(line)]
    assert sum(1 for line in lines if '"event": "staged"' in line) >= 2, lines
    assert re.search(r"\r\x1b\[K\d{4}-\d\d-\d\d ", raw), raw   # a log line erased the shown progress line
    # only the final progress line stays on the screen: every other was erased before a log line or redrawn
    assert len(progress) == 1 and PROGRESS.match(lines[-2]), lines[-3:]
    assert LOG_LINE.match(lines[-1]) and '"event": "stop"' in lines[-1]
    # every progress frame written (not only the last): acked starts at the slot's position, lag within the WAL
    # written since then, never the whole WAL
    frames = [PROGRESS.match(part.strip("\r\n")) for part in re.split(r"\r\x1b\[K", raw)]
    frames = [m for m in frames if m]
    assert frames
    first = frames[0]
    assert lsn(first["acked"]) >= confirmed, (first["acked"], confirmed)
    assert int(first["lag"].replace(",", "")) <= lsn(wal_now) - confirmed
    assert all(lsn(m["acked"]) >= confirmed for m in frames)
    (rows,) = db.query("SELECT count(*) FROM t")[0]
    assert progress[0]["rows"].replace(",", "") == str(rows) == "700"


def test_progress_on_a_narrow_terminal_is_cut_to_its_width(db, impl, tmp_path):
    prepare(db)
    status, raw = run_on_terminal(ingest_args(db, tmp_path / "staging", "--idle-exit", "1.5", "--log-format",
                                              "json"),
                                  environment(impl.IMPLEMENTATION), columns=50, on_output=lambda text: None)
    assert status == 0, raw
    parts = [line.strip("\r") for p in re.split(r"\r\x1b\[K", raw) for line in p.split("\n")]
    drawn = [p for p in parts if p.startswith("spockwire ingest:")]
    # redrawn lines never wrap (a wrapped line cannot be redrawn); the final one, which stays, is whole
    assert len(drawn) >= 2 and all(len(p) <= 49 for p in drawn[:-1]), drawn
    assert PROGRESS.match(drawn[-1]) and PROGRESS.match(drawn[-1])["rows"] == "500", drawn
    lines = [line for line in screen(raw) if line.strip()]
    assert all(line.startswith('{"ts": ') or line.startswith("spockwire ingest:") for line in lines), lines


def test_progress_on_a_pipe_is_whole_lines_and_off_by_default(db, impl, tmp_path):
    prepare(db)
    env = environment(impl.IMPLEMENTATION)
    forced = subprocess.run(ingest_args(db, tmp_path / "a", "--idle-exit", "1.5", "--progress"),
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert forced.returncode == 0, forced.stderr
    assert "\r" not in forced.stderr and "\x1b" not in forced.stderr
    lines = forced.stderr.splitlines()
    assert all(LOG_LINE.match(line) or PROGRESS.match(line) for line in lines), lines
    final = [PROGRESS.match(line) for line in lines if PROGRESS.match(line)][-1]
    assert final["rows"] == "500"
    default = subprocess.run(ingest_args(db, tmp_path / "b", "--create-slot", "--idle-exit", "1",
                                         slot=slot_name(db, "_b")),
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert default.returncode == 0, default.stderr
    assert "spockwire ingest:" not in default.stderr
    assert all(LOG_LINE.match(line) for line in default.stderr.splitlines()), default.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of sockets listening on `port`."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if int(hex_port, 16) == port and fields[3] == "0A":   # 0A: LISTEN
            found.add(address)
    return found


def scrape(port: int, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


@pytest.mark.parametrize("host, bound", [(None, "0100007F"), ("0.0.0.0", "00000000")])
def test_metrics_exist_from_the_first_scrape_on_the_chosen_host(db, impl, tmp_path, host, bound):
    confirmed = prepare(db)
    port = free_port()
    extra = ["--metrics-port", str(port), "--idle-exit", "3"] + (["--metrics-host", host] if host else [])
    proc = subprocess.Popen(ingest_args(db, tmp_path / "staging", *extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=environment(impl.IMPLEMENTATION), cwd=ROOT)
    try:
        first = scrape(port, time.monotonic() + 60)
        assert listening_addresses(port) == {bound}
        families = {line.split()[2]: line.split()[3] for line in first.splitlines() if line.startswith("# TYPE")}
        values = samples(first)
        expected = {"spockwire_rows_staged_total", "spockwire_rows_staged_all_total", "spockwire_bytes_written_total",
                    "spockwire_staging_commits_total", "spockwire_events_total", "spockwire_reconnects_total",
                    "spockwire_acked_lsn", "spockwire_lag_bytes", "spockwire_last_commit_timestamp_seconds",
                    "spockwire_uptime_seconds", "spockwire_staging_commits_by_reason_total"}
        assert set(families) == expected
        # per-table and per-reason series appear with their table / reason
        for name in expected - {"spockwire_rows_staged_total", "spockwire_staging_commits_by_reason_total"}:
            assert name in values, name
        for name, kind in families.items():
            if kind == "counter" and name in values:
                assert values[name] == 0, (name, first)
        assert values["spockwire_lag_bytes"] >= 0
        # once the stream is open, the acknowledged position is the slot's, not 0/0
        deadline = time.monotonic() + 60
        while samples(scrape(port, deadline))["spockwire_acked_lsn"] < confirmed:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        later = samples(scrape(port, deadline))
        assert later["spockwire_acked_lsn"] >= confirmed
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
