"""Benchmark fixtures. Benchmarks live apart from the tests: run them with

    python -m pytest benchmarks -o python_files='bench_*.py' --benchmark-json=out/bench.json
    python benchmarks/report.py out/bench.json          # writes BENCHMARKS.md from that run

or everything at once (peers, end to end, the report, the charts): scripts/bench.sh. A run saved with
--benchmark-json is also kept in benchmarks/results/ (benchmarks/runs.py): a full run as bench_run.json, the
pipeline's measurements as pipeline_run.json; BENCHMARKS.md and the charts are made from those.
"""
from __future__ import annotations

import os

import pytest

from benchmarks.captured import captured_workloads  # noqa: F401 - session fixture of bench_peers.py
from benchmarks.workloads import pgoutput_inserts

ROWS = 200_000


def pytest_benchmark_update_machine_info(config, machine_info):
    """Memory and load at the start of the run, for the machine line of BENCHMARKS.md."""
    try:
        with open("/proc/meminfo") as fh:
            total_kb = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        machine_info["memory_gb"] = round(total_kb / 1024 ** 2, 1)
    except (OSError, StopIteration, ValueError):
        pass
    if hasattr(os, "getloadavg"):
        machine_info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Keep the run where benchmarks/report.py and benchmarks/charts.py find it (benchmarks/runs.py)."""
    from benchmarks import runs

    for path in runs.keep(output_json):
        print(f"\nbenchmarks: kept {path}")


@pytest.fixture(scope="session")
def narrow_text():
    return pgoutput_inserts(rows=ROWS, binary=False)


@pytest.fixture(scope="session")
def narrow_binary():
    return pgoutput_inserts(rows=ROWS, binary=True)
