"""Micro-batches handed over as Arrow files: the ``spockwire`` source's ``stagingPath`` option.

Moving rows through Spark's JVM costs about 2-3 CPU seconds per million change rows (the Python source's Arrow
batches become JVM rows, and become Arrow again on their way to the driver) -- more than decoding them. With
``stagingPath`` set, each task of a micro-batch writes the changes it decoded as Arrow IPC files, one per table,
in that folder, and the micro-batch's DataFrame holds one row per file (:data:`MANIFEST_SCHEMA`): the table, the
file, its row count, its snapshot rows, its last commit LSN, whether later micro-batches read more of the same
snapshot. The reader of the DataFrame (the pipeline job,
:mod:`spockwire.spark.job`) opens the files (memory-mapped) and deletes them once the batch is applied.

A file holds one table's changes in the flat layout of :func:`spockwire.spark.apply.select_table`: the change
columns and the table's columns, with the Arrow types Spark's own schema gives them (so a Delta table written from
files has the schema it would have from the DataFrame). File names are derived from the task's partition, and
written under a temporary name then renamed: a retried task writes the same file again. On a cluster the folder
must be on storage the executors and the driver share (as the checkpoint is): any URI pyarrow's file systems open.
A manifest row also names the host of the task that wrote the file; the reader checks that every file is there
with the rows its task wrote (:func:`check_files`, :func:`read_files`) and raises :class:`BatchFileError`
otherwise -- a folder on an executor's local disk fails the micro-batch, it never loses its changes.
"""
from __future__ import annotations

import socket
import uuid
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs

from ..errors import SpockwireError
from ..export.arrow import change_type_scalar, python_column
from . import schema as S
from .manifest import MANIFEST_SCHEMA

__all__ = ["MANIFEST_SCHEMA", "MANIFEST_ARROW", "BatchFileError", "write_files", "read_files", "check_files",
           "delete_files", "clear", "table_schema", "partition_name"]

_INSERT = change_type_scalar("insert")

#: the DataFrame of a micro-batch in ``stagingPath`` mode (MANIFEST_SCHEMA, in Arrow): one row per Arrow file
MANIFEST_ARROW = pa.schema([("_table", pa.string()), ("path", pa.string()), ("rows", pa.int64()),
                            ("snapshot_rows", pa.int64()), ("last_lsn", pa.int64()), ("host", pa.string()),
                            ("snapshot_more", pa.bool_())])


class BatchFileError(SpockwireError):
    """A micro-batch's Arrow file is not what its task wrote: missing where the reader looks (the staging folder is
    not shared by the driver and the executors), or holding another number of rows."""


def _fs(path: str) -> tuple[Any, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


def table_schema(target: pa.Schema, table: str, multi: bool) -> pa.Schema:
    """The flat Arrow schema of one table's file: the change columns and the table's columns, typed as in the
    query's schema `target`."""
    heads = [target.field(c) for c in S.CHANGE_COLUMNS]
    if multi:
        return pa.schema(heads + list(target.field(S.table_struct_name(table)).type))
    return pa.schema(heads + [f for f in target if f.name not in S.CHANGE_COLUMNS])


def file_schema(target: pa.Schema, batch: pa.Schema) -> pa.Schema:
    """The Arrow schema of a file holding decoder batches of schema `batch`: the change columns as in the query's
    schema `target`, then the batch's own columns in the Arrow types Spark gives their decoder types, with the
    batch's metadata (its column description). The file follows the table as the stream describes it at that
    point, so a column added, renamed, dropped or retyped upstream reaches the driver as it is
    (spockwire.spark.schema_changes), whatever the query's schema said when it started."""
    from pyspark.sql import types as T

    values = pa.schema([f for f in batch if f.name not in S.CHANGE_COLUMNS])
    typed = S.target_arrow_schema(T.StructType(S.spark_fields(values))) if len(values) else pa.schema([])
    heads = [target.field(c) for c in S.CHANGE_COLUMNS]
    return pa.schema(heads + list(typed), metadata=batch.metadata)


def _shape(schema: pa.Schema) -> tuple:
    meta = schema.metadata or {}
    return tuple((f.name, str(f.type)) for f in schema), meta.get(S.COLUMNS_METADATA), meta.get(S.DDL_METADATA)


def write_files(staging: str, name: str, batches: Iterator[tuple[str, pa.RecordBatch]], target: pa.Schema,
                multi: bool, snapshot_more: bool = False) -> Iterator[pa.RecordBatch]:
    """Write a task's (table, decoder batch) pairs as one Arrow file per table, ``<staging>/<name>.<n>.arrow``;
    yield the manifest (one row per file). `snapshot_more`: the task reads part of a snapshot that later
    micro-batches go on reading."""
    fs, root = _fs(staging)
    fs.create_dir(root, recursive=True)
    # one file per table and shape: a table described again with other columns (or a column switched to text)
    # starts a new file, so the driver sees each shape where the stream changed it (a truncate, which has no
    # columns of the table, goes into the table's open file)
    open_: dict[tuple, tuple[Any, Any, str, str, list[int]]] = {}
    schemas: dict[tuple, pa.Schema] = {}
    current: dict[str, tuple] = {}
    try:
        for table, batch in batches:
            shape = _shape(batch.schema)
            key = current.get(table)
            if key is None or key[1][2] is not None or shape[2] is not None or \
                    (shape != key[1] and batch.num_columns > len(S.CHANGE_COLUMNS)):
                # (a captured DDL statement has a file of its own, and the next batch a new one)
                key = current[table] = (table, shape, len(open_))
                if (table, shape) not in schemas:     # a truncate's file: the table as the query started
                    known = not multi or S.table_struct_name(table) in target.names
                    schemas[(table, shape)] = table_schema(target, table, multi) \
                        if known and batch.num_columns == len(S.CHANGE_COLUMNS) and shape[2] is None \
                        else file_schema(target, batch.schema)
                final = f"{root.rstrip('/')}/{name}.{len(open_)}.arrow"
                tmp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
                sink = fs.open_output_stream(tmp)
                open_[key] = (sink, pa.ipc.new_stream(sink, schemas[(table, shape)]), tmp, final, [0, 0, -1])
            _sink, writer, _tmp, _final, counts = open_[key]
            out = S.conform_batch(batch, schemas[(key[0], key[1])])
            writer.write_batch(out)
            counts[0] += out.num_rows
            kinds, xids = out.column(0), out.column(3)
            counts[1] += pc.sum(pc.and_(pc.equal(kinds, _INSERT), pc.is_null(xids))).as_py() or 0
            last = pc.max(out.column(1)).as_py()
            if last is not None:
                counts[2] = max(counts[2], last)
    finally:
        for sink, writer, _tmp, _final, _counts in open_.values():
            writer.close()
            sink.close()
    rows = []
    for (table, _shape_, _n), (_sink, _writer, tmp, final, counts) in open_.items():
        fs.move(tmp, final)
        rows.append((table, final if "://" not in staging else f"{staging.split('://', 1)[0]}://{final}",
                     counts[0], counts[1], counts[2] if counts[2] >= 0 else None, socket.gethostname(), snapshot_more))
    if rows:
        yield pa.RecordBatch.from_arrays([python_column([r[i] for r in rows], f.type)
                                          for i, f in enumerate(MANIFEST_ARROW)], schema=MANIFEST_ARROW)


def _not_shared(path: str, host: str | None) -> str:
    folder = path.rsplit("/", 1)[0]
    return (f"the micro-batch file {path}, written by a task on {host or 'an executor'}, is not there for its reader "
            f"on {socket.gethostname()}: the staging folder {folder} (the pipeline job's <checkpoint>/spockwire-"
            "batches) must be on storage the driver and every executor share (HDFS, S3, ABFS, GCS, NFS, ...), as the "
            "checkpoint must be")


def check_files(manifest: pa.Table) -> None:
    """Every file a micro-batch's manifest names is there for this process (the driver); :class:`BatchFileError`
    names the first one that is not, and the host that wrote it."""
    for row in manifest.select(["path", "host"]).to_pylist():
        fs, p = _fs(row["path"])
        if fs.get_file_info(p).type != pafs.FileType.File:
            raise BatchFileError(_not_shared(row["path"], row["host"]))


def read_files(paths: Sequence[str], rows: Sequence[int] | None = None) -> pa.Table | None:
    """The rows of one table's files (memory-mapped when local), as one Arrow table; None for no file. `rows`: the
    row count of each file in its manifest row (a file holding another count is a :class:`BatchFileError`)."""
    tables = []
    for i, path in enumerate(paths):
        fs, p = _fs(path)
        try:
            source = pa.memory_map(p) if isinstance(fs, pafs.LocalFileSystem) else fs.open_input_stream(p)
        except FileNotFoundError:
            raise BatchFileError(_not_shared(path, None)) from None
        tables.append(pa.ipc.open_stream(source).read_all())
        if rows is not None and tables[-1].num_rows != rows[i]:
            raise BatchFileError(f"the micro-batch file {path} holds {tables[-1].num_rows} rows, its task wrote "
                                 f"{rows[i]}: another process wrote a file of that name in the staging folder")
    if not tables:
        return None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def delete_files(paths: Sequence[str]) -> None:
    for path in paths:
        fs, p = _fs(path)
        try:
            fs.delete_file(p)
        except FileNotFoundError:
            pass


def clear(staging: str) -> None:
    """Remove what an earlier run left in the staging folder (no micro-batch is in flight when a query starts)."""
    fs, root = _fs(staging)
    try:
        fs.delete_dir_contents(root, missing_dir_ok=True)
    except FileNotFoundError:
        pass


def partition_name(partition: Any) -> str:
    """A file name stem for a task: its LSN range, or its snapshot and chunk."""
    if hasattr(partition, "snapshot"):
        return f"snapshot-{partition.snapshot.replace('/', '_')}-{partition.index}"
    return f"range-{partition.start:016x}-{partition.end:016x}"
