"""Benchmark fixtures. Benchmarks live apart from the tests: run them with

    python -m pytest benchmarks -o python_files='bench_*.py' --benchmark-json=out/bench.json
    python benchmarks/report.py out/bench.json          # writes BENCHMARKS.md
"""
from __future__ import annotations

import pytest

from benchmarks.workloads import pgoutput_inserts

ROWS = 200_000


@pytest.fixture(scope="session")
def narrow_text():
    return pgoutput_inserts(rows=ROWS, binary=False)


@pytest.fixture(scope="session")
def narrow_binary():
    return pgoutput_inserts(rows=ROWS, binary=True)
