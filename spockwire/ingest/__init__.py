"""Sinks that make decoded changes durable: the Parquet staging layout written by `ingest` and `decode`.

    from spockwire.ingest import StagingWriter, read_staging

    with StagingWriter("out", protocol="pgoutput") as staging:
        staging.add_all(decoder.drain())
        entry = staging.commit(decoder.committed_lsn)   # durable; acknowledge entry["committed_lsn"]

The layout, the log entry schema, the crash semantics and the deduplication rule are described in docs/staging.md.
"""
from __future__ import annotations

from .source import StagingSource, read_source
from .staging import (
    FORMAT_VERSION,
    SchemaVersion,
    StagedFile,
    StagingError,
    StagingState,
    StagingWriter,
    list_tables,
    read_log,
    read_messages,
    read_staging,
    table_folder_name,
)

__all__ = [
    "FORMAT_VERSION", "SchemaVersion", "StagedFile", "StagingError", "StagingState", "StagingWriter",
    "list_tables", "read_log", "read_messages", "read_staging", "table_folder_name", "StagingSource", "read_source",
]
