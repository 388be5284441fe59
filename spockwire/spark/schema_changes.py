"""Schema changes on the way into Delta: each table's changes applied in the shape the stream gave them, and a
table read again from the source when its shape changed.

A Relation message shows a table's new shape but not what happened to it: a rename looks like a drop and an add,
and a column added with a default (or a volatile one, which rewrites the table) sends no change for the rows that
existed. Applying the new shape to the rows already in Delta would leave them wrong without a sign. So a table is
*re-read* whenever the stream describes it with other columns than those its Delta table was written with:

1. The source's tasks write each table's changes in the shape the stream gave them, one Arrow file per shape, with
   the relation's column description (names, type OIDs, type modifiers, key flags) in the file's metadata
   (batch_files.py, slot.py ``described``).
2. On the driver, a target's changes are cut where that description changes (:func:`segments`). Those in the shape
   the target holds (its description, kept beside the table in ``_spockwire_columns.json``) are applied as usual.
3. At the first other shape, the table is read again under a new exported snapshot at consistent point P (a
   temporary slot: the snapshot sees exactly the transactions that committed before P): its rows replace the
   Delta table's (SCD 1), or close every current version at P and open the rows read (SCD 2), in one commit that
   also records P (a Delta transaction action of application :data:`REREAD_APP`, version P) and the micro-batch's
   idempotence token. The table's schema becomes the source's as of P: a dropped column is removed, a renamed one
   holds every row's value under its new name, a retyped one holds the values the source now has.
4. From then on the table's changes committed before P are left out (the re-read already holds them); the other
   tables keep streaming, and nothing waits. A re-read is reported in the job's output and metrics.

A column that the decoder switched to PostgreSQL's text because a value did not fit its Arrow type (same type OID)
is not a schema change: the text side is kept (the Delta column becomes a string column once, holding the text of
every stored value) and typed values of that column are written as their text.

The re-read is exact whatever the DDL was; its cost is a read of the table (the parallel binary COPY of
:func:`spockwire.read_table`). With the DDL capture installed upstream (spockwire.connection.ddl_capture), each
ALTER TABLE also reaches the table's runs, at its place, as a run of one ``ddl`` row: what it did is known, and
:func:`in_place` tells the changes the Delta table follows without a re-read (a column added without a default, a
rename, a drop, a widening without ``USING``).
"""
from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from . import schema as S

__all__ = ["REREAD_APP", "SHAPE_FILE", "Reread", "TableSnapshot", "segments", "description", "reread_point",
           "read_shape", "write_shape", "apply_shaped"]

#: the Delta transaction application whose version is the LSN a table was last re-read at
REREAD_APP = "spockwire-reread"
#: the file beside a Delta table's log holding the column description the table was written with
SHAPE_FILE = "_spockwire_columns.json"

_TEXT_TYPES = (pa.string(), pa.large_string())


def description(schema: pa.Schema) -> list | None:
    """The column description a batch's schema carries (None: none, e.g. a snapshot chunk or a truncate)."""
    raw = (schema.metadata or {}).get(S.COLUMNS_METADATA)
    return json.loads(raw) if raw else None


def _value_fields(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if f.name not in S.CHANGE_COLUMNS]


def segments(tables: Sequence[pa.Table]) -> list[pa.Table]:
    """A table's files in stream order, merged into runs of one shape (consecutive files of the same column
    description and columns)."""
    runs: list[list[pa.Table]] = []
    shapes: list[tuple] = []
    for t in tables:
        meta = t.schema.metadata or {}
        shape = (meta.get(S.COLUMNS_METADATA), tuple((f.name, str(f.type)) for f in _value_fields(t.schema)))
        if runs and shape == shapes[-1] and S.DDL_METADATA not in meta and \
                S.DDL_METADATA not in (runs[-1][0].schema.metadata or {}):
            runs[-1].append(t)
        else:
            runs.append([t])
            shapes.append(shape)
    return [pa.concat_tables(run) if len(run) > 1 else run[0] for run in runs]


# ---------------------------------------------------------------------------------------------------------------
# what a target was written with

def read_shape(path: str) -> list | None:
    """The column description a Delta table was last written with (None: not recorded)."""
    try:
        with open(os.path.join(path, SHAPE_FILE)) as f:
            return json.load(f)["columns"]
    except FileNotFoundError:
        return None


def write_shape(path: str, desc: list) -> None:
    """Record `desc` as the table's shape (after the commit that wrote it: a crash in between costs a re-read)."""
    final = os.path.join(path, SHAPE_FILE)
    tmp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump({"columns": desc}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def reread_point(dt: Any) -> int | None:
    """The LSN the table was last re-read at (its changes committed before it are in the table already)."""
    if dt is None:
        return None
    return dt.transaction_version(REREAD_APP)


# ---------------------------------------------------------------------------------------------------------------
# reading a table again

@dataclass
class TableSnapshot:
    """A table read under an exported snapshot: its rows as change rows at the consistent point."""

    table: str
    lsn: int                       # the consistent point P: the rows hold every transaction committed before it
    rows: pa.Table                 # change columns + the table's columns, typed as the stream's files type them
    columns: list                  # the column description, as the stream describes the table


class Reread:
    """Reads tables again from the source, each at most once per micro-batch (a table and its history table share
    one read). `spec`: the source's SlotSpec (connection, types, column overrides)."""

    def __init__(self, spec: Any, workers: int = 2) -> None:
        self.spec = spec
        self.workers = workers
        self._lock = threading.Lock()
        self._done: dict[str, TableSnapshot] = {}
        self.reread: list[str] = []

    def __call__(self, table: str) -> TableSnapshot:
        with self._lock:
            if table not in self._done:
                self._done[table] = self._read(table)
                self.reread.append(table)
            return self._done[table]

    def column_fields(self, table: str, columns: list) -> list[pa.Field]:
        """The Arrow fields (as the stream's files type them) of `columns` ([name, type OID, modifier, ...]) of
        `table`, planned by the values catalog as the decoder plans them."""
        from pyspark.sql import types as T

        from ..model import Column, Relation
        from .slot import _catalog

        nsp, name = S.split_table_name(table)
        relation = Relation(0, nsp, name, tuple(Column(c[0], int(c[1]), int(c[2]), bool(c[3])) for c in columns),
                            None, 1)
        spec = self.spec
        arrow = S.table_arrow_schema(relation, _catalog(spec.conninfo) if spec.types != "raw" else None,
                                     typed=spec.types != "raw", binary=spec.binary, column_types=spec.column_types)
        values = pa.schema(_value_fields(arrow))
        return list(S.target_arrow_schema(T.StructType(S.spark_fields(values))))

    def _read(self, table: str) -> TableSnapshot:
        import psycopg2

        import spockwire
        from ..snapshot.initial import create_slot_with_snapshot, snapshot_time
        from .batch_files import file_schema
        from .slot import column_description
        from .snapshot import SNAPSHOT_SEQ_BASE, _change_columns

        spec = self.spec
        name = f"spockwire_reread_{uuid.uuid4().hex[:12]}"
        with create_slot_with_snapshot(spec.conninfo, name, "pgoutput", temporary=True) as exported:
            conn = psycopg2.connect(spec.conninfo)
            try:
                with conn.cursor() as cur:
                    cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (exported.name,))
                    relation = S.read_table_relation(cur, table, spec.protocol)
                    cur.execute("ROLLBACK")
            finally:
                conn.close()
            ts = snapshot_time(spec.conninfo, exported.name)
            types = "typed" if spec.types == "auto" else spec.types
            values = spockwire.read_table(spec.conninfo, table, workers=self.workers, snapshot=exported.name,
                                          columns=[c.name for c in relation.columns], types=types,
                                          on_unrepresentable=spec.on_unrepresentable,
                                          column_types=dict(spec.column_types) or None)
            lsn = exported.consistent_point
        if spec.protocol != "pgoutput":      # pglogical and spock describe no types in their Relation messages
            relation = relation.__class__(relation.relid, relation.namespace, relation.name,
                                          tuple(c.__class__(c.name, None, None, c.is_key) for c in relation.columns),
                                          relation.replica_identity, relation.version)
        desc = json.loads(column_description(relation))
        n = values.num_rows
        ts_us = int(ts.timestamp() * 1_000_000)
        seq = pa.array(range(SNAPSHOT_SEQ_BASE + 1, SNAPSHOT_SEQ_BASE + 1 + n), pa.int64())
        heads = _change_columns(n, lsn, ts_us, "insert", seq)
        raw = pa.schema(list(S.change_fields()) + list(values.schema),
                        metadata={S.COLUMNS_METADATA: json.dumps(desc).encode()})
        change_target = S.target_arrow_schema(S.change_schema())
        schema = file_schema(change_target, raw)
        batch = pa.Table.from_arrays(heads + [values.column(i) for i in range(values.num_columns)], schema=raw)
        rows = pa.Table.from_batches([S.conform_batch(b, schema) for b in batch.to_batches()], schema=schema) \
            if n else schema.empty_table()
        return TableSnapshot(table, lsn, rows, desc)


# ---------------------------------------------------------------------------------------------------------------
# applying a target's changes shape by shape

def _same_columns(desc: list, stored: list) -> bool:
    """Same columns, types and keys; a type OID or modifier of None (pglogical, spock) matches any."""
    if len(desc) != len(stored):
        return False
    for a, b in zip(desc, stored):
        if a[0] != b[0] or bool(a[3]) != bool(b[3]):
            return False
        for x, y in ((a[1], b[1]), (a[2], b[2])):
            if x is not None and y is not None and x != y:
                return False
    return True


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, whatever their list fields are named or whether they may be null."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(_same_type(x.type, y.type) for x, y in zip(a, b))
    return a == b


def _fits(seg: pa.Table, held: dict[str, pa.DataType]) -> tuple[bool, list[str], list[str]]:
    """Whether the run's columns have the types the table holds them in: (fits, the run's columns to write as text,
    the table's columns to turn into text). A typed column against a string column is a column the decoder switched
    to text on one side (same type OID: the column descriptions matched)."""
    to_text, delta_to_text = [], []
    for f in _value_fields(seg.schema):
        have = held.get(f.name)
        if have is None:
            return False, [], []
        if _same_type(f.type, have):
            continue
        if have in _TEXT_TYPES:
            to_text.append(f.name)
        elif f.type in _TEXT_TYPES:
            delta_to_text.append(f.name)
        else:
            return False, [], []
    return True, to_text, delta_to_text


def _as_text(table: pa.Table, names: Sequence[str]) -> pa.Table:
    for name in names:
        i = table.schema.get_field_index(name)
        if i >= 0:
            table = table.set_column(i, pa.field(name, pa.string()),
                                     S.conform_array(table.column(i), pa.string(), name))
    return table


@dataclass
class ShapedResult:
    """What :func:`apply_shaped` did to one target."""

    metrics: list                  # ApplyMetrics of each apply_changes call
    reread_lsn: int | None = None  # the table was re-read at this LSN
    evolved: list = field(default_factory=list)   # in-place steps from captured ALTER TABLEs (add, rename, ...)
    dropped_rows: int = 0          # changes left out: committed before the table's re-read point


def _after_reread_point(runs: Sequence[pa.Table], point: int | None, result: ShapedResult) -> list[pa.Table]:
    out = []
    for run in runs:
        if point is not None:
            lsn = run.column("_commit_lsn")
            kept = run.filter(pc.greater_equal(lsn, pa.scalar(point, lsn.type)))
            result.dropped_rows += run.num_rows - kept.num_rows
            run = kept
        if run.num_rows:
            out.append(run)
    return out


def apply_shaped(path: str, changes: Sequence[pa.Table], keys: Sequence[str], scd: int,
                 token: tuple[str, int] | None, reread: Callable[[str], TableSnapshot], table: str,
                 apply: Callable[..., Any], keys_changed: Callable[[list[str]], list[str]] | None = None,
                 read_ahead: Any = None, new_table_reread: bool = False) -> ShapedResult:
    """Apply one target's changes (the table's runs of one shape, :func:`segments`, in stream order) to the Delta
    table at `path`: the runs in the shape the table holds through `apply` (``apply_changes``'s signature), and a
    re-read of `table` (`reread`) at the first run of another shape (see the module docstring). The idempotence
    `token` goes with the last commit, and a token of its own (`_part_token`) with each earlier one: a batch
    replayed after a crash between them skips the runs already applied (a table without a key would add their
    inserts twice). `new_table_reread`: a table without a Delta table is read whole first
    unless its changes come from the initial snapshot (a table that joined a followed publication).

    A re-read's point is past every change of the micro-batch (it is taken after the batch's range was read), so
    the re-read ends the target's batch: the changes after the run that asked for it are in the rows read."""
    from .delta_target import open_delta

    dt = open_delta(path)
    result = ShapedResult([])
    runs = _after_reread_point(changes, reread_point(dt), result)
    if dt is None and new_table_reread and not (runs and _from_snapshot(runs[0])):
        return _reread_into(path, reread(table), keys, scd, token, keys_changed, result)
    if dt is not None and runs and _opens_snapshot(runs[0]):
        dt = _snapshot_starts(path, dt, runs[0], scd)
    shape = read_shape(path) if dt is not None else None
    recorded = shape is not None
    changed = False
    pending: list[pa.Table] = []
    for run in runs:
        ddl = (run.schema.metadata or {}).get(S.DDL_METADATA)
        if ddl is not None:                   # a captured ALTER TABLE (connection/ddl_capture.py)
            if dt is None or not recorded:
                continue                      # the next change's shape decides
            after = json.loads(ddl)
            columns = [c[:4] for c in after["columns"]]
            if _same_columns(columns, shape):
                continue
            step = in_place(shape, after)
            if step is not None and step[0] != "add" and pending:
                # the rows before the statement, in the shape before it
                result.metrics.append(apply(_concat(pending, dt, scd), path, keys=keys, stored_as_scd_type=scd,
                                            idempotence=_part_token(token, result)))
                pending = []
            if step is None:
                if pending:
                    result.metrics.append(apply(_concat(pending, dt, scd), path, keys=keys, stored_as_scd_type=scd,
                                                idempotence=_part_token(token, result)))
                return _reread_into(path, reread(table), keys, scd, token, keys_changed, result)
            _evolve(path, dt, step, scd, lambda cols: reread.column_fields(table, cols))
            dt = open_delta(path)
            shape, changed = columns, True
            result.evolved.append(step[0])
            continue
        desc = description(run.schema)
        names = [f.name for f in _value_fields(run.schema)]
        if desc is None or not names:
            pending.append(run)
            continue
        if dt is None:
            if shape is None:                 # a new table, created in this shape
                shape = desc
            if _same_columns(desc, shape):
                pending.append(run)
                continue
            fits = (False, [], [])
        elif recorded:
            fits = _fits(run, _delta_types(dt, names)) if _same_columns(desc, shape) else (False, [], [])
        else:                                 # a table written before shapes were recorded: its columns must match
            fits = _fits(run, _delta_types(dt, names)) if names == _table_names(dt, scd) else (False, [], [])
            if fits[0]:
                shape, changed = desc, True
        if fits[0]:
            try:
                texts = [_as_text(p, fits[2]) for p in pending] + [_as_text(run, fits[1])]
                if fits[2]:
                    _turn_to_text(path, dt, fits[2])
                    dt = open_delta(path)
                pending = texts
                continue
            except TypeError:     # values whose PostgreSQL text is not rendered here (export/pg_text.py): re-read
                pass
        # another shape: what came before it is applied, then the table is read again
        if pending:
            result.metrics.append(apply(_concat(pending, dt, scd), path, keys=keys, stored_as_scd_type=scd,
                                        idempotence=_part_token(token, result)))
            pending = []
        return _reread_into(path, reread(table), keys, scd, token, keys_changed, result)
    if pending:
        result.metrics.append(apply(_concat(pending, dt, scd), path, keys=keys, stored_as_scd_type=scd,
                                    idempotence=token, read_ahead=read_ahead))
    if shape is not None and (changed or not recorded):
        write_shape(path, shape)
    return result


def _part_token(token: tuple[str, int] | None, result: ShapedResult) -> tuple[str, int] | None:
    """The idempotence token of a batch's commit before its last: the batch's version under an application id
    numbering the commits of the batch (the same on a replay, which applies the same runs in the same order)."""
    return None if token is None else (f"{token[0]}/{len(result.metrics) + 1}", token[1])


def _opens_snapshot(run: pa.Table) -> bool:
    """A run holding the initial snapshot's opening truncate (a snapshot started again, after the driver died)."""
    from .snapshot import SNAPSHOT_SEQ_BASE

    if not _from_snapshot(run):
        return False
    first = run.slice(0, 1)
    return first.column("_change_type")[0].as_py() == "truncate" and first.column("_seq")[0].as_py() == \
        SNAPSHOT_SEQ_BASE


def _snapshot_starts(path: str, dt: Any, run: pa.Table, scd: int) -> Any:
    """An initial snapshot starting again over a table written before (the driver died during the snapshot, and the
    table's columns may have changed upstream since): the snapshot replaces every row, so the table takes the
    snapshot's columns (SCD 1; an SCD 2 table keeps its columns for the versions it ends), and the shape it was
    written with is forgotten (the next change's shape is compared by names and types)."""
    from .delta_target import deltalake_module, open_delta

    try:
        os.remove(os.path.join(path, SHAPE_FILE))
    except FileNotFoundError:
        pass
    names = [f.name for f in _value_fields(run.schema)]
    if scd != 1 or _table_names(dt, scd) == names:
        return dt
    schema = arrow_schema_of(dt)
    book = [f for f in schema if f.name not in _table_names(dt, scd)]
    empty = pa.schema([f for f in _value_fields(run.schema)] + book).empty_table()
    overwrite(path, dt, empty)
    return open_delta(path)


def arrow_schema_of(dt: Any) -> pa.Schema:
    from .delta_rewrite import arrow_schema

    return arrow_schema(dt.schema())


def overwrite(path: str, dt: Any, rows: pa.Table, commit: Any = None) -> None:
    """Replace the Delta table's rows and schema by `rows` in one commit (`commit`: its properties), keeping its
    statistics exact (delta_rewrite.stats_configuration): before the commit only the columns the table has and
    `rows` can bound keep statistics, after it every column of `rows` that can be bounded has them (a table
    property commit each, when they change)."""
    from .delta_rewrite import STATS_COLUMNS, stats_configuration
    from .delta_target import created_configuration, deltalake_module, open_delta

    dl = deltalake_module()
    conf = stats_configuration(rows)
    if dt is None:
        dl.write_deltalake(path, rows, mode="overwrite", commit_properties=commit,
                           configuration=created_configuration(rows))
        return
    have = set(pa.schema(dt.schema().to_arrow()).names)
    wanted = [c for c in conf[STATS_COLUMNS].split(",") if c]
    before = ",".join(c for c in wanted if c.strip("`") in have)
    if (dt.metadata().configuration or {}).get(STATS_COLUMNS) != before:
        dt.alter.set_table_properties({STATS_COLUMNS: before})
    dl.write_deltalake(path, rows, mode="overwrite", schema_mode="overwrite", commit_properties=commit)
    if before != conf[STATS_COLUMNS]:
        open_delta(path).alter.set_table_properties({STATS_COLUMNS: conf[STATS_COLUMNS]})


def _from_snapshot(run: pa.Table) -> bool:
    """A run of the initial snapshot (its rows and truncates: no description, no transaction id)."""
    meta = run.schema.metadata or {}
    return S.COLUMNS_METADATA not in meta and S.DDL_METADATA not in meta and run.column("_xid").null_count == \
        run.num_rows


#: PostgreSQL types (OIDs) a column may be widened among in place: every value of the first is the same value of
#: the second (int2 -> int4 -> int8 -> numeric, float4 -> float8, varchar -> text)
_WIDER = {21: {23, 20, 1700}, 23: {20, 1700}, 20: {1700}, 700: {701}, 1043: {25, 1043}, 1700: {1700}}


def _widens(old: list, new: list) -> bool:
    """Whether column `new` ([name, oid, typmod, ...]) holds every value of `old` unchanged."""
    (_, a, am), (_, b, bm) = old[:3], new[:3]
    if b not in _WIDER.get(a, ()):
        return False
    if a == b == 1700:          # numeric(p,s) -> numeric(p',s'): no fewer integer digits, no fewer decimals
        if bm == -1:
            return True
        if am == -1:
            return False
        p, sc = ((am - 4) >> 16) & 0xFFFF, (am - 4) & 0xFFFF
        q, t = ((bm - 4) >> 16) & 0xFFFF, (bm - 4) & 0xFFFF
        return t >= sc and q - t >= p - sc
    if a == b == 1043:          # varchar(n) -> varchar(m >= n) or unbounded
        return bm == -1 or (am != -1 and bm >= am)
    return True


def in_place(shape: list, after: dict) -> tuple | None:
    """What a captured ALTER TABLE did to the columns `shape` describes, when the Delta table can follow it in place
    exactly; None when the table must be read again.

    * ``("add", columns)``: columns added that every existing row holds as NULL (no default, no missing value, not
      generated or an identity, the table not rewritten);
    * ``("rename", {old: new})``: columns renamed, nothing else;
    * ``("drop", [names])``: columns dropped, nothing else;
    * ``("widen", [columns])``: columns retyped to a type that holds every old value unchanged, by a statement
      without ``USING`` (so the values were converted by the types' own cast), nothing else."""
    cols = after["columns"]
    now = [c[:4] for c in cols]
    if len(now) > len(shape):
        added = cols[len(shape):]
        if after.get("rewritten") or not _same_columns(now[:len(shape)], shape) or \
                any(c[3] or c[4] or c[5] or c[6] for c in added):
            return None
        return "add", [c[:4] for c in added]
    if len(now) < len(shape):
        if after.get("rewritten"):
            return None
        names = [c[0] for c in now]
        kept = [c for c in shape if c[0] in names]
        if [c[0] for c in kept] != names or not _same_columns(now, kept):
            return None
        return "drop", [c[0] for c in shape if c[0] not in names]
    renamed = {a[0]: b[0] for a, b in zip(shape, now) if a[0] != b[0]}
    if renamed:
        if after.get("rewritten") or not _same_columns([[renamed.get(c[0], c[0])] + c[1:] for c in shape], now):
            return None
        return "rename", renamed
    retyped = [(a, b) for a, b in zip(shape, now) if (a[1], a[2]) != (b[1], b[2])]
    if not retyped or "using" in str(after.get("statement") or "").lower() or \
            any(bool(a[3]) != bool(b[3]) for a, b in zip(shape, now)) or \
            not all(a[1] is not None and _widens(a, b) for a, b in retyped):
        return None
    return "widen", [b for _, b in retyped]


def _evolve(path: str, dt: Any, step: tuple, scd: int, fields: Callable[[list], list[pa.Field]]) -> None:
    """Apply an in-place step (:func:`in_place`) to the Delta table; each is idempotent (a replay after a crash finds
    it done). Adding columns writes no file; a rename, a widening and (SCD 1) a drop rewrite the table's files in
    one commit; a dropped column stays in an SCD 2 table for the versions that had it."""
    kind, what = step
    if kind == "add":
        _add_columns(dt, fields(what))
        return
    if kind == "drop" and scd == 2:
        return
    table = dt.to_pyarrow_table()
    if kind == "rename":
        if not any(old in table.column_names for old in what):
            return
        table = table.rename_columns([what.get(n, n) for n in table.column_names])
    elif kind == "drop":
        if not any(n in table.column_names for n in what):
            return
        table = table.drop_columns([n for n in what if n in table.column_names])
    else:
        for f in fields(what):
            i = table.schema.get_field_index(f.name)
            table = table.set_column(i, f, pc.cast(table.column(i), f.type, safe=True))
    from .delta_target import deltalake_module

    overwrite(path, dt, table)


def _add_columns(dt: Any, fields: list[pa.Field]) -> None:
    """Add nullable columns to the Delta table (a metadata commit: no file is written); those it has are kept."""
    import deltalake

    have = set(pa.schema(dt.schema().to_arrow()).names)
    new = [f for f in fields if f.name not in have]
    if new:
        dt.alter.add_columns(list(deltalake.Schema.from_arrow(pa.schema(new)).fields))


def _reread_into(path: str, snap: TableSnapshot, keys: Sequence[str], scd: int, token: tuple[str, int] | None,
                 keys_changed: Callable[[list[str]], list[str]] | None, result: ShapedResult) -> ShapedResult:
    """Write a re-read to the target and record its shape; a key the re-read's replica identity names replaces
    the target's where `keys_changed` (told the new key, answering the key to write with) agrees. Every column
    flagged is REPLICA IDENTITY FULL (or a key of every column), which names no key of its own."""
    flagged = [c[0] for c in snap.columns if c[3]]
    new_keys = [] if len(flagged) == len(snap.columns) else flagged
    if keys_changed is not None and new_keys != list(keys):
        keys = keys_changed(new_keys)
    _write_reread(path, snap, keys, scd, token)
    write_shape(path, snap.columns)
    result.reread_lsn = snap.lsn
    return result


def _concat(runs: list[pa.Table], dt: Any, scd: int) -> pa.Table:
    """Runs applied together. A run of truncates only holds no value of the table (its file may carry the columns
    the table had when the query started), so it brings none: it takes the columns of the others, or, alone, those
    of the Delta table (`dt`, None: not written yet), all NULL."""
    heads = list(S.CHANGE_COLUMNS)
    values = [r for r in runs if not _only_truncates(r)]
    if values:
        runs = [r.select(heads) if _only_truncates(r) else r for r in runs]
        return runs[0] if len(runs) == 1 else pa.concat_tables(runs, promote_options="default")
    if dt is None:
        return pa.concat_tables(runs, promote_options="default")
    only = pa.concat_tables([r.select(heads) for r in runs])
    held = arrow_schema_of(dt)
    for name in _table_names(dt, scd):
        f = held.field(name)
        only = only.append_column(f, pa.nulls(only.num_rows, f.type))
    return only


def _only_truncates(run: pa.Table) -> bool:
    return bool(pc.all(pc.equal(run.column("_change_type"), "truncate")).as_py())


def _delta_types(dt: Any, names: Sequence[str]) -> dict[str, pa.DataType]:
    from .delta_rewrite import arrow_schema

    return {f.name: f.type for f in arrow_schema(dt.schema()) if f.name in names}


def _table_names(dt: Any, scd: int) -> list[str]:
    """The Delta table's columns, its bookkeeping (sequence or validity columns) left out."""
    from .arrow_target import STATE_KIND
    from .resolve import DEFAULT_SEQUENCE, scd2_columns

    start, end = scd2_columns(list(DEFAULT_SEQUENCE))
    book = set(DEFAULT_SEQUENCE if scd == 1 else start + end) | {STATE_KIND}
    return [f.name for f in pa.schema(dt.schema().to_arrow()) if f.name not in book]


def _turn_to_text(path: str, dt: Any, names: Sequence[str]) -> None:
    """Turn the Delta table's columns `names` into string columns holding PostgreSQL's text of every value."""
    rows = _as_text(dt.to_pyarrow_table(), names)
    overwrite(path, dt, rows)


def _write_reread(path: str, snap: TableSnapshot, keys: Sequence[str], scd: int, token: tuple[str, int] | None
                  ) -> None:
    """Replace the target's rows by a re-read (SCD 1), or close its current versions at the re-read point and open
    the rows read (SCD 2), in one commit that records the re-read point and the idempotence token."""
    import shutil

    from .delta_target import STATE_DIR, deltalake_module, open_delta
    from .keyless import inserted_rows, keyless_plan
    from .resolve import DEFAULT_SEQUENCE, Stored, make_plan, resolve

    dl = deltalake_module()
    rows = snap.rows
    values = [f.name for f in _value_fields(rows.schema)]
    if keys:
        plan = make_plan(rows.column_names, list(keys), DEFAULT_SEQUENCE, scd, values)
        table_cols = plan.keys + [v for v in values if v not in plan.keys]
        new = resolve(rows, plan, Stored(), table_cols, {}).rows
    else:                                 # a table without a key: every row read, equal ones included
        plan = keyless_plan(rows.column_names, DEFAULT_SEQUENCE, scd, values)
        table_cols = values
        new = inserted_rows(rows, plan, table_cols)
    new = new.select(table_cols + [c for c in plan.bookkeeping() if c not in table_cols])
    if scd == 2:
        new = _with_history(open_delta(path), new, plan, snap)
    # the tombstones and truncates kept for the old rows are of no use once every later change is after the
    # re-read point (and may be keyed by columns the table no longer has): they go first, so a crash before the
    # commit below leaves a table that is re-read again
    shutil.rmtree(os.path.join(path, STATE_DIR), ignore_errors=True)
    txns = [dl.Transaction(REREAD_APP, snap.lsn)]
    if token is not None:
        txns.append(dl.Transaction(token[0], token[1]))
    overwrite(path, open_delta(path), new, dl.CommitProperties(app_transactions=txns))


def _with_history(dt: Any, new: pa.Table, plan: Any, snap: TableSnapshot) -> pa.Table:
    """An SCD 2 table after a re-read: its versions (current ones ended at the re-read point), then the rows read.
    A column the source no longer has is kept for the old versions (NULL in the new ones); a column whose values
    cannot be cast to its new type keeps the old ones as ``<name>__before_<LSN>``."""
    from .delta_rewrite import plain_type
    from .snapshot import SNAPSHOT_SEQ_BASE

    if dt is None:
        return new
    old = dt.to_pyarrow_table()
    old = old.cast(pa.schema([pa.field(f.name, plain_type(f.type)) for f in old.schema]))
    end_lsn, end_seq, end_ts = plan.end_cols
    alive = pc.is_null(old.column(end_lsn))
    ts = new.column(plan.start_cols[-1])[0] if new.num_rows else None
    for name, value in ((end_lsn, snap.lsn), (end_seq, SNAPSHOT_SEQ_BASE)):
        i = old.schema.get_field_index(name)
        col = old.column(i)
        old = old.set_column(i, old.schema.field(i), pc.if_else(alive, pa.scalar(value, col.type), col))
    if ts is not None:
        i = old.schema.get_field_index(end_ts)
        col = old.column(i)
        old = old.set_column(i, old.schema.field(i), pc.if_else(alive, ts.cast(col.type), col))
    for f in new.schema:
        i = old.schema.get_field_index(f.name)
        if i < 0 or old.schema.field(i).type == f.type:
            continue
        try:
            old = old.set_column(i, pa.field(f.name, f.type), pc.cast(old.column(i), f.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            old = old.rename_columns([f"{n}__before_{snap.lsn:X}" if n == f.name else n for n in old.column_names])
    order = list(new.column_names) + [n for n in old.column_names if n not in new.column_names]
    return pa.concat_tables([old, new], promote_options="default").select(order)
