"""Applying a change DataFrame to a table (SCD type 1 or 2): Delta Lake, Parquet, or an in-memory DataFrame.

A change DataFrame has the change columns (`_change_type`, `_commit_lsn`, `_commit_ts`, `_xid`, `_seq`, `_origin`,
`_unchanged_toast`) and the table's columns, as the ``spockwire`` data source, the staging reader and
``decode_frame_file`` produce it. :func:`apply_changes` works like Databricks' AUTO CDC / APPLY CHANGES:

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
sequence, so re-applying a batch, or applying batches out of order, gives the same table.

The work, per batch:

1. events: the changes as upserts and deletes per key (Spark, distributed);
2. the stored state of the keys the batch touches (only those: a semi-join in Spark, or -- Delta through
   delta-rs -- a read of the files whose statistics may hold them);
3. the resolution: per key, stored versions and the batch's events replayed in sequence order
   (``mapInArrow`` over the key-partitioned, sorted union: distributed by key);
4. the write: a MERGE of the changed rows (Delta: delta-rs or delta-spark), a rewrite (Parquet), or the new
   DataFrame (memory).
"""
from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .schema import CHANGE_COLUMNS, KEY_METADATA, TABLE_COLUMN, TRUNCATE, table_struct_name

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["apply_changes", "apply_to_dataframe", "select_table", "key_columns", "value_columns",
           "scd2_columns", "ApplyMetrics", "has_delta_spark", "STATE_DIR", "DEFAULT_SEQUENCE"]

#: the default ordering of changes: commit LSN, then position in the transaction
DEFAULT_SEQUENCE = ("_commit_lsn", "_seq")
#: the directory, inside a Parquet or Delta target, holding its tombstones and truncates
STATE_DIR = "_spockwire_state"

# internal column names (never in a target table)
_KIND = "_sw_kind"        # 0 stored version, 1 stored tombstone, 2 event of the batch
_OP = "_sw_op"            # upsert | delete
_TS = "_sw_ts"            # commit time of the event / the version's start
_TOAST = "_sw_toast"      # columns whose value the event does not carry
_CHANGED = "_sw_changed"  # the resolved row differs from the stored one
_END = "_sw_end_"         # prefix: a stored SCD 2 version's end (sequence columns, then _sw_end_ts)
_END_TS = "_sw_end_ts"
_STATE_KIND = "_sw_state"  # state rows: delete (a tombstone) | truncate


def _c(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def key_columns(df: "DataFrame") -> list[str]:
    """The key columns marked in the DataFrame's schema (the ``spockwire`` source marks replica-identity keys)."""
    return [f.name for f in df.schema.fields if f.metadata.get(KEY_METADATA)]


def value_columns(df: "DataFrame") -> list[str]:
    """The table's columns of a change DataFrame (everything but the change columns)."""
    return [c for c in df.columns if c not in CHANGE_COLUMNS and c != TABLE_COLUMN]


def scd2_columns(sequence_by: Sequence[str] = DEFAULT_SEQUENCE) -> tuple[list[str], list[str]]:
    """The validity columns of an SCD 2 table: (start columns, end columns). Each sequence column ``c`` gives
    ``_start_<c>`` / ``_end_<c>`` (leading underscores dropped), then ``_start_commit_ts`` / ``_end_commit_ts``:
    with the default sequence ``_start_commit_lsn, _start_seq, _start_commit_ts`` and the same with ``_end_``."""
    start = [f"_start_{c.lstrip('_')}" for c in sequence_by] + ["_start_commit_ts"]
    end = [f"_end_{c.lstrip('_')}" for c in sequence_by] + ["_end_commit_ts"]
    return start, end


def select_table(df: "DataFrame", table: str) -> "DataFrame":
    """One table's changes out of a multi-table change DataFrame (change columns + that table's columns)."""
    from pyspark.sql import functions as F

    struct = table_struct_name(table if "." in table else f"public.{table}")
    qualified = table if "." in table else f"public.{table}"
    if struct not in df.columns:
        raise ValueError(f"{table!r} is not in this change DataFrame (columns: {', '.join(df.columns)})")
    return df.filter(F.col(TABLE_COLUMN) == qualified).select(*[_c(c) for c in CHANGE_COLUMNS],
                                                              f"`{struct}`.*")


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


# ---------------------------------------------------------------------------------------------------------------
# the plan: columns and how the batch becomes events

@dataclass
class _Plan:
    keys: list[str]
    values: list[str]          # the batch's table columns other than the keys
    seq: list[str]
    scd: int
    has_ts: bool
    has_toast: bool

    @property
    def start_cols(self) -> list[str]:
        return scd2_columns(self.seq)[0]

    @property
    def end_cols(self) -> list[str]:
        return scd2_columns(self.seq)[1]

    def bookkeeping(self) -> list[str]:
        """Columns the target holds besides the table's: SCD 1 the sequence (those not table columns), SCD 2 the
        validity columns."""
        if self.scd == 2:
            return self.start_cols + self.end_cols
        return [c for c in self.seq if c not in self.keys and c not in self.values]


def _plan(changes: "DataFrame", keys: Sequence[str] | None, sequence_by: Sequence[str] | str,
          scd: int) -> _Plan:
    if scd not in (1, 2):
        raise ValueError(f"stored_as_scd_type must be 1 or 2, not {scd!r}")
    seq = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    if not seq:
        raise ValueError("sequence_by needs at least one column")
    missing = [c for c in seq if c not in changes.columns]
    if missing:
        raise ValueError(f"sequence_by columns {missing} are not columns of the change DataFrame")
    found = list(keys) if keys else key_columns(changes)
    if not found:
        raise ValueError("apply_changes needs the key columns: pass keys=[...] (the spockwire source marks the "
                         "table's replica-identity columns, but this DataFrame has no such marks)")
    missing = [k for k in found if k not in changes.columns]
    if missing:
        raise ValueError(f"key columns {missing} are not columns of the change DataFrame")
    if "_change_type" not in changes.columns:
        raise ValueError("the change DataFrame has no _change_type column")
    values = [c for c in value_columns(changes) if c not in found]
    return _Plan(found, values, seq, scd, "_commit_ts" in changes.columns, "_unchanged_toast" in changes.columns)


def _sk(pos: tuple) -> tuple:
    """A sort key for a sequence tuple: a NULL (a plain table's row, which has no sequence yet) first."""
    return tuple((x is not None, x) for x in pos)


def _merge_truncates(*lists: Sequence[tuple[tuple, Any]]) -> list[tuple[tuple, Any]]:
    """Truncates of several sources, each once (by sequence), in order."""
    seen: dict[tuple, Any] = {}
    for lst in lists:
        for pos, ts in lst:
            seen.setdefault(pos, ts)
    return sorted(seen.items(), key=lambda t: _sk(t[0]))


def _scan(changes: "DataFrame", plan: _Plan) -> tuple[list[tuple[tuple, Any]], bool]:
    """One pass over the batch: its truncates ((sequence tuple, commit time), in order), and whether it holds
    any preimage (without one, no key changed)."""
    from pyspark.sql import functions as F

    ts = _c("_commit_ts") if plan.has_ts else F.lit(None).cast("timestamp")
    row = changes.agg(
        F.collect_list(F.when(F.col("_change_type") == TRUNCATE,
                              F.struct(*[_c(c).alias(f"p{i}") for i, c in enumerate(plan.seq)], ts.alias("ts"))))
        .alias("t"),
        F.max((F.col("_change_type") == "update_preimage").cast("int")).alias("pre")).collect()[0]
    truncates = [(tuple(t[f"p{i}"] for i in range(len(plan.seq))), t["ts"]) for t in row["t"]]
    return _merge_truncates(truncates), bool(row["pre"])


def _events(changes: "DataFrame", plan: _Plan) -> "DataFrame":
    """The batch as events: keys, kind 2, op, sequence columns, commit time, the columns not carried, values.

    A preimage matters only when the key changed (the postimage that follows it, at the next `_seq` of the
    same commit, has another key): then it is a delete of the old key."""
    from pyspark.sql import functions as F

    rows = changes.filter(F.col("_change_type") != TRUNCATE)
    toast = (F.coalesce(_c("_unchanged_toast"), F.array().cast("array<string>")) if plan.has_toast
             else F.array().cast("array<string>"))
    ts = _c("_commit_ts") if plan.has_ts else F.lit(None).cast("timestamp")
    out = [*[_c(k) for k in plan.keys], F.lit(2).alias(_KIND),
           F.when(F.col("_change_type").isin("delete", "update_preimage"), F.lit("delete"))
           .otherwise(F.lit("upsert")).alias(_OP),
           *[_c(c) for c in plan.seq if c not in plan.keys and c not in plan.values], ts.alias(_TS),
           toast.alias(_TOAST), *[_c(v) for v in plan.values]]
    kept = rows.filter(F.col("_change_type") != "update_preimage")
    if {"_commit_lsn", "_seq"} <= set(changes.columns):
        pre = rows.filter(F.col("_change_type") == "update_preimage")
        post = rows.filter(F.col("_change_type") == "update_postimage").select(
            F.col("_commit_lsn").alias("_p_lsn"), (F.col("_seq") - 1).alias("_p_seq"),
            *[_c(k).alias(f"_p_{i}") for i, k in enumerate(plan.keys)])
        same = (F.col("_commit_lsn") == F.col("_p_lsn")) & (F.col("_seq") == F.col("_p_seq"))
        for i, k in enumerate(plan.keys):
            same = same & _c(k).eqNullSafe(F.col(f"_p_{i}"))
        moved = pre.join(post, same, "left_anti")
        kept = kept.unionByName(moved)
    return kept.select(*out)


# ---------------------------------------------------------------------------------------------------------------
# the resolution of one key: stored versions + events, in sequence order

def _fold(records: list[dict], truncates: Sequence[tuple[tuple, Any]], cfg: dict) -> list[dict]:
    """The rows to store for one key.

    `records` are the key's stored versions (kind 0), stored tombstone (kind 1) and the batch's events (kind 2).
    SCD 1: one row, ``op`` upsert (the latest version) or delete (the key ends, with the sequence of its end).
    SCD 2: every version. Each output row carries ``changed``: it differs from what the target holds.
    """
    seq, values, scd = cfg["seq"], cfg["values"], cfg["scd"]
    ends = cfg["end_seq"]
    timeline: list[tuple[tuple, int, str, dict]] = []
    stored_starts = set()
    stored_tomb = None
    for r in records:
        pos = tuple(r[c] for c in seq)
        if r[_KIND] == 0:
            timeline.append((pos, 0, "upsert", r))
            stored_starts.add(pos)
        elif r[_KIND] == 1:
            timeline.append((pos, 0, "delete", r))
            stored_tomb = pos
        else:
            timeline.append((pos, 1, r[_OP], r))
    if scd == 2:
        for r in records:
            if r[_KIND] == 0 and r[ends[0]] is not None:
                end = tuple(r[c] for c in ends)
                if end not in stored_starts:
                    timeline.append((end, 0, "delete", {_TS: r[_END_TS]}))
    for tpos, tts in truncates:
        timeline.append((tpos, 0, "delete", {_TS: tts}))
    timeline.sort(key=lambda t: (_sk(t[0]), t[1]))
    versions: list[dict] = []
    new_deletes: list[tuple] = []
    alive: dict | None = None
    last_pos = None
    last_delete = None
    for pos, prio, op, r in timeline:
        if pos == last_pos:
            continue  # the same change again (a replayed batch, or a duplicate row): the first copy counts
        last_pos = pos
        if op == "upsert":
            if prio == 0:
                vals = {v: r.get(v) for v in values}
            else:
                carried = set(r.get(_TOAST) or ())
                vals = {v: ((alive["values"].get(v) if alive is not None else None) if v in carried else r.get(v))
                        for v in values}
            if alive is not None:
                alive["end"], alive["end_ts"] = pos, r.get(_TS)
            alive = {"start": pos, "ts": r.get(_TS), "values": vals, "end": None, "end_ts": None,
                     "stored": r if prio == 0 else None}
            versions.append(alive)
        else:
            if alive is not None:
                alive["end"], alive["end_ts"] = pos, r.get(_TS)
            alive = None
            last_delete = pos
            if prio == 1:
                new_deletes.append((pos, r.get(_TS)))
    out: list[dict] = []
    if scd == 1:
        had_row = bool(stored_starts)
        if alive is not None:
            row = dict(alive["values"])
            row.update(zip(seq, alive["start"]))
            row[_OP] = "upsert"
            row[_CHANGED] = alive["stored"] is None
            out.append(row)
        elif last_delete is not None:
            row = {v: None for v in values}
            row.update(zip(seq, last_delete))
            row[_OP] = "delete"
            row[_CHANGED] = had_row or stored_tomb != last_delete
            out.append(row)
        return out
    start_cols, end_cols = cfg["start_cols"], cfg["end_cols"]
    for v in versions:
        row = dict(v["values"])
        row.update(zip(start_cols, (*v["start"], v["ts"])))
        end = v["end"] or (None,) * len(seq)
        row.update(zip(end_cols, (*end, v["end_ts"])))
        stored = v["stored"]
        if stored is None:
            changed = True
        else:
            before = None if stored[ends[0]] is None else tuple(stored[c] for c in ends)
            changed = before != v["end"]
        row[_CHANGED] = changed
        row[_OP] = "version"
        out.append(row)
    # deletes seen: a late change before one must end there, even when the delete ended no stored version
    for pos, ts in new_deletes:
        row = {v: None for v in values}
        row.update(zip(start_cols, (*pos, ts)))
        row.update(zip(end_cols, (None,) * len(end_cols)))
        row[_OP] = "delete"
        row[_CHANGED] = True
        out.append(row)
    return out


def _resolve_partition(batches: Iterator[Any], cfg: dict) -> Iterator[Any]:
    """mapInArrow body: rows sorted by key then sequence; one :func:`_fold` per key.

    Only the control columns (keys, kind, operation, sequence, times, carried columns) become Python values; the
    table's values stay Arrow arrays and the fold moves row numbers, so every value Arrow holds (an infinite
    timestamp, a huge decimal) goes through unchanged."""
    import pyarrow as pa

    schema = cfg["out_schema"]
    keys = cfg["keys"]
    values = cfg["refs"]
    control = [c for c in cfg["control"]]
    kept: list[Any] = []
    offset = 0
    out: list[dict] = []
    group: list[dict] = []
    current: Any = object()

    def flush() -> None:
        if group:
            key_values = {k: group[0][k] for k in keys}
            for row in _fold(group, cfg["truncates"], cfg):
                row.update(key_values)
                out.append(row)

    for batch in batches:
        if batch.num_rows == 0:
            continue
        kept.append(batch)
        cols = {c: batch.column(c).to_pylist() for c in control}
        for i in range(batch.num_rows):
            r = {c: cols[c][i] for c in control}
            k = tuple(r[c] for c in keys)
            if k != current:
                flush()
                group = []
                current = k
            for v in values:
                r[v] = offset + i
            group.append(r)
        offset += batch.num_rows
    flush()
    if not out:
        return
    names = [f.name for f in schema]
    arrays = []
    for f in schema:
        if f.name in values:
            source = pa.concat_arrays([b.column(f.name) for b in kept]) if kept else pa.nulls(0, f.type)
            idx = pa.array([row.get(f.name) for row in out], pa.int64())
            arrays.append(source.take(idx).cast(f.type))
        else:
            arrays.append(pa.array([row.get(f.name) for row in out], f.type))
    table = pa.Table.from_arrays(arrays, names=names)
    yield from table.to_batches(max_chunksize=8192)


# ---------------------------------------------------------------------------------------------------------------
# apply

def apply_changes(changes: "DataFrame", target: "str | DataFrame | None" = None, *, format: str = "delta",
                  keys: Sequence[str] | None = None, engine: str = "auto",
                  sequence_by: Sequence[str] | str = DEFAULT_SEQUENCE,
                  stored_as_scd_type: int = 1) -> "DataFrame | ApplyMetrics":
    """Apply a change DataFrame (one micro-batch, or any set of changes) to a table.

    * ``format="memory"``: `target` is a DataFrame (a table this function returned earlier, or a plain table
      for SCD 1) or None for an empty table; returns the new table.
    * ``format="parquet"``: `target` is a directory; the table is rewritten (new files, then swapped in).
    * ``format="delta"``: `target` is a Delta table path. ``engine="delta-rs"`` reads and merges with the
      `deltalake` package (only the files that may hold the batch's keys are read); ``engine="spark"`` merges
      through delta-spark (needs its jars in the session); ``auto`` picks delta-spark when the session has it.

    `keys`: the key columns (default: the replica-identity columns the ``spockwire`` source marks).
    `sequence_by`: the columns ordering changes (default ``("_commit_lsn", "_seq")``).
    `stored_as_scd_type`: 1 -- the latest version per key, plus its sequence columns; 2 -- every version with
    ``_start_*`` / ``_end_*`` validity columns (see :func:`scd2_columns`).

    Path targets return :class:`ApplyMetrics`.
    """
    spark = changes.sparkSession
    plan = _plan(changes, keys, sequence_by, stored_as_scd_type)
    changes = _materialize(changes)
    if format == "memory":
        if target is not None and isinstance(target, str):
            raise TypeError("format='memory' takes a DataFrame (or None) as target")
        store: _Store = _MemoryStore(spark, target, plan)
    elif not isinstance(target, str):
        raise TypeError(f"format={format!r} takes a path as target")
    elif format == "parquet":
        store = _ParquetStore(spark, target, plan)
    elif format == "delta":
        if engine == "auto":
            engine = "spark" if has_delta_spark(spark) else "delta-rs"
        if engine == "spark":
            if not has_delta_spark(spark):
                raise RuntimeError("engine='spark' needs delta-spark in the session: the delta-spark Python "
                                   "package and its jars (spark.jars.packages=io.delta:delta-spark_2.13:<version>, "
                                   "or spark.jars=...)")
            store = _DeltaSparkStore(spark, target, plan)
        elif engine in ("delta-rs", "deltalake"):
            store = _DeltaRsStore(spark, target, plan)
        else:
            raise ValueError(f"unknown Delta engine {engine!r}: use auto, spark or delta-rs")
    else:
        raise ValueError(f"unknown format {format!r}: use delta, parquet or memory")

    metrics = ApplyMetrics()
    truncates, has_preimages = _scan(changes, plan)
    metrics.truncates = len(truncates)
    events = _events(changes, plan)
    touched = events.select(*[_c(k) for k in plan.keys]).distinct().localCheckpoint(eager=True)
    stored, stored_truncates = store.read(touched, metrics)
    all_truncates = _merge_truncates(stored_truncates, truncates)
    known = {pos for pos, _ts in stored_truncates}
    table_cols = store.table_columns(changes)
    inp = _resolver_input(events, stored, plan, table_cols)
    if has_preimages:
        inp = _carry_moved_toast(changes, inp, plan, all_truncates)
    result = _resolve(spark, inp, plan, table_cols, all_truncates)
    return store.write(result, table_cols, truncates, [t for t in truncates if t[0] not in known], metrics)


def apply_to_dataframe(changes: "DataFrame", target: "DataFrame | None" = None,
                       keys: Sequence[str] | None = None, **options: Any) -> "DataFrame":
    """The table after `changes`, starting from `target` (None: an empty table): ``apply_changes`` with
    ``format="memory"``."""
    return apply_changes(changes, target, format="memory", keys=keys, **options)  # type: ignore[return-value]


def _materialize(changes: "DataFrame") -> "DataFrame":
    """Read the changes once: the apply scans them several times, and a micro-batch DataFrame would otherwise
    re-read its source (peek the slot again) for every scan. Also cuts the lineage, which keeps self-joins
    valid whatever the source plan is (a memory sink's table, for one)."""
    return changes.localCheckpoint(eager=True)


def _resolver_input(events: "DataFrame", stored: "DataFrame | None", plan: _Plan,
                    table_cols: list[str]) -> "DataFrame":
    """One DataFrame of events and stored rows with the same columns: keys, kind, op, sequence, commit time,
    SCD 2 end, columns not carried, then every value column of the table (the batch's and the target's)."""
    from pyspark.sql import functions as F

    seq_extra = [c for c in plan.seq if c not in plan.keys and c not in plan.values]
    values = [c for c in table_cols if c not in plan.keys]
    ev_types = dict(events.dtypes)
    st_types = dict(stored.dtypes) if stored is not None else {}
    ev_cols = set(events.columns)

    def typ(c: str) -> str:
        return ev_types.get(c) or st_types[c]

    end_cols = [f"{_END}{c}" for c in plan.seq]
    missing = [v for v in values if v not in ev_cols]
    ev = events.select(
        *[_c(k) for k in plan.keys], _c(_KIND), _c(_OP), *[_c(c) for c in seq_extra], _c(_TS),
        *[F.lit(None).cast(typ(c) if c in ev_types else st_types.get(c, "long")).alias(f"{_END}{c}")
          for c in plan.seq],
        F.lit(None).cast("timestamp").alias(_END_TS),
        (F.concat(_c(_TOAST), F.array(*[F.lit(m) for m in missing])) if missing else _c(_TOAST)).alias(_TOAST),
        *[(_c(v) if v in ev_cols else F.lit(None).cast(typ(v))).alias(v) for v in values])
    if stored is None:
        return ev
    cols = set(stored.columns)
    if plan.scd == 2:
        start, end = plan.start_cols, plan.end_cols
        tomb = (F.col(_STATE_KIND) == "delete") if _STATE_KIND in cols else F.lit(False)
        kind = F.when(tomb, F.lit(1)).otherwise(F.lit(0))
        seq_src = {c: (F.when(tomb, _c(c)).otherwise(_c(start[i])) if c in cols else _c(start[i]))
                   for i, c in enumerate(plan.seq)}
        st = stored.select(
            *[_c(k).cast(typ(k)).alias(k) for k in plan.keys], kind.alias(_KIND),
            F.when(kind == 1, F.lit("delete")).otherwise(F.lit("upsert")).alias(_OP),
            *[seq_src[c].cast(typ(c)).alias(c) for c in seq_extra],
            (F.when(tomb, _c("_commit_ts")).otherwise(_c(start[-1])) if "_commit_ts" in cols
             else _c(start[-1])).cast("timestamp").alias(_TS),
            *[_c(end[i]).cast(ev_types.get(c, "long")).alias(end_cols[i]) for i, c in enumerate(plan.seq)],
            _c(end[-1]).cast("timestamp").alias(_END_TS),
            F.lit(None).cast("array<string>").alias(_TOAST),
            *[(_c(v) if v in cols else F.lit(None)).cast(typ(v)).alias(v) for v in values])
    else:
        kind = F.when(F.col(_STATE_KIND) == "delete", F.lit(1)).otherwise(F.lit(0)) if _STATE_KIND in cols \
            else F.lit(0)
        st = stored.select(
            *[_c(k).cast(typ(k)).alias(k) for k in plan.keys], kind.alias(_KIND),
            F.when(kind == 1, F.lit("delete")).otherwise(F.lit("upsert")).alias(_OP),
            # a table written without sequence columns (older spockwire): its rows are older than any change
            *[(_c(c) if c in cols else F.lit(None)).cast(typ(c)).alias(c) for c in seq_extra],
            F.lit(None).cast("timestamp").alias(_TS),
            *[F.lit(None).cast(ev_types.get(c, "long")).alias(e) for c, e in zip(plan.seq, end_cols)],
            F.lit(None).cast("timestamp").alias(_END_TS), F.lit(None).cast("array<string>").alias(_TOAST),
            *[(_c(v) if v in cols else F.lit(None)).cast(typ(v)).alias(v) for v in values])
    return ev.unionByName(st)


def _out_schema(inp: "DataFrame", plan: _Plan, table_cols: list[str]) -> Any:
    from pyspark.sql import types as T

    types = {f.name: f.dataType for f in inp.schema.fields}
    fields = [T.StructField(c, types[c], True) for c in table_cols]
    if plan.scd == 2:
        seq_types = [types[c] for c in plan.seq]
        start, end = plan.start_cols, plan.end_cols
        for names in (start, end):
            fields += [T.StructField(n, t, True) for n, t in zip(names, seq_types)]
            fields.append(T.StructField(names[-1], T.TimestampType(), True))
    else:
        fields += [T.StructField(c, types[c], True) for c in plan.seq if c not in table_cols]
    fields.append(T.StructField(_OP, T.StringType(), False))
    fields.append(T.StructField(_CHANGED, T.BooleanType(), False))
    return T.StructType(fields)


def _resolve(spark: "SparkSession", inp: "DataFrame", plan: _Plan, table_cols: list[str],
             truncates: list) -> "DataFrame":
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = _out_schema(inp, plan, table_cols)
    values = [c for c in table_cols if c not in plan.keys]
    cfg = {"keys": plan.keys, "seq": plan.seq, "values": values,
           # values travel as row numbers; sequence columns that are table columns too as Python values
           "refs": [v for v in values if v not in plan.seq],
           "control": [c for c in inp.columns if c not in values or c in plan.seq],
           "scd": plan.scd, "end_seq": [f"{_END}{c}" for c in plan.seq], "start_cols": plan.start_cols,
           "end_cols": plan.end_cols, "truncates": list(truncates),
           "out_schema": to_arrow_schema(schema, timezone="UTC")}
    parts = max(1, spark.sparkContext.defaultParallelism)
    ordered = inp.repartition(parts, *[_c(k) for k in plan.keys]).sortWithinPartitions(
        *[_c(k) for k in plan.keys], *[_c(c) for c in plan.seq], _c(_KIND))
    return ordered.mapInArrow(lambda it: _resolve_partition(it, cfg), schema).localCheckpoint(eager=True)


def _carry_moved_toast(changes: "DataFrame", inp: "DataFrame", plan: _Plan, truncates: list) -> "DataFrame":
    """Fill the unchanged TOASTed columns of postimages whose key changed, from the old key's version.

    PostgreSQL marks such a column unchanged although the row moved to another key; its value is the old key's
    version just before the update (stored or from the batch; a chain of key updates resolves in sequence
    order). Rare, so resolved on the driver over the keys involved only."""
    from pyspark.sql import functions as F

    if not plan.has_toast or not {"_commit_lsn", "_seq"} <= set(changes.columns):
        return inp
    pre = changes.filter(F.col("_change_type") == "update_preimage").select(
        F.col("_commit_lsn").alias("_m_lsn"), (F.col("_seq") + 1).alias("_m_seq"),
        *[_c(k).alias(f"_o_{i}") for i, k in enumerate(plan.keys)],
        *[_c(c).alias(f"_mp_{i}") for i, c in enumerate(plan.seq)])
    differs = None
    for i, k in enumerate(plan.keys):
        d = ~_c(k).eqNullSafe(F.col(f"_o_{i}"))
        differs = d if differs is None else differs | d
    moves = (changes.filter((F.col("_change_type") == "update_postimage") & (F.size("_unchanged_toast") > 0))
             .join(pre, (F.col("_commit_lsn") == F.col("_m_lsn")) & (F.col("_seq") == F.col("_m_seq")))
             .filter(differs).select(*[_c(c) for c in plan.seq], *[F.col(f"_o_{i}") for i in range(len(plan.keys))],
                                     *[F.col(f"_mp_{i}") for i in range(len(plan.seq))],
                                     *[_c(k) for k in plan.keys]).collect())
    if not moves:
        return inp
    # the keys whose versions are needed: old keys of moves, and (for chains) the keys they moved from
    olds = {tuple(m[f"_o_{i}"] for i in range(len(plan.keys))) for m in moves}
    cond = None
    for key in olds:
        eq = None
        for k, v in zip(plan.keys, key):
            e = _c(k).eqNullSafe(F.lit(v))
            eq = e if eq is None else eq & e
        cond = eq if cond is None else cond | eq
    involved = [r.asDict() for r in inp.filter(cond).collect()]
    by_key: dict[tuple, list[dict]] = {}
    for r in involved:
        by_key.setdefault(tuple(r[k] for k in plan.keys), []).append(r)
    values = [c for c in inp.columns if c not in plan.keys and not c.startswith("_sw_") and c not in plan.seq]
    cfg = {"seq": plan.seq, "values": values, "scd": 1, "end_seq": [f"{_END}{c}" for c in plan.seq]}
    fixes: list[dict] = []
    for m in sorted(moves, key=lambda m: _sk(tuple(m[c] for c in plan.seq))):
        pos = tuple(m[c] for c in plan.seq)
        old = tuple(m[f"_o_{i}"] for i in range(len(plan.keys)))
        prepos = _sk(tuple(m[f"_mp_{i}"] for i in range(len(plan.seq))))  # the old key's end
        before = [r for r in by_key.get(old, []) if _sk(tuple(r[c] for c in plan.seq)) < prepos]
        state = _fold(before, [t for t in truncates if _sk(t[0]) < prepos], cfg)
        new_key = tuple(m[k] for k in plan.keys)
        mine = [r for r in by_key.get(new_key, []) if r[_KIND] == 2 and tuple(r[c] for c in plan.seq) == pos]
        if not state or state[0][_OP] != "upsert":
            continue
        fix = {c: m[c] for c in plan.seq}
        for r in (mine or [None]):
            toast = list(r[_TOAST]) if r is not None else None
            fix["_fx_values"] = {v: state[0][v] for v in values}
            fix["_fx_toast"] = toast
            if r is not None:  # a chain: the next move reads this postimage with its values filled
                for v in toast or ():
                    r[v] = state[0][v]
                r[_TOAST] = []
        fixes.append(fix)
    if not fixes:
        return inp
    # replace the moved postimages' carried columns: their values from the old key, nothing left to carry
    spark = inp.sparkSession
    vtypes = dict(inp.dtypes)
    rows = [tuple([f[c] for c in plan.seq] + [f["_fx_values"][v] for v in values]) for f in fixes]
    schema = ", ".join([f"`{c}` {vtypes[c]}" for c in plan.seq] + [f"`_fx_{i}` {vtypes[v]}"
                                                                   for i, v in enumerate(values)])
    fx = F.broadcast(spark.createDataFrame(rows, schema).withColumn("_fx_hit", F.lit(True)))
    joined = inp.join(fx, [*plan.seq], "left")
    hit = F.col("_fx_hit").isNotNull() & (F.col(_KIND) == 2) & (F.col(_OP) == "upsert")
    cols = []
    for c in inp.columns:
        if c in values:
            i = values.index(c)
            cols.append(F.when(hit & F.array_contains(_c(_TOAST), c), F.col(f"_fx_{i}")).otherwise(_c(c)).alias(c))
        elif c == _TOAST:
            cols.append(F.when(hit, F.array().cast("array<string>")).otherwise(_c(_TOAST)).alias(c))
        else:
            cols.append(_c(c))
    return joined.select(*cols)


# ---------------------------------------------------------------------------------------------------------------
# targets

def _pos_gt(cols: Sequence[str], pos: tuple, less: bool = False) -> Any:
    """The row's sequence (cols) is after `pos` (lexicographic; `less`: before it)."""
    from pyspark.sql import functions as F

    cond = None
    for i in range(len(cols) - 1, -1, -1):
        here = (_c(cols[i]) < F.lit(pos[i])) if less else (_c(cols[i]) > F.lit(pos[i]))
        if cond is not None:
            here = here | ((_c(cols[i]) == F.lit(pos[i])) & cond)
        cond = here
    return cond


def _sql_literal(v: Any) -> str:
    import datetime as dt
    import decimal

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, decimal.Decimal)):
        return str(v)
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
        return f"TIMESTAMP '{v.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(sep=' ')}Z'"
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'"
    return "'" + str(v).replace("'", "''") + "'"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_pos_cmp(cols: Sequence[str], pos: tuple, op: str, quote: Any = _q) -> str:
    """SQL: the row's sequence (cols) compares with `pos` by `op` ("<" or ">"), lexicographically."""
    expr = None
    for i in range(len(cols) - 1, -1, -1):
        here = f"{quote(cols[i])} {op} {_sql_literal(pos[i])}"
        if expr is not None:
            here = f"({here} OR ({quote(cols[i])} = {_sql_literal(pos[i])} AND {expr}))"
        expr = here
    return expr or "false"


def _sql_pos_lt(cols: Sequence[str], pos: tuple, quote: Any = _q) -> str:
    """SQL: the row's sequence (cols) is before `pos`."""
    return _sql_pos_cmp(cols, pos, "<", quote)


def _sql_pos_gt(cols: Sequence[str], pos: tuple, quote: Any = _q) -> str:
    """SQL: the row's sequence (cols) is after `pos`."""
    return _sql_pos_cmp(cols, pos, ">", quote)


class _Store:
    """A target: reads the stored state of the touched keys, writes the resolved rows."""

    def __init__(self, spark: "SparkSession", target: Any, plan: _Plan) -> None:
        self.spark = spark
        self.target = target
        self.plan = plan

    def existing_columns(self) -> list[str] | None:
        raise NotImplementedError

    def table_columns(self, changes: "DataFrame") -> list[str]:
        """The table's columns after this batch: the target's (bookkeeping excluded), then new ones."""
        plan = self.plan
        batch = plan.keys + [v for v in value_columns(changes) if v not in plan.keys]
        existing = self.existing_columns()
        if not existing:
            return batch
        book = set(plan.bookkeeping()) | {_STATE_KIND}
        cols = [c for c in existing if c not in book]
        return cols + [c for c in batch if c not in cols]

    def read(self, touched: "DataFrame", metrics: ApplyMetrics) -> tuple["DataFrame | None", list]:
        raise NotImplementedError

    def write(self, result: "DataFrame", table_cols: list[str], truncates: list, new_truncates: list,
              metrics: ApplyMetrics) -> Any:
        raise NotImplementedError

    # shared by the rewriting stores (memory, Parquet)
    def _semi(self, df: "DataFrame", touched: "DataFrame") -> "DataFrame":
        return df.join(touched, [*self.plan.keys], "left_semi") if len(self.plan.keys) else df

    def _rewrite(self, table: "DataFrame | None", result: "DataFrame", table_cols: list[str],
                 truncates: list) -> "DataFrame":
        """The new table: untouched stored rows (with the batch's truncates applied) and the resolved rows."""
        from pyspark.sql import functions as F

        plan = self.plan
        book = plan.bookkeeping()
        cols = table_cols + book
        fresh = result.filter(F.col(_OP) == ("upsert" if plan.scd == 1 else "version"))
        fresh = fresh.select(*[_c(c) for c in cols])
        if table is None:
            return fresh
        rest = table.join(result.select(*[_c(k) for k in plan.keys]).distinct(), [*plan.keys], "left_anti")
        if plan.scd == 1:
            for pos, _ts in truncates:
                rest = rest.filter(_pos_gt(plan.seq, pos))
        else:
            start, end = plan.start_cols, plan.end_cols
            for pos, ts in truncates:
                alive = _pos_gt(start[:-1], pos, less=True) & (_c(end[0]).isNull() | _pos_gt(end[:-1], pos))
                rest = rest.select(*[
                    (F.when(alive, F.lit(pos[end.index(c)]).cast(dict(rest.dtypes)[c]) if c != end[-1]
                            else F.lit(ts).cast("timestamp")).otherwise(_c(c)) if c in end else _c(c)).alias(c)
                    for c in rest.columns])
        have = set(rest.columns)
        types = dict(fresh.dtypes)
        rest = rest.select(*[(_c(c) if c in have else F.lit(None)).cast(types[c]).alias(c) for c in cols])
        return rest.unionByName(fresh)


class _MemoryStore(_Store):
    def existing_columns(self) -> list[str] | None:
        return None if self.target is None else list(self.target.columns)

    def read(self, touched: "DataFrame", metrics: ApplyMetrics) -> tuple["DataFrame | None", list]:
        if self.target is None:
            return None, []
        table = self.target
        if self.plan.scd == 1:
            from pyspark.sql import functions as F

            missing = [c for c in self.plan.seq if c not in table.columns]
            if missing:  # a plain table (no sequence yet): every stored row is older than any change
                table = table.select("*", *[F.lit(None).cast("long").alias(c) for c in missing])
                self.target = table
        return self._semi(table, touched), []

    def write(self, result: "DataFrame", table_cols: list[str], truncates: list, new_truncates: list,
              metrics: ApplyMetrics) -> "DataFrame":
        return self._rewrite(self.target, result, table_cols, truncates)


class _ParquetStore(_Store):
    def __init__(self, spark: "SparkSession", target: str, plan: _Plan) -> None:
        super().__init__(spark, target, plan)
        if target.startswith(("s3:", "s3a:", "gs:", "abfs:", "abfss:", "hdfs:", "dbfs:")):
            raise NotImplementedError("format='parquet' rewrites local or shared-filesystem paths only; use Delta")
        self.path = target[len("file:"):] if target.startswith("file:") else target
        self.table = self.spark.read.parquet(self.path) if _has_parquet(self.path, top=True) else None
        state = os.path.join(self.path, STATE_DIR)
        self.state = self.spark.read.parquet(state) if _has_parquet(state) else None

    def existing_columns(self) -> list[str] | None:
        return None if self.table is None else list(self.table.columns)

    def read(self, touched: "DataFrame", metrics: ApplyMetrics) -> tuple["DataFrame | None", list]:
        from pyspark.sql import functions as F

        truncates: list = []
        parts = []
        if self.table is not None:
            parts.append(self._semi(self.table, touched))
        if self.state is not None:
            truncates = [(tuple(r[c] for c in self.plan.seq), r["_commit_ts"])
                         for r in self.state.filter(F.col(_STATE_KIND) == "truncate").collect()]
            parts.append(self._semi(self.state.filter(F.col(_STATE_KIND) == "delete"), touched))
        if not parts:
            return None, truncates
        stored = parts[0]
        for p in parts[1:]:
            stored = stored.unionByName(p, allowMissingColumns=True)
        return stored, truncates

    def write(self, result: "DataFrame", table_cols: list[str], truncates: list, new_truncates: list,
              metrics: ApplyMetrics) -> ApplyMetrics:
        from pyspark.sql import functions as F

        plan = self.plan
        table = self.table
        if table is not None and plan.scd == 1:
            missing = [c for c in plan.seq if c not in table.columns]
            if missing:
                table = table.select("*", *[F.lit(None).cast("long").alias(c) for c in missing])
        new = self._rewrite(table, result, table_cols, truncates)
        tmp = f"{self.path.rstrip('/')}.spockwire-{uuid.uuid4().hex[:8]}"
        new.write.mode("overwrite").parquet(tmp)
        state = _state_rows(self.spark, result, plan, truncates, self.state)
        if state is not None:
            state.write.mode("overwrite").parquet(os.path.join(tmp, STATE_DIR))
        old = None
        if os.path.exists(self.path):
            old = f"{tmp}.old"
            os.rename(self.path, old)
        os.rename(tmp, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return metrics


def _state_rows(spark: "SparkSession", result: "DataFrame", plan: _Plan, truncates: list,
                stored: "DataFrame | None") -> "DataFrame | None":
    """The whole state after the batch (Parquet): tombstones (SCD 1) and truncates."""
    from pyspark.sql import functions as F

    types = dict(result.dtypes)
    seq_types = {c: types.get(c) or types[plan.start_cols[plan.seq.index(c)]] for c in plan.seq}
    cols = [_STATE_KIND, *plan.keys, *plan.seq, "_commit_ts"]
    pos_cols = plan.seq if plan.scd == 1 else plan.start_cols[:-1]
    ts = F.lit(None).cast("timestamp") if plan.scd == 1 else _c(plan.start_cols[-1])
    parts = [result.filter(F.col(_OP) == "delete").select(
        F.lit("delete").alias(_STATE_KIND), *[_c(k) for k in plan.keys],
        *[_c(p).alias(c) for p, c in zip(pos_cols, plan.seq)], ts.alias("_commit_ts"))]
    if truncates:
        rows = [("truncate", *[None] * len(plan.keys), *pos, ts) for pos, ts in truncates]
        schema = ", ".join([f"`{_STATE_KIND}` string", *[f"`{k}` {types[k]}" for k in plan.keys],
                            *[f"`{c}` {seq_types[c]}" for c in plan.seq], "`_commit_ts` timestamp"])
        parts.append(spark.createDataFrame(rows, schema))
    if stored is not None:
        keep = stored
        if plan.scd == 1:
            keep = keep.join(result.select(*[_c(k) for k in plan.keys]), [*plan.keys], "left_anti") \
                .unionByName(stored.filter(F.col(_STATE_KIND) == "truncate")).distinct()
        parts.append(keep.select(*[_c(c) for c in cols]))
    if not parts:
        return None
    out = parts[0].select(*[_c(c) for c in cols])
    for p in parts[1:]:
        out = out.unionByName(p.select(*[_c(c).cast(dict(out.dtypes)[c]) for c in cols]))
    return out.dropDuplicates()


def _has_parquet(path: str, top: bool = False) -> bool:
    if not os.path.isdir(path):
        return False
    for root, dirs, files in os.walk(path):
        if top:
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        if any(f.endswith(".parquet") for f in files):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Delta through delta-rs

def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover
        raise ImportError("format='delta' without delta-spark needs the deltalake package "
                          "(pip install deltalake)") from exc
    return deltalake


def _open_delta(path: str) -> Any:
    DeltaTable = _deltalake().DeltaTable
    try:
        return DeltaTable(path)
    except Exception:  # noqa: BLE001 - deltalake raises TableNotFoundError (the name differs across versions)
        return None


_PRUNABLE = (int, float, str)


def _key_pruning(keys: Sequence[str], touched: Any, max_in: int = 512) -> list | None:
    """delta-rs file pruning for the touched keys: per key column its range, and the values themselves when
    few (files whose min/max statistics cannot hold any of them are not read)."""
    import datetime as dt

    import pyarrow.compute as pc

    if touched.num_rows == 0:
        return None
    filters: list = []
    for k in keys:
        col = touched.column(k)
        mm = pc.min_max(col).as_py()
        lo, hi = mm["min"], mm["max"]
        if lo is None or not isinstance(lo, (*_PRUNABLE, dt.date)) or isinstance(lo, bool):
            continue
        if len(keys) == 1 and touched.num_rows <= max_in:
            filters.append((k, "in", sorted(set(col.to_pylist()) - {None})))
        else:
            filters += [(k, ">=", lo), (k, "<=", hi)]
    return filters or None


def _read_keys(dt: Any, keys: Sequence[str], touched: Any) -> tuple[Any, int, int]:
    """The rows of `dt` whose key is in `touched`, reading only the files that may hold them.
    Returns (rows, files read, files in the table)."""
    import pyarrow.compute as pc

    total = len(dt.file_uris())
    pruning = _key_pruning(keys, touched)
    ds = dt.to_pyarrow_dataset(file_pruning_predicate=pruning)
    files = len(ds.files)
    expr = None
    for k in keys:
        vals = touched.column(k).drop_null()
        if len(vals) == 0:
            continue
        e = pc.field(k).isin(vals)
        expr = e if expr is None else expr & e
    table = ds.to_table(filter=expr) if expr is not None else ds.to_table()
    if len(keys) > 1 and table.num_rows:
        table = table.join(touched.select(list(keys)), list(keys), join_type="left semi")
    return table, files, total


def _arrow(df: "DataFrame") -> Any:
    return df.toArrow()


class _DeltaRsStore(_Store):
    def __init__(self, spark: "SparkSession", target: str, plan: _Plan) -> None:
        super().__init__(spark, target, plan)
        self.dt = _open_delta(target)
        self.state_path = os.path.join(target, STATE_DIR)
        self.state = _open_delta(self.state_path)

    def existing_columns(self) -> list[str] | None:
        if self.dt is None:
            return None
        return [f.name for f in self.dt.schema().fields]

    def read(self, touched: "DataFrame", metrics: ApplyMetrics) -> tuple["DataFrame | None", list]:
        import pyarrow as pa
        import pyarrow.compute as pc

        truncates: list = []
        keys = _arrow(touched)
        metrics.keys_touched = keys.num_rows
        parts = []
        if self.dt is not None:
            rows, files, total = _read_keys(self.dt, self.plan.keys, keys)
            metrics.files_read, metrics.files_in_table = files, total
            parts.append(rows)
        if self.state is not None:
            ds = self.state.to_pyarrow_dataset()
            for r in ds.to_table(filter=pc.field(_STATE_KIND) == "truncate").to_pylist():
                truncates.append((tuple(r[c] for c in self.plan.seq), r["_commit_ts"]))
            tombs, _f, _t = _read_keys(self.state, self.plan.keys, keys)
            parts.append(tombs.filter(pc.field(_STATE_KIND) == "delete"))
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return None, truncates
        metrics.stored_rows_read = sum(p.num_rows for p in parts)
        stored = pa.concat_tables(parts, promote_options="permissive")
        return self.spark.createDataFrame(stored).localCheckpoint(eager=True), truncates

    def write(self, result: "DataFrame", table_cols: list[str], truncates: list, new_truncates: list,
              metrics: ApplyMetrics) -> ApplyMetrics:
        import pyarrow as pa

        dl = _deltalake()
        plan = self.plan
        from pyspark.sql import functions as F

        changed = _arrow(result.filter(F.col(_CHANGED)))
        metrics.rows_written = changed.num_rows
        # 1. state first (tombstones, truncates): a batch retried after a failure in between finds them and
        #    resolves the same rows again
        self._write_state(changed, new_truncates)
        book = plan.bookkeeping()
        cols = table_cols + book
        if self.dt is None:
            rows = changed.filter(pa.compute.equal(changed.column(_OP), "upsert" if plan.scd == 1 else "version"))
            dl.write_deltalake(self.target, rows.select(cols), mode="append")
            return metrics
        # 2. the batch's truncates, on the keys it did not touch
        for pos, ts in truncates:
            if plan.scd == 1:
                self.dt.delete(_sql_pos_lt(plan.seq, pos))
            else:
                start, end = plan.start_cols, plan.end_cols
                alive = f"{_sql_pos_lt(start[:-1], pos)} AND ({_q(end[0])} IS NULL OR {_sql_pos_gt(end[:-1], pos)})"
                updates = {_q(c): _sql_literal(p) for c, p in zip(end[:-1], pos)}
                updates[_q(end[-1])] = _sql_literal(ts) if ts is not None else "NULL"
                self.dt.update(updates=updates, predicate=alive)
        if changed.num_rows == 0:
            return metrics
        # 3. the changed rows of the touched keys
        on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in plan.keys)
        if plan.scd == 1:
            source = changed.select(cols + [_OP])
            merge = (self.dt.merge(source, on, source_alias="s", target_alias="t", merge_schema=True)
                     .when_matched_delete(predicate=f"s.{_OP} = 'delete'")
                     .when_matched_update_all(predicate=f"s.{_OP} = 'upsert'", except_cols=[_OP])
                     .when_not_matched_insert_all(predicate=f"s.{_OP} = 'upsert'", except_cols=[_OP]))
        else:
            on += "".join(f" AND t.{_q(c)} = s.{_q(c)}" for c in plan.start_cols[:-1])
            versions = changed.filter(pa.compute.equal(changed.column(_OP), "version"))
            if versions.num_rows == 0:
                return metrics
            merge = (self.dt.merge(versions.select(cols), on, source_alias="s", target_alias="t", merge_schema=True)
                     .when_matched_update_all().when_not_matched_insert_all())
        metrics.merge = merge.execute()
        return metrics

    def _write_state(self, changed: Any, new_truncates: list) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        dl = _deltalake()
        plan = self.plan
        parts = []
        pos_cols = plan.seq if plan.scd == 1 else plan.start_cols[:-1]
        seq_types = {c: changed.schema.field(p).type for c, p in zip(plan.seq, pos_cols)}
        tombs = changed.filter(pc.equal(changed.column(_OP), "delete"))
        if tombs.num_rows:
            parts.append(pa.table(
                {_STATE_KIND: pa.array(["delete"] * tombs.num_rows, pa.string()),
                 **{k: tombs.column(k) for k in plan.keys}, **{c: tombs.column(p) for c, p in zip(plan.seq, pos_cols)},
                 "_commit_ts": (pa.nulls(tombs.num_rows, pa.timestamp("us", tz="UTC")) if plan.scd == 1
                                else tombs.column(plan.start_cols[-1]).cast(pa.timestamp("us", tz="UTC")))}))
        if new_truncates:
            n = len(new_truncates)
            parts.append(pa.table(
                {_STATE_KIND: pa.array(["truncate"] * n, pa.string()),
                 **{k: pa.nulls(n, changed.schema.field(k).type) for k in plan.keys},
                 **{c: pa.array([p[i] for p, _ in new_truncates], seq_types[c]) for i, c in enumerate(plan.seq)},
                 "_commit_ts": pa.array([t for _, t in new_truncates], pa.timestamp("us", tz="UTC"))}))
        if not parts:
            return
        rows = pa.concat_tables(parts)
        if self.state is None:
            dl.write_deltalake(self.state_path, rows, mode="append")
            return
        tombs = rows.filter(pc.equal(rows.column(_STATE_KIND), "delete"))
        if tombs.num_rows:
            # SCD 1: one tombstone per key (the latest); SCD 2: every delete
            on = f"t.{_STATE_KIND} = 'delete' AND " + " AND ".join(
                [f"t.{_q(k)} = s.{_q(k)}" for k in plan.keys]
                + ([f"t.{_q(c)} = s.{_q(c)}" for c in plan.seq] if plan.scd == 2 else []))
            (self.state.merge(tombs, on, source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        truncs = rows.filter(pc.equal(rows.column(_STATE_KIND), "truncate"))
        if truncs.num_rows:
            dl.write_deltalake(self.state, truncs, mode="append")


# ---------------------------------------------------------------------------------------------------------------
# Delta through delta-spark (a cluster with the Delta jars)

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


def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _DeltaSparkStore(_Store):
    """The same resolution, written with delta-spark's MERGE (the table's and the state's)."""

    def __init__(self, spark: "SparkSession", target: str, plan: _Plan) -> None:
        super().__init__(spark, target, plan)
        from delta.tables import DeltaTable  # noqa: F811 - the delta-spark class

        self.DeltaTable = DeltaTable
        self.state_path = target.rstrip("/") + "/" + STATE_DIR
        self.exists = DeltaTable.isDeltaTable(spark, target)
        self.state_exists = DeltaTable.isDeltaTable(spark, self.state_path)

    def existing_columns(self) -> list[str] | None:
        return self.spark.read.format("delta").load(self.target).columns if self.exists else None

    def read(self, touched: "DataFrame", metrics: ApplyMetrics) -> tuple["DataFrame | None", list]:
        from pyspark.sql import functions as F

        parts = []
        truncates: list = []
        if self.exists:
            parts.append(self._semi(self.spark.read.format("delta").load(self.target), touched))
        if self.state_exists:
            state = self.spark.read.format("delta").load(self.state_path)
            truncates = [(tuple(r[c] for c in self.plan.seq), r["_commit_ts"])
                         for r in state.filter(F.col(_STATE_KIND) == "truncate").collect()]
            parts.append(self._semi(state.filter(F.col(_STATE_KIND) == "delete"), touched))
        if not parts:
            return None, truncates
        stored = parts[0]
        for p in parts[1:]:
            stored = stored.unionByName(p, allowMissingColumns=True)
        stored = stored.localCheckpoint(eager=True)
        metrics.stored_rows_read = stored.count()
        return stored, truncates

    def write(self, result: "DataFrame", table_cols: list[str], truncates: list, new_truncates: list,
              metrics: ApplyMetrics) -> ApplyMetrics:
        from pyspark.sql import functions as F

        plan = self.plan
        changed = result.filter(F.col(_CHANGED)).localCheckpoint(eager=True)
        metrics.rows_written = changed.count()
        state = _state_rows(self.spark, changed, plan, new_truncates, None)
        if state is not None:
            if not self.state_exists:
                state.write.format("delta").mode("append").save(self.state_path)
            else:
                same_pos = " AND ".join(f"t.{_bq(c)} = s.{_bq(c)}" for c in plan.seq)
                on = (f"t.{_STATE_KIND} = s.{_STATE_KIND} AND " + " AND ".join(
                    [f"t.{_bq(k)} <=> s.{_bq(k)}" for k in plan.keys]
                    + [f"(s.{_STATE_KIND} = 'delete' OR {same_pos})" if plan.scd == 1 else f"({same_pos})"]))
                (self.DeltaTable.forPath(self.spark, self.state_path).alias("t").merge(state.alias("s"), on)
                 .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        cols = table_cols + plan.bookkeeping()
        if not self.exists:
            rows = changed.filter(F.col(_OP) == ("upsert" if plan.scd == 1 else "version"))
            rows.select(*[_c(c) for c in cols]).write.format("delta").mode("append").save(self.target)
            return metrics
        table = self.DeltaTable.forPath(self.spark, self.target)
        for pos, ts in truncates:
            if plan.scd == 1:
                table.delete(_sql_pos_lt(plan.seq, pos, _bq))
            else:
                start, end = plan.start_cols, plan.end_cols
                alive = f"{_sql_pos_lt(start[:-1], pos, _bq)} AND ({_bq(end[0])} IS NULL OR " \
                        f"{_sql_pos_gt(end[:-1], pos, _bq)})"
                ends = {c: F.lit(p) for c, p in zip(end[:-1], pos)}
                ends[end[-1]] = F.lit(ts).cast("timestamp")
                table.update(condition=alive, set=ends)
        on = " AND ".join(f"t.{_bq(k)} <=> s.{_bq(k)}" for k in plan.keys)
        sets = {c: f"s.{_bq(c)}" for c in cols}

        def merge(source: "DataFrame", cond: str) -> Any:
            builder = table.alias("t").merge(source.alias("s"), cond)
            # columns added upstream: MERGE's schema evolution (delta-spark 3.2+)
            return builder.withSchemaEvolution() if hasattr(builder, "withSchemaEvolution") else builder

        if plan.scd == 1:
            (merge(changed, on)
             .whenMatchedDelete(condition=f"s.{_OP} = 'delete'")
             .whenMatchedUpdate(condition=f"s.{_OP} = 'upsert'", set=sets)
             .whenNotMatchedInsert(condition=f"s.{_OP} = 'upsert'", values=sets).execute())
        else:
            on += "".join(f" AND t.{_bq(c)} = s.{_bq(c)}" for c in plan.start_cols[:-1])
            (merge(changed.filter(F.col(_OP) == "version"), on)
             .whenMatchedUpdate(set=sets).whenNotMatchedInsert(values=sets).execute())
        return metrics
