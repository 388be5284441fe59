"""Every Delta table a user may point apply_changes (and the job) at: plain, partitioned, change data feed and CHECK
constraints are applied exactly (a row that breaks a constraint fails the batch, which commits nothing); deletion
vectors, column mapping, generated columns and append-only tables are refused before the first read with one line
naming the feature and what to do. Both keyed and keyless applies."""
from __future__ import annotations

import deltalake
import pyarrow as pa
import pytest

from spockwire.spark.apply import apply_changes
from spockwire.spark.delta_features import UnsupportedTableError
from tests.delta_check import checked_table

START = pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"]})


def changes(ids=(3, 1), values=("c", "z")) -> pa.Table:
    n = len(ids)
    return pa.table({"_change_type": ["insert"] + ["update_postimage"] * (n - 1),
                     "_commit_lsn": pa.array([10 * (i + 1) for i in range(n)], pa.int64()),
                     "_commit_ts": pa.nulls(n, pa.timestamp("us", tz="UTC")),
                     "_xid": pa.array(range(n), pa.int64()), "_seq": pa.array([0] * n, pa.int64()),
                     "_origin": pa.nulls(n, pa.string()), "_unchanged_toast": pa.nulls(n, pa.list_(pa.string())),
                     "id": pa.array(ids, pa.int32()), "v": list(values)})


def _rows(path) -> list:
    return sorted((r["id"], r["v"]) for r in checked_table(path).select(["id", "v"]).to_pylist())


@pytest.mark.parametrize("kind", ["plain", "partitioned", "change_data_feed", "check_constraint"])
def test_tables_that_are_applied(tmp_path, kind):
    path = str(tmp_path / kind)
    kw = {"partitioned": dict(partition_by=["v"]),
          "change_data_feed": dict(configuration={"delta.enableChangeDataFeed": "true"})}.get(kind, {})
    deltalake.write_deltalake(path, START, **kw)
    if kind == "check_constraint":
        deltalake.DeltaTable(path).alter.add_constraint({"id_small": "id < 100"})
    apply_changes(changes(), path, format="delta", keys=["id"])
    assert _rows(path) == [(1, "z"), (2, "b"), (3, "c")]
    if kind == "check_constraint":
        version = deltalake.DeltaTable(path).version()
        with pytest.raises(Exception, match="failed validation check"):
            apply_changes(changes((300, 2), ("big", "y")), path, format="delta", keys=["id"])
        assert deltalake.DeltaTable(path).version() == version and _rows(path) == [(1, "z"), (2, "b"), (3, "c")]


REFUSED = {
    "deletion_vectors": (dict(configuration={"delta.enableDeletionVectors": "true"}), "uses deletion vectors"),
    "column_mapping": (dict(configuration={"delta.columnMapping.mode": "name"}), "uses column mapping"),
    "append_only": (dict(configuration={"delta.appendOnly": "true"}), "is append-only"),
    "generated_column": (None, "its column 'g' is generated (id * 2)"),
}


@pytest.mark.parametrize("keys", [["id"], []], ids=["keyed", "keyless"])
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_tables_that_are_refused_in_one_line(tmp_path, kind, keys):
    path = str(tmp_path / kind)
    kw, message = REFUSED[kind]
    if kw is None:
        deltalake.DeltaTable.create(path, deltalake.Schema([
            deltalake.Field("id", "integer"), deltalake.Field("v", "string"),
            deltalake.Field("g", "integer", metadata={"delta.generationExpression": "id * 2"})]))
    else:
        deltalake.write_deltalake(path, START, **kw)
    version = deltalake.DeltaTable(path).version()
    with pytest.raises(UnsupportedTableError) as err:
        apply_changes(changes(), path, format="delta", keys=keys)
    text = str(err.value)
    assert text.startswith(f"cannot apply changes to the Delta table {path}: ") and message in text, text
    assert "\n" not in text
    assert deltalake.DeltaTable(path).version() == version
