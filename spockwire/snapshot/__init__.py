"""Whole tables into Arrow: binary COPY under one snapshot, over several connections.

`read_table()` / `iter_table_batches()` plan the read (partitions, block ranges), open the connections that share
the snapshot and feed the COPY data to `CopyBinaryDecoder` (spockwire.wire), the same value kernels as the
replication stream's binary values. See docs/snapshot.md.
"""
from __future__ import annotations

from .reader import ReadProgress, SnapshotReadError, TableChunk, TableReader, iter_table_batches, read_table

__all__ = ["read_table", "iter_table_batches", "TableReader", "ReadProgress", "TableChunk", "SnapshotReadError"]
