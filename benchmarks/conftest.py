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
#: SPOCKWIRE_BENCH_* settings that change no measurement (where results go, time limits)
NOT_SIZES = {"SPOCKWIRE_BENCH_OUT", "SPOCKWIRE_BENCH_PIPELINE_JOB_TIMEOUT", "SPOCKWIRE_BENCH_PIPELINE_KEEP"}


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
    # sizes other than the defaults (SPOCKWIRE_BENCH_SCALE=0.05 ...): such a run is not kept as the run of record
    machine_info["bench_settings"] = {k: v for k, v in sorted(os.environ.items())
                                      if k.startswith("SPOCKWIRE_BENCH_") and k not in NOT_SIZES}


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Keep the run where benchmarks/report.py and benchmarks/charts.py find it (benchmarks/runs.py)."""
    from benchmarks import runs

    settings = output_json.get("machine_info", {}).get("bench_settings")
    if settings:
        print(f"\nbenchmarks: not kept in benchmarks/results/ (sizes other than the defaults: {settings})")
        return
    for path in runs.keep(output_json):
        print(f"\nbenchmarks: kept {path}")


@pytest.fixture(scope="session")
def narrow_text():
    return pgoutput_inserts(rows=ROWS, binary=False)


@pytest.fixture(scope="session")
def narrow_binary():
    return pgoutput_inserts(rows=ROWS, binary=True)
