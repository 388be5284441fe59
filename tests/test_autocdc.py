"""`spockwire.spark.autocdc_changes` (the mapping of spockwire's changes for AUTO CDC) on generated change streams,
fed to a model of AUTO CDC's documented SCD 1 / SCD 2 semantics (tests/autocdc_model.py: create_auto_cdc_flow
itself needs a MERGE-capable target, Delta's or Iceberg's jars, which cannot be had here). The result must be the
apply_changes oracle's (tests/apply_oracle.py) for histories of inserts, updates, key changes and deletes, and with
REPLICA IDENTITY FULL preimages also of unchanged TOASTed values. Without the mapping, and for what it cannot map
(unchanged TOAST under the default replica identity, truncates), the documented differences are real."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from spockwire.spark.autocdc import AutoCdcError, autocdc_batches, autocdc_changes
from tests import autocdc_model as model
from tests.apply_oracle import replay_scd1, replay_scd2, workload

KEYS, COLUMNS = ("h", "id"), ("h", "id", "name", "doc")
SCHEMA = pa.schema([("_change_type", pa.string()), ("_commit_lsn", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", "UTC")), ("_xid", pa.int64()), ("_seq", pa.int64()),
                    ("_origin", pa.string()),
                    ("_unchanged_toast", pa.list_(pa.string())), ("h", pa.int64()), ("id", pa.int64()),
                    ("name", pa.string()), ("doc", pa.string())])
HISTORIES = 120


def history(seed: int, rows: list[dict] | None = None, *, toast: bool = False, truncates: bool = False) -> list[dict]:
    """One history's rows (generated, or `rows`) with a history column `h`, part of the key, and LSNs of its own."""
    if rows is None:
        rows = [r for t in workload(seed, 30, toast=toast, truncates=truncates) for r in t]
    return [{**r, "h": seed, "_commit_lsn": r["_commit_lsn"] + seed * 10**6} for r in rows]


def full_preimages(seed: int, toast: bool = True) -> list[dict]:
    """A history as REPLICA IDENTITY FULL sends it: every update has a preimage with the old row's values (TOASTed
    ones inline); the postimage still leaves unchanged TOASTed values out."""
    state: dict = {}
    out = []
    for txn in workload(seed, 30, toast=toast, truncates=False):
        rows: list[dict] = []
        moved = None
        for r in txn:
            kind = r["_change_type"]
            if kind == "update_preimage":
                moved = state.pop(r["id"])
                rows.append({**r, **moved})
                continue
            if kind == "update_postimage":
                old = moved if moved is not None else state.pop(r["id"])
                if moved is None:
                    rows.append({**r, "_change_type": "update_preimage", "_unchanged_toast": None, **old})
                unsent = r["_unchanged_toast"] or []
                state[r["id"]] = {c: old[c] if c in unsent else r[c] for c in ("name", "doc")}
            elif kind == "insert":
                state[r["id"]] = {"name": r["name"], "doc": r["doc"]}
            elif kind == "delete":
                state.pop(r["id"])
            rows.append(dict(r))
            moved = None
        out += [{**r, "_seq": i} for i, r in enumerate(rows)]
    return out


def changes_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _mapped(rows: list[dict], **options) -> list[dict]:
    # small record batches: a preimage and its postimage often lie in two of them
    table = changes_table(rows)
    batches = iter(table.to_batches(max_chunksize=7))
    return pa.Table.from_batches(list(autocdc_batches(batches, KEYS, **options)), schema=SCHEMA).to_pylist()


def _scd1_oracle(seed: int, rows: list[dict]) -> dict:
    return {(seed, v[0]): (seed, *v) for v in replay_scd1(rows).values()}


def _scd2_oracle(seed: int, rows: list[dict]) -> set[tuple]:
    return {(seed, i, n, d, (sl, ss), None if el is None else (el, es))
            for i, n, d, sl, ss, _st, el, es, _et in replay_scd2(rows)}


def _in_random_batches(events: list[dict], rng: random.Random) -> list[list[dict]]:
    """The events as micro-batches of whole transactions, in a random order."""
    txns: dict[int, list[dict]] = {}
    for e in events:
        txns.setdefault(e["_commit_lsn"], []).append(e)
    batches = list(txns.values())
    rng.shuffle(batches)
    return batches


def test_mapped_streams_give_the_oracles_tables():
    rng = random.Random(7)
    raw_differs = 0
    for seed in range(HISTORIES):
        rows = history(seed)
        events = _mapped(rows)
        assert not any(e["_change_type"] == "update_preimage" for e in events)
        expected = _scd1_oracle(seed, rows)
        assert model.scd1(_in_random_batches(events, rng), KEYS, COLUMNS) == expected, seed
        assert model.scd2(events, KEYS, COLUMNS) == _scd2_oracle(seed, rows), seed
        # without the mapping, a key change's preimage is an upsert of the old key
        raw_differs += model.scd1([rows], KEYS, COLUMNS) != expected
    assert raw_differs > HISTORIES // 10, raw_differs


def test_replica_identity_full_fills_unchanged_toast_values_from_the_preimage():
    rng = random.Random(8)
    raw_differs = 0
    for seed in range(HISTORIES):
        rows = history(seed, full_preimages(1000 + seed))
        events = _mapped(rows, replica_identity_full=True)
        assert not any(e["_unchanged_toast"] for e in events)
        # the events are the key-only stream's: a delete for each key change's old key, one upsert per change
        sent = [r for t in workload(1000 + seed, 30, toast=True, truncates=False) for r in t]
        assert [(e["_commit_lsn"] - seed * 10**6, e["_change_type"], e["id"]) for e in events] == \
            [(r["_commit_lsn"], "delete" if r["_change_type"] == "update_preimage" else r["_change_type"], r["id"])
             for r in sent], seed
        assert model.scd1(_in_random_batches(events, rng), KEYS, COLUMNS) == _scd1_oracle(seed, rows), seed
        # every version holds the oracle's values (the oracle's positions count a same-key preimage as the change)
        assert {v[:4] for v in model.scd2(events, KEYS, COLUMNS)} == {v[:4] for v in _scd2_oracle(seed, rows)}, seed
        # without the mapping, each preimage is a version of its own
        raw_differs += len(model.scd2(rows, KEYS, COLUMNS)) > len(_scd2_oracle(seed, rows))
    assert raw_differs > HISTORIES // 2, raw_differs


def test_what_cannot_be_mapped_fails_and_differs():
    toasted = [r for s in range(40) for r in history(2000 + s, toast=True)]
    with pytest.raises(AutoCdcError, match=r"SPOCKWIRE_UNCHANGED_TOAST.* \(the change at _commit_lsn \d+, _seq \d+\)"):
        _mapped(toasted)
    truncated = [r for s in range(40) for r in history(3000 + s, truncates=True)]
    with pytest.raises(AutoCdcError, match="SPOCKWIRE_TRUNCATE"):
        _mapped(truncated)
    kept = _mapped(truncated, truncates="keep")
    assert sum(e["_change_type"] == "truncate" for e in kept) == sum(r["_change_type"] == "truncate" for r in truncated)
    # AUTO CDC on what the mapping refuses: NULLs for the unsent TOASTed values, the truncated rows left in place
    toast_differs = sum(model.scd1([history(2000 + s, toast=True)], KEYS, COLUMNS)
                        != _scd1_oracle(2000 + s, history(2000 + s, toast=True)) for s in range(40))
    dropped = _mapped(truncated, truncates="drop")
    truncate_differs = sum(model.scd1([[e for e in dropped if e["h"] == 3000 + s]], KEYS, COLUMNS)
                           != _scd1_oracle(3000 + s, history(3000 + s, truncates=True)) for s in range(40))
    assert toast_differs > 10 and truncate_differs > 5, (toast_differs, truncate_differs)
    # a preimage whose postimage is not the next row of its partition is refused, not guessed at
    rows = history(5, full_preimages(5))
    split = [r for r in rows if r["_change_type"] != "update_postimage"]
    with pytest.raises(AutoCdcError, match="SPOCKWIRE_SPLIT_UPDATE"):
        _mapped(split, replica_identity_full=True)


def test_arrow_tables_and_keys_from_the_schema():
    rows = history(11)
    table = changes_table(rows)
    marked = table.cast(pa.schema([f.with_metadata({b"spockwire.key": b"true"}) if f.name in KEYS else f
                                   for f in SCHEMA]))
    assert autocdc_changes(marked).to_pylist() == _mapped(rows)
    with pytest.raises(ValueError, match="needs the key columns"):
        autocdc_changes(table)
