"""spockwire's changes mapped for AUTO CDC (``pyspark.pipelines.create_auto_cdc_flow``, Databricks' AUTO CDC).

AUTO CDC takes one event per key and sequence value: an upsert (the row's new values, all of them) or a delete
(``apply_as_deletes``). spockwire's change rows say more than that, and two kinds of them would be applied wrongly
as they are:

* ``update_preimage`` rows (the old row of an update, sent for a key change or under ``REPLICA IDENTITY FULL``)
  would be upserts of the old values. :func:`autocdc_changes` drops a preimage followed by a postimage of the
  same key, and turns the preimage of a key change into a ``delete`` of the old key (at the preimage's position,
  just before the new key's postimage).
* a postimage whose ``_unchanged_toast`` lists columns carries NULL for values PostgreSQL did not send; AUTO CDC
  would write those NULLs. Under ``REPLICA IDENTITY FULL`` the preimage holds the values (PostgreSQL logs the old
  row with its TOASTed values inline), and ``replica_identity_full=True`` fills them in from it. Otherwise the
  values are nowhere in the stream, and such a row fails the query (``SPOCKWIRE_UNCHANGED_TOAST``) rather than
  erase them.

What cannot be mapped: ``truncate`` rows. ``create_auto_cdc_flow`` in Spark 4.3 has no truncate handling (Databricks'
``apply_as_truncates`` exists for SCD type 1 only), so a truncate fails the query (``SPOCKWIRE_TRUNCATE``) unless
``truncates="keep"`` (for ``apply_as_truncates = "_change_type = 'truncate'"``) or ``"drop"`` (the rows the truncate
removed stay in the target) is given. :func:`spockwire.spark.apply_changes` handles all of these itself.

The mapping pairs each preimage with the row after it, so it needs a transaction's rows together and in order in
one partition: the ``spockwire`` source gives them so (a transaction is never split between tasks). It runs as
``mapInArrow``, on streaming DataFrames too. Other change DataFrames (batch): ``repartition("_commit_lsn")
.sortWithinPartitions("_commit_lsn", "_seq")`` first. A preimage whose postimage is not the next row of its
partition fails the query (``SPOCKWIRE_SPLIT_UPDATE``) rather than be guessed at.

    from pyspark import pipelines as dp
    from pyspark.sql import functions as F
    import spockwire.spark as sws

    @dp.temporary_view
    def orders_changes():
        return sws.autocdc_changes(spark.readStream.format("spockwire").options(...).load(), keys=["id"])

    dp.create_streaming_table("orders")
    dp.create_auto_cdc_flow(target="orders", source="orders_changes", keys=["id"],
                            sequence_by=F.struct("_commit_lsn", "_seq"),
                            apply_as_deletes="_change_type = 'delete'",
                            except_column_list=list(sws.CHANGE_COLUMNS), stored_as_scd_type=1)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .schema import CHANGE_COLUMNS, KEY_METADATA, TABLE_COLUMN

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

__all__ = ["autocdc_changes", "autocdc_batches", "AutoCdcError", "TRUNCATE_ERROR", "UNCHANGED_TOAST_ERROR",
           "SPLIT_UPDATE_ERROR"]

#: the messages a change AUTO CDC cannot apply fails the query with
TRUNCATE_ERROR = ("SPOCKWIRE_TRUNCATE: a truncate cannot be applied by AUTO CDC (create_auto_cdc_flow has no truncate "
                  "handling in Spark 4.3); use spockwire.spark.apply_changes, or autocdc_changes(truncates='keep') "
                  "with apply_as_truncates (Databricks, SCD type 1)")
UNCHANGED_TOAST_ERROR = ("SPOCKWIRE_UNCHANGED_TOAST: an update left a TOASTed value unchanged and PostgreSQL did not "
                         "send it; AUTO CDC would write NULL. Set REPLICA IDENTITY FULL on the table and "
                         "autocdc_changes(replica_identity_full=True), or use spockwire.spark.apply_changes")
SPLIT_UPDATE_ERROR = ("SPOCKWIRE_SPLIT_UPDATE: an update's preimage is not followed by its postimage in the same "
                      "partition; give autocdc_changes a transaction's rows together and in (_commit_lsn, _seq) "
                      "order (repartition('_commit_lsn').sortWithinPartitions('_commit_lsn', '_seq'))")


class AutoCdcError(ValueError):
    """A change AUTO CDC cannot apply as spockwire's `apply_changes` would (the message says which)."""


def _where(message: str, batch: pa.Table, mask: pa.Array) -> str:
    row = pc.index(mask, True).as_py()
    return (f"{message} (the change at _commit_lsn {batch.column('_commit_lsn')[row].as_py()}, "
            f"_seq {batch.column('_seq')[row].as_py()})")


def _shift(col: pa.ChunkedArray | pa.Array, by: int) -> pa.Array:
    """The column moved by `by` rows (1: each row sees the next row's value; -1: the previous one's), NULL-padded."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    pad = pa.nulls(min(abs(by), n), arr.type)
    return pa.concat_arrays([arr.slice(by), pad] if by > 0 else [pad, arr.slice(0, max(n + by, 0))])


def _same(a: pa.Array, b: pa.Array) -> pa.Array:
    """NULL-safe equality."""
    return pc.fill_null(pc.or_(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b))), False)


def _unsent(toast: pa.ChunkedArray, column: str, n: int) -> pa.Array:
    """Rows whose `_unchanged_toast` lists `column`."""
    arr = toast.combine_chunks()
    if not n or arr.null_count == n:
        return pa.array([False] * n)
    flat = pc.list_flatten(arr)
    parents = pc.list_parent_indices(arr)
    hit = pc.filter(parents, pc.fill_null(pc.equal(flat, column), False))
    mask = [False] * n
    for i in hit.to_pylist():
        mask[i] = True
    return pa.array(mask)


def _map(batch: pa.Table, keys: Sequence[str], replica_identity_full: bool, truncates: str) -> pa.Table:
    """One partition's rows, in order, mapped (see the module)."""
    n = batch.num_rows
    kind = batch.column("_change_type").combine_chunks()
    lsn, seq = batch.column("_commit_lsn").combine_chunks(), batch.column("_seq").combine_chunks()
    pre = pc.fill_null(pc.equal(kind, "update_preimage"), False)
    post = pc.fill_null(pc.equal(kind, "update_postimage"), False)
    # the next row is this preimage's postimage (same transaction, next _seq)
    next_is_post = pc.and_(pc.and_(_same(_shift(lsn, 1), lsn), _same(_shift(seq, 1), pc.add(seq, 1))),
                           _shift(post, 1).fill_null(False))
    if pc.any(pc.and_(pre, pc.invert(next_is_post))).as_py():
        raise AutoCdcError(_where(SPLIT_UPDATE_ERROR, batch, pc.and_(pre, pc.invert(next_is_post))))
    same_key = pa.array([True] * n)
    for k in keys:
        col = batch.column(k).combine_chunks()
        same_key = pc.and_(same_key, _same(_shift(col, 1), col))
    drop = pc.and_(pre, same_key)                     # REPLICA IDENTITY FULL: the old row of the same key
    prev_is_pre = _shift(pre, -1).fill_null(False)    # a postimage right after its preimage
    if truncates == "error" and pc.any(pc.equal(kind, "truncate")).as_py():
        raise AutoCdcError(_where(TRUNCATE_ERROR, batch, pc.fill_null(pc.equal(kind, "truncate"), False)))
    columns = []
    toast = batch.column("_unchanged_toast") if "_unchanged_toast" in batch.column_names else None
    filled_any = pa.array([False] * n)
    for name in batch.column_names:
        col = batch.column(name).combine_chunks()
        if name == "_change_type":
            col = pc.if_else(pre, pa.scalar("delete", col.type), col)
        elif name not in CHANGE_COLUMNS and name not in keys and toast is not None:
            unsent = pc.and_(post, _unsent(toast, name, n))
            if pc.any(unsent).as_py():
                fill = pc.and_(unsent, prev_is_pre) if replica_identity_full else pa.array([False] * n)
                missing = pc.and_(unsent, pc.invert(fill))
                if pc.any(missing).as_py():
                    raise AutoCdcError(_where(UNCHANGED_TOAST_ERROR, batch, missing))
                col = pc.if_else(fill, _shift(col, -1), col)
                filled_any = pc.or_(filled_any, fill)
        columns.append(col)
    out = pa.Table.from_arrays(columns, schema=batch.schema)
    if toast is not None and pc.any(filled_any).as_py():   # nothing left unsent in those rows
        i = out.column_names.index("_unchanged_toast")
        out = out.set_column(i, out.schema.field(i), pc.if_else(filled_any, pa.nulls(n, toast.type),
                                                                toast.combine_chunks()))
    keep = pc.invert(drop)
    if truncates == "drop":
        keep = pc.and_(keep, pc.invert(pc.fill_null(pc.equal(kind, "truncate"), False)))
    return out.filter(keep)


def autocdc_batches(batches: Iterator[pa.RecordBatch], keys: Sequence[str], *, replica_identity_full: bool = False,
                    truncates: str = "error") -> Iterator[pa.RecordBatch]:
    """The mapping over one partition's record batches in order (what ``mapInArrow`` runs): a preimage at the end of
    a batch waits for the next one."""
    held: pa.Table | None = None
    for rb in batches:
        table = pa.Table.from_batches([rb])
        if held is not None:
            table = pa.concat_tables([held, table])
            held = None
        if table.num_rows and table.column("_change_type")[-1].as_py() == "update_preimage":
            held, table = table.slice(table.num_rows - 1), table.slice(0, table.num_rows - 1)
        if table.num_rows:
            yield from _map(table, keys, replica_identity_full, truncates).to_batches()
    if held is not None:
        yield from _map(held, keys, replica_identity_full, truncates).to_batches()   # raises SPOCKWIRE_SPLIT_UPDATE


def autocdc_changes(changes: "DataFrame | pa.Table", keys: Sequence[str] | None = None, *,
                    replica_identity_full: bool = False, truncates: str = "error") -> "DataFrame | pa.Table":
    """`changes` (one table's change DataFrame -- the ``spockwire`` source, ``select_table`` of it; the staging
    reader, whose large commits span several files, after the repartitioning the module describes -- or an Arrow
    table of them) as events AUTO CDC applies the way :func:`~spockwire.spark.apply_changes` does, with
    ``keys``, ``sequence_by = struct(_commit_lsn, _seq)`` and ``apply_as_deletes = "_change_type = 'delete'"``:
    preimages dropped, a key change a ``delete`` of the old key, unchanged TOASTed values filled from the preimage
    (`replica_identity_full`) or refused; truncates refused, kept or dropped (`truncates`: error | keep | drop).
    Streaming DataFrames too (``mapInArrow``)."""
    if truncates not in ("error", "keep", "drop"):
        raise ValueError(f"truncates must be 'error', 'keep' or 'drop', not {truncates!r}")
    columns = changes.column_names if isinstance(changes, pa.Table) else changes.columns
    if TABLE_COLUMN in columns:
        raise ValueError("autocdc_changes takes one table's changes: select_table(df, 'schema.table') first")
    if not keys:
        if isinstance(changes, pa.Table):
            keys = [f.name for f in changes.schema
                    if f.metadata and f.metadata.get(KEY_METADATA.encode()) in (b"true", b"True")]
        else:
            keys = [f.name for f in changes.schema.fields if f.metadata.get(KEY_METADATA)]
    if not keys:
        raise ValueError("autocdc_changes needs the key columns (keys=[...]; the spockwire source marks the replica "
                         "identity's)")
    keys = list(keys)
    if isinstance(changes, pa.Table):
        return pa.Table.from_batches(list(autocdc_batches(iter(changes.to_batches()), keys,
                                                          replica_identity_full=replica_identity_full,
                                                          truncates=truncates)), schema=changes.schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return autocdc_batches(batches, keys, replica_identity_full=replica_identity_full, truncates=truncates)

    return changes.mapInArrow(run, changes.schema)
