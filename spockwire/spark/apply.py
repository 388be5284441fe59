"""Applying a change DataFrame to a table: Delta Lake, Parquet, or an in-memory DataFrame.

A change DataFrame has the change columns (`_change_type`, `_commit_lsn`, `_commit_ts`, `_xid`, `_seq`, `_origin`,
`_unchanged_toast`) and the table's columns, as the ``spockwire`` data source, the staging reader and
``decode_frame_file`` produce it. Applying it gives the table the upstream had after the last change:

* changes take effect in (`_commit_lsn`, `_seq`) order;
* ``insert`` and ``update_postimage`` write the row of their key; a column named in `_unchanged_toast` (an
  unchanged TOASTed value PostgreSQL did not send) keeps the value it had -- from an earlier change of the
  same key in the DataFrame, else from the target row -- while a NULL column is a real NULL;
* ``delete`` removes the row of its key; an ``update_preimage`` whose key differs from the postimage that
  follows it (an update of the key) removes the old key's row;
* ``truncate`` empties the table; only changes after it count.

Everything runs as Spark aggregations and joins keyed by the table's key, so it scales out with the cluster:
nothing is collected to the driver except when writing through delta-rs.

Applying the same DataFrame twice gives the same table, so a `foreachBatch` that applies each micro-batch is
exactly-once together with the query's checkpoint.

An update that changes the key and leaves a TOASTed column unchanged does not carry that column's value on
the wire: it is taken from the old key's row (its last change before the update, else the target row).
"""
from __future__ import annotations

import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .schema import CHANGE_COLUMNS, KEY_METADATA, TABLE_COLUMN, TRUNCATE, table_struct_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["apply_changes", "apply_to_dataframe", "final_changes", "select_table", "key_columns"]

_POS = "_spockwire_pos"
_OP = "_spockwire_op"
_RESET = "_spockwire_reset"


def _c(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def key_columns(df: "DataFrame") -> list[str]:
    """The key columns marked in the DataFrame's schema (the ``spockwire`` source marks replica-identity keys)."""
    return [f.name for f in df.schema.fields if f.metadata.get(KEY_METADATA)]


def value_columns(df: "DataFrame") -> list[str]:
    return [c for c in df.columns if c not in CHANGE_COLUMNS and c != TABLE_COLUMN]


def select_table(df: "DataFrame", table: str) -> "DataFrame":
    """One table's changes out of a multi-table change DataFrame (change columns + that table's columns)."""
    from pyspark.sql import functions as F

    struct = table_struct_name(table if "." in table else f"public.{table}")
    qualified = table if "." in table else f"public.{table}"
    if struct not in df.columns:
        raise ValueError(f"{table!r} is not in this change DataFrame (columns: {', '.join(df.columns)})")
    return df.filter(F.col(TABLE_COLUMN) == qualified).select(*[_c(c) for c in CHANGE_COLUMNS],
                                                              f"`{struct}`.*")


def _resolve_keys(changes: "DataFrame", keys: Sequence[str] | None) -> list[str]:
    found = list(keys) if keys else key_columns(changes)
    if not found:
        raise ValueError("apply_changes needs the key columns: pass keys=[...] (the spockwire source marks the "
                         "table's replica-identity columns, but this DataFrame has no such marks)")
    missing = [k for k in found if k not in changes.columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the change DataFrame")
    return found


def _last_truncate(changes: "DataFrame") -> Any:
    from pyspark.sql import functions as F

    row = (changes.filter(F.col("_change_type") == TRUNCATE)
           .agg(F.max(F.struct("_commit_lsn", "_seq")).alias("t")).collect()[0])
    return row["t"]


def final_changes(changes: "DataFrame", keys: Sequence[str] | None = None,
                  target: "DataFrame | Callable[[], DataFrame | None] | None" = None) -> tuple["DataFrame", bool]:
    """Fold the changes into one row per touched key, and say whether a truncate came first.

    `target` (a DataFrame, or a function returning one, called only when needed) supplies the values of
    unchanged TOASTed columns of rows whose key was updated, when the changes do not hold them.

    The result has the key columns, ``_spockwire_op`` (``upsert`` | ``delete``), ``_spockwire_reset`` (the
    row was (re)inserted, so nothing is kept from the target) and, per value column, its final value plus
    ``_keep_<column>`` (true: keep the target's value).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = _resolve_keys(changes, keys)
    values = [c for c in value_columns(changes) if c not in keys]
    pos = F.struct(F.col("_commit_lsn"), F.col("_seq"))
    truncated = False
    last_truncate = _last_truncate(changes)
    rows = changes.filter(F.col("_change_type") != TRUNCATE)
    if last_truncate is not None:
        truncated = True
        rows = rows.filter(pos > F.struct(F.lit(last_truncate["_commit_lsn"]).cast("long").alias("_commit_lsn"),
                                          F.lit(last_truncate["_seq"]).cast("long").alias("_seq")))
    rows = rows.withColumn(_POS, pos)
    rows = _resolve_moved_toast(rows, keys, values, None if truncated else target)

    # an update_preimage matters only when the key changed: then it deletes the old key's row
    pre = rows.filter(F.col("_change_type") == "update_preimage")
    post = rows.filter(F.col("_change_type") == "update_postimage").select(
        F.col("_commit_lsn").alias("_p_lsn"), (F.col("_seq") - 1).alias("_p_seq"),
        *[_c(k).alias(f"_p_{i}") for i, k in enumerate(keys)])
    same_key = (F.col("_commit_lsn") == F.col("_p_lsn")) & (F.col("_seq") == F.col("_p_seq"))
    for i, k in enumerate(keys):
        same_key = same_key & _c(k).eqNullSafe(F.col(f"_p_{i}"))
    moved = pre.join(post, same_key, "left_anti")
    events = (rows.filter(F.col("_change_type") != "update_preimage")
              .unionByName(moved)
              .withColumn(_OP, F.when(F.col("_change_type").isin("delete", "update_preimage"), F.lit("delete"))
                          .otherwise(F.lit("upsert"))))

    # only what follows the last delete of a key counts
    by_key = Window.partitionBy(*[_c(k) for k in keys])
    events = events.withColumn("_last_delete", F.max(F.when(F.col(_OP) == "delete", F.col(_POS))).over(by_key))
    events = events.filter(F.col("_last_delete").isNull() | (F.col(_POS) >= F.col("_last_delete")))

    toast = F.coalesce(F.col("_unchanged_toast"), F.array().cast("array<string>"))
    aggs = [F.max_by(F.col(_OP), F.col(_POS)).alias(_OP),
            F.max(F.when((F.col("_change_type") == "insert") | (F.col(_OP) == "delete"), F.lit(True))
                  .otherwise(F.lit(False))).alias(_RESET)]
    for v in values:
        known = (F.col(_OP) == "upsert") & ~F.array_contains(toast, v)
        aggs.append(F.max_by(F.struct(_c(v).alias("v")), F.when(known, F.col(_POS))).alias(f"_v_{v}"))
    folded = events.groupBy(*[_c(k) for k in keys]).agg(*aggs)
    out = [_c(k) for k in keys] + [F.col(_OP), F.col(_RESET)]
    for v in values:
        out.append(F.col(f"`_v_{v}`.v").alias(v))
        out.append((F.col(f"`_v_{v}`").isNull() & ~F.col(_RESET)).alias(f"_keep_{v}"))
    return folded.select(*out), truncated


def _resolve_moved_toast(rows: "DataFrame", keys: Sequence[str], values: Sequence[str],
                         target: "DataFrame | Callable[[], DataFrame | None] | None", passes: int = 3
                         ) -> "DataFrame":
    """Fill the unchanged-TOAST columns of postimages whose key changed from the old key's row.

    PostgreSQL sends such a column as 'unchanged' although the row moved to another key; its value is the old
    key's latest known value before the update (a chain of key updates takes one pass per link).
    """
    from pyspark.sql import functions as F

    toasty = [v for v in values]
    if not toasty:
        return rows
    target_df = None
    for _ in range(passes):
        pre = rows.filter(F.col("_change_type") == "update_preimage").select(
            F.col("_commit_lsn").alias("_m_lsn"), (F.col("_seq") + 1).alias("_m_seq"),
            *[_c(k).alias(f"_o_{i}") for i, k in enumerate(keys)])
        differs = None
        for i, k in enumerate(keys):
            d = ~_c(k).eqNullSafe(F.col(f"_o_{i}"))
            differs = d if differs is None else differs | d
        moved = (rows.filter((F.col("_change_type") == "update_postimage") & (F.size("_unchanged_toast") > 0))
                 .join(pre, (F.col("_commit_lsn") == F.col("_m_lsn")) & (F.col("_seq") == F.col("_m_seq")))
                 .filter(differs).drop("_m_lsn", "_m_seq"))
        if moved.limit(1).count() == 0:
            return rows
        # the old key's latest change before the move, per column where the value is known
        old = rows.filter(F.col("_change_type").isin("insert", "update_postimage")).select(
            *[_c(k).alias(f"_h_{i}") for i, k in enumerate(keys)], F.col(_POS).alias("_h_pos"),
            F.coalesce(F.col("_unchanged_toast"), F.array().cast("array<string>")).alias("_h_toast"),
            *[_c(v).alias(f"_h_v_{v}") for v in toasty])
        link = F.col("_h_pos") < F.col(_POS)
        for i in range(len(keys)):
            link = link & F.col(f"_o_{i}").eqNullSafe(F.col(f"_h_{i}"))
        found = moved.join(old, link, "left").groupBy("_commit_lsn", "_seq").agg(
            *[F.max_by(F.struct(F.col(f"_h_v_{v}").alias("v")),
                       F.when(~F.array_contains("_h_toast", v), F.col("_h_pos"))).alias(f"_f_{v}")
              for v in toasty])
        fixed = moved.join(found, ["_commit_lsn", "_seq"], "left")
        if target is not None:
            if target_df is None:
                target_df = target() if callable(target) else target
            if target_df is not None:
                t = target_df.select(*[_c(k).alias(f"_t_{i}") for i, k in enumerate(keys)],
                                     *[_c(v).alias(f"_t_v_{v}") for v in toasty if v in target_df.columns])
                cond = None
                for i in range(len(keys)):
                    eq = F.col(f"_o_{i}").eqNullSafe(F.col(f"_t_{i}"))
                    cond = eq if cond is None else cond & eq
                fixed = fixed.join(t.withColumn("_t_hit", F.lit(True)), cond, "left")
        has_target = "_t_hit" in fixed.columns
        toast = F.col("_unchanged_toast")
        replaced = []
        for v in values:
            in_toast = F.array_contains(toast, v)
            from_old = F.col(f"_f_{v}").isNotNull()
            value = F.when(in_toast & from_old, F.col(f"_f_{v}.v"))
            if has_target and f"_t_v_{v}" in fixed.columns:
                value = value.when(in_toast & F.col("_t_hit").isNotNull(), F.col(f"_t_v_{v}"))
            replaced.append(value.otherwise(_c(v)).alias(v))
        resolved = F.filter(toast, lambda name: ~(
            F.coalesce(*[F.when(name == F.lit(v), F.col(f"_f_{v}").isNotNull() |
                                (F.col("_t_hit").isNotNull() if has_target and f"_t_v_{v}" in fixed.columns
                                 else F.lit(False))) for v in values], F.lit(False))))
        fixed = fixed.select(*[F.when(F.size(resolved) > 0, resolved).alias(c) if c == "_unchanged_toast" else
                               (replaced[values.index(c)] if c in values else _c(c)) for c in rows.columns])
        fixed = fixed.localCheckpoint(eager=True)
        rows = rows.join(fixed.select("_commit_lsn", "_seq"), ["_commit_lsn", "_seq"], "left_anti") \
            .unionByName(fixed).localCheckpoint(eager=True)
        if fixed.filter(F.size("_unchanged_toast") > 0).limit(1).count() == 0:
            return rows
    return rows


def apply_to_dataframe(changes: "DataFrame", target: "DataFrame | None" = None,
                       keys: Sequence[str] | None = None) -> "DataFrame":
    """The table after `changes`, starting from `target` (None: an empty table). Columns as in `target` (or
    the change DataFrame's table columns)."""
    from pyspark.sql import functions as F

    keys = _resolve_keys(changes, keys)
    final, truncated = final_changes(changes, keys, target)
    columns = target.columns if target is not None else value_columns(changes)
    values = [c for c in value_columns(changes) if c not in keys]
    upserts = final.filter(F.col(_OP) == "upsert").alias("s")
    if target is None or truncated:
        return upserts.select(*[(F.col(f"s.`{c}`") if c in keys or c in values else F.lit(None)).alias(c)
                                for c in columns])
    t = target.alias("t")
    cond = None
    for k in keys:
        eq = F.col(f"s.`{k}`").eqNullSafe(F.col(f"t.`{k}`"))
        cond = eq if cond is None else cond & eq
    merged = upserts.join(t, cond, "left")
    select = []
    for c in columns:
        if c in keys:
            select.append(F.col(f"s.`{c}`").alias(c))
        elif c in values:
            select.append(F.when(F.col(f"s.`_keep_{c}`"), F.col(f"t.`{c}`")).otherwise(F.col(f"s.`{c}`"))
                          .cast(target.schema[c].dataType).alias(c))
        else:
            select.append(F.col(f"t.`{c}`").alias(c))
    untouched = t.join(final.alias("s"), cond, "left_anti").select(*[F.col(f"t.`{c}`").alias(c) for c in columns])
    return untouched.unionByName(merged.select(*select))


def apply_changes(changes: "DataFrame", target: "str | DataFrame | None" = None, *, format: str = "delta",
                  keys: Sequence[str] | None = None, engine: str = "auto") -> "DataFrame | None":
    """Apply a change DataFrame to a table.

    The changes are read once (``localCheckpoint``) before the fold.

    * ``format="memory"``: `target` is a DataFrame (or None for an empty table); returns the new table.
    * ``format="parquet"``: `target` is a directory; the table is rewritten (new files, then swapped in).
    * ``format="delta"``: `target` is a Delta table path. ``engine="spark"`` merges through delta-spark (needs
      the Delta jars in the session), ``engine="delta-rs"`` through the `deltalake` package (the folded
      changes -- one row per touched key -- are collected to the driver); ``auto`` picks delta-spark when the
      session has it, else delta-rs.
    """
    spark = changes.sparkSession
    changes = _materialize(changes)
    if format == "memory":
        if target is not None and isinstance(target, str):
            raise TypeError("format='memory' takes a DataFrame (or None) as target")
        return apply_to_dataframe(changes, target, keys)
    if not isinstance(target, str):
        raise TypeError(f"format={format!r} takes a path as target")
    if format == "parquet":
        _apply_parquet(spark, changes, target, keys)
        return None
    if format == "delta":
        if engine == "auto":
            engine = "spark" if has_delta_spark(spark) else "delta-rs"
        if engine == "spark":
            _apply_delta_spark(spark, changes, target, keys)
        elif engine in ("delta-rs", "deltalake"):
            _apply_delta_rs(changes, target, keys)
        else:
            raise ValueError(f"unknown Delta engine {engine!r}: use auto, spark or delta-rs")
        return None
    raise ValueError(f"unknown format {format!r}: use delta, parquet or memory")


def _materialize(changes: "DataFrame") -> "DataFrame":
    """Read the changes once: the fold scans them several times, and a micro-batch DataFrame would otherwise
    re-read its source (peek the slot again) for every scan. Also cuts the lineage, which keeps the self-joins
    of the fold valid whatever the source plan is (a memory sink's table, for one)."""
    return changes.localCheckpoint(eager=True)


# ---------------------------------------------------------------------------------------------------------------
# Parquet

def _apply_parquet(spark: "SparkSession", changes: "DataFrame", path: str, keys: Sequence[str] | None) -> None:
    local = not path.startswith(("s3:", "s3a:", "gs:", "abfs:", "abfss:", "hdfs:", "dbfs:"))
    plain = path[len("file:"):] if path.startswith("file:") else path
    exists = os.path.exists(plain) if local else True
    target = spark.read.parquet(path) if exists and _has_files(plain, local) else None
    result = apply_to_dataframe(changes, target, keys)
    if not local:
        # object stores: write next to the table, then let the caller swap (no atomic rename there)
        raise NotImplementedError("format='parquet' rewrites local or shared-filesystem paths only; use Delta")
    tmp = f"{plain.rstrip('/')}.spockwire-{uuid.uuid4().hex[:8]}"
    result.write.mode("overwrite").parquet(tmp)
    old = None
    if exists:
        old = f"{tmp}.old"
        os.rename(plain, old)
    os.rename(tmp, plain)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _has_files(path: str, local: bool) -> bool:
    if not local:
        return True
    for _root, _dirs, files in os.walk(path):
        if any(f.endswith(".parquet") for f in files):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Delta

def has_delta_spark(spark: "SparkSession") -> bool:
    """Whether the session can use delta-spark (the Python package and the JVM classes)."""
    try:
        import delta.tables  # noqa: F401
    except ImportError:
        return False
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")  # type: ignore[union-attr]
        return True
    except Exception:  # noqa: BLE001 - py4j raises its own error types
        return False


def _merge_condition(keys: Sequence[str], left: str = "t", right: str = "s") -> str:
    return " AND ".join(f"{left}.`{k}` <=> {right}.`{k}`" for k in keys)


def _apply_delta_spark(spark: "SparkSession", changes: "DataFrame", path: str, keys: Sequence[str] | None) -> None:
    if not has_delta_spark(spark):
        raise RuntimeError("engine='spark' needs delta-spark in the session: the delta-spark Python package and "
                           "its jars (spark.jars.packages=io.delta:delta-spark_2.13:<version>, or spark.jars=...)")
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    keys = _resolve_keys(changes, keys)
    values = [c for c in value_columns(changes) if c not in keys]
    final, truncated = final_changes(
        changes, keys, lambda: spark.read.format("delta").load(path) if DeltaTable.isDeltaTable(spark, path) else None)
    if truncated or not DeltaTable.isDeltaTable(spark, path):
        table = apply_to_dataframe(changes, None, keys) if truncated else \
            final.filter(F.col(_OP) == "upsert").select(*[_c(c) for c in keys + values])
        table.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
        return
    updates = {v: f"CASE WHEN s.`_keep_{v}` THEN t.`{v}` ELSE s.`{v}` END" for v in values}
    inserts = {c: f"s.`{c}`" for c in keys + values}
    (DeltaTable.forPath(spark, path).alias("t")
     .merge(final.alias("s"), _merge_condition(keys))
     .whenMatchedDelete(condition=f"s.{_OP} = 'delete'")
     .whenMatchedUpdate(condition=f"s.{_OP} = 'upsert'", set=updates)
     .whenNotMatchedInsert(condition=f"s.{_OP} = 'upsert'", values=inserts)
     .execute())


def _apply_delta_rs(changes: "DataFrame", path: str, keys: Sequence[str] | None) -> None:
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError as exc:  # pragma: no cover
        raise ImportError("format='delta' without delta-spark needs the deltalake package "
                          "(pip install deltalake)") from exc
    from pyspark.sql import functions as F

    keys = _resolve_keys(changes, keys)
    values = [c for c in value_columns(changes) if c not in keys]
    try:
        DeltaTable(path)
        exists = True
    except Exception:  # noqa: BLE001 - deltalake raises TableNotFoundError (name differs across versions)
        exists = False
    final, truncated = final_changes(
        changes, keys, lambda: changes.sparkSession.createDataFrame(DeltaTable(path).to_pyarrow_table()) if exists
        else None)
    if truncated or not exists:
        table = apply_to_dataframe(changes, None, keys) if truncated else \
            final.filter(F.col(_OP) == "upsert").select(*[_c(c) for c in keys + values])
        write_deltalake(path, _to_arrow(table), mode="overwrite", schema_mode="overwrite")
        return
    source = _to_arrow(final)
    if source.num_rows == 0:
        return

    def q(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    cond = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
    updates = {q(v): f"CASE WHEN s.{q('_keep_' + v)} THEN t.{q(v)} ELSE s.{q(v)} END" for v in values}
    inserts = {q(c): f"s.{q(c)}" for c in keys + values}
    (DeltaTable(path).merge(source=source, predicate=cond, source_alias="s", target_alias="t")
     .when_matched_delete(predicate=f"s.{_OP} = 'delete'")
     .when_matched_update(updates=updates, predicate=f"s.{_OP} = 'upsert'")
     .when_not_matched_insert(updates=inserts, predicate=f"s.{_OP} = 'upsert'")
     .execute())


def _to_arrow(df: "DataFrame") -> Any:
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa  # pragma: no cover - Spark before 4.0

    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)
