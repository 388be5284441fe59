"""The benchmark runs BENCHMARKS.md and the charts are made from: a run saved with --benchmark-json is kept where
benchmarks/report.py and benchmarks/charts.py look (benchmarks/runs.py), a partial run never replaces the full one,
and the newest pipeline measurements are shown."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# benchmarks/ is part of the checkout, not of the wheel
pytestmark = pytest.mark.lint

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def runs():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import runs
    finally:
        sys.path.remove(str(ROOT))
    return runs


def _bench(fullname: str, **extra) -> dict:
    return {"name": fullname.split("::")[1], "fullname": fullname, "extra_info": extra, "stats": {"median": 1.0}}


PEER = _bench("benchmarks/bench_peers.py::test_peers[narrow-c-typed-text]", role="spockwire", workload="narrow")
E2E = _bench("benchmarks/bench_e2e.py::test_stream[pg15-c]", rows=10)
SNAPSHOT = _bench("benchmarks/bench_snapshot.py::test_read[adbc]", snapshot_reader="adbc")
PIPELINE = _bench("benchmarks/bench_pipeline.py::test_snapshot", pipeline={"key": "snapshot", "measured": 1.0})
MANY = _bench("benchmarks/bench_many_tables.py::test_many_tables_under_pgbench",
              many_tables={"key": "many_tables", "measured": 1.0})
HOT_UNIFORM = _bench("benchmarks/bench_hot_keys.py::test_hot_keys[uniform]", hot_keys={"kind": "uniform"})
HOT = _bench("benchmarks/bench_hot_keys.py::test_hot_keys[hot]", hot_keys={"kind": "hot"})


def test_a_full_run_is_kept_and_its_pipeline_apart(runs, tmp_path):
    run = {"datetime": "2026-01-02", "benchmarks": [PEER, E2E, SNAPSHOT, PIPELINE]}
    written = runs.keep(run, tmp_path)
    assert sorted(p.name for p in written) == ["bench_run.json", "pipeline_run.json"]
    assert json.loads((tmp_path / "pipeline_run.json").read_text())["benchmarks"] == [PIPELINE]


def test_a_partial_run_does_not_replace_the_full_one(runs, tmp_path):
    runs.keep({"datetime": "2026-01-02", "benchmarks": [PEER, E2E, SNAPSHOT]}, tmp_path)
    full = (tmp_path / "bench_run.json").read_text()
    assert runs.keep({"datetime": "2026-01-03", "benchmarks": [PEER]}, tmp_path) == []
    assert [p.name for p in runs.keep({"datetime": "2026-01-04", "benchmarks": [PIPELINE]}, tmp_path)] == [
        "pipeline_run.json"]
    assert (tmp_path / "bench_run.json").read_text() == full


def test_the_newest_pipeline_measurements_are_shown(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUN", tmp_path / "bench_run.json")
    monkeypatch.setattr(runs, "PIPELINE", tmp_path / "pipeline_run.json")
    runs.keep({"datetime": "2026-01-02", "benchmarks": [PEER, E2E, SNAPSHOT, PIPELINE]}, tmp_path)
    main, pipeline = runs.load()
    assert main["datetime"] == "2026-01-02" and pipeline is None          # the full run's own
    runs.keep({"datetime": "2026-01-05", "benchmarks": [PIPELINE]}, tmp_path)
    main, pipeline = runs.load()
    assert main["datetime"] == "2026-01-02" and pipeline["datetime"] == "2026-01-05"


def test_the_many_tables_run_is_kept_apart_from_the_pipeline(runs, tmp_path):
    written = runs.keep({"datetime": "2026-01-06", "benchmarks": [MANY]}, tmp_path)
    assert [p.name for p in written] == ["many_tables_run.json"]
    assert runs.load_many_tables(tmp_path / "many_tables_run.json")["benchmarks"] == [MANY]
    written = runs.keep({"datetime": "2026-01-07", "benchmarks": [PIPELINE, MANY]}, tmp_path)
    assert sorted(p.name for p in written) == ["many_tables_run.json", "pipeline_run.json"]
    assert json.loads((tmp_path / "pipeline_run.json").read_text())["benchmarks"] == [PIPELINE]


def test_the_hot_keys_run_is_kept_with_both_batches_only(runs, tmp_path):
    assert runs.keep({"datetime": "2026-01-08", "benchmarks": [HOT]}, tmp_path) == []      # no uniform to compare
    written = runs.keep({"datetime": "2026-01-09", "benchmarks": [PEER, HOT_UNIFORM, HOT]}, tmp_path)
    assert [p.name for p in written] == ["hot_keys.json"]
    assert runs.load_hot_keys(tmp_path / "hot_keys.json")["benchmarks"] == [HOT_UNIFORM, HOT]
