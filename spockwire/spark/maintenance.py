"""Keeping `apply_changes` targets fast for months: collecting the state, compacting, vacuuming.

* :func:`collect_state` removes the tombstones and truncates a target remembers (``_spockwire_state``) that lie
  before a position no change can come before any more, and records that position: a later call with older
  changes is refused (:class:`spockwire.errors.StaleChangesError`) instead of bringing back a deleted key.
* :func:`optimize` rewrites a Delta table's data files: Z-ordered by the key (files with narrow key ranges, which
  the key lookup of every micro-batch prunes on) or compacted (small files binned together).
* :func:`vacuum` deletes the files no version within the retention period references.
* :class:`Maintenance` is the pipeline job's step after a micro-batch: it decides per table when to do the above.

Every step is one Delta commit that changes no row of the table (the state's collection changes only what no
future change can need), so a crash between or during steps loses nothing and resurrects nothing: files a killed
step wrote are referenced by no commit, and a later :func:`vacuum` removes them once older than the retention.
The table's idempotence tokens (Delta ``txn`` actions) are part of the table's state, which an OPTIMIZE commit
keeps: a micro-batch replayed after an OPTIMIZE is still skipped.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_target import collected_state, unify
from .delta_rewrite import arrow_schema, keep_stats_exact, plain_type
from .delta_target import STATE_DIR, TARGET_FILE_BYTES, delta_dataset, open_delta
from .file_rows import keep_table, open_table
from .resolve import DEFAULT_SEQUENCE

__all__ = ["collect_state", "optimize", "vacuum", "table_files", "TableFiles", "Maintenance", "MaintenanceOptions",
           "count_option", "retention_option",
           "DEFAULT_SMALL_FILES", "DEFAULT_VACUUM_RETENTION_HOURS", "MIN_VACUUM_RETENTION_HOURS"]

#: OPTIMIZE a table once it has this many small files (data files under half the target file size)
DEFAULT_SMALL_FILES = 32
#: VACUUM keeps the files of the last 7 days of versions (Delta's own default, delta.deletedFileRetentionDuration)
DEFAULT_VACUUM_RETENTION_HOURS = 168.0
#: no shorter retention is accepted: a reader still reading a version whose files were vacuumed fails
MIN_VACUUM_RETENTION_HOURS = 1.0


def collect_state(target: str, before: tuple, *, format: str = "delta",
                  sequence_by: Sequence[str] | str = DEFAULT_SEQUENCE) -> int:
    """Forget the target's tombstones and truncates before the position `before` (a tuple of the `sequence_by`
    values, default ``(_commit_lsn, _seq)``): the caller's promise that no change before it can arrive any more.

    A streaming query's ``foreachBatch`` may replay its current micro-batch (after a failure) but never an earlier
    one, and every later micro-batch holds later changes: so `before` can be the first position among the current
    micro-batch's changes of the table (:func:`spockwire.spark.resolve.first_position`), once they are applied.

    The target records `before`; :func:`spockwire.spark.apply_changes` then refuses changes older than it
    (:class:`spockwire.errors.StaleChangesError`), which without their tombstones could bring a deleted key back.
    Delta: one commit to ``_spockwire_state``, none when nothing is to be forgotten. Returns the rows removed."""
    seq = [sequence_by] if isinstance(sequence_by, str) else list(sequence_by)
    before = tuple(before)
    if len(before) != len(seq):
        raise ValueError(f"before={before!r} needs one value per sequence column {seq}")
    if format == "parquet":
        return _collect_parquet(target, before, seq)
    if format != "delta":
        raise ValueError(f"collect_state: unknown format {format!r}: use delta or parquet (memory keeps no state)")
    return _collect_delta(target, before, seq)


def _collect_delta(target: str, before: tuple, seq: list[str]) -> int:
    from .delta_target import deltalake_module

    state = open_delta(os.path.join(target, STATE_DIR))
    if state is None:
        return 0
    kept, removed = collected_state(unify(delta_dataset(state).to_table(), arrow_schema(state.schema())),
                                    _SeqOnly(seq), before)
    if removed == 0:
        return 0
    keep_stats_exact(state, kept)
    # one commit: the state as collected (the forgotten rows and the earlier mark out, the new mark in)
    deltalake_module().write_deltalake(state, kept, mode="overwrite")
    return removed


@dataclass
class _SeqOnly:
    """The part of a plan that state rows need: the sequence columns."""

    seq: list[str]


def _collect_parquet(target: str, before: tuple, seq: list[str]) -> int:
    import shutil
    import uuid

    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    path = os.path.join(target[len("file:"):] if target.startswith("file:") else target, STATE_DIR)
    if not os.path.isdir(path):
        return 0
    state = pads.dataset(path, format="parquet").to_table()
    if state.num_rows == 0:
        return 0
    kept, removed = collected_state(state, _SeqOnly(seq), before)
    if removed == 0:
        return 0
    tmp = f"{path}.spockwire-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    pq.write_table(kept, os.path.join(tmp, "part-00000.parquet"))
    old = f"{tmp}.old"
    os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return removed


# ---------------------------------------------------------------------------------------------------------------
# files

@dataclass
class TableFiles:
    """A Delta table's data files: how many, how many small (under half the target file size), and its rows."""

    files: int = 0
    small_files: int = 0
    rows: int = 0


def table_files(dt: Any, target_size: int = TARGET_FILE_BYTES) -> TableFiles:
    """The data files of a Delta table (a `deltalake.DeltaTable`, or None: no table)."""
    if dt is None:
        return TableFiles()
    adds = pa.table(dt.get_add_actions(flatten=True))
    if adds.num_rows == 0:
        return TableFiles()
    sizes = adds.column("size_bytes")
    small = pc.sum(pc.cast(pc.less(sizes, target_size // 2), pa.int64())).as_py() or 0
    rows = (pc.sum(adds.column("num_records")).as_py() or 0) if "num_records" in adds.column_names else 0
    return TableFiles(adds.num_rows, int(small), int(rows))


def _prunable(t: pa.DataType) -> bool:
    """A key type whose files the key lookup prunes by their min/max statistics (delta_target._key_pruning)."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_date(t)
            or pa.types.is_timestamp(t))


def optimize(target: str, keys: Sequence[str] | None = None, *, zorder: bool = True,
             target_size: int = TARGET_FILE_BYTES) -> dict:
    """OPTIMIZE a Delta table: Z-order by `keys` (`zorder`; every data file rewritten, each then holding a narrow
    range of keys) or compact its small files. Z-order only where it helps the key lookup's file pruning: keys of
    types pruned on their statistics (numbers, text, dates, timestamps); others are compacted. One commit that
    changes no row; its metrics."""
    dt = open_delta(target)
    if dt is None:
        return {}
    if zorder and keys:
        types = {f.name: plain_type(f.type) for f in pa.schema(dt.schema().to_arrow())}
        if all(k in types and _prunable(types[k]) for k in keys):
            return dt.optimize.z_order(list(keys), target_size=target_size)
    return dt.optimize.compact(target_size=target_size)


def vacuum(target: str, retention_hours: float) -> int:
    """Delete the files of a Delta table that no version of the last `retention_hours` references, and files no
    commit references (left by a writer killed before its commit) once that old. The number of files deleted.

    A reader still reading a version older than the retention fails: never below MIN_VACUUM_RETENTION_HOURS."""
    if retention_hours < MIN_VACUUM_RETENTION_HOURS:
        raise ValueError(f"a VACUUM retention of {retention_hours} hours is below the minimum of "
                         f"{MIN_VACUUM_RETENTION_HOURS} hour(s): readers of recent versions would fail")
    dt = open_delta(target)
    if dt is None:
        return 0
    hours = int(retention_hours) if float(retention_hours).is_integer() else None
    if hours is None:
        raise ValueError(f"VACUUM retention is in whole hours, not {retention_hours}")
    return len(dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True))


# ---------------------------------------------------------------------------------------------------------------
# the pipeline job's step after a micro-batch

@dataclass
class MaintenanceOptions:
    """When the pipeline job maintains a table (after a micro-batch that wrote it)."""

    optimize_every: int = 0                     #: OPTIMIZE every N micro-batches that wrote the table (0: never)
    small_files: int = DEFAULT_SMALL_FILES      #: OPTIMIZE once the table has this many small files (0: never)
    zorder: bool = True                         #: Z-order by the key (else compact)
    vacuum_retention_hours: float | None = DEFAULT_VACUUM_RETENTION_HOURS   #: None: no VACUUM

    def __post_init__(self) -> None:
        if self.optimize_every < 0 or self.small_files < 0:
            raise ValueError("optimize_every and small_files are counts: 0 or more")
        if self.vacuum_retention_hours is not None and self.vacuum_retention_hours < MIN_VACUUM_RETENTION_HOURS:
            raise ValueError(f"vacuum retention below {MIN_VACUUM_RETENTION_HOURS} hour(s): readers of recent "
                             f"versions would fail")


@dataclass
class Maintenance:
    """The job's maintenance of its tables, one call per table after each micro-batch that wrote it.

    Per table: once it has `small_files` small data files or every `optimize_every` micro-batches, and likewise
    for its ``_spockwire_state``, the state is collected before the micro-batch's first change (the streaming
    checkpoint has committed every earlier micro-batch, and a replay of this one carries the same changes), the
    state compacted, the table Z-ordered (or compacted), then both vacuumed."""

    options: MaintenanceOptions = field(default_factory=MaintenanceOptions)
    batches: dict[str, int] = field(default_factory=dict)
    def _files(self, path: str) -> TableFiles:
        # the table as the micro-batch's apply left it open (file_rows.open_table: only its newer commits read;
        # opening it again every micro-batch costs several times that, for each table)
        dt = open_table(path, open_delta)
        try:
            return table_files(dt)
        finally:
            keep_table(path, dt)

    def after_batch(self, path: str, keys: Sequence[str], first: tuple | None) -> dict:
        """Maintain the table at `path` after a micro-batch whose first change of it was at `first` (None: no
        change). What was done and the table's files afterwards."""
        opt = self.options
        t0 = time.monotonic()
        n = self.batches.get(path, 0) + 1
        self.batches[path] = n
        table = self._files(path)
        state_path = os.path.join(path, STATE_DIR)
        state = self._files(state_path)
        every = opt.optimize_every and n >= opt.optimize_every
        due_table = bool(every or (opt.small_files and table.small_files >= opt.small_files))
        due_state = bool(every or (opt.small_files and state.small_files >= opt.small_files))
        out: dict[str, Any] = {}
        if due_table or due_state:
            if first is not None:
                out["state_collected"] = collect_state(path, first)
            if state.files > 1:
                optimize(state_path, zorder=False)
            if due_table:
                done = optimize(path, keys, zorder=opt.zorder)
                out["optimized"] = {"removed": done.get("numFilesRemoved", 0), "added": done.get("numFilesAdded", 0)}
                self.batches[path] = 0
            if opt.vacuum_retention_hours is not None:
                out["vacuumed"] = vacuum(path, opt.vacuum_retention_hours) + \
                    vacuum(state_path, opt.vacuum_retention_hours)
            table = self._files(path)
            state = self._files(state_path)
        out.update(files=table.files, state_files=state.files, state_rows=state.rows,
                   seconds=round(time.monotonic() - t0, 3))
        return out


def count_option(text: str) -> int:
    """An --optimize-every / --optimize-small-files value: a count, 0 or more (ValueError otherwise)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{text!r} is not a count (0 or more)")
    return n


def retention_option(text: str) -> float | None:
    """A --vacuum-retention-hours value: whole hours, at least MIN_VACUUM_RETENTION_HOURS, or ``off`` (None)."""
    if str(text).strip().lower() == "off":
        return None
    try:
        hours = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number of hours (or off)") from None
    if hours < MIN_VACUUM_RETENTION_HOURS:
        raise ValueError(f"{hours} is below the minimum of {MIN_VACUUM_RETENTION_HOURS:g} hour(s): readers of recent "
                         f"versions would fail")
    return float(hours)
