"""The values of the JSON protocol (``proto_format=json``), as PostgreSQL's ``datum_to_json`` writes them, back to
the text the type's output function prints (:class:`_Values`), so that the native decoder's text kernels read them
as they read a native text stream. The nodes are those of :mod:`spockwire.wire.json_messages`.
"""
from __future__ import annotations

import re
from typing import Any

from .json_messages import _KIND_NAMES, _Bad

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

