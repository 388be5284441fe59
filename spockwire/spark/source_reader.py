"""The readers of the ``spockwire`` data source (datasource.py): the partitions of a micro-batch (LSN ranges, snapshot
chunks), planning on the driver, decoding on the executors, the rows in the query's layout or as Arrow files
(stagingPath).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..connection.failover import TimelineDiverged, check_failover_safety, check_position, move_wal_past, \
    sql_timeline
from ..connection.slots import format_lsn, parse_lsn
from ..export.arrow import repeated
from ..model import Relation
from . import schema as S
from .slot import IDLE_ADVANCE_BYTES, IDLE_ADVANCE_SECONDS, SPLIT_WAL_BYTES, ReusedConnection, SlotSpec, _catalog, \
    _connect, advance_slot, decodable_wal_end, decoder_types_supported, drop_stale_range_copies, ensure_slot, \
    make_failover_slot, plan_end, read_range, slot_position, split_range
from .memory import release_memory
from .snapshot import is_snapshot_offset
from .source_options import ON_DIVERGENCE, STARTING_POSITIONS, flag, names, staging_path

try:  # Spark 4.2+: admission control and Trigger.AvailableNow for Python streaming sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

__all__ = ["LsnRange", "SpockwireBatchReader", "SpockwireStreamReader", "data_schema"]


def _tables(options: Any) -> tuple[tuple[str, ...], bool]:
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    if opts.get("table") and opts.get("tables"):
        raise ValueError("give either table or tables, not both")
    if opts.get("table"):
        return (_qualify(opts["table"]),), False
    tables = tuple(_qualify(t) for t in names(opts.get("tables")))
    if not tables and not _all_tables(opts):
        raise ValueError("the spockwire data source needs the option table (or tables, or allTables)")
    return tables, True


def _all_tables(opts: dict) -> bool:
    """The option allTables: every table the stream sends is read, those named by `tables` and any other (a table
    added to the publication later); needs stagingPath, whose files hold each table in its own layout."""
    if not flag(opts.get("alltables")):
        return False
    if not opts.get("stagingpath"):
        raise ValueError("allTables needs stagingPath: a table the query's schema does not name has no place in "
                         "its rows")
    return True


def _wanted(options: Any, tables: Sequence[str]) -> Sequence[str] | None:
    """The tables a range's read keeps (None: every table the stream sends)."""
    return None if _all_tables({str(k).lower(): v for k, v in dict(options).items()}) else tables


def _qualify(name: str) -> str:
    nsp, rel = S.split_table_name(name)
    return f"{nsp}.{rel}"


class LsnRange(InputPartition):
    """One read: the transactions committed in ``[start, end)`` (`from_copy`: over a copy of the slot advanced to
    `start`, the second half of a split range)."""

    def __init__(self, start: int, end: int, from_copy: bool = False) -> None:
        super().__init__((start, end, from_copy))
        self.start = start
        self.end = end
        self.from_copy = from_copy

    def __repr__(self) -> str:
        copy = ", from a copy" if self.from_copy else ""
        return f"LsnRange({format_lsn(self.start)}, {format_lsn(self.end)}{copy})"


def _ranges(start: int, end: int, split_bytes: int) -> list[LsnRange]:
    return [LsnRange(lo, hi, copy) for lo, hi, copy in split_range(start, end, split_bytes)]


def _split_bytes(opts: dict) -> int:
    value = opts.get("splitwalbytes")
    return SPLIT_WAL_BYTES if value in (None, "") else int(value)


class _Layout:
    """Turns (table, decoder batch) into batches of the query's Arrow schema."""

    def __init__(self, spark_schema: Any, tables: Sequence[str], multi: bool) -> None:
        self.target = S.target_arrow_schema(spark_schema)
        self.tables = tuple(tables)
        self.multi = multi
        if multi:
            self.struct_types = {t: self.target.field(S.table_struct_name(t)).type for t in tables}

    def convert(self, table: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self.multi:
            return S.conform_batch(batch, self.target)
        extra = {S.TABLE_COLUMN: lambda n: repeated(table, n, pa.string())}
        for t in self.tables:
            col = S.table_struct_name(t)
            stype = self.struct_types[t]
            if t == table:
                extra[col] = lambda n, b=batch, st=stype: self._struct(b, st)
            else:
                extra[col] = lambda n, st=stype: pa.nulls(n, st)
        return S.conform_batch(batch, self.target, extra=extra)

    @staticmethod
    def _struct(batch: pa.RecordBatch, stype: pa.StructType) -> pa.Array:
        n = batch.num_rows
        names = batch.schema.names
        children = []
        for f in stype:
            if f.name in names:
                children.append(S.conform_array(batch.column(names.index(f.name)), f.type, f.name))
            else:
                children.append(pa.nulls(n, f.type))
        is_truncate = pc.equal(batch.column(0), "truncate")
        return pa.StructArray.from_arrays(children, fields=list(stype), mask=is_truncate)


def _deliver(staging: str | None, layout_args: tuple, partition: Any, pairs: Iterator[tuple[str, pa.RecordBatch]]
             ) -> Iterator[pa.RecordBatch]:
    """The task's output: its changes in the query's layout, or (stagingPath) written as Arrow files, one manifest
    row per file."""
    layout = _Layout(*layout_args)
    if staging:
        from .batch_files import partition_name, write_files

        yield from write_files(staging, partition_name(partition), pairs, layout.target, layout.multi,
                               snapshot_more=bool(getattr(partition, "more", False)))
    else:
        for table, batch in pairs:
            yield layout.convert(table, batch)
    # the worker then waits idle for its next task: what the task freed goes back to the system meanwhile
    release_memory()


def _table_columns(layout: _Layout, table: str) -> list[str] | None:
    """The table's columns in the query's schema (what a snapshot task reads); None (all of them) for a table the
    query does not name (allTables: one that joined the publications later)."""
    if layout.multi:
        return [f.name for f in layout.struct_types[table]] if table in layout.struct_types else None
    return [f.name for f in layout.target if f.name not in S.CHANGE_COLUMNS]


def data_schema(spec: SlotSpec, options: Any) -> Any:
    """The schema of the change rows (what the DataFrame holds unless stagingPath is set)."""
    tables, multi = _tables(options)
    catalog = _catalog(spec.conninfo) if spec.types != "raw" else None
    # typed values as the readers' decoder will have them (a pglogical/spock stream names no types: without a
    # catalog its columns stay raw)
    typed = spec.types != "raw" and decoder_types_supported() and \
        (spec.protocol == "pgoutput" or catalog is not None)
    found: list[tuple[Relation, pa.Schema]] = []
    with _connect(spec.conninfo) as conn, conn.cursor() as cur:
        for table in tables:
            relation = S.read_table_relation(cur, table, spec.protocol)
            arrow = S.table_arrow_schema(relation, catalog, typed=typed, binary=spec.binary,
                                         column_types=spec.column_types)
            found.append((relation, arrow))
    return S.spark_schema(found, multi_table=multi)


class SpockwireBatchReader(DataSourceReader):
    """A batch read of ``[startingLsn, endingLsn)`` (default: from the slot's position to the flush LSN)."""

    def __init__(self, spec: SlotSpec, schema: Any, options: Any) -> None:
        self.spec = spec
        tables, multi = _tables(options)
        self.layout_args = (schema, tables, multi)
        self.wanted = _wanted(options, tables)
        self.staging = staging_path(options)
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        with _connect(spec.conninfo) as conn, conn.cursor() as cur:
            pos = slot_position(cur, spec.slot)
            if pos is None:
                raise ValueError(f"replication slot {spec.slot!r} does not exist")
            self.start = parse_lsn(opts["startinglsn"]) if opts.get("startinglsn") else pos[0]
            self.end = parse_lsn(opts["endinglsn"]) if opts.get("endinglsn") else decodable_wal_end(cur)
            drop_stale_range_copies(cur, spec.slot)
        self.split_bytes = _split_bytes(opts)

    def partitions(self) -> Sequence[InputPartition]:
        return _ranges(self.start, self.end, self.split_bytes)

    def read(self, partition: LsnRange) -> Iterator[pa.RecordBatch]:
        pairs = read_range(self.spec, partition.start, partition.end, self.wanted, from_copy=partition.from_copy)
        yield from _deliver(self.staging, self.layout_args, partition, pairs)


class SpockwireStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of committed transactions; the slot moves only after Spark committed a batch."""

    def __init__(self, spec: SlotSpec, schema: Any, options: Any) -> None:
        self.spec = spec
        tables, multi = _tables(options)
        self.layout_args = (schema, tables, multi)
        self.wanted = _wanted(options, tables)
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        self.staging = staging_path(options)
        self.create_slot = flag(opts.get("createslot"))
        self.failover = flag(opts.get("failoverslot"))
        self._failover_done = not self.failover
        self.require_failover_safety = flag(opts.get("requirefailoversafety"))
        self._safety_checked_on: int | None = None     # the timeline failover safety was last checked on
        self.max_messages = int(opts["maxchangesperbatch"]) if opts.get("maxchangesperbatch") else None
        self.max_wal_bytes = int(opts["maxwalbytesperbatch"]) if opts.get("maxwalbytesperbatch") else None
        idle = opts.get("idleadvancebytes")
        self.idle_advance = int(idle) if idle not in (None, "") else IDLE_ADVANCE_BYTES
        idle_s = opts.get("idleadvanceseconds")
        self.idle_advance_seconds = float(idle_s) if idle_s not in (None, "") else IDLE_ADVANCE_SECONDS
        # (start, since when): the plannings from `start` that found WAL without output and made no range
        self._idle_since: tuple[int, float] | None = None
        self.split_bytes = _split_bytes(opts)
        self.starting = parse_lsn(opts["startinglsn"]) if opts.get("startinglsn") else None
        position = str(opts.get("startingposition") or "slot").lower()
        if position not in STARTING_POSITIONS:
            raise ValueError(f"startingPosition must be one of {', '.join(STARTING_POSITIONS)}, not {position!r}")
        self.all_tables = flag(opts.get("alltables"))
        self.on_divergence = str(opts.get("ondivergence") or "repair").lower()
        if self.on_divergence not in ON_DIVERGENCE:
            raise ValueError(f"onDivergence must be one of {', '.join(ON_DIVERGENCE)}, not {self.on_divergence!r}")
        self._snapshot_args = (tables, opts.get("snapshotchunkpages"), opts.get("snapshotchunksperbatch"),
                               opts.get("snapshottaskslots"))
        self.snapshot: Any = None
        if position == "snapshot":
            self.snapshot = self._snapshot_driver()
        self._until: int | None = None
        self._known_start: int | None = None
        # planning and committing on the driver: one connection for the query's life (opened again if it broke)
        self._conn = ReusedConnection(spec.conninfo)
        # ranges whose planning saw them whole without output: no task reads them
        self._empty: set[tuple[int, int]] = set()
        # the end of the last range that reached the flush LSN its planning read (None: none yet in this process)
        self._settled: int | None = None
        # the server's timeline as the last planning read it: every offset records it with its LSN, and an offset of
        # another timeline is checked against the server's history once (a promoted standby that lagged never had
        # the changes past its switch point)
        self._timeline: int | None = None
        self._in_history: set[tuple[int, str]] = set()

    def _snapshot_driver(self, all_replicated: bool = False) -> Any:
        """The driver of this query's snapshots (made on first need: a checkpoint that holds a snapshot -- an
        initial one, or the one that repaired a divergence -- needs it whatever startingPosition says)."""
        if self.snapshot is None:
            from .snapshot import CHUNK_PAGES, CHUNKS_PER_BATCH, SnapshotDriver

            tables, pages, per_batch, slots = self._snapshot_args
            self.snapshot = SnapshotDriver(self.spec, tables, int(pages or CHUNK_PAGES),
                                           int(per_batch or CHUNKS_PER_BATCH), int(slots or 1))
        self.snapshot.all_replicated = self.snapshot.all_replicated or all_replicated
        return self.snapshot

    # offsets ---------------------------------------------------------------------------------------------------
    def _offset(self, lsn: int) -> dict:
        if self._timeline is None:
            return {"lsn": format_lsn(lsn)}
        return {"lsn": format_lsn(lsn), "timeline": self._timeline}

    def _read_timeline(self) -> None:
        def timeline(conn: Any) -> int | None:
            with conn.cursor() as cur:
                return sql_timeline(cur)

        self._timeline = self._conn.run(timeline)

    def _diverged(self, offset: dict) -> TimelineDiverged | None:
        """TimelineDiverged when `offset` was read on a timeline the server's history left before its LSN: the
        changes up to it may be applied, but past the switch point the new primary never had them (raised at
        once with onDivergence=stop)."""
        read_on = offset.get("timeline")
        if read_on is None or self._timeline is None or read_on == self._timeline:
            return None
        key = (int(read_on), offset["lsn"])
        if key in self._in_history:
            return None
        try:
            check_position(self.spec.conninfo, parse_lsn(offset["lsn"]), int(read_on), self._timeline)
        except TimelineDiverged as exc:
            if self.on_divergence == "stop":
                raise
            return exc
        self._in_history.add(key)
        return None

    def _repair(self, diverged: TimelineDiverged) -> dict:
        """The offset of a snapshot that reads every table of the query again on the new primary (the slot is
        made again with it: the snapshot holds every change up to its consistent point); its first micro-batch
        truncates each table, so what the old timeline left in the targets past the switch point is gone. The new
        primary's WAL is first moved past the diverged offset, so the snapshot's position is past every row the
        targets hold."""
        def past(conn: Any) -> int:
            with conn.cursor() as cur:
                return move_wal_past(cur, diverged.acked + 1)

        # the snapshot's position past everything read on the old timeline: its truncate and rows come after every
        # row the targets hold, whatever position those had (apply_changes orders by position)
        self._conn.run(past)
        driver = self._snapshot_driver(all_replicated=self.all_tables)
        offset = driver.new_snapshot()
        self._failover_done = not self.failover        # the slot made again: a failover slot once it is read
        print(f"spockwire: {diverged}; reading the tables again (a snapshot at {offset['lsn']} on timeline "
              f"{self._timeline} replaces them)", file=sys.stderr, flush=True)
        return offset

    def initialOffset(self) -> dict:
        if self.snapshot is not None:
            from .snapshot import initial_offset

            return initial_offset()
        if self.create_slot:
            confirmed = ensure_slot(self.spec, failover=self.failover)
        else:
            pos = self._slot_position()
            if pos is None:
                raise ValueError(f"replication slot {self.spec.slot!r} does not exist (create it first, or set "
                                 "createSlot=true)")
            confirmed = pos[0]
        start = max(confirmed, self.starting or 0)
        self._known_start = start
        self._read_timeline()
        return self._offset(start)

    def _slot_position(self) -> tuple[int, str] | None:
        def position(conn: Any) -> tuple[int, str] | None:
            with conn.cursor() as cur:
                return slot_position(cur, self.spec.slot)

        return self._conn.run(position)

    def getDefaultReadLimit(self) -> Any:
        if self.max_messages and ReadMaxRows is not None:
            return ReadMaxRows(self.max_messages)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        def flush(conn: Any) -> int:
            with conn.cursor() as cur:
                return decodable_wal_end(cur)

        self._until = self._conn.run(flush)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The end of the next micro-batch.

        Spark calls this only once every earlier batch is committed in the checkpoint, so the slot may move to
        `start` first. Without `start` (Spark before 4.2) the slot's own position is used.
        """
        if start is not None and is_snapshot_offset(start):
            self._snapshot_driver()
            if not self.snapshot.complete(start):
                return self.snapshot.next_offset(start)
            if self.snapshot.alive(start["snapshot"]):
                # this process created the slot, whose consistent point was the flush then: the idle rule holds
                # from there (WAL without output after it makes no empty micro-batch)
                self._settled = parse_lsn(start["lsn"])
            self.snapshot.close()        # read: the slot's changes follow from its consistent point
        if not self._failover_done:         # the slot exists and no snapshot holds it: a failover slot from now on
            self._failover_done = self._conn.run(lambda conn: make_failover_slot(self.spec, conn))
        self._read_timeline()
        if start is not None:
            diverged = self._diverged(start)
            if diverged is not None:
                return self._repair(diverged)
        if self.failover and self._failover_done and self._safety_checked_on != self._timeline:
            # once the slot is a failover slot, and again after each promotion: would a standby hold it? A warning
            # on stderr, or FailoverUnsafe (the query fails with it) with requireFailoverSafety
            self._safety_checked_on = self._timeline
            check_failover_safety(self.spec.conninfo, self.spec.slot, require=self.require_failover_safety)
        if start is not None:
            begin = parse_lsn(start["lsn"])
        elif self._known_start is not None:
            begin = self._known_start
        else:
            pos = self._slot_position()
            begin = pos[0] if pos else 0
        # the options bound every micro-batch whatever the trigger; a ReadMaxRows limit from Spark (the default
        # read limit, or a smaller one) bounds the messages too
        max_messages = self.max_messages
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_messages = min(max_messages or limit.max_rows, limit.max_rows)
        # A range may end short of the flush LSN its planning read (maxChangesPerBatch's estimate or the transaction
        # that reached it, maxWalBytesPerBatch, an empty range before the next output) with nothing but WAL
        # without output for the stream after it. Below idleAdvanceBytes the planning makes no range over such
        # WAL, so the query would stay short of the flush (and the slot hold that WAL) until more WAL came: from
        # such a start, and from one this process did not plan (a checkpoint's), any WAL without output up to the
        # bound becomes one empty range. From a start that reached the flush the idle rule holds as before.
        # ... and after idleAdvanceSeconds of plannings that found only such WAL (a quiet server: the slot, and what a
        # standby's copy of it may resume from, move on within that time)
        idle_advance = self.idle_advance if begin == self._settled else 0
        now = time.monotonic()
        if (idle_advance and self._idle_since is not None and self._idle_since[0] == begin
                and now - self._idle_since[1] >= self.idle_advance_seconds):
            idle_advance = 0
        plan = plan_end(self.spec, begin, max_messages=max_messages, max_wal_bytes=self.max_wal_bytes,
                        until=self._until, idle_advance_bytes=idle_advance, connection=self._conn)
        if plan.end == begin and plan.flush > begin:
            if self._idle_since is None or self._idle_since[0] != begin:
                self._idle_since = (begin, now)
        else:
            self._idle_since = None
        if plan.end >= plan.flush:
            self._settled = plan.end
        if plan.empty and plan.end > begin:
            self._empty.add((begin, plan.end))
        self._known_start = plan.end
        if plan.end == begin and start is not None:
            # no new range: the offset as it was (a read snapshot's too: its LSN in the plain form would be a new
            # offset to Spark, so an empty micro-batch)
            return start
        return self._offset(plan.end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if is_snapshot_offset(end):
            return self._snapshot_driver().partitions(end)
        if self._timeline is None:          # a micro-batch of the checkpoint read again, before any planning
            self._read_timeline()
        # a range planned on the old timeline, maybe applied already (the checkpoint had not recorded it): not read
        # on the new one; the next planning, from its end, repairs the divergence
        if self._diverged(end) is not None:
            return []
        lo, hi = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        if hi <= lo or (lo, hi) in self._empty:
            return []
        return _ranges(lo, hi, self.split_bytes)

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LsnRange):
            pairs = read_range(self.spec, partition.start, partition.end, self.wanted,
                               from_copy=partition.from_copy)
        else:
            from .snapshot import read_chunk

            pairs = read_chunk(self.spec, partition, _table_columns(_Layout(*self.layout_args), partition.table))
        yield from _deliver(self.staging, self.layout_args, partition, pairs)

    def commit(self, end: dict) -> None:
        if is_snapshot_offset(end):
            return           # the slot stays at its consistent point until the snapshot is read
        lsn = parse_lsn(end["lsn"])
        advance_slot(self.spec, lsn, connection=self._conn)
        self._empty = {r for r in self._empty if r[1] > lsn}

    def stop(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
        self._conn.close()
