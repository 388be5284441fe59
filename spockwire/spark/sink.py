"""``format("spockwire_apply")``: a streaming sink applying each micro-batch of changes with `apply_changes`.

Where a ``foreachBatch`` function cannot be given -- a Declarative Pipelines sink (``dp.create_sink``), a plain
``writeStream.format(...)`` -- this Python data source writer does what the pipeline job's ``foreachBatch`` does:

    spockwire.spark.register(spark)
    (changes.writeStream.format("spockwire_apply").option("path", "/lake/orders").option("keys", "id")
     .option("checkpointLocation", "/lake/_ck/orders").start())

Each task writes its rows of the micro-batch as an Arrow file (``<path>/_spockwire_incoming``); the commit, on the
driver, reads the batch's files, applies them with :func:`spockwire.spark.apply_changes` (Delta through delta-rs)
and deletes them. A multi-table change DataFrame (the ``tables`` option of the source) is applied to one table per
source table, ``<path>/<schema>.<table>`` (as the pipeline job does). Exactly-once as with ``foreachBatch``:
Spark replays an uncommitted micro-batch after a failure, and applying the same changes again leaves the tables as
they are.

Options: ``path`` (required), ``keys`` (the key columns, comma-separated; for several tables
``keys.<schema>.<table>``; default: the replica-identity columns the source marks), ``scdType`` (1, default, or
2), ``history`` (true: also an SCD 2 table ``<table>_history`` beside the SCD 1 one).
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from . import schema as S

__all__ = ["ApplySink", "INCOMING_DIR"]

#: where the tasks leave a micro-batch's rows for the commit (inside the target folder)
INCOMING_DIR = "_spockwire_incoming"


class _Files(WriterCommitMessage):
    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)


def _options(options: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


class ApplySink(DataSource):
    """``writeStream.format("spockwire_apply")``: each micro-batch applied with `apply_changes` (see the module)."""

    @classmethod
    def name(cls) -> str:
        return "spockwire_apply"

    def streamWriter(self, schema: Any, overwrite: bool) -> "_ApplyWriter":
        opts = _options(self.options)
        if not opts.get("path"):
            raise ValueError("the spockwire_apply sink needs the option path (a folder of Delta tables, or one table)")
        return _ApplyWriter(opts, [f.name for f in schema.fields])


class _ApplyWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: dict[str, str], columns: Sequence[str]) -> None:
        self.path = opts["path"]
        self.opts = opts
        self.multi = S.TABLE_COLUMN in columns
        self.scd = int(opts.get("scdtype", "1"))
        self.history = opts.get("history", "false").lower() in ("1", "true", "yes", "on")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Files:
        folder = os.path.join(self.path, INCOMING_DIR)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{uuid.uuid4().hex}.arrow")
        writer = None
        try:
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_file(path + ".tmp", batch.schema)
                writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return _Files([])
        os.replace(path + ".tmp", path)
        return _Files([path])

    def _keys(self, table: str | None) -> list[str] | None:
        value = self.opts.get(f"keys.{table}") if table else self.opts.get("keys")
        return [k.strip() for k in value.split(",") if k.strip()] if value else None

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from .apply import apply_changes, select_table_arrow, target_path

        paths = [p for m in messages if isinstance(m, _Files) for p in m.paths]
        tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]
        tables = [t for t in tables if t.num_rows]
        if tables:
            changes = pa.concat_tables(tables)
            if self.multi:
                for table in sorted(set(changes.column(S.TABLE_COLUMN).drop_null().to_pylist())):
                    self._apply(apply_changes, select_table_arrow(changes, table), table,
                                lambda h, t=table: target_path(self.path, t, h))
            else:
                self._apply(apply_changes, changes, None,
                            lambda h: self.path.rstrip("/") + ("_history" if h else ""))
        for p in paths:
            os.remove(p)

    def _apply(self, apply_changes: Any, changes: pa.Table, table: str | None, where: Any) -> None:
        runs = [(False, 1), (True, 2)] if self.history else [(False, self.scd)]
        for history, scd in runs:
            apply_changes(changes, where(history), format="delta", engine="delta-rs", keys=self._keys(table),
                          stored_as_scd_type=scd)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for m in messages:
            for p in (m.paths if isinstance(m, _Files) else ()):
                if os.path.exists(p):
                    os.remove(p)
