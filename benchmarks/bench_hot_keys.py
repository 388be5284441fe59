"""Hot keys: a micro-batch where a few keys carry most of the changes, resolved as fast per change as a uniform one.

    python -m pytest benchmarks/bench_hot_keys.py -o python_files='bench_*.py'

pgbench's branches and tellers take thousands of updates a second on a handful of keys, so one micro-batch holds
thousands of changes of each. The resolution (spockwire.spark.resolve, the step of `apply_changes` between reading
the stored rows and writing files) settles every key's changes with array operations; only keys whose changes
interleave with what is stored, or that carry TOASTed values across a key change, go one at a time (its
`sequential_keys` count). Both batches here are SPOCKWIRE_BENCH_HOT_CHANGES (500,000) updates in stream order, in
transactions of 10 changes, over a table of SPOCKWIRE_BENCH_HOT_KEYS (200,000) stored keys (SCD 1; the stored rows
of every touched key given, as the Delta target reads them):

* ``uniform``: each change's key drawn uniformly from the table's keys;
* ``hot``: 90% of the changes on 10 keys, the rest uniform (pgbench's branches and tellers at scale 10 get 1 and 10
  keys of every transaction).

Measured: the median of 5 rounds of ``resolve``; per change in microseconds; the keys on the sequential path (must
be 0: a hot key stays on the vectorised path, or the benchmark fails). ``extra_info["hot_keys"]``; the hot batch's
also holds its per-change cost divided by the uniform one's in the same run (``per_change_ratio_to_uniform``). A run
saved with ``--benchmark-json`` at the default sizes holding both batches is kept as benchmarks/results/hot_keys.json
(benchmarks/runs.py), which BENCHMARKS.md's "Hot keys" section is rendered from.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

CHANGES = int(os.environ.get("SPOCKWIRE_BENCH_HOT_CHANGES", "500000"))
KEYS = int(os.environ.get("SPOCKWIRE_BENCH_HOT_KEYS", "200000"))
HOT = 10
HOT_SHARE = 0.9
#: per change in microseconds of each batch measured in this run: the hot batch's ratio to the uniform one
PER_CHANGE_US: dict[str, float] = {}


def _batch(kind: str, rng: np.random.Generator) -> pa.Table:
    keys = rng.integers(0, KEYS, CHANGES)
    if kind == "hot":
        hot = rng.random(CHANGES) < HOT_SHARE
        keys[hot] = rng.integers(0, HOT, int(hot.sum()))
    n = CHANGES
    lsn = 1_000_000 + np.arange(n) // 10 * 100          # transactions of 10 changes
    return pa.table({"_change_type": pa.array(["update_postimage"] * n),
                     "_commit_lsn": pa.array(lsn, pa.int64()), "_seq": pa.array(np.arange(n) % 10, pa.int64()),
                     "_commit_ts": pa.array(lsn * 1000, pa.timestamp("us", "UTC")),
                     "id": pa.array(keys, pa.int64()), "balance": pa.array(rng.integers(-5000, 5000, n), pa.int64()),
                     "filler": pa.array(np.full(n, "x" * 84).tolist(), pa.string())})


def _stored(batch: pa.Table) -> pa.Table:
    ids = np.unique(batch.column("id").to_numpy())
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "balance": pa.array(np.zeros(n, np.int64)),
                     "filler": pa.array(np.full(n, "y" * 84).tolist(), pa.string()),
                     "_commit_lsn": pa.array(np.full(n, 10, np.int64)), "_seq": pa.array(np.zeros(n, np.int64))})


@pytest.mark.parametrize("kind", ["uniform", "hot"])
@pytest.mark.benchmark(group="hot keys")
def test_hot_keys(benchmark, kind):
    from spockwire.spark.resolve import DEFAULT_SEQUENCE, Stored, make_plan, resolve

    batch = _batch(kind, np.random.default_rng(7))
    stored = Stored(rows=_stored(batch))
    cols = ["id", "balance", "filler"]
    plan = make_plan(batch.column_names, ["id"], DEFAULT_SEQUENCE, 1, cols)
    res = benchmark.pedantic(lambda: resolve(batch, plan, stored, cols), rounds=5, iterations=1, warmup_rounds=1)
    median = benchmark.stats.stats.median
    counts = np.bincount(batch.column("id").to_numpy())
    top = np.sort(counts)[::-1]
    info = {"kind": kind, "changes": CHANGES, "table_keys": KEYS, "hot_keys": HOT if kind == "hot" else 0,
            "hot_share": HOT_SHARE if kind == "hot" else 0.0, "keys_touched": int(np.count_nonzero(counts)),
            "top_10_keys_share": round(float(top[:HOT].sum()) / CHANGES, 3),
            "rows_written": res.rows.num_rows, "fresh_keys": int(res.fresh_keys),
            "sequential_keys": int(res.sequential_keys),
            "seconds": round(median, 4), "per_change_us": round(median / CHANGES * 1e6, 3)}
    PER_CHANGE_US[kind] = median / CHANGES * 1e6
    if kind == "hot" and "uniform" in PER_CHANGE_US:
        info["per_change_ratio_to_uniform"] = round(PER_CHANGE_US["hot"] / PER_CHANGE_US["uniform"], 3)
    benchmark.extra_info["hot_keys"] = info
    print(f"\n{kind}: {info}")
    assert res.rows.num_rows == info["keys_touched"]          # one row per key: its last change
    assert res.sequential_keys == 0, f"{res.sequential_keys} keys went one at a time"
