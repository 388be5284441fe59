"""Reading whole tables into Arrow: planning, connections, snapshots and workers.

A table is read with ``COPY (SELECT columns FROM ONLY table ...) TO STDOUT (FORMAT binary)`` (``COPY table
(columns) TO STDOUT`` when nothing filters it) on connections whose transactions all see one snapshot. The COPY
data goes from libpq to the decoder in large pieces (`CopyDataPump`, one Python call per piece, never per row) and
is decoded by `CopyBinaryDecoder` (spockwire.wire) with the same value kernels as the binary values of the
replication stream: a column comes out with exactly the Arrow type and values the stream decoder gives it.

Plan: a partitioned table is read through its leaf partitions, their rows presented as the parent's (the parent's
columns, by name, in the parent's order). With ``workers > 1`` every leaf larger than a few MB is cut into block
ranges (``ctid >= '(a,0)' AND ctid < '(b,0)'``, TID range scans from PostgreSQL 14; older servers read each leaf
whole) and the ranges are spread over the connections. Memory stays bounded whatever the table size: each
connection holds at most one batch being built plus one piece of COPY data, and finished batches wait in a queue
of ``2 * workers`` batches for the consumer.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from ..connection.session import pinned_connect
from ..connection.stream import load_pump
from ..errors import SpockwireError
from ..model import Column, Relation
from ..values.catalog import ColumnSpec, PostgresTypeCatalog
from ..wire import load_implementation

__all__ = ["read_table", "iter_table_batches", "TableReader", "ReadProgress", "TableChunk", "SnapshotReadError",
           "DEFAULT_PIECE_BYTES", "MIN_CHUNK_PAGES"]

#: bytes of COPY data handed from libpq to the decoder per call
DEFAULT_PIECE_BYTES = 1 << 18
#: smallest block range a leaf is cut into when several workers read it (8 MB with 8 kB blocks)
MIN_CHUNK_PAGES = 1024
#: ctid ranges per worker a large leaf is cut into (so that workers finish close together)
CHUNKS_PER_WORKER = 4
#: pieces of COPY data received ahead of the decoder, per connection
PREFETCH_PIECES = 16


class SnapshotReadError(SpockwireError):
    """A table cannot be read as asked (unknown table or column, bad option, a worker failed)."""


@dataclass(frozen=True)
class TableChunk:
    """One COPY of a read: a leaf table (its SQL name) and a block range of it (None: from the start / to the end)."""

    leaf: str
    leaf_oid: int
    first_page: int | None = None
    stop_page: int | None = None
    relkind: str = "r"


@dataclass
class ReadProgress:
    """Where a read stands; handed to the `progress` callback after every batch and once at the end.

    `tables_total` counts the tables COPY reads (the leaf partitions of a partitioned table, else 1);
    `estimated_rows` is the sum of their ``pg_class.reltuples`` (0 when never analyzed).
    """

    table: str
    rows: int = 0
    bytes: int = 0
    chunks_done: int = 0
    chunks_total: int = 0
    tables_done: int = 0
    tables_total: int = 0
    estimated_rows: int = 0
    elapsed: float = 0.0
    finished: bool = False

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the current rate, from the reltuples estimate (None when unknown)."""
        if self.finished:
            return 0.0
        if self.rows <= 0 or self.estimated_rows <= self.rows or self.elapsed <= 0:
            return None
        return (self.estimated_rows - self.rows) * self.elapsed / self.rows


class _LockedCatalog:
    """A type catalog several worker threads may ask (one psycopg2 connection behind it)."""

    def __init__(self, catalog: Any) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()

    def type_info(self, oid: int) -> Any:
        with self._lock:
            return self._catalog.type_info(oid)

    def column_types(self, relation: Relation) -> Any:
        with self._lock:
            return self._catalog.column_types(relation)

    def composite_fields(self, oid: int) -> Any:
        with self._lock:
            return self._catalog.composite_fields(oid)

    def close(self) -> None:
        close = getattr(self._catalog, "close", None)
        if close is not None:
            close()


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Conn:
    """One connection of a read: psycopg2 for the SQL, the pump for the COPY data."""

    def __init__(self, dsn: str, connect_kwargs: Mapping[str, Any] | None) -> None:
        self.conn = pinned_connect(dsn, **dict(connect_kwargs or {}))
        self.conn.autocommit = True
        self.pump: Any = None

    def execute(self, sql: str, params: Any = None) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def begin(self, snapshot: str | None) -> None:
        self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if snapshot is not None:
            self.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))

    def close(self) -> None:
        if self.pump is not None:
            try:
                if self.pump.active:
                    self.pump.cancel(2.0)
            finally:
                self.pump.detach()
                self.pump = None
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


class TableReader:
    """The connections, snapshot and plan of one table read; `batches()` reads it (again, same snapshot).

    Use as a context manager; `snapshot_name` is the snapshot every connection sees (the one given, or the one
    exported from the first connection when ``workers > 1``; None for one connection without a given snapshot).
    """

    def __init__(self, dsn: str, table: str | tuple[str, str], *, workers: int = 1, snapshot: str | None = None,
                 columns: Sequence[str] | None = None, types: str = "typed", where: str | None = None,
                 numeric: str = "decimal", on_unrepresentable: str = "text",
                 column_types: Mapping[str, str] | None = None, type_catalog: Any = "auto",
                 batch_rows: int | None = None, batch_bytes: int | None = None,
                 piece_bytes: int = DEFAULT_PIECE_BYTES, connect_kwargs: Mapping[str, Any] | None = None,
                 progress: Callable[[ReadProgress], None] | None = None) -> None:
        if int(workers) < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.dsn = dsn
        self.workers = int(workers)
        self.types = types
        self.where = where
        self.numeric = numeric
        self.on_unrepresentable = on_unrepresentable
        self.column_types = dict(column_types or {})
        self.piece_bytes = int(piece_bytes)
        self.progress = progress
        self._impl = load_implementation()
        self._pumps = load_pump()
        self._decoder_options: dict[str, Any] = {}
        if batch_rows is not None:
            self._decoder_options["batch_rows"] = int(batch_rows)
        if batch_bytes is not None:
            self._decoder_options["batch_bytes"] = int(batch_bytes)
        self._conns: list[_Conn] = []
        self._own_catalog = type_catalog == "auto"
        self._catalog: Any = None
        try:
            first = _Conn(dsn, connect_kwargs)
            self._conns.append(first)
            first.begin(snapshot)
            self.snapshot_name = snapshot
            self._plan(first, table, columns)
            if self._own_catalog:
                self._catalog = _LockedCatalog(PostgresTypeCatalog(dsn, strict=False))
            else:
                self._catalog = None if type_catalog is None else _LockedCatalog(type_catalog)
            # the decoding plan: checked once here (bad options raise before any COPY runs)
            self.specs: tuple[ColumnSpec, ...] = self._decoder().specs
            nconn = min(self.workers, max(1, len(self.chunks)))
            if nconn > 1 and self.snapshot_name is None:
                self.snapshot_name = first.execute("SELECT pg_export_snapshot()")[0][0]
            for _ in range(nconn - 1):
                conn = _Conn(dsn, connect_kwargs)
                self._conns.append(conn)
                conn.begin(self.snapshot_name)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ plan
    def _plan(self, conn: _Conn, table: str | tuple[str, str], columns: Sequence[str] | None) -> None:
        if isinstance(table, tuple):
            name = f"{_quote_ident(table[0])}.{_quote_ident(table[1])}"
        else:
            name = str(table)
        rows = conn.execute("SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident FROM pg_class c "
                            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (name,))
        if not rows:
            raise SnapshotReadError(f"no table {name!r}")
        oid, nspname, relname, relkind, replident = rows[0]
        if relkind not in ("r", "p", "m", "f"):
            raise SnapshotReadError(f"{nspname}.{relname} is not a table (relkind {relkind!r})")
        attrs = conn.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod, a.attgenerated, "
            "COALESCE(a.attnum = ANY(i.indkey), false) FROM pg_attribute a "
            "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (oid,))
        by_name = {r[0]: r for r in attrs}
        if columns is None:
            # generated columns are not part of what logical replication sends by default: not read either unless named
            chosen = [r for r in attrs if not r[3]]
        else:
            chosen = []
            for col in columns:
                if col not in by_name:
                    raise SnapshotReadError(f"{nspname}.{relname} has no column {col!r}")
                chosen.append(by_name[col])
            if len({c[0] for c in chosen}) != len(chosen):
                raise SnapshotReadError(f"columns names a column twice: {list(columns)}")
        if not chosen:
            raise SnapshotReadError(f"no columns to read from {nspname}.{relname}")
        self.relation = Relation(int(oid), nspname, relname,
                                 tuple(Column(r[0], int(r[1]), int(r[2]), bool(r[4])) for r in chosen),
                                 {"d": "d", "n": "n", "f": "f", "i": "i"}.get(replident), 1)
        self.table = self.relation.qualified_name
        self._select_list = ", ".join(_quote_ident(r[0]) for r in chosen)
        if relkind == "p":
            leaves = conn.execute(
                "SELECT t.relid::oid, t.relid::regclass::text, c.relkind, c.reltuples, "
                "pg_relation_size(t.relid), current_setting('block_size')::int "
                "FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid "
                "WHERE t.isleaf ORDER BY t.relid::regclass::text", (oid,))
        else:
            leaves = conn.execute(
                "SELECT c.oid, c.oid::regclass::text, c.relkind, c.reltuples, "
                "CASE WHEN c.relkind IN ('r', 'm') THEN pg_relation_size(c.oid) ELSE 0 END, "
                "current_setting('block_size')::int FROM pg_class c WHERE c.oid = %s", (oid,))
        self.partitioned = relkind == "p"
        self.server_version = int(conn.execute("SHOW server_version_num")[0][0])
        ranges = self.server_version >= 140000 and self.workers > 1
        self.leaves = [(int(r[0]), r[1]) for r in leaves]
        self.estimated_rows = int(sum(max(float(r[3]), 0.0) for r in leaves))
        chunks: list[TableChunk] = []
        total_pages = sum(int(r[4]) // max(int(r[5]), 1) for r in leaves)
        for leaf_oid, leaf, kind, _tuples, size, block in leaves:
            pages = int(size) // max(int(block), 1)
            step = max(MIN_CHUNK_PAGES, -(-total_pages // (self.workers * CHUNKS_PER_WORKER)))
            if not ranges or kind not in ("r", "m") or pages < 2 * MIN_CHUNK_PAGES:
                chunks.append(TableChunk(leaf, int(leaf_oid), relkind=kind))
                continue
            start = 0
            while start < pages:
                stop = start + step
                # the last range is open-ended: a visible row can never lie past the size seen now, but the
                # range must not depend on it
                chunks.append(TableChunk(leaf, int(leaf_oid), start, None if stop >= pages else stop, kind))
                start = stop
        self.chunks = chunks

    def query(self, chunk: TableChunk) -> str:
        """The COPY statement of one chunk."""
        conds = []
        if chunk.first_page is not None and chunk.first_page > 0:
            conds.append(f"ctid >= '({chunk.first_page},0)'::tid")
        if chunk.stop_page is not None:
            conds.append(f"ctid < '({chunk.stop_page},0)'::tid")
        if self.where:
            conds.append(f"({self.where})")
        if not conds and chunk.relkind == "r":
            return f"COPY {chunk.leaf} ({self._select_list}) TO STDOUT (FORMAT binary)"
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        return f"COPY (SELECT {self._select_list} FROM ONLY {chunk.leaf}{where}) TO STDOUT (FORMAT binary)"

    def _decoder(self, column_types: Mapping[str, str] | None = None) -> Any:
        merged = dict(self.column_types)
        merged.update(column_types or {})
        return self._impl.CopyBinaryDecoder(self.relation, types=self.types, type_catalog=self._catalog,
                                            numeric=self.numeric, on_unrepresentable=self.on_unrepresentable,
                                            column_types=merged, **self._decoder_options)

    def empty_schema(self, column_types: Mapping[str, str] | None = None) -> pa.Schema:
        """The schema of a read that returns no row (untyped columns: string, as for a batch of NULLs)."""
        specs = self._decoder(column_types).specs
        return pa.schema([pa.field(c.name, s.arrow_type if s.arrow_type is not None else pa.string())
                          for c, s in zip(self.relation.columns, specs)])

    # ------------------------------------------------------------------ reading
    def _pieces(self, conn: _Conn, query: str, stop: threading.Event | None) -> Iterator[bytes]:
        """The COPY data of `query` in pieces, fetched by a thread of its own: libpq keeps receiving (the pump
        releases the GIL) while the caller decodes the previous piece. At most PREFETCH_PIECES wait."""
        if conn.pump is None:
            conn.pump = self._pumps.CopyDataPump(conn.conn.pgconn_ptr, max_batch_bytes=self.piece_bytes)
        pump = conn.pump
        pieces: queue.Queue = queue.Queue(maxsize=PREFETCH_PIECES)
        halt = threading.Event()
        end = object()

        def put(item: Any) -> bool:
            while not halt.is_set() and not (stop is not None and stop.is_set()):
                try:
                    pieces.put(item, timeout=0.2)
                    return True
                except queue.Full:
                    continue
            return False

        def fetch() -> None:
            try:
                pump.start(query)
                while True:
                    data = pump.read(0.5)
                    if data and not put(data):
                        break
                    if pump.finished:
                        put(end)
                        return
                pump.cancel(2.0)   # the reader stopped early: end the COPY, leave the connection usable
            except BaseException as exc:  # noqa: BLE001 - raised in the reading thread
                put(exc)

        fetcher = threading.Thread(target=fetch, name="spockwire-copy-fetch", daemon=True)
        fetcher.start()
        try:
            while True:
                try:
                    item = pieces.get(timeout=0.2)
                except queue.Empty:
                    if stop is not None and stop.is_set():
                        return
                    if not fetcher.is_alive() and pieces.empty():
                        raise SnapshotReadError("the COPY reader thread ended without a result")
                    continue
                if item is end:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            halt.set()
            while fetcher.is_alive():
                try:
                    pieces.get(timeout=0.05)
                except queue.Empty:
                    pass
            fetcher.join()

    def _read_chunk(self, conn: _Conn, chunk: TableChunk, column_types: Mapping[str, str] | None,
                    stop: threading.Event | None = None) -> Iterator[tuple[pa.RecordBatch | None, int]]:
        """(batch, COPY bytes since the last item) pairs of one chunk; a final (None, bytes) ends it."""
        dec = self._decoder(column_types)
        nbytes = 0
        for data in self._pieces(conn, self.query(chunk), stop):
            nbytes += len(data)
            dec.feed(data)
            for batch in dec.drain():
                yield batch, nbytes
                nbytes = 0
        if stop is not None and stop.is_set():
            return
        for batch in dec.finish():
            yield batch, nbytes
            nbytes = 0
        yield None, nbytes

    def batches(self, column_types: Mapping[str, str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every row of the table as record batches (bounded memory); may be called again (same snapshot)."""
        progress = ReadProgress(self.table, chunks_total=len(self.chunks), tables_total=len(self.leaves),
                                estimated_rows=self.estimated_rows)
        started = time.monotonic()
        left = {}
        for chunk in self.chunks:
            left[chunk.leaf_oid] = left.get(chunk.leaf_oid, 0) + 1

        def account(batch: pa.RecordBatch | None, nbytes: int, chunk: TableChunk | None) -> None:
            progress.bytes += nbytes
            progress.elapsed = time.monotonic() - started
            if batch is not None:
                progress.rows += batch.num_rows
            elif chunk is not None:
                progress.chunks_done += 1
                left[chunk.leaf_oid] -= 1
                if left[chunk.leaf_oid] == 0:
                    progress.tables_done += 1
            if self.progress is not None:
                self.progress(progress)

        if len(self._conns) == 1:
            conn = self._conns[0]
            for chunk in self.chunks:
                for batch, nbytes in self._read_chunk(conn, chunk, column_types):
                    account(batch, nbytes, chunk)
                    if batch is not None:
                        yield batch
        else:
            yield from self._parallel(column_types, account)
        progress.finished = True
        progress.elapsed = time.monotonic() - started
        if self.progress is not None:
            self.progress(progress)

    def _parallel(self, column_types: Mapping[str, str] | None,
                  account: Callable[[Any, int, Any], None]) -> Iterator[pa.RecordBatch]:
        todo: queue.Queue = queue.Queue()
        for chunk in self.chunks:
            todo.put(chunk)
        out: queue.Queue = queue.Queue(maxsize=2 * len(self._conns))
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.2)
                    return True
                except queue.Full:
                    continue
            return False

        def work(conn: _Conn) -> None:
            try:
                while not stop.is_set():
                    try:
                        chunk = todo.get_nowait()
                    except queue.Empty:
                        break
                    for batch, nbytes in self._read_chunk(conn, chunk, column_types, stop):
                        if not put(("batch", batch, nbytes, chunk)):
                            return
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
                put(("error", exc, 0, None))
            finally:
                put(("done", None, 0, None))

        threads = [threading.Thread(target=work, args=(conn,), name=f"spockwire-read-{i}", daemon=True)
                   for i, conn in enumerate(self._conns)]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                kind, item, nbytes, chunk = out.get()
                if kind == "done":
                    running -= 1
                elif kind == "error":
                    raise item
                else:
                    account(item, nbytes, chunk)
                    if item is not None:
                        yield item
        finally:
            stop.set()
            while any(t.is_alive() for t in threads):
                try:
                    out.get(timeout=0.05)
                except queue.Empty:
                    pass
            for t in threads:
                t.join()

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []
        if self._own_catalog and self._catalog is not None:
            self._catalog.close()
            self._catalog = None

    def __enter__(self) -> "TableReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iter_table_batches(dsn: str, table: str | tuple[str, str], *, workers: int = 1, snapshot: str | None = None,
                       columns: Sequence[str] | None = None, types: str = "typed", where: str | None = None,
                       numeric: str = "decimal", on_unrepresentable: str = "text",
                       column_types: Mapping[str, str] | None = None, type_catalog: Any = "auto",
                       batch_rows: int | None = None, batch_bytes: int | None = None,
                       connect_kwargs: Mapping[str, Any] | None = None,
                       progress: Callable[[ReadProgress], None] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of `table` as pyarrow record batches, in bounded memory (see `read_table`).

    A batch's schema is the table's, except where the decoder had to change a column on the way, exactly as the
    stream decoder does: a column whose Arrow type cannot hold a valid value (NaN in numeric(p,s), a timestamp
    past year 294276, a multi-dimensional array) is PostgreSQL's text (string) from that batch on, and an untyped
    column (types="raw", unknown types) is binary in a batch with a value, string in a batch of NULLs only.
    """
    with TableReader(dsn, table, workers=workers, snapshot=snapshot, columns=columns, types=types, where=where,
                     numeric=numeric, on_unrepresentable=on_unrepresentable, column_types=column_types,
                     type_catalog=type_catalog, batch_rows=batch_rows, batch_bytes=batch_bytes,
                     connect_kwargs=connect_kwargs, progress=progress) as reader:
        yield from reader.batches()


def _unify(reader: TableReader, batches: list[pa.RecordBatch]) -> tuple[pa.Schema, list[pa.RecordBatch]] | None:
    """One schema for all batches, or None when a typed column switched to text in some (read it again)."""
    if not batches:
        return reader.empty_schema(), []
    names = batches[0].schema.names
    target = []
    for i, name in enumerate(names):
        kinds = {b.schema.field(i).type for b in batches}
        if len(kinds) == 1:
            target.append(pa.field(name, kinds.pop()))
        elif kinds == {pa.string(), pa.binary()}:
            target.append(pa.field(name, pa.binary()))   # untyped: NULL-only batches come as string
        else:
            return None
    schema = pa.schema(target)
    out = []
    for b in batches:
        if b.schema != schema:
            b = pa.RecordBatch.from_arrays([col if col.type == f.type else col.cast(f.type)
                                            for col, f in zip(b.columns, schema)], schema=schema)
        out.append(b)
    return schema, out


def read_table(dsn: str, table: str | tuple[str, str], *, workers: int = 1, snapshot: str | None = None,
               columns: Sequence[str] | None = None, types: str = "typed", where: str | None = None,
               numeric: str = "decimal", on_unrepresentable: str = "text",
               column_types: Mapping[str, str] | None = None, type_catalog: Any = "auto",
               batch_rows: int | None = None, batch_bytes: int | None = None,
               connect_kwargs: Mapping[str, Any] | None = None,
               progress: Callable[[ReadProgress], None] | None = None) -> pa.Table:
    """Every row of `table` ("schema.table", PostgreSQL's name syntax, or a (schema, name) pair) as a pyarrow Table.

    * `workers`: connections reading at once (block ranges of large tables and partitions spread over them); they
      all see one snapshot.
    * `snapshot`: an exported snapshot name (``pg_export_snapshot()``, or a replication slot created with
      ``EXPORT_SNAPSHOT``) every connection reads under; without it the read is consistent on its own (one
      connection's transaction, or a snapshot exported from the first connection for the others).
    * `columns`: the columns to read, in that order (default: every column but generated ones).
    * `types`, `numeric`, `on_unrepresentable`, `column_types`, `type_catalog`: as for `spockwire.Decoder`; a
      column comes out with the Arrow type and values the stream decoder gives it for binary values.
    * `where`: an SQL condition (trusted text) the rows must meet.
    * `progress`: called with a `ReadProgress` after every batch and at the end.

    When a typed column meets a valid value its Arrow type cannot hold, the table is read again (same snapshot)
    with that column as PostgreSQL's text, so the whole table has one schema.
    """
    with TableReader(dsn, table, workers=workers, snapshot=snapshot, columns=columns, types=types, where=where,
                     numeric=numeric, on_unrepresentable=on_unrepresentable, column_types=column_types,
                     type_catalog=type_catalog, batch_rows=batch_rows, batch_bytes=batch_bytes,
                     connect_kwargs=connect_kwargs, progress=progress) as reader:
        extra: dict[str, str] = {}
        while True:
            batches = list(reader.batches(extra))
            unified = _unify(reader, batches)
            if unified is not None:
                schema, batches = unified
                return pa.Table.from_batches(batches, schema=schema)
            first = batches[0].schema
            prefix = f"{reader.relation.namespace}.{reader.relation.name}."
            before = len(extra)
            for b in batches:
                for i, f in enumerate(b.schema):
                    if f.type != first.field(i).type and f.type == pa.string():
                        extra[prefix + f.name] = "text"
                    elif f.type != first.field(i).type and first.field(i).type == pa.string():
                        extra[prefix + first.field(i).name] = "text"
            if len(extra) == before:
                raise SnapshotReadError(f"the batches of {reader.table} do not share one schema")
