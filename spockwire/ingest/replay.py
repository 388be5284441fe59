"""Replaying staged changes into table contents: what a downstream apply does, in plain Python.

Used by `spockwire demo` and the tests to check the staging against the source tables. Changes and truncates of a
table are applied in (`_commit_lsn`, `_seq`) order; an unchanged-TOAST column keeps the value the row had.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..model import ChangeBatch, Relation
from .staging import StagingState, read_staging

__all__ = ["replay_table"]

_CHANGE_COLUMNS = ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast")


def _python_rows(table: Any, name: str) -> list[dict[str, Any]]:
    namespace, _, relname = name.partition(".")
    columns = [c for c in table.column_names if c not in _CHANGE_COLUMNS]
    rel = Relation(0, namespace, relname, tuple(), None, 0)
    batches = table.combine_chunks().to_batches() if table.num_rows else []
    rows: list[dict[str, Any]] = []
    for rb in batches:
        rows.extend(ChangeBatch(rel, rb).to_pylist())
    del columns
    return rows


def replay_table(out_dir: str | Path, table: str, key_columns: Sequence[str]) -> dict[tuple, dict[str, Any]]:
    """The contents of `table` after every staged change and truncate: {key tuple: {column: value}}."""
    state = StagingState.load(out_dir)
    changes = _python_rows(read_staging(out_dir, table), table) if table in state.tables else []
    steps: list[tuple[int, int, int, Any]] = [(c["_commit_lsn"], c["_seq"], 1, c) for c in changes]
    for t in state.truncates:
        if table in t["tables"]:
            steps.append((t["commit_lsn"], t["seq"], 0, None))
    steps.sort(key=lambda s: (s[0], s[1], s[2]))
    contents: dict[tuple, dict[str, Any]] = {}
    pending_old_key: tuple | None = None
    for _lsn, _seq, kind, change in steps:
        if kind == 0:
            contents.clear()
            continue
        values = {k: v for k, v in change.items() if k not in _CHANGE_COLUMNS}
        key = tuple(values[k] for k in key_columns)
        ctype = change["_change_type"]
        if ctype == "update_preimage":
            pending_old_key = key
            continue
        if ctype == "delete":
            contents.pop(key, None)
            continue
        previous = contents.get(key)
        if ctype == "update_postimage" and pending_old_key is not None and pending_old_key != key:
            previous = contents.pop(pending_old_key, previous)
        pending_old_key = None
        for col in change["_unchanged_toast"] or ():
            values[col] = previous.get(col) if previous else None
        contents[key] = values
    return contents
