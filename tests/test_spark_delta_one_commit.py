"""One commit per table per micro-batch: a batch holding a truncate, its rows and its idempotence token land in one
Delta commit. A reader polling the table while truncate-and-refill batches are applied only ever sees a whole
generation (never the table emptied, never two generations mixed), SCD 1 and 2; a writer killed with SIGKILL at
random moments leaves the table at a whole generation, and the batch it was applying lands at the next run."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spockwire.spark.apply import apply_changes
from tests.delta_check import checked_table

ROOT = Path(__file__).resolve().parents[1]
ROWS = 400


def generation(g: int) -> pa.Table:
    """Batch g: a truncate (g > 0) then ROWS inserts labelled g, at commit LSN 1000 * (g + 1)."""
    lsn = 1000 * (g + 1)
    kinds = (["truncate"] if g else []) + ["insert"] * ROWS
    n = len(kinds)
    ids = ([None] if g else []) + list(range(ROWS))
    return pa.table({"_change_type": kinds, "_commit_lsn": pa.array([lsn] * n, pa.int64()),
                     "_commit_ts": pa.array([1_700_000_000_000_000 + g] * n, pa.timestamp("us", tz="UTC")),
                     "_xid": pa.array([g] * n, pa.int64()), "_seq": pa.array(range(n), pa.int64()),
                     "_origin": pa.nulls(n, pa.string()), "_unchanged_toast": pa.nulls(n, pa.list_(pa.string())),
                     "id": pa.array(ids, pa.int32()), "label": pa.array([None if i is None else f"g{g}" for i in ids])})


def current(path: str, scd: int, independent: bool = True) -> pa.Table:
    """The table's current rows (`independent`: read by DuckDB too, and equal; the polling reader reads with
    deltalake alone, to poll often)."""
    cols = ["id", "label"] + (["_end_commit_lsn"] if scd == 2 else [])
    t = checked_table(path).select(cols) if independent else \
        deltalake.DeltaTable(path).to_pyarrow_table(columns=cols)
    return t.filter(pc.is_null(t.column("_end_commit_lsn"))) if scd == 2 else t


def whole_generation(t: pa.Table) -> str | None:
    """The generation a table state holds, or None when it is not one whole generation."""
    labels = set(t.column("label").to_pylist())
    if t.num_rows != ROWS or len(labels) != 1 or sorted(t.column("id").to_pylist()) != list(range(ROWS)):
        return None
    return labels.pop()


@pytest.mark.parametrize("scd", [1, 2])
def test_a_reader_polling_never_sees_a_truncate_before_its_rows(tmp_path, scd):
    path = str(tmp_path / "t")
    apply_changes(generation(0), path, format="delta", keys=["id"], stored_as_scd_type=scd, idempotence=("app", 0))
    stop = threading.Event()
    seen: list = []

    def poll() -> None:
        while not stop.is_set():
            t = current(path, scd, independent=False)
            seen.append(whole_generation(t) or (t.num_rows, sorted(set(t.column("label").to_pylist()), key=str)))

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for g in range(1, 9):
            before = deltalake.DeltaTable(path).version()
            metrics = apply_changes(generation(g), path, format="delta", keys=["id"], stored_as_scd_type=scd,
                                    idempotence=("app", g))
            assert metrics.commits == 1 and deltalake.DeltaTable(path).version() == before + 1
            assert deltalake.DeltaTable(path).transaction_version("app") == g
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 20 and all(isinstance(s, str) for s in seen), [s for s in seen if not isinstance(s, str)][:5]
    assert whole_generation(current(path, scd)) == "g8"
    if scd == 2:          # every generation kept, each closed where the next truncate came
        assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == 9 * ROWS


_WRITER = """
import sys
sys.path.insert(0, {root!r})
from tests.test_spark_delta_one_commit import generation
from spockwire.spark.apply import apply_changes
path, scd = sys.argv[1], int(sys.argv[2])
for g in range(1, 1000):
    apply_changes(generation(g), path, format="delta", keys=["id"], stored_as_scd_type=scd, idempotence=("app", g))
    print(g, flush=True)
"""


@pytest.mark.parametrize("scd", [1, 2])
def test_sigkill_at_random_moments_leaves_a_whole_generation(tmp_path, scd):
    path = str(tmp_path / "t")
    apply_changes(generation(0), path, format="delta", keys=["id"], stored_as_scd_type=scd, idempotence=("app", 0))
    rng = random.Random(5 + scd)
    script = _WRITER.format(root=str(ROOT))
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", script, path, str(scd)], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.stdout.readline()            # one batch applied: the next ones are under way
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        state = current(path, scd)
        label = whole_generation(state)
        assert label is not None, (state.num_rows, set(state.column("label").to_pylist()))
        version = deltalake.DeltaTable(path).transaction_version("app")
        assert label == f"g{version}"            # the rows and the token went in together
