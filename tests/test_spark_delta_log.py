"""The Delta log the job leaves stays short to replay: every table it creates (target, history, state) checkpoints
every delta_target.CHECKPOINT_INTERVAL commits, and a table it takes over that has no interval of its own gets
that one (the ownership check), while one a user set is kept."""
from __future__ import annotations

import os

import deltalake
import pyarrow as pa
import pytest

from spockwire.spark.apply import apply_changes
from spockwire.spark.delta_target import CHECKPOINT_INTERVAL, CHECKPOINT_PROPERTY, STATE_DIR
from spockwire.spark.ownership import OWNER_PROPERTY, Ownership
from tests.delta_check import checked_table


def _changes(lsn: int, ids: list[int], kind: str) -> pa.Table:
    n = len(ids)
    return pa.table({"_change_type": pa.array([kind] * n), "_commit_lsn": pa.array([lsn] * n, pa.int64()),
                     "_seq": pa.array(range(n), pa.int64()), "id": pa.array(ids, pa.int64()),
                     "v": pa.array([f"v{lsn}"] * n)})


def _checkpoints(path: str) -> list[int]:
    return sorted(int(f.split(".")[0]) for f in os.listdir(os.path.join(path, "_delta_log"))
                  if f.endswith(".checkpoint.parquet"))


@pytest.mark.parametrize("scd", [1, 2])
def test_tables_the_job_creates_checkpoint_every_interval(tmp_path, scd):
    path = str(tmp_path / "t")
    commits = 2 * CHECKPOINT_INTERVAL + 3
    apply_changes(_changes(1, list(range(100)), "insert"), path, keys=["id"], stored_as_scd_type=scd,
                  format="delta", engine="delta-rs", idempotence=("app", 0))
    for i in range(1, commits):
        kind = "delete" if i % 3 == 0 else "update"
        apply_changes(_changes(10 + i, [i, 50 + i], kind), path, keys=["id"], stored_as_scd_type=scd,
                      format="delta", engine="delta-rs", idempotence=("app", i))
    dt = deltalake.DeltaTable(path)
    assert dt.metadata().configuration[CHECKPOINT_PROPERTY] == str(CHECKPOINT_INTERVAL)
    assert dt.version() >= commits - 1
    # delta-rs checkpoints the version that is a multiple of the interval, less one
    assert [v for v in _checkpoints(path) if v < dt.version()][-2:] == \
        [v for v in range(dt.version() + 1) if (v + 1) % CHECKPOINT_INTERVAL == 0][-2:]
    checked_table(path)         # read from its checkpoints by delta-kernel too, and the same as deltalake reads
    state = os.path.join(path, STATE_DIR)
    assert deltalake.DeltaTable(state).metadata().configuration[CHECKPOINT_PROPERTY] == str(CHECKPOINT_INTERVAL)


def test_a_table_taken_over_gets_the_interval_unless_it_has_its_own(tmp_path):
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    plain, own = str(tmp_path / "plain"), str(tmp_path / "own")
    deltalake.write_deltalake(plain, rows)
    deltalake.write_deltalake(own, rows, configuration={CHECKPOINT_PROPERTY: "50"})
    owners = Ownership()
    assert owners.check(plain, "spockwire-q") and owners.check(own, "spockwire-q")
    conf = deltalake.DeltaTable(plain).metadata().configuration
    assert conf[OWNER_PROPERTY] == "spockwire-q" and conf[CHECKPOINT_PROPERTY] == str(CHECKPOINT_INTERVAL)
    conf = deltalake.DeltaTable(own).metadata().configuration
    assert conf[OWNER_PROPERTY] == "spockwire-q" and conf[CHECKPOINT_PROPERTY] == "50"
    assert deltalake.DeltaTable(plain).version() == 1          # owner and interval in one commit
