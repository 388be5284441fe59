"""A replication slot created with an exported snapshot, the tables it covers, and their rows as snapshot rows.

    from spockwire.snapshot.initial import create_slot_with_snapshot, replicated_tables

    with create_slot_with_snapshot(dsn, "orders_cdc", "pgoutput") as exported:   # the connection stays open
        for table in replicated_tables(dsn, "pgoutput", publication=["pub"]):
            ...  # read table.sources with spockwire.iter_table_batches(..., snapshot=exported.name)
    # closed: the exported snapshot is gone; stream the slot from exported.consistent_point

The slot's consistent point and the exported snapshot describe the same moment: the snapshot sees exactly the
transactions that committed before the consistent point, and the slot delivers exactly those that commit at or
after it (docs/staging.md, "Snapshot rows"). `stage_initial_snapshot` does all of it into a staging folder.
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import pyarrow as pa

from ..connection.errors import plugin_not_allowed
from ..connection.session import pinned_kwargs
from ..connection.slots import SLOT_PLUGIN, format_lsn, parse_lsn
from ..errors import SpockwireError
from ..model import SNAPSHOT_SEQ_BASE, ChangeBatch, Column, Relation, epoch_micros
from .reader import iter_table_batches

__all__ = ["ExportedSnapshot", "SnapshotError", "SnapshotTable", "SnapshotProgress", "SNAPSHOT_SEQ_BASE",
           "WATERMARK_TABLE", "create_slot_with_snapshot", "replicated_tables", "snapshot_time", "iter_snapshot_rows",
           "snapshot_rows", "snapshot_batch", "iter_snapshot_changes", "stage_initial_snapshot"]

log = logging.getLogger("spockwire.snapshot")

# SNAPSHOT_SEQ_BASE (spockwire.model): `_seq` of a table's first snapshot row; row i has SNAPSHOT_SEQ_BASE + i (-2^63 + i). Every
# snapshot row sorts before every change the stream delivers at the consistent point (a transaction's `_seq` starts
# at 0), so no transaction can share a (`_commit_lsn`, `_seq`) with a snapshot row (docs/staging.md).

_TS = pa.timestamp("us", tz="UTC")


class SnapshotError(SpockwireError):
    """A snapshot could not be taken or read (slot creation refused, snapshot import failed, table gone)."""


# ---------------------------------------------------------------------------------------------------- the slot

@dataclass
class ExportedSnapshot:
    """A slot just created with an exported snapshot. The replication connection that created it stays open
    and idle (the snapshot lives as long as it does, and dies with it) until `close()`."""

    slot: str
    plugin: str
    consistent_point: int
    name: str
    taken_at: _dt.datetime
    server_version_num: int
    _conn: Any = field(default=None, repr=False)

    @property
    def consistent_point_text(self) -> str:
        return format_lsn(self.consistent_point)

    @property
    def open(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def close(self) -> None:
        """End the replication connection: the exported snapshot is no longer importable; the slot stays."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def __enter__(self) -> "ExportedSnapshot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def create_slot_with_snapshot(dsn: str, slot: str, plugin: str = "pgoutput", *, two_phase: bool = False,
                              temporary: bool = False,
                              connect_kwargs: dict[str, Any] | None = None) -> ExportedSnapshot:
    """Create logical slot `slot` over a replication connection with an exported snapshot and return it with
    that connection held open.

    PostgreSQL 15 and later take ``CREATE_REPLICATION_SLOT name LOGICAL plugin (SNAPSHOT 'export')``, older
    servers ``... LOGICAL plugin EXPORT_SNAPSHOT``. Nothing else may run on the connection until the snapshot has
    been read (a command on it ends the export): close it then. An existing slot of that name is an error.
    A `temporary` slot is dropped by the server when the connection ends (what table snapshots of a running
    stream use: only the pair (consistent point, snapshot) matters).
    """
    import psycopg2
    from psycopg2.extras import LogicalReplicationConnection

    try:
        library = SLOT_PLUGIN[plugin]
    except KeyError:
        raise SnapshotError(f"unknown plugin {plugin!r} (one of {', '.join(sorted(SLOT_PLUGIN))})") from None
    try:
        conn = psycopg2.connect(dsn, connection_factory=LogicalReplicationConnection,
                                **pinned_kwargs(dsn, connect_kwargs))
    except psycopg2.Error as exc:
        raise SnapshotError(f"cannot open a replication connection to create slot {slot!r}: "
                            f"{str(exc).strip()}") from exc
    try:
        version = conn.server_version
        if version >= 150000:
            opts = ["SNAPSHOT 'export'"] + (["TWO_PHASE"] if two_phase else [])
            command = (f"CREATE_REPLICATION_SLOT {_quote_ident(slot)} {'TEMPORARY ' if temporary else ''}LOGICAL "
                       f"{library} ({', '.join(opts)})")
        else:
            if two_phase:
                raise SnapshotError("two_phase slots with an exported snapshot need PostgreSQL 15 or later")
            command = (f"CREATE_REPLICATION_SLOT {_quote_ident(slot)} {'TEMPORARY ' if temporary else ''}LOGICAL "
                       f"{library} EXPORT_SNAPSHOT")
        cur = conn.cursor()
        cur.execute(command)
        row = cur.fetchone()
        taken_at = _dt.datetime.now(_dt.timezone.utc)
    except psycopg2.Error as exc:
        conn.close()
        refused = plugin_not_allowed(exc, library)
        if refused is not None:
            raise refused from None
        raise SnapshotError(f"cannot create slot {slot!r} with an exported snapshot: {str(exc).strip()}") from exc
    except BaseException:
        conn.close()
        raise
    # row: slot_name, consistent_point, snapshot_name, output_plugin
    exported = ExportedSnapshot(slot=slot, plugin=plugin, consistent_point=parse_lsn(row[1]), name=row[2],
                                taken_at=taken_at, server_version_num=version, _conn=conn)
    log.info("slot %s created at consistent point %s with exported snapshot %s", slot, row[1], row[2])
    return exported


def snapshot_time(dsn: str, snapshot_name: str, connect_kwargs: dict[str, Any] | None = None) -> _dt.datetime:
    """The commit time of the newest transaction the exported snapshot sees (needs track_commit_timestamp), else
    the server's clock now: the `_commit_ts` of snapshot rows."""
    import psycopg2

    conn = psycopg2.connect(dsn, **pinned_kwargs(dsn, connect_kwargs))
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            cur.execute("SELECT clock_timestamp()")
            now = cur.fetchone()[0]
            cur.execute("ROLLBACK")
    finally:
        conn.close()
    return now.astimezone(_dt.timezone.utc)


# ---------------------------------------------------------------------------------------------------- the tables

@dataclass(frozen=True)
class SnapshotTable:
    """A table the stream replicates: its `relation` (as the stream will describe it: for a partition published
    through its root, the root) and the tables read for its rows (`sources`: itself; for a partitioned root the
    reader reads its leaf partitions), with the server's row estimate (pg_class.reltuples of the table or its
    leaves; -1 when never analysed)."""

    relation: Relation
    sources: tuple[str, ...]
    estimated_rows: int
    where: str | None = None         # the publication's / replication set's row filter (SQL), None: every row

    @property
    def name(self) -> str:
        return self.relation.qualified_name

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.relation.columns]


_PUBLICATION_TABLES = """
SELECT c.oid, {filters}
  FROM pg_publication_tables p
  JOIN pg_namespace n ON n.nspname = p.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
 WHERE p.pubname = ANY(%s)
"""

_SET_TABLES = """
SELECT t.set_reloid::oid, t.set_att_list::text[], pg_get_expr(t.set_row_filter, t.set_reloid)
  FROM {schema}.replication_set_table t
  JOIN {schema}.replication_set s ON s.set_id = t.set_id
  JOIN {schema}.local_node l ON l.node_id = s.set_nodeid
 WHERE s.set_name = ANY(%s)
"""

_COLUMNS = """
SELECT a.attname, a.atttypid::oid::bigint, a.atttypmod,
       (c.relreplident = 'f' OR a.attnum = ANY(coalesce(i.indkey::int2[], '{}'))) AS is_key
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_index i ON i.indrelid = c.oid AND (
        (c.relreplident = 'i' AND i.indisreplident) OR (c.relreplident = 'd' AND i.indisprimary))
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
 ORDER BY a.attnum
"""


def _relation_of(cur: Any, oid: int, protocol: str, published: set[str] | None = None) -> Relation:
    cur.execute("SELECT n.nspname, c.relname, c.relreplident FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,))
    nsp, name, ident = cur.fetchone()
    cur.execute(_COLUMNS, (oid,))
    cols = []
    for attname, typoid, typmod, is_key in cur.fetchall():
        if published is not None and attname not in published:
            continue                     # not in the publication's column list: the stream does not send it
        if protocol == "pglogical":      # pglogical's relation message has no type OIDs
            cols.append(Column(attname, None, None, bool(is_key)))
        else:
            cols.append(Column(attname, int(typoid), int(typmod), bool(is_key)))
    if ident == "n":
        cols = [Column(c.name, c.type_oid, c.type_modifier, False) for c in cols]
    return Relation(oid, nsp, name, tuple(cols), ident if protocol == "pgoutput" else None, 1)


def _qualified(cur: Any, oid: int) -> str:
    cur.execute("SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,))
    return cur.fetchone()[0]


def _leaves(cur: Any, oid: int) -> list[int]:
    cur.execute("SELECT relid::oid::bigint FROM pg_partition_tree(%s) WHERE isleaf ORDER BY level, relid::text",
                (oid,))
    return [int(r[0]) for r in cur.fetchall()]


#: where chunked snapshots write their watermarks when the output plugin forwards no logical messages (pglogical,
#: spock): created and added to the stream's replication set by the worker; never read by a snapshot, never staged
WATERMARK_TABLE = "public.spockwire_watermark"


def replicated_tables(dsn_or_conn: Any, plugin: str, *, publication: Any = None, replication_sets: Any = None,
                      snapshot: str | None = None, connect_kwargs: dict[str, Any] | None = None,
                      skip: Iterable[str] = ()) -> list[SnapshotTable]:
    """Every table the stream of these settings replicates, with the relation it arrives as.

    pgoutput: ``pg_publication_tables`` of the publications, which already honours ``publish_via_partition_root``
    (the root is listed and its leaf partitions are read as its rows; otherwise each leaf is listed itself).
    pglogical / spock: the tables of the replication sets (``<schema>.replication_set_table``). Tables without a
    primary key are included. Column lists and row filters are honoured: the relation has the published columns
    only, and `where` is the row filter (several publications: the union of the columns, the OR of the filters). With `snapshot`, the catalogs are read as the exported snapshot sees them. Tables
    named in `skip` ("schema.table") are left out before their columns are read.
    """
    import psycopg2

    from ..connection.options import plugin_protocol, split_names

    protocol = plugin_protocol(plugin)
    own = isinstance(dsn_or_conn, str)
    conn = psycopg2.connect(dsn_or_conn, **pinned_kwargs(dsn_or_conn, connect_kwargs)) if own else dsn_or_conn
    try:
        with conn.cursor() as cur:
            if snapshot is not None:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            if protocol == "pgoutput":
                names = list(split_names(publication))
                if not names:
                    raise SnapshotError("pgoutput needs at least one publication to know which tables to read")
                cur.execute("SELECT pubname FROM pg_publication WHERE pubname = ANY(%s)", (names,))
                missing = sorted(set(names) - {r[0] for r in cur.fetchall()})
                if missing:
                    raise SnapshotError(f"publication {', '.join(missing)} does not exist")
                # PostgreSQL 15+: column lists (attnames lists every column when there is none) and row filters
                filters = ("p.attnames::text[], p.rowfilter" if conn.server_version >= 150000
                           else "NULL::text[], NULL::text")
                cur.execute(_PUBLICATION_TABLES.format(filters=filters), (names,))
            else:
                schema = "pglogical" if protocol == "pglogical" else "spock"
                sets = list(split_names(replication_sets)) or ["default"]
                cur.execute(_SET_TABLES.format(schema=schema), (sets,))
            # per table: the union of the column lists and the OR of the row filters of every publication / set
            # naming it (no list, or no filter, in any of them: all columns, all rows), as the server decides
            columns: dict[int, set[str] | None] = {}
            filters_of: dict[int, list[str] | None] = {}
            for oid, attnames, rowfilter in cur.fetchall():
                oid = int(oid)
                if oid not in columns:
                    columns[oid], filters_of[oid] = set(), []
                if attnames is None or columns[oid] is None:
                    columns[oid] = None
                else:
                    columns[oid].update(attnames)
                if rowfilter is None or filters_of[oid] is None:
                    filters_of[oid] = None
                elif rowfilter not in filters_of[oid]:
                    filters_of[oid].append(rowfilter)
            oids = sorted(columns)
            skip = set(skip) | {WATERMARK_TABLE}
            if skip and oids:
                cur.execute("SELECT c.oid::bigint, n.nspname || '.' || c.relname FROM pg_class c "
                            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s)", (oids,))
                oids = sorted(oid for oid, name in cur.fetchall() if name not in skip)
            tables = []
            for oid in oids:
                rel = _relation_of(cur, oid, protocol, columns[oid])
                cur.execute("SELECT relkind FROM pg_class WHERE oid = %s", (oid,))
                kind = cur.fetchone()[0]
                parts = _leaves(cur, oid) if kind == "p" else [oid]
                cur.execute("SELECT coalesce(sum(greatest(reltuples, 0)), 0)::bigint, bool_or(reltuples < 0) "
                            "FROM pg_class WHERE oid = ANY(%s)", (parts,))
                estimate, unknown = cur.fetchone()
                # the reader reads a partitioned table's leaves itself (columns by name, as the root's rows)
                where = None if not filters_of[oid] else " OR ".join(f"({f})" for f in filters_of[oid])
                tables.append(SnapshotTable(rel, (_qualified(cur, oid),), -1 if unknown else int(estimate), where))
            if snapshot is not None:
                cur.execute("ROLLBACK")
            return tables
    finally:
        if own:
            conn.close()


# ---------------------------------------------------------------------------------------------------- snapshot rows

def snapshot_batch(relation: Relation, values: pa.RecordBatch, first_row: int, commit_lsn: int,
                   commit_ts: _dt.datetime) -> pa.RecordBatch:
    """A reader batch of `relation`'s columns as a change batch of snapshot rows (change columns first)."""
    from ..export.arrow import change_fields, int64_sequence, repeated
    n = values.num_rows
    # each column from its buffers: no Python object per row
    change = [
        repeated("insert", n, pa.string()),
        repeated(commit_lsn, n, pa.uint64()),
        repeated(epoch_micros(commit_ts), n, _TS),
        pa.nulls(n, pa.uint32()),
        int64_sequence(SNAPSHOT_SEQ_BASE + first_row, n),
        pa.nulls(n, pa.string()),
        pa.nulls(n, pa.list_(pa.string())),
    ]
    names = [c.name for c in relation.columns]
    fields = change_fields()
    arrays = list(change)
    for name in names:
        idx = values.schema.get_field_index(name)
        if idx < 0:
            raise SnapshotError(f"the reader returned no column {name!r} for {relation.qualified_name}")
        arrays.append(values.column(idx))
        fields.append(values.schema.field(idx))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# ---------------------------------------------------------------------------------------------------- progress

@dataclass
class SnapshotProgress:
    """Rows and tables read so far against the server's estimates (pg_class.reltuples)."""

    tables_total: int = 0
    tables_done: int = 0
    rows: int = 0
    estimated_rows: int = 0
    started: float = field(default_factory=time.monotonic)
    current: str | None = None

    def eta_seconds(self) -> float | None:
        """Seconds left at the rate so far, from the estimates; None before any row or without estimates."""
        elapsed = time.monotonic() - self.started
        if self.rows <= 0 or self.estimated_rows <= 0 or elapsed <= 0:
            return None
        left = max(self.estimated_rows - self.rows, 0)
        return left / (self.rows / elapsed)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        eta = self.eta_seconds()
        eta_text = "?" if eta is None else f"{eta:,.0f}s"
        est = f"/~{self.estimated_rows:,}" if self.estimated_rows > 0 else ""
        return (f"spockwire snapshot: {self.rows:,}{est} rows ({self.rows / elapsed:,.0f}/s), "
                f"{self.tables_done}/{self.tables_total} tables, ETA {eta_text}"
                + (f", reading {self.current}" if self.current else ""))


def iter_snapshot_rows(dsn: str, table: SnapshotTable, snapshot: str, *, workers: int = 1, types: str = "typed",
                       connect_kwargs: dict[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of `table` under the exported `snapshot`, batch by batch (each source table in turn, the columns
    in the relation's order, so a leaf partition's rows come as its root's)."""
    for source in table.sources:
        for batch in iter_table_batches(dsn, source, workers=workers, snapshot=snapshot,
                                        columns=table.column_names, types=types, where=table.where,
                                        connect_kwargs=connect_kwargs):
            if isinstance(batch, pa.Table):
                yield from batch.to_batches()
            else:
                yield batch


def snapshot_rows(batches: Iterable[pa.RecordBatch], relation: Relation, commit_lsn: int,
                  commit_ts: _dt.datetime, progress: SnapshotProgress | None = None,
                  on_batch: Callable[[], None] | None = None) -> Iterator[pa.RecordBatch]:
    """Reader batches as snapshot change batches, numbered from 0 across the whole table."""
    row = 0
    for values in batches:
        if values.num_rows == 0:
            continue
        yield snapshot_batch(relation, values, row, commit_lsn, commit_ts)
        row += values.num_rows
        if progress is not None:
            progress.rows += values.num_rows
        if on_batch is not None:
            on_batch()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetch(items: Iterable[Any], depth: int = 4) -> Iterator[Any]:
    """`items` produced on a thread of their own, at most `depth` ahead of the consumer: the table is read (COPY,
    decoding) while the previous batches are written (Parquet encoding releases the GIL). An exception of the
    producer is raised in the consumer; a consumer that stops early stops the producer, which closes `items` on
    its own thread."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        it = iter(items)
        try:
            for item in it:
                if not put(item):
                    break
            else:
                put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(_Failed(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="spockwire-snapshot-read", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


def stage_snapshot_tables(writer: Any, dsn: str, exported: ExportedSnapshot, tables: Sequence[SnapshotTable],
                          commit_ts: Any, *, workers: int = 1, types: str = "typed",
                          progress: SnapshotProgress | None = None,
                          on_progress: Callable[[SnapshotProgress], None] | None = None,
                          connect_kwargs: dict[str, Any] | None = None) -> dict[str, int]:
    """Read every table under the exported snapshot into `writer` (a StagingWriter) as pending snapshot files at
    the consistent point (published by the caller's next commit); returns the rows of each table."""
    progress = progress if progress is not None else SnapshotProgress()
    progress.tables_total = len(tables)
    progress.estimated_rows = sum(max(t.estimated_rows, 0) for t in tables)
    counts: dict[str, int] = {}
    for table in tables:
        progress.current = table.name
        batches = iter_snapshot_rows(dsn, table, exported.name, workers=workers, types=types,
                                     connect_kwargs=connect_kwargs)
        rows = writer.stage_snapshot_table(
            table.relation, prefetch(snapshot_rows(batches, table.relation, exported.consistent_point, commit_ts,
                                                   progress, (lambda: on_progress(progress)) if on_progress else None)))
        counts[table.name] = rows
        progress.tables_done += 1
        progress.current = None
        if on_progress is not None:
            on_progress(progress)
        log.info("snapshot of %s: %d rows", table.name, rows)
    return counts


def snapshot_record(kind: str, exported: ExportedSnapshot, commit_ts: Any, counts: dict[str, int],
                    **more: Any) -> dict[str, Any]:
    """The "snapshot" record of a staging commit that publishes snapshot rows (docs/staging.md)."""
    return {"kind": kind, "slot": exported.slot, "consistent_point": exported.consistent_point,
            "consistent_point_text": exported.consistent_point_text, "snapshot_name": exported.name,
            "snapshot_ts": commit_ts.isoformat(), "tables": counts, **more}


def stage_initial_snapshot(writer: Any, dsn: str, exported: ExportedSnapshot, tables: Sequence[SnapshotTable], *,
                           workers: int = 1, types: str = "typed", progress: SnapshotProgress | None = None,
                           on_progress: Callable[[SnapshotProgress], None] | None = None,
                           connect_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read every table under the exported snapshot into `writer` (a StagingWriter) as pending snapshot files and
    publish them all in one staging commit at the consistent point. Returns that log entry.

    Nothing is visible before that commit: a crash leaves only files no log entry names, which the next writer
    removes (docs/staging.md, "Snapshot rows").
    """
    commit_ts = snapshot_time(dsn, exported.name, connect_kwargs)
    counts = stage_snapshot_tables(writer, dsn, exported, tables, commit_ts, workers=workers, types=types,
                                   progress=progress, on_progress=on_progress, connect_kwargs=connect_kwargs)
    return writer.commit(exported.consistent_point, snapshot=snapshot_record("initial", exported, commit_ts, counts))


def iter_snapshot_changes(dsn: str, exported: ExportedSnapshot, tables: Sequence[SnapshotTable] | None = None, *,
                          publication: Any = None, replication_sets: Any = None, workers: int = 1,
                          types: str = "typed", connect_kwargs: dict[str, Any] | None = None
                          ) -> Iterator[ChangeBatch]:
    """Every snapshot row of `tables` (default: every table the slot's stream replicates, listed with
    `publication` / `replication_sets`) as `ChangeBatch` events, the same kind the stream's decoder drains, so a
    consumer handles snapshot and changes alike:

        with create_slot_with_snapshot(dsn, "lake", "pgoutput") as exported:
            for batch in iter_snapshot_changes(dsn, exported, publication="pub"):
                consume(batch)                       # insert rows at the consistent point, _xid null
        stream = spockwire.connect(dsn, slot="lake", publication="pub", start_lsn=exported.consistent_point)

    The exported snapshot must still be open (iterate before leaving the `with` block)."""
    if tables is None:
        tables = replicated_tables(dsn, exported.plugin, publication=publication, replication_sets=replication_sets,
                                   snapshot=exported.name, connect_kwargs=connect_kwargs)
    commit_ts = snapshot_time(dsn, exported.name, connect_kwargs)
    for table in tables:
        batches = iter_snapshot_rows(dsn, table, exported.name, workers=workers, types=types,
                                     connect_kwargs=connect_kwargs)
        for rb in snapshot_rows(batches, table.relation, exported.consistent_point, commit_ts):
            yield ChangeBatch(table.relation, rb)
