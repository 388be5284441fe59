"""A Delta table as the target of `apply_changes`, through delta-rs (the `deltalake` package).

Per batch: the stored rows of the touched keys are read from the files whose statistics may hold them (keys
first, full rows only of the keys found), the state table ``_spockwire_state`` gives the keys' remembered deletes
and the truncates; :func:`spockwire.spark.resolve.resolve` decides the rows to write. Then at most two commits, one
on each table:

1. the state (only when the batch deletes or truncates): its tombstones and truncates appended -- first, so a
   batch retried after a failure in between finds them and resolves the same rows again;
2. the table: an append when every resolved row is a new key's (a snapshot, an insert-only stream: no file is
   read or rewritten), a rewrite of the files holding the batch's keys, or one MERGE; a batch holding truncates is
   one overwrite commit of the rows the truncates leave, closed or not, and the batch's rows.

With an idempotence token ``(application id, version)`` the table's commit carries it as a Delta transaction
action (``txn``, as Spark's own Delta sink does); a batch whose version the table already holds is skipped whole.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import time
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_target import (COLLECTED, STATE_KIND, collected_position, key_values, keys_in, state_rows,
                           truncate_positions, truncated, unify)
from .delta_rewrite import (FILE_COLUMN, StoredFiles, append_files, arrow_schema, exact_values, file_sizes,
                            keep_stats_exact, local_root, plain_type, rewritable, rewrite_files, rewrite_supported,
                            stats_configuration)
from .file_rows import file_rows, keep_table, open_table
from .resolve import DELETE, OP, UPSERT, Plan, Resolution, Stored

__all__ = ["DeltaTarget", "STATE_DIR", "delta_dataset", "deltalake_module", "open_delta"]

#: the directory, inside a Parquet or Delta target, holding its tombstones and truncates
STATE_DIR = "_spockwire_state"
_PRUNABLE = (int, float, str, _dt.date)


def deltalake_module() -> Any:
    try:
        import deltalake
    except ImportError as exc:  # pragma: no cover
        raise ImportError("format='delta' without delta-spark needs the deltalake package "
                          "(pip install deltalake)") from exc
    return deltalake


def open_delta(path: str) -> Any:
    """The Delta table at `path`, or None when there is none."""
    DeltaTable = deltalake_module().DeltaTable
    try:
        return DeltaTable(path)
    except Exception:  # noqa: BLE001 - deltalake raises TableNotFoundError (the name differs across versions)
        return None


def delta_dataset(dt: Any, predicate: Any = None) -> Any:
    """The data files of `dt` (those its statistics leave for `predicate`: delta-rs's file pruning) as a pyarrow
    dataset whose files carry their partition values only. deltalake attaches each file's min/max to it as a
    guarantee that pyarrow simplifies filters with: where the statistics hold no bound for a column, the guarantee
    (``column >= null``) makes pyarrow skip the file's rows for any filter on that column, and a string column
    delta-rs wrote as string_view cannot be compared with it at all."""
    import pyarrow.dataset as pds

    ds = dt.to_pyarrow_dataset(file_pruning_predicate=predicate)
    parts = _partition_expressions(dt) if dt.metadata().partition_columns else {}
    frags = [ds.format.make_fragment(f.path, filesystem=ds.filesystem, partition_expression=parts.get(f.path))
             for f in ds.get_fragments()]
    return pds.FileSystemDataset(frags, ds.schema, ds.format, ds.filesystem)


def _partition_expressions(dt: Any) -> dict[str, Any]:
    """Each data file's partition values as a dataset expression (what the file's rows hold in those columns)."""
    adds = pa.table(dt.get_add_actions(flatten=True))
    types = {f.name: f.type for f in pa.schema(dt.schema().to_arrow())}
    out: dict[str, Any] = {}
    for i, path in enumerate(adds.column("path").to_pylist()):
        expr = None
        for c in dt.metadata().partition_columns:
            value = adds.column(f"partition.{c}")[i]
            e = pc.field(c).is_null() if not value.is_valid else pc.field(c) == value.cast(plain_type(types[c]))
            expr = e if expr is None else expr & e
        out[path] = expr
    return out


def _key_pruning(keys: Sequence[str], touched: pa.Table, max_in: int = 512) -> list | None:
    """delta-rs file pruning for the touched keys: per key column its range, and the values themselves when
    few (files whose min/max statistics cannot hold any of them are not read). Not by a column holding a value
    the filters cannot name (`_nameable`)."""
    if touched.num_rows == 0:
        return None
    filters: list = []
    for k in keys:
        col = touched.column(k)
        if col.null_count or not _nameable(col):     # a NULL key: in files without bounds for the column too
            continue
        mm = pc.min_max(col).as_py()
        lo, hi = mm["min"], mm["max"]
        if lo is None or not isinstance(lo, _PRUNABLE) or isinstance(lo, bool):
            continue
        if len(keys) == 1 and touched.num_rows <= max_in:
            filters.append((k, "in", sorted(set(col.to_pylist()) - {None})))
        else:
            filters += [(k, ">=", lo), (k, "<=", hi)]
    return filters or None


def _nameable(col: Any) -> bool:
    """Whether delta-rs's file pruning names every value of a key column exactly: not NaN, an infinite float, a
    date or timestamp outside years 1 to 9999 (±infinity included: no Python value; the files holding such values
    have no bounds for the column anyway), not an empty string (a filter's value is written as a partition value,
    where an empty string is NULL)."""
    if not exact_values(col):
        return False
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return not pc.any(pc.equal(col, "")).as_py()
    return True


def _key_filter(keys: Sequence[str], touched: pa.Table) -> Any:
    """A dataset filter: the row's key is among the touched keys' values (per column; NaN matching NaN, NULL
    matching NULL)."""
    expr = None
    for k in keys:
        col = touched.column(k)
        vals = key_values(col)
        if len(vals) == 0 and col.null_count == 0:
            continue
        e = pc.field(k).isin(vals)
        if col.null_count:
            e = e | pc.field(k).is_null()
        if pa.types.is_floating(vals.type) and pc.any(pc.is_nan(vals)).as_py():
            # Parquet's statistics leave NaN out: a value set of NaN alone would skip the row group holding it
            e = e | pc.is_nan(pc.field(k))
        expr = e if expr is None else expr & e
    return expr


#: the size of the data files the table is written in (and, as its delta.targetFileSize, what a MERGE rewrites
#: them to): a MERGE rewrites every file holding a matched key, so a micro-batch of one change rewrites one such
#: file rather than the whole table (1,000,000 rows as one file: 1.0-1.8 s for one change; as 8 MiB files: 0.5 s)
TARGET_FILE_BYTES = 8 << 20
#: a checkpoint of the table's log every this many commits (delta.checkpointInterval; delta-rs's default is 100):
#: opening a table, reading its idempotence tokens and listing its files replay the log since the last checkpoint,
#: and a job commits to each table every micro-batch -- at 90 commits past a checkpoint, opening a small table took
#: 91 ms against 2.5 ms at 10
CHECKPOINT_INTERVAL = 10
CHECKPOINT_PROPERTY = "delta.checkpointInterval"
#: above this many touched keys, candidate files are read whole and filtered in memory (a dataset filter with a
#: large value set is evaluated at several times the cost of reading the files)
FILTER_IN_MEMORY_KEYS = 4096


def read_keys(dt: Any, keys: Sequence[str], touched: pa.Table, whole_files: bool = False,
              read_ahead: Any = None) -> tuple[pa.Table, int, int, StoredFiles | None]:
    """The rows of `dt` whose key is in `touched`, reading only the files that may hold them (their statistics).
    Few keys: the key columns first, whole rows only of the keys found; many: the candidate files whole, filtered
    in memory. `whole_files`: also every row of the files read, with the file each came from (for
    `rewrite_files`; not when the log names a file otherwise than the dataset does, such as by an absolute path).
    `read_ahead`: a read_ahead.ReadAhead of the table, used for many keys when its files are the candidates.
    Returns (rows, files read, files in the table, those files or None)."""
    import pyarrow.dataset as pds

    total = len(dt.file_uris())
    ds = delta_dataset(dt, _key_pruning(keys, touched))
    files = len(ds.files)
    sizes = file_sizes(dt) if whole_files else {}
    whole_files = whole_files and set(ds.files) <= set(sizes)
    cols = ds.schema.names
    with_file = cols + [FILE_COLUMN] if whole_files else cols
    held = _held_rows(dt, ds) if whole_files else None
    if touched.num_rows > FILTER_IN_MEMORY_KEYS or held is not None and held.complete:
        rows = read_ahead.rows_for(dt, ds.files) if read_ahead is not None and whole_files else None
        if rows is None:
            rows = held.read(ds) if held is not None else ds.to_table(columns=with_file)
        hit = keys_in(rows, keys, touched)
        found = rows.filter(pa.array(hit)).select(cols)
        return found, files, total, _stored_files(rows, hit, ds.files, sizes) if whole_files else None
    expr = _key_filter(keys, touched)
    key_cols = list(keys) + ([FILE_COLUMN] if whole_files else [])
    found = _scan(ds, key_cols, expr) if expr is not None else ds.to_table(columns=key_cols)
    if len(keys) > 1 and found.num_rows:
        found = found.filter(pa.array(keys_in(found, keys, touched)))
    if whole_files:
        # the files holding a found key, whole: they are rewritten, and their rows of the found keys resolved
        holding = {ds.files[i] for i in pc.unique(found.column(FILE_COLUMN)).to_pylist()}
        frags = [f for f in ds.get_fragments() if f.path in holding]
        sub = pds.FileSystemDataset(frags, ds.schema, ds.format, ds.filesystem)
        whole = held.read(sub) if held is not None else sub.to_table(columns=with_file)
        hit = keys_in(whole, keys, found.select(list(keys)))
        return whole.filter(pa.array(hit)).select(cols), files, total, _stored_files(whole, hit, sub.files, sizes)
    if found.num_rows == 0:
        return ds.schema.empty_table(), files, total, None
    rows = _scan(ds, cols, _key_filter(keys, found))
    if len(keys) > 1:
        rows = rows.filter(pa.array(keys_in(rows, keys, found)))
    return rows, files, total, None


class _HeldRows:
    """The files of a table read whole through file_rows.FileRows: those held taken from memory, the others
    read (side by side) and then held."""

    def __init__(self, root: str, ds: Any, held: Any) -> None:
        self.root = os.path.abspath(root)
        self.cache = held
        self.complete = all(held.get(os.path.join(self.root, f)) is not None for f in ds.files)

    def read(self, ds: Any) -> pa.Table:
        """Every row of `ds`'s files in its schema, with FILE_COLUMN (the index of each row's file in ds.files)."""
        from concurrent.futures import ThreadPoolExecutor

        schema = ds.schema
        frags = list(ds.get_fragments())

        def one(frag: Any) -> pa.Table:
            path = os.path.join(self.root, frag.path)
            rows = self.cache.get(path)
            if rows is None or not rows.schema.equals(schema):
                rows = frag.to_table(schema=schema) if rows is None else unify(rows, schema)
                self.cache.put(path, rows)
            return rows

        with ThreadPoolExecutor(max_workers=min(len(frags), os.cpu_count() or 2) or 1) as pool:
            parts = list(pool.map(one, frags))
        if not parts:
            return schema.empty_table().append_column(FILE_COLUMN, pa.array([], pa.int32()))
        index = pa.array(np.repeat(np.arange(len(parts), dtype=np.int32), [p.num_rows for p in parts]))
        return pa.concat_tables(parts).append_column(FILE_COLUMN, index)


def _held_rows(dt: Any, ds: Any) -> "_HeldRows | None":
    held = file_rows()
    if held is None:
        return None
    try:
        root = local_root(dt)
    except ValueError:
        return None
    return _HeldRows(root, ds, held)


def _scan(ds: Any, columns: list[str], expr: Any) -> pa.Table:
    """The rows of `ds` matching `expr`, in `columns` (which hold the columns `expr` reads). pyarrow cannot test a
    filter on a string column against the Parquet statistics of a file that delta-rs's MERGE wrote the column in
    as string_view: then the columns are read whole and filtered in memory."""
    try:
        return ds.to_table(columns=columns, filter=expr)
    except pa.ArrowNotImplementedError:
        return ds.to_table(columns=columns).filter(expr)


def _stored_files(rows: pa.Table, hit: Any, names: Sequence[str], sizes: dict[str, int]) -> StoredFiles:
    return StoredFiles(rows, hit, list(names), [sizes[n] for n in names])


def target_file_size(dt: Any) -> int:
    """The size the table's data files are written in: its ``delta.targetFileSize``, else TARGET_FILE_BYTES."""
    if dt is None:
        return TARGET_FILE_BYTES
    return int((dt.metadata().configuration or {}).get("delta.targetFileSize") or TARGET_FILE_BYTES)


def created_configuration(rows: pa.Table) -> dict[str, str]:
    """The properties of a table created with `rows`: its file size, its checkpoint interval, its statistics
    columns."""
    return {"delta.targetFileSize": str(TARGET_FILE_BYTES), CHECKPOINT_PROPERTY: str(CHECKPOINT_INTERVAL),
            **stats_configuration(rows)}


def _closed(t: pa.Table, ended: Any, end_cols: Sequence[str], pos: tuple, ts: Any) -> pa.Table:
    """SCD 2 versions `ended` (a row mask) closed at the truncate `pos` (its commit time `ts`)."""
    import numpy as np

    mask = pa.array(np.asarray(ended, dtype=bool))
    if not pc.any(mask).as_py():
        return t
    for c, v in zip(end_cols, (*pos, ts)):
        i = t.schema.get_field_index(c)
        col = t.column(c)
        t = t.set_column(i, t.schema.field(i), pc.if_else(mask, pa.scalar(v, col.type), col))
    return t


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_literal(v: Any) -> str:
    import decimal

    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return f"CAST('{'NaN' if math.isnan(v) else 'Infinity' if v > 0 else '-Infinity'}' AS DOUBLE)"
    if isinstance(v, (int, float, decimal.Decimal)):
        return str(v)
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
        return f"TIMESTAMP '{v.astimezone(_dt.timezone.utc).replace(tzinfo=None).isoformat(sep=' ')}Z'"
    if isinstance(v, _dt.date):
        return f"DATE '{v.isoformat()}'"
    return "'" + str(v).replace("'", "''") + "'"


def _matching(column: str, source: pa.Table) -> str:
    """The MERGE condition of a target row (t) and a source row (s) having the same value in `column`, NULL
    matching NULL as keys compare (an equality join unless the source holds a NULL there)."""
    if source.column(column).null_count:
        return f"(t.{_q(column)} IS NOT DISTINCT FROM s.{_q(column)})"
    return f"t.{_q(column)} = s.{_q(column)}"


class SqlConditions:
    """Conditions as SQL predicates (delta-rs's delete and update), for arrow_target.position_before."""

    def __init__(self, quote: Any = _q) -> None:
        self.quote = quote

    def is_null(self, c: str) -> str:
        return f"{self.quote(c)} IS NULL"

    def not_null(self, c: str) -> str:
        return f"{self.quote(c)} IS NOT NULL"

    def compare(self, c: str, op: str, v: Any) -> str:
        return f"{self.quote(c)} {op} {_sql_literal(v)}"

    @staticmethod
    def false() -> str:
        return "false"

    @staticmethod
    def or_(a: str, b: str) -> str:
        return f"({a} OR {b})"

    @staticmethod
    def and_(a: str, b: str) -> str:
        return f"({a} AND {b})"


class DeltaTarget:
    """One Delta table (and its state table) written through delta-rs."""

    def __init__(self, path: str, plan: Plan, read_ahead: Any = None) -> None:
        self.path = path
        self.plan = plan
        self.read_ahead = read_ahead
        self.dt = open_table(path, open_delta)            # file_rows.py: the table as the last batch left it
        self.state_path = os.path.join(path, STATE_DIR)
        self.state = open_table(self.state_path, open_delta)
        self.known_truncates: set[tuple] = set()
        self.stored_files: StoredFiles | None = None    # the files holding a touched key, when they can be rewritten

    def release(self) -> None:
        """The batch is done with the tables: kept open for the next one (file_rows.keep_table)."""
        keep_table(self.path, self.dt)
        keep_table(self.state_path, self.state)

    def applied(self, token: tuple[str, int] | None) -> bool:
        """Whether the table already holds the batch of this idempotence token."""
        if token is None or self.dt is None:
            return False
        version = self.dt.transaction_version(token[0])
        return version is not None and version >= token[1]

    def columns(self) -> tuple[list[str], dict[str, pa.DataType]]:
        """The table's columns (bookkeeping excluded) and the Arrow type of each."""
        if self.dt is None:
            return [], {}
        schema = pa.schema(self.dt.schema().to_arrow())
        book = set(self.plan.bookkeeping()) | {STATE_KIND}
        cols = [f.name for f in schema if f.name not in book]
        return cols, {f.name: plain_type(f.type) for f in schema}

    def stored(self, touched: pa.Table, metrics: Any) -> Stored:
        plan = self.plan
        rows = tombs = None
        if self.dt is not None:
            rows, metrics.files_read, metrics.files_in_table, self.stored_files = read_keys(
                self.dt, plan.keys, touched, whole_files=rewritable(self.dt), read_ahead=self.read_ahead)
        truncates: list = []
        collected = None
        if self.state is not None:
            ds = delta_dataset(self.state)
            marks = ds.to_table(filter=pc.field(STATE_KIND).isin(["truncate", COLLECTED]))
            truncates = truncate_positions(marks, plan)
            collected = collected_position(marks, plan)
            dels = pc.field(STATE_KIND) == "delete"
            if touched.num_rows > FILTER_IN_MEMORY_KEYS:     # a large value set costs more as a scan filter
                tombs = ds.to_table(filter=dels)
                tombs = tombs.filter(pa.array(keys_in(tombs, plan.keys, touched)))
            else:
                keys = _key_filter(plan.keys, touched)
                tombs = ds.to_table(filter=dels & keys if keys is not None else dels)
                if len(plan.keys) > 1 and tombs.num_rows:
                    tombs = tombs.filter(pa.array(keys_in(tombs, plan.keys, touched)))
        self.known_truncates = {p for p, _ in truncates}
        metrics.stored_rows_read = (rows.num_rows if rows is not None else 0) + \
            (tombs.num_rows if tombs is not None else 0)
        return Stored(rows, tombs, truncates, collected)

    def write(self, res: Resolution, table_cols: list[str], token: tuple[str, int] | None, metrics: Any,
              append_only: bool) -> None:
        """Write a resolution: the state, the batch's truncates, the rows (append or MERGE)."""
        dl = deltalake_module()
        plan = self.plan
        rows = res.rows
        metrics.rows_written = rows.num_rows
        new_truncates = [t for t in res.truncates if t[0] not in self.known_truncates]
        t0 = time.perf_counter()
        self._write_state(res, new_truncates)
        metrics.seconds["state"] = time.perf_counter() - t0
        commit = None
        if token is not None:
            # no silent retry over another writer's commit: the batch is read and resolved again (apply.py)
            commit = dl.CommitProperties(app_transactions=[dl.Transaction(token[0], token[1])], max_commit_retries=0)
        cols = list(table_cols) + [c for c in plan.bookkeeping() if c not in table_cols]
        deletes = pc.equal(rows.column(OP), DELETE)
        written = rows.filter(pc.invert(deletes)) if pc.any(deletes).as_py() else rows
        if self.dt is not None:
            keep_stats_exact(self.dt, rows.select([c for c in cols if c in rows.column_names]))
        if self.dt is not None and res.truncates:
            # the truncates, the rows and the token in one commit: a reader never sees the table emptied first
            self._replace_truncated(res, written, cols, commit)
            metrics.commits += 1
            return
        if self.dt is None or append_only:
            # the target holds none of the keys: their rows are appended, no file read or rewritten
            if written.num_rows and self._append(written.select(cols), commit):
                metrics.commits += 1
                metrics.appended = written.num_rows
                return
            if written.num_rows or self.dt is None or commit is not None:
                new = written.select(cols)
                created = {"configuration": created_configuration(new)} if self.dt is None else {}
                dl.write_deltalake(self.dt if self.dt is not None else self.path, new, mode="append",
                                   schema_mode="merge", commit_properties=commit, target_file_size=TARGET_FILE_BYTES,
                                   **created)
                metrics.commits += 1
                metrics.appended = written.num_rows
            return
        if self._rewrite(res, written, cols, commit, metrics):
            return
        on = " AND ".join(_matching(c, rows) for c in plan.keys)
        if plan.scd == 1:
            merge = (self.dt.merge(rows.select(cols + [OP]), on, source_alias="s", target_alias="t",
                                   merge_schema=True, commit_properties=commit)
                     .when_matched_delete(predicate=f"s.{OP} = '{DELETE}'")
                     .when_matched_update_all(predicate=f"s.{OP} = '{UPSERT}'", except_cols=[OP])
                     .when_not_matched_insert_all(predicate=f"s.{OP} = '{UPSERT}'", except_cols=[OP]))
        else:
            on += "".join(f" AND {_matching(c, written)}" for c in plan.start_cols[:-1])
            if written.num_rows == 0 and commit is None:
                return
            merge = (self.dt.merge(written.select(cols), on, source_alias="s", target_alias="t", merge_schema=True,
                                   commit_properties=commit)
                     .when_matched_update_all().when_not_matched_insert_all())
        metrics.merge = merge.execute()
        metrics.commits += 1

    def _append(self, rows: pa.Table, commit: Any) -> bool:
        """New keys' rows as new files through delta_rewrite.append_files (a plain table, or a new one), sorted by
        the key; False when delta-rs's writer must add them instead."""
        if not (rewritable(self.dt) if self.dt is not None else rewrite_supported()):
            return False
        created = created_configuration(rows) if self.dt is None else None
        return append_files(self.path, self.dt, rows, self.plan.keys, target_file_size(self.dt), commit, created)

    def _rewrite(self, res: Resolution, written: pa.Table, cols: list[str], commit: Any, metrics: Any) -> bool:
        """The batch's rows by rewriting the files holding its keys (delta_rewrite.py), when the table allows it
        and the batch neither truncates (its delete or update has just changed the files) nor adds columns."""
        if self.stored_files is None or res.truncates:
            return False
        schema = arrow_schema(self.dt.schema())
        if set(schema.names) != set(cols):
            return False
        plan = self.plan
        if plan.scd == 1:
            match, by = res.rows, plan.keys
        else:
            match, by = written, plan.keys + plan.start_cols[:-1]
        stored, self.stored_files = self.stored_files, None
        metrics.merge = rewrite_files(self.dt, stored, match.select(by), by, written.select(cols),
                                      plan.keys, schema, target_file_size(self.dt), commit)
        metrics.commits += 1
        return True

    def _replace_truncated(self, res: Resolution, written: pa.Table, cols: list[str], commit: Any) -> None:
        """A batch holding truncates, in one overwrite commit that carries the token: the stored rows each truncate
        ends (arrow_target.truncated, as the Arrow target ends them) left out (SCD 1) or closed at it (SCD 2), the
        stored rows the batch replaces left out (SCD 1: its keys; SCD 2: its versions, by key and start), then the
        batch's rows. The stored rows stream through one batch at a time."""
        from .arrow_target import RowMasks

        dl = deltalake_module()
        plan = self.plan
        stored_schema = arrow_schema(self.dt.schema())
        schema = pa.schema(list(stored_schema) + [written.schema.field(c) for c in cols
                                                  if c not in stored_schema.names])
        by = plan.keys if plan.scd == 1 else plan.keys + plan.start_cols[:-1]
        replaced = (res.rows if plan.scd == 1 else written).select(by)
        replaced = replaced.group_by(by).aggregate([]) if replaced.num_rows else replaced

        files = delta_dataset(self.dt)       # (delta-rs is not called while its writer pulls the batches)

        def stored() -> Any:
            for batch in files.to_batches(columns=stored_schema.names):
                t = pa.Table.from_batches([batch], schema=batch.schema)
                for pos, ts in res.truncates:
                    ended = truncated(plan, pos, RowMasks(t))
                    if plan.scd == 1:
                        t = t.filter(pa.array(~ended))
                    else:
                        t = _closed(t, ended, plan.end_cols, pos, ts)
                if replaced.num_rows and t.num_rows:
                    t = t.filter(pa.array(~keys_in(t, by, replaced)))
                if t.num_rows:
                    yield from unify(t, schema).to_batches()
            if written.num_rows:
                yield from unify(written.select(cols), schema).to_batches()

        reader = pa.RecordBatchReader.from_batches(schema, stored())
        dl.write_deltalake(self.dt, reader, mode="overwrite", schema_mode="merge", commit_properties=commit,
                           target_file_size=target_file_size(self.dt))

    def _write_state(self, res: Resolution, new_truncates: list) -> None:
        dl = deltalake_module()
        plan = self.plan
        pos_cols = plan.seq if plan.scd == 1 else plan.start_cols[:-1]
        seq_types = {c: res.rows.schema.field(p).type for c, p in zip(plan.seq, pos_cols)}
        rows = state_rows(res, plan, new_truncates, seq_types)
        if rows is None:
            return
        # appended: a key's latest tombstone is the one that counts (resolve takes the latest), so no merge reads
        # or rewrites the state's files
        if self.state is None:
            dl.write_deltalake(self.state_path, rows, mode="append",
                               configuration={CHECKPOINT_PROPERTY: str(CHECKPOINT_INTERVAL),
                                              **stats_configuration(rows)})
            self.state = open_delta(self.state_path)
        else:
            keep_stats_exact(self.state, rows)
            dl.write_deltalake(self.state, rows, mode="append")
