"""Tables without a key land in Delta as bags of rows (spockwire/spark/keyless.py): `apply_changes(keys=[])` on
Arrow change tables against a plain-Python replay of the same changes (random histories of equal rows, NULLs, NaN,
nested values, unchanged TOAST values, truncates, replayed batches; SCD 1 and 2), the edge cases one by one, and
the pipeline job on a live server: an insert-only table written by pgbench, a REPLICA IDENTITY FULL table whose
updates and deletes hit one of two equal rows, a REPLICA IDENTITY NOTHING table, each compared as a bag with its
source; an update that came without its old row is counted, reported and said once."""
from __future__ import annotations

import datetime as dt
import math
import os
import random
import subprocess
import time

import deltalake
import pyarrow as pa
import pytest

from spockwire.spark.apply import apply_changes
from spockwire.spark.resolve import scd2_columns

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
VALUES = [("a", pa.int32()), ("b", pa.string()), ("f", pa.float64()), ("tags", pa.list_(pa.int32())),
          ("doc", pa.string())]
SCHEMA = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                    ("_origin", pa.string()), ("_unchanged_toast", pa.list_(pa.string())), *VALUES])
NAMES = [n for n, _ in VALUES]
START, END = scd2_columns()


def changes(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in SCHEMA} for r in rows], schema=SCHEMA)


def _norm(v):
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return tuple(v) if isinstance(v, list) else v


def bag(rows) -> list[tuple]:
    """Rows (dicts or tuples of NAMES) as a sorted list of comparable tuples: a bag."""
    out = [tuple(_norm(r[c]) for c in NAMES) if isinstance(r, dict) else tuple(_norm(v) for v in r) for r in rows]
    return sorted(out, key=repr)


def stored(path: str) -> list[dict]:
    return deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()


def apply(rows: list[dict], path: str, scd: int = 1, token=None):
    return apply_changes(changes(rows), path, format="delta", engine="delta-rs", keys=[],
                         stored_as_scd_type=scd, idempotence=token)


# ---------------------------------------------------------------------------------------------------------------
# the plain-Python replay

class Replay:
    """A bag of rows after changes applied in order: an old row removes the equal row written last; `unmatched`
    counts old rows equal to none, `unapplied` updates without their old row. `states`: the bag after each batch."""

    def __init__(self) -> None:
        self.rows: list[tuple[tuple, dict]] = []       # (position, row)
        self.unmatched = self.unapplied = 0

    def _remove(self, old: dict) -> None:
        want = bag([old])[0]
        for i in range(len(self.rows) - 1, -1, -1):
            if bag([self.rows[i][1]])[0] == want:
                del self.rows[i]
                return
        self.unmatched += 1

    def play(self, batch: list[dict]) -> None:
        ordered = sorted(batch, key=lambda r: (r["_commit_lsn"], r["_seq"]))
        pre = None
        for r in ordered:
            kind = r["_change_type"]
            pos = (r["_commit_lsn"], r["_seq"])
            if kind == "truncate":
                self.rows.clear()
            elif kind == "insert":
                self.rows.append((pos, {c: r[c] for c in NAMES}))
            elif kind == "delete":
                self._remove(r)
            elif kind == "update_preimage":
                pre = r
                continue
            elif pre is None:
                self.unapplied += 1
            else:
                self._remove(pre)
                toast = r.get("_unchanged_toast") or []
                self.rows.append((pos, {c: pre[c] if c in toast else r[c] for c in NAMES}))
            pre = None

    def bag(self) -> list[tuple]:
        return bag(r for _, r in self.rows)


def _row(rng: random.Random) -> dict:
    return {"a": rng.choice([None, 1, 2]), "b": rng.choice([None, "x", "y"]), "f": rng.choice([None, 0.5, math.nan]),
            "tags": rng.choice([None, [1], [1, 2]]), "doc": rng.choice(["d", "long " * 400])}


def workload(seed: int, transactions: int) -> list[list[dict]]:
    """Transactions of inserts (equal rows often), updates (sometimes of an unchanged TOASTed `doc`), deletes (of
    a row the table holds, now and then of one it does not) and truncates, tracked on a replay."""
    rng = random.Random(seed)
    replay = Replay()
    txs = []
    for t in range(transactions):
        lsn = 100 + t * 10
        seq = 0
        tx: list[dict] = []

        def change(kind: str, values: dict, **extra) -> dict:
            nonlocal seq
            r = {"_change_type": kind, "_commit_lsn": lsn, "_seq": seq, "_commit_ts": T0 + dt.timedelta(seconds=t),
                 "_xid": t, **values, **extra}
            seq += 1
            tx.append(r)
            return r

        if t and rng.random() < 0.06:
            change("truncate", {})
        else:
            for _ in range(rng.randint(1, 5)):
                current = [row for _, row in replay.rows]
                roll = rng.random()
                if roll < 0.4 or not current:
                    change("insert", dict(rng.choice(current)) if current and rng.random() < 0.4 else _row(rng))
                elif roll < 0.7:
                    old = dict(rng.choice(current))
                    new = {**_row(rng), "doc": None}
                    change("update_preimage", old)
                    if rng.random() < 0.5:
                        change("update_postimage", new, _unchanged_toast=["doc"])
                    else:
                        change("update_postimage", {**new, "doc": rng.choice(["d", "e"])})
                elif roll < 0.95:
                    change("delete", dict(rng.choice(current)))
                else:
                    change("delete", {**_row(rng), "b": "never"})
                replay.play(tx[-2:] if tx[-1]["_change_type"] == "update_postimage" else tx[-1:])
        if tx[0]["_change_type"] == "truncate":
            replay.play(tx)
        txs.append(tx)
    return txs


def _as_of(rows: list[dict], pos: tuple) -> list[tuple]:
    """An SCD 2 table's rows valid at `pos` (a (commit LSN, seq) position)."""
    def at(r, cols):
        return (r[cols[0]], r[cols[1]])
    return bag(r for r in rows if at(r, START) <= pos and (r[END[0]] is None or at(r, END) > pos))


@pytest.mark.parametrize("scd", [1, 2])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_equal_the_replay(tmp_path, seed, scd):
    """Each batch applied with its token, every third one twice (a replayed micro-batch: skipped); after each
    batch the table (SCD 1), or its rows valid at the batch's last position (SCD 2), equal the replay's bag, and
    the counts of what could not be applied are the replay's."""
    txs = workload(seed, 60)
    path = str(tmp_path / "t")
    replay = Replay()
    rng = random.Random(seed)
    unmatched = 0
    ends = []
    i = 0
    batch_id = 0
    while i < len(txs):
        n = rng.randint(1, 8)
        batch = [r for tx in txs[i:i + n] for r in tx]
        i += n
        batch_id += 1
        m = apply(batch, path, scd, ("app", batch_id))
        unmatched += m.unmatched
        replay.play(batch)
        if batch_id % 3 == 0:
            version = deltalake.DeltaTable(path).version()
            again = apply(batch, path, scd, ("app", batch_id))
            assert again.skipped and deltalake.DeltaTable(path).version() == version
        rows = stored(path)
        last = max((r["_commit_lsn"], r["_seq"]) for r in batch)
        ends.append((last, replay.bag()))
        if scd == 1:
            assert bag(rows) == replay.bag(), batch_id
            assert len({(r["_commit_lsn"], r["_seq"]) for r in rows}) == len(rows)    # one change wrote each
        else:
            assert _as_of(rows, last) == replay.bag(), batch_id
            assert bag(r for r in rows if r[END[0]] is None) == replay.bag()
    assert unmatched == replay.unmatched > 0
    if scd == 2:
        rows = stored(path)
        assert all(_as_of(rows, pos) == state for pos, state in ends)      # the whole history, at every batch


def _ins(lsn, seq, **values):
    return {"_change_type": "insert", "_commit_lsn": lsn, "_seq": seq, "_commit_ts": T0, **values}


def _chg(kind, lsn, seq, **values):
    return {"_change_type": kind, "_commit_lsn": lsn, "_seq": seq, "_commit_ts": T0, **values}


def test_equal_rows_are_rows_of_their_own(tmp_path):
    path = str(tmp_path / "t")
    m = apply([_ins(10, 0, a=1, b="x"), _ins(10, 1, a=1, b="x"), _ins(11, 0, a=None, b=None),
               _ins(11, 1, a=None, b=None)], path)
    assert m.appended == 4 and m.commits == 1
    assert bag(stored(path)) == bag([{**dict.fromkeys(NAMES), "a": 1, "b": "x"}] * 2 +
                                    [dict.fromkeys(NAMES)] * 2)
    # a delete removes one of two equal rows (NULL matches NULL), an update the other and adds its new row
    m = apply([_chg("delete", 20, 0, a=None, b=None), _chg("update_preimage", 21, 0, a=1, b="x"),
               _chg("update_postimage", 21, 1, a=1, b="z")], path)
    assert (m.unmatched, m.unapplied, m.commits) == (0, 0, 1)
    assert bag(stored(path)) == bag([{**dict.fromkeys(NAMES), "a": 1, "b": "x"}, {**dict.fromkeys(NAMES), "a": 1,
                                     "b": "z"}, dict.fromkeys(NAMES)])


def test_an_insert_and_a_delete_of_the_same_row_in_one_batch(tmp_path):
    """The delete takes the row the batch inserted (the equal row written last), not the equal stored row: the
    stored file is not rewritten, and the row that stays is the stored one."""
    path = str(tmp_path / "t")
    apply([_ins(10, 0, a=1, b="x")], path)
    files = deltalake.DeltaTable(path).file_uris()
    m = apply([_ins(20, 0, a=1, b="x"), _chg("delete", 21, 0, a=1, b="x")], path)
    assert m.rows_written == 0 and m.commits == 0
    assert [(r["a"], r["_commit_lsn"]) for r in stored(path)] == [(1, 10)]
    assert deltalake.DeltaTable(path).file_uris() == files


def test_an_unchanged_toasted_value_comes_from_the_old_row(tmp_path):
    path = str(tmp_path / "t")
    big = "x" * 10_000
    apply([_ins(10, 0, a=1, doc=big), _ins(10, 1, a=1, doc=big)], path)
    apply([_chg("update_preimage", 20, 0, a=1, doc=big),
           _chg("update_postimage", 20, 1, a=2, doc=None, _unchanged_toast=["doc"])], path)
    assert sorted((r["a"], r["doc"] == big) for r in stored(path)) == [(1, True), (2, True)]
    # the new row, with its value from the old one, is what a later old row names
    m = apply([_chg("delete", 30, 0, a=2, doc=big)], path)
    assert m.unmatched == 0 and [r["a"] for r in stored(path)] == [1]


def test_nan_nested_values_and_nulls_match(tmp_path):
    path = str(tmp_path / "t")
    row = {"a": None, "b": "x", "f": math.nan, "tags": [1, None, 2], "doc": None}
    apply([_ins(10, 0, **row), _ins(10, 1, **{**row, "tags": [1, None]}), _ins(10, 2, **{**row, "f": 0.5})], path)
    m = apply([_chg("delete", 20, 0, **row)], path)
    assert m.unmatched == 0
    assert bag(stored(path)) == bag([{**row, "tags": [1, None]}, {**row, "f": 0.5}])


def test_a_truncate_in_the_batch(tmp_path):
    """Rows before the truncate go (stored or in the batch), rows after it stay; an old row after it can only
    name a row inserted after it."""
    path = str(tmp_path / "t")
    apply([_ins(10, 0, a=1), _ins(10, 1, a=2)], path)
    m = apply([_ins(20, 0, a=3), _chg("truncate", 21, 0), _ins(22, 0, a=4), _ins(22, 1, a=4),
               _chg("delete", 23, 0, a=4), _chg("delete", 23, 1, a=1)], path)
    assert m.truncates == 1 and m.unmatched == 1
    assert bag(stored(path)) == bag([{**dict.fromkeys(NAMES), "a": 4}])


def test_history_keeps_every_row_with_its_validity(tmp_path):
    path = str(tmp_path / "h")
    apply([_ins(10, 0, a=1), _ins(10, 1, a=1)], path, scd=2)
    apply([_chg("update_preimage", 20, 0, a=1), _chg("update_postimage", 20, 1, a=2)], path, scd=2)
    apply([_chg("truncate", 30, 0), _ins(31, 0, a=5)], path, scd=2)
    got = sorted((r["a"], r[START[0]], r[START[1]], r[END[0]], r[END[1]]) for r in stored(path))
    # of the equal rows written at 10, the one written last ends at the update's new row (20/1), the other at the
    # truncate
    assert got == [(1, 10, 0, 30, 0), (1, 10, 1, 20, 1), (2, 20, 1, 30, 0), (5, 31, 0, None, None)]


def test_an_update_without_its_old_row_is_counted_and_not_applied(tmp_path):
    path = str(tmp_path / "t")
    apply([_ins(10, 0, a=1)], path, token=("app", 1))
    m = apply([_chg("update_postimage", 20, 1, a=2), _ins(21, 0, a=3)], path, token=("app", 2))
    assert (m.unapplied, m.unmatched, m.commits) == (1, 0, 1)
    assert bag(stored(path)) == bag([{**dict.fromkeys(NAMES), "a": 1}, {**dict.fromkeys(NAMES), "a": 3}])
    # a batch that only holds such an update still records its token
    m = apply([_chg("update_postimage", 30, 1, a=2)], path, token=("app", 3))
    assert m.unapplied == 1 and deltalake.DeltaTable(path).transaction_version("app") == 3


def test_a_replayed_batch_changes_nothing(tmp_path):
    path = str(tmp_path / "t")
    first = [_ins(10, 0, a=1), _ins(10, 1, a=1)]
    second = [_chg("delete", 20, 0, a=1), _ins(20, 1, a=7)]
    apply(first, path, token=("app", 1))
    apply(second, path, token=("app", 2))
    before = (deltalake.DeltaTable(path).version(), bag(stored(path)))
    for batch, n in ((first, 1), (second, 2)):
        m = apply(batch, path, token=("app", n))
        assert m.skipped and m.commits == 0
    assert (deltalake.DeltaTable(path).version(), bag(stored(path))) == before
    assert bag(stored(path)) == bag([{**dict.fromkeys(NAMES), "a": 1}, {**dict.fromkeys(NAMES), "a": 7}])


def test_a_table_without_a_key_is_delta_through_delta_rs_only(tmp_path):
    with pytest.raises(ValueError, match="without a key"):
        apply_changes(changes([_ins(1, 0, a=1)]), str(tmp_path / "p"), format="parquet", keys=[])


# ---------------------------------------------------------------------------------------------------------------
# the job on a live server

@pytest.fixture(scope="module")
def spark():
    from tests.spark_session import spark_session

    return spark_session()


@pytest.mark.pg
@pytest.mark.timeout(900)
def test_tables_without_a_key_through_the_job(spark, pg_db, tmp_path, capfd):
    """The job takes its publications' tables with no --table. `logs` (no primary key, insert-only) lands row for
    row, its equal rows included; `bag` (REPLICA IDENTITY FULL) has equal rows, of which an update or a delete
    changes one, unchanged TOASTed values, a truncate and a schema change (a re-read); `quiet` (REPLICA IDENTITY
    NOTHING) is published for inserts only, and the job says once at the start that its other changes never reach
    the pipeline. Both Delta tables, and the history tables' current rows, equal their sources as bags; the history
    of `bag` holds every version."""
    from spockwire.spark.job import JobConfig, flush_lsn, start, target_path, wait_caught_up
    from tests.test_spark_schema_changes import _delta, _source
    from tests.test_spark_source import _slot

    pg_db.execute("CREATE TABLE logs (at int, line text)")
    pg_db.execute("CREATE TABLE bag (n int, label text, doc text, f float8); ALTER TABLE bag REPLICA IDENTITY FULL")
    pg_db.execute("CREATE TABLE quiet (n int, label text); ALTER TABLE quiet REPLICA IDENTITY NOTHING")
    pg_db.execute("INSERT INTO logs SELECT g % 7, 'line ' || (g % 3) FROM generate_series(1, 300) g")
    pg_db.execute("INSERT INTO bag SELECT g % 5, 'l' || (g % 2), CASE WHEN g % 4 = 0 THEN repeat('x', 9000) END, "
                  "CASE WHEN g % 6 = 0 THEN 'NaN'::float8 END FROM generate_series(1, 60) g")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE logs, bag; "
                  "CREATE PUBLICATION inserts FOR TABLE quiet WITH (publish = 'insert')")
    cfg = JobConfig(dsn=pg_db.dsn, slot=_slot(pg_db), publication=["pub", "inserts"], tables={},
                    target=str(tmp_path / "delta"), checkpoint=str(tmp_path / "ck"), starting_position="snapshot",
                    trigger_seconds=0.5, create_slot=True, history=True)
    reports: list = []

    def equal(what: str) -> None:
        for table in ("logs", "bag"):
            names, want = _source(pg_db, table)
            have, got = _delta(target_path(cfg.target, f"public.{table}"), names)
            assert have == names and got == want, f"{what}: {table} differs from its source"
            _, current = _delta(target_path(cfg.target, f"public.{table}", history=True), names, current_only=True)
            assert current == want, f"{what}: {table}'s history differs from its source"

    query = start(spark, cfg, reports.append)
    try:
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        equal("snapshot")
        pg_db.execute("INSERT INTO logs SELECT 1, 'line 1' FROM generate_series(1, 50)")        # equal rows
        pg_db.execute("INSERT INTO quiet VALUES (1, 'a'), (1, 'a'), (2, 'b')")
        # not published; before the published changes below, so the last transaction waited for has output (WAL
        # with none for the stream moves the slot on only once a segment of it went by: slot.IDLE_ADVANCE_BYTES)
        pg_db.execute("UPDATE quiet SET label = 'never seen' WHERE n = 2")
        # one of several equal rows changed, one deleted; an update leaving a TOASTed value unchanged
        pg_db.execute("UPDATE bag SET label = 'one' WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 1)")
        pg_db.execute("DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 2)")
        pg_db.execute("UPDATE bag SET f = 1.5 WHERE doc IS NOT NULL AND n = 0")
        pg_db.execute("BEGIN; INSERT INTO bag VALUES (9, 'tx', NULL, NULL); "
                      "UPDATE bag SET n = 10 WHERE n = 9; DELETE FROM bag WHERE n = 3; COMMIT")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        equal("changes")
        pg_db.execute("TRUNCATE bag")
        pg_db.execute("INSERT INTO bag SELECT g % 3, 'again', NULL, NULL FROM generate_series(1, 20) g")
        pg_db.execute("DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 0)")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        equal("truncate")
        pg_db.execute("ALTER TABLE bag ADD COLUMN extra int NOT NULL DEFAULT 7")   # a re-read
        pg_db.execute("UPDATE bag SET extra = 8 WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 1)")
        wait_caught_up(query, flush_lsn(cfg.dsn), timeout=300)
        equal("re-read")
    finally:
        query.stop()
    err = capfd.readouterr().err
    said = [ln for ln in err.splitlines() if "public.quiet" in ln]
    assert len([ln for ln in said if "does not publish update, delete, truncate of public.quiet" in ln]) == 1, said
    assert len([ln for ln in said if "public.quiet has no key (REPLICA IDENTITY NOTHING)" in ln]) == 1, said
    assert not [ln for ln in err.splitlines() if "public.bag" in ln and "no key" in ln], err   # FULL: nothing to say
    assert "public.logs has no key (REPLICA IDENTITY DEFAULT and no primary key)" in err
    assert {t for r in reports for t in r.reread} >= {"public.bag"}
    assert not any(r.unapplied for r in reports)
    names, _ = _source(pg_db, "quiet")
    _, landed = _delta(target_path(cfg.target, "public.quiet"), names)
    assert landed == sorted([(1, "a"), (1, "a"), (2, "b")], key=repr)   # the inserts, as the warning said
    history = deltalake.DeltaTable(target_path(cfg.target, "public.bag", history=True)).to_pyarrow_table()
    ended = history.filter(pa.compute.invert(pa.compute.is_null(history.column(END[0]))))
    assert ended.num_rows >= 60 + 4          # the snapshot's rows ended by the truncate, and the changed ones
