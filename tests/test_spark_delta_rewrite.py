"""`apply_changes` into Delta through delta-rs rewrites the data files holding a batch's keys itself
(spockwire/spark/delta_rewrite.py) instead of running delta-rs's MERGE: random histories give the tables a
plain-Python replay gives (read back through deltalake, row for row), through the rewrite and through delta-rs's own
writers alike; partial rewrites keep the other files, the new files' statistics prune later lookups, and tables
whose features a rewrite would bypass are merged by delta-rs. No Spark session (the module runs with the Spark
extras, which bring deltalake)."""
from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
from collections import Counter

import deltalake
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spockwire.spark import delta_target
from spockwire.spark.apply import apply_changes
from spockwire.spark.delta_rewrite import delta_stats_json, rewritable
from spockwire.spark.maintenance import vacuum
from spockwire.spark.resolve import DEFAULT_SEQUENCE, scd2_columns
from tests.apply_oracle import COLUMNS, T0, replay_scd2, workload
from tests.test_apply_resolve import (ORDERS, _bulk, _one_table, composite_key, expected_versions, keyed,
                                      same_key_preimages, schedule, side_by_side, table_of, to_arrow,
                                      toast_before_earlier_changes, utc)

EXAMPLES = 4
HISTORIES = 30
#: the target's key: (key kind of test_apply_resolve, key columns); `k` is one integer column, NULL for one key
KEYINGS = {"one key column with NULL": ("integers", ("k",)), "two key columns": ("integers", ("h", "id")),
           "text key with NULL": ("text with NULL", ("h", "id")),
           "composite key with NULL": ("composite with NULL", ("h", "ks", "kn"))}


def single_key(h: int, i: int | None) -> int | None:
    """The one-column key `k` of history h's id i: h * 1000 + id, NULL for history 0's id 1."""
    return None if i is None or (h, i) == (0, 1) else h * 1000 + i


def _with_single_key(batch: pa.Table) -> pa.Table:
    """The batch with its one-column key `k` (single_key)."""
    return batch.append_column("k", pa.array([single_key(h, i) for h, i in zip(batch.column("h").to_pylist(),
                                                                                  batch.column("id").to_pylist())],
                                             pa.int64()))


def _apply(batch: pa.Table, path: str, keys, scd: int, sequence, token=None, merge_only: bool = False):
    if not merge_only:
        return apply_changes(batch, path, format="delta", engine="delta-rs", keys=list(keys),
                             stored_as_scd_type=scd, sequence_by=list(sequence), idempotence=token)
    # delta-rs's own writers throughout, as with a deltalake that cannot commit our remove actions
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(delta_target, "rewritable", lambda table: False)
        mp.setattr(delta_target, "rewrite_supported", lambda: False)
        return apply_changes(batch, path, format="delta", engine="delta-rs", keys=list(keys),
                             stored_as_scd_type=scd, sequence_by=list(sequence), idempotence=token)


def _rows(path: str, scd: int) -> list[tuple]:
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    cols = ["h", *COLUMNS] + (list(scd2_columns()[0]) + list(scd2_columns()[1]) if scd == 2 else [])
    return sorted((tuple(utc(r[c]) for c in cols) for r in table.select(cols).to_pylist()),
                  key=lambda t: tuple((v is None, str(v)) for v in t))


def _key_columns(keys) -> list[str]:
    return [k for k in keys if k not in ("h", "id")]


def _key_values(keys, h: int, i) -> tuple:
    """The values of the key columns besides h and id (_key_columns) of history h's id i."""
    if "k" in keys:
        return (single_key(h, i),)
    return composite_key(i) if "ks" in keys else ()


def _read_back(path: str, scd: int, keys, sequence) -> Counter:
    """Every row of the Delta table as deltalake reads it: h, the key columns besides h and id, id, name, doc,
    then SCD 1 the position columns, SCD 2 the validity columns (a multiset: a row twice counts twice)."""
    start, end = scd2_columns(sequence)
    book = list(sequence) if scd == 1 else start + end
    cols = ["h", *_key_columns(keys), *COLUMNS, *book]
    return Counter(tuple(utc(r[c]) for c in cols) for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist())


def _replayed(histories: list, scd: int, keys, sequence) -> Counter:
    """The rows the table must hold, as _read_back gives them, from a plain-Python replay of every history: SCD 2
    its versions, SCD 1 the versions still open (with the position that started them)."""
    out: Counter = Counter()
    width = len(sequence) + 1
    for h, txs in enumerate(histories):
        for version, n in expected_versions(sum(txs, []), sequence).items():
            values, start, end = version[:len(COLUMNS)], version[len(COLUMNS):-width], version[-width:]
            key = _key_values(keys, h, values[0])
            if scd == 2:
                out[(h, *key, *values, *start, *end)] += n
            elif end[0] is None:
                out[(h, *key, *values, *start[:-1])] += n
    return out


@pytest.mark.parametrize("keying", list(KEYINGS))
@pytest.mark.parametrize("scd", [1, 2])
def test_rewrites_equal_the_replay_in_every_order(tmp_path, monkeypatch, keying, scd):
    """Random histories (TOAST chains, key changes, same-key preimages, deletes, truncates), each history batched
    its own way and applied in order, replayed, out of order (TOAST values too) or with rows twice, into Delta
    tables of small files: the table read back equals a plain-Python replay of the changes, row for row, through
    the rewrite and through delta-rs's own writers."""
    monkeypatch.setattr(delta_target, "TARGET_FILE_BYTES", 4096)
    key_kind, keys = KEYINGS[keying]
    rnd = random.Random(27 + scd)
    rewrites = partial = disordered = 0
    for example in range(EXAMPLES):
        transactions = 12
        sequence = ("pos",) if example % 2 else DEFAULT_SEQUENCE
        histories = [workload(rnd.getrandbits(32), transactions, toast=rnd.random() < 0.7, keys=rnd.randint(2, 8),
                              truncate_at=frozenset({7} if example in (1, 2) else ())) for _ in range(HISTORIES)]
        histories = [same_key_preimages(txs, rnd, 0.3) for txs in histories]
        _one_table(histories)
        histories = [[keyed(rows, key_kind, sequence) for rows in txs] for txs in histories]
        hows = [ORDERS[(h + example) % len(ORDERS)] for h in range(HISTORIES)]
        schedules = [schedule(txs, rnd, how, 4) for txs, how in zip(histories, hows)]
        disordered += sum(map(toast_before_earlier_changes, schedules))
        schema = table_of(key_kind, sequence)[0]
        rewritten, merged = str(tmp_path / f"rw{example}"), str(tmp_path / f"mg{example}")
        for n, rows in enumerate(side_by_side(schedules)):
            batch = to_arrow(rows, schema)
            if keys == ("k",):
                batch = _with_single_key(batch)
            m = _apply(batch, rewritten, keys, scd, sequence, token=("app", n))
            _apply(batch, merged, keys, scd, sequence, token=("app", n), merge_only=True)
            if m.merge.get("rewritten"):
                rewrites += 1
                partial += m.merge["num_target_files_removed"] < m.files_in_table
        expected = _replayed(histories, scd, keys, sequence)
        assert _read_back(rewritten, scd, keys, sequence) == expected, (example, "rewritten")
        assert _read_back(merged, scd, keys, sequence) == expected, (example, "delta-rs's writers")
    # the check of the test: the rewrite ran, and also rewrote some files of a table while leaving others; some
    # histories applied unchanged TOAST values before earlier changes
    assert rewrites >= 8 and partial >= 2 and disordered >= 5, (rewrites, partial, disordered)


def test_new_files_are_sorted_with_statistics_that_prune_the_next_lookup(tmp_path, monkeypatch):
    """After a batch updating keys spread over the whole table, every file is rewritten in key order with its
    statistics (exact bounds; timestamps widened to whole milliseconds): a later one-change batch reads and
    rewrites one file; a replayed batch is skipped by its idempotence token."""
    monkeypatch.setattr(delta_target, "TARGET_FILE_BYTES", 1 << 20)
    n = 100_000
    path = str(tmp_path / "t")
    apply_changes(_bulk(n).append_column("k", pa.array(np.arange(n, dtype=np.int64) * 7 % n)), path,
                  keys=["k"], engine="delta-rs", stored_as_scd_type=2, idempotence=("app", 1))
    every_third = _bulk(n, "update_postimage", lsn=20).filter(pa.array(np.arange(n) % 3 == 0))
    every_third = every_third.append_column("k", pc.remainder(pc.multiply(every_third.column("id").cast(pa.int64()),
                                                                           7), n))
    big = apply_changes(every_third, path, keys=["k"], engine="delta-rs", stored_as_scd_type=2,
                        idempotence=("app", 2))
    assert big.merge["rewritten"] and big.merge["num_target_files_removed"] == big.files_in_table >= 3
    table = deltalake.DeltaTable(path)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    start_ts = scd2_columns()[0][-1]
    for a in actions:
        part = pa.parquet.read_table(f"{path}/{a['path']}")
        keys = part.column("k").to_numpy()
        assert (np.diff(keys) >= 0).all()                      # sorted by the key
        assert (a["min.k"], a["max.k"], a["num_records"]) == (keys.min(), keys.max(), part.num_rows)
        ts = pc.min_max(part.column(start_ts)).as_py()
        assert a[f"min.{start_ts}"] <= ts["min"] and a[f"max.{start_ts}"] >= ts["max"]
        assert ts["max"] - a[f"max.{start_ts}"] < dt.timedelta(milliseconds=1)
    assert sum(a["num_records"] for a in actions) == n + every_third.num_rows
    one = _bulk(1, "update_postimage", lsn=30, first_id=6).append_column("k", pa.array([42], pa.int64()))
    m = apply_changes(one, path, keys=["k"], engine="delta-rs", stored_as_scd_type=2, idempotence=("app", 3))
    assert m.files_read == 1 and m.merge["rewritten"] and m.merge["num_target_files_removed"] == 1
    again = apply_changes(one, path, keys=["k"], engine="delta-rs", stored_as_scd_type=2, idempotence=("app", 3))
    assert again.skipped
    versions = deltalake.DeltaTable(path).to_pyarrow_table(filters=[("k", "=", 42)])    # id 6: three versions
    assert sorted(versions.column(scd2_columns()[0][0]).to_pylist()) == [10, 20, 30]


def test_file_statistics_leave_out_what_json_cannot_bound():
    """NaN, infinities, decimals, nested and naive timestamps get no bounds (a reader then reads the file); NULLs
    count."""
    t = pa.table({"i": pa.array([3, None, 1], pa.int16()), "f": pa.array([1.5, float("nan"), 0.5]),
                  "inf": pa.array([1.0, float("inf"), None]),
                  "d": pa.array([1, 2, 3], pa.decimal128(5, 2)), "s": pa.array(["b", "a", None]),
                  "l": pa.array([[1], None, []]), "naive": pa.array([1, 2, 3], pa.timestamp("us")),
                  "ts": pa.array([1_500, 2_000_001, None], pa.timestamp("us", tz="UTC")),
                  "day": pa.array([dt.date(2024, 1, 2), dt.date(2023, 5, 6), None])})
    stats = json.loads(delta_stats_json(t))
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"i": 1, "s": "a", "ts": "1970-01-01T00:00:00.001Z", "day": "2023-05-06"}
    assert stats["maxValues"] == {"i": 3, "s": "b", "ts": "1970-01-01T00:00:02.001Z", "day": "2024-01-02"}
    assert stats["nullCount"] == {"i": 1, "f": 0, "inf": 1, "d": 0, "s": 1, "naive": 0, "ts": 1, "day": 1}


def test_tables_with_features_a_rewrite_would_bypass_are_merged_by_delta_rs(tmp_path):
    """Partitioned tables, change data feed, constraints, append-only: not rewritable; their batches go through
    delta-rs's MERGE, which keeps those features (the change data feed records the update)."""
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "p": pa.array(["a", "b"])})
    plain, parted = str(tmp_path / "plain"), str(tmp_path / "parted")
    deltalake.write_deltalake(plain, data)
    deltalake.write_deltalake(parted, data, partition_by=["p"])
    assert rewritable(deltalake.DeltaTable(plain)) and not rewritable(deltalake.DeltaTable(parted))
    for name, change in [("cdf", lambda t: t.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})),
                         ("append", lambda t: t.alter.set_table_properties({"delta.appendOnly": "true"})),
                         ("check", lambda t: t.alter.add_constraint({"positive": "id > 0"}))]:
        path = str(tmp_path / name)
        deltalake.write_deltalake(path, data)
        change(deltalake.DeltaTable(path))
        assert not rewritable(deltalake.DeltaTable(path)), name
    # a change data feed table through apply_changes: merged, and the feed holds the update
    path = str(tmp_path / "feed")
    apply_changes(_bulk(10).append_column("k", pa.array(np.arange(10, dtype=np.int64))), path, keys=["k"],
                  engine="delta-rs")
    deltalake.DeltaTable(path).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    upd = _bulk(1, "update_postimage", lsn=20, first_id=3).append_column("k", pa.array([3], pa.int64()))
    m = apply_changes(upd, path, keys=["k"], engine="delta-rs")
    assert "rewritten" not in m.merge and m.commits == 1
    feed = pa.table(deltalake.DeltaTable(path).load_cdf(starting_version=2).read_all())
    assert sorted(feed.column("_change_type").to_pylist()) == ["update_postimage", "update_preimage"]
    assert deltalake.DeltaTable(path).to_pyarrow_table(filters=[("k", "=", 3)]).column("_commit_lsn").to_pylist() \
        == [20]


def _data_files(table: deltalake.DeltaTable) -> set[str]:
    """The data files of the table's version, as its log names them."""
    return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def test_a_replayed_rewrite_after_a_crash_before_its_commit_leaves_no_trace(tmp_path):
    """Files written by a rewrite that died before its commit are not part of the table: the batch applied again
    gives the same table, and VACUUM removes the orphans once older than its retention."""
    path = str(tmp_path / "t")
    apply_changes(_bulk(1000).append_column("k", pa.array(np.arange(1000, dtype=np.int64))), path, keys=["k"],
                  engine="delta-rs", idempotence=("app", 1))
    upd = _bulk(500, "update_postimage", lsn=20).append_column("k", pa.array(np.arange(500, dtype=np.int64)))
    version = deltalake.DeltaTable(path).version()
    offered = []
    with pytest.MonkeyPatch.context() as mp:
        def die(table, actions, *args, **kwargs):
            offered.extend(a.path for a in actions if hasattr(a, "stats"))     # the add actions
            raise OSError("killed before the commit")
        mp.setattr(deltalake.DeltaTable, "create_write_transaction", die)
        with pytest.raises(OSError):
            apply_changes(upd, path, keys=["k"], engine="delta-rs", idempotence=("app", 2))
    # the rewrite wrote its files and died at the commit: the files are there, the table knows none of them
    assert offered and all(os.path.exists(os.path.join(path, f)) for f in offered)
    table = deltalake.DeltaTable(path)
    assert table.version() == version and not set(offered) & _data_files(table)
    assert table.to_pyarrow_table().column("_commit_lsn").to_pylist() == [10] * 1000
    m = apply_changes(upd, path, keys=["k"], engine="delta-rs", idempotence=("app", 2))
    assert m.merge["rewritten"]
    lsn = deltalake.DeltaTable(path).to_pyarrow_table().sort_by("k").column("_commit_lsn").to_pylist()
    assert lsn == [20] * 500 + [10] * 500
    assert not set(offered) & _data_files(deltalake.DeltaTable(path))
    two_hours_ago = time.time() - 7200
    for f in offered:
        os.utime(os.path.join(path, f), (two_hours_ago, two_hours_ago))
    vacuum(path, 1)
    assert not any(os.path.exists(os.path.join(path, f)) for f in offered)
    assert deltalake.DeltaTable(path).to_pyarrow_table().sort_by("k").column("_commit_lsn").to_pylist() == lsn


def test_new_keys_are_appended_as_sorted_files_and_odd_types_by_delta_rs(tmp_path):
    """A batch of new keys (a snapshot) creates the table as sorted files with statistics in one commit; a naive
    timestamp gets Delta's timestampNtz feature; types Delta stores otherwise (unsigned integers) go through
    delta-rs's own writer, which converts them."""
    n = 5000
    ids = np.arange(n, dtype=np.int64)[::-1].copy()
    batch = _bulk(n).append_column("k", pa.array(ids)).append_column(
        "naive", pa.array(np.arange(n), pa.timestamp("us")))
    path = str(tmp_path / "t")
    m = apply_changes(batch, path, keys=["k"], engine="delta-rs", idempotence=("app", 1))
    table = deltalake.DeltaTable(path)
    assert m.appended == n and m.commits == 1 and table.version() == 0
    assert table.transaction_version("app") == 1
    assert "timestampNtz" in (table.protocol().writer_features or [])
    got = table.to_pyarrow_table()
    assert got.column("k").to_pylist() == sorted(ids.tolist())
    assert got.column("naive").type == pa.timestamp("us") and got.num_rows == n
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert [(s["min.k"], s["max.k"]) for s in stats] == [(0, n - 1)]
    # the timestampNtz feature is one a rewrite keeps: the next batch rewrites the file
    upd = batch.slice(0, 10).set_column(0, "_change_type", pa.array(["update_postimage"] * 10)).set_column(
        1, "_commit_lsn", pa.array([20] * 10, pa.int64()))
    m = apply_changes(upd, path, keys=["k"], engine="delta-rs", idempotence=("app", 2))
    assert m.merge.get("rewritten") and deltalake.DeltaTable(path).to_pyarrow_table().num_rows == n
    odd = str(tmp_path / "odd")
    unsigned = _bulk(10).append_column("k", pa.array(np.arange(10, dtype=np.uint16)))
    apply_changes(unsigned, odd, keys=["k"], engine="delta-rs")
    assert deltalake.DeltaTable(odd).to_pyarrow_table().sort_by("k").column("k").to_pylist() == list(range(10))


def test_a_read_ahead_gives_the_same_table_and_is_used_only_while_current(tmp_path, monkeypatch):
    """Rows read ahead (spark/read_ahead.py) serve a large batch touching every file, with the same table as a batch
    without them; a read-ahead of a table that changed since, or whose batch needs some files only, goes unused and
    the batch reads the files itself."""
    from spockwire.spark.read_ahead import ReadAhead

    monkeypatch.setattr(delta_target, "TARGET_FILE_BYTES", 256 << 10)
    n = 60_000
    paths = [str(tmp_path / name) for name in ("ahead", "plain")]
    first = _bulk(n).append_column("k", pa.array(np.arange(n, dtype=np.int64)))
    for path in paths:
        apply_changes(first, path, keys=["k"], engine="delta-rs")
    assert len(deltalake.DeltaTable(paths[0]).file_uris()) >= 3
    every_other = _bulk(n, "update_postimage", lsn=20).filter(pa.array(np.arange(n) % 2 == 0))
    every_other = every_other.append_column("k", every_other.column("id").cast(pa.int64()))
    ahead = ReadAhead(paths[0])
    m = apply_changes(every_other, paths[0], keys=["k"], engine="delta-rs", read_ahead=ahead)
    apply_changes(every_other, paths[1], keys=["k"], engine="delta-rs")
    assert ahead.used and m.merge["rewritten"]
    assert _rows(paths[0], 1) == _rows(paths[1], 1)
    # the table changes after the read-ahead started: its rows are stale and go unused
    stale = ReadAhead(paths[0])
    stale._thread.join()                  # read before the change below
    later = _bulk(n, "update_postimage", lsn=30).filter(pa.array(np.arange(n) % 2 == 1))
    later = later.append_column("k", later.column("id").cast(pa.int64()))
    apply_changes(later.slice(0, 1), paths[0], keys=["k"], engine="delta-rs")
    apply_changes(later.slice(0, 1), paths[1], keys=["k"], engine="delta-rs")
    apply_changes(later, paths[0], keys=["k"], engine="delta-rs", read_ahead=stale)
    apply_changes(later, paths[1], keys=["k"], engine="delta-rs")
    assert stale.used is False
    assert _rows(paths[0], 1) == _rows(paths[1], 1)
    # a batch whose keys lie in the first files only: the candidate files are not the files read ahead
    low = _bulk(5000, "update_postimage", lsn=40).append_column("k", pa.array(np.arange(5000, dtype=np.int64)))
    some = ReadAhead(paths[0])
    m = apply_changes(low, paths[0], keys=["k"], engine="delta-rs", read_ahead=some)
    apply_changes(low, paths[1], keys=["k"], engine="delta-rs")
    assert some.used is False and m.files_read < m.files_in_table
    assert _rows(paths[0], 1) == _rows(paths[1], 1)


def test_batch_wal_bytes_reads_the_span_from_the_checkpoint_offsets(tmp_path):
    """A streaming batch's WAL span is its end offset less the previous one; a snapshot batch, the first batch and
    a missing or unreadable offset file give None."""
    from spockwire.spark.read_ahead import ReadAheadPolicy, batch_wal_bytes

    offsets = tmp_path / "offsets"
    offsets.mkdir()
    head = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
    (offsets / "0").write_text(head + '{"lsn": "0/0", "snapshot": "", "chunks": []}')         # not taken yet
    (offsets / "1").write_text(head + '{"lsn": "0/800000", "snapshot": "00000003-1", "chunks": []}')
    (offsets / "2").write_text(head + '{"lsn": "0/1000000"}')
    (offsets / "3").write_text(head + '{"lsn": "1/2000000"}')
    (offsets / "4").write_text(head + "{not json")
    assert batch_wal_bytes(str(tmp_path), 3) == (1 << 32) + 0x1000000
    assert batch_wal_bytes(str(tmp_path), 2) == 0x800000      # the first after the snapshot: from its slot's LSN
    assert batch_wal_bytes(str(tmp_path), 1) is None          # the snapshot batch itself
    assert batch_wal_bytes(str(tmp_path), 0) is None
    assert batch_wal_bytes(str(tmp_path), 4) is None
    assert batch_wal_bytes(str(tmp_path), 9) is None
    assert batch_wal_bytes("s3://bucket/ck", 3) is None
    policy = ReadAheadPolicy(str(tmp_path), wal_bytes=1 << 30)
    target = str(tmp_path / "no-table")
    assert policy.start(2, [target]) == {}     # 8 MiB: below the policy's 1 GiB
    started = policy.start(3, [target])
    assert list(started) == [target]
    started[target].rows_for(None, [])     # no table there: nothing read, so unused
    policy.finished(started)
    assert policy.start(3, [target]) == {}     # a miss: the next large batches read as usual


def _keyed_bulk(n: int, kind: str = "insert", lsn: int = 10, keep: np.ndarray | None = None) -> pa.Table:
    batch = _bulk(n, kind, lsn=lsn)
    if keep is not None:
        batch = batch.filter(pa.array(keep))
    return batch.append_column("k", batch.column("id").cast(pa.int64()))


def _held_paths(path: str) -> set[str]:
    return {os.path.abspath(os.path.join(path, f)) for f in _data_files(deltalake.DeltaTable(path))}


def test_files_held_in_memory_serve_the_next_batch_and_leave_with_their_files(tmp_path, monkeypatch):
    """The files a batch writes stay in memory (spark/file_rows.py): the next batch touching them reads none from
    disk and writes the table a batch with nothing held writes; a file the rewrite removed is no longer held, and
    nothing beyond the limit is."""
    from spockwire.spark import file_rows as held_rows

    monkeypatch.setattr(delta_target, "TARGET_FILE_BYTES", 256 << 10)
    monkeypatch.setattr(held_rows, "_FILE_ROWS", None)
    n = 60_000
    held, plain = str(tmp_path / "held"), str(tmp_path / "plain")
    monkeypatch.setenv("SPOCKWIRE_FILE_ROWS_MB", "0")
    apply_changes(_keyed_bulk(n), plain, keys=["k"], engine="delta-rs")
    monkeypatch.setenv("SPOCKWIRE_FILE_ROWS_MB", "64")
    apply_changes(_keyed_bulk(n), held, keys=["k"], engine="delta-rs")
    cache = held_rows.file_rows()
    files = _held_paths(held)
    assert len(files) >= 3 and all(cache.get(f) is not None for f in files)
    for lsn, keep in ((20, np.arange(n) % 2 == 0), (30, np.arange(n) % 3 == 0)):
        batch = _keyed_bulk(n, "update_postimage", lsn, keep)
        misses = cache.misses
        m = apply_changes(batch, held, keys=["k"], engine="delta-rs")
        assert m.merge["rewritten"] and cache.misses == misses      # every file it read was held
        monkeypatch.setenv("SPOCKWIRE_FILE_ROWS_MB", "0")
        apply_changes(batch, plain, keys=["k"], engine="delta-rs")
        monkeypatch.setenv("SPOCKWIRE_FILE_ROWS_MB", "64")
        assert _rows(held, 1) == _rows(plain, 1)
        now = _held_paths(held)
        assert all(cache.get(f) is None for f in files - now) and all(cache.get(f) is not None for f in now)
        files = now
    order = sorted(files)
    small = held_rows.FileRows(limit=max(cache.get(f).nbytes for f in order) * 2)
    for f in order:
        small.put(f, cache.get(f))
    assert small.bytes <= small.limit and small.get(order[-1]) is not None     # the least recently used go first
    assert small.get(order[0]) is None


def test_a_table_kept_open_sees_other_writers_and_a_table_made_again_at_its_path(tmp_path):
    """A batch's table is kept open for the next (file_rows.open_table): the next batch still sees what another
    writer committed in between, and a table deleted and made again at the same path is the new table."""
    import shutil

    from spockwire.spark import file_rows

    path = str(tmp_path / "t")
    apply_changes(_keyed_bulk(1000), path, keys=["k"], engine="delta-rs")
    apply_changes(_keyed_bulk(1, "update_postimage", lsn=40), path, keys=["k"], engine="delta-rs")
    assert path in file_rows._TABLES                 # kept open (a table created by the batch is opened next time)
    # another writer adds key 5000 (its rows in the table's own columns)
    row = deltalake.DeltaTable(path).to_pyarrow_table().slice(0, 1)
    row = row.set_column(row.schema.get_field_index("k"), "k", pa.array([5000], pa.int64()))
    deltalake.write_deltalake(path, row, mode="append")
    update = _keyed_bulk(1, "update_postimage", lsn=50)
    update = update.set_column(update.schema.get_field_index("k"), "k", pa.array([5000], pa.int64()))
    m = apply_changes(update, path, keys=["k"], engine="delta-rs")
    assert m.commit_retries == 0                     # read at the version the other writer left, not before it
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    mine = table.filter(pc.equal(table.column("k"), 5000))
    assert table.num_rows == 1001 and mine.column("_commit_lsn").to_pylist() == [50]
    assert path in file_rows._TABLES
    shutil.rmtree(path)
    apply_changes(_keyed_bulk(10, lsn=70), path, keys=["k"], engine="delta-rs")
    apply_changes(_keyed_bulk(10, "update_postimage", lsn=80), path, keys=["k"], engine="delta-rs")
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    assert table.num_rows == 10 and set(table.column("_commit_lsn").to_pylist()) == {80}


def test_the_apply_warm_up_leaves_nothing_for_the_first_resolution_to_import():
    """The job's warm-up of its driver (warmup.start_apply_warm_up, started beside the JVM's start) imports what
    the first apply would: afterwards, in a fresh interpreter, resolving a batch loads no module."""
    import subprocess
    import sys

    code = """
import sys
from spockwire.spark.warmup import start_apply_warm_up
warm = start_apply_warm_up()
warm.join(60)
assert not warm.is_alive()
import pyarrow as pa
from spockwire.spark.resolve import DEFAULT_SEQUENCE, Stored, make_plan, resolve
from tests.test_apply_resolve import SCHEMA, TABLE, _bulk
before = set(sys.modules)
batch = _bulk(50, "update_postimage", lsn=30)
plan = make_plan(SCHEMA.names, ["id"], DEFAULT_SEQUENCE, 1, TABLE)
stored = _bulk(100).select(["id", "h", "name", "doc", "_commit_lsn", "_seq"])
res = resolve(batch, plan, Stored(rows=stored), TABLE)
assert res.rows.num_rows == 50
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
