"""The JSON protocol of pglogical 2 and Spock 6 (startup parameter ``proto_format=json``).

Each message is one JSON object (docs/protocols.md, "The JSON protocol"). :class:`JsonDecoder` reads them strictly
and hands each one, rewritten as the pglogical native message it stands for with every value in its text form, to
the native decoder of the chosen implementation (C or pure Python, ``SPOCKWIRE_IMPL``). So the values go through
the same text kernels and the type catalog as a native text stream, and both implementations give the same values
and the same errors. The JSON reading itself is Python (the C JSON reader of the standard library, and a reader of
its own that keeps byte positions, for errors and for json values, whose exact text matters): this is a
diagnostics format, not a fast path.

What the JSON form does not carry stays null, never made up: ``_xid``, ``_commit_lsn`` and ``_commit_ts`` under
``no_txinfo``; ``_origin`` always; the relation id (``Relation.relid`` is 0) and the key flags of the columns.

The reading of a message (the JSON, the members of each action, the startup message) is in json_messages.py, the
values' text forms in json_values.py, the rewriting into native messages and the decoder here; every public name is
importable from this module.
"""
from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any, Callable

import pyarrow as pa

from ..errors import FrameError, ProtocolError
from ..frames import iter_frames
from ..model import PG_EPOCH_OFFSET_US, ChangeBatch, Relation
from .encodings import text_codec
from .json_messages import (_BEGIN_KEYS, _CHANGE_KEYS, _CHANGE_NAMES, _COMMIT_KEYS, _KIND_NAMES, _START_KEYS, _Bad,
                            _commit_time, _error, _fields, _lsn, _startup_params, _uint, json_action, parse_json,
                            parse_json_fast, parse_json_startup_message)
from .json_values import _UNKNOWN, _Values

__all__ = ["JsonDecoder", "PROTO_FORMATS", "parse_json_startup_message", "json_decoder_or_native", "json_action"]

#: the values of the ``proto_format`` startup parameter spockwire reads
PROTO_FORMATS = ("native", "json")

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_B_MSG = struct.Struct(">cBQqI")
_C_MSG = struct.Struct(">cBQQq")

# ------------------------------------------------------------------------------------------------------------------
# the decoder


def _native_name(text: str, what: str, at: int) -> bytes:
    raw = text.encode("utf-8") + b"\0"
    if len(raw) > 255:
        raise _Bad(at, f"{what} is longer than a PostgreSQL name can be")
    return bytes((len(raw),)) + raw


class _Table:
    """What the decoder knows of one table: its columns (the keys of its tuples) and the native relation id
    used inside (never shown: the JSON protocol does not carry the table's OID)."""

    __slots__ = ("inner_relid", "columns", "categories")

    def __init__(self, inner_relid: int) -> None:
        self.inner_relid = inner_relid
        self.columns: list[str] = []
        self.categories: list[tuple] = []


def _is_subsequence(keys: list[str], columns: list[str]) -> bool:
    it = iter(columns)
    return all(any(k == c for c in it) for k in keys)


class _JsonChangeBatch(ChangeBatch):
    """A change batch of the inner decoder with the change columns the JSON form carried put back: the real
    xid, commit LSN and commit time of each row's transaction, or null where the stream did not say."""

    __slots__ = ("_inner", "_txns")

    def __init__(self, relation: Relation, inner: ChangeBatch, txns: dict[int, tuple]) -> None:
        super().__init__(relation, None)   # type: ignore[arg-type]  # built on the first to_arrow()
        self._inner = inner
        self._txns = txns

    @property
    def num_rows(self) -> int:
        return self._inner.num_rows

    def __len__(self) -> int:
        return self._inner.num_rows

    def to_arrow(self) -> pa.RecordBatch:
        if self._record_batch is None:
            self._record_batch = _restore_change_columns(self._inner.to_arrow(), self._txns, self.relation)
            self._inner = None  # type: ignore[assignment]
        return self._record_batch


def _restore_change_columns(batch: pa.RecordBatch, txns: dict[int, tuple], relation: Relation) -> pa.RecordBatch:
    tokens = batch.column("_xid").to_pylist()
    found = [txns[t] for t in tokens]
    arrays = list(batch.columns)
    fields = list(batch.schema)
    for name, index, typ in (("_xid", 0, pa.uint32()), ("_commit_lsn", 1, pa.uint64()),
                             ("_commit_ts", 2, pa.timestamp("us", tz="UTC"))):
        at = batch.schema.get_field_index(name)
        values = [f[index] for f in found]
        arrays[at] = pa.array(values, typ)
        fields[at] = pa.field(name, typ, nullable=fields[at].nullable or arrays[at].null_count > 0)
    metadata = dict(batch.schema.metadata or {})
    metadata[b"spockwire.relid"] = str(relation.relid).encode()
    metadata[b"spockwire.proto_format"] = b"json"
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


class JsonDecoder:
    """Decodes a pglogical or Spock stream in the JSON protocol (``proto_format=json``) into the same events as
    the native decoder: ``ChangeBatch`` es with the same change columns and typed values.

    `protocol` is "pglogical" or "spock"; `implementation` the decoder module whose text kernels decode the
    values (default: the one ``SPOCKWIRE_IMPL`` picks); the other keyword arguments are the native Decoder's
    (`type_catalog`, `types`, `numeric`, `column_types`, `on_unrepresentable`, ...). Without a type catalog the
    columns stay untyped, as in a native pglogical stream, and a value is the JSON's text.
    """

    proto_format = "json"

    def __init__(self, protocol: str = "pglogical", *, implementation: Any = None, type_catalog: Any = None,
                 **options: Any) -> None:
        if protocol not in ("pglogical", "spock"):
            raise ValueError(f"the JSON protocol is pglogical's and spock's, not {protocol!r}")
        if implementation is None:
            from . import load_implementation

            implementation = load_implementation()
        self.protocol = protocol
        self.type_catalog = type_catalog
        self._inner = implementation.Decoder("pglogical", type_catalog=type_catalog, **options)
        self._values = _Values(type_catalog)
        self.startup_params: dict[str, str] = {}
        self._codec: str | None = None
        self._txinfo: bool | None = None      # False under no_txinfo; None before the startup message
        self._tables: dict[tuple[str, str], _Table] = {}
        self._txn: tuple | None = None         # (token, xid, commit_ts) of the open transaction
        self._after_begin = False
        self._token = 0
        self._committed: dict[int, tuple] = {}

    # ------------------------------------------------------------------ the native Decoder's interface
    @property
    def committed_lsn(self) -> int:
        return self._inner.committed_lsn

    @property
    def open_transactions(self) -> int:
        return self._inner.open_transactions

    @property
    def remote_insert_lsn(self) -> int:
        return 0

    @property
    def relations(self) -> dict[int, Relation]:
        """The tables seen so far, by the decoder's own numbering (the JSON protocol carries no relation id)."""
        return {relid: self._shown(rel) for relid, rel in self._inner.relations.items()}

    def feed(self, payload: Any, lsn: int | None = None) -> None:
        self._message(bytes(payload), lsn)

    def feed_frames(self, buffer: Any, *, partial_ok: bool = False) -> int:
        pos = 0
        try:
            for lsn, payload in iter_frames(buffer):
                try:
                    self._message(bytes(payload), lsn)
                except ProtocolError as exc:
                    exc.frame_offset = pos  # type: ignore[attr-defined]
                    raise
                pos += 12 + len(payload)
        except FrameError as exc:
            if not partial_ok:
                raise
            return exc.offset or 0
        return pos

    def drain(self) -> list[Any]:
        events = self._inner.drain()
        txns, self._committed = self._committed, {}
        return [_JsonChangeBatch(self._shown(ev.relation), ev, txns) for ev in events]

    # ------------------------------------------------------------------ messages
    def _shown(self, rel: Relation) -> Relation:
        return replace(rel, relid=0)

    def _message(self, data: bytes, lsn: int | None) -> None:
        action = None
        try:
            if not data:
                # where the native protocol has an ORIGIN message (Spock: every transaction; pglogical: a
                # forwarded one) the JSON protocol writes nothing, and the message boundary makes an empty message
                if not self._after_begin:
                    raise _Bad(0, "empty message (the plugins send one only right after a BEGIN)")
                self._after_begin = False
                return
            self._after_begin = False
            action = json_action(data)
            action = None if action == "?" else action      # named in a syntax error too
            root = parse_json_fast(data, self._codec)
            if root is not None:
                try:
                    self._dispatch(root, data, lsn)
                    return
                except _Bad as bad:
                    if bad.offset >= 0:
                        raise
                    # a problem in a tree without positions: read the message again with them, to say where
            self._dispatch(parse_json(data, self._codec), data, lsn)
        except _Bad as bad:
            raise _error(bad, action, lsn) from None

    def _dispatch(self, root: tuple, data: bytes, lsn: int | None) -> None:
        """One message, read; every check here comes before anything is fed to the native decoder (so a message
        refused while read without byte positions can be read again with them)."""
        if root[0] != "o":
            raise _Bad(root[1], f"a message must be a JSON object, not {_KIND_NAMES[root[0]]}")
        first = root[3][0] if root[3] else None
        if first is None or first[0] != "action" or first[1][0] != "s":
            raise _Bad(root[1], 'a message must begin with its "action" string')
        action = first[1][3]
        if action == "S":
            self._startup(root)
        elif self._txinfo is None:
            raise _Bad(0, "the stream must begin with the startup message (action S)")
        elif action == "B":
            self._begin(root, data, lsn)
        elif action == "C":
            self._commit(root, lsn)
        elif action in _CHANGE_NAMES:
            self._change(root, action, data, lsn)
        else:
            raise _Bad(first[1][1], f"unknown action {action!r}")

    def _feed_inner(self, payload: bytes, lsn: int | None,
                    locate: Callable[[ProtocolError], _Bad] | None = None) -> None:
        try:
            self._inner.feed(payload, lsn)
        except ProtocolError as exc:
            if locate is None:
                raise _Bad(0, _problem(exc)) from None
            raise locate(exc) from None

    def _at(self, root: tuple, data: bytes, *path: str) -> int:
        """The byte offset of the member at `path` (object keys) of the message; read again with byte positions
        when `root` was read without them."""
        node = root if root[1] >= 0 else parse_json(data, self._codec)
        for key in path:
            node = dict(node[3])[key]
        return node[1]

    def _startup(self, root: tuple) -> None:
        fields = _fields(root, _START_KEYS, "the startup message")
        if "params" not in fields:
            raise _Bad(root[1], "the startup message has no params")
        params = _startup_params(fields["params"])
        try:
            self._codec = text_codec(params.get("encoding"))
        except ValueError as exc:
            raise _Bad(fields["params"][1], str(exc)) from None
        flag = params.get("no_txinfo", "f")
        if flag not in ("t", "f"):
            raise _Bad(fields["params"][1], f"startup parameter no_txinfo is {flag!r}, not t or f")
        self._txinfo = flag == "f"
        self.startup_params = params
        # the inner decoder reads what this class writes: UTF-8 text values, no binary or internal datums
        inner = {"max_proto_version": "1", "min_proto_version": "1", "database_encoding": "UTF8", "encoding": "UTF8"}
        self._feed_inner(b"S\x01" + b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in inner.items()),
                         None)

    def _begin(self, root: tuple, data: bytes, lsn: int | None) -> None:
        fields = _fields(root, _BEGIN_KEYS, "BEGIN")
        flag = fields.get("has_catalog_changes")
        if flag is None or flag[3] not in ("t", "f"):
            raise _Bad(root[1], 'BEGIN needs "has_catalog_changes" "t" or "f"')
        if "origin_id" in fields:
            _uint(fields["origin_id"], "origin_id", 0xFFFF)
        carried = [k for k in ("xid", "first_lsn", "origin_lsn", "commit_time") if k in fields]
        if not self._txinfo and carried:
            raise _Bad(fields[carried[0]][1], f"BEGIN carries {carried[0]!r} although the stream has no_txinfo")
        if self._txinfo:
            for key in ("xid", "first_lsn"):
                if key not in fields:
                    raise _Bad(root[1], f"BEGIN has no {key!r} (and the stream is not no_txinfo)")
        xid = _uint(fields["xid"], "xid", 0xFFFFFFFF) if "xid" in fields else None
        for key in ("first_lsn", "origin_lsn"):
            if key in fields:
                _lsn(fields[key], key)
        ts = _commit_time(fields["commit_time"]) if "commit_time" in fields else None
        self._token = (self._token + 1) & 0xFFFFFFFF
        self._txn = (self._token, xid, ts)
        self._feed_inner(_B_MSG.pack(b"B", 0, 0, 0 if ts is None else ts, self._token), lsn,
                         lambda exc: _Bad(self._at(root, data, "commit_time"), _problem(exc)))
        self._after_begin = True

    def _commit(self, root: tuple, lsn: int | None) -> None:
        fields = _fields(root, _COMMIT_KEYS, "COMMIT")
        if self._txn is None:
            raise _Bad(0, "COMMIT without a BEGIN")
        if self._txinfo:
            for key in ("final_lsn", "end_lsn"):
                if key not in fields:
                    raise _Bad(root[1], f"COMMIT has no {key!r} (and the stream is not no_txinfo)")
        elif fields.keys() - {"action"}:
            raise _Bad(root[1], "COMMIT carries LSNs although the stream has no_txinfo")
        commit_lsn = _lsn(fields["final_lsn"], "final_lsn") if "final_lsn" in fields else None
        if "end_lsn" in fields:
            end_lsn = _lsn(fields["end_lsn"], "end_lsn")
        elif lsn is not None:
            end_lsn = lsn    # the position of the commit message is the transaction's end
        else:
            raise _Bad(0, "COMMIT under no_txinfo carries no end LSN: feed it with its frame LSN")
        token, xid, ts = self._txn
        self._feed_inner(_C_MSG.pack(b"C", 0, 0, end_lsn, 0 if ts is None else ts), lsn)
        self._txn = None
        self._committed[token] = (xid, commit_lsn, None if ts is None else ts + PG_EPOCH_OFFSET_US)

    def _change(self, root: tuple, action: str, data: bytes, lsn: int | None) -> None:
        what = _CHANGE_NAMES[action]
        fields = _fields(root, _CHANGE_KEYS, what)
        rel = fields.get("relation")
        if rel is None or len(rel[3]) != 2 or any(item[0] != "s" for item in rel[3]):
            raise _Bad(root[1] if rel is None else rel[1], f"{what} needs \"relation\": [schema, table]")
        old, new = fields.get("oldtuple"), fields.get("newtuple")
        if (new is None) != (action == "D") or (old is not None and action == "I") or (old is None and action == "D"):
            raise _Bad(root[1], {"I": "INSERT needs a newtuple and no oldtuple", "U": "UPDATE needs a newtuple",
                                 "D": "DELETE needs an oldtuple and no newtuple"}[action])
        if self._txn is None:
            raise _Bad(root[1], f"{what} outside a transaction")
        table = self._table(rel, [t for t in (old, new) if t is not None], action, lsn)
        out = bytearray(action.encode() + b"\0" + _U32.pack(table.inner_relid))
        starts: list[tuple[int, str, dict[str, tuple]]] = []   # where each tuple starts in the native message
        for mark, key, tup in ((b"K", "oldtuple", old), (b"N", "newtuple", new)):
            if tup is None:
                continue
            out += mark
            values = {name: node for name, node in tup[3]}
            starts.append((len(out), key, values))
            self._tuple(out, table, values, data)

        def locate(exc: ProtocolError) -> _Bad:
            key, values = starts[0][1], starts[0][2]
            for start, k, v in starts:
                if exc.offset is not None and exc.offset >= start:
                    key, values = k, v
            column = exc.column
            if column is None or column >= len(table.columns):
                return _Bad(self._at(root, data, key), _problem(exc))
            name = table.columns[column]
            path = (key, name) if name in values else (key,)
            return _Bad(self._at(root, data, *path), _problem(exc), column, name)

        self._feed_inner(bytes(out), lsn, locate)

    def _table(self, rel: tuple, tuples: list[tuple], action: str, lsn: int | None) -> _Table:
        nsp, name = rel[3][0][3], rel[3][1][3]
        table = self._tables.get((nsp, name))
        keyed = [[key for key, _node in tup[3]] for tup in tuples]
        for keys, tup in zip(keyed, tuples):
            if len(set(keys)) != len(keys):
                raise _Bad(tup[1], "a tuple names a column twice")
        if table is not None:
            # a tuple may leave out unchanged TOASTed columns (UPDATE, DELETE), never add or reorder them
            fits = all(keys == table.columns if action == "I" else _is_subsequence(keys, table.columns)
                       for keys in keyed)
            if fits:
                return table
        else:
            table = self._tables[(nsp, name)] = _Table(len(self._tables) + 1)
        columns = max(keyed, key=len)
        out = bytearray(b"R\0" + _U32.pack(table.inner_relid) + _native_name(nsp, "the schema name", rel[1])
                        + _native_name(name, "the table name", rel[1]) + b"A" + _U16.pack(len(columns)))
        for column in columns:
            raw = column.encode("utf-8") + b"\0"
            out += b"C\0N" + _U16.pack(len(raw)) + raw
        self._feed_inner(bytes(out), lsn)
        table.columns = columns
        inner = self._inner.relations[table.inner_relid]
        types = None
        if self.type_catalog is not None:
            types = self.type_catalog.column_types(inner)
        table.categories = [self._values.category(oid) for oid, _mod in types] if types else \
            [_UNKNOWN] * len(columns)
        return table

    def _tuple(self, out: bytearray, table: _Table, values: dict[str, tuple], data: bytes) -> None:
        out += b"T" + _U16.pack(len(table.columns))
        for i, (column, cat) in enumerate(zip(table.columns, table.categories)):
            node = values.get(column)
            if node is None:
                out += b"u"         # left out: an unchanged TOASTed value
                continue
            try:
                text = self._values.text(node, cat, data, self._codec)
            except _Bad as bad:
                raise _Bad(bad.offset, bad.problem, i, column) from None
            if text is None:
                out += b"n"
            else:
                raw = text.encode("utf-8") + b"\0"
                out += b"t" + _U32.pack(len(raw)) + raw


def _problem(exc: ProtocolError) -> str:
    """What a native decoder's error says, without its place in the native message (which does not exist)."""
    from ..errors import _column_text, _where

    text = str(exc)
    for head in ("bad ", "truncated "):
        prefix = f"{head}{_where(exc.msg_type, exc.offset or 0)}{_column_text(exc.column, exc.column_name)}: "
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def json_decoder_or_native(module: Any, protocol: str, proto_format: str | None, **options: Any) -> Any:
    """A decoder of `module` for `protocol` in `proto_format` ("native" or None, or "json")."""
    if proto_format in (None, "native"):
        return module.Decoder(protocol, **options)
    if proto_format != "json":
        raise ValueError(f"proto_format must be 'native' or 'json', not {proto_format!r}")
    options.pop("proto_version", None)   # the JSON messages are the same under every protocol version
    return JsonDecoder(protocol, implementation=module, **options)
