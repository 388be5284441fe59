"""`spockwire demo`, the main job, end to end: a throwaway PostgreSQL whose tables hold rows before the slot, a
local Spark reading the initial snapshot then the changes while writes run, a Delta table per source table; the
demo's own check compares each Delta table with its source table (read with psycopg2)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_the_spark_pipeline_into_delta(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPOCKWIRE_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "spockwire", "demo", "--rows", "3000", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=environ, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("spockwire demo: starting a throwaway cluster of PostgreSQL ")
    assert lines[-1] == f"demo: every table matches its source, on {lines[0].split(' cluster of ', 1)[1]}"
    assert any("they arrive by the source's initial snapshot" in line for line in lines), proc.stdout
    assert any(re.match(r"snapshot: [\d,]+ rows", line) for line in lines), proc.stdout
    assert sum("Delta table equals the source table" in line for line in lines) == 3, proc.stdout
    assert any(re.match(r"\s+batch\s+\d+:", line) for line in lines), proc.stdout
    tables = sorted(p.name for p in (tmp_path / "delta").iterdir())
    assert tables == ["public.customers", "public.events", "public.orders"]
