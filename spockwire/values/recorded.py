"""A type catalog recorded beside a capture, so that decoding it offline gives exactly the live values.

A live stream types user-defined columns (composites, enums, domains, user ranges, arrays of them) and every
pglogical/spock column through the upstream catalog (`PostgresTypeCatalog`). A frame file decoded later, away from
that database, has no catalog to ask. `spockwire capture` therefore records, in the frame file's JSON header
(``"type_catalog"``), what the decoder will ask about the relations the stream described:

* the column types of each table whose relation messages name none (pglogical and spock);
* every type that is not builtin to spockwire's decoders, with what resolves it: a domain's base type and
  modifier, an array's element type, a range's subtype, a multirange's range type, a composite's field types,
  an enum's labels -- recursively, so a composite of an array of a domain over an enum is complete;
* the role names, when an aclitem column is replicated (aclitem's text names roles).

``RecordedTypeCatalog.from_frame_header(header)`` reads it back; `decode`, `inspect`, ``spockwire main``, and Spark's
``decode_frame_file`` attach it by themselves, and ``Decoder(protocol, type_catalog=...)`` takes it like any
catalog. The recorded catalog answers as the upstream catalog did while the capture ran (the live decode reads
the catalog at that time too).

JSON form (``version`` 1)::

    {"version": 1,
     "types": [{"oid": 16390, "name": "mood", "typtype": "e", "labels": ["sad", "ok"]},
               {"oid": 16401, "name": "comp", "typtype": "c", "fields": [23, 25, 16390]}, ...],
     "tables": {"public.orders": {"id": [23, -1], "total": [1700, 655366]}},
     "roles": {"10": "postgres"}}

A type entry holds every `TypeInfo` field (`oid`, `name`, `typtype`, `base_oid`, `base_typmod`, `element_oid`,
`category`, `subtype_oid`; defaults may be left out) and `fields` (composites) or `labels` (enums).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields as dc_fields
from typing import Any, Iterable, Mapping, Sequence

from ..model import Relation
from . import sendtext
from .catalog import ACLITEM_OID, ARRAY_TYPES, BUILTIN_TYPES, TypeCatalogError, TypeInfo

__all__ = ["RecordedTypeCatalog", "FORMAT_VERSION", "HEADER_KEY"]

FORMAT_VERSION = 1
#: the frame-file header key that holds the recorded catalog
HEADER_KEY = "type_catalog"

_ACLITEM_ARRAY_OID = 1034
_MAX_DEPTH = 32
_INFO_FIELDS = tuple(f.name for f in dc_fields(TypeInfo))
_INFO_DEFAULTS = {f.name: f.default for f in dc_fields(TypeInfo) if f.name not in ("oid", "name")}


def _is_builtin(oid: int) -> bool:
    """Types the decoders know without a catalog (no question is asked about them)."""
    if oid in BUILTIN_TYPES or oid in ARRAY_TYPES:
        return True
    if oid in sendtext.RENDERED_TYPES:
        return True
    element = sendtext.ARRAY_ELEMENTS.get(oid)
    return element is not None and (element in sendtext.RENDERED_TYPES or element in BUILTIN_TYPES)


@dataclass
class RecordedTypeCatalog:
    """The types, table column types and role names a capture's stream needs, held in memory.

    Implements the catalog protocol the decoders ask (`type_info`, `column_types`, `composite_fields`,
    `role_name`), plus `enum_labels`. Build one from a live catalog with `record(source, relations)`, store it
    with `to_json()`, read it back with `from_json()` / `from_frame_header()`.
    """

    types: dict[int, TypeInfo] = field(default_factory=dict)
    fields: dict[int, list[int]] = field(default_factory=dict)       # composite oid -> field type oids
    labels: dict[int, list[str]] = field(default_factory=dict)       # enum oid -> labels in sort order
    tables: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    has_roles: bool = False                                           # the role names were recorded

    # the catalog protocol -----------------------------------------------------------------------------------
    def type_info(self, oid: int) -> TypeInfo | None:
        return self.types.get(oid)

    def composite_fields(self, oid: int) -> list[int] | None:
        return self.fields.get(oid)

    def enum_labels(self, oid: int) -> list[str] | None:
        return self.labels.get(oid)

    def role_name(self, oid: int) -> str | None:
        if not self.has_roles:
            raise TypeCatalogError(f"the recorded type catalog holds no role names (role {oid}): the capture "
                                   f"replicated no aclitem column when it recorded its catalog")
        return self.roles.get(oid)

    def column_types(self, relation: Relation) -> Sequence[tuple[int, int]] | None:
        table = self.tables.get(relation.qualified_name)
        if table is None:
            return None
        return [table.get(c.name, (0, -1)) for c in relation.columns]

    # recording ----------------------------------------------------------------------------------------------
    def record(self, source: Any, relations: Iterable[Relation]) -> bool:
        """Add what decoding `relations` asks of a catalog, read from `source` (a live catalog such as
        PostgresTypeCatalog). Returns whether anything was added."""
        before = self._size()
        for relation in relations:
            if all(c.type_oid is not None for c in relation.columns):
                oids = [c.type_oid or 0 for c in relation.columns]
            else:
                pairs = source.column_types(relation)
                if pairs is None:
                    continue
                self.tables[relation.qualified_name] = {
                    c.name: (int(oid), int(typmod)) for c, (oid, typmod) in zip(relation.columns, pairs)}
                oids = [int(oid) for oid, _typmod in pairs]
            for oid in oids:
                self._record_type(source, oid, 0)
        return self._size() != before

    def _size(self) -> tuple[int, ...]:
        return (len(self.types), len(self.fields), len(self.labels), len(self.roles), int(self.has_roles),
                sum(len(t) for t in self.tables.values()), len(self.tables))

    def _record_type(self, source: Any, oid: int, depth: int) -> None:
        if oid == 0 or oid in self.types or depth > _MAX_DEPTH:
            return
        if oid in (ACLITEM_OID, _ACLITEM_ARRAY_OID):
            if not self.has_roles:
                self.roles = dict(source.role_names())
                self.has_roles = True
            return
        if _is_builtin(oid):
            return
        info = source.type_info(oid)
        if info is None:
            return
        self.types[oid] = info
        for child in (info.base_oid, info.element_oid, info.subtype_oid):
            if child:
                self._record_type(source, child, depth + 1)
        if info.typtype == "c":
            fields = source.composite_fields(oid)
            if fields is not None:
                self.fields[oid] = [int(f) for f in fields]
                for child in fields:
                    self._record_type(source, int(child), depth + 1)
        elif info.typtype == "e":
            labels = source.enum_labels(oid)
            if labels is not None:
                self.labels[oid] = list(labels)

    # JSON ---------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        types = []
        for oid in sorted(self.types):
            info = self.types[oid]
            entry: dict[str, Any] = {"oid": info.oid, "name": info.name}
            entry.update({k: getattr(info, k) for k, default in _INFO_DEFAULTS.items()
                          if getattr(info, k) != default})
            if oid in self.fields:
                entry["fields"] = self.fields[oid]
            if oid in self.labels:
                entry["labels"] = self.labels[oid]
            types.append(entry)
        out: dict[str, Any] = {"version": FORMAT_VERSION, "types": types,
                               "tables": {t: {c: list(p) for c, p in cols.items()}
                                          for t, cols in sorted(self.tables.items())}}
        if self.has_roles:
            out["roles"] = {str(oid): name for oid, name in sorted(self.roles.items())}
        return out

    @classmethod
    def from_json(cls, obj: Any, *, source: str = "type catalog") -> "RecordedTypeCatalog":
        """Read the JSON form back; anything malformed is a TypeCatalogError naming where."""
        def bad(where: str, what: str) -> TypeCatalogError:
            return TypeCatalogError(f"{source}: {where}: {what}")

        if not isinstance(obj, Mapping):
            raise bad("top level", f"expected an object, got {type(obj).__name__}")
        if obj.get("version") != FORMAT_VERSION:
            raise bad("version", f"unsupported version {obj.get('version')!r} (this reader knows {FORMAT_VERSION})")
        out = cls()
        types = obj.get("types", [])
        if not isinstance(types, list):
            raise bad("types", "expected a list")
        for i, entry in enumerate(types):
            where = f"types[{i}]"
            if not isinstance(entry, Mapping):
                raise bad(where, "expected an object")
            unknown = set(entry) - set(_INFO_FIELDS) - {"fields", "labels"}
            if unknown:
                raise bad(where, f"unknown keys {sorted(unknown)}")
            values = {**_INFO_DEFAULTS, **{k: entry[k] for k in _INFO_FIELDS if k in entry}}
            for key in ("oid", "base_oid", "base_typmod", "element_oid", "subtype_oid"):
                if type(values.get(key)) is not int:
                    raise bad(f"{where}.{key}", f"expected an integer, got {values.get(key)!r}")
            for key in ("name", "typtype", "category"):
                if not isinstance(values.get(key), str):
                    raise bad(f"{where}.{key}", f"expected a string, got {values.get(key)!r}")
            info = TypeInfo(**values)
            if info.oid in out.types:
                raise bad(f"{where}.oid", f"type {info.oid} is described twice")
            out.types[info.oid] = info
            if "fields" in entry:
                fields = entry["fields"]
                if not isinstance(fields, list) or not all(type(f) is int for f in fields):
                    raise bad(f"{where}.fields", "expected a list of type OIDs")
                out.fields[info.oid] = list(fields)
            if "labels" in entry:
                labels = entry["labels"]
                if not isinstance(labels, list) or not all(isinstance(s, str) for s in labels):
                    raise bad(f"{where}.labels", "expected a list of strings")
                out.labels[info.oid] = list(labels)
        tables = obj.get("tables", {})
        if not isinstance(tables, Mapping):
            raise bad("tables", "expected an object")
        for name, cols in tables.items():
            if not isinstance(cols, Mapping):
                raise bad(f"tables[{name!r}]", "expected an object")
            parsed: dict[str, tuple[int, int]] = {}
            for col, pair in cols.items():
                if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)):
                    raise bad(f"tables[{name!r}][{col!r}]", f"expected [type oid, typmod], got {pair!r}")
                parsed[col] = (pair[0], pair[1])
            out.tables[name] = parsed
        if "roles" in obj:
            roles = obj["roles"]
            if not isinstance(roles, Mapping):
                raise bad("roles", "expected an object")
            for key, name in roles.items():
                if not (isinstance(key, str) and key.isdigit() and isinstance(name, str)):
                    raise bad(f"roles[{key!r}]", "expected a role OID (digits) mapped to a name")
                out.roles[int(key)] = name
            out.has_roles = True
        return out

    @classmethod
    def from_frame_header(cls, header: Mapping[str, Any], *,
                          source: str = "frame file") -> "RecordedTypeCatalog | None":
        """The catalog a frame file's header recorded, or None when it recorded none."""
        obj = header.get(HEADER_KEY)
        return None if obj is None else cls.from_json(obj, source=f"{source}: {HEADER_KEY}")
