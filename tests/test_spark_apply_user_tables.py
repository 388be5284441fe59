"""`apply_changes` on tables a user made and with options other than the defaults, Delta (delta-rs) and Parquet, from
Arrow changes (no Spark session):

* SCD 2 pointed at a table without the validity columns of its sequence (a plain table, a history of another
  sequence) is refused in one line before anything is read or written;
* a truncate on a plain table (no sequence columns) ends every stored row: they are all before it;
* SCD 2 with a `sequence_by` other than the default keeps distinct validity columns and the right history."""
from __future__ import annotations

import datetime as dt
import os

import deltalake
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from spockwire.errors import HistoryTableError
from spockwire.spark.apply import STATE_DIR, apply_changes, scd2_columns
from tests.delta_check import checked_table

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
TS = pa.timestamp("us", tz="UTC")
PLAIN = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]})
BY_TS = ("_commit_ts", "_seq")


def t(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def changes(rows) -> pa.Table:
    """rows: (change, commit LSN, seq, id, name[, unchanged TOAST columns[, commit time in seconds]]); the commit
    time defaults to the LSN in seconds after T0."""
    rows = [tuple(r) + (None,) * (7 - len(r)) for r in rows]
    return pa.table({
        "_change_type": pa.array([r[0] for r in rows], pa.string()),
        "_commit_lsn": pa.array([r[1] for r in rows], pa.int64()),
        "_commit_ts": pa.array([t(r[6] if r[6] is not None else r[1]) for r in rows], TS),
        "_xid": pa.array([r[1] for r in rows], pa.int64()),
        "_seq": pa.array([r[2] for r in rows], pa.int64()),
        "_origin": pa.nulls(len(rows), pa.string()),
        "_unchanged_toast": pa.array([r[5] for r in rows], pa.list_(pa.string())),
        "id": pa.array([r[3] for r in rows], pa.int32()),
        "name": pa.array([r[4] for r in rows], pa.string()),
    })


def write_plain(path: str, fmt: str, table: pa.Table = PLAIN) -> None:
    """A table as a user writes one: just its columns."""
    if fmt == "delta":
        deltalake.write_deltalake(path, table)
    else:
        os.makedirs(path)
        pq.write_table(table, os.path.join(path, "part-0.parquet"))


def read(path: str, fmt: str) -> pa.Table:
    return checked_table(path) if fmt == "delta" else pads.dataset(path, format="parquet").to_table()


def files(path: str) -> dict[str, bytes]:
    """Every file under `path` with its content."""
    out = {}
    for root, _dirs, names in os.walk(path):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                out[os.path.relpath(os.path.join(root, n), path)] = f.read()
    return out


def plain_rows(table: pa.Table) -> list[tuple]:
    return sorted((r["id"], r["name"]) for r in table.select(["id", "name"]).to_pylist())


# ---------------------------------------------------------------------------------------------------------------
# SCD 2 on a table without validity columns: refused before anything is written

BATCHES = {
    "a stored key updated": [("update_postimage", 10, 0, 1, "a2"), ("insert", 10, 1, 3, "c")],
    "new keys only": [("insert", 10, 0, 3, "c")],
    "a truncate": [("truncate", 10, 0, None, None), ("insert", 10, 1, 3, "c")],
}


def _refused(path: str, call, kind: str, missing: list[str]) -> None:
    before = files(path)
    with pytest.raises(HistoryTableError) as err:
        call()
    text = str(err.value)
    assert text.startswith(f"cannot apply SCD 2 changes to the {kind} table {path}: it lacks the validity columns "
                           f"{', '.join(missing)} of sequence_by="), text
    assert "write the history to a new path" in text and "\n" not in text, text
    assert isinstance(err.value, ValueError)
    assert files(path) == before           # nothing written: no commit, no state table, no rewritten file


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_scd2_on_a_plain_table_is_refused_before_anything_is_written(tmp_path, fmt, batch):
    path = str(tmp_path / "plain")
    write_plain(path, fmt)
    start, end = scd2_columns()
    _refused(path, lambda: apply_changes(changes(BATCHES[batch]), path, format=fmt, keys=["id"],
                                         stored_as_scd_type=2), fmt.capitalize(), start + end)
    assert plain_rows(read(path, fmt)) == [(1, "a"), (2, "b")]
    assert not os.path.exists(os.path.join(path, STATE_DIR))


def test_scd2_without_a_key_on_a_plain_delta_table_is_refused(tmp_path):
    path = str(tmp_path / "plain")
    write_plain(path, "delta")
    start, end = scd2_columns()
    _refused(path, lambda: apply_changes(changes(BATCHES["a truncate"]), path, format="delta", keys=[],
                                         stored_as_scd_type=2), "Delta", start + end)


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_scd2_on_a_history_of_another_sequence_is_refused(tmp_path, fmt):
    """A history kept with the default sequence, then changes with sequence_by=("_commit_ts", "_seq"): its versions
    are not ordered by those columns."""
    path = str(tmp_path / "history")
    apply_changes(changes([("insert", 10, 0, 1, "a")]), path, format=fmt, keys=["id"], stored_as_scd_type=2)
    _refused(path, lambda: apply_changes(changes([("update_postimage", 20, 0, 1, "a2")]), path, format=fmt,
                                         keys=["id"], stored_as_scd_type=2, sequence_by=BY_TS),
             fmt.capitalize(), ["_start__commit_ts", "_end__commit_ts"])


# ---------------------------------------------------------------------------------------------------------------
# a truncate on a table without sequence columns

TRUNCATES = {
    # batch -> the table after it (id, name)
    "the truncate alone": ([("truncate", 10, 0, None, None)], []),
    "a change before the truncate": ([("update_postimage", 5, 0, 1, "a2"), ("truncate", 10, 0, None, None),
                                      ("insert", 12, 0, 3, "c")], [(3, "c")]),
    "stored keys again after the truncate": ([("truncate", 10, 0, None, None), ("insert", 11, 0, 1, "a3"),
                                              ("insert", 11, 1, 2, "b3")], [(1, "a3"), (2, "b3")]),
}


@pytest.mark.parametrize("case", list(TRUNCATES))
@pytest.mark.parametrize("fmt,token", [("delta", None), ("delta", ("app", 1)), ("parquet", None)],
                         ids=["delta", "delta with a token", "parquet"])
def test_a_truncate_ends_every_row_of_a_table_without_positions(tmp_path, fmt, token, case):
    """SCD 1: the rows of a plain table have no position, so each is before any truncate and the truncate ends it;
    re-applying the batch, or a late change from before the truncate, brings none back."""
    path = str(tmp_path / "plain")
    write_plain(path, fmt)
    batch, after = TRUNCATES[case]
    kw = {"idempotence": token} if token else {}
    m = apply_changes(changes(batch), path, format=fmt, keys=["id"], **kw)
    assert m.truncates == 1
    table = read(path, fmt)
    assert plain_rows(table) == after
    assert {"_commit_lsn", "_seq"} <= set(table.column_names)
    apply_changes(changes(batch), path, format=fmt, keys=["id"])                    # a replay
    apply_changes(changes([("update_postimage", 7, 0, 2, "late")]), path, format=fmt, keys=["id"])
    assert plain_rows(read(path, fmt)) == after


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_a_truncate_of_a_plain_table_as_history_is_refused(tmp_path, fmt):
    """SCD 2: the rows of a plain table have no validity to close at the truncate."""
    path = str(tmp_path / "plain")
    write_plain(path, fmt)
    start, end = scd2_columns()
    _refused(path, lambda: apply_changes(changes([("truncate", 10, 0, None, None)]), path, format=fmt, keys=["id"],
                                         stored_as_scd_type=2), fmt.capitalize(), start + end)


# ---------------------------------------------------------------------------------------------------------------
# SCD 2 with another sequence_by

@pytest.mark.parametrize("sequence", [("_commit_lsn", "_seq"), ("_commit_ts", "_seq"), ("_commit_ts",),
                                      ("_seq", "seq"), ("commit_ts", "_commit_ts", "__commit_ts"), "_commit_ts"])
def test_validity_column_names_are_distinct(sequence):
    start, end = scd2_columns(sequence)
    n = 1 if isinstance(sequence, str) else len(sequence)
    names = start + end
    assert len(set(names)) == len(names) == 2 * (n + 1), names
    assert (start[-1], end[-1]) == ("_start_commit_ts", "_end_commit_ts")    # the commit time, whatever the sequence


def test_validity_column_names_of_the_default_and_of_the_commit_time():
    assert scd2_columns() == (["_start_commit_lsn", "_start_seq", "_start_commit_ts"],
                              ["_end_commit_lsn", "_end_seq", "_end_commit_ts"])
    assert scd2_columns(BY_TS) == (["_start__commit_ts", "_start_seq", "_start_commit_ts"],
                                   ["_end__commit_ts", "_end_seq", "_end_commit_ts"])


# (change, lsn, seq, id, name, toast, commit time in seconds): the LSNs run against the commit times on purpose, so
# the history follows sequence_by and not the LSN
HISTORY = [
    [("insert", 100, 0, 1, "a", None, 10), ("insert", 100, 1, 2, "b", None, 10)],
    [("update_postimage", 50, 0, 1, "a2", None, 20), ("delete", 40, 0, 2, None, None, 30)],
    [("insert", 30, 0, 3, "c", None, 40), ("truncate", 20, 0, None, None, None, 50),
     ("insert", 10, 0, 1, "a3", None, 60), ("update_postimage", 10, 1, 1, "a4", ["name"], 60)],
]


def _version(i, name, start, end):
    """(id, name, start, end): start and end as (commit time in seconds, seq), None for an open version."""
    s = (t(start[0]), start[1], t(start[0]))
    e = (t(end[0]), end[1], t(end[0])) if end else (None, None, None)
    return (i, name, *s, *e)


EXPECTED = sorted([
    _version(1, "a", (10, 0), (20, 0)),
    _version(1, "a2", (20, 0), (50, 0)),      # closed by the truncate
    _version(2, "b", (10, 1), (30, 0)),       # closed by the delete
    _version(3, "c", (40, 0), (50, 0)),       # closed by the truncate
    _version(1, "a3", (60, 0), (60, 1)),
    _version(1, "a3", (60, 1), None),         # the unchanged TOAST value from the version before
], key=repr)


def _versions(table: pa.Table) -> list[tuple]:
    start, end = scd2_columns(BY_TS)
    cols = ["id", "name", *start, *end]
    fix = (lambda v: v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v)
    return sorted((tuple(fix(r[c]) for c in cols) for r in table.select(cols).to_pylist()), key=repr)


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_scd2_history_with_the_commit_time_as_sequence(tmp_path, fmt):
    """sequence_by=("_commit_ts", "_seq"), SCD 2, batch by batch: inserts, an update, a delete, a truncate, an
    insert after it with an update carrying an unchanged TOAST value; every version's start and end. Replaying the
    batches changes nothing."""
    path = str(tmp_path / "history")
    start, end = scd2_columns(BY_TS)
    for batch in HISTORY:
        apply_changes(changes(batch), path, format=fmt, keys=["id"], stored_as_scd_type=2, sequence_by=BY_TS)
    table = read(path, fmt)
    assert table.column_names == ["id", "name", *start, *end]
    assert table.schema.field("_start__commit_ts").type == TS and table.schema.field("_end_seq").type == pa.int64()
    assert _versions(table) == EXPECTED
    for batch in HISTORY:
        apply_changes(changes(batch), path, format=fmt, keys=["id"], stored_as_scd_type=2, sequence_by=BY_TS)
    assert _versions(read(path, fmt)) == EXPECTED


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_scd2_history_with_the_commit_time_as_sequence_in_one_batch_and_out_of_order(tmp_path, fmt):
    """The same changes in one batch, and batch by batch in reverse order: the same history."""
    one, reverse = str(tmp_path / "one"), str(tmp_path / "reverse")
    apply_changes(changes(sum(HISTORY, [])), one, format=fmt, keys=["id"], stored_as_scd_type=2, sequence_by=BY_TS)
    assert _versions(read(one, fmt)) == EXPECTED
    for batch in reversed(HISTORY):
        apply_changes(changes(batch), reverse, format=fmt, keys=["id"], stored_as_scd_type=2, sequence_by=BY_TS)
    assert _versions(read(reverse, fmt)) == EXPECTED


def test_a_sequence_column_named_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sequence_by names _seq more than once"):
        apply_changes(changes(HISTORY[0]), str(tmp_path / "t"), format="delta", keys=["id"], stored_as_scd_type=2,
                      sequence_by=("_commit_lsn", "_seq", "_seq"))
    assert not os.path.exists(tmp_path / "t")


def test_a_table_column_named_as_a_validity_column_is_refused(tmp_path):
    batch = changes(HISTORY[0]).append_column("_start_seq", pa.array([1, 2], pa.int64()))
    with pytest.raises(ValueError, match=r"the table's columns \['_start_seq'\] have the names of SCD 2 validity"):
        apply_changes(batch, str(tmp_path / "t"), format="delta", keys=["id"], stored_as_scd_type=2)
    assert not os.path.exists(tmp_path / "t")
