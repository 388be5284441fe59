"""A plain-Python model of AUTO CDC's documented semantics (``create_auto_cdc_flow``), for checking what
`spockwire.spark.autocdc_changes` feeds it against the `apply_changes` oracle (tests/apply_oracle.py).

AUTO CDC cannot run here (it needs a MERGE-capable target, Delta or Iceberg jars), so its behaviour is modelled
from its documentation: Apache Spark's Declarative Pipelines programming guide ("Change Data Capture (CDC) with
Auto CDC", "SCD Type 2: Keeping History"; apache/spark docs/declarative-pipelines-programming-guide.md) and
Databricks' reference (https://docs.databricks.com/aws/dlt-ref/dlt-python-ref-apply-changes):

* every event is an upsert of its key (the row becomes the event's columns, all of them) unless
  ``apply_as_deletes`` holds, which removes the key;
* per key, the event with the highest ``sequence_by`` value wins; an event older than what is recorded for its key
  (a delete's tombstone included) is discarded, whatever order the events arrive in;
* SCD type 2: each upsert opens a version with ``__START_AT`` = its sequence value, ended (``__END_AT``) by the
  key's next event, an upsert or a delete; an upsert that changes none of the tracked columns (by default every
  column but the keys) opens no version.
"""
from __future__ import annotations

from typing import Iterable, Sequence

Event = dict


def _position(e: Event) -> tuple[int, int]:
    return (e["_commit_lsn"], e["_seq"])


def scd1(batches: Iterable[Sequence[Event]], keys: Sequence[str], columns: Sequence[str]) -> dict[tuple, tuple]:
    """The SCD 1 table after the batches (applied one after the other, in the order given): key -> row."""
    state: dict[tuple, tuple[tuple[int, int], tuple | None]] = {}
    for batch in batches:
        for e in sorted(batch, key=_position):
            key = tuple(e[k] for k in keys)
            seen = state.get(key)
            if seen is not None and seen[0] >= _position(e):
                continue                                  # older than what the key holds: discarded
            row = None if e["_change_type"] == "delete" else tuple(e[c] for c in columns)
            state[key] = (_position(e), row)             # a delete leaves a tombstone
    return {k: row for k, (_pos, row) in state.items() if row is not None}


def scd2(events: Iterable[Event], keys: Sequence[str], columns: Sequence[str]) -> set[tuple]:
    """Every SCD 2 version: (row..., __START_AT, __END_AT), positions as (_commit_lsn, _seq), None when open."""
    by_key: dict[tuple, list[Event]] = {}
    for e in events:
        by_key.setdefault(tuple(e[k] for k in keys), []).append(e)
    tracked = [c for c in columns if c not in keys]
    out = set()
    for evs in by_key.values():
        evs.sort(key=_position)
        current: list | None = None
        for e in evs:
            if e["_change_type"] == "delete":
                if current is not None:
                    current[2] = _position(e)
                    out.add(tuple(current[0]) + (current[1], current[2]))
                current = None
                continue
            row = tuple(e[c] for c in columns)
            if current is not None and all(current[0][columns.index(c)] == e[c] for c in tracked):
                continue                                  # no tracked column changed: no new version
            if current is not None:
                current[2] = _position(e)
                out.add(tuple(current[0]) + (current[1], current[2]))
            current = [row, _position(e), None]
        if current is not None:
            out.add(tuple(current[0]) + (current[1], None))
    return out
