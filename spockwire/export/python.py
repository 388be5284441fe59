"""Python-object, pandas and numpy exports of change batches: spockwire.python_objects, where `ChangeBatch` finds
them (this path stays importable)."""
from __future__ import annotations

from ..python_objects import INFINITY, NEG_INFINITY, PgInfinity, date_text, numpy_view, timestamp_text, to_pandas, \
    to_pylist

__all__ = ["to_pylist", "to_pandas", "numpy_view", "date_text", "timestamp_text", "PgInfinity", "INFINITY",
           "NEG_INFINITY"]
