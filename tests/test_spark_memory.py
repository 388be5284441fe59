"""The pipeline driver's memory settings (spockwire/spark/memory.py): delta-rs's allocator options set by default
unless the user set them, and the pages freed by a micro-batch given back to the system.

Each case runs in a fresh interpreter: the allocator reads its options once, when ``deltalake`` is loaded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from spockwire.spark.memory import DELTA_ALLOCATOR_CONF, DELTA_ALLOCATOR_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, env: dict[str, str | None]) -> list[str]:
    full = {k: v for k, v in os.environ.items() if k != DELTA_ALLOCATOR_ENV}
    full.update({k: v for k, v in env.items() if v is not None})
    full["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p]])
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def test_delta_allocator_default_applies_only_when_unset_and_before_deltalake_loads():
    mine = "dirty_decay_ms:5000"
    lines = _run(f"""
        import os, sys
        from spockwire.spark.memory import configure_delta_allocator
        assert "deltalake" not in sys.modules
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))      # unset: the default
        os.environ[{DELTA_ALLOCATOR_ENV!r}] = {mine!r}
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))      # the user's setting wins
        del os.environ[{DELTA_ALLOCATOR_ENV!r}]
        import deltalake
        # its allocator has read its options already: setting them now would claim an effect they cannot have
        print(configure_delta_allocator(), os.environ.get({DELTA_ALLOCATOR_ENV!r}))
    """, {})
    assert lines[:3] == [f"True {DELTA_ALLOCATOR_CONF}", f"False {mine}", "False None"]


def test_release_memory_gives_freed_pool_pages_back_and_keeps_live_data():
    lines = _run("""
        import numpy as np, pyarrow as pa, pyarrow.compute as pc
        from spockwire.spark.memory import release_memory

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096

        keep = pc.multiply(pa.array(np.arange(1_000_000)), 3)          # live: must survive
        garbage = [pc.multiply(keep, i) for i in range(12)] + [pc.add(keep.slice(0, 50_000), i) for i in range(200)]
        assert pa.total_allocated_bytes() > 150 << 20
        del garbage
        freed = rss()
        release_memory()
        print(freed - rss())
        print(keep[999_999].as_py(), keep.sum().as_py())
    """, {})
    returned, values = int(lines[0]), lines[1]
    # about 180 MB were freed inside pyarrow's pool; without the release the process keeps them resident
    assert returned > 100 << 20, returned
    assert values == f"{3 * 999_999} {3 * 999_999 * 1_000_000 // 2}"
