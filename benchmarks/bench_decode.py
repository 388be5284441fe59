"""Decode-only throughput: the same in-memory stream through each implementation and mode, side by side.

Workload: 200,000 INSERT rows into a 7-column table (bigint, int, numeric(12,2), timestamptz, text, jsonb, uuid)
as a pgoutput stream, text format (~210 bytes per row message) and binary format. Each benchmark feeds the whole
stream with one `feed_frames` call and drains the Arrow batches. `extra_info` carries rows, payload bytes and the
row count decoded, so the report can state rows/s, MB/s and ratios.
"""
from __future__ import annotations

import pytest

from spockwire.wire import _decoder, _decoder_py

IMPLS = {"c": _decoder, "python": _decoder_py}


def _decode(module, body, types):
    dec = module.Decoder("pgoutput", types=types)
    dec.feed_frames(body)
    return sum(e.num_rows for e in dec.drain())


@pytest.mark.parametrize("impl", ["c", "python"])
@pytest.mark.parametrize("types", ["raw", "typed"])
@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_decode_narrow(benchmark, request, impl, types, fmt):
    workload = request.getfixturevalue(f"narrow_{fmt}")
    module = IMPLS[impl]
    benchmark.group = f"decode narrow 200k rows ({fmt})"
    benchmark.extra_info.update(rows=workload.rows, bytes=len(workload.body), workload=f"narrow-{fmt}",
                                implementation=impl, types=types)
    rounds = 5 if impl == "c" else 1
    rows = benchmark.pedantic(_decode, args=(module, workload.body, types), rounds=rounds, iterations=1,
                              warmup_rounds=1 if impl == "c" else 0)
    assert rows == workload.rows
