"""Reading a staging folder: only the files the log names, in log order (docs/staging.md)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .staging_log import MESSAGES_SCHEMA, PathLike, StagingError, StagingState
from .stored_types import restore_table

__all__ = ["list_tables", "read_staging", "read_messages"]


def list_tables(out_dir: PathLike) -> list[str]:
    """The tables (``namespace.name``) the log knows: those with staged files, schema versions or truncates."""
    return StagingState.load(out_dir).tables


def _read_file(out: Path, rel: str) -> pa.Table:
    path = out / rel
    try:
        return restore_table(pq.ParquetFile(path).read())
    except FileNotFoundError:
        raise StagingError(f"staging file {path} named by the log is missing") from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise StagingError(f"cannot read staging file {path}: {exc}") from exc


def _concat(tables: list[pa.Table], what: str, hint: str = "") -> pa.Table:
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise StagingError(f"cannot combine the staged files of {what} into one table: {exc}{hint}") from exc


def read_staging(out_dir: PathLike, table: str | None = None, *, schema_version: int | None = None) -> pa.Table:
    """The staged row changes, from the files the log names, in log order.

    With `table` (``namespace.name``): that table's rows (all schema versions, columns unified; a column missing
    from an older version is null), or one version with `schema_version`. Without: the rows of every table, with
    a ``_table`` column first. Truncates are in the log (`StagingState.load(out).truncates`); order changes and
    truncates of a table by (`_commit_lsn`, `_seq`) to replay them.
    """
    out = Path(out_dir)
    state = StagingState.load(out)
    if table is not None:
        if table not in state.tables:
            known = ", ".join(state.tables) or "none"
            raise StagingError(f"no table {table!r} in the staging folder {out} (tables: {known})")
        files = [f for f in state.files.get(table, ()) if schema_version is None or f.schema_version == schema_version]
        if not files:
            return pa.table({})
        versions = sorted({f.schema_version for f in files})
        hint = "" if len(versions) == 1 else (f"; read its schema versions ({', '.join(map(str, versions))}) one "
                                              "at a time with schema_version=")
        return _concat([_read_file(out, f.path).replace_schema_metadata(None) for f in files], table, hint)
    ordered = sorted((f for fs in state.files.values() for f in fs), key=lambda f: (f.commit, f.path))
    parts = []
    for f in ordered:
        t = _read_file(out, f.path).replace_schema_metadata(None)
        parts.append(t.add_column(0, pa.field("_table", pa.string(), nullable=False),
                                  pa.array([f.table] * t.num_rows, pa.string())))
    if not parts:
        return pa.table({})
    return _concat(parts, "all tables (read one table at a time)")


def read_messages(out_dir: PathLike) -> pa.Table:
    """The staged logical messages in log order (columns: MESSAGES_SCHEMA)."""
    out = Path(out_dir)
    state = StagingState.load(out)
    parts = [_read_file(out, m["path"]) for m in state.message_files]
    if not parts:
        return MESSAGES_SCHEMA.empty_table()
    return pa.concat_tables(parts)
