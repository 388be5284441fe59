"""The ingest worker's Parquet staging (docs/staging.md) as a batch or streaming Spark DataFrame.

    df = spockwire.spark.read_staging(spark, "/data/staging", "public.orders")            # batch
    sdf = spockwire.spark.read_staging_stream(spark, "/data/staging", "public.orders")    # streaming

Both go through the ``spockwire_staging`` data source. Only files named by the staging log are read (a file a
crash left behind is never data). Each Parquet file is one Spark partition, read with pyarrow and converted to
the same Spark types as the live ``spockwire`` source (``_commit_lsn`` as LongType, not Spark's DECIMAL(20,0)
for unsigned INT64): a stored interval is first restored to the decoder's month_day_nano_interval, then
converted like the live source's (struct<months, days, nanoseconds>). Truncates of the table, which live in the log, come out as rows with ``_change_type`` =
``truncate`` so that :func:`spockwire.spark.apply_changes` can replay them.

Streaming offsets are staging commit numbers (``{"commit": n}``); option ``maxCommitsPerBatch`` bounds a
micro-batch. The schema is fixed when the query starts: the union of the table's schema versions then (by
column name); columns added by later versions are not read until the query is restarted.
"""
from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from ..ingest.stored_types import restore_batch, restore_schema
from . import schema as S

try:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadMaxFiles = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

__all__ = ["StagingDataSource", "read_staging", "read_staging_stream"]


def _state(path: str) -> Any:
    from ..ingest.staging import StagingState

    return StagingState.load(path)


def read_staging(spark: Any, path: str, table: str) -> Any:
    """The staged changes of `table` (``namespace.name``) as a DataFrame (a batch read of the whole log)."""
    spark.dataSource.register(StagingDataSource)
    return spark.read.format("spockwire_staging").option("path", str(path)).option("table", table).load()


def read_staging_stream(spark: Any, path: str, table: str, **options: Any) -> Any:
    """The staged changes of `table` as a streaming DataFrame; one micro-batch per new staging commit(s)."""
    spark.dataSource.register(StagingDataSource)
    reader = spark.readStream.format("spockwire_staging").option("path", str(path)).option("table", table)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


class StagedPart(InputPartition):
    """Files (relative paths) and truncates of one table to read."""

    def __init__(self, files: Sequence[str], truncates: Sequence[dict]) -> None:
        super().__init__((tuple(files), tuple(truncates)))
        self.files = tuple(files)
        self.truncates = tuple(truncates)


def _merged(old: pa.Field, new: pa.Field) -> pa.Field:
    """One field for a column two schema versions typed differently: the type both fit in as `read_staging`
    unifies them (null -> any, string -> binary, int32 -> int64, ...), else the newer one."""
    if old.type == new.type:
        return new
    try:
        return pa.unify_schemas([pa.schema([old]), pa.schema([new])], promote_options="permissive").field(0)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return new


def _arrow_schema(out: str, state: Any, table: str) -> pa.Schema:
    """The union (by column name) of the table's staged file schemas: types the versions share are unified as
    `read_staging` does (an all-NULL column staged as string next to binary values is binary); where they cannot
    be, the newest type wins."""
    fields: dict[str, pa.Field] = {}
    seen_versions = set()
    for f in state.files.get(table, ()):
        if f.schema_version in seen_versions:
            continue
        seen_versions.add(f.schema_version)
        schema = restore_schema(pq.read_schema(os.path.join(out, f.path)))
        for field in schema:
            fields[field.name] = _merged(fields[field.name], field) if field.name in fields else field
    if not fields:
        raise ValueError(f"no staged rows of {table!r} in {out}: the schema is not known yet")
    ordered = [fields[c] for c in S.CHANGE_COLUMNS] + [fld for n, fld in fields.items()
                                                       if n not in S.CHANGE_COLUMNS]
    return pa.schema(ordered)


def _keys(state: Any, table: str) -> list[str]:
    versions = state.schemas.get(table) or []
    if not versions:
        return []
    return [c[0] for c in versions[-1].columns if c[3]]


def _truncate_batch(t: dict, target: pa.Schema) -> pa.RecordBatch:
    import datetime as _dt

    ts = _dt.datetime.fromisoformat(t["commit_ts"]) if t.get("commit_ts") else None
    values = {"_change_type": "truncate", "_commit_lsn": int(t["commit_lsn"]), "_commit_ts": ts,
              "_xid": int(t.get("xid") or 0), "_seq": int(t["seq"]), "_origin": t.get("origin")}
    arrays = [pa.array([values.get(f.name)], f.type) if f.name in values else pa.nulls(1, f.type) for f in target]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _read_part(out: str, part: StagedPart, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    for rel in part.files:
        pf = pq.ParquetFile(os.path.join(out, rel))
        for batch in pf.iter_batches():
            yield S.conform_batch(restore_batch(batch), target)
    for t in part.truncates:
        yield _truncate_batch(t, target)


def _table_truncates(state: Any, table: str, commits: range | None = None) -> list[dict]:
    found = []
    for entry in state.entries:
        if commits is not None and int(entry["commit"]) not in commits:
            continue
        for t in entry.get("truncates", ()):
            if table in t["tables"]:
                found.append(t)
    return found


class StagingDataSource(DataSource):
    """``format("spockwire_staging")``, options ``path`` and ``table``."""

    @classmethod
    def name(cls) -> str:
        return "spockwire_staging"

    def _args(self) -> tuple[str, str]:
        opts = {str(k).lower(): v for k, v in dict(self.options).items()}
        if not opts.get("path") or not opts.get("table"):
            raise ValueError("the spockwire_staging data source needs the options path and table")
        return str(opts["path"]), str(opts["table"])

    def schema(self) -> Any:
        out, table = self._args()
        state = _state(out)
        arrow = _arrow_schema(out, state, table)
        from pyspark.sql import types as T

        return T.StructType(S.spark_fields(arrow, _keys(state, table)))

    def reader(self, schema: Any) -> "StagingBatchReader":
        return StagingBatchReader(*self._args(), schema)

    def streamReader(self, schema: Any) -> "StagingStreamReader":
        opts = {str(k).lower(): v for k, v in dict(self.options).items()}
        limit = opts.get("maxcommitsperbatch")
        return StagingStreamReader(*self._args(), schema, int(limit) if limit else None)


class StagingBatchReader(DataSourceReader):
    def __init__(self, out: str, table: str, schema: Any) -> None:
        self.out, self.table = out, table
        self.target = S.target_arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        state = _state(self.out)
        parts: list[InputPartition] = [StagedPart([f.path], []) for f in state.files.get(self.table, ())]
        truncates = _table_truncates(state, self.table)
        if truncates or not parts:
            parts.append(StagedPart([], truncates))
        return parts

    def read(self, partition: StagedPart) -> Iterator[pa.RecordBatch]:
        yield from _read_part(self.out, partition, self.target)


class StagingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, out: str, table: str, schema: Any, max_commits: int | None) -> None:
        self.out, self.table = out, table
        self.target = S.target_arrow_schema(schema)
        self.max_commits = max_commits
        self._until: int | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = _state(self.out).commit

    def initialOffset(self) -> dict:
        return {"commit": 0}

    def getDefaultReadLimit(self) -> Any:
        if self.max_commits and ReadMaxFiles is not None:
            return ReadMaxFiles(self.max_commits)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        newest = _state(self.out).commit
        if self._until is not None:
            newest = min(newest, self._until)
        if start is not None and ReadMaxFiles is not None and isinstance(limit, ReadMaxFiles):
            newest = min(newest, int(start["commit"]) + max(1, limit.max_files))
        return {"commit": newest}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = int(start["commit"]), int(end["commit"])
        if hi <= lo:
            return []
        state = _state(self.out)
        commits = range(lo + 1, hi + 1)
        parts: list[InputPartition] = [StagedPart([f.path], []) for f in state.files.get(self.table, ())
                                       if f.commit in commits]
        truncates = _table_truncates(state, self.table, commits)
        if truncates:
            parts.append(StagedPart([], truncates))
        return parts

    def read(self, partition: StagedPart) -> Iterator[pa.RecordBatch]:
        yield from _read_part(self.out, partition, self.target)

    def commit(self, end: dict) -> None:
        """Nothing to release: the staging folder belongs to the ingest worker."""
