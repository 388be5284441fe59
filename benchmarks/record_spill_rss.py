"""Record the peak memory of one huge transaction decoded with spilling (the figure README "Protocols" quotes).

    python -m benchmarks.record_spill_rss [ROWS]

Runs the workload of tests/test_spill.py's huge-transaction test (one pgoutput transaction of ROWS two-column rows,
default 10,000,000, compiled decoder, spill_bytes 64 MiB) in a fresh interpreter, checks that every row came out,
and writes the result with the machine and the date to benchmarks/results/spill_rss.json. The peak is the child
process's own VmHWM.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "spill_rss.json"


def main(rows: int = 10_000_000) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.test_spill import HUGE

    with tempfile.TemporaryDirectory() as tmp:
        script = HUGE.format(root=str(ROOT), module="_decoder", rows=rows, tmp=tmp)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        seconds = time.monotonic() - started
    got_rows, total, peak_mb = (int(x) for x in done.stdout.split())
    assert got_rows == rows and total == rows * (rows - 1) // 2, done.stdout
    result = {
        "workload": "one pgoutput transaction of bigint + 24-byte text rows (tests/test_spill.py HUGE)",
        "rows": rows, "decoder": "c", "spill_bytes": 64 << 20, "peak_rss_mb": peak_mb,
        "wall_seconds": round(seconds, 1),
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:])), indent=2))
