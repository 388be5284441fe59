"""A short coverage-guided fuzzing run on the sanitizer build, and the regression tests of what fuzzing found.

The run: fuzz/build_sanitized.sh builds spockwire.wire._decoder with clang, ASan + UBSan and libFuzzer coverage
into build/fuzz/ (cached; the in-place build the other tests import is not touched), fuzz/seeds.py writes the seed
corpus, and fuzz/run.sh runs fuzz/fuzz_decoder.py under atheris in a subprocess with the sanitizer runtime
preloaded, for every seed and then FUZZ_MUTATIONS mutated inputs (a fixed amount of work, however loaded the
machine; FUZZ_MAX_SECONDS bounds the time). Any finding -- an exception other than ProtocolError, a sanitizer report, a crash, an allocation
above the limit, a time-out, or the C and Python implementations disagreeing -- fails the test with the fuzzer's
report. Missing tools (clang, atheris and the runtime its wheel ships) fail the test: they are part of the test
setup (scripts/setup-machine.sh), not optional.

SPOCKWIRE_FUZZ_MUTATIONS sets the inputs to run beyond the seeds (default 1000), SPOCKWIRE_FUZZ_MAX_SECONDS the time
limit (default 600).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spockwire.errors import ProtocolError
from tests import wire_encoder as W

# the source tree (fuzz/ lives there): the test command sets SPOCKWIRE_SOURCE_DIR when it runs the suite against
# the installed wheel from a copy of tests/
ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
FUZZ = ROOT / "fuzz"
# inputs beyond the seeds the short run executes (a loaded 2-core machine does 18-111 inputs/s)
FUZZ_MUTATIONS = int(os.environ.get("SPOCKWIRE_FUZZ_MUTATIONS", "1000"))
FUZZ_MAX_SECONDS = int(os.environ.get("SPOCKWIRE_FUZZ_MAX_SECONDS", "600"))
REGRESSIONS = FUZZ / "regressions"


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="module")
def sanitized():
    """Build (or refresh) the sanitizer build; fail, never skip, when a tool is missing."""
    missing = []
    if shutil.which(os.environ.get("CC", "clang")) is None:
        missing.append("clang (Debian package `clang`)")
    try:
        import atheris
    except ImportError:
        missing.append("atheris (pip install atheris)")
    else:
        if not (Path(atheris.path()) / "asan_with_fuzzer.so").is_file():
            missing.append("asan_with_fuzzer.so from the atheris wheel (reinstall atheris from its wheel)")
    if missing:
        pytest.fail("the fuzzing tests need " + ", ".join(missing) + ": install them (scripts/setup-machine.sh)")
    proc = subprocess.run(["bash", str(FUZZ / "build_sanitized.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"fuzz/build_sanitized.sh failed:\n{_tail(proc.stdout + proc.stderr)}")
    return ROOT / proc.stdout.strip().splitlines()[-1]


def _sanitized_env() -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("SPOCKWIRE_FUZZ_KNOWN", None)   # the test looks past nothing
    env.pop("SPOCKWIRE_FUZZ_LAST", None)
    return env


def _run_sanitized(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(FUZZ / "run.sh"), *args], cwd=ROOT, env=_sanitized_env(),
                          capture_output=True, text=True, errors="replace", timeout=timeout)


def _report(proc: subprocess.CompletedProcess) -> str:
    """The interesting part of a fuzzer's output: the finding and its stack, without atheris's import chatter."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("INFO: Instrumenting")]
    for marker in ("=== Uncaught Python exception", "ERROR: AddressSanitizer", "runtime error:", "ERROR: libFuzzer",
                   "FINDING", "Traceback"):
        for i, line in enumerate(lines):
            if marker in line:
                return "\n".join(lines[max(0, i - 3):i + 45])
    return "\n".join(lines[-60:])


def test_short_fuzz_run_finds_nothing(sanitized, tmp_path, request):
    """Every entry point (feed after a preamble, feed of message sequences, feed_frames, feed_frames with
    partial_ok), every protocol, typed and raw: the seeds cover each, and the fuzzer mutates from there."""
    seeds, corpus, artifacts = tmp_path / "seeds", tmp_path / "corpus", tmp_path / "artifacts"
    corpus.mkdir()
    artifacts.mkdir()
    proc = subprocess.run([sys.executable, str(FUZZ / "seeds.py"), str(seeds)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(list(seeds.iterdir())) > 300
    nseeds = len(list(seeds.iterdir()))
    started = time.monotonic()
    proc = _run_sanitized([f"-runs={nseeds + FUZZ_MUTATIONS}", f"-max_total_time={FUZZ_MAX_SECONDS}",
                           "-max_len=16384", "-timeout=30", "-rss_limit_mb=6144", "-malloc_limit_mb=256",
                           f"-dict={FUZZ / 'decoder.dict'}", "-seed=1", "-print_final_stats=1",
                           f"-artifact_prefix={artifacts}/", str(corpus), str(seeds)],
                          timeout=FUZZ_MAX_SECONDS + 240)
    seconds = time.monotonic() - started
    found = sorted(p.name for p in artifacts.iterdir())
    assert proc.returncode == 0 and not found, (
        f"the fuzzer reported a finding (exit code {proc.returncode}, artifacts {found}; replay one with "
        f"`fuzz/run.sh --replay FILE`):\n{_report(proc)}")
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
    assert executed, f"libFuzzer printed no execution count:\n{_report(proc)}"
    units = int(executed.group(1))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # past pytest's output capture, onto the terminal
            reporter.write_line(f"short fuzz run: {units} inputs executed in {seconds:.0f} s "
                                f"({nseeds} seeds, {units - nseeds} mutations)")
    # every seed ran, then the mutations (fewer: the time limit ended the run first)
    assert units >= nseeds + FUZZ_MUTATIONS, (
        f"{units} inputs executed in {seconds:.0f} s: the {FUZZ_MAX_SECONDS} s limit ended the run before "
        f"{nseeds} seeds and {FUZZ_MUTATIONS} mutations")


def test_replay_fuzzer_regressions(sanitized):
    """Inputs in the fuzzer's format that once were findings (fuzz/regressions/), on the sanitizer build."""
    inputs = sorted(str(p) for p in REGRESSIONS.iterdir() if p.is_file() and not p.name.endswith(".md"))
    assert inputs
    failures = []
    for path in inputs:   # one process per input: a sanitizer report ends the process
        proc = _run_sanitized(["--replay", path], timeout=180)
        if proc.returncode != 0:
            failures.append(f"--- {Path(path).name} (exit code {proc.returncode}):\n{_report(proc)}")
    assert not failures, "\n".join(failures)


# -------------------------------------------------------------------------------------------------------------
# regressions: minimal reproductions of the findings, readable without the fuzzer

_SANITIZED_PRELUDE = """
import os, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {fuzz!r})
import fuzz_decoder
c_module, _ = fuzz_decoder.load_modules(os.environ["SPOCKWIRE_FUZZ_MODULE"])
assert c_module.__file__ == os.environ["SPOCKWIRE_FUZZ_MODULE"], c_module.__file__
from tests import wire_encoder as W
Decoder = c_module.Decoder
"""


def _run_under_sanitizers(sanitized: Path, body: str) -> subprocess.CompletedProcess:
    """Run `body` (Python; `Decoder` is the sanitizer build's) with the sanitizer runtime preloaded."""
    import atheris

    env = _sanitized_env()
    env.update(SPOCKWIRE_FUZZ_MODULE=str(sanitized), SPOCKWIRE_IMPL="python", PYTHONMALLOC="malloc",
               ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               LD_PRELOAD=str(Path(atheris.path()) / "asan_with_fuzzer.so"))
    code = _SANITIZED_PRELUDE.format(root=str(ROOT), fuzz=str(FUZZ)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          errors="replace", timeout=180)


def _assert_clean(proc: subprocess.CompletedProcess) -> None:
    report = proc.stderr
    assert proc.returncode == 0 and "runtime error:" not in report and "Sanitizer" not in report, (
        f"exit code {proc.returncode}:\n{_report(proc)}")
    assert proc.stdout.strip().endswith("done"), proc.stdout


def test_typed_first_array_value_is_sanitizer_clean(sanitized):
    """UBSan: 'applying zero offset to null pointer' in decode_value (`col.data.data + idx * col.width` while the
    column's fixed-width data buffer is still NULL: variable-width and array columns never allocate it)."""
    _assert_clean(_run_under_sanitizers(sanitized, """
        dec = Decoder("pgoutput")
        dec.feed(W.pgoutput("R", relid=1, namespace="public", name="t", columns=[W.Col("a", 1007, -1, True)]))
        dec.feed(W.pgoutput("B", final_lsn=0x100, commit_ts=0, xid=5))
        dec.feed(W.pgoutput("I", relid=1, new=["{1}"]))
        dec.feed(W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=0))
        assert dec.drain()[0].to_arrow().column("a").to_pylist() == [[1]]
        print("done")
    """))


def test_raw_empty_first_value_is_sanitizer_clean(sanitized):
    """UBSan: 'applying zero offset to null pointer' / 'null pointer passed as argument 1' -- the raw tuple loop
    (Decoder._tuple) and var_append copy a zero-length value with memcpy(col.data.data + pos, p, 0) while the
    column's data buffer is still NULL."""
    _assert_clean(_run_under_sanitizers(sanitized, """
        for types in ("raw", "typed"):
            dec = Decoder("pgoutput", types=types)
            dec.feed(W.pgoutput("R", relid=1, namespace="public", name="t", columns=[W.Col("a", 25, -1, True)]))
            dec.feed(W.pgoutput("B", final_lsn=0x100, commit_ts=0, xid=5))
            dec.feed(W.pgoutput("I", relid=1, new=[""]))
            dec.feed(W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=0))
            assert dec.drain()[0].to_arrow().column("a").to_pylist() == [""]
        print("done")
    """))


# A commit timestamp that PostgreSQL can send (its range ends in 294276 AD) but Python's datetime cannot hold.
FAR_FUTURE = 0x7FFFFFFFFFFFFFF0


def _decode_until_error(impl, records):
    dec = impl.Decoder("pgoutput")
    try:
        for payload in records:
            dec.feed(payload)
        return None, dec.drain()
    except ProtocolError as exc:
        return (type(exc).__name__, str(exc), exc.offset), dec.drain()


@pytest.mark.parametrize("what", ["truncate", "message"])
def test_commit_timestamp_out_of_datetime_range(impl, what):
    """Bad bytes raise ProtocolError or decode: an out-of-range commit timestamp on a transaction holding a
    truncate or a transactional message raised OverflowError from pg_timestamp_to_datetime in both
    implementations."""
    cols = [W.Col("id", 23, -1, True)]
    item = (W.pgoutput("T", flags=0, relids=[1]) if what == "truncate"
            else W.pgoutput("M", flags=1, lsn=0x80, prefix="p", content=b"x"))
    records = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
               W.pgoutput("B", final_lsn=0x100, commit_ts=FAR_FUTURE, xid=5), item,
               W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=FAR_FUTURE)]
    _decode_until_error(impl, records)


def test_commit_timestamp_out_of_range_same_in_both(both_impls):
    c_impl, py_impl = both_impls
    cols = [W.Col("id", 23, -1, True)]
    records = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
               W.pgoutput("B", final_lsn=0x100, commit_ts=-FAR_FUTURE, xid=5),
               W.pgoutput("T", flags=0, relids=[1]),
               W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=-FAR_FUTURE)]

    def outcome(impl):
        try:
            error, events = _decode_until_error(impl, records)
        except Exception as exc:   # anything but ProtocolError is reported as such
            return ("escaped", type(exc).__name__)
        return error, [type(e).__name__ for e in events]

    assert outcome(c_impl) == outcome(py_impl)


@pytest.mark.parametrize("commit_ts", [FAR_FUTURE, -FAR_FUTURE], ids=["far-future", "far-past"])
def test_row_commit_timestamp_out_of_range(both_impls, commit_ts):
    """A row-only transaction with a commit timestamp outside datetime's range: the Python twin raised
    OverflowError (pg_timestamp_to_datetime in _emit_pending) while C decoded it -- for the far future into a
    wrapped, negative _commit_ts (see the sanitizer test below). Both must give the same ProtocolError, or the
    same rows with the true timestamp."""
    cols = [W.Col("id", 23, -1, True)]
    records = [W.pgoutput("R", relid=1, namespace="public", name="t", replident="d", columns=cols),
               W.pgoutput("B", final_lsn=0x100, commit_ts=commit_ts, xid=5),
               W.pgoutput("I", relid=1, new=["1"]),
               W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=commit_ts)]
    outcomes = []
    for impl in both_impls:
        error, events = _decode_until_error(impl, records)
        stamps = [e.to_arrow().column("_commit_ts").cast("int64").to_pylist() for e in events]
        outcomes.append((error, stamps))
        if error is None:
            from spockwire.model import PG_EPOCH_OFFSET_US

            assert stamps == [[commit_ts + PG_EPOCH_OFFSET_US]], (impl.IMPLEMENTATION, stamps)
    assert outcomes[0] == outcomes[1]


def test_commit_timestamp_epoch_shift_is_sanitizer_clean(sanitized):
    """UBSan: 'signed integer overflow: 9223372036854775792 + 946684800000000' -- `txn.commit_ts + _EPOCH`
    (_decoder.pyx, the row's _commit_ts) for a commit timestamp near the int64 limit."""
    _assert_clean(_run_under_sanitizers(sanitized, """
        from spockwire.errors import ProtocolError
        dec = Decoder("pgoutput")
        dec.feed(W.pgoutput("R", relid=1, namespace="public", name="t", replident="d",
                            columns=[W.Col("id", 23, -1, True)]))
        try:
            dec.feed(W.pgoutput("B", final_lsn=0x100, commit_ts=0x7FFFFFFFFFFFFFF0, xid=5))
            dec.feed(W.pgoutput("I", relid=1, new=["1"]))
            dec.feed(W.pgoutput("C", commit_lsn=0x100, end_lsn=0x140, commit_ts=0x7FFFFFFFFFFFFFF0))
            dec.drain()
        except ProtocolError:
            pass
        print("done")
    """))
