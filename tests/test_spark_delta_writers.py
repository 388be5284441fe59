"""Another writer beside the pipeline on the same Delta table: a commit that lands between a batch's read and its
commit makes the batch's commit fail (no silent retry over it), and the batch is read, resolved and committed again
on the table as the other writer left it -- a key both wrote is stored once. Deterministic (the other commit made
at that moment) and with a writer thread running beside a stream of batches."""
from __future__ import annotations

import random
import threading
from collections import Counter

import deltalake
import pyarrow as pa
import pytest

from spockwire.spark import delta_target
from spockwire.spark.apply import apply_changes
from tests.delta_check import checked_table


def batch(ids, label: str, lsn: int, kind: str = "insert") -> pa.Table:
    n = len(ids)
    return pa.table({"_change_type": [kind] * n, "_commit_lsn": pa.array([lsn] * n, pa.int64()),
                     "_commit_ts": pa.nulls(n, pa.timestamp("us", tz="UTC")), "_xid": pa.array([lsn] * n, pa.int64()),
                     "_seq": pa.array(range(n), pa.int64()), "_origin": pa.nulls(n, pa.string()),
                     "_unchanged_toast": pa.nulls(n, pa.list_(pa.string())), "id": pa.array(ids, pa.int64()),
                     "label": [label] * n})


def _foreign(path: str, ids, label: str) -> None:
    """The other writer: an upsert by key through delta-rs's MERGE (its own bookkeeping: the batch's position 0)."""
    dt = deltalake.DeltaTable(path)
    rows = pa.table({"id": pa.array(ids, pa.int64()), "label": [label] * len(ids),
                     "_commit_lsn": pa.array([0] * len(ids), pa.int64()), "_seq": pa.array([0] * len(ids), pa.int64())})
    (dt.merge(rows, "t.id = s.id", source_alias="s", target_alias="t").when_matched_update_all()
     .when_not_matched_insert_all().execute())


@pytest.mark.parametrize("keys", [["id"], []], ids=["keyed", "keyless"])
def test_a_commit_between_read_and_commit_makes_the_batch_run_again(tmp_path, monkeypatch, keys):
    path = str(tmp_path / "t")
    apply_changes(batch(range(10), "first", 10), path, format="delta", keys=keys, idempotence=("job", 0))
    writes = []
    real = delta_target.DeltaTarget.write

    def write_after_another(self, *args, **kw):
        if not writes:                       # the other writer commits while this batch is being resolved
            writes.append(1)
            _foreign(path, [100], "theirs")
        return real(self, *args, **kw)

    monkeypatch.setattr(delta_target.DeltaTarget, "write", write_after_another)
    if not keys:
        import spockwire.spark.keyless as keyless

        real_keyless = keyless._typed

        def typed_after_another(*args, **kw):
            if not writes:
                writes.append(1)
                _foreign(path, [100], "theirs")
            return real_keyless(*args, **kw)

        monkeypatch.setattr(keyless, "_typed", typed_after_another)
    metrics = apply_changes(batch([100, 11], "ours", 20), path, format="delta", keys=keys, idempotence=("job", 1))
    assert metrics.commit_retries == 1
    got = checked_table(path).select(["id", "label"]).to_pylist()
    counts = Counter(r["id"] for r in got)
    if keys:        # one row per key: ours, the later position
        assert counts[100] == 1 and {r["label"] for r in got if r["id"] == 100} == {"ours"}
        assert max(counts.values()) == 1
    else:           # a bag: their row and ours
        assert sorted(r["label"] for r in got if r["id"] == 100) == ["ours", "theirs"]
    assert deltalake.DeltaTable(path).transaction_version("job") == 1


def test_a_writer_thread_beside_a_stream_of_batches_never_doubles_a_key(tmp_path):
    path = str(tmp_path / "t")
    apply_changes(batch(range(200), "start", 1), path, format="delta", keys=["id"], idempotence=("job", 0))
    stop = threading.Event()
    rng = random.Random(3)
    foreign = [0]

    def other() -> None:
        while not stop.is_set():
            try:
                _foreign(path, rng.sample(range(400), 5), "theirs")
                foreign[0] += 1
                stop.wait(0.05)       # a busy writer of its own; one committing without pause would starve any other
            except deltalake.exceptions.CommitFailedError:
                continue              # its own check found our commit first: it tries again

    thread = threading.Thread(target=other)
    thread.start()
    retries = 0
    try:
        n = 0
        while (foreign[0] < 30 or retries < 1) and n < 400:       # until the two met, several times over
            n += 1
            ids = sorted({rng.randrange(400) for _ in range(20)})
            m = apply_changes(batch(ids, f"ours{n}", 10 * (n + 1), "update_postimage"), path, format="delta",
                              keys=["id"], idempotence=("job", n))
            retries += m.commit_retries
    finally:
        stop.set()
        thread.join()
    counts = Counter(checked_table(path).column("id").to_pylist())
    assert max(counts.values()) == 1, [k for k, c in counts.items() if c > 1][:5]
    assert foreign[0] >= 30 and retries >= 1, (foreign[0], retries, n)
