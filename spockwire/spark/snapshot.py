"""The initial snapshot of the ``spockwire`` source (``startingPosition`` ``snapshot``): planning on the driver,
chunks read by Spark tasks that import the exported snapshot.

The driver creates the slot with an exported snapshot (:func:`spockwire.snapshot.initial.create_slot_with_snapshot`)
and keeps that replication connection open, idle, while the snapshot is read; it cuts every table (every leaf
partition of a partitioned one) into ctid block ranges. Each range is one Spark task: it opens a connection,
imports the snapshot (``REPEATABLE READ`` + ``SET TRANSACTION SNAPSHOT``) and reads its rows with the binary COPY
reader (:func:`spockwire.iter_table_batches`, ``where`` = the block range). Snapshot rows follow the snapshot
contract (docs/staging.md, "Snapshot rows"): ``_change_type`` ``insert``, ``_commit_lsn`` the slot's consistent
point, ``_commit_ts`` the snapshot time, ``_xid`` null, ``_seq`` above :data:`SNAPSHOT_SEQ_BASE`, numbered per chunk
(``SNAPSHOT_SEQ_BASE + 1 + chunk * 2**40 + row``), so every snapshot row sorts before every change at the
consistent point. The first micro-batch of a snapshot also holds one ``truncate`` row per table at
(``consistent point``, ``SNAPSHOT_SEQ_BASE``): whatever a target held before (an earlier, abandoned snapshot
included) is replaced by the snapshot.

An exported snapshot lives only as long as the connection that exported it, i.e. as long as the driver. A driver
that dies during the snapshot takes it along: the restarted query replays the interrupted micro-batch as empty,
drops the slot, creates it again with a new exported snapshot and reads the whole snapshot again, starting with
the truncate rows. Applied with `apply_changes`, the tables end up exactly as if the first snapshot had
completed. Once the snapshot's last micro-batch is committed, the changes follow from the consistent point.

This module needs Spark only for the InputPartition class.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ..connection.slots import format_lsn, parse_lsn
from ..model import epoch_micros
from .slot import SlotSpec, _connect, _wait_released

__all__ = ["SnapshotChunk", "SnapshotDriver", "is_snapshot_offset", "read_chunk", "page_ranges", "SNAPSHOT_SEQ_BASE",
           "CHUNK_PAGES", "CHUNKS_PER_BATCH", "MIN_SLOT_CHUNK_PAGES"]

#: the `_seq` of the truncate rows that open a snapshot; snapshot rows come after it
SNAPSHOT_SEQ_BASE = -(1 << 63)
#: table pages (8 kB each) per Spark task
CHUNK_PAGES = 4096
#: snapshot chunks (tasks) per micro-batch
CHUNKS_PER_BATCH = 8
#: the fewest table pages a task is given when a table is cut into more ranges to fill the task slots
MIN_SLOT_CHUNK_PAGES = 256
_CHUNK_SEQ = 1 << 40


def is_snapshot_offset(offset: Any) -> bool:
    return isinstance(offset, dict) and "snapshot" in offset


def initial_offset() -> dict:
    """The offset a query that starts with a snapshot begins at: no snapshot taken yet."""
    return {"lsn": format_lsn(0), "snapshot": "", "epoch": 0, "ts": 0, "chunks": [], "first": 0, "done": 0}


class SnapshotChunk(InputPartition):
    """One task of the snapshot: a block range of one table (or leaf partition), under one exported snapshot."""

    def __init__(self, snapshot: str, lsn: int, ts_us: int, index: int, table: str, source: str,
                 first_page: int | None, stop_page: int | None, truncate_tables: Sequence[str] = (),
                 more: bool = False) -> None:
        super().__init__((snapshot, index))
        self.snapshot = snapshot
        self.lsn = lsn
        self.ts_us = ts_us
        self.index = index
        self.table = table
        self.source = source
        self.first_page = first_page
        self.stop_page = stop_page
        self.truncate_tables = tuple(truncate_tables)
        self.more = more            # later micro-batches read more of this snapshot

    def where(self) -> str | None:
        conds = []
        if self.first_page:
            conds.append(f"ctid >= '({int(self.first_page)},0)'::tid")
        if self.stop_page is not None:
            conds.append(f"ctid < '({int(self.stop_page)},0)'::tid")
        return " AND ".join(conds) or None

    def __repr__(self) -> str:
        return f"SnapshotChunk({self.source}, pages {self.first_page}..{self.stop_page})"


def _change_columns(n: int, lsn: int, ts_us: int, change: str, seq: Any) -> list[pa.Array]:
    # from buffers: a Python list through pa.array would import pandas into every worker (export.arrow.repeated)
    from ..export.arrow import repeated

    return [repeated(change, n, pa.string()), repeated(lsn, n, pa.uint64()),
            repeated(ts_us, n, pa.timestamp("us", tz="UTC")), pa.nulls(n, pa.uint32()),
            seq, pa.nulls(n, pa.string()), pa.nulls(n, pa.list_(pa.string()))]


def _truncate_batch(table: str, lsn: int, ts_us: int) -> pa.RecordBatch:
    from ..export.arrow import change_fields, repeated

    arrays = _change_columns(1, lsn, ts_us, "truncate", repeated(SNAPSHOT_SEQ_BASE, 1, pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(change_fields()))


def read_chunk(spec: SlotSpec, chunk: SnapshotChunk,
               columns: Sequence[str] | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """(table, change batch) of the chunk's rows, read under its snapshot (`columns`: None, all of them); the
    truncate rows first, if any."""
    import spockwire
    from ..export.arrow import change_fields, int64_sequence

    for table in chunk.truncate_tables:
        yield table, _truncate_batch(table, chunk.lsn, chunk.ts_us)
    row = 0
    base = SNAPSHOT_SEQ_BASE + 1 + chunk.index * _CHUNK_SEQ
    types = "typed" if spec.types == "auto" else spec.types
    for values in spockwire.iter_table_batches(spec.conninfo, chunk.source, snapshot=chunk.snapshot,
                                               columns=None if columns is None else list(columns), types=types,
                                               where=chunk.where(),
                                               on_unrepresentable=spec.on_unrepresentable,
                                               column_types=dict(spec.column_types) or None):
        n = values.num_rows
        if not n:
            continue
        seq = int64_sequence(base + row, n)
        fields = change_fields() + list(values.schema)
        arrays = _change_columns(n, chunk.lsn, chunk.ts_us, "insert", seq) + list(values.columns)
        yield chunk.table, pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
        row += n


def page_ranges(pages: int, chunk_pages: int, slots: int = 1) -> list[tuple[int, int | None]]:
    """The block ranges ``(first page, stop page)`` a table of `pages` pages is read in: ranges of equal size, about
    `chunk_pages` pages each, as many as a multiple of `slots` (the task slots a micro-batch's ranges run on), so
    no slot idles while another reads a last, extra range. Fewer ranges of up to 1.5 x `chunk_pages` where that
    fills the slots (three ranges' pages on two slots: two ranges, one round of tasks), else more and smaller ones,
    of at least :data:`MIN_SLOT_CHUNK_PAGES` pages. The last range is open-ended (`stop` None): the pages added
    since it was planned are read too."""
    pages, chunk_pages, slots = max(0, int(pages)), max(1, int(chunk_pages)), max(1, int(slots))
    n = max(1, -(-pages // chunk_pages))
    if n % slots:
        fewer = n // slots * slots
        more = fewer + slots
        if fewer and pages <= fewer * chunk_pages * 3 // 2:
            n = fewer
        elif pages >= more * min(MIN_SLOT_CHUNK_PAGES, chunk_pages):
            n = more
    if pages < n:
        return [(0, None)]
    bounds = [i * pages // n for i in range(n)]
    return [(first, stop) for first, stop in zip(bounds, bounds[1:])] + [(bounds[-1], None)]


class SnapshotDriver:
    """The driver's side: the exported snapshot it holds, and the offsets of the snapshot's micro-batches.

    A snapshot offset: ``{"lsn": consistent point, "snapshot": name, "epoch": n, "ts": µs, "chunks": [[table,
    source, first_page, stop_page], ...], "first": i, "done": j}`` -- the micro-batch ending at it read chunks
    ``[first, done)``. The snapshot is complete once a batch ending with ``done == len(chunks)`` is committed.
    """

    def __init__(self, spec: SlotSpec, tables: Sequence[str], chunk_pages: int = CHUNK_PAGES,
                 chunks_per_batch: int = CHUNKS_PER_BATCH, task_slots: int = 1) -> None:
        self.spec = spec
        self.tables = tuple(tables)
        self.chunk_pages = max(1, int(chunk_pages))
        self.chunks_per_batch = max(1, int(chunks_per_batch))
        # a table's ranges fill the slots a micro-batch's tasks run on (no more slots than tasks per batch)
        self.task_slots = max(1, min(int(task_slots), self.chunks_per_batch))
        self.exported: Any = None
        self.voided: set[str] = set()    # snapshots whose micro-batch this process replayed as empty
        #: read every table the publications / replication sets replicate, the named ones and any other
        self.all_replicated = False

    def alive(self, name: str) -> bool:
        return bool(name) and self.exported is not None and self.exported.open and self.exported.name == name

    def close(self) -> None:
        if self.exported is not None:
            self.exported.close()
            self.exported = None

    def complete(self, offset: dict) -> bool:
        """Whether the snapshot of `offset` (the end of a committed micro-batch) has been read completely."""
        return (bool(offset["snapshot"]) and offset["done"] >= len(offset["chunks"])
                and offset["snapshot"] not in self.voided)

    def next_offset(self, start: dict) -> dict:
        """The end of the micro-batch after `start` (a snapshot offset whose snapshot is not complete)."""
        if self.alive(start["snapshot"]) and start["snapshot"] not in self.voided:
            done = min(start["done"] + self.chunks_per_batch, len(start["chunks"]))
            return {**start, "first": start["done"], "done": done}
        return self.new_snapshot(int(start.get("epoch", 0)) + 1)

    def new_snapshot(self, epoch: int = 1) -> dict:
        """Drop the slot, make it again with an exported snapshot, and return the offset of the snapshot's first
        micro-batch (its chunks: every table cut into block ranges)."""
        from ..snapshot.initial import create_slot_with_snapshot, replicated_tables, snapshot_time

        self.close()
        with _connect(self.spec.conninfo) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.spec.slot,))
            if cur.fetchone() is not None:
                # the slot of an unfinished snapshot (its exported snapshot died with the driver): start over
                _wait_released(cur, self.spec)
                cur.execute("SELECT pg_drop_replication_slot(%s)", (self.spec.slot,))
        self.exported = create_slot_with_snapshot(self.spec.conninfo, self.spec.slot, self.spec.plugin)
        name = self.exported.name
        ts = epoch_micros(snapshot_time(self.spec.conninfo, name))
        found = {t.name: t for t in replicated_tables(
            self.spec.conninfo, self.spec.plugin, publication=list(self.spec.publication) or None,
            replication_sets=list(self.spec.replication_sets) or None, snapshot=name)}
        if self.all_replicated:
            self.tables = tuple(dict.fromkeys([*self.tables, *sorted(found)]))
        chunks: list[list[Any]] = []
        with _connect(self.spec.conninfo, autocommit=False) as conn, conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (name,))
            cur.execute("SHOW server_version_num")
            ranges = int(cur.fetchone()[0]) >= 140000        # TID range scans
            for table in self.tables:
                if table not in found:
                    raise ValueError(f"{table} is not replicated by this slot's publication / replication sets")
                for source in found[table].sources:
                    cur.execute("SELECT c.relkind, pg_relation_size(c.oid) / current_setting('block_size')::int "
                                "FROM pg_class c WHERE c.oid = %s::regclass", (source,))
                    kind, pages = cur.fetchone()
                    if not ranges or kind != "r":
                        chunks.append([table, source, None, None])
                        continue
                    for first, stop in page_ranges(int(pages), self.chunk_pages, self.task_slots):
                        chunks.append([table, source, first or None, stop])
            conn.rollback()
        return {"lsn": format_lsn(self.exported.consistent_point), "snapshot": name, "epoch": epoch, "ts": ts,
                "chunks": chunks, "first": 0, "done": min(self.chunks_per_batch, len(chunks))}

    def partitions(self, end: dict) -> list[SnapshotChunk]:
        """The tasks of the micro-batch ending at `end`; none when its snapshot is gone (the driver that exported
        it died): that batch is replayed as empty and the next one starts a new snapshot."""
        if not self.alive(end["snapshot"]):
            self.voided.add(end["snapshot"])
            return []
        lsn = parse_lsn(end["lsn"])
        more = end["done"] < len(end["chunks"])
        parts = []
        for i in range(end["first"], end["done"]):
            table, source, first, stop = end["chunks"][i]
            truncate = self.tables if i == 0 else ()
            parts.append(SnapshotChunk(end["snapshot"], lsn, int(end["ts"]), i, table, source, first, stop,
                                       truncate, more))
        return parts
