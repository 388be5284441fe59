"""One writer per Delta table: the streaming query that lands a table owns it.

The owner is the table property ``spockwire.owner``: the application id the query records its micro-batches under
(``spockwire-<query id>``, the id Spark keeps in the query's checkpoint). Before a query writes a table for the
first time in a run, :class:`Ownership` checks it:

* a table the query creates is its own from its first commit on (the property is set right after it);
* an existing table without the property (written before owners were recorded, or by something else) is taken;
* a table owned by this query is written;
* a table owned by another query -- another job, the same job with a new checkpoint, a second copy of the job -- is
  refused with one line naming the owner, unless the job was told to take tables over (``--take-over``), which
  records the new owner first.

A table without ``delta.checkpointInterval`` gets the job's (delta_target.CHECKPOINT_INTERVAL) in the same commit.
"""
from __future__ import annotations

from typing import Any

__all__ = ["OWNER_PROPERTY", "TableOwnedError", "Ownership"]

#: the table property naming the query that writes the table
OWNER_PROPERTY = "spockwire.owner"


class TableOwnedError(ValueError):
    """The table is written by another streaming query."""


class Ownership:
    """The tables a query has checked (see the module). `app_id`: the query's application id; `take_over`: take
    tables owned by another query."""

    def __init__(self, take_over: bool = False) -> None:
        self.take_over = take_over
        # (no lock: over Spark Connect the job's function, this with it, is pickled; a table checked twice by two
        # threads at once is only set to the same owner twice)
        self._checked: set[str] = set()

    def check(self, path: str, app_id: str) -> bool:
        """Raise TableOwnedError when another query owns the Delta table at `path`; record this one as its owner when
        the table has none (or, taking over, another). Once per table and run. False when there is no table yet:
        call :meth:`claim` once the query created it."""
        if path in self._checked:
            return True
        from .delta_target import CHECKPOINT_INTERVAL, CHECKPOINT_PROPERTY, open_delta

        dt = open_delta(path)
        if dt is None:
            return False
        conf = dt.metadata().configuration or {}
        owner = conf.get(OWNER_PROPERTY)
        props = {}
        if owner != app_id:
            if owner is not None and not self.take_over:
                raise TableOwnedError(
                    f"{path} is written by another streaming query ({owner}): a second job, or this job with a new "
                    "checkpoint, would land every change twice. Stop the other one; to make this job the table's "
                    "writer deliberately, run it with --take-over (JobConfig.take_over)")
            props[OWNER_PROPERTY] = app_id
        if CHECKPOINT_PROPERTY not in conf:        # (a table written before, or by something else: its log replays
            props[CHECKPOINT_PROPERTY] = str(CHECKPOINT_INTERVAL)      # stay short as the job commits to it)
        if props:
            dt.alter.set_table_properties(props, raise_if_not_exists=False)
        self._checked.add(path)
        return True

    def claim(self, path: str, app_id: str) -> None:
        """A table this query created: record it as the owner (when the write created it)."""
        self.check(path, app_id)
