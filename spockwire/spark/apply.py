"""Applying changes to a table (SCD type 1 or 2): Delta Lake, Parquet, or an in-memory DataFrame.

The changes are a Spark DataFrame or an Arrow table with the change columns (`_change_type`, `_commit_lsn`,
`_commit_ts`, `_xid`, `_seq`, `_origin`, `_unchanged_toast`) and the table's columns, as the ``spockwire`` data
source, the staging reader, ``decode_frame_file`` and ``ChangeBatch.to_arrow()`` produce them. :func:`apply_changes`
works like Databricks' AUTO CDC / APPLY CHANGES:

* changes take effect in `sequence_by` order (default (`_commit_lsn`, `_seq`)), per key;
* ``insert`` and ``update_postimage`` write a version of their key; a column named in `_unchanged_toast` (an
  unchanged TOASTed value PostgreSQL did not send) keeps the value of the previous version, while a NULL column
  is a real NULL; ``delete`` ends the key; an ``update_preimage`` whose key differs from the postimage that
  follows it (an update of the key) ends the old key, and the new key's unchanged TOASTed values come from it;
  ``truncate`` ends every key;
* SCD type 1 keeps the latest version of each key plus the sequence of the change that wrote it; SCD type 2
  keeps every version with its validity (``_start_*`` / ``_end_*`` columns, the current version open-ended).

Idempotent and order-safe: the target keeps, per key, the sequence of the last applied change (SCD 1: the
sequence columns and a tombstone per deleted key; SCD 2: the validity columns), and the truncates seen; a change
at or before what the target already holds for its key takes part in the result only where it belongs in the
sequence, so re-applying a batch, or applying batches out of order, gives the same table. (One limit: an unchanged
TOASTed value is resolved from the version before it when it is applied; a batch holding that earlier version
that arrives later does not change it.)

The work, per call: the changes reach the driver as Arrow (a DataFrame: one Spark job), the target's stored state
of the keys they touch is read (Delta: only the files whose statistics may hold them), the changes are resolved
per key in Arrow (:mod:`spockwire.spark.resolve`), and the target is written (Delta: an append when every key is
new, else one MERGE; see :mod:`spockwire.spark.delta_target`).
"""
from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_target import STATE_KIND, ArrowTarget
from .delta_features import check_target
from .delta_target import STATE_DIR, DeltaTarget
from .resolve import DEFAULT_SEQUENCE, make_plan, resolve, scd2_columns
from .schema import CHANGE_COLUMNS, KEY_METADATA, TABLE_COLUMN, table_struct_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from .read_ahead import ReadAhead

__all__ = ["apply_changes", "apply_to_dataframe", "select_table", "select_table_arrow", "key_columns",
           "value_columns", "scd2_columns", "ApplyMetrics", "STATE_DIR", "DEFAULT_SEQUENCE"]


def _c(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def key_columns(df: "DataFrame | pa.Table | pa.Schema") -> list[str]:
    """The key columns marked in the schema (the ``spockwire`` source marks replica-identity keys)."""
    if isinstance(df, (pa.Table, pa.Schema)):
        schema = df.schema if isinstance(df, pa.Table) else df
        return [f.name for f in schema if f.metadata and f.metadata.get(KEY_METADATA.encode()) in (b"true", b"True")]
    return [f.name for f in df.schema.fields if f.metadata.get(KEY_METADATA)]


def value_columns(df: "DataFrame | pa.Table") -> list[str]:
    """The table's columns of a change DataFrame (everything but the change columns)."""
    cols = df.column_names if isinstance(df, pa.Table) else df.columns
    return [c for c in cols if c not in CHANGE_COLUMNS and c != TABLE_COLUMN]


def _qualified(table: str) -> str:
    return table if "." in table else f"public.{table}"


def select_table(df: "DataFrame", table: str) -> "DataFrame":
    """One table's changes out of a multi-table change DataFrame (change columns + that table's columns)."""
    from pyspark.sql import functions as F

    qualified = _qualified(table)
    struct = table_struct_name(qualified)
    if struct not in df.columns:
        raise ValueError(f"{table!r} is not in this change DataFrame (columns: {', '.join(df.columns)})")
    return df.filter(F.col(TABLE_COLUMN) == qualified).select(*[_c(c) for c in CHANGE_COLUMNS], f"`{struct}`.*")


def select_table_arrow(batch: pa.Table, table: str) -> pa.Table:
    """One table's changes out of a multi-table change table in Arrow (what :func:`select_table` does in Spark)."""
    qualified = _qualified(table)
    struct = table_struct_name(qualified)
    if struct not in batch.column_names:
        raise ValueError(f"{table!r} is not in this change table (columns: {', '.join(batch.column_names)})")
    rows = batch.filter(pc.fill_null(pc.equal(batch.column(TABLE_COLUMN), qualified), False))
    values = rows.column(struct).combine_chunks() if rows.num_rows else \
        pa.array([], batch.schema.field(struct).type)
    fields = list(batch.schema.field(struct).type)
    children = values.flatten() if isinstance(values, pa.StructArray) else []
    cols = [rows.column(c) for c in CHANGE_COLUMNS] + list(children)
    schema = pa.schema([batch.schema.field(c) for c in CHANGE_COLUMNS] + fields)
    return pa.Table.from_arrays(cols, schema=schema)


@dataclass
class ApplyMetrics:
    """What one :func:`apply_changes` call read and wrote (path targets)."""

    keys_touched: int = 0          #: distinct keys the batch's changes name
    stored_rows_read: int = 0      #: target rows (and tombstones) read for those keys
    files_in_table: int | None = None   #: Delta: data files of the target before the write
    files_read: int | None = None       #: Delta: data files read to find the touched keys' rows
    rows_written: int = 0          #: rows inserted, updated or deleted in the target
    truncates: int = 0             #: truncates in the batch
    merge: dict = field(default_factory=dict)  #: delta-rs merge metrics, when a merge ran
    appended: int = 0              #: Delta: rows appended without a merge (keys the target did not hold)
    commits: int = 0               #: Delta: commits to the table (the state table's not counted)
    fresh_keys: int = 0            #: keys resolved by the vectorised passes
    sequential_keys: int = 0       #: keys resolved one at a time (late changes, TOAST values across key changes)
    skipped: bool = False          #: the target already held this batch (its idempotence token)
    commit_retries: int = 0        #: another writer committed first: the batch was read and resolved again
    unapplied: int = 0             #: a table without a key: updates and deletes that came without the old row
    unmatched: int = 0             #: a table without a key: old rows that equal no row the table holds
    seconds: dict = field(default_factory=dict)  #: Delta through delta-rs: seconds per step (stored, resolve, write)


# ---------------------------------------------------------------------------------------------------------------
# apply

def apply_changes(changes: "DataFrame | pa.Table", target: "str | DataFrame | None" = None, *,
                  format: str = "delta", keys: Sequence[str] | None = None, engine: str = "auto",
                  sequence_by: Sequence[str] | str = DEFAULT_SEQUENCE, stored_as_scd_type: int = 1,
                  idempotence: tuple[str, int] | None = None,
                  read_ahead: "ReadAhead | None" = None) -> "DataFrame | ApplyMetrics":
    """Apply changes (a Spark DataFrame or an Arrow table: one micro-batch, or any set of changes) to a table.

    * ``format="memory"``: `target` is a DataFrame (a table this function returned earlier, or a plain table
      for SCD 1) or None for an empty table; returns the new table (needs a DataFrame of changes).
    * ``format="parquet"``: `target` is a directory; the table is rewritten (new files, then swapped in).
    * ``format="delta"``: `target` is a Delta table path, read and written with the `deltalake` package (delta-rs:
      only the files that may hold the batch's keys are read), on the driver, whatever the session
      (``engine``: ``"auto"`` or ``"delta-rs"``, the same).

    `keys`: the key columns (default: the replica-identity columns the ``spockwire`` source marks); an empty list:
    the table has no key, and its changes are applied as a bag of rows (Delta through delta-rs only; see
    :mod:`spockwire.spark.keyless`).
    `sequence_by`: the columns ordering changes (default ``("_commit_lsn", "_seq")``).
    `stored_as_scd_type`: 1 -- the latest version per key, plus its sequence columns; 2 -- every version with
    ``_start_*`` / ``_end_*`` validity columns (see :func:`scd2_columns`).
    `idempotence`: Delta through delta-rs: ``(application id, version)`` recorded with the table's commit; a call
    whose version the table already holds for that application changes nothing (a replayed micro-batch).
    `read_ahead`: Delta through delta-rs: a :class:`~spockwire.spark.read_ahead.ReadAhead` of `target` started
    before the changes arrived; its rows are used if the table did not change since and the batch needs them all.

    Path targets return :class:`ApplyMetrics`.
    """
    spark = None if isinstance(changes, pa.Table) else changes.sparkSession
    if keys is not None and not list(keys):
        return _apply_keyless(changes, target, format, engine, sequence_by, stored_as_scd_type, idempotence)
    found_keys = list(keys) if keys else key_columns(changes)
    values = value_columns(changes)
    columns = changes.column_names if isinstance(changes, pa.Table) else changes.columns
    plan = make_plan(columns, found_keys, sequence_by, stored_as_scd_type, values)
    if format == "memory":
        if spark is None:
            raise TypeError("format='memory' takes a DataFrame of changes (its result is a DataFrame)")
        if target is not None and isinstance(target, str):
            raise TypeError("format='memory' takes a DataFrame (or None) as target")
        return _apply_memory(spark, _arrow(changes), target, plan)
    if not isinstance(target, str):
        raise TypeError(f"format={format!r} takes a path as target")
    if format == "parquet":
        return _apply_parquet(_arrow(changes), target, plan)
    if format != "delta":
        raise ValueError(f"unknown format {format!r}: use delta, parquet or memory")
    _check_engine(engine)
    return _apply_delta_rs(changes, target, plan, idempotence, read_ahead)


def apply_to_dataframe(changes: "DataFrame", target: "DataFrame | None" = None,
                       keys: Sequence[str] | None = None, **options: Any) -> "DataFrame":
    """The table after `changes`, starting from `target` (None: an empty table): ``apply_changes`` with
    ``format="memory"``."""
    return apply_changes(changes, target, format="memory", keys=keys, **options)  # type: ignore[return-value]


def _check_engine(engine: str) -> None:
    """Delta is written through delta-rs in every case; delta-spark's MERGE is not an engine of spockwire."""
    if engine == "spark":
        raise ValueError("engine='spark' is not supported: spockwire writes Delta through delta-rs (the deltalake "
                         "package) in every case, the same table format delta-spark reads; use engine='delta-rs'")
    if engine not in ("auto", "delta-rs", "deltalake"):
        raise ValueError(f"unknown Delta engine {engine!r}: use delta-rs")


def check_history(kind: str, where: str, columns: Sequence[str], plan: Any) -> None:
    """HistoryTableError, before anything is read or written, when SCD 2 changes meet an existing table (`columns`:
    all of its columns) that lacks the validity columns of their sequence: a plain or SCD 1 table holds no history
    to add versions to (its rows' validity is unknown), and a history of another sequence orders its versions by
    other columns."""
    if plan.scd != 2:
        return
    have = set(columns)
    missing = [c for c in plan.start_cols + plan.end_cols if c not in have]
    if missing:
        from ..errors import HistoryTableError

        what = "a plain or SCD 1 table" if len(missing) == len(plan.start_cols) * 2 else \
            "a history kept with another sequence_by"
        remedy = "start from target=None, or from a history apply_changes(stored_as_scd_type=2) returned" \
            if kind == "in-memory" else \
            "write the history to a new path, or to a history table apply_changes(stored_as_scd_type=2) made"
        raise HistoryTableError(
            f"cannot apply SCD 2 changes to the {kind} table {where}: it lacks the validity columns "
            f"{', '.join(missing)} of sequence_by={tuple(plan.seq)} ({what}); {remedy} with this sequence_by")


def _apply_keyless(changes: "DataFrame | pa.Table", target: Any, format: str, engine: str,
                   sequence_by: Sequence[str] | str, scd: int, idempotence: tuple[str, int] | None) -> ApplyMetrics:
    """A table without a key (``keys=[]``): its changes applied to Delta through delta-rs as a bag of rows."""
    from .keyless import apply_keyless, keyless_plan

    _check_engine(engine)
    if format != "delta" or not isinstance(target, str):
        raise ValueError("a table without a key (keys=[]) is applied to a Delta table path through delta-rs only "
                         "(format='delta', engine='delta-rs')")
    columns = changes.column_names if isinstance(changes, pa.Table) else changes.columns
    plan = keyless_plan(columns, sequence_by, scd, value_columns(changes))
    if plan.scd == 2:
        from .delta_target import open_delta

        dt = open_delta(target)
        if dt is not None:
            check_history("Delta", target, pa.schema(dt.schema().to_arrow()).names, plan)
    batch = _arrow(changes)

    def once(_attempt: int) -> ApplyMetrics:
        metrics = ApplyMetrics()
        apply_keyless(batch, target, plan, idempotence, metrics)
        return metrics

    return retry_on_conflict(once, target)


def _arrow(changes: "DataFrame | pa.Table") -> pa.Table:
    """The changes on the driver as Arrow: a DataFrame is read once (one Spark job)."""
    if isinstance(changes, pa.Table):
        return changes
    return changes.toArrow()


def _touched(batch: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The key columns of the batch's rows (its truncates left out)."""
    rows = batch.select(list(keys))
    kinds = batch.column("_change_type")
    if not pc.any(pc.equal(kinds, "truncate")).as_py():
        return rows
    return rows.filter(pc.fill_null(pc.not_equal(kinds, "truncate"), True))


def _table_columns(plan: Any, batch: pa.Table, existing: Sequence[str]) -> list[str]:
    """The table's columns after this batch: the target's (bookkeeping excluded), then new ones."""
    cols = plan.keys + [v for v in value_columns(batch) if v not in plan.keys]
    if not existing:
        return cols
    book = set(plan.bookkeeping()) | {STATE_KIND}
    have = [c for c in existing if c not in book]
    return have + [c for c in cols if c not in have]


#: attempts at a batch whose commit met another writer's (each reads the table again, after a short random pause)
COMMIT_ATTEMPTS = 8


def retry_on_conflict(apply: Any, path: str) -> ApplyMetrics:
    """`apply(attempt)` (one read, resolution and commit of a batch; with an idempotence token its commit takes no
    silent retry) again while another writer committed to the table first: the next attempt reads the table as
    that writer left it, so a key both wrote is never stored twice."""
    from .delta_target import deltalake_module

    failed = deltalake_module().exceptions.CommitFailedError
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            metrics = apply(attempt)
        except failed as exc:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise RuntimeError(f"{path}: another writer committed to the Delta table before each of "
                                   f"{COMMIT_ATTEMPTS} attempts at this batch ({exc}); is a second job writing it?"
                                   ) from exc
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            continue
        metrics.commit_retries = attempt
        return metrics
    raise AssertionError("unreachable")  # pragma: no cover


def _apply_delta_rs(changes: "DataFrame | pa.Table", path: str, plan: Any,
                    idempotence: tuple[str, int] | None, read_ahead: "ReadAhead | None" = None) -> ApplyMetrics:
    return retry_on_conflict(lambda attempt: _apply_delta_rs_once(changes, path, plan, idempotence,
                                                                  read_ahead if attempt == 0 else None), path)


def _apply_delta_rs_once(changes: "DataFrame | pa.Table", path: str, plan: Any,
                         idempotence: tuple[str, int] | None, read_ahead: "ReadAhead | None" = None) -> ApplyMetrics:
    metrics = ApplyMetrics()
    target = DeltaTarget(path, plan, read_ahead)
    if target.dt is not None:
        check_target(path, target.dt)          # a feature delta-rs cannot keep up: one line, before any read
        check_history("Delta", path, pa.schema(target.dt.schema().to_arrow()).names, plan)
    if target.applied(idempotence):
        metrics.skipped = True
        target.release()
        return metrics
    batch = _arrow(changes)
    existing, types = target.columns()
    table_cols = _table_columns(plan, batch, existing)
    t0 = time.perf_counter()
    stored = target.stored(_touched(batch, plan.keys), metrics)
    t1 = time.perf_counter()
    res = resolve(batch, plan, stored, table_cols, types)
    t2 = time.perf_counter()
    _count(metrics, res)
    append_only = stored.rows is None or stored.rows.num_rows == 0
    target.write(res, table_cols, idempotence, metrics, append_only)
    metrics.seconds.update(stored=t1 - t0, resolve=t2 - t1, write=time.perf_counter() - t2)
    target.release()
    return metrics


def _count(metrics: ApplyMetrics, res: Any) -> None:
    metrics.keys_touched = res.keys_touched
    metrics.truncates = len(res.truncates)
    metrics.fresh_keys = res.fresh_keys
    metrics.sequential_keys = res.sequential_keys
    metrics.rows_written = res.rows.num_rows


def _apply_arrow_target(target: ArrowTarget, batch: pa.Table, existing: Sequence[str],
                        types: dict[str, pa.DataType]) -> ApplyMetrics:
    metrics = ApplyMetrics()
    table_cols = _table_columns(target.plan, batch, existing)
    stored = target.stored(_touched(batch, target.plan.keys))
    metrics.stored_rows_read = sum(t.num_rows for t in (stored.rows, stored.tombstones) if t is not None)
    res = resolve(batch, target.plan, stored, table_cols, types)
    _count(metrics, res)
    target.apply(res, table_cols)
    return metrics


def _apply_memory(spark: "SparkSession", batch: pa.Table, target: "DataFrame | None", plan: Any) -> "DataFrame":
    if target is not None:
        check_history("in-memory", "given as target", target.columns, plan)
    table = target.toArrow() if target is not None else None
    if table is not None and plan.scd == 1:
        missing = [c for c in plan.seq if c not in table.column_names]
        for c in missing:   # a plain table (no sequence yet): every stored row is older than any change
            table = table.append_column(c, pa.nulls(table.num_rows, batch.schema.field(c).type))
    existing = table.column_names if table is not None else []
    state = ArrowTarget(plan, table)
    _apply_arrow_target(state, batch, existing, _types(table))
    out_cols = _table_columns(plan, batch, existing) + [c for c in plan.bookkeeping()]
    result = state.table if state.table is not None else pa.table({c: pa.nulls(0) for c in out_cols})
    return spark.createDataFrame(result.select([c for c in out_cols if c in result.column_names]))


def _types(table: pa.Table | None) -> dict[str, pa.DataType]:
    return {} if table is None else {f.name: f.type for f in table.schema if f.type != pa.null()}


def _apply_parquet(batch: pa.Table, target: str, plan: Any) -> ApplyMetrics:
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    if target.startswith(("s3:", "s3a:", "gs:", "abfs:", "abfss:", "hdfs:", "dbfs:")):
        raise NotImplementedError("format='parquet' rewrites local or shared-filesystem paths only; use Delta")
    path = target[len("file:"):] if target.startswith("file:") else target
    table = None
    if _has_parquet(path, top=True):
        data = pads.dataset(path, format="parquet")
        check_history("Parquet", path, data.schema.names, plan)
        table = data.to_table()
    state_path = os.path.join(path, STATE_DIR)
    state = pads.dataset(state_path, format="parquet").to_table() if _has_parquet(state_path) else None
    if table is not None and plan.scd == 1:
        for c in plan.seq:
            if c not in table.column_names:
                table = table.append_column(c, pa.nulls(table.num_rows, batch.schema.field(c).type))
    existing = table.column_names if table is not None else []
    arrow_target = ArrowTarget(plan, table, state)
    metrics = _apply_arrow_target(arrow_target, batch, existing, _types(table))
    tmp = f"{path.rstrip('/')}.spockwire-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    if arrow_target.table is not None:
        pq.write_table(arrow_target.table, os.path.join(tmp, "part-00000.parquet"))
    if arrow_target.state is not None:
        os.makedirs(os.path.join(tmp, STATE_DIR))
        pq.write_table(arrow_target.state, os.path.join(tmp, STATE_DIR, "part-00000.parquet"))
    old = None
    if os.path.exists(path):
        old = f"{tmp}.old"
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return metrics


def _has_parquet(path: str, top: bool = False) -> bool:
    if not os.path.isdir(path):
        return False
    for _root, dirs, files in os.walk(path):
        if top:
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        if any(f.endswith(".parquet") for f in files):
            return True
    return False


def target_path(target: str, table: str, history: bool = False) -> str:
    """The Delta table of a source table: ``<target>/<schema>.<table>`` (SCD 1), ``<target>/<schema>.<table>_history``
    (SCD 2)."""
    name = table if "." in table else f"public.{table}"
    return os.path.join(target, name + ("_history" if history else ""))
