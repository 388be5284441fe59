"""The staging log and what it says: the folder's names, the log entries, the state they describe, the writer lock.

Layout (docs/staging.md):

```
OUT/
  _spockwire/lock                                  held (flock) by the one writer of OUT
  _spockwire/log/00000000000000000001.json         one entry per staging commit (tmp + fsync + rename + fsync dir)
  _spockwire/messages/part-<first>-<last>-<commit>.parquet     logical messages
  <namespace>.<table>/v<schema version>/part-<first_commit_lsn:016X>-<last_commit_lsn:016X>-<commit:08d>[-<n>].parquet
```

A Parquet file exists for readers only once a log entry names it. `StagingState.open` reads the log, removes crash
leftovers and gives the resume point, the recorded source and the per-table high-water marks a restarted writer
uses to drop re-delivered changes. The writer is staging.py, the readers staging_read.py.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import pyarrow as pa

from ..errors import SpockwireError
from ..model import SNAPSHOT_SEQ_BASE
from .source import StagingSource

__all__ = [
    "FORMAT_VERSION", "StagingError", "StagedFile", "SchemaVersion", "StagingState", "read_log", "table_folder_name",
    "MESSAGES_SCHEMA", "part_name", "log_name", "format_lsn",
]

#: Version of the log entry format ("format" in every entry). Readers refuse entries with a higher number.
FORMAT_VERSION = 1

META_DIR = "_spockwire"
LOG_DIR = f"{META_DIR}/log"
MESSAGES_DIR = f"{META_DIR}/messages"
LOCK_FILE = f"{META_DIR}/lock"

_LOG_NAME = re.compile(r"^(\d{20})\.json$")
_PART_NAME = re.compile(r"^part-[0-9A-F]{16}-[0-9A-F]{16}-\d{8,}(-[1-9]\d*)?\.parquet$")
_TMP_NAME = re.compile(r"^\..+\.tmp$")
_VERSION_DIR = re.compile(r"^v[1-9]\d*$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$-")

_TS = pa.timestamp("us", tz="UTC")

#: The columns of the logical-message Parquet files under _spockwire/messages/.
MESSAGES_SCHEMA = pa.schema([
    pa.field("prefix", pa.string(), nullable=False),
    pa.field("content", pa.binary(), nullable=False),
    pa.field("transactional", pa.bool_(), nullable=False),
    pa.field("lsn", pa.uint64(), nullable=False),
    pa.field("xid", pa.uint32()),
    pa.field("commit_lsn", pa.uint64()),
    pa.field("commit_ts", _TS),
    pa.field("seq", pa.int64()),
    pa.field("origin", pa.string()),
], metadata={b"spockwire.table": b"_spockwire.messages"})

PathLike = Union[str, "os.PathLike[str]"]


class StagingError(SpockwireError):
    """Staging could not read or write its folder (unwritable folder, disk full, a damaged or foreign log).

    When raised by `StagingWriter.commit`, nothing of that commit is visible: the log still ends at the previous
    entry, the files written for it were removed, and the buffered events are kept so the commit can be retried.
    """


# ---------------------------------------------------------------------------------------------------- naming

def _encode_part(text: str, *, leading: bool) -> str:
    out = []
    for i, byte in enumerate(text.encode("utf-8", "surrogateescape")):
        if byte in _SAFE and not (leading and i == 0 and byte == 0x5F):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def table_folder_name(namespace: str, name: str) -> str:
    """The folder of a table: ``<namespace>.<table>``, each part percent-encoded.

    Bytes of the UTF-8 name outside ``A-Z a-z 0-9 _ $ -`` become ``%XX`` (upper-case hex), so ``.`` and ``/``
    inside a name cannot be confused with the separator, and a leading ``_`` becomes ``%5F`` (Spark and Hadoop
    skip names starting with ``_`` or ``.``). ``public.orders`` stays ``public.orders``.
    """
    return f"{_encode_part(namespace, leading=True)}.{_encode_part(name, leading=False)}"


def part_name(first_lsn: int, last_lsn: int, commit: int, part: int | None = None) -> str:
    """A part file's name; `part` numbers (from 1) the files one commit writes for one table schema version when
    it writes several."""
    suffix = "" if part is None else f"-{part}"
    return f"part-{first_lsn:016X}-{last_lsn:016X}-{commit:08d}{suffix}.parquet"


def log_name(commit: int) -> str:
    return f"{commit:020d}.json"


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# ---------------------------------------------------------------------------------------------------- value objects

@dataclass(frozen=True)
class SchemaVersion:
    """One schema version of a staged table: the folder ``v<schema_version>`` holds files of exactly this schema.

    A new version starts when the relation id, its description (column names, type OIDs, type modifiers, key
    flags, replica identity) or the Arrow type of a column changes. `columns` holds
    ``(name, type_oid, type_modifier, is_key, arrow_type)`` per column.
    """

    table: str
    namespace: str
    name: str
    relid: int
    schema_version: int
    replica_identity: str | None
    columns: tuple[tuple[str, int | None, int | None, bool, str], ...]

    @property
    def identity(self) -> tuple:
        return (self.relid, self.namespace, self.name, self.replica_identity, self.columns)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table, "namespace": self.namespace, "name": self.name, "relid": self.relid,
            "schema_version": self.schema_version, "replica_identity": self.replica_identity,
            "columns": [{"name": n, "type_oid": t, "type_modifier": m, "is_key": k, "arrow_type": a}
                        for n, t, m, k, a in self.columns],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "SchemaVersion":
        cols = tuple((c["name"], c.get("type_oid"), c.get("type_modifier"), bool(c.get("is_key")),
                      c.get("arrow_type", "")) for c in obj["columns"])
        return cls(obj["table"], obj["namespace"], obj["name"], int(obj["relid"]), int(obj["schema_version"]),
                   obj.get("replica_identity"), cols)


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file named by a log entry (`path` is relative to the staging folder, with ``/``)."""

    path: str
    table: str
    relid: int
    schema_version: int
    first_commit_lsn: int
    last_commit_lsn: int
    first_seq: int
    last_seq: int
    rows: int
    bytes: int
    commit: int

    @classmethod
    def from_json(cls, obj: dict[str, Any], commit: int) -> "StagedFile":
        return cls(obj["path"], obj["table"], int(obj["relid"]), int(obj["schema_version"]),
                   int(obj["first_commit_lsn"]), int(obj["last_commit_lsn"]), int(obj["first_seq"]),
                   int(obj["last_seq"]), int(obj["rows"]), int(obj["bytes"]), commit)


# ---------------------------------------------------------------------------------------------------- the log

def _log_dir(out: Path) -> Path:
    return out / LOG_DIR


def _read_entries(out: Path) -> list[dict[str, Any]]:
    """The log entries of `out` in commit order, validated (contiguous numbers, known format)."""
    log_dir = _log_dir(out)
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StagingError(f"cannot read the staging log {log_dir}: {exc.strerror or exc}") from exc
    numbered = sorted((int(m.group(1)), n) for n in names if (m := _LOG_NAME.match(n)))
    entries = []
    for expected, (number, name) in enumerate(numbered, start=1):
        path = log_dir / name
        if number != expected:
            raise StagingError(f"staging log {log_dir} is damaged: commit {expected} is missing "
                               f"(next entry is {name})")
        try:
            entry = json.loads(path.read_bytes().decode("utf-8"))
        except OSError as exc:
            raise StagingError(f"cannot read staging log entry {path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StagingError(f"staging log entry {path} is not valid JSON: {exc}") from exc
        if not isinstance(entry, dict) or entry.get("commit") != number:
            raise StagingError(f"staging log entry {path} does not describe commit {number}")
        if int(entry.get("format", 1)) > FORMAT_VERSION:
            raise StagingError(f"staging log entry {path} has format {entry['format']}; this spockwire reads "
                               f"format {FORMAT_VERSION} and older")
        entries.append(entry)
    return entries


def read_log(out_dir: PathLike) -> list[dict[str, Any]]:
    """The log entries of a staging folder, oldest first ([] when there is no log yet). Read-only."""
    return _read_entries(Path(out_dir))


def _key_le(a: tuple[int, int], b: tuple[int, int] | None) -> bool:
    return b is not None and a <= b


def _max_key(a: tuple[int, int] | None, b: tuple[int, int]) -> tuple[int, int]:
    return b if a is None or b > a else a


@dataclass
class StagingState:
    """What a staging folder holds according to its log.

    `committed_lsn` is the resume point (0 for an empty folder): the slot may be acknowledged up to it, and the
    changes with a lower `_commit_lsn` are staged. `high_water` gives, per table, the highest staged
    (`_commit_lsn`, `_seq`) of its rows and truncates; `message_high_water` the same for transactional messages,
    `nontransactional_high_water` the highest LSN of a staged non-transactional message.
    """

    out_dir: Path
    entries: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, list[StagedFile]] = field(default_factory=dict)
    message_files: list[dict[str, Any]] = field(default_factory=list)
    truncates: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, list[SchemaVersion]] = field(default_factory=dict)
    high_water: dict[str, tuple[int, int]] = field(default_factory=dict)
    message_high_water: tuple[int, int] | None = None
    nontransactional_high_water: int | None = None
    committed_lsn: int = 0
    commit: int = 0
    timeline: int | None = None      # the server timeline of the last entry that recorded one
    protocol: str | None = None
    source: StagingSource | None = None
    snapshots: list[dict[str, Any]] = field(default_factory=list)   # the "snapshot" records, in commit order
    removed: list[Path] = field(default_factory=list)

    @property
    def resume_lsn(self) -> int:
        return self.committed_lsn

    @property
    def tables(self) -> list[str]:
        names = set(self.files) | set(self.schemas)
        for t in self.truncates:
            names.update(t["tables"])
        return sorted(names)

    def named_paths(self) -> set[str]:
        paths = {f.path for files in self.files.values() for f in files}
        paths.update(m["path"] for m in self.message_files)
        return paths

    # ------------------------------------------------------------------ building
    def _apply(self, entry: dict[str, Any]) -> None:
        number = int(entry["commit"])
        for rel in entry.get("relations", ()):
            sv = SchemaVersion.from_json(rel)
            self.schemas.setdefault(sv.table, []).append(sv)
        for obj in entry.get("files", ()):
            f = StagedFile.from_json(obj, number)
            self.files.setdefault(f.table, []).append(f)
            self.high_water[f.table] = _max_key(self.high_water.get(f.table), (f.last_commit_lsn, f.last_seq))
        for t in entry.get("truncates", ()):
            self.truncates.append(t)
            key = (int(t["commit_lsn"]), int(t["seq"]))
            for table in t["tables"]:
                self.high_water[table] = _max_key(self.high_water.get(table), key)
        for m in entry.get("messages", ()):
            self.message_files.append(m)
            if m.get("last_commit_lsn") is not None:
                key = (int(m["last_commit_lsn"]), int(m["last_seq"]))
                self.message_high_water = _max_key(self.message_high_water, key)
            if m.get("last_nontransactional_lsn") is not None:
                lsn = int(m["last_nontransactional_lsn"])
                if self.nontransactional_high_water is None or lsn > self.nontransactional_high_water:
                    self.nontransactional_high_water = lsn
        if entry.get("snapshot"):
            record = entry["snapshot"]
            self.snapshots.append(dict(record, commit=number))
            # a table's snapshot covers every change before its consistent point, also when it had no row
            point = int(record["consistent_point"])
            for table, rows in record.get("tables", {}).items():
                key = (point, SNAPSHOT_SEQ_BASE + max(int(rows), 1) - 1)
                self.high_water[table] = _max_key(self.high_water.get(table), key)
        self.committed_lsn = max(self.committed_lsn, int(entry["committed_lsn"]))
        if entry.get("timeline") is not None:
            self.timeline = int(entry["timeline"])
        self.commit = number
        self.protocol = entry.get("protocol", self.protocol)
        if entry.get("source"):
            try:
                self.source = StagingSource.from_json(entry["source"])
            except (KeyError, TypeError, ValueError) as exc:
                raise StagingError(f"staging log entry {number} has a damaged source record: {exc!r}") from None
        self.entries.append(entry)

    @classmethod
    def load(cls, out_dir: PathLike) -> "StagingState":
        """Read the log without touching the folder (what readers use)."""
        state = cls(Path(out_dir))
        for entry in _read_entries(state.out_dir):
            state._apply(entry)
        return state

    @classmethod
    def open(cls, out_dir: PathLike) -> "StagingState":
        """Read the log and remove crash leftovers: Parquet and tmp files that no log entry names.

        Takes the folder's writer lock while cleaning; a folder another writer holds is a StagingError.
        """
        out = Path(out_dir)
        if not (out / META_DIR).is_dir():
            return cls.load(out)
        lock = _Lock.acquire(out)
        try:
            return cls._open_locked(out)
        finally:
            lock.release()

    @classmethod
    def _open_locked(cls, out: Path) -> "StagingState":
        state = cls.load(out)
        state.removed = _remove_leftovers(out, state)
        return state


def _remove_leftovers(out: Path, state: StagingState) -> list[Path]:
    """Delete what a crashed commit left behind; only spockwire's own file name patterns are touched."""
    named = state.named_paths()
    removed: list[Path] = []

    def sweep(folder: Path, rel: str, parquet_too: bool) -> None:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StagingError(f"cannot list {folder}: {exc.strerror or exc}") from exc
        for name in names:
            path = folder / name
            if _TMP_NAME.match(name) or (parquet_too and _PART_NAME.match(name) and f"{rel}/{name}" not in named):
                try:
                    if path.is_file():
                        path.unlink()
                        removed.append(path)
                except OSError as exc:
                    raise StagingError(f"cannot remove the leftover {path}: {exc.strerror or exc}") from exc

    sweep(out / LOG_DIR, LOG_DIR, False)
    sweep(out / MESSAGES_DIR, MESSAGES_DIR, True)
    try:
        tops = sorted(os.listdir(out))
    except OSError as exc:
        raise StagingError(f"cannot list {out}: {exc.strerror or exc}") from exc
    for top in tops:
        if top.startswith((".", "_")) or "." not in top or not (out / top).is_dir():
            continue
        for sub in sorted(os.listdir(out / top)):
            if _VERSION_DIR.match(sub) and (out / top / sub).is_dir():
                sweep(out / top / sub, f"{top}/{sub}", True)
    if removed:
        for folder in {p.parent for p in removed}:
            _fsync_dir(folder)
    return removed


# ---------------------------------------------------------------------------------------------------- durable I/O

def _write_durable(path: Path, data: Any) -> None:
    """Create `path` with `data` and fsync it (raises OSError)."""
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        offset, size = 0, view.nbytes
        while offset < size:
            offset += os.write(fd, view[offset:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(out: Path, rel: str) -> Path:
    """Create out/rel (each new level fsynced into its parent); raises OSError."""
    folder = out
    for part in rel.split("/"):
        parent, folder = folder, folder / part
        if not folder.is_dir():
            try:
                os.mkdir(folder)
            except FileExistsError:
                if not folder.is_dir():
                    raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a folder", str(folder))
            _fsync_dir(parent)
    return folder


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"[Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


class _Lock:
    """An exclusive flock on OUT/_spockwire/lock: one writer (or cleaner) per staging folder."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, out: Path) -> "_Lock":
        path = out / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StagingError(f"cannot open the staging lock {path}: {_why(exc)}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StagingError(f"staging folder {out} is in use by another writer ({path} is locked)") from None
            raise StagingError(f"cannot lock {path}: {_why(exc)}") from exc
        return cls(fd, path)

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
