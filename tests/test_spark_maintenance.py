"""Keeping targets fast (spockwire/spark/maintenance.py), on real Delta tables through delta-rs, no Spark: the
state's tombstones and truncates collected once no change before a position can arrive (and a batch older than
that refused, while before the collection the same late batch is resolved by the tombstones), OPTIMIZE keeping
every row and the idempotence token (a replay after it is still skipped), VACUUM's retention, and kill -9 of a
process in the middle of the job's maintenance step."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from spockwire.errors import StaleChangesError
from spockwire.spark.apply import apply_changes
from spockwire.spark.delta_target import STATE_DIR
from spockwire.spark.maintenance import Maintenance, MaintenanceOptions, collect_state, optimize, table_files, vacuum
from spockwire.spark.resolve import first_position
from tests.apply_oracle import T0
from tests.delta_check import checked_table

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                    ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), ("id", pa.int64()),
                    ("v", pa.string())])


def changes(kind: str, ids, lsn: int) -> pa.Table:
    ids = list(ids)
    n = len(ids)
    return pa.table({"_change_type": [kind] * n, "_commit_lsn": [lsn] * n, "_commit_ts": [T0] * n, "_xid": [lsn] * n,
                     "_seq": list(range(n)), "_origin": [None] * n, "_unchanged_toast": [None] * n, "id": ids,
                     "v": [None if kind in ("delete", "truncate") else f"{kind} {i} at {lsn}" for i in ids]},
                    schema=SCHEMA)


def rows(path: str, fmt: str = "delta", scd: int = 1) -> dict:
    if fmt == "delta":
        table = checked_table(path)
    else:
        import pyarrow.dataset as pads

        table = pads.dataset(path, format="parquet", exclude_invalid_files=True).to_table()
    out = table.to_pylist()
    if scd == 2:
        out = [r for r in out if r["_end_commit_lsn"] is None]
    return {r["id"]: r["v"] for r in out}


def state_rows(path: str, fmt: str = "delta") -> int:
    import pyarrow.dataset as pads

    state = os.path.join(path, STATE_DIR)
    if fmt == "delta":
        return checked_table(state).num_rows
    return pads.dataset(state, format="parquet").to_table().num_rows


@pytest.mark.parametrize("fmt,scd", [("delta", 1), ("delta", 2), ("parquet", 1)])
def test_a_late_batch_cannot_resurrect_a_key_before_or_after_the_collection(tmp_path, fmt, scd):
    path = str(tmp_path / "t")

    def apply(batch: pa.Table, token=None):
        return apply_changes(batch, path, format=fmt, engine="delta-rs", keys=["id"], stored_as_scd_type=scd,
                             **({"idempotence": ("q", token)} if token is not None and fmt == "delta" else {}))

    inserted = changes("insert", range(10), 10)
    apply(inserted, 0)
    apply(changes("delete", range(5), 20), 1)
    apply(pa.concat_tables([changes("truncate", [None], 25), changes("insert", range(5, 10), 26)]), 2)
    live = rows(path, fmt, scd)
    assert sorted(live) == [5, 6, 7, 8, 9]
    # before the collection the tombstones and the truncate decide: a late batch (the first one again, not as a
    # replay of the current micro-batch) brings nothing back
    apply(inserted)
    assert rows(path, fmt, scd) == live
    held = state_rows(path, fmt)
    assert held == 6                        # five tombstones, one truncate
    # the job's rule after micro-batch 3: nothing before its first change can arrive any more
    current = changes("update_postimage", [7], 30)
    apply(current, 3)
    assert collect_state(path, first_position(current), format=fmt) == 6
    assert state_rows(path, fmt) == 1       # the collected mark alone
    assert collect_state(path, first_position(current), format=fmt) == 0   # nothing more: no commit
    # the current micro-batch may still be replayed: accepted, and changes nothing
    apply(current, 3)
    apply(current)
    after = rows(path, fmt, scd)
    assert after == {**live, 7: "update_postimage 7 at 30"}
    # a batch from before the collected position cannot come from the stream any more: refused, nothing written
    with pytest.raises(StaleChangesError, match=r"older than the target's collected state .*_commit_lsn': 30"):
        apply(inserted)
    assert rows(path, fmt, scd) == after
    # later changes, deletes and truncates are remembered again as before
    apply(changes("delete", [8], 40), 4)
    assert state_rows(path, fmt) == 2 and 8 not in rows(path, fmt, scd)


def test_optimize_keeps_the_rows_and_the_idempotence_token_and_narrows_key_ranges(tmp_path):
    import deltalake

    path = str(tmp_path / "t")
    rng = random.Random(3)
    ids = list(range(2000))
    rng.shuffle(ids)
    token = 0
    for i in range(0, 2000, 100):             # 20 appends of keys in random order: every file spans the key range
        apply_changes(changes("insert", ids[i:i + 100], 10 + token), path, engine="delta-rs", keys=["id"],
                      idempotence=("q", token))
        token += 1
    last = changes("update_postimage", [5, 1500], 100)
    apply_changes(last, path, engine="delta-rs", keys=["id"], idempotence=("q", token))
    probe = changes("update_postimage", [1234], 200)
    assert apply_changes(probe, path, engine="delta-rs", keys=["id"]).files_read >= 15   # before: most files
    before = rows(path)
    for zorder in (False, True):
        done = optimize(path, ["id"], zorder=zorder)
        assert done["numFilesRemoved"] >= 1
        dt = deltalake.DeltaTable(path)
        assert dt.transaction_version("q") == token
        assert rows(path) == before
        # a replay of the last micro-batch after the OPTIMIZE is still skipped
        assert apply_changes(last, path, engine="delta-rs", keys=["id"], idempotence=("q", token)).skipped
    # Z-ordered by the key: one key's lookup reads one file
    assert table_files(deltalake.DeltaTable(path)).rows == 2000
    m = apply_changes(changes("update_postimage", [1234], 300), path, engine="delta-rs", keys=["id"])
    assert m.files_read == 1, m


def test_vacuum_keeps_what_readers_and_writers_may_still_need(tmp_path):
    path = str(tmp_path / "t")
    apply_changes(changes("insert", range(10), 10), path, engine="delta-rs", keys=["id"])
    with pytest.raises(ValueError, match="below the minimum"):
        vacuum(path, 0)
    with pytest.raises(ValueError, match="below"):
        MaintenanceOptions(vacuum_retention_hours=0.5)
    # files no commit references (a writer killed before its commit): kept while recent, deleted once older
    fresh, old = Path(path, "part-fresh.parquet"), Path(path, "part-old.parquet")
    fresh.write_bytes(b"x")
    old.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    apply_changes(changes("delete", [1], 20), path, engine="delta-rs", keys=["id"])   # a state table inside
    for f in Path(path, STATE_DIR).glob("*.parquet"):
        os.utime(f, (two_hours_ago, two_hours_ago))
    assert vacuum(path, 1) == 1
    assert fresh.exists() and not old.exists()
    assert state_rows(path) == 1             # the state table inside the target is not the table's to vacuum
    assert sorted(rows(path)) == [0, *range(2, 10)]


CHILD = """
import sys
import deltalake
from spockwire.spark.maintenance import Maintenance, MaintenanceOptions
lsn = int(sys.stdin.readline())        # started ahead, imports done: the step when told
print("go", flush=True)
m = Maintenance(MaintenanceOptions(small_files=1, vacuum_retention_hours=1))
print(m.after_batch(sys.argv[1], ["id"], (lsn, 0)), flush=True)
"""


def test_kill_9_during_the_maintenance_step_loses_and_resurrects_nothing(tmp_path):
    """The job's step (collect the state, compact it, Z-order the table, vacuum) in a child process killed with
    SIGKILL at random moments: the table keeps its rows and its token, the state its meaning."""
    path = str(tmp_path / "t")
    rng = random.Random(11)
    expected: dict = {}
    lsn = 10
    for token in range(12):                   # small files, deletes remembered in the state
        new = list(range(token * 50, token * 50 + 50))
        gone = rng.sample(sorted(expected), k=min(len(expected), 10))
        batch = pa.concat_tables([changes("insert", new, lsn), changes("delete", gone, lsn + 1)])
        apply_changes(batch, path, engine="delta-rs", keys=["id"], idempotence=("q", token))
        expected.update({i: f"insert {i} at {lsn}" for i in new})
        for i in gone:
            del expected[i]
        lsn += 10
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # the children start together (their imports take seconds on a busy machine) and each waits for its turn
    children = [subprocess.Popen([sys.executable, "-c", CHILD, target], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for target in [path] * 4 + [str(tmp_path / "c")]]
    # how long the step takes on this machine now: once to its end on a copy of the table, so that the kills
    # below land inside it whatever the machine's speed
    shutil.copytree(path, tmp_path / "c")
    calibration = children.pop()
    calibration.stdin.write(f"{lsn}\n")
    calibration.stdin.close()
    assert calibration.stdout.readline().strip() == "go"
    started = time.monotonic()
    calibration.stdout.read()
    step = time.monotonic() - started
    assert calibration.wait(60) == 0
    killed = 0
    for token in range(12, 15):
        # another micro-batch (more small files, more tombstones), then its maintenance step killed part way
        new = list(range(token * 50, token * 50 + 50))
        gone = rng.sample(sorted(expected), k=10)
        last = pa.concat_tables([changes("insert", new, lsn), changes("delete", gone, lsn + 1)])
        apply_changes(last, path, engine="delta-rs", keys=["id"], idempotence=("q", token))
        expected.update({i: f"insert {i} at {lsn}" for i in new})
        for i in gone:
            del expected[i]
        child = children.pop()
        child.stdin.write(f"{lsn}\n")
        child.stdin.close()
        assert child.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.05, 0.7) * step)
        child.send_signal(signal.SIGKILL)
        killed += child.wait(30) == -signal.SIGKILL
        child.stdout.close()
        assert rows(path) == expected
        import deltalake

        assert deltalake.DeltaTable(path).transaction_version("q") == token
        # the micro-batch replayed (the job's restart): skipped by its token; without the token it resolves to
        # nothing new, with or without the collection
        assert apply_changes(last, path, engine="delta-rs", keys=["id"], idempotence=("q", token)).skipped
        apply_changes(last, path, engine="delta-rs", keys=["id"])
        assert rows(path) == expected
        lsn += 10
    assert killed >= 2
    # the step again, to its end: everything before the last batch collected
    out, _ = children[0].communicate(f"{lsn - 10}\n", timeout=120)
    assert children[0].returncode == 0
    assert "'optimized'" in out and "'state_collected'" in out, out
    assert rows(path) == expected and state_rows(path) == 11
    assert table_files(__import__("deltalake").DeltaTable(path)).files == 1


def test_the_jobs_step_optimizes_by_small_files_and_every_n_batches(tmp_path):
    path = str(tmp_path / "t")
    other = str(tmp_path / "u")
    by_files = Maintenance(MaintenanceOptions(small_files=3, vacuum_retention_hours=None))
    every = Maintenance(MaintenanceOptions(optimize_every=4, small_files=0, vacuum_retention_hours=None))
    seen_files, seen_every = [], []
    for i in range(8):
        batch = changes("insert", range(i * 10, i * 10 + 10), 10 + i)
        for p in (path, other):
            apply_changes(batch, p, engine="delta-rs", keys=["id"])
        seen_files.append(by_files.after_batch(path, ["id"], first_position(batch)))
        seen_every.append(every.after_batch(other, ["id"], first_position(batch)))
    # an append per batch: a small file each
    assert [("optimized" in r) for r in seen_files] == [False, False, True, False, True, False, True, False]
    assert [r["files"] for r in seen_files] == [1, 2, 1, 2, 1, 2, 1, 2]
    assert [("optimized" in r) for r in seen_every] == [False, False, False, True] * 2
    assert [r["files"] for r in seen_every] == [1, 2, 3, 1, 2, 3, 4, 1]
    assert rows(path) == rows(other) and len(rows(path)) == 80


def test_zorder_only_where_the_key_lookup_prunes(tmp_path):
    """A key of a type the lookup does not prune on (binary: a uuid) is compacted, not Z-ordered."""
    for name, key_type in (("int", pa.int64()), ("uuid", pa.binary(16))):
        path = str(tmp_path / name)
        for lsn in (10, 20):
            batch = changes("insert", range(lsn, lsn + 5), lsn)
            batch = batch.set_column(batch.schema.get_field_index("id"), "id",
                                     batch.column("id").cast(pa.int64()) if name == "int" else
                                     pa.array([i.to_bytes(16, "big") for i in range(lsn, lsn + 5)], key_type))
            apply_changes(batch, path, engine="delta-rs", keys=["id"])
        assert (optimize(path, ["id"], zorder=True)["plannerStrategy"] == "zOrder") == (name == "int")
        assert len(rows(path)) == 10


@pytest.mark.parametrize("option,value,message", [
    ("--vacuum-retention-hours", "0", "0 is below the minimum of 1 hour"),
    ("--vacuum-retention-hours", "1.5", "not a whole number of hours"),
    ("--optimize-every", "-1", "'-1' is not a count"),
    ("--optimize-small-files", "many", "'many' is not a count"),
])
def test_the_jobs_maintenance_options_are_checked_at_start(capsys, option, value, message):
    from spockwire.spark.job import main

    with pytest.raises(SystemExit):
        main(["--dsn", "host=nowhere", "--slot", "s", "--publication", "p", "--table", "t=id", "--target", "x",
              "--checkpoint", "y", option, value])
    assert message in capsys.readouterr().err


def test_the_job_step_follows_a_table_made_again_and_commits_since_its_last_look(tmp_path):
    """Maintenance keeps each table open between micro-batches (reading only its newer commits): it sees files
    added since, and a table removed and made again (as a re-read does with the state) is opened again."""
    import shutil

    import deltalake

    path = str(tmp_path / "t")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    m = Maintenance(MaintenanceOptions(small_files=0, vacuum_retention_hours=None))
    deltalake.write_deltalake(path, rows)
    assert m.after_batch(path, ["id"], None)["files"] == 1
    deltalake.write_deltalake(path, rows, mode="append")
    deltalake.write_deltalake(path, rows, mode="append")
    assert m.after_batch(path, ["id"], None)["files"] == 3
    shutil.rmtree(path)
    deltalake.write_deltalake(path, rows)
    assert m.after_batch(path, ["id"], None)["files"] == 1
    shutil.rmtree(path)
    assert m.after_batch(path, ["id"], None)["files"] == 0
