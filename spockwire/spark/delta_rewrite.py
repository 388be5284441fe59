"""Copy-on-write of a Delta table's data files through delta-rs's transaction API, instead of its MERGE.

`apply_changes` reads the data files that may hold a batch's keys whole (their statistics say which) to find the
stored rows; those same rows then give the files that hold a changed key: each is rewritten without the replaced
rows, the batch's new rows are added, and one commit removes the old files and adds the new ones. The files are
read once and no join engine runs: for a batch touching most of a table this costs about what reading and writing
its files costs (delta-rs's MERGE reads them again and joins).

Only plain tables take this path (`rewritable`): no partition columns, no column mapping, deletion vectors, change
data feed, constraints, invariants, generated or identity columns -- anything delta-rs's own writers must keep up
to date. The others, and a batch adding columns, are merged by delta-rs.

The new files are sorted by the key (one key column of a sortable type), so a later batch's key lookup prunes to
the few files whose key range holds its keys, and carry the statistics Delta readers use for that (row count,
null counts; min/max of integer, floating, boolean, string, date and timestamp columns where JSON holds them
exactly: a column holding NaN, an infinite float, or a date or timestamp outside years 1 to 9999 gets none). Such
a column also leaves the table's statistics columns before the value is written (`stats_configuration`,
`keep_stats_exact`), so that no writer, delta-rs's own included, writes bounds for it.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .arrow_target import keys_in, unify
from .file_rows import file_rows

__all__ = ["FILE_COLUMN", "STATS_COLUMNS", "StoredFiles", "append_files", "arrow_schema", "exact_values",
           "file_sizes", "delta_stats_json", "keep_stats_exact", "local_root", "plain_type", "rewritable",
           "rewrite_supported", "rewrite_files", "stats_configuration"]

#: the column giving each stored row's data file, by its index among the files read (a pyarrow dataset field)
FILE_COLUMN = "__fragment_index"
#: writer features a rewrite keeps intact (it only removes and adds plain data files)
_HARMLESS_WRITER_FEATURES = {"appendOnly", "invariants", "timestampNtz"}
#: reader features files written by pyarrow satisfy as they are
_HARMLESS_READER_FEATURES = {"timestampNtz"}
_UNSAFE_CONFIG = ("delta.enableChangeDataFeed", "delta.enableDeletionVectors", "delta.columnMapping.mode",
                  "delta.enableRowTracking", "delta.appendOnly")


@dataclass
class StoredFiles:
    """The rows of the data files read for a batch, each with its file (`FILE_COLUMN`: an index into `names`)."""

    rows: pa.Table | None           #: (None once a rewrite used them)
    hit: np.ndarray                 #: the rows whose key the batch touches
    names: list[str]                #: the files, as the table's log names them
    sizes: list[int]                #: their sizes in bytes


def rewrite_supported() -> bool:
    """Whether the installed deltalake commits remove actions of our own (`RemoveAction`: deltalake 1.6.6 and
    later); without it every write goes through delta-rs's own writers."""
    try:
        from deltalake.transaction import RemoveAction  # noqa: F401
    except ImportError:
        return False
    return True


def rewritable(dt: Any) -> bool:
    """Whether delta-rs's table `dt` is plain enough to rewrite its files without its MERGE (see the module)."""
    if not rewrite_supported():
        return False
    meta = dt.metadata()
    if meta.partition_columns:
        return False
    proto = dt.protocol()
    if set(proto.reader_features or ()) - _HARMLESS_READER_FEATURES or proto.min_reader_version == 2:
        return False                                    # reader version 2: column mapping; 3: features listed
    if proto.min_writer_version > 2 and not (proto.min_writer_version == 7 and
                                            set(proto.writer_features or ()) <= _HARMLESS_WRITER_FEATURES):
        return False
    conf = {k: str(v).lower() for k, v in (meta.configuration or {}).items()}
    if any(k.startswith("delta.constraints.") for k in conf):
        return False
    for key in _UNSAFE_CONFIG:
        if conf.get(key) not in (None, "false", "none"):
            return False
    # invariants, generation expressions, identity columns, column mapping: in the fields' metadata
    return not any(str(k).startswith("delta.") for f in dt.schema().fields for k in (f.metadata or {}))


def file_sizes(dt: Any) -> dict[str, int]:
    """Each active data file's path (as the log names it) and size."""
    actions = pa.table(dt.get_add_actions(flatten=False))
    return dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))


def rewrite_files(dt: Any, stored: StoredFiles, match: pa.Table, match_by: Sequence[str], written: pa.Table,
                  keys: Sequence[str], schema: pa.Schema, target_file_size: int, commit: Any) -> dict:
    """One commit: every file of `stored` holding a row whose `match_by` columns equal a row of `match` is
    replaced by its other rows; `written` (in `schema`'s columns) is added. Returns MERGE-like metrics."""
    started = time.perf_counter()
    rows = stored.rows
    # the rows replaced: among those of touched keys, the ones matching a row of the batch
    hit = np.zeros(rows.num_rows, dtype=bool)
    touched = np.flatnonzero(stored.hit)
    if touched.size and match.num_rows:
        hit[touched[keys_in(rows.select(list(match_by)).take(touched), match_by, match)]] = True
    frag = rows.column(FILE_COLUMN).to_numpy()
    replaced = np.unique(frag[hit])
    in_replaced = np.isin(frag, replaced)
    kept = np.flatnonzero(in_replaced & ~hit)
    copied, replaced_rows, old_rows = kept.size, int(hit.sum()), int(in_replaced.sum())
    stored.rows = None
    # the new files' rows: the kept rows of the files read and the batch's rows, gathered file by file as they are
    # written (no copy of the kept rows as a whole)
    source = pa.concat_tables([unify(rows.drop_columns([FILE_COLUMN]), schema), unify(written, schema)])
    picked = np.concatenate([kept, np.arange(rows.num_rows, source.num_rows, dtype=np.int64)])
    del rows
    removed = [stored.names[i] for i in replaced]
    sizes = [stored.sizes[i] for i in replaced]
    rows_per_file = _rows_per_file(sum(sizes), old_rows, written, target_file_size)
    root = local_root(dt)
    adds = _write(root, source, rows_per_file, _key_order(source, keys, picked))
    now = int(time.time() * 1000)
    from deltalake.transaction import RemoveAction

    actions = adds + [RemoveAction(path=p, data_change=True, deletion_timestamp=now, size=s, partition_values={})
                      for p, s in zip(removed, sizes)]
    if actions or commit is not None:
        dt.create_write_transaction(actions, mode="append", schema=dt.schema(), commit_properties=commit)
    held = file_rows()
    if held is not None:
        held.drop(os.path.abspath(os.path.join(root, p)) for p in removed)     # no longer in the table
    return {"num_target_files_removed": len(removed), "num_target_files_added": len(adds),
            "num_target_rows_copied": copied, "num_target_rows_replaced": replaced_rows,
            "num_output_rows": int(picked.size), "execution_time_ms": int((time.perf_counter() - started) * 1000),
            "rewritten": True}


def append_files(path: str, dt: Any, rows: pa.Table, keys: Sequence[str], target_file_size: int, commit: Any,
                 configuration: dict[str, str] | None = None) -> bool:
    """`rows` added to the table (`dt`; None: created at `path` with `configuration`) as new files, sorted by the
    key, in one commit. False, having written nothing, when the rows' types are not Delta's as they are (delta-rs's
    own writer converts them then)."""
    from deltalake import Schema as DeltaSchema

    if dt is not None:
        schema = arrow_schema(dt.schema())
        if set(schema.names) != set(rows.column_names):
            return False
    else:
        try:
            delta_schema = DeltaSchema.from_arrow(rows.schema)
        except Exception:  # noqa: BLE001 - a type Delta has no direct equivalent of
            return False
        schema = arrow_schema(delta_schema)
        if [f.type for f in schema] != [plain_type(f.type) for f in rows.schema]:
            return False
    table = unify(rows, schema)
    if dt is None:
        os.makedirs(path, exist_ok=True)
    adds = _write(path, table, _rows_per_file(0, 0, table, target_file_size), _key_order(table, keys))
    if dt is None:
        from deltalake.transaction import create_table_with_add_actions

        create_table_with_add_actions(path, delta_schema, adds, mode="error", configuration=configuration,
                                      commit_properties=commit)
    else:
        dt.create_write_transaction(adds, mode="append", schema=dt.schema(), commit_properties=commit)
    return True


def arrow_schema(delta_schema: Any) -> pa.Schema:
    """A Delta schema as the Arrow schema of the files written for it (plain, not view or large, types)."""
    return pa.schema([pa.field(f.name, plain_type(f.type), f.nullable) for f in pa.schema(delta_schema.to_arrow())])


def plain_type(t: pa.DataType) -> pa.DataType:
    """The plain Arrow type for a type delta-rs reads as a view or large type."""
    if hasattr(pa, "string_view") and t == pa.string_view() or t == pa.large_string():
        return pa.string()
    if hasattr(pa, "binary_view") and t == pa.binary_view() or t == pa.large_binary():
        return pa.binary()
    if pa.types.is_large_list(t):
        return pa.list_(plain_type(t.value_type))
    return t


def _key_order(table: pa.Table, keys: Sequence[str], rows: np.ndarray | None = None) -> pa.Array | None:
    """The row order (indices into `table`) that sorts `rows` (row indices; None: all of `table`) by the key (one
    column of a sortable type); None: all rows in the order they have (already sorted, or not sortable so)."""
    col = table.column(keys[0]) if len(keys) == 1 else None
    if rows is not None and rows.size == table.num_rows and (rows[1:] > rows[:-1]).all():
        rows = None                                        # every row, in order
    if col is None or not _sortable(col.type) or (rows.size if rows is not None else table.num_rows) < 2:
        return None if rows is None else pa.array(rows)
    if rows is not None:
        col = col.take(pa.array(rows))
    if (pa.types.is_integer(col.type) or pa.types.is_date(col.type) or pa.types.is_timestamp(col.type)) \
            and col.null_count == 0:
        values = col.to_numpy()
        if (values[1:] >= values[:-1]).all():
            return None if rows is None else pa.array(rows)
    order = pc.sort_indices(col)
    return order if rows is None else pa.array(rows[order.to_numpy()])


def _sortable(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_string(t) \
        or pa.types.is_large_string(t)


def _rows_per_file(old_bytes: int, old_rows: int, new: pa.Table, target: int) -> int:
    """Rows per new file for files of about `target` bytes: the replaced files' bytes per row, else those of the
    rows of `new` in Arrow."""
    if old_rows > 0 and old_bytes > 0:
        per_row = old_bytes / old_rows
    else:
        per_row = max(new.nbytes / max(new.num_rows, 1) / 3, 1.0)    # Parquet: about a third of Arrow's size
    return max(1024, int(target / per_row))


def _write(root: str, table: pa.Table, rows_per_file: int, order: pa.Array | None) -> list:
    """The rows of `table` in `order` (row indices; None: all, as they are), as new Parquet files in the table's
    folder (rows_per_file rows each); their add actions. Each file's rows are gathered as it is written: the rows
    are never copied as a whole."""
    from deltalake.transaction import AddAction

    total = table.num_rows if order is None else len(order)
    if total == 0:
        return []
    n = math.ceil(total / rows_per_file)
    step = math.ceil(total / n)
    run = uuid.uuid4()
    # dictionaries only where values repeat as a rule (strings): for numbers they cost more than they save
    dictionary = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                  or pa.types.is_binary(f.type)]
    held = file_rows()

    def one(i: int) -> Any:
        part = table.slice(i * step, step) if order is None else table.take(order.slice(i * step, step))
        name = f"part-{i:05d}-{run}-c000.snappy.parquet"
        path = os.path.join(root, name)
        pq.write_table(part, path, compression="snappy", row_group_size=max(part.num_rows, 1),
                       use_dictionary=dictionary)
        if held is not None:
            held.put(os.path.abspath(path), part)           # file_rows.py: the next batch that needs this file whole has it
        st = os.stat(path)
        return AddAction(name, st.st_size, {}, int(st.st_mtime * 1000), True, delta_stats_json(part))

    with ThreadPoolExecutor(max_workers=min(n, os.cpu_count() or 2)) as pool:
        return list(pool.map(one, range(n)))


def local_root(dt: Any) -> str:
    """The folder of the local Delta table `dt` (ValueError: not a local table)."""
    uri = dt.table_uri
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" in uri:
        raise ValueError(f"rewrite_files writes local tables only, not {uri}")
    return uri


def delta_stats_json(table: pa.Table) -> str:
    """Delta statistics of a data file (JSON): numRecords, nullCount of every top-level column, minValues and
    maxValues of the columns whose bounds JSON holds as Delta readers read them (see `_bounds`)."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in table.schema:
        t = f.type
        if pa.types.is_nested(t):
            continue
        col = table.column(f.name)
        nulls[f.name] = col.null_count
        if col.null_count == len(col):
            continue
        bounds = _bounds(col, t)
        if bounds is not None:
            mins[f.name], maxs[f.name] = bounds
    # characters as they are: the log's reader decodes a JSON escape of a character beyond U+FFFF (a surrogate
    # pair) to another character
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                      separators=(",", ":"), ensure_ascii=False)


#: the first and the last day (since 1970) Delta's statistics can name: years 1 to 9999, as ``yyyy-MM-dd``
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896
_DAY_US = 86_400_000_000
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
#: a string longer than this is bounded by its prefix in the statistics (as delta-rs's writer bounds it)
STATS_STRING_PREFIX = 64


def _bounds(col: Any, t: pa.DataType) -> tuple[Any, Any] | None:
    """The min and max of a column (not all NULL) as its Delta statistics hold them, or None where they cannot be
    written exactly: NaN and infinities (no JSON number), dates and timestamps outside years 1 to 9999 (±infinity
    included), decimals, binary, naive timestamps. Timestamps are widened to whole milliseconds; a string longer
    than STATS_STRING_PREFIX is bounded by its prefix (below it) and by the prefix with its last character raised
    (above it, when one can be)."""
    if pa.types.is_floating(t):
        if not pc.all(pc.is_finite(col)).as_py():
            return None
    elif pa.types.is_date32(t):
        lo, hi = _instants(col, t)
        return (_day(lo), _day(hi)) if _in_years(lo, hi, t) else None
    elif pa.types.is_timestamp(t):
        if t.tz is None:
            return None
        lo, hi = _instants(col, t)
        lo, hi = lo // 1000 * 1000, -(-hi // 1000) * 1000
        return (_ts(lo), _ts(hi)) if _in_years(lo, hi, t) else None
    elif not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
              or pa.types.is_large_string(t)):
        return None
    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if isinstance(hi, str) and len(hi) > STATS_STRING_PREFIX:
        hi = _above_prefix(hi[:STATS_STRING_PREFIX]) or hi
    if isinstance(lo, str):
        lo = lo[:STATS_STRING_PREFIX]
    return lo, hi


def exact_values(col: Any) -> bool:
    """Whether Delta's statistics and Python hold every value of a column exactly: no NaN or infinite float, no
    date or timestamp outside years 1 to 9999 (±infinity is the largest or smallest day or microsecond count), in
    the column or in the lists and structs it holds."""
    t = col.type
    if pa.types.is_floating(t):
        return pc.all(pc.is_finite(col)).as_py() is not False
    if pa.types.is_date32(t) or pa.types.is_timestamp(t):
        return col.null_count == len(col) or _in_years(*_instants(col, t), t)
    if not _holds_loose_type(t):
        return True
    if pa.types.is_struct(t):
        return all(exact_values(pc.struct_field(col, [i])) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return exact_values(pc.map_keys(col)) and exact_values(pc.map_values(col))
    return exact_values(pc.list_flatten(col))


def _holds_loose_type(t: pa.DataType) -> bool:
    """A type of values `exact_values` may refuse, or a list, struct or map holding one."""
    if pa.types.is_floating(t) or pa.types.is_date(t) or pa.types.is_timestamp(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_loose_type(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _holds_loose_type(t.key_type) or _holds_loose_type(t.item_type)
    return pa.types.is_nested(t) and _holds_loose_type(t.value_type)


def _instants(col: Any, t: pa.DataType) -> tuple[int, int]:
    """The smallest and largest day (date32) or microsecond (timestamp; nanoseconds widened to whole
    microseconds) since 1970 of a column that is not all NULL."""
    mm = pc.min_max(col.cast(pa.int32() if pa.types.is_date32(t) else pa.int64())).as_py()
    lo, hi = mm["min"], mm["max"]
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            return lo // 1000, -(-hi // 1000)
        per_us = {"s": 1_000_000, "ms": 1_000, "us": 1}[t.unit]
        return lo * per_us, hi * per_us
    return lo, hi


def _in_years(lo: int, hi: int, t: pa.DataType) -> bool:
    """Whether days (date32) or microseconds (timestamp) since 1970 from `lo` to `hi` lie in years 1 to 9999."""
    if pa.types.is_date32(t):
        return _FIRST_DAY <= lo and hi <= _LAST_DAY
    return _FIRST_DAY * _DAY_US <= lo and hi < (_LAST_DAY + 1) * _DAY_US


def _day(days: int) -> str:
    """A date bound (days since 1970, years 1 to 9999) as Delta's statistics hold it."""
    return _dt.date.fromordinal(days + _EPOCH_ORDINAL).isoformat()


def _ts(micros: int) -> str:
    """A timestamp bound (microseconds since 1970, years 1 to 9999) as Delta's statistics hold it, to the
    millisecond."""
    v = _dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=micros)
    return f"{v.year:04d}-{v:%m-%dT%H:%M:%S}.{v.microsecond // 1000:03d}Z"


def _above_prefix(prefix: str) -> str | None:
    """The shortest string above every string starting with `prefix`: its last character that can be raised,
    raised by one (None when none can)."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code <= 0x10FFFF:
            return prefix[:i] + chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)
    return None


# ---------------------------------------------------------------------------------------------------------------
# the statistics columns

#: the table property naming the columns whose statistics Delta writers keep and readers use
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
_NUM_INDEXED = "delta.dataSkippingNumIndexedCols"


def stats_configuration(rows: pa.Table) -> dict[str, str]:
    """The statistics columns of a table created with `rows` (a table property): the columns `delta_stats_json` bounds
    exactly (numbers, booleans, strings, dates, timestamps with a time zone) and whose values in `rows` it can
    bound. Only these get min/max statistics, from any writer: delta-rs's writers otherwise fail on ±infinity or
    write bounds its readers reject (years outside 1 to 9999) or that are wrong (NaN left out), and delta-rs's
    Arrow reader takes a file without a column's min/max as holding no value of it."""
    return {STATS_COLUMNS: ",".join(_stats_name(f.name) for f in rows.schema
                                    if _bounded_type(f.type) and exact_values(rows.column(f.name)))}


def keep_stats_exact(dt: Any, rows: pa.Table) -> bool:
    """Before `rows` are added to the table `dt`: its statistics columns holding a value of `rows` that no exact
    min/max can bound (`exact_values`) leave its statistics (`stats_configuration`), in one commit that changes
    only the table's properties; the columns whose type `delta_stats_json` does not bound leave with them. True when it
    committed."""
    conf = dt.metadata().configuration or {}
    schema = arrow_schema(dt.schema())
    entries = _stats_entries(conf.get(STATS_COLUMNS)) if conf.get(STATS_COLUMNS) is not None else None
    if entries is None:
        limit = int(conf.get(_NUM_INDEXED) or 32)
        first, leaves = [], 0
        for f in schema:
            if limit < 0 or leaves < limit:
                first.append(f.name)
            leaves += _leaves(f.type)
        entries = [[name] for name in first]
    drop = {e[0] for e in entries if e[0] in rows.column_names and not exact_values(rows.column(e[0]))}
    if not drop:
        return False
    types = {f.name: f.type for f in schema}
    kept = [e for e in entries if e[0] not in drop and (len(e) > 1 or _bounded_type(types.get(e[0], pa.null())))]
    dt.alter.set_table_properties({STATS_COLUMNS: ",".join(".".join(_stats_name(p) for p in e) for e in kept)})
    return True


def _bounded_type(t: pa.DataType) -> bool:
    """A type whose min/max `delta_stats_json` writes."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t) and t.tz is not None)


def _leaves(t: pa.DataType) -> int:
    """The Parquet leaf columns of a column of type `t` (what delta.dataSkippingNumIndexedCols counts)."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    return _leaves(t.value_type) if pa.types.is_nested(t) else 1


def _stats_name(name: str) -> str:
    """A column name as delta.dataSkippingStatsColumns lists it: quoted with backticks unless a plain identifier."""
    plain = name[:1].isascii() and (name[:1].isalpha() or name[:1] == "_") and \
        all(c.isascii() and (c.isalnum() or c == "_") for c in name)
    return name if plain else "`" + name.replace("`", "``") + "`"


def _stats_entries(text: str) -> list[list[str]]:
    """The entries of a delta.dataSkippingStatsColumns value, each the parts of a column path (backticks
    unquoted)."""
    entries: list[list[str]] = []
    parts: list[str] = []
    part, quoted, i = "", False, 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "`" and text[i + 1:i + 2] == "`":
                part += "`"
                i += 1
            elif c == "`":
                quoted = False
            else:
                part += c
        elif c == "`":
            quoted = True
        elif c in ".,":
            parts.append(part.strip())
            part = ""
            if c == ",":
                entries.append(parts)
                parts = []
        else:
            part += c
        i += 1
    parts.append(part.strip())
    entries.append(parts)
    return [e for e in entries if e != [""]]
