"""Allocation bounds: a count or length claimed by the wire never sizes an allocation.

Each case builds a decoder (set up with valid messages where the case needs them), then feeds bytes that claim
something huge -- 65535 columns, a 2 GB field, 4 billion truncated relations, a 4 GB frame record, a 4 GB logical
message, a binary array of 2^31 elements, a numeric of 32767 digits -- but stop short. Both implementations must
raise a ProtocolError (TruncatedMessage where the message is cut short) quickly, with the peak memory growth of
the call under a few MB: Python allocations measured by tracemalloc, C allocations by the process's peak resident
set (VmHWM, reset through /proc/self/clear_refs before the call). The address space is also capped a little above
what the process already uses, so an allocation that is made but never touched fails too.

The measurements run in a subprocess per implementation (`python -m tests.test_bounds IMPL` prints one JSON line
per case), so the test process's own memory does not blur them.
"""
from __future__ import annotations

import gc
import json
import os
import re
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAX_PY_GROWTH = 6 << 20      # bytes, tracemalloc peak during the call (a 65535-column relation costs ~5 MB)
MAX_RSS_GROWTH = 8 << 20     # bytes, VmHWM during the call minus VmRSS before it
MAX_SECONDS = 1.0
ADDRESS_SPACE_HEADROOM = 128 << 20   # bytes of address space the call may add

HUGE_FIELD = 0x7FFFFFFF      # 2 GB - 1: the largest positive int32 length
NUMERIC_12_2 = ((12 << 16) | 2) + 4


# -------------------------------------------------------------------------------------------------------------
# the cases: name -> (protocol, decoder kwargs, setup messages, what to do with the decoder, expected class name)

def _wire():
    from tests import wire_encoder as W

    return W


def _pgo(t, **fields):
    return _wire().pgoutput(t, **fields)


def _sp5(t, **fields):
    return _wire().spock(t, proto=5, insert_lsn=0x1000, **fields)


def _pgl(t, **fields):
    return _wire().pglogical(t, **fields)


def _cols(*specs):
    W = _wire()
    return [W.Col(name, oid, typmod, i == 0) for i, (name, oid, typmod) in enumerate(specs)]


def _wide(n=65535):
    W = _wire()
    return [W.Col(f"c{i}", 25, -1, i == 0) for i in range(n)]


def _pgo_setup(columns):
    return [_pgo("R", relid=1, namespace="public", name="t", replident="d", columns=columns),
            _pgo("B", final_lsn=0x100, commit_ts=0, xid=7)]


def _sp5_setup(columns):
    return [_sp5("R", relid=1, namespace="public", name="t", columns=columns),
            _sp5("B", final_lsn=0x100, commit_ts=0, xid=7)]


def _pgl_setup(columns):
    return [_pgl("R", relid=1, namespace="public", name="t", columns=columns),
            _pgl("B", final_lsn=0x100, commit_ts=0, xid=7)]


SP5 = struct.pack(">Q", 0x1000)         # spock v5 remote_insert_lsn prefix


def _binary_value(data: bytes) -> bytes:
    return b"b" + struct.pack(">I", len(data)) + data


def _pgo_row(*fields: bytes, natts: int | None = None) -> bytes:
    return b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", len(fields) if natts is None else natts) \
        + b"".join(fields)


def _array_header(ndim, elem_oid, dims):
    return struct.pack(">iiI", ndim, 0, elem_oid) + b"".join(struct.pack(">ii", d, 1) for d in dims)


def cases():
    """name -> (protocol, kwargs, setup messages (or a function making them), operation(decoder), expected
    exception class name)."""
    feed = lambda payload: (lambda dec: dec.feed(payload))  # noqa: E731
    c = {}
    # 65535 columns: a relation that really has them, then a row that claims them and stops
    c["pgoutput-65535-column-row"] = ("pgoutput", {}, lambda: _pgo_setup(_wide()),
                                      feed(_pgo_row(b"t\0\0\0\x01a", natts=65535)), "TruncatedMessage")
    c["pgoutput-65535-column-relation"] = (
        "pgoutput", {}, [], feed(b"R" + struct.pack(">I", 1) + b"public\0t\0d" + struct.pack(">H", 65535)
                                 + b"\x01a\0" + struct.pack(">Ii", 25, -1)), "TruncatedMessage")
    c["spock-65535-column-row"] = ("spock", {"proto_version": 5}, lambda: _sp5_setup(_wide()),
                                   feed(SP5 + b"I\0" + struct.pack(">I", 1) + b"NT" + struct.pack(">H", 65535)
                                        + b"n"), "TruncatedMessage")
    c["spock-65535-column-relation"] = (
        "spock", {"proto_version": 5}, [],
        feed(SP5 + b"R\0" + struct.pack(">I", 1) + b"\x07public\0\x02t\0A" + struct.pack(">H", 65535)),
        "TruncatedMessage")
    c["pglogical-65535-column-row"] = ("pglogical", {}, lambda: _pgl_setup(_wide()),
                                       feed(b"I\0" + struct.pack(">I", 1) + b"NT" + struct.pack(">H", 65535)
                                            + b"n"), "TruncatedMessage")
    c["pglogical-65535-column-relation"] = (
        "pglogical", {}, [],
        feed(b"R\0" + struct.pack(">I", 1) + b"\x07public\0\x02t\0A" + struct.pack(">H", 65535)
             + b"C\0N\0\x02a\0"), "TruncatedMessage")
    # a 2 GB field length in a tuple
    text1 = _cols(("a", 25, -1))
    for kind in (b"t", b"b"):
        name = {b"t": "text", b"b": "binary"}[kind]
        c[f"pgoutput-2GB-{name}-field"] = ("pgoutput", {}, _pgo_setup(text1),
                                           feed(_pgo_row(kind + struct.pack(">I", HUGE_FIELD) + b"abc")),
                                           "TruncatedMessage")
        c[f"pgoutput-2GB-{name}-field-raw"] = ("pgoutput", {"types": "raw"}, _pgo_setup(text1),
                                               feed(_pgo_row(kind + struct.pack(">I", HUGE_FIELD) + b"abc")),
                                               "TruncatedMessage")
    c["pgoutput-4GB-field"] = ("pgoutput", {}, _pgo_setup(text1),
                               feed(_pgo_row(b"t" + struct.pack(">I", 0xFFFFFFFF) + b"abc")), "ProtocolError")
    c["spock-2GB-field"] = ("spock", {"proto_version": 5}, _sp5_setup(text1),
                            feed(SP5 + b"I\0" + struct.pack(">I", 1) + b"NT\0\x01t" + struct.pack(">I", HUGE_FIELD)
                                 + b"ab"), "TruncatedMessage")
    c["pglogical-2GB-internal-field"] = ("pglogical", {}, _pgl_setup(text1),
                                         feed(b"I\0" + struct.pack(">I", 1) + b"NT\0\x01i"
                                              + struct.pack(">I", HUGE_FIELD) + b"ab"), "TruncatedMessage")
    # 4 billion relations in a truncate
    c["pgoutput-4G-relation-truncate"] = ("pgoutput", {}, _pgo_setup(text1),
                                          feed(b"T" + struct.pack(">IBII", 4_000_000_000, 0, 1, 1)),
                                          "TruncatedMessage")
    c["spock-4G-relation-truncate"] = ("spock", {"proto_version": 5}, _sp5_setup(text1),
                                       feed(SP5 + b"T" + struct.pack(">IBII", 4_000_000_000, 0, 1, 1)),
                                       "TruncatedMessage")
    # a frame record claiming 4 GB
    frame = struct.pack(">IQ", 0xFFFFFFFF, 0x10) + b"B" * 20
    c["frame-record-4GB"] = ("pgoutput", {}, [], lambda dec: dec.feed_frames(frame), "FrameError")
    c["spock-frame-record-4GB"] = ("spock", {}, [], lambda dec: dec.feed_frames(frame), "FrameError")
    # a logical message with a 4 GB content length
    c["pgoutput-4GB-message-content"] = ("pgoutput", {}, [],
                                         feed(b"M\0" + struct.pack(">Q", 0x10) + b"p\0" + struct.pack(">I", 0xFFFFFFFF)
                                              + b"abc"), "TruncatedMessage")
    c["pgoutput-2GB-message-content-in-txn"] = ("pgoutput", {}, _pgo_setup(text1),
                                                feed(b"M\1" + struct.pack(">Q", 0x10) + b"p\0"
                                                     + struct.pack(">I", HUGE_FIELD) + b"abc"), "TruncatedMessage")
    c["spock-4GB-message-content"] = ("spock", {"proto_version": 5}, [],
                                      feed(SP5 + b"M" + struct.pack(">IQB", 0, 0x10, 0) + b"Spock\0"
                                           + struct.pack(">I", 0xFFFFFFFF) + b"abc"), "TruncatedMessage")
    # a binary array claiming 2^31 elements; a 6-dimensional one whose dimensions multiply past 2^64
    for elem, arr_oid in ((23, 1007), (25, 1009)):
        cols = _cols(("a", arr_oid, -1))
        one = struct.pack(">i", 4) + b"\0\0\0\1"
        c[f"pgoutput-binary-array-{arr_oid}-2^31-elements"] = (
            "pgoutput", {}, _pgo_setup(cols),
            feed(_pgo_row(_binary_value(_array_header(1, elem, [0x7FFFFFFF]) + one))), "ProtocolError")
    c["pgoutput-binary-array-6-huge-dimensions"] = (
        "pgoutput", {}, _pgo_setup(_cols(("a", 1007, -1))),
        feed(_pgo_row(_binary_value(_array_header(6, 23, [0x7FFFFFFF] * 6)))), "ProtocolError")
    # a numeric claiming 32767 digits (base 10000) with two present
    short_numeric = struct.pack(">hhHH", 32767, 0, 0, 0) + struct.pack(">hh", 1, 2)
    for label, typmod in (("numeric", -1), ("numeric(12,2)", NUMERIC_12_2)):
        for mode in ("decimal", "text"):
            c[f"pgoutput-{label}-32767-digits-{mode}"] = (
                "pgoutput", {"numeric": mode}, _pgo_setup(_cols(("n", 1700, typmod))),
                feed(_pgo_row(_binary_value(short_numeric))), "ProtocolError")
    c["pgoutput-numeric-array-32767-digits"] = (
        "pgoutput", {}, _pgo_setup(_cols(("n", 1231, -1))),
        feed(_pgo_row(_binary_value(_array_header(1, 1700, [1]) + struct.pack(">i", len(short_numeric))
                                    + short_numeric))), "ProtocolError")
    return c


CASE_NAMES = sorted(cases())


def continuation(protocol: str, kwargs: dict, in_transaction: bool) -> list[bytes]:
    """Valid messages after a case: commit the transaction its setup opened (or, for a spock decoder told no
    version, the startup message), then a new transaction with a newly described one-column table and two rows."""
    enc = {"pgoutput": _pgo, "spock": _sp5, "pglogical": _pgl}[protocol]
    cols = _cols(("k", 23, -1))
    out = [enc("C", commit_lsn=0x100, end_lsn=0x110, commit_ts=0)] if in_transaction else []
    if protocol == "spock" and "proto_version" not in kwargs:
        out.append(_wire().spock("S", params={"proto_version": "5"}))
    return out + [enc("B", final_lsn=0x200, commit_ts=0, xid=8),
                  enc("R", relid=2, namespace="public", name="after", columns=cols),
                  enc("I", relid=2, new=["41"]), enc("I", relid=2, new=["42"]),
                  enc("C", commit_lsn=0x200, end_lsn=0x210, commit_ts=0)]


def outcome(dec, messages) -> list:
    """What a decoder makes of `messages` after what it already holds: its events as text, or its error."""
    from spockwire.errors import ProtocolError

    try:
        for message in messages:
            dec.feed(message)
        return ["events", [repr(e.to_pylist()) if hasattr(e, "to_pylist") else type(e).__name__
                           for e in dec.drain()]]
    except ProtocolError as exc:
        return ["error", type(exc).__name__, str(exc)]


def clean_outcome(module, name: str) -> list:
    """The outcome of the continuation on a decoder fed only the case's setup (never the bad bytes)."""
    protocol, kwargs, setup, _operation, _expected = cases()[name]
    setup = setup() if callable(setup) else setup
    dec = module.Decoder(protocol, **kwargs)
    for payload in setup:
        dec.feed(payload)
    return outcome(dec, continuation(protocol, kwargs, bool(setup)))


def _control_touched(dec):
    """Controls: the measurement must see what a decoder bug would do. A 32 MB buffer, written to."""
    from spockwire.errors import ProtocolError

    block = bytearray(32 << 20)
    raise ProtocolError(f"control {len(block)}")


def _control_untouched(dec):
    """A 1 GB malloc that is never written to: invisible to RSS, refused by the address-space cap."""
    import ctypes

    from spockwire.errors import ProtocolError

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    p = libc.malloc(1 << 30)
    libc.free(p)
    raise ProtocolError(f"control {'refused' if not p else 'allowed'}")


CONTROLS = {"control-touched-32MB": _control_touched, "control-untouched-1GB": _control_untouched}


# -------------------------------------------------------------------------------------------------------------
# the measuring subprocess

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(impl_name: str) -> None:
    import tracemalloc

    sys.path.insert(0, str(ROOT))
    from spockwire.errors import ProtocolError
    from tests.conftest import load_impl

    module = load_impl(impl_name)
    table = cases()
    for name, operation in CONTROLS.items():
        table[name] = ("pgoutput", {}, [], operation, "ProtocolError")
    prepared = {}
    for name in CASE_NAMES + list(CONTROLS):
        protocol, kwargs, setup, operation, expected = table[name]
        dec = module.Decoder(protocol, **kwargs)
        for payload in (setup() if callable(setup) else setup):
            dec.feed(payload)
        prepared[name] = (dec, operation, expected, protocol, kwargs, bool(setup() if callable(setup) else setup))
    del table
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    for name in CASE_NAMES + list(CONTROLS):
        dec, operation, expected, protocol, kwargs, in_transaction = prepared.pop(name)
        gc.collect()
        resource.setrlimit(resource.RLIMIT_AS, ((_status_kb("VmSize") << 10) + ADDRESS_SPACE_HEADROOM, hard))
        tracemalloc.start()
        py_before = tracemalloc.get_traced_memory()[0]
        rss_before = _status_kb("VmRSS") << 10
        _reset_peak_rss()
        started = time.perf_counter()
        error = None
        try:
            operation(dec)
        except ProtocolError as exc:
            error = (type(exc).__name__, str(exc))
        except BaseException as exc:   # MemoryError from the address-space cap, or any other escape
            error = ("UNEXPECTED " + type(exc).__name__, str(exc)[:300])
        seconds = time.perf_counter() - started
        rss_growth = (_status_kb("VmHWM") << 10) - rss_before
        py_growth = tracemalloc.get_traced_memory()[1] - py_before
        tracemalloc.stop()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        after = outcome(dec, continuation(protocol, kwargs, in_transaction))   # the same decoder, after the error
        del dec
        gc.collect()
        print(json.dumps({"case": name, "error": error, "expected": expected, "seconds": seconds,
                          "py_growth": py_growth, "rss_growth": rss_growth, "after": after}), flush=True)


# -------------------------------------------------------------------------------------------------------------
# the tests

_RESULTS: dict[str, dict] = {}


def results(impl_name: str) -> dict:
    if impl_name not in _RESULTS:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("LD_PRELOAD", None)
        proc = subprocess.run([sys.executable, "-m", "tests.test_bounds", impl_name], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        rows = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows[row["case"]] = row
        if proc.returncode != 0 or len(rows) != len(CASE_NAMES) + len(CONTROLS):
            pytest.fail(f"the measuring subprocess ({impl_name}) failed with exit code {proc.returncode} after "
                        f"{len(rows)} of {len(CASE_NAMES) + len(CONTROLS)} cases:\n{proc.stderr[-3000:]}")
        _RESULTS[impl_name] = rows
    return _RESULTS[impl_name]


@pytest.mark.parametrize("impl_name", ["c", "python"])
@pytest.mark.parametrize("case", CASE_NAMES)
def test_claimed_size_raises_without_allocating(case, impl_name):
    row = results(impl_name)[case]
    assert row["error"] is not None, f"{case}: no error raised"
    kind, text = row["error"]
    expected = row["expected"]
    from spockwire import errors

    assert hasattr(errors, kind), f"{case}: {kind}: {text}"
    assert issubclass(getattr(errors, kind), getattr(errors, expected)), f"{case}: {kind}: {text}"
    assert row["seconds"] < MAX_SECONDS, f"{case}: took {row['seconds']:.2f} s"
    assert row["py_growth"] < MAX_PY_GROWTH, f"{case}: Python allocations grew by {row['py_growth']} bytes"
    assert row["rss_growth"] < MAX_RSS_GROWTH, f"{case}: peak RSS grew by {row['rss_growth']} bytes"
    # the refused message left no trace: the same decoder goes on like one that never saw it, and decodes rows
    from tests.conftest import load_impl

    expected_after = clean_outcome(load_impl(impl_name), case)
    assert row["after"] == expected_after, f"{case}: the decoder after the error: {row['after']}"
    assert expected_after[0] == "events" and any("41" in e and "42" in e for e in expected_after[1]), expected_after


def test_the_measurement_sees_large_allocations():
    """The controls: a written 32 MB buffer shows in both measures; an untouched 1 GB malloc is refused."""
    row = results("python")["control-touched-32MB"]
    assert row["py_growth"] > 32 << 20 and row["rss_growth"] > 16 << 20, row
    assert results("python")["control-untouched-1GB"]["error"] == ["ProtocolError", "control refused"]


def test_both_implementations_give_the_same_errors():
    c_rows, py_rows = results("c"), results("python")
    diffs = [(case, c_rows[case]["error"], py_rows[case]["error"]) for case in CASE_NAMES
             if c_rows[case]["error"] != py_rows[case]["error"]]
    assert not diffs, "\n".join(f"{case}:\n  c:      {c}\n  python: {p}" for case, c, p in diffs)


if __name__ == "__main__":
    measure(sys.argv[1])
