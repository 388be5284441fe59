"""Decode-only comparison with the peers, on the same captured changes held in memory (benchmarks/captured.py).

One pytest-benchmark group per workload. In each group, the same committed changes go through:

* spockwire, Cython (``spockwire.wire._decoder``), ``types="raw"`` and ``types="typed"``, over the pgoutput text
  and binary captures: one ``feed_frames`` call over the frame records, then ``drain()`` and ``to_arrow()``;
* spockwire, pure Python (``spockwire.wire._decoder_py``), typed, text, on a subset of the workloads (it is slow);
* pypgoutput: its message classes (``pypgoutput.decoders.Begin/Relation/Insert/Update/Delete/Commit``) over each
  text-format message, dispatched on the first byte, as its reader does. That is the package's decode step alone:
  its reader adds a database lookup per relation and a pydantic model per change, which are not measured;
* ``json.loads`` (and ``orjson.loads`` where installed) over the wal2json format-version 2 documents of the same
  changes, one per line;
* the npm package pg-logical-replication (``PgoutputPlugin.parse`` per message) in Node, text and binary captures,
  when ``node`` and the package (``npm install --prefix out/node pg-logical-replication``) are present; its time is
  measured inside Node (``benchmarks/node_peer.js``) and reported through ``extra_info["seconds"]``;
* a copy of the same bytes into a preallocated buffer (``numpy.copyto``): the physical floor.

Peers that take one message at a time get the messages already split (as a replication client hands them over);
splitting is not timed. ``extra_info`` carries ``rows`` (row changes), ``bytes`` (the input's size), ``input``
(pgoutput-text | pgoutput-binary | wal2json), ``role`` (spockwire | peer | floor), ``peer`` and ``label``, which
benchmarks/report.py turns into rows/s, MB/s, ratios to each peer and the fraction of memcpy speed.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from benchmarks.captured import ROOT, WORKLOADS, Captured
from spockwire.wire import _decoder, _decoder_py

NODE_MODULES = Path(os.environ.get("SPOCKWIRE_BENCH_NODE_MODULES", ROOT / "out" / "node" / "node_modules"))
NODE_SCRIPT = Path(__file__).with_name("node_peer.js")
PYTHON_TWIN_WORKLOADS = ("narrow", "wide", "toast", "update_heavy")

# (key, label, input, role, peer)
CANDIDATES = [
    ("c-raw-text", "spockwire C, raw, text", "text", "spockwire", None),
    ("c-typed-text", "spockwire C, typed, text", "text", "spockwire", None),
    ("c-raw-binary", "spockwire C, raw, binary", "binary", "spockwire", None),
    ("c-typed-binary", "spockwire C, typed, binary", "binary", "spockwire", None),
    ("c-raw-text-view", "spockwire C, raw, text, views", "text", "spockwire", None),
    ("c-typed-text-view", "spockwire C, typed, text, views", "text", "spockwire", None),
    ("c-raw-binary-view", "spockwire C, raw, binary, views", "binary", "spockwire", None),
    ("c-typed-binary-view", "spockwire C, typed, binary, views", "binary", "spockwire", None),
    ("python-typed-text", "spockwire Python, typed, text", "text", "spockwire", None),
    ("pypgoutput-text", "pypgoutput, text", "text", "peer", "pypgoutput"),
    ("wal2json-json", "wal2json + json.loads", "wal2json", "peer", "wal2json+json.loads"),
    ("wal2json-orjson", "wal2json + orjson.loads", "wal2json", "peer", "wal2json+orjson"),
    ("node-text", "pg-logical-replication (Node), text", "text", "peer", "pg-logical-replication"),
    ("node-binary", "pg-logical-replication (Node), binary", "binary", "peer", "pg-logical-replication binary"),
    ("memcpy-text", "memcpy, pgoutput text bytes", "text", "floor", None),
    ("memcpy-binary", "memcpy, pgoutput binary bytes", "binary", "floor", None),
    ("memcpy-wal2json", "memcpy, wal2json bytes", "wal2json", "floor", None),
]
INPUTS = {"text": "pgoutput-text", "binary": "pgoutput-binary", "wal2json": "wal2json"}

# What each peer does and does not do with these bytes (printed under the tables by report.py).
NOTES = {
    "pypgoutput": (
        "pypgoutput decodes text-format pgoutput only: its tuple reader has no case for binary ('b') values, so "
        "on a binary stream it silently returns rows without columns, and it is not measured there. It has no "
        "Origin, Type, logical Message, streaming or two-phase messages. Measured is its message decoding into "
        "dataclasses of strings; its reader's per-change pydantic models and per-relation catalog queries (which "
        "need a live connection) are left out, so the real package is slower than shown."),
    "wal2json+json.loads": (
        "wal2json + JSON: the server formats every value as JSON text (numbers as JSON numbers, everything else "
        "as strings); the client parses dicts of Python objects. Its input is larger than pgoutput's (up to 4x here)."),
    "pg-logical-replication": (
        "pg-logical-replication (Node): text values go through the pg-types parsers (int8 and numeric stay "
        "strings, timestamptz becomes a Date, jsonb is JSON.parse'd); binary values are handed over as undecoded "
        "Buffers, hence the comparison with spockwire's raw mode. Timed inside Node after a warm-up pass."),
    "spockwire Python": (
        "spockwire's pure-Python twin builds the same typed Arrow batches as the C decoder; it is the fallback, "
        "run on four of the workloads."),
}


# ---------------------------------------------------------------------------------------------------------------
# the decoders under test

def spockwire_decode(module, body: bytes, types: str, strings: str = "plain") -> int:
    dec = module.Decoder("pgoutput", types=types, strings=strings)
    dec.feed_frames(body)
    return sum(event.to_arrow().num_rows for event in dec.drain())


def pypgoutput_decode(payloads: list[bytes]) -> int:
    from pypgoutput import decoders as d

    classes = {ord("B"): d.Begin, ord("C"): d.Commit, ord("R"): d.Relation, ord("I"): d.Insert,
               ord("U"): d.Update, ord("D"): d.Delete, ord("T"): d.Truncate}
    changes = (ord("I"), ord("U"), ord("D"))
    rows = 0
    for payload in payloads:
        kind = payload[0]
        classes[kind](payload)
        if kind in changes:
            rows += 1
    return rows


def json_decode(loads, lines: list[bytes]) -> int:
    rows = 0
    for line in lines:
        if loads(line)["action"] in ("I", "U", "D"):
            rows += 1
    return rows


def memcpy(src: np.ndarray, dst: np.ndarray) -> int:
    np.copyto(dst, src)
    return 0


def _node_ready() -> str | None:
    """Why the Node peer cannot run, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_MODULES / "pg-logical-replication").is_dir():
        return (f"pg-logical-replication is not installed in {NODE_MODULES} "
                "(npm install --prefix out/node pg-logical-replication)")
    return None


def _require(module: str):
    """Import a peer's module; a missing peer fails its benchmark (BENCHMARKS.md never silently drops a column)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        pytest.fail(f"peer missing: pip install {module}")


def _version(dist: str) -> str:
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [c[0] for c in CANDIDATES])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_peers(benchmark, captured_workloads: dict[str, Captured], name: str, key: str) -> None:
    if name not in captured_workloads:
        pytest.skip(f"{name} is not in SPOCKWIRE_BENCH_WORKLOADS")
    w = captured_workloads[name]
    _, label, fmt, role, peer = next(c for c in CANDIDATES if c[0] == key)
    benchmark.group = f"decode-only: {name}"
    benchmark.extra_info.update(
        workload=name, workload_index=list(WORKLOADS).index(name), description=w.description, label=label,
        input=INPUTS[fmt], role=role, peer=peer, rows=w.changes, bytes=len(w.body(fmt)),
        server_version=w.meta["server_version"])
    note = NOTES.get(peer or "") or NOTES.get("spockwire Python" if key.startswith("python") else "")
    if note:
        benchmark.extra_info["note"] = note

    if key.startswith("c-"):
        types = key.split("-")[1]
        strings = "view" if key.endswith("-view") else "plain"
        rows = benchmark.pedantic(spockwire_decode, args=(_decoder, w.body(fmt), types, strings), rounds=5,
                                  iterations=1, warmup_rounds=1)
        assert rows == w.output_rows
    elif key == "python-typed-text":
        if name not in PYTHON_TWIN_WORKLOADS:
            pytest.skip("the pure-Python twin runs on a subset of the workloads")
        rows = benchmark.pedantic(spockwire_decode, args=(_decoder_py, w.text, "typed"), rounds=1, iterations=1)
        assert rows == w.output_rows
    elif key == "pypgoutput-text":
        _require("pypgoutput")
        benchmark.extra_info["version"] = _version("pypgoutput")
        rows = benchmark.pedantic(pypgoutput_decode, args=(w.text_payloads,), rounds=3, iterations=1)
        assert rows == w.changes
    elif key == "wal2json-json":
        rows = benchmark.pedantic(json_decode, args=(json.loads, w.wal2json_lines), rounds=3, iterations=1)
        assert rows == w.changes
    elif key == "wal2json-orjson":
        orjson = _require("orjson")
        benchmark.extra_info["version"] = _version("orjson")
        rows = benchmark.pedantic(json_decode, args=(orjson.loads, w.wal2json_lines), rounds=3, iterations=1,
                                  warmup_rounds=1)
        assert rows == w.changes
    elif key.startswith("node-"):
        why = _node_ready()
        if why:
            pytest.fail(f"peer missing: {why}")
        env = dict(os.environ, NODE_PATH=str(NODE_MODULES))

        def run() -> dict:
            proc = subprocess.run(["node", str(NODE_SCRIPT), str(w.path(fmt)), "3"], capture_output=True,
                                  text=True, env=env, timeout=1800, check=True)
            return json.loads(proc.stdout)

        result = benchmark.pedantic(run, rounds=1, iterations=1)
        assert result["rows"] == w.changes
        # the time measured inside Node (the process start and the file read are not the decoder's)
        benchmark.extra_info.update(seconds=statistics.median(result["times"]),
                                    version=f"{result['package']}, Node {result['node']}")
    elif key.startswith("memcpy-"):
        src = np.frombuffer(w.body(fmt), dtype=np.uint8)
        dst = np.empty_like(src)
        benchmark.pedantic(memcpy, args=(src, dst), rounds=20, iterations=1, warmup_rounds=2)
    else:  # pragma: no cover - a candidate without a branch
        raise ValueError(f"no benchmark for candidate {key!r}")
