"""The Delta tables spockwire can apply changes to, found before anything is written.

Applied, through delta-rs (spockwire's own file rewrite where it may, delta-rs's own writers where a feature must be
kept up: docs/spark-reference.md): plain tables, partitioned tables, change data feed, CHECK constraints (a row
that breaks one fails the batch, which is not committed).

Refused with one line naming the feature and what to do, before the first read:

* deletion vectors: delta-rs reads and writes no table that has them;
* column mapping (``delta.columnMapping.mode`` name or id): delta-rs cannot write such a table's new columns;
* generated and identity columns: the writer must compute them, and delta-rs does not;
* ``delta.appendOnly``: updates and deletes cannot be applied;
* any other reader feature delta-rs does not know.
"""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["UnsupportedTableError", "unsupported_feature", "check_target"]

#: reader features delta-rs reads (tables with only these may be targets)
_READABLE = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "variantType", "variantType-preview"}

_checked: set[str] = set()
_lock = threading.Lock()


class UnsupportedTableError(ValueError):
    """A Delta table with a feature spockwire cannot apply changes to."""


def unsupported_feature(dt: Any) -> str | None:
    """What keeps changes from being applied to the Delta table `dt` (one line's reason and remedy), or None."""
    protocol = dt.protocol()
    conf = dt.metadata().configuration or {}
    readers = set(protocol.reader_features or ())
    if "deletionVectors" in readers or conf.get("delta.enableDeletionVectors", "").lower() == "true":
        return ("it uses deletion vectors (delta.enableDeletionVectors), which delta-rs can neither read nor write: "
                "write into a table created without them, or drop the feature (ALTER TABLE ... DROP FEATURE "
                "deletionVectors, Delta 3.1+)")
    if conf.get("delta.columnMapping.mode", "none").lower() != "none" or "columnMapping" in readers:
        return (f"it uses column mapping (delta.columnMapping.mode = {conf.get('delta.columnMapping.mode')}), "
                "whose new columns delta-rs cannot write: write into a table created without column mapping")
    if conf.get("delta.appendOnly", "").lower() == "true":
        return ("it is append-only (delta.appendOnly = true), so updates and deletes cannot be applied: set "
                "delta.appendOnly = false, or write into another table")
    for field in dt.schema().fields:
        meta = field.metadata or {}
        if "delta.generationExpression" in meta:
            return (f"its column {field.name!r} is generated ({meta['delta.generationExpression']}), which the "
                    "writer must compute and delta-rs does not: drop the generation expression, or write into a "
                    "table without it")
        if any(key.startswith("delta.identity.") for key in meta):
            return (f"its column {field.name!r} is an identity column, which the writer must fill and delta-rs "
                    "does not: write into a table without it")
    unknown = sorted(readers - _READABLE)
    if unknown:
        return f"it needs the reader features {', '.join(unknown)}, which delta-rs does not read"
    return None


def check_target(path: str, dt: Any = None) -> None:
    """UnsupportedTableError when the Delta table at `path` has a feature spockwire cannot apply changes to (checked
    once per table and process; no table yet: nothing to check)."""
    with _lock:
        if path in _checked:
            return
    if dt is None:
        from .delta_target import open_delta

        dt = open_delta(path)
        if dt is None:
            return
    reason = unsupported_feature(dt)
    if reason is not None:
        raise UnsupportedTableError(f"cannot apply changes to the Delta table {path}: {reason}")
    with _lock:
        _checked.add(path)
