"""Reading one message of the JSON protocol of pglogical 2 and Spock 6 (``proto_format=json``).

Each message is one JSON object (docs/protocols.md, "The JSON protocol"), read strictly into a tree of nodes: by
Python's C JSON reader when it can (without byte positions), else by a reader of its own that keeps the byte offset
of every value, for errors and for json values, whose exact text matters. This module also holds the members each
action may carry, the forms of the LSN, number and commit time fields, the startup message, and the ProtocolError
that a problem at a byte of a message becomes. :mod:`spockwire.wire.json_values` turns the values into their text
forms and :mod:`spockwire.wire.json_protocol` the messages into native ones.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..errors import ProtocolError
from ..model import PG_EPOCH_OFFSET_US
from .encodings import encoding_name

__all__ = ["parse_json", "parse_json_fast", "parse_json_startup_message", "json_action"]

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
# the messages: the members of each action, the startup message, the error a problem becomes

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

