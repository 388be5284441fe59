"""The rows of a micro-batch's DataFrame when its tasks write their changes as Arrow files (the source's option
stagingPath; batch_files.py writes and reads the files): one row per file."""
from __future__ import annotations

__all__ = ["MANIFEST_SCHEMA"]

#: the manifest rows, as Spark's DDL: the table, the file's path, its rows, how many of them come from a snapshot,
#: the last commit LSN in it, the host that wrote it, and whether later micro-batches read more of the same snapshot
MANIFEST_SCHEMA = ("_table string, path string, rows long, snapshot_rows long, last_lsn long, host string, "
                   "snapshot_more boolean")
