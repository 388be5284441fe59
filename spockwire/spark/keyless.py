"""Tables without a key applied to Delta as a bag of rows: ``apply_changes(..., keys=[])``.

A table whose replica identity names no column it can be keyed by (REPLICA IDENTITY FULL or NOTHING without a
primary key, DEFAULT without one) may hold equal rows several times, and its Delta table holds the same bag:

* ``insert`` adds one row, whatever rows equal to it the table holds already (two equal rows inserted are two rows);
* ``delete`` carries the whole old row (REPLICA IDENTITY FULL) and removes one row equal to it: equal in every
  column the change carries, NULL equal to NULL and NaN to NaN. Of several equal rows, the one written last goes;
* an update's old row (``update_preimage``) removes one row as a delete does and its new row
  (``update_postimage``, the change after it) is added; a column the new row names in ``_unchanged_toast`` (an
  unchanged TOASTed value pgoutput did not send) takes the old row's value, which a FULL old row always holds;
* ``truncate`` removes every row.

What cannot be applied is counted, never dropped silently: an update or delete that came without its old row
(REPLICA IDENTITY NOTHING or DEFAULT without a key; PostgreSQL refuses these statements while a publication
publishes updates or deletes of the table, but other plugins send them) is not applied
(``ApplyMetrics.unapplied``); an old row the table holds no row equal to (the table was changed besides the
pipeline, or an earlier change could not be applied) removes nothing (``ApplyMetrics.unmatched``), and an update's
new row is still added.

The stored rows: SCD 1 the table's columns and the sequence of the change that wrote each row (``_commit_lsn``,
``_seq``: unique per row, they name the row a later change removes); SCD 2 every row as a version with its
validity (``_start_*`` / ``_end_*``, the columns of a keyed history table): a row is valid from the change that
wrote it to the one that removed it, an update's old row ending where its new row starts, so the table as of any
position is ``_start <= position < _end`` (current rows: ``_end_commit_lsn IS NULL``), duplicates included.

Each call is one commit to the table carrying the idempotence token: new rows alone are appended as new files
(delta_rewrite.append_files); rows removed or ended rewrite the files holding them (delta_rewrite.rewrite_files),
found by reading only the files whose statistics may hold the old rows (by their columns of plain types holding no
NULL) and matched in Arrow; an SCD 1 truncate replaces every file. A table delta-rs's own writers must keep up
(not ``rewritable``) is merged by the rows' sequence instead. Unlike keyed tables, a batch is idempotent only
through its token: applied twice without one, its inserts are added twice.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_target import unify
from .delta_features import check_target
from .delta_rewrite import (FILE_COLUMN, StoredFiles, append_files, arrow_schema, exact_values, file_sizes,
                            keep_stats_exact, rewritable, rewrite_files)
from .delta_target import DeltaTarget, _q, created_configuration, delta_dataset, deltalake_module, read_keys, \
    target_file_size
from .resolve_frame import OP, Plan, _dense_rank, _same_as_previous
from .schema import read_table_relation

__all__ = ["keyless_plan", "apply_keyless", "inserted_rows", "table_key", "landing_notes", "divergence"]

_DELETE, _INSERT = "delete", "insert"


def keyless_plan(columns: Sequence[str], sequence_by: Sequence[str] | str, scd: int,
                 value_columns: Sequence[str]) -> Plan:
    """The plan of a table without a key (its `values` the table's columns of the changes)."""
    if scd not in (1, 2):
        raise ValueError(f"stored_as_scd_type must be 1 or 2, not {scd!r}")
    seq = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    missing = [c for c in seq if c not in columns]
    if not seq or missing:
        raise ValueError(f"sequence_by columns {missing or seq} are not columns of the change DataFrame")
    if "_change_type" not in columns:
        raise ValueError("the change DataFrame has no _change_type column")
    return Plan([], list(value_columns), seq, scd, "_commit_ts" in columns, "_unchanged_toast" in columns)


def table_key(cur: Any, table: str) -> list[str]:
    """The key a table is landed by: its replica identity's columns (the primary key under DEFAULT, the index of
    REPLICA IDENTITY USING INDEX); under FULL or NOTHING its primary key, if it has one; else none (an empty list:
    the table is landed as a bag of rows)."""
    relation = read_table_relation(cur, table)
    if relation.replica_identity in ("d", "i"):
        return [c.name for c in relation.columns if c.is_key]
    cur.execute("SELECT a.attname FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid "
                "AND a.attnum = ANY (x.indkey::int2[]) WHERE x.indrelid = %s AND x.indisprimary "
                "ORDER BY array_position(x.indkey::int2[], a.attnum)", (relation.relid,))
    return [r[0] for r in cur.fetchall()]


_ACTIONS = ("insert", "update", "delete", "truncate")


def landing_notes(cur: Any, table: str, key: Sequence[str], publications: Sequence[str]) -> list[str]:
    """What the job says at the start about how `table` lands, when it cannot follow every change exactly: the
    actions none of `publications` publishes for it (their changes never reach the pipeline), and, for a table
    without a key under REPLICA IDENTITY NOTHING or DEFAULT, that it lands as rows appended. Empty when the table
    is followed exactly."""
    cur.execute("SELECT bool_or(p.pubinsert), bool_or(p.pubupdate), bool_or(p.pubdelete), bool_or(p.pubtruncate) "
                "FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname "
                "WHERE p.pubname = ANY(%s) AND t.schemaname || '.' || t.tablename = %s", (list(publications), table))
    flags = cur.fetchone()
    notes = []
    if flags is not None and flags[0] is not None and not all(flags):
        missing = [a for a, on in zip(_ACTIONS, flags) if not on]
        notes.append(f"spockwire: the publication {','.join(publications)} does not publish {', '.join(missing)} of "
                     f"{table}: such changes never reach the pipeline, and after one its Delta table differs from "
                     f"the source (publish them: ALTER PUBLICATION ... SET (publish = '{', '.join(_ACTIONS)}'))")
    if not key:
        identity = read_table_relation(cur, table).replica_identity
        if identity != "f":
            kind = "NOTHING" if identity == "n" else "DEFAULT and no primary key"
            notes.append(f"spockwire: {table} has no key (REPLICA IDENTITY {kind}): it lands as rows appended; the "
                         "server refuses its UPDATE and DELETE while a publication publishes them, and one that "
                         "comes without its old row is counted as unapplied, never applied (REPLICA IDENTITY FULL "
                         "lands every change, or name a key: --table NAME=COLUMN)")
    return notes


def divergence(table: str, metrics: Any) -> str | None:
    """The line saying that `table` no longer equals its source and why (None while it does)."""
    if metrics.unapplied:
        return (f"spockwire: {table} can no longer be kept equal to its source: {metrics.unapplied} update(s) or "
                "delete(s) came without the old row (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key), "
                "so the row each changed cannot be found; they are not applied (REPLICA IDENTITY FULL upstream "
                "sends the old rows)")
    if metrics.unmatched:
        return (f"spockwire: {table} can no longer be kept equal to its source: {metrics.unmatched} update(s) or "
                "delete(s) name an old row its Delta table does not hold (it was changed besides the pipeline, or "
                "an earlier change could not be applied); they removed no row")
    return None


# ---------------------------------------------------------------------------------------------------------------
# rows as equality classes

def _rankable(t: pa.DataType) -> bool:
    """A type Arrow sorts and compares (the other columns are compared as Python values)."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t) or pa.types.is_temporal(t)
            and not pa.types.is_interval(t))


def _frozen(value: Any) -> Any:
    """A Python value of a column as a hashable value that equals another exactly when the values are equal
    (NaN equal to NaN)."""
    if isinstance(value, float) and value != value:
        return ("NaN",)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def row_classes(rows: pa.Table, probe: np.ndarray) -> np.ndarray:
    """An equality class per row of `rows`: rows equal in every column (NULL equal to NULL, NaN to NaN) share
    one; a row whose columns Arrow compares equal no `probe` row's (a boolean mask) gets -1."""
    n = rows.num_rows
    cols = [f.name for f in rows.schema if f.type != pa.null()]
    plain = [c for c in cols if _rankable(rows.schema.field(c).type)]
    other = [c for c in cols if c not in plain]
    ranks = _dense_rank([rows.select(plain)])[0][0] if plain and n else np.zeros(n, np.int64)
    wanted = np.isin(ranks, ranks[probe])
    if not other:
        return np.where(wanted, ranks, -1)
    out = np.full(n, -1, np.int64)
    at = np.flatnonzero(wanted)
    if len(at):
        sub = rows.select(other).take(pa.array(at))
        seen: dict[tuple, int] = {}
        for i, values in zip(at.tolist(), zip(*(sub.column(c).to_pylist() for c in other))):
            out[i] = seen.setdefault((int(ranks[i]), _frozen(values)), len(seen))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the batch

class _Batch:
    """A batch's changes in sequence order (a change delivered twice counted once), what each row is, and the
    table's values of every row (a new row's unchanged TOASTed values taken from its old row)."""

    def __init__(self, changes: pa.Table, plan: Plan) -> None:
        order = pc.sort_indices(changes, sort_keys=[(c, "ascending") for c in plan.seq])
        t = changes.take(order)
        n = t.num_rows
        if n > 1:
            again = np.ones(n - 1, dtype=bool)
            for c in plan.seq:
                again &= _same_as_previous(t.column(c))
            if again.any():
                t = t.filter(pa.array(np.concatenate([[True], ~again])))
                n = t.num_rows
        self.table = t
        kind = np.asarray(t.column("_change_type").to_numpy(zero_copy_only=False), dtype=object)
        pre, post = kind == "update_preimage", kind == "update_postimage"
        self.truncate = kind == "truncate"
        paired = np.zeros(n, dtype=bool)           # a postimage right after its preimage
        paired[1:] = post[1:] & pre[:-1]
        self.unapplied = int(np.count_nonzero(post & ~paired))   # an update without its old row
        self.new = (kind == _INSERT) | paired        # rows added
        self.delete = kind == _DELETE
        self.old = self.delete.copy()                # old rows: deletes and the preimages of paired postimages
        self.old[:-1] |= paired[1:]
        self.values = self._filled(t, plan, paired)

    @staticmethod
    def _filled(t: pa.Table, plan: Plan, paired: np.ndarray) -> pa.Table:
        values = t.select([c for c in plan.values if c in t.column_names])
        if not plan.has_toast or not paired.any():
            return values
        toast = t.column("_unchanged_toast").combine_chunks()
        if toast.null_count == len(toast):
            return values
        parents = pc.list_parent_indices(toast).to_numpy()
        names = pc.list_flatten(toast).to_numpy(zero_copy_only=False)
        for name in set(names.tolist()) & set(values.column_names):
            rows = parents[names == name]
            rows = rows[paired[rows]]
            if len(rows):
                src = np.arange(t.num_rows)
                src[rows] -= 1                       # the preimage before it
                i = values.schema.get_field_index(name)
                values = values.set_column(i, values.schema.field(i), values.column(i).take(pa.array(src)))
        return values


class _Walk:
    """The batch played in order against its own rows: which new rows a later change of the batch removed
    (`end`: the row of the change that did, -1 none), the old rows only a stored row can match (`needs`: the old
    row and the change ending the stored row), and the first truncate (every stored row ends there)."""

    def __init__(self, b: _Batch) -> None:
        n = b.table.num_rows
        self.end = np.full(n, -1, np.int64)
        self.needs: list[tuple[int, int]] = []
        self.truncated: int | None = None
        self.unmatched = 0
        if not (b.old.any() or b.truncate.any()):
            return
        cls = row_classes(b.values, b.old)
        live: dict[int, list[int]] = {}
        for i in np.flatnonzero(b.truncate | b.old | (b.new & (cls >= 0))).tolist():
            if b.truncate[i]:
                ended = b.new[:i] & (self.end[:i] == -1)
                self.end[:i][ended] = i
                live.clear()
                if self.truncated is None:
                    self.truncated = i
            elif b.new[i]:
                live.setdefault(int(cls[i]), []).append(i)
            else:
                ends = i if b.delete[i] else i + 1
                stack = live.get(int(cls[i]))
                if stack:
                    self.end[stack.pop()] = ends
                elif self.truncated is None:
                    self.needs.append((i, ends))
                else:
                    self.unmatched += 1


# ---------------------------------------------------------------------------------------------------------------
# apply

def apply_keyless(changes: pa.Table, path: str, plan: Plan, idempotence: tuple[str, int] | None,
                  metrics: Any) -> None:
    """Apply `changes` to the Delta table at `path` as a bag of rows (see the module), filling `metrics` (an
    apply.ApplyMetrics)."""
    target = DeltaTarget(path, plan)
    if target.dt is not None:
        check_target(path, target.dt)
    if target.applied(idempotence):
        metrics.skipped = True
        return
    existing, types = target.columns()
    table_cols = existing + [c for c in plan.values if c not in existing]
    b = _Batch(changes, plan)
    walk = _Walk(b)
    metrics.truncates = int(np.count_nonzero(b.truncate))
    metrics.unapplied = b.unapplied
    dl = deltalake_module()
    commit = dl.CommitProperties(app_transactions=[dl.Transaction(*idempotence)], max_commit_retries=0) \
        if idempotence else None
    dt = target.dt
    pos = plan.seq if plan.scd == 1 else plan.start_cols[:-1]
    stored = _Stored(dt, b, walk, plan, pos, metrics) if dt is not None else None
    metrics.unmatched = walk.unmatched + (stored.unmatched if stored is not None else 0)
    kept = b.new & (walk.end == -1) if plan.scd == 1 else b.new    # SCD 2: the rows ended in the batch too
    rows = _typed(_rows_at(b, np.flatnonzero(kept), walk.end, plan, table_cols), types)
    removed = stored.removed if stored is not None else None
    if stored is not None and stored.ended is not None:
        rows = pa.concat_tables([stored.ended, rows], promote_options="default")
    metrics.rows_written = rows.num_rows + (removed.num_rows if removed is not None else 0)
    if dt is None:
        _create(path, rows, commit)
        metrics.appended = rows.num_rows
    elif plan.scd == 1 and walk.truncated is not None:
        keep_stats_exact(dt, rows)
        dl.write_deltalake(dt, rows, mode="overwrite", schema_mode="merge", commit_properties=commit)
    elif removed is not None and removed.num_rows:
        keep_stats_exact(dt, rows)
        metrics.merge = _replace(dt, stored.files, removed, pos, rows, plan, commit)
    elif rows.num_rows or commit is not None:
        keep_stats_exact(dt, rows)
        if not (rows.num_rows and rewritable(dt) and append_files(path, dt, rows, [], target_file_size(dt), commit)):
            dl.write_deltalake(dt, rows, mode="append", schema_mode="merge", commit_properties=commit)
        metrics.appended = rows.num_rows
    else:
        return
    metrics.commits += 1


def _typed(rows: pa.Table, types: dict[str, pa.DataType]) -> pa.Table:
    """`rows` with the types the Delta table holds its columns in."""
    cols = [rows.column(f.name).cast(types[f.name]) if f.name in types and types[f.name] != f.type
            else rows.column(f.name) for f in rows.schema]
    return pa.table(cols, names=rows.column_names)


def _create(path: str, rows: pa.Table, commit: Any) -> None:
    if not append_files(path, None, rows, [], target_file_size(None), commit, created_configuration(rows)):
        deltalake_module().write_deltalake(path, rows, mode="append", commit_properties=commit,
                                           configuration=created_configuration(rows))


def _replace(dt: Any, files: StoredFiles | None, removed: pa.Table, pos: list[str], rows: pa.Table, plan: Plan,
             commit: Any) -> dict:
    """One commit: the stored rows `removed` (named by their sequence `pos`) out, `rows` in: the files holding them
    rewritten, or (a table delta-rs must write itself) a MERGE by the sequence."""
    schema = arrow_schema(dt.schema())
    if files is not None and set(schema.names) == set(rows.column_names):
        return rewrite_files(dt, files, removed.select(pos), pos, rows, [], schema, target_file_size(dt), commit)
    on = " AND ".join(f"t.{_q(c)} = s.{_q(c)}" for c in pos)
    if plan.scd == 1:
        source = pa.concat_tables([_with_op(removed, _DELETE), _with_op(unify(rows, removed.schema), _INSERT)])
        merge = (dt.merge(source, on, source_alias="s", target_alias="t", merge_schema=True, commit_properties=commit)
                 .when_matched_delete(predicate=f"s.{OP} = '{_DELETE}'")
                 .when_not_matched_insert_all(predicate=f"s.{OP} = '{_INSERT}'", except_cols=[OP]))
    else:            # the ended versions are among `rows`: they update their stored rows
        merge = (dt.merge(rows, on, source_alias="s", target_alias="t", merge_schema=True, commit_properties=commit)
                 .when_matched_update_all().when_not_matched_insert_all())
    return merge.execute()


def _with_op(rows: pa.Table, op: str) -> pa.Table:
    return rows.append_column(OP, pa.array([op] * rows.num_rows, pa.string()))


def _rows_at(b: _Batch, at: np.ndarray, end: np.ndarray, plan: Plan, table_cols: Sequence[str]) -> pa.Table:
    """The stored rows of the batch's new rows `at` (indices): the table's columns and the sequence (SCD 1), or the
    validity from the row's change to the change that removed it (`end`, -1: still valid; SCD 2)."""
    t, n = b.table, len(at)
    idx = pa.array(at, pa.int64())
    cols = {c: b.values.column(c).take(idx) if c in b.values.column_names else pa.nulls(n) for c in table_cols}
    ts_type = pa.timestamp("us", tz="UTC")
    ts = t.column("_commit_ts").cast(ts_type) if plan.has_ts else pa.nulls(t.num_rows, ts_type)
    if plan.scd == 1:
        for c in plan.seq:
            cols.setdefault(c, t.column(c).take(idx))
        return pa.table(cols)
    for c, s in zip(plan.start_cols[:-1], plan.seq):
        cols[c] = t.column(s).take(idx)
    cols[plan.start_cols[-1]] = ts.take(idx)
    ends = end[at]
    cols.update(_ends(t, ts, ends, plan))
    return pa.table(cols)


def _ends(t: pa.Table, ts: Any, ends: np.ndarray, plan: Plan) -> dict[str, Any]:
    """The end columns of versions ended by the batch's changes `ends` (row indices; -1: not ended)."""
    mask = pa.array(ends == -1)
    idx = pa.array(np.where(ends == -1, 0, ends), pa.int64())
    out = {}
    for c, s in zip(plan.end_cols[:-1], plan.seq):
        col = t.column(s)
        out[c] = pc.if_else(mask, pa.nulls(len(ends), col.type), col.take(idx)) if len(col) else \
            pa.nulls(len(ends), col.type)
    out[plan.end_cols[-1]] = pc.if_else(mask, pa.nulls(len(ends), ts.type), ts.take(idx)) if len(ts) else \
        pa.nulls(len(ends), ts.type)
    return out


def inserted_rows(changes: pa.Table, plan: Plan, table_cols: Sequence[str]) -> pa.Table:
    """The stored rows of changes that are all inserts (a table read whole): each row as the change wrote it."""
    b = _Batch(changes, plan)
    return _rows_at(b, np.flatnonzero(b.new), np.full(b.table.num_rows, -1, np.int64), plan, table_cols)


# ---------------------------------------------------------------------------------------------------------------
# the stored rows a batch removes or ends

class _Stored:
    """The stored rows the batch's old rows match (one each), read from the files that may hold them: `removed`
    (SCD 1: the rows; SCD 2: the current versions ended), `ended` (SCD 2: those versions with their end), `files`
    (the files read whole, for a rewrite; None when they cannot be rewritten) and `unmatched`. An SCD 2 batch that
    truncates ends every current version (at its old row's change, or at the truncate); an SCD 1 batch that
    truncates replaces the table, its old rows before the truncate matched only to count those matching none."""

    def __init__(self, dt: Any, b: _Batch, walk: _Walk, plan: Plan, pos: list[str], metrics: Any) -> None:
        self.removed: pa.Table | None = None
        self.ended: pa.Table | None = None
        self.files: StoredFiles | None = None
        self.unmatched = 0
        everything = plan.scd == 2 and walk.truncated is not None
        if not walk.needs and not everything:
            return
        need = b.values.take(pa.array([i for i, _ in walk.needs], pa.int64()))
        if everything:
            cands = self._current(dt, plan, metrics)
        else:
            cands = self._candidates(dt, need, metrics)
        cands = unify(cands, arrow_schema(dt.schema()))
        if plan.scd == 2:
            cands = cands.filter(pc.is_null(cands.column(plan.end_cols[0])))
        metrics.stored_rows_read = cands.num_rows
        ends = self._match(need, cands, pos, [e for _, e in walk.needs])
        if everything:
            ends = np.where(ends == -1, walk.truncated, ends)
        taken = np.flatnonzero(ends != -1)
        self.removed = cands.take(pa.array(taken, pa.int64()))
        if plan.scd == 2:
            t = b.table
            ts = t.column("_commit_ts").cast(pa.timestamp("us", tz="UTC")) if plan.has_ts else \
                pa.nulls(t.num_rows, pa.timestamp("us", tz="UTC"))
            ended = self.removed
            for c, v in _ends(t, ts, ends[taken], plan).items():
                i = ended.schema.get_field_index(c)
                ended = ended.set_column(i, ended.schema.field(i), v.cast(ended.schema.field(i).type))
            self.ended = ended

    def _match(self, need: pa.Table, cands: pa.Table, pos: list[str], ends: list[int]) -> np.ndarray:
        """Per candidate, the change ending it (-1: none): each old row of `need` takes the equal candidate written
        last that no earlier one took."""
        out = np.full(cands.num_rows, -1, np.int64)
        if not need.num_rows:
            return out
        if not cands.num_rows:
            self.unmatched = need.num_rows
            return out
        both = pa.concat_tables([need, unify(cands, need.schema)])
        probe = np.zeros(both.num_rows, dtype=bool)
        probe[:need.num_rows] = True
        cls = row_classes(both, probe)
        mine, theirs = cls[:need.num_rows], cls[need.num_rows:]
        stacks: dict[int, list[int]] = {}
        order = pc.sort_indices(cands.select(pos), sort_keys=[(c, "ascending") for c in pos]).to_numpy()
        for j in order[np.isin(theirs[order], mine)].tolist():
            stacks.setdefault(int(theirs[j]), []).append(j)
        for c, e in zip(mine.tolist(), ends):
            stack = stacks.get(c)
            if stack:
                out[stack.pop()] = e
            else:
                self.unmatched += 1
        return out

    def _candidates(self, dt: Any, need: pa.Table, metrics: Any) -> pa.Table:
        """The stored rows that may equal an old row of `need`: by the old rows' columns of types the file statistics
        and filters name exactly and that hold no NULL, else every row; their files read whole when they can be
        rewritten."""
        have = set(arrow_schema(dt.schema()).names)
        by = [c for c in need.column_names if c in have and _prunable(need.schema.field(c).type)
              and need.column(c).null_count == 0 and exact_values(need.column(c))]
        if not by:
            return self._read_all(dt, None, metrics)
        rows, metrics.files_read, metrics.files_in_table, self.files = read_keys(
            dt, by, need.select(by), whole_files=rewritable(dt))
        return rows

    def _current(self, dt: Any, plan: Plan, metrics: Any) -> pa.Table:
        """Every current version (SCD 2), the files holding one read whole."""
        end = plan.end_cols[0]
        ds = delta_dataset(dt)
        ends = ds.to_table(columns=[end, FILE_COLUMN])
        holding = set(pc.unique(ends.column(FILE_COLUMN).filter(pc.is_null(ends.column(end)))).to_pylist())
        return self._read_all(dt, holding, metrics)

    def _read_all(self, dt: Any, holding: set[int] | None, metrics: Any) -> pa.Table:
        """The rows of the table's files (`holding`: those of these indices among the dataset's files), read
        whole, with the files for a rewrite."""
        import pyarrow.dataset as pds

        ds = delta_dataset(dt)
        frags = [f for i, f in enumerate(ds.get_fragments()) if holding is None or i in holding]
        sub = pds.FileSystemDataset(frags, ds.schema, ds.format, ds.filesystem)
        sizes = file_sizes(dt)
        metrics.files_read, metrics.files_in_table = len(frags), len(sizes)
        cols = ds.schema.names
        if rewritable(dt) and set(sub.files) <= set(sizes):
            rows = sub.to_table(columns=cols + [FILE_COLUMN])
            self.files = StoredFiles(rows, np.ones(rows.num_rows, dtype=bool), list(sub.files),
                                     [sizes[f] for f in sub.files])
            return rows.select(cols)
        return sub.to_table(columns=cols)


def _prunable(t: pa.DataType) -> bool:
    """A column type the file statistics bound and a dataset filter names exactly."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t))
