"""The rows of Delta data files kept in memory between micro-batches, and Delta tables kept open.

A Delta data file never changes once written: a commit adds new files and removes old ones from the table, it never
rewrites one in place. So the rows of a file, once held, are its rows for good, and a later batch that needs the
file whole (to find the stored rows of its keys, then to rewrite the file without them: delta_rewrite.py) can take
them from memory instead of reading and decoding the file again. The files kept are the ones this process wrote
(their rows are at hand when they are written) and the ones it read whole; a file the process's own commit removed
is dropped at once, the rest least recently used first beyond ``SPOCKWIRE_FILE_ROWS_MB`` (default 256 MB of Arrow
buffers; 0 keeps none). A pipeline job streaming into the same tables thus reads each table's files from disk once,
at its first batch.

The same holds for a table's log up to the version last seen: :func:`open_table` keeps each table's
``DeltaTable`` and brings it up to date (``update_incremental``: the log's newer commits only) instead of loading
the log again from its last checkpoint. A table whose first log entry changed since (deleted and created again at
the same path) is opened afresh.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa

__all__ = ["FileRows", "file_rows", "keep_table", "open_table"]

#: Arrow bytes of file rows kept, unless SPOCKWIRE_FILE_ROWS_MB says otherwise
DEFAULT_MB = 256


class FileRows:
    """Data files' rows by absolute path, least recently used dropped first beyond `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rows: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, path: str) -> pa.Table | None:
        with self._lock:
            rows = self._rows.get(path)
            if rows is None:
                self.misses += 1
                return None
            self._rows.move_to_end(path)
            self.hits += 1
            return rows

    def put(self, path: str, rows: pa.Table) -> None:
        size = rows.nbytes
        if size > self.limit:
            return
        with self._lock:
            old = self._rows.pop(path, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._rows[path] = rows
            self._bytes += size
            while self._bytes > self.limit:
                _path, dropped = self._rows.popitem(last=False)
                self._bytes -= dropped.nbytes

    def drop(self, paths: Any) -> None:
        with self._lock:
            for path in paths:
                old = self._rows.pop(path, None)
                if old is not None:
                    self._bytes -= old.nbytes

    @property
    def bytes(self) -> int:
        return self._bytes


_FILE_ROWS: FileRows | None = None
_TABLES: dict[str, tuple[Any, tuple]] = {}
_TABLES_LOCK = threading.Lock()


def file_rows() -> FileRows | None:
    """This process's file rows (None when SPOCKWIRE_FILE_ROWS_MB is 0)."""
    global _FILE_ROWS
    limit = int(float(os.environ.get("SPOCKWIRE_FILE_ROWS_MB", DEFAULT_MB)) * (1 << 20))
    if limit <= 0:
        return None
    if _FILE_ROWS is None or _FILE_ROWS.limit != limit:
        _FILE_ROWS = FileRows(limit)
    return _FILE_ROWS


def _first_entry(path: str) -> tuple | None:
    try:
        st = os.stat(os.path.join(path, "_delta_log", "00000000000000000000.json"))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def open_table(path: str, open_new: Any) -> Any:
    """The Delta table at the local `path`, up to date: the one handed back last (:func:`keep_table`), brought up
    to date, while its first log entry is the same file; else `open_new(path)` (None: there is no table). The
    table is the caller's alone until it hands it back: two writers of one table never share one."""
    local = path[len("file://"):] if path.startswith("file://") else path
    if "://" in local:
        return open_new(path)
    first = _first_entry(local)
    with _TABLES_LOCK:
        kept = _TABLES.pop(path, None)
    if kept is not None and first is not None and kept[1] == first:
        try:
            kept[0].update_incremental()
            return kept[0]
        except Exception:  # noqa: BLE001 - the log could not be read on from there: opened afresh below
            pass
    return open_new(path)


def keep_table(path: str, dt: Any) -> None:
    """Hand `dt` (from :func:`open_table`, used without error) back for the next batch of its table."""
    local = path[len("file://"):] if path.startswith("file://") else path
    first = _first_entry(local) if dt is not None and "://" not in local else None
    if first is not None:
        with _TABLES_LOCK:
            _TABLES[path] = (dt, first)
