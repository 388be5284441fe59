"""Column types: from a PostgreSQL type OID (and type modifier) to a value kind and its Arrow type.

Both decoder implementations ask `column_specs()` once per relation version and then decode every value of a
column with the kind it returns. The mapping:

| PostgreSQL | kind | Arrow |
|---|---|---|
| bool | BOOL | bool |
| int2, int4, int8, oid | INT2, INT4, INT8, OID | int16, int32, int64, uint32 |
| float4, float8 | FLOAT4, FLOAT8 | float32, float64 (NaN, ±Infinity kept) |
| numeric(p,s), p <= 38 | DECIMAL | decimal128(p, s) (negative scale s: decimal128(p-s, 0); s > p: decimal128(s, s)); NaN and ±Infinity, which decimal128 cannot hold: see below |
| numeric without typmod, or p > 38, or any numeric with `numeric="text"` | NUMERIC_TEXT | string, PostgreSQL's exact text (NaN, Infinity, -Infinity kept as text) |
| text, varchar, bpchar, name, citext, xml | TEXT | string |
| "char" | CHAR | string, PostgreSQL's text of the byte (byte 0: empty; 0x80-0xff: backslash and 3 octal digits) |
| json, jsonb | JSON, JSONB | string (jsonb binary format: version byte 1 dropped) |
| bytea | BYTEA | binary |
| date | DATE | date32 (±infinity: int32 max/min) |
| timestamp, timestamptz | TIMESTAMP, TIMESTAMPTZ | timestamp[us], timestamp[us, UTC] (±infinity: int64 max/min) |
| time | TIME | time64[us] |
| timetz | TIMETZ | string, PostgreSQL's exact text form (e.g. `04:05:06.5+05:30`) |
| interval | INTERVAL | month_day_nano_interval |
| uuid | UUID | fixed_size_binary(16) |
| enums | ENUM | dictionary<int32, string> |
| domains | their base type | |
| 1-D arrays of the above | ARRAY | list<element type> (lower bound 1: other bounds, like more dimensions, see below) |
| every other builtin type with a send format (spockwire.values.sendtext.RENDERED_TYPES: inet, cidr, macaddr(8), money, bit, varbit, ranges, multiranges, geometric types, tsvector, tsquery, pg_lsn, ...), arrays of them, composites, user ranges/multiranges over such types, domains over them | PGTEXT | string, PostgreSQL's text output: text values as they arrive, binary values rendered by `send_to_text` (the ColumnSpec's `render`) |
| aclitem (no send format: arrives as text, or as its internal datum) | PGTEXT | aclitemout's text `grantee=privileges/grantor`, role names from the catalog's `role_name(oid)` (an internal aclitem without such a catalog is an error) |
| anything else (types of extensions, composites holding them, reg* types) | OTHER | string from the text form; binary from the binary form |

PGTEXT binary values: the C implementation renders inet, cidr, macaddr, macaddr8, money, bit, varbit and the
int4/int8/date/timestamp/timestamptz ranges itself, and calls the column's `render` (Python, one call per value)
for the other types; the pure-Python twin calls `render` for all of them. Both give send_to_text's text and
refuse the same bytes.

Without type information (pglogical sends none and no catalog was given) columns are RAW: string when every
value arrived as valid UTF-8 text, binary otherwise — never guessed.

Lossless by default: a valid value its column's Arrow type cannot hold (`switches_to_text`: a multi-dimensional
array or a lower bound other than 1 in an ARRAY column, NaN/±Infinity in DECIMAL, a DATE/TIMESTAMP/TIMESTAMPTZ
outside the Arrow type's range such as a timestamp after 294247 AD, an INTERVAL whose microseconds overflow
month_day_nano's nanoseconds) makes the decoder switch that column to PGTEXT (`text_column_spec`: PostgreSQL's
exact text, binary values rendered by spockwire.values.sendtext) under a new version of the relation (version + 1,
the rows of the previous version closed first). It stays text for the rest of that relation version's life; the
next Relation message from the server starts a version typed from the declared types again. Failures of bytes that
are not a value of the type (INVALID, INVALID_UTF8, integers out of their type's range, ...) stay errors. The
decoder option `on_unrepresentable="error"` raises instead of switching. `column_types` overrides single columns
("schema.table.column" -> "text" for PGTEXT, "raw" for RAW) in every version.

Catalogs: pgoutput names every column's type OID, so only user-defined types need a catalog (enums, domains,
composites, user ranges, and arrays of them); pglogical and spock name none, so every column needs one.
`PostgresTypeCatalog(dsn)` reads `pg_type`/`pg_attribute`/`pg_range` over an ordinary connection and caches the
answers; `spockwire.connect()`, the ingest worker and the Spark source attach one for their DSN by default
(`strict=False`: an unreadable catalog leaves columns untyped with a warning instead of failing the stream).
It reads the catalog as it is when asked, not as it was when the change was written: a type altered between
the change and its decoding is described as it is now.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Protocol, Sequence

import pyarrow as pa

from ..errors import SpockwireError
from ..export.arrow import change_fields
from ..model import Relation
from . import sendtext
from .kinds import ARRAY, BOOL, BYTEA, CHAR, DATE, DECIMAL, ENUM, FLOAT4, FLOAT8, INT2, INT4, INT8, INTERVAL, JSON, \
    JSONB, KIND_NAMES, NUMERIC_TEXT, OID, OTHER, PGTEXT, RAW, TEXT, TIME, TIMESTAMP, TIMESTAMPTZ, TIMETZ, UUID, \
    ColumnSpec

__all__ = [
    "ColumnSpec", "column_specs", "TypeInfo", "TypeCatalog", "StaticTypeCatalog", "PostgresTypeCatalog",
    "BUILTIN_TYPES", "KIND_NAMES", "TypeCatalogError", "arrow_field_type", "arrow_schema",
]

# builtin type OID -> (name, kind); array type OID -> element OID
BUILTIN_TYPES: dict[int, tuple[str, int]] = {
    16: ("bool", BOOL), 17: ("bytea", BYTEA), 18: ("char", CHAR), 19: ("name", TEXT), 20: ("int8", INT8),
    21: ("int2", INT2), 23: ("int4", INT4), 25: ("text", TEXT), 26: ("oid", OID), 114: ("json", JSON),
    142: ("xml", TEXT), 700: ("float4", FLOAT4), 701: ("float8", FLOAT8), 1042: ("bpchar", TEXT),
    1043: ("varchar", TEXT), 1082: ("date", DATE), 1083: ("time", TIME), 1114: ("timestamp", TIMESTAMP),
    1184: ("timestamptz", TIMESTAMPTZ), 1186: ("interval", INTERVAL), 1266: ("timetz", TIMETZ),
    1700: ("numeric", DECIMAL), 2950: ("uuid", UUID), 3802: ("jsonb", JSONB),
}
ARRAY_TYPES: dict[int, int] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 1028: 26, 199: 114,
    143: 142, 1021: 700, 1022: 701, 1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184,
    1187: 1186, 1270: 1266, 1231: 1700, 2951: 2950, 3807: 3802,
}
_BY_NAME = {name: oid for oid, (name, _kind) in BUILTIN_TYPES.items()}
_BY_NAME.update({"_" + BUILTIN_TYPES[elem][0]: arr for arr, elem in ARRAY_TYPES.items()})
_BY_NAME.update({"boolean": 16, "smallint": 21, "integer": 23, "bigint": 20, "real": 700,
                 "double precision": 701, "character varying": 1043, "character": 1042,
                 "timestamp without time zone": 1114, "timestamp with time zone": 1184,
                 "time without time zone": 1083, "time with time zone": 1266, "decimal": 1700})

ACLITEM_OID = 1033

# bytes of the internal ('i') representation of by-value / fixed-length types that can be read safely
INTERNAL_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIMESTAMP: 8,
                  TIMESTAMPTZ: 8, TIME: 8, UUID: 16, CHAR: 1}


class TypeCatalogError(SpockwireError):
    """The upstream catalog could not be read, or does not describe a replicated relation."""


@dataclass(frozen=True)
class TypeInfo:
    """What a catalog knows of one type: enough to resolve domains, enums and arrays."""

    oid: int
    name: str
    typtype: str = "b"            # b base, d domain, e enum, c composite, r range, m multirange, p pseudo
    base_oid: int = 0             # domains: the underlying type
    base_typmod: int = -1         # domains: the underlying type's modifier
    element_oid: int = 0          # arrays: the element type
    category: str = ""            # pg_type.typcategory ('A' for arrays)
    subtype_oid: int = 0          # ranges: the subtype; multiranges: the range type


class TypeCatalog(Protocol):
    """Where column types come from when the stream does not carry them (pglogical) or to resolve user types."""

    def type_info(self, oid: int) -> TypeInfo | None: ...

    def column_types(self, relation: Relation) -> Sequence[tuple[int, int]] | None: ...


@dataclass
class StaticTypeCatalog:
    """Column types given by the user: `{"public.orders": {"id": "int8", "total": "numeric(12,2)"}}`.

    Type names are builtin names (`int4`, `numeric(12,2)`, `timestamptz`, `text[]`, ...); also accepted are
    `(oid, typmod)` pairs. Columns not listed stay untyped (RAW). `roles` names the roles of aclitem values.
    """

    tables: Mapping[str, Mapping[str, Any]]
    types: Mapping[int, TypeInfo] = field(default_factory=dict)
    roles: Mapping[int, str] = field(default_factory=dict)    # role OID -> name (aclitem's text)

    def type_info(self, oid: int) -> TypeInfo | None:
        return self.types.get(oid)

    def role_name(self, oid: int) -> str | None:
        return self.roles.get(oid)

    def column_types(self, relation: Relation) -> Sequence[tuple[int, int]] | None:
        table = self.tables.get(relation.qualified_name)
        if table is None:
            return None
        return [parse_type_name(table[c.name]) if c.name in table else (0, -1) for c in relation.columns]


def parse_type_name(spec: Any) -> tuple[int, int]:
    """`"numeric(12,2)"` -> (1700, typmod); `"int4[]"` -> (1007, -1); `(oid, typmod)` passes through."""
    if isinstance(spec, tuple):
        return int(spec[0]), int(spec[1])
    if isinstance(spec, int):
        return spec, -1
    text = str(spec).strip().lower()
    is_array = text.endswith("[]")
    if is_array:
        text = text[:-2].strip()
    typmod = -1
    if "(" in text and text.endswith(")"):
        base, args = text[:-1].split("(", 1)
        text = base.strip()
        nums = [int(a) for a in args.split(",")]
        if text in ("numeric", "decimal"):
            precision, scale = nums[0], (nums[1] if len(nums) > 1 else 0)
            typmod = ((precision << 16) | (scale & 0x7FF)) + 4
        elif text in ("varchar", "bpchar", "character varying", "character"):
            typmod = nums[0] + 4
        else:
            typmod = nums[0]
    oid = _BY_NAME.get(text)
    if oid is None:   # the builtin types kept as text (inet, money, int4range, ...)
        oid = {n: o for o, n in sendtext.TYPE_NAMES.items() if o not in (705, 2249)}.get(text)
    if oid is None:
        raise ValueError(f"unknown type name {spec!r}")
    if is_array:
        arrays = {elem: arr for arr, elem in ARRAY_TYPES.items()}
        arrays.update({elem: arr for arr, elem in sendtext.ARRAY_ELEMENTS.items() if elem not in arrays})
        oid = arrays[oid]
    return oid, typmod


class PostgresTypeCatalog:
    """Types loaded from the upstream catalog (`pg_attribute`, `pg_type`) over a normal connection, cached.

    The cache of a relation is keyed by its relation id and version, so a new Relation message (after DDL)
    reloads it. The connection is opened at the first question (for pgoutput only user-defined types ask one).

    `strict=False` (what `spockwire.connect()` and the ingest worker attach by default): when the catalog cannot
    be read (no ordinary connection allowed, server gone), a warning is logged and the columns it would have
    typed stay untyped, instead of the stream failing; it tries again at questions RETRY_SECONDS later.
    """

    RETRY_SECONDS = 30.0

    def __init__(self, dsn: str, *, connect: Callable[[str], Any] | None = None, strict: bool = True) -> None:
        self.dsn = dsn
        self.strict = strict
        self._failed_at: float | None = None
        self._connect = connect
        self._conn: Any = None
        self._types: dict[int, TypeInfo | None] = {}
        self._fields: dict[int, list[int] | None] = {}
        self._columns: dict[tuple[int, int], list[tuple[int, int]] | None] = {}
        self._roles: dict[int, str | None] = {}

    def _cursor(self) -> Any:
        if self._conn is None or getattr(self._conn, "closed", 0):
            try:
                if self._connect is not None:
                    self._conn = self._connect(self.dsn)
                else:
                    import psycopg2

                    self._conn = psycopg2.connect(self.dsn)
                    # the names read (types, enum labels, roles) in UTF-8, whatever the database's encoding; no
                    # other session setting changes what the catalog queries return
                    self._conn.set_client_encoding("UTF8")
                self._conn.autocommit = True
            except Exception as exc:  # noqa: BLE001 - any driver error is a catalog error here
                raise TypeCatalogError(f"cannot connect to the upstream catalog: {exc}") from exc
        return self._conn.cursor()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _unavailable(self, exc: Exception) -> None:
        if self.strict:
            raise exc if isinstance(exc, TypeCatalogError) else TypeCatalogError(
                f"cannot read the upstream catalog: {exc}")
        logging.getLogger("spockwire.values").warning(
            "the upstream type catalog cannot be read (%s): columns it would type stay untyped", exc)
        self._failed_at = time.monotonic()
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the connection is broken already
            self._conn = None

    def _resting(self) -> bool:
        return self._failed_at is not None and time.monotonic() - self._failed_at < self.RETRY_SECONDS

    def type_info(self, oid: int) -> TypeInfo | None:
        if self._resting():
            return self._types.get(oid)
        try:
            return self._type_info(oid)
        except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
            self._unavailable(exc)
            return None

    def column_types(self, relation: Relation) -> Sequence[tuple[int, int]] | None:
        if self._resting():
            return self._columns.get((relation.relid, relation.version))
        try:
            return self._column_types(relation)
        except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
            self._unavailable(exc)
            return None

    def role_name(self, oid: int) -> str | None:
        """The name of role `oid` (aclitem's text), None when there is no such role now. An unreadable catalog
        raises TypeCatalogError: a name cannot be left out of a value the way a type can stay untyped."""
        if oid not in self._roles:
            try:
                with self._cursor() as cur:
                    cur.execute("SELECT rolname FROM pg_roles WHERE oid = %s", (oid,))
                    row = cur.fetchone()
            except TypeCatalogError:
                raise
            except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
                raise TypeCatalogError(f"cannot read role {oid} from the upstream catalog: {exc}") from exc
            self._roles[oid] = None if row is None else row[0]
        return self._roles[oid]

    def role_names(self) -> dict[int, str]:
        """Every role's name by OID (what a recorded catalog keeps for aclitem values)."""
        try:
            with self._cursor() as cur:
                cur.execute("SELECT oid, rolname FROM pg_roles")
                return {int(oid): name for oid, name in cur.fetchall()}
        except TypeCatalogError:
            raise
        except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
            raise TypeCatalogError(f"cannot read the roles from the upstream catalog: {exc}") from exc

    def enum_labels(self, oid: int) -> list[str] | None:
        """The labels of enum type `oid` in their sort order (None when it is not an enum, or the catalog cannot
        be read)."""
        if self._resting():
            return None
        try:
            with self._cursor() as cur:
                cur.execute("SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder", (oid,))
                return [r[0] for r in cur.fetchall()] or None
        except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
            self._unavailable(exc)
            return None

    def composite_fields(self, oid: int) -> list[int] | None:
        """The field types of composite type `oid` (None when it is not one, or the catalog cannot be read)."""
        if oid not in self._fields:
            if self._resting():
                return None
            try:
                with self._cursor() as cur:
                    cur.execute("SELECT a.atttypid FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid "
                                "WHERE t.oid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (oid,))
                    self._fields[oid] = [int(r[0]) for r in cur.fetchall()] or None
            except Exception as exc:  # noqa: BLE001 - any driver error means the catalog is unavailable
                self._unavailable(exc)
                return None
        return self._fields[oid]

    def _type_info(self, oid: int) -> TypeInfo | None:
        if oid not in self._types:
            with self._cursor() as cur:
                cur.execute("SELECT t.oid, t.typname, t.typtype, t.typbasetype, t.typtypmod, t.typelem, "
                            "t.typcategory, COALESCE(r.rngsubtype, m.rngtypid, 0) FROM pg_type t "
                            "LEFT JOIN pg_range r ON r.rngtypid = t.oid "
                            "LEFT JOIN pg_range m ON m.rngmultitypid = t.oid WHERE t.oid = %s", (oid,))
                row = cur.fetchone()
            self._types[oid] = None if row is None else TypeInfo(int(row[0]), row[1], row[2], int(row[3]),
                                                                 int(row[4]), int(row[5]), row[6], int(row[7]))
        return self._types[oid]

    def _column_types(self, relation: Relation) -> Sequence[tuple[int, int]] | None:
        key = (relation.relid, relation.version)
        if key not in self._columns:
            with self._cursor() as cur:
                cur.execute("SELECT a.attname, a.atttypid, a.atttypmod FROM pg_attribute a "
                            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
                            (relation.namespace, relation.name))
                found = {name: (int(oid), int(typmod)) for name, oid, typmod in cur.fetchall()}
            if not found:
                self._columns[key] = None
            else:
                self._columns[key] = [found.get(c.name, (0, -1)) for c in relation.columns]
        return self._columns[key]


def _numeric_spec(typmod: int) -> ColumnSpec:
    if typmod < 4:
        return ColumnSpec(NUMERIC_TEXT, "numeric", pa.string())
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (((typmod - 4) & 0x7FF) ^ 1024) - 1024   # PostgreSQL 15: an 11-bit signed scale (-1000 .. 1000)
    name = f"numeric({precision},{scale})"
    if scale < 0:
        precision, scale = precision - scale, 0
    elif scale > precision:
        precision = scale
    if precision > 38 or precision < 1:
        return ColumnSpec(NUMERIC_TEXT, name, pa.string())
    return ColumnSpec(DECIMAL, name, pa.decimal128(precision, scale), precision, scale)


_SIMPLE_ARROW: dict[int, pa.DataType] = {
    BOOL: pa.bool_(), INT2: pa.int16(), INT4: pa.int32(), INT8: pa.int64(), OID: pa.uint32(),
    FLOAT4: pa.float32(), FLOAT8: pa.float64(), TEXT: pa.string(), JSON: pa.string(), JSONB: pa.string(),
    BYTEA: pa.binary(), DATE: pa.date32(), TIMESTAMP: pa.timestamp("us"), TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    TIME: pa.time64("us"), TIMETZ: pa.string(), INTERVAL: pa.month_day_nano_interval(), UUID: pa.binary(16),
    ENUM: pa.dictionary(pa.int32(), pa.string()), CHAR: pa.string(), PGTEXT: pa.string(),
}


def _text_spec(oid: int, name: str, catalog: TypeCatalog | None) -> ColumnSpec:
    """A column kept as PostgreSQL's text: binary values are rendered to it by send_to_text."""
    return ColumnSpec(PGTEXT, name, pa.string(), type_oid=oid,
                      render=partial(sendtext.send_to_text, oid, catalog=catalog))


def _builtin_spec(oid: int, typmod: int, numeric_text: bool = False) -> ColumnSpec | None:
    entry = BUILTIN_TYPES.get(oid)
    if entry is not None:
        name, kind = entry
        if kind == DECIMAL:
            return ColumnSpec(NUMERIC_TEXT, "numeric", pa.string()) if numeric_text else _numeric_spec(typmod)
        return ColumnSpec(kind, name, _SIMPLE_ARROW[kind])
    elem = ARRAY_TYPES.get(oid)
    if elem is not None:
        element = _builtin_spec(elem, typmod, numeric_text)
        return _array_spec(element)
    st = sendtext
    if oid in st.RENDERED_TYPES:
        return _text_spec(oid, st.TYPE_NAMES[oid], None)
    elem = st.ARRAY_ELEMENTS.get(oid)
    if elem is not None and elem in st.RENDERED_TYPES:
        return _text_spec(oid, st.TYPE_NAMES.get(elem, str(elem)) + "[]", None)
    return None


def _array_spec(element: ColumnSpec, array_oid: int = 0, catalog: TypeCatalog | None = None) -> ColumnSpec:
    if element.kind == PGTEXT and array_oid:
        # an array of a type kept as text is kept whole as its text, like the text format gives it
        return _text_spec(array_oid, element.type_name + "[]", catalog)
    if element.is_raw or element.kind == ARRAY:
        # no decoder for the elements: the whole value stays as it arrived (text -> string, binary -> binary)
        return ColumnSpec(OTHER, element.type_name + "[]", None)
    return ColumnSpec(ARRAY, element.type_name + "[]", pa.list_(element.arrow_type), element=element)


def _spec_for(oid: int, typmod: int, types: Mapping[int, tuple[str, str]], catalog: TypeCatalog | None,
              numeric_text: bool, depth: int = 0) -> ColumnSpec:
    if oid == 0:
        return ColumnSpec(RAW, "unknown", None)
    if oid == ACLITEM_OID:      # its text names roles: rendered with the catalog's role names
        return _text_spec(oid, "aclitem", catalog)
    spec = _builtin_spec(oid, typmod, numeric_text)
    if spec is not None:
        return spec
    if depth > 16:
        return ColumnSpec(OTHER, str(oid), None)
    info = catalog.type_info(oid) if catalog is not None else None
    if info is not None:
        if info.typtype == "d" and info.base_oid:
            return _spec_for(info.base_oid, info.base_typmod if info.base_typmod >= 0 else typmod, types,
                             catalog, numeric_text, depth + 1)
        if info.typtype == "e":
            return ColumnSpec(ENUM, info.name, _SIMPLE_ARROW[ENUM])
        if info.category == "A" and info.element_oid:
            return _array_spec(_spec_for(info.element_oid, typmod, types, catalog, numeric_text, depth + 1),
                               oid, catalog)
        if info.typtype in ("c", "r", "m") and sendtext.can_render(oid, catalog):
            return _text_spec(oid, info.name, catalog)
        return ColumnSpec(OTHER, info.name, None)
    described = types.get(oid)
    if described is not None:
        nsp, name = described
        # pgoutput names a domain by its base type (in pg_catalog, sent as "")
        if nsp in ("", "pg_catalog") and name in _BY_NAME:
            return _spec_for(_BY_NAME[name], typmod, types, catalog, numeric_text, depth + 1)
        rendered = {n: o for o, n in sendtext.TYPE_NAMES.items() if o not in (705, 2249)}
        if nsp in ("", "pg_catalog") and name in rendered:
            return _spec_for(rendered[name], typmod, types, catalog, numeric_text, depth + 1)
        return ColumnSpec(OTHER, f"{nsp}.{name}" if nsp else name, None)
    return ColumnSpec(OTHER, str(oid), None)


#: what a column_types override may ask for: PostgreSQL's text form of every value, or the values as sent
COLUMN_TYPE_CHOICES = ("text", "raw")

# failures of valid values that the column's Arrow type cannot hold (spockwire.values.failures)
_MULTIDIMENSIONAL, _SPECIAL_DECIMAL, _OUT_OF_RANGE, _LOWER_BOUND = 3, 4, 5, 9
_RANGED = (DATE, TIMESTAMP, TIMESTAMPTZ, INTERVAL)


def check_column_types(column_types: Mapping[str, str] | None) -> dict[str, str]:
    """Validate a column_types mapping ("schema.table.column" -> "text" | "raw") and return a copy."""
    out: dict[str, str] = {}
    for key, value in (column_types or {}).items():
        if not isinstance(key, str) or key.count(".") < 2:
            raise ValueError(f"column_types key {key!r} is not 'schema.table.column'")
        if value not in COLUMN_TYPE_CHOICES:
            raise ValueError(f"column_types[{key!r}] must be one of {', '.join(map(repr, COLUMN_TYPE_CHOICES))}, "
                             f"got {value!r}")
        out[key] = value
    return out


def parse_column_types(text: str) -> dict[str, str]:
    """``schema.table.column=TYPE[,...]`` (TYPE: text or raw) as a column_types mapping (CLI, Spark options)."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        key, sep, value = item.rpartition("=")
        if not sep:
            raise ValueError(f"expected schema.table.column=TYPE, got {item!r}")
        out[key.strip()] = value.strip()
    return check_column_types(out)


def switches_to_text(code: int, spec: ColumnSpec) -> bool:
    """Whether a failure is a valid PostgreSQL value that the column's Arrow type cannot hold (a multi-dimensional
    array or a lower bound other than 1 in a list column, NaN or ±Infinity in decimal128, a date, timestamp or
    interval outside the Arrow type's range) -- rather than bytes that are not a value of the type."""
    base = spec.element if spec.kind == ARRAY and spec.element is not None else spec
    if code in (_MULTIDIMENSIONAL, _LOWER_BOUND):
        return spec.kind == ARRAY
    if code == _SPECIAL_DECIMAL:
        return base.kind == DECIMAL
    if code == _OUT_OF_RANGE:
        return base.kind in _RANGED
    return False


def _column_pairs(relation: Relation, catalog: TypeCatalog | None) -> Sequence[tuple[int, int]] | None:
    if all(c.type_oid is not None for c in relation.columns):
        return [(c.type_oid or 0, c.type_modifier if c.type_modifier is not None else -1) for c in relation.columns]
    if catalog is not None:
        return catalog.column_types(relation)
    return None


def _text_oid(oid: int, types: Mapping[int, tuple[str, str]]) -> int:
    """The type whose send format a column's binary values have: pgoutput describes a domain by its base type."""
    described = types.get(oid)
    if oid not in BUILTIN_TYPES and oid not in ARRAY_TYPES and described is not None \
            and described[0] in ("", "pg_catalog") and described[1] in _BY_NAME:
        return _BY_NAME[described[1]]
    return oid


def text_column_spec(relation: Relation, column: int, types: Mapping[int, tuple[str, str]],
                     catalog: TypeCatalog | None) -> ColumnSpec:
    """The spec of a column kept as PostgreSQL's text: text values as they arrive, binary values rendered by
    spockwire.values.sendtext (a column whose type is not known renders no binary value: NO_TEXT_FORM)."""
    pairs = _column_pairs(relation, catalog)
    oid, typmod = pairs[column] if pairs is not None and column < len(pairs) else (0, -1)
    if oid == 0:
        return _text_spec(0, "unknown", None)        # renders no binary value (NO_TEXT_FORM)
    return _text_spec(_text_oid(oid, types), _spec_for(oid, typmod, types, catalog, False).type_name, catalog)


def column_specs(relation: Relation, types: Mapping[int, tuple[str, str]], catalog: TypeCatalog | None,
                 typed: bool, numeric: str = "decimal",
                 column_types: Mapping[str, str] | None = None) -> tuple[ColumnSpec, ...]:
    """The decoding plan of one relation version (one ColumnSpec per column).

    `numeric="decimal"` decodes numeric(p,s), p <= 38, as decimal128; `numeric="text"` decodes every numeric as
    its exact PostgreSQL text. `column_types` ("schema.table.column" -> "text" | "raw") overrides single
    columns: "text" keeps PostgreSQL's text of every value, "raw" the values as sent (string for UTF-8 text,
    binary otherwise), whatever `typed` says for the others.
    """
    n = len(relation.columns)
    specs = list(_declared_specs(relation, types, catalog, typed, numeric))
    if column_types:
        prefix = f"{relation.namespace}.{relation.name}."
        for i, col in enumerate(relation.columns):
            choice = column_types.get(prefix + col.name)
            if choice == "text":
                specs[i] = text_column_spec(relation, i, types, catalog)
            elif choice == "raw":
                specs[i] = ColumnSpec(RAW, "raw", None)
    return tuple(specs)


def _declared_specs(relation: Relation, types: Mapping[int, tuple[str, str]], catalog: TypeCatalog | None,
                    typed: bool, numeric: str) -> tuple[ColumnSpec, ...]:
    n = len(relation.columns)
    if not typed:
        return tuple(ColumnSpec(RAW, "raw", None) for _ in range(n))
    pairs = _column_pairs(relation, catalog)
    if pairs is None:
        return tuple(ColumnSpec(RAW, "unknown", None) for _ in range(n))
    if len(pairs) != n:
        raise TypeCatalogError(f"the type catalog gave {len(pairs)} column types for {relation.qualified_name}, "
                               f"which has {n} replicated columns")
    return tuple(_spec_for(oid, typmod, types, catalog, numeric == "text") for oid, typmod in pairs)


def arrow_field_type(spec: ColumnSpec, binary: bool = False) -> pa.DataType:
    """The Arrow type of a column decoded with `spec`. RAW and OTHER columns hold what arrives: string from a
    text stream, binary from a binary one (`binary`)."""
    if spec.arrow_type is not None:
        return spec.arrow_type
    return pa.binary() if binary else pa.string()


def arrow_schema(relation: Relation, catalog: TypeCatalog | None = None, *, typed: bool = True,
                 binary: bool = False, numeric: str = "decimal", column_types: Mapping[str, str] | None = None,
                 types: Mapping[int, tuple[str, str]] | None = None) -> pa.Schema:
    """The Arrow schema of the decoder's batches of `relation` (change columns, then the table's columns), as
    the decoder built with the same options types them before any row arrives: from the type OIDs and
    modifiers (or `catalog`), exactly as `column_specs` plans the decoding."""
    specs = column_specs(relation, types or {}, catalog, typed, numeric, column_types)
    fields = [pa.field(c.name, arrow_field_type(spec, binary)) for c, spec in zip(relation.columns, specs)]
    return pa.schema(change_fields() + fields)
