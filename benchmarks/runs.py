"""The stored benchmark runs that BENCHMARKS.md and the charts are made from.

    benchmarks/results/bench_run.json       the last full run of scripts/bench.sh (pytest-benchmark JSON)
    benchmarks/results/pipeline_run.json    the last run of benchmarks/bench_pipeline.py (the same format)
    benchmarks/results/many_tables_run.json the last run of benchmarks/bench_many_tables.py (the same format)
    benchmarks/results/soak.json            the last soak of benchmarks/bench_soak.py (its own format: per batch)
    benchmarks/results/failover_run.json    the last run of each case of benchmarks/bench_failover.py
    benchmarks/results/hot_keys.json        the last run of benchmarks/bench_hot_keys.py holding both of its batches

A run saved with ``--benchmark-json`` at the default sizes (no SPOCKWIRE_BENCH_* setting) is kept here by ``keep``
(called from benchmarks/conftest.py when pytest-benchmark writes its JSON): a run holding the decode peers, the end-to-end streams and the snapshot readers becomes
bench_run.json; a run holding the pipeline's measurements also becomes pipeline_run.json (only those), and one
holding the many-tables benchmark many_tables_run.json (only it), one holding both batches of the hot-keys benchmark
hot_keys.json (only them). ``load`` gives the main run and the newest pipeline run, ``load_many_tables`` the
many-tables run, ``load_hot_keys`` the hot-keys run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().with_name("results")
RUN = RESULTS / "bench_run.json"
PIPELINE = RESULTS / "pipeline_run.json"
SOAK = RESULTS / "soak.json"
MANY_TABLES = RESULTS / "many_tables_run.json"
FAILOVER = RESULTS / "failover_run.json"
HOT_KEYS = RESULTS / "hot_keys.json"
#: the batches of benchmarks/bench_hot_keys.py, kept only together (the section compares them)
HOT_KEYS_KINDS = {"uniform", "hot"}


def load_soak(path: str | Path | None = None) -> dict | None:
    """The soak's record (benchmarks/bench_soak.py), None when there is none."""
    target = Path(path) if path else SOAK
    return json.loads(target.read_text()) if target.is_file() else None


def is_peer(bench: dict) -> bool:
    return "role" in bench.get("extra_info", {})


def is_e2e(bench: dict) -> bool:
    full = bench.get("fullname", "")
    return "bench_e2e.py" in full or "bench_connection.py" in full


def is_snapshot(bench: dict) -> bool:
    return "snapshot_reader" in bench.get("extra_info", {})


def is_pipeline(bench: dict) -> bool:
    return isinstance(bench.get("extra_info", {}).get("pipeline"), dict) or "bench_pipeline.py" in bench.get(
        "fullname", "")


def is_many_tables(bench: dict) -> bool:
    """benchmarks/bench_many_tables.py: the pipeline job over a 100-table database under pgbench (its figures in
    ``extra_info["many_tables"]``, apart from the pipeline's)."""
    return isinstance(bench.get("extra_info", {}).get("many_tables"), dict) or "bench_many_tables.py" in bench.get(
        "fullname", "")


def load_many_tables(path: str | Path | None = None) -> dict | None:
    """The kept run of benchmarks/bench_many_tables.py, None when there is none."""
    target = Path(path) if path else MANY_TABLES
    return json.loads(target.read_text()) if target.is_file() else None


def is_failover(bench: dict) -> bool:
    """benchmarks/bench_failover.py: promotions of a standby under the ingest worker or the pipeline job."""
    return isinstance(bench.get("extra_info", {}).get("failover"), dict)


def load_failover(path: str | Path | None = None) -> dict | None:
    """The kept runs of benchmarks/bench_failover.py, None when there is none."""
    target = Path(path) if path else FAILOVER
    return json.loads(target.read_text()) if target.is_file() else None


def is_hot_keys(bench: dict) -> bool:
    """benchmarks/bench_hot_keys.py: resolving a micro-batch whose changes land mostly on a few keys, beside a
    uniform one (its figures in ``extra_info["hot_keys"]``)."""
    return isinstance(bench.get("extra_info", {}).get("hot_keys"), dict) or "bench_hot_keys.py" in bench.get(
        "fullname", "")


def load_hot_keys(path: str | Path | None = None) -> dict | None:
    """The kept run of benchmarks/bench_hot_keys.py, None when there is none."""
    target = Path(path) if path else HOT_KEYS
    return json.loads(target.read_text()) if target.is_file() else None


def is_full_run(data: dict) -> bool:
    """A run of every part that BENCHMARKS.md leads with (what scripts/bench.sh runs without arguments)."""
    benches = data.get("benchmarks", [])
    return all(any(test(b) for b in benches) for test in (is_peer, is_e2e, is_snapshot))


def keep(data: dict[str, Any], results: Path = RESULTS) -> list[Path]:
    """Store a pytest-benchmark run (its JSON as a dict) where load() finds it; returns the files written."""
    written = []
    if is_full_run(data):
        written.append(_write(results / RUN.name, data))
    pipeline = [b for b in data.get("benchmarks", []) if is_pipeline(b)]
    if pipeline and all(isinstance(b.get("extra_info", {}).get("pipeline"), dict) for b in pipeline):
        written.append(_write(results / PIPELINE.name, dict(data, benchmarks=pipeline)))
    failover = [b for b in data.get("benchmarks", []) if is_failover(b)]
    if failover:       # each case replaces its own last run, the others are kept
        kept = load_failover(results / FAILOVER.name) or dict(data, benchmarks=[])
        names = {b["name"] for b in failover}
        merged = [b for b in kept["benchmarks"] if b["name"] not in names] + failover
        written.append(_write(results / FAILOVER.name, dict(data, benchmarks=sorted(merged, key=lambda b: b["name"]))))
    many = [b for b in data.get("benchmarks", []) if is_many_tables(b)]
    if many and all(isinstance(b.get("extra_info", {}).get("many_tables"), dict) for b in many):
        written.append(_write(results / MANY_TABLES.name, dict(data, benchmarks=many)))
    hot = [b for b in data.get("benchmarks", []) if is_hot_keys(b)]
    if all(isinstance(b.get("extra_info", {}).get("hot_keys"), dict) for b in hot) \
            and {b["extra_info"]["hot_keys"].get("kind") for b in hot} >= HOT_KEYS_KINDS:
        written.append(_write(results / HOT_KEYS.name, dict(data, benchmarks=hot)))
    return written


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


def load(run: str | Path | None = None, pipeline: str | Path | None = None) -> tuple[dict, dict | None]:
    """The main run, and the run whose pipeline measurements to show instead of its own (None: its own).

    Without `run`, the stored runs: bench_run.json, and pipeline_run.json when it is newer than bench_run.json's
    own pipeline measurements (or bench_run.json has none). With `run` (a file of the caller's), `pipeline` or None.
    """
    if run is not None:
        return json.loads(Path(run).read_text()), json.loads(Path(pipeline).read_text()) if pipeline else None
    run, pipeline = RUN, PIPELINE
    main = json.loads(Path(run).read_text())
    other = json.loads(Path(pipeline).read_text()) if Path(pipeline).exists() else None
    own = [b for b in main.get("benchmarks", []) if is_pipeline(b)]
    if own and (other is None or main.get("datetime", "") >= other.get("datetime", "")):
        return main, None
    return main, other
