"""The Parquet staging layout: a folder of per-table Parquet files plus an append-only commit log.

```
OUT/
  _spockwire/lock                                  held (flock) by the one writer of OUT
  _spockwire/log/00000000000000000001.json         one entry per staging commit (tmp + fsync + rename + fsync dir)
  _spockwire/messages/part-<first>-<last>-<commit>.parquet     logical messages
  <namespace>.<table>/v<schema version>/part-<first_commit_lsn:016X>-<last_commit_lsn:016X>-<commit:08d>.parquet
```

A Parquet file exists for readers only once a log entry names it. `StagingWriter` buffers drained decoder events
per table and schema version; `commit(committed_lsn)` writes the files, makes them durable, then appends the log
entry that publishes them. `StagingState.open` reads the log, removes crash leftovers and gives the resume point
and the per-table high-water marks a restarted writer uses to drop re-delivered changes. `read_staging` and
`list_tables` read only what the log names, in log order. A writer given a `source` (source.py) records it in
every log entry and refuses a folder whose recorded source differs. Intervals, which Parquet cannot hold, are
stored as a marked struct and restored on read (stored_types.py). The full description is docs/staging.md.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import SpockwireError
from ..model import ChangeBatch, LogicalMessage, Relation, Truncate
from .source import StagingSource
from .stored_types import restore_table, store_batch

__all__ = [
    "FORMAT_VERSION", "StagingError", "StagedFile", "SchemaVersion", "StagingState", "StagingWriter",
    "read_log", "read_staging", "read_messages", "list_tables", "table_folder_name", "MESSAGES_SCHEMA",
]

#: Version of the log entry format ("format" in every entry). Readers refuse entries with a higher number.
FORMAT_VERSION = 1

META_DIR = "_spockwire"
LOG_DIR = f"{META_DIR}/log"
MESSAGES_DIR = f"{META_DIR}/messages"
LOCK_FILE = f"{META_DIR}/lock"

DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_BYTES = 128 << 20
DEFAULT_MAX_AGE = 10.0
COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")

_LOG_NAME = re.compile(r"^(\d{20})\.json$")
_PART_NAME = re.compile(r"^part-[0-9A-F]{16}-[0-9A-F]{16}-\d{8,}\.parquet$")
_TMP_NAME = re.compile(r"^\..+\.tmp$")
_VERSION_DIR = re.compile(r"^v[1-9]\d*$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_$-")

_TS = pa.timestamp("us", tz="UTC")
_U64 = pa.uint64()

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


def part_name(first_lsn: int, last_lsn: int, commit: int) -> str:
    return f"part-{first_lsn:016X}-{last_lsn:016X}-{commit:08d}.parquet"


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
    protocol: str | None = None
    source: StagingSource | None = None
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
        self.committed_lsn = max(self.committed_lsn, int(entry["committed_lsn"]))
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


# ---------------------------------------------------------------------------------------------------- the writer

class _Group:
    """Buffered batches of one table schema version."""

    __slots__ = ("schema", "batches", "rows", "nbytes", "first", "last", "counts")

    def __init__(self, schema: SchemaVersion) -> None:
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self.nbytes = 0
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        self.counts: dict[str, int] = {}


def _batch_bounds(rb: pa.RecordBatch) -> tuple[tuple[int, int], tuple[int, int]]:
    """The lowest and highest (`_commit_lsn`, `_seq`) of a non-empty batch: its first and last rows, since the
    rows of a decoder batch are in (`_commit_lsn`, `_seq`) order (docs/architecture.md)."""
    lsn = rb.column(1)
    seq = rb.column(4)
    n = rb.num_rows - 1
    return (lsn[0].as_py(), seq[0].as_py()), (lsn[n].as_py(), seq[n].as_py())


def _drop_staged(rb: pa.RecordBatch, floor: int, hwm: tuple[int, int] | None) -> pa.RecordBatch:
    """Keep the rows with `_commit_lsn` >= floor and (`_commit_lsn`, `_seq`) above the high-water mark."""
    if rb.num_rows == 0:
        return rb
    (lo, lo_seq), (hi, hi_seq) = _batch_bounds(rb)
    if lo >= floor and (hwm is None or (lo, lo_seq) > hwm):
        return rb
    if hi < floor or (hwm is not None and (hi, hi_seq) <= hwm):
        return rb.slice(0, 0)
    lsn = rb.column("_commit_lsn")
    mask = pc.greater_equal(lsn, pa.scalar(floor, _U64))
    if hwm is not None:
        h_lsn = pa.scalar(hwm[0], _U64)
        above = pc.or_(pc.greater(lsn, h_lsn),
                       pc.and_(pc.equal(lsn, h_lsn), pc.greater(rb.column("_seq"), pa.scalar(hwm[1], pa.int64()))))
        mask = pc.and_(mask, above)
    return rb.filter(mask)


def _schema_version_of(relation: Relation, schema: pa.Schema, version: int) -> SchemaVersion:
    n_change = len(schema) - len(relation.columns)
    cols = tuple((c.name, c.type_oid, c.type_modifier, bool(c.is_key), str(schema.field(n_change + i).type))
                 for i, c in enumerate(relation.columns))
    return SchemaVersion(relation.qualified_name, relation.namespace, relation.name, relation.relid, version,
                         relation.replica_identity, cols)


def _file_metadata(sv: SchemaVersion) -> dict[bytes, bytes]:
    return {
        b"spockwire.table": sv.table.encode("utf-8", "surrogateescape"),
        b"spockwire.relid": str(sv.relid).encode(),
        b"spockwire.schema_version": str(sv.schema_version).encode(),
    }


def _iso(ts: _dt.datetime | None) -> str | None:
    return None if ts is None else ts.isoformat()


class StagingWriter:
    """Buffers decoded events per table and schema version and commits them to the staging layout.

        with StagingWriter(out, protocol="pgoutput") as w:
            w.add_all(decoder.drain())            # everything drained so far ...
            if w.should_flush():
                w.commit(decoder.committed_lsn)   # ... before reading committed_lsn

    Opening takes the folder's writer lock, reads the log and removes crash leftovers (see `StagingState.open`).
    Events already staged are dropped on `add`: rows and truncates with `_commit_lsn` below the resume LSN or at
    or below their table's high-water mark (`_commit_lsn`, `_seq`); messages likewise (docs/staging.md, "dedup").

    Flush policy: `should_flush()` is true once `max_rows` buffered rows, `max_bytes` buffered bytes (Arrow
    buffers + message contents) or `max_age` seconds since the oldest buffered event is reached. The writer never
    commits on its own: the caller decides, because only it knows the LSN that covers what it added.
    """

    def __init__(self, out_dir: PathLike, protocol: str, *, compression: str = "zstd",
                 max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age: float = DEFAULT_MAX_AGE, source: StagingSource | None = None) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        if max_rows < 1 or max_bytes < 1 or max_age < 0:
            raise ValueError("max_rows and max_bytes must be positive and max_age not negative")
        self.out_dir = Path(out_dir)
        self.protocol = protocol
        self.source = source
        self.compression = compression
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age = max_age
        try:
            if not self.out_dir.is_dir():
                self.out_dir.mkdir(parents=True, exist_ok=True)
                _fsync_dir(self.out_dir.resolve().parent)
            _ensure_dir(self.out_dir, LOG_DIR)
        except OSError as exc:
            raise StagingError(f"cannot create the staging folder {self.out_dir}: {_why(exc)}") from exc
        self._lock: _Lock | None = _Lock.acquire(self.out_dir)
        try:
            self.state = StagingState._open_locked(self.out_dir)
            if self.state.protocol is not None and self.state.protocol != protocol:
                raise StagingError(f"staging folder {self.out_dir} holds a {self.state.protocol} stream; "
                                   f"refusing to add {protocol} changes to it")
            recorded = self.state.source
            if source is not None and recorded is not None and recorded != source:
                raise StagingError(f"staging folder {self.out_dir} holds changes from {recorded.describe()}; "
                                   f"refusing to add changes from {source.describe()}")
        except BaseException:
            self._lock.release()
            self._lock = None
            raise
        self.resume_lsn = self.state.committed_lsn
        self._current: dict[str, SchemaVersion] = {t: v[-1] for t, v in self.state.schemas.items() if v}
        self._next_version: dict[str, int] = {t: max(s.schema_version for s in v)
                                              for t, v in self.state.schemas.items() if v}
        self._hwm: dict[str, tuple[int, int]] = dict(self.state.high_water)
        self._msg_hwm = self.state.message_high_water
        self._nontx_hwm = self.state.nontransactional_high_water
        self.skipped_rows = 0
        self.skipped_truncates = 0
        self.skipped_messages = 0
        self._reset_buffer()

    def _reset_buffer(self) -> None:
        self._groups: dict[tuple[str, int], _Group] = {}
        self._truncates: list[dict[str, Any]] = []
        self._messages: list[LogicalMessage] = []
        self._new_versions: list[SchemaVersion] = []
        self._rows = 0
        self._bytes = 0
        self._oldest: float | None = None

    # ------------------------------------------------------------------ properties
    @property
    def committed_lsn(self) -> int:
        """The LSN of the newest log entry: safe to acknowledge."""
        return self.state.committed_lsn

    @property
    def buffered_rows(self) -> int:
        return self._rows

    @property
    def buffered_bytes(self) -> int:
        """Memory held by buffered events (Arrow buffer sizes plus message contents)."""
        return self._bytes

    @property
    def buffered_events(self) -> int:
        return sum(len(g.batches) for g in self._groups.values()) + len(self._truncates) + len(self._messages)

    def buffered_age(self, now: float | None = None) -> float:
        """Seconds since the oldest buffered event was added (0 when nothing is buffered)."""
        if self._oldest is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self._oldest)

    def flush_reason(self, now: float | None = None) -> str | None:
        """"rows", "bytes" or "age" when a limit is reached, else None."""
        if self._rows >= self.max_rows:
            return "rows"
        if self._bytes >= self.max_bytes:
            return "bytes"
        if self._oldest is not None and self.buffered_age(now) >= self.max_age:
            return "age"
        return None

    def should_flush(self, now: float | None = None) -> bool:
        """True when the flush policy says: commit now. `now` is a `time.monotonic()` value (for tests)."""
        return self.flush_reason(now) is not None

    # ------------------------------------------------------------------ adding
    def _touch(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()

    def _version_for(self, relation: Relation, schema: pa.Schema) -> SchemaVersion:
        table = relation.qualified_name
        candidate = _schema_version_of(relation, schema, 0)
        current = self._current.get(table)
        if current is not None and current.identity == candidate.identity:
            return current
        number = self._next_version.get(table, 0) + 1
        self._next_version[table] = number
        sv = _schema_version_of(relation, schema, number)
        self._current[table] = sv
        self._new_versions.append(sv)
        return sv

    def add(self, event: Any) -> int:
        """Buffer one drained event; returns the rows (or events) kept after dropping already-staged ones."""
        self._check_open()
        if isinstance(event, ChangeBatch):
            return self._add_batch(event)
        if isinstance(event, Truncate):
            return self._add_truncate(event)
        if isinstance(event, LogicalMessage):
            return self._add_message(event)
        raise TypeError(f"StagingWriter.add takes ChangeBatch, Truncate or LogicalMessage, not {type(event).__name__}")

    def add_all(self, events: Iterable[Any]) -> int:
        return sum(self.add(e) for e in events)

    def _add_batch(self, batch: ChangeBatch) -> int:
        rb = batch.to_arrow()
        table = batch.relation.qualified_name
        kept = _drop_staged(rb, self.resume_lsn, self._hwm.get(table))
        self.skipped_rows += rb.num_rows - kept.num_rows
        if kept.num_rows == 0:
            return 0
        sv = self._version_for(batch.relation, kept.schema)
        kept = kept.replace_schema_metadata(_file_metadata(sv))
        group = self._groups.get((table, sv.schema_version))
        if group is None:
            group = self._groups[(table, sv.schema_version)] = _Group(sv)
        lo, hi = _batch_bounds(kept)
        group.first = lo if group.first is None else min(group.first, lo)
        group.last = _max_key(group.last, hi)
        self._hwm[table] = _max_key(self._hwm.get(table), hi)
        for item in pc.value_counts(kept.column("_change_type")).to_pylist():
            group.counts[item["values"]] = group.counts.get(item["values"], 0) + item["counts"]
        group.batches.append(kept)
        group.rows += kept.num_rows
        size = kept.nbytes
        group.nbytes += size
        self._rows += kept.num_rows
        self._bytes += size
        self._touch()
        return kept.num_rows

    def _add_truncate(self, t: Truncate) -> int:
        tables = [r.qualified_name for r in t.relations]
        key = (t.commit_lsn, t.seq)
        if t.commit_lsn < self.resume_lsn or (tables and all(_key_le(key, self._hwm.get(n)) for n in tables)):
            self.skipped_truncates += 1
            return 0
        for n in tables:
            self._hwm[n] = _max_key(self._hwm.get(n), key)
        self._truncates.append({
            "tables": tables, "relids": [r.relid for r in t.relations], "cascade": bool(t.cascade),
            "restart_identity": bool(t.restart_identity), "commit_lsn": t.commit_lsn,
            "commit_ts": _iso(t.commit_ts), "seq": t.seq, "xid": t.xid, "origin": t.origin,
        })
        self._bytes += 256
        self._touch()
        return 1

    def _add_message(self, m: LogicalMessage) -> int:
        if m.transactional and m.commit_lsn is not None:
            key = (m.commit_lsn, m.seq or 0)
            if m.commit_lsn < self.resume_lsn or _key_le(key, self._msg_hwm):
                self.skipped_messages += 1
                return 0
            self._msg_hwm = _max_key(self._msg_hwm, key)
        else:
            if m.lsn < self.resume_lsn or (self._nontx_hwm is not None and m.lsn <= self._nontx_hwm):
                self.skipped_messages += 1
                return 0
            self._nontx_hwm = m.lsn
        self._messages.append(m)
        self._bytes += len(m.content) + len(m.prefix) + 64
        self._touch()
        return 1

    # ------------------------------------------------------------------ committing
    def _encode_parquet(self, table: pa.Table) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=self.compression if self.compression != "none" else None)
        return sink.getvalue()

    def _put(self, rel_dir: str, name: str, data: pa.Buffer, created: list[Path], dirs: set[Path]) -> None:
        folder = _ensure_dir(self.out_dir, rel_dir)
        tmp = folder / f".{name}.tmp"
        final = folder / name
        created.append(tmp)
        _write_durable(tmp, data)
        os.replace(tmp, final)
        created.append(final)
        dirs.add(folder)

    def _messages_table(self) -> pa.Table:
        ms = self._messages
        return pa.table([
            pa.array([m.prefix for m in ms], pa.string()),
            pa.array([m.content for m in ms], pa.binary()),
            pa.array([m.transactional for m in ms], pa.bool_()),
            pa.array([m.lsn for m in ms], pa.uint64()),
            pa.array([m.xid for m in ms], pa.uint32()),
            pa.array([m.commit_lsn for m in ms], pa.uint64()),
            pa.array([m.commit_ts for m in ms], _TS),
            pa.array([m.seq for m in ms], pa.int64()),
            pa.array([m.origin for m in ms], pa.string()),
        ], schema=MESSAGES_SCHEMA)

    def commit(self, committed_lsn: int) -> dict[str, Any] | None:
        """Write everything buffered, make it durable, then append the log entry that publishes it.

        `committed_lsn` is the decoder's `committed_lsn` read after the events were added; the entry records the
        larger of it and the previous entry's. Returns the log entry (a dict, as written), or None when there was
        nothing to write and the LSN did not move. On failure raises StagingError and commits nothing.
        """
        self._check_open()
        lsn = int(committed_lsn)
        if lsn < 0:
            raise ValueError(f"committed_lsn must not be negative, got {lsn}")
        previous = self.state.committed_lsn
        new_lsn = max(lsn, previous)
        if not self._groups and not self._truncates and not self._messages and new_lsn == previous:
            return None
        number = self.state.commit + 1
        created: list[Path] = []
        dirs: set[Path] = set()
        log_final: Path | None = None
        step = "writing the Parquet files"
        try:
            files = []
            for (table, version), g in self._groups.items():
                sv = g.schema
                data = self._encode_parquet(pa.Table.from_batches([store_batch(b) for b in g.batches]))
                rel_dir = f"{table_folder_name(sv.namespace, sv.name)}/v{version}"
                name = part_name(g.first[0], g.last[0], number)
                self._put(rel_dir, name, data, created, dirs)
                files.append({
                    "path": f"{rel_dir}/{name}", "table": table, "relid": sv.relid, "schema_version": version,
                    "first_commit_lsn": g.first[0], "last_commit_lsn": g.last[0], "first_seq": g.first[1],
                    "last_seq": g.last[1], "rows": g.rows, "bytes": data.size, "change_counts": g.counts,
                })
            messages = []
            if self._messages:
                ms = self._messages
                positions = [m.commit_lsn if m.commit_lsn is not None else m.lsn for m in ms]
                tx = [(m.commit_lsn, m.seq or 0) for m in ms if m.transactional and m.commit_lsn is not None]
                ntx = [m.lsn for m in ms if not (m.transactional and m.commit_lsn is not None)]
                data = self._encode_parquet(self._messages_table())
                name = part_name(min(positions), max(positions), number)
                self._put(MESSAGES_DIR, name, data, created, dirs)
                messages.append({
                    "path": f"{MESSAGES_DIR}/{name}", "rows": len(ms), "bytes": data.size,
                    "first_lsn": min(m.lsn for m in ms), "last_lsn": max(m.lsn for m in ms),
                    "last_commit_lsn": max(tx)[0] if tx else None, "last_seq": max(tx)[1] if tx else None,
                    "last_nontransactional_lsn": max(ntx) if ntx else None,
                })
            step = "syncing the folders"
            for folder in sorted(dirs):
                _fsync_dir(folder)
            entry = {
                "format": FORMAT_VERSION, "commit": number, "committed_lsn": new_lsn,
                "committed_lsn_text": format_lsn(new_lsn), "previous_committed_lsn": previous,
                "protocol": self.protocol, "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                **({"source": self.source.to_json()} if self.source is not None else {}),
                "files": files, "truncates": list(self._truncates), "messages": messages,
                "relations": [sv.to_json() for sv in self._new_versions],
            }
            step = "writing the log entry"
            raw = (json.dumps(entry, indent=1, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
            log_dir = _log_dir(self.out_dir)
            tmp = log_dir / f".{log_name(number)}.tmp"
            created.append(tmp)
            _write_durable(tmp, raw)
            log_final = log_dir / log_name(number)
            os.replace(tmp, log_final)
            step = "syncing the log folder"
            _fsync_dir(log_dir)
        except Exception as exc:
            self._undo(created, log_final)
            if isinstance(exc, StagingError):
                raise
            raise StagingError(
                f"staging commit {number} to {self.out_dir} failed while {step}: {_why(exc)}; nothing was "
                f"committed (the log still ends at commit {number - 1}, committed_lsn "
                f"{format_lsn(previous)})") from exc
        self.state._apply(entry)
        self._reset_buffer()
        return entry

    def _undo(self, created: list[Path], log_final: Path | None) -> None:
        """Best effort: take back a failed commit (the log entry first, then its files)."""
        if log_final is not None:
            try:
                log_final.unlink()
                _fsync_dir(log_final.parent)
            except OSError:
                pass
        for path in reversed(created):
            try:
                path.unlink()
            except OSError:
                pass

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._lock is None:
            raise StagingError(f"StagingWriter for {self.out_dir} is closed")

    @property
    def closed(self) -> bool:
        return self._lock is None

    def close(self) -> None:
        """Release the folder. Buffered, uncommitted events are dropped (they were never acknowledged)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            self._reset_buffer()

    def __enter__(self) -> "StagingWriter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._lock is None else "open"
        return (f"<StagingWriter {state} {self.out_dir} commit={self.state.commit} "
                f"committed_lsn={format_lsn(self.state.committed_lsn)} buffered_rows={self._rows}>")


# ---------------------------------------------------------------------------------------------------- readers

def list_tables(out_dir: PathLike) -> list[str]:
    """The tables (``namespace.name``) the log knows: those with staged files, schema versions or truncates."""
    return StagingState.load(out_dir).tables


def _read_file(out: Path, rel: str) -> pa.Table:
    path = out / rel
    try:
        return restore_table(pq.ParquetFile(path).read())
    except FileNotFoundError:
        raise StagingError(f"staging file {path} named by the log is missing") from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise StagingError(f"cannot read staging file {path}: {exc}") from exc


def _concat(tables: list[pa.Table], what: str, hint: str = "") -> pa.Table:
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise StagingError(f"cannot combine the staged files of {what} into one table: {exc}{hint}") from exc


def read_staging(out_dir: PathLike, table: str | None = None, *, schema_version: int | None = None) -> pa.Table:
    """The staged row changes, from the files the log names, in log order.

    With `table` (``namespace.name``): that table's rows (all schema versions, columns unified; a column missing
    from an older version is null), or one version with `schema_version`. Without: the rows of every table, with
    a ``_table`` column first. Truncates are in the log (`StagingState.load(out).truncates`); order changes and
    truncates of a table by (`_commit_lsn`, `_seq`) to replay them.
    """
    out = Path(out_dir)
    state = StagingState.load(out)
    if table is not None:
        if table not in state.tables:
            known = ", ".join(state.tables) or "none"
            raise StagingError(f"no table {table!r} in the staging folder {out} (tables: {known})")
        files = [f for f in state.files.get(table, ()) if schema_version is None or f.schema_version == schema_version]
        if not files:
            return pa.table({})
        versions = sorted({f.schema_version for f in files})
        hint = "" if len(versions) == 1 else (f"; read its schema versions ({', '.join(map(str, versions))}) one "
                                              "at a time with schema_version=")
        return _concat([_read_file(out, f.path).replace_schema_metadata(None) for f in files], table, hint)
    ordered = sorted((f for fs in state.files.values() for f in fs), key=lambda f: (f.commit, f.path))
    parts = []
    for f in ordered:
        t = _read_file(out, f.path).replace_schema_metadata(None)
        parts.append(t.add_column(0, pa.field("_table", pa.string(), nullable=False),
                                  pa.array([f.table] * t.num_rows, pa.string())))
    if not parts:
        return pa.table({})
    return _concat(parts, "all tables (read one table at a time)")


def read_messages(out_dir: PathLike) -> pa.Table:
    """The staged logical messages in log order (columns: MESSAGES_SCHEMA)."""
    out = Path(out_dir)
    state = StagingState.load(out)
    parts = [_read_file(out, m["path"]) for m in state.message_files]
    if not parts:
        return MESSAGES_SCHEMA.empty_table()
    return pa.concat_tables(parts)
