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
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import replace
from typing import Any, Callable

import pyarrow as pa

from ..errors import FrameError, ProtocolError
from ..frames import iter_frames
from ..model import PG_EPOCH_OFFSET_US, ChangeBatch, Relation
from .encodings import encoding_name, text_codec

__all__ = ["JsonDecoder", "PROTO_FORMATS", "parse_json_startup_message", "json_decoder_or_native", "json_action"]

#: the values of the ``proto_format`` startup parameter spockwire reads
PROTO_FORMATS = ("native", "json")

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_B_MSG = struct.Struct(">cBQqI")
_C_MSG = struct.Struct(">cBQQq")

# ------------------------------------------------------------------------------------------------------------------
# strict JSON reading with byte positions

_TOKEN = re.compile(rb'[ \t\n\r]*(?:("[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*")'
                    rb'|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)|(true|false|null)|([\[\]{}:,]))')
_WS = re.compile(rb"[ \t\n\r]*")

# node: (kind, start, end, payload) -- kind "s" string (str), "n" number (its text), "b" boolean (bool),
# "z" null (None), "a" array (list of nodes), "o" object (list of (key, node)); start/end: byte offsets
_VALUE, _FIRST_ITEM, _FIRST_KEY, _KEY, _COLON, _NEXT, _DONE = range(7)


class _Bad(Exception):
    """A problem at a byte of the JSON message (turned into a ProtocolError with the message's context)."""

    def __init__(self, offset: int, problem: str, column: int | None = None, name: str | None = None) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem
        self.column = column
        self.name = name


def _string(data: bytes, start: int, end: int, codec: str | None) -> str:
    raw = data[start + 1:end - 1]
    try:
        if b"\\" not in raw:
            text = raw.decode(codec or "utf-8")
        else:
            text = json.loads(raw.decode(codec or "utf-8").join('""'))
            text.encode("utf-8")   # a \u escape of a lone surrogate cannot be text
    except UnicodeDecodeError as exc:
        raise _Bad(start + 1 + exc.start, f"string is not valid {encoding_name(codec) if codec else 'UTF-8'}") \
            from None
    except UnicodeEncodeError:
        raise _Bad(start, "string holds a \\u escape of a lone UTF-16 surrogate") from None
    if "\0" in text:
        raise _Bad(start, "string holds a NUL character (\\u0000), which no PostgreSQL text can")
    return text


def _syntax_error(data: bytes, pos: int) -> _Bad:
    pos = _WS.match(data, pos).end()
    if pos >= len(data):
        return _Bad(pos, "the JSON ends early")
    ch = data[pos:pos + 1]
    if ch == b'"':
        return _Bad(pos, "string is not terminated, or holds a control character or a bad escape")
    return _Bad(pos, f"unexpected {ch!r} in the JSON")


def parse_json(data: bytes, codec: str | None = None) -> tuple:
    """The node tree of one JSON text (strict RFC 8259: one value, nothing after it but whitespace)."""
    stack: list[list[Any]] = []      # [kind, start, items, pending key]
    pos = 0
    want = _VALUE
    root: tuple | None = None
    n = len(data)
    while True:
        if want == _DONE:
            if _WS.match(data, pos).end() != n:
                raise _Bad(_WS.match(data, pos).end(), "more after the end of the JSON value")
            assert root is not None
            return root
        m = _TOKEN.match(data, pos)
        if m is None:
            raise _syntax_error(data, pos)
        string, number, literal, punct = m.groups()
        start, pos = m.start(m.lastindex), m.end()
        node: tuple | None = None
        if punct is not None:
            if punct in b"[{":
                if want not in (_VALUE, _FIRST_ITEM):
                    raise _Bad(start, f"unexpected {punct.decode()!r} in the JSON")
                stack.append(["a" if punct == b"[" else "o", start, [], None])
                want = _FIRST_ITEM if punct == b"[" else _FIRST_KEY
                continue
            if punct == b"]" and want in (_FIRST_ITEM, _NEXT) and stack and stack[-1][0] == "a":
                kind, begin, items, _ = stack.pop()
                node = ("a", begin, pos, items)
            elif punct == b"}" and want in (_FIRST_KEY, _NEXT) and stack and stack[-1][0] == "o":
                kind, begin, items, _ = stack.pop()
                node = ("o", begin, pos, items)
            elif punct == b"," and want == _NEXT:
                want = _VALUE if stack[-1][0] == "a" else _KEY
                continue
            elif punct == b":" and want == _COLON:
                want = _VALUE
                continue
            else:
                raise _Bad(start, f"unexpected {punct.decode()!r} in the JSON")
        elif want in (_FIRST_KEY, _KEY):
            if string is None:
                raise _Bad(start, "an object key must be a string")
            stack[-1][3] = _string(data, start, pos, codec)
            want = _COLON
            continue
        elif want not in (_VALUE, _FIRST_ITEM):
            raise _Bad(start, "a value where the JSON needs a ',', ':' or the end of an array or object")
        elif string is not None:
            node = ("s", start, pos, _string(data, start, pos, codec))
        elif number is not None:
            node = ("n", start, pos, number.decode("ascii"))
        elif literal == b"null":
            node = ("z", start, pos, None)
        else:
            node = ("b", start, pos, literal == b"true")
        if not stack:
            root = node
            want = _DONE
        else:
            top = stack[-1]
            top[2].append(node if top[0] == "a" else (top[3], node))
            want = _NEXT


class _Number(str):
    """A JSON number's text, as the C reader hands it over."""


class _Object(list):
    """A JSON object's (key, value) pairs in order, as the C reader hands them over."""


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


_C_READER = json.JSONDecoder(object_pairs_hook=_Object, parse_float=_Number, parse_int=_Number,
                             parse_constant=_reject_constant)


def _nodes(value: Any) -> tuple:
    """A value of the C reader as a node without byte positions (-1: parse_json finds them when needed)."""
    if isinstance(value, str):
        return ("n" if type(value) is _Number else "s", -1, -1, value)
    if value is None:
        return ("z", -1, -1, None)
    if value is True or value is False:
        return ("b", -1, -1, value)
    if type(value) is _Object:
        return ("o", -1, -1, [(k, _nodes(v)) for k, v in value])
    return ("a", -1, -1, [_nodes(v) for v in value])


def parse_json_fast(data: bytes, codec: str | None = None) -> tuple | None:
    """The node tree of a JSON text read by Python's C JSON reader, without byte positions; None when only
    :func:`parse_json` can say what is wrong with it (or when it holds a backslash-u escape, which may stand for a
    NUL or a lone surrogate)."""
    if b"\\u" in data:
        return None
    try:
        return _nodes(_C_READER.decode(data.decode(codec or "utf-8")))
    except (ValueError, RecursionError):
        return None


_KIND_NAMES = {"s": "a string", "n": "a number", "b": "a boolean", "z": "null", "a": "an array", "o": "an object"}


def _fields(node: tuple, allowed: dict[str, str], what: str) -> dict[str, tuple]:
    """An object's members by key: each must be one of `allowed` (key -> kinds it may have), none twice."""
    if node[0] != "o":
        raise _Bad(node[1], f"{what} must be a JSON object, not {_KIND_NAMES[node[0]]}")
    out: dict[str, tuple] = {}
    for key, value in node[3]:
        if key in out:
            raise _Bad(value[1], f"{what} has the key {key!r} twice")
        kinds = allowed.get(key)
        if kinds is None:
            raise _Bad(value[1], f"{what} has an unexpected key {key!r}")
        if value[0] not in kinds:
            raise _Bad(value[1], f"{what}: {key!r} must be {' or '.join(_KIND_NAMES[k] for k in kinds)}, "
                                 f"not {_KIND_NAMES[value[0]]}")
        out[key] = value
    return out


_ACTION_HEAD = re.compile(rb'[ \t\n\r]*\{[ \t\n\r]*"action"[ \t\n\r]*:[ \t\n\r]*"([A-Z])"')
_LSN = re.compile(r"[0-9A-F]{1,8}/[0-9A-F]{1,8}")
_DIGITS = re.compile(r"[0-9]{1,10}")
_TIMESTAMPTZ = re.compile(r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?([+-])(\d\d)(?::(\d\d))?"
                          r"(?::(\d\d))?( BC)?")


def _lsn(node: tuple, what: str) -> int:
    m = _LSN.fullmatch(node[3])
    if m is None:
        raise _Bad(node[1], f"{what} {node[3]!r} is not an LSN (X/Y in hex)")
    hi, lo = node[3].split("/")
    return int(hi, 16) << 32 | int(lo, 16)


def _uint(node: tuple, what: str, limit: int) -> int:
    if _DIGITS.fullmatch(node[3]) is None or int(node[3]) > limit:
        raise _Bad(node[1], f"{what} {node[3]!r} is not a number from 0 to {limit}")
    return int(node[3])


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days from 1970-01-01 of a proleptic Gregorian date (any year)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _commit_time(node: tuple) -> int:
    """`timestamptz_to_str` text (ISO, the session's time zone) as µs since 2000-01-01 UTC."""
    m = _TIMESTAMPTZ.fullmatch(node[3])
    if m is None:
        raise _Bad(node[1], f"commit_time {node[3]!r} is not a timestamp with time zone")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if m.group(12):
        year = 1 - year
    frac = int((m.group(7) or "").ljust(6, "0"))
    zone = (int(m.group(9)) * 3600 + int(m.group(10) or 0) * 60 + int(m.group(11) or 0)) * \
        (-1 if m.group(8) == "-" else 1)
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 24 and minute <= 59 and second <= 60):
        raise _Bad(node[1], f"commit_time {node[3]!r} is not a timestamp with time zone")
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - zone
    return seconds * 1_000_000 + frac - PG_EPOCH_OFFSET_US


# ------------------------------------------------------------------------------------------------------------------
# values: the JSON that datum_to_json writes, back to the type's text output

_NUMERIC_OIDS = frozenset((20, 21, 23, 700, 701, 1700))
_BUILTIN_CATEGORIES: dict[int, tuple] = {16: ("bool",), 1082: ("date",), 1114: ("ts",), 1184: ("tstz",),
                                         114: ("json",), 3802: ("json",), 22: ("vector",), 30: ("vector",)}
_BOX = 603
_UNKNOWN = ("unknown",)
_ARRAY_SPECIAL = re.compile(r'[{}"\\ \t\n\r\v\f]')
_RECORD_SPECIAL = re.compile(r'[()",\\ \t\n\r\v\f]')


def _array_elements() -> dict[int, int]:
    from ..values.catalog import ARRAY_TYPES
    from ..values.sendtext import ARRAY_ELEMENTS

    return {**ARRAY_ELEMENTS, **ARRAY_TYPES}


def _quote_element(text: str | None, delim: str) -> str:
    if text is None:
        return "NULL"
    if text == "" or text.upper() == "NULL" or delim in text or _ARRAY_SPECIAL.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _quote_field(text: str | None) -> str:
    if text is None:
        return ""
    if text == "" or _RECORD_SPECIAL.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    return text


def _xsd_timestamp(text: str) -> str:
    """datum_to_json's XSD timestamp (``2024-01-02T03:04:05``) in timestamp_out's ISO form."""
    i = text.find("T")
    return text if i < 0 else text[:i] + " " + text[i + 1:]


#: PostgreSQL's MAXDIM: an array has at most this many dimensions
_MAXDIM = 6


def _deeper_than(node: tuple, limit: int) -> bool:
    """Whether JSON arrays nest in `node` more than `limit` deep (not counting arrays inside objects)."""
    level, depth = [node], 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [item for n in level for item in n[3] if item[0] == "a"]
    return False


def _xsd_zone(text: str) -> str:
    """datum_to_json's zone of whole hours (``+00:00``) as timestamptz_out prints it (``+00``); ``+05:30`` stays."""
    core, bc = (text[:-3], " BC") if text.endswith(" BC") else (text, "")
    if len(core) >= 6 and core[-6] in "+-" and core[-3:] == ":00" and core[-5:-3].isdigit():
        return core[:-3] + bc
    return text


class _Values:
    """Turns JSON values into the text the type's output function prints, by the JSON category of the type
    (PostgreSQL's json_categorize_type), with the column types from the type catalog."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self._categories: dict[int, tuple] = {}
        self._arrays = _array_elements()

    def category(self, oid: int, depth: int = 0) -> tuple:
        if oid in self._categories:
            return self._categories[oid]
        cat = self._resolve(oid, depth)
        self._categories[oid] = cat
        return cat

    def _resolve(self, oid: int, depth: int) -> tuple:
        if not oid or depth > 32:
            return _UNKNOWN
        if oid in _NUMERIC_OIDS:
            return ("num",)
        if oid in _BUILTIN_CATEGORIES:
            return _BUILTIN_CATEGORIES[oid]
        element = self._arrays.get(oid)
        if element is not None:
            return ("array", self.category(element, depth + 1), ";" if self._base(element) == _BOX else ",")
        info = self.catalog.type_info(oid) if self.catalog is not None and oid >= 10000 else None
        if info is None:
            return ("other",) if oid < 10000 else _UNKNOWN
        if info.typtype == "d":
            return self.category(info.base_oid, depth + 1)
        if info.category == "A" and info.element_oid:
            delim = ";" if self._base(info.element_oid) == _BOX else ","
            return ("array", self.category(info.element_oid, depth + 1), delim)
        if info.typtype == "c":
            fields = getattr(self.catalog, "composite_fields", lambda _oid: None)(oid)
            if not fields:
                return _UNKNOWN
            return ("composite", tuple(self.category(f, depth + 1) for f in fields))
        return ("other",)

    def _base(self, oid: int) -> int:
        for _ in range(32):
            info = self.catalog.type_info(oid) if self.catalog is not None and oid >= 10000 else None
            if info is None or info.typtype != "d":
                return oid
            oid = info.base_oid
        return oid

    def text(self, node: tuple, cat: tuple, data: bytes, codec: str | None) -> str | None:
        kind, c = node[0], cat[0]
        if kind == "z":
            return None
        if c == "json" or (c == "unknown" and (kind == "o" or (kind == "a" and _deeper_than(node, _MAXDIM)))):
            # json_out's text is written as it is, with its own leading and trailing whitespace: the plugins put
            # none of theirs around a value, so every space next to it is the value's
            start, end = node[1], node[2]
            if start < 0:
                raise _Bad(-1, "the text of a json value needs the message read with byte positions")
            while start > 0 and data[start - 1] in b" \t\n\r":
                start -= 1
            while end < len(data) and data[end] in b" \t\n\r":
                end += 1
            return data[start:end].decode(codec or "utf-8")
        if c == "bool" or (c == "unknown" and kind == "b"):
            if kind != "b":
                raise _Bad(node[1], f"a bool value must be JSON true or false, not {_KIND_NAMES[kind]}")
            return "t" if node[3] else "f"
        if c == "num":
            if kind not in "ns":
                raise _Bad(node[1], f"a number value must be a JSON number or string, not {_KIND_NAMES[kind]}")
            return node[3]
        if c == "array" or (c == "unknown" and kind == "a"):
            if kind != "a":
                raise _Bad(node[1], f"an array value must be a JSON array, not {_KIND_NAMES[kind]}")
            element, delim = (cat[1], cat[2]) if c == "array" else (_UNKNOWN, ",")
            return self._array(node, element, delim, data, codec)
        if c == "vector":
            # int2vector: [1,2] (numbers); oidvector: ["23","25"] (oid is printed as a string)
            if kind != "a" or any(item[0] not in "ns" for item in node[3]):
                raise _Bad(node[1], "an int2vector or oidvector value must be a JSON array of numbers or strings")
            return " ".join(item[3] for item in node[3])
        if c == "composite":
            if kind != "o":
                raise _Bad(node[1], f"a composite value must be a JSON object, not {_KIND_NAMES[kind]}")
            fields = cat[1]
            if len(node[3]) != len(fields):
                raise _Bad(node[1], f"a composite value of {len(fields)} fields arrived with {len(node[3])}")
            return "(" + ",".join(_quote_field(self.text(v, f, data, codec))
                                  for (_k, v), f in zip(node[3], fields)) + ")"
        if kind not in ("s", "n") or (kind == "n" and c != "unknown"):
            raise _Bad(node[1], f"a value of this type must be a JSON string, not {_KIND_NAMES[kind]} (a type "
                                "with a cast to json, which the JSON protocol uses instead of its text?)")
        if c == "ts":
            return _xsd_timestamp(node[3])
        if c == "tstz":
            return _xsd_zone(_xsd_timestamp(node[3]))
        return node[3]

    def _array(self, node: tuple, element: tuple, delim: str, data: bytes, codec: str | None) -> str:
        items = node[3]
        if _deeper_than(node, _MAXDIM):
            raise _Bad(node[1], f"an array value nested deeper than PostgreSQL's {_MAXDIM} dimensions")
        if element[0] != "json" and items and any(item[0] == "a" for item in items):
            if not all(item[0] == "a" for item in items):
                raise _Bad(node[1], "an array mixes sub-arrays and elements")
            return "{" + delim.join(self._array(item, element, delim, data, codec) for item in items) + "}"
        return "{" + delim.join(_quote_element(self.text(item, element, data, codec), delim) for item in items) + "}"


# ------------------------------------------------------------------------------------------------------------------
# the decoder

_START_KEYS = {"action": "s", "params": "o"}
_BEGIN_KEYS = {"action": "s", "has_catalog_changes": "s", "origin_id": "s", "xid": "s", "first_lsn": "s",
               "origin_lsn": "s", "commit_time": "s"}
_COMMIT_KEYS = {"action": "s", "final_lsn": "s", "end_lsn": "s"}
_CHANGE_KEYS = {"action": "s", "relation": "a", "oldtuple": "o", "newtuple": "o"}
_CHANGE_NAMES = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}


def _startup_params(node: tuple) -> dict[str, str]:
    params = {}
    for key, value in node[3]:
        if value[0] != "s":
            raise _Bad(value[1], f"startup parameter {key!r} must be a string, not {_KIND_NAMES[value[0]]}")
        if key in params:
            raise _Bad(value[1], f"startup parameter {key!r} is given twice")
        params[key] = value[3]
    return params


def parse_json_startup_message(payload: Any) -> dict[str, str]:
    """The parameters of a JSON startup message (``{"action":"S", "params": {...}}``); ProtocolError otherwise."""
    data = bytes(payload)
    try:
        fields = _fields(parse_json(data), _START_KEYS, "the startup message")
        if fields.get("action", (0, 0, 0, None))[3] != "S" or "params" not in fields:
            raise _Bad(0, 'the first message must be the startup message {"action":"S", "params": {...}}')
        return _startup_params(fields["params"])
    except _Bad as bad:
        raise _error(bad, "S", None) from None


def json_action(payload: Any) -> str:
    """The action letter a JSON message starts with ("S", "B", "I", ...); "" for the empty message after a BEGIN,
    "?" when it does not start like a message."""
    data = bytes(payload)
    if not data:
        return ""
    head = _ACTION_HEAD.match(data)
    return head.group(1).decode() if head else "?"


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _error(bad: _Bad, action: str | None, lsn: int | None) -> ProtocolError:
    where = f"'{action}' message" if action else "message"
    if lsn is not None:
        where += f" at LSN {_lsn_text(lsn)}"
    where += f", byte {bad.offset}"
    if bad.column is not None:
        where += f" of column {bad.column}" + (f' ("{bad.name}")' if bad.name is not None else "")
    return ProtocolError(f"bad JSON {where}: {bad.problem}", msg_type=action, offset=bad.offset, column=bad.column,
                         column_name=bad.name)


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
