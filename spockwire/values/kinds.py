"""Value kinds: how a column's values are decoded (the Cython decoder uses the same numbers), and `ColumnSpec`,
the plan of one column that `spockwire.values.catalog.column_specs` makes and both implementations follow."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["ColumnSpec", "KIND_NAMES", "RAW", "BOOL", "INT2", "INT4", "INT8", "OID", "FLOAT4", "FLOAT8", "DECIMAL",
           "NUMERIC_TEXT", "TEXT", "JSON", "JSONB", "BYTEA", "DATE", "TIMESTAMP", "TIMESTAMPTZ", "TIME", "TIMETZ",
           "INTERVAL", "UUID", "ENUM", "ARRAY", "OTHER", "CHAR", "PGTEXT"]

RAW, BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8, DECIMAL, NUMERIC_TEXT, TEXT, JSON, JSONB, BYTEA, DATE, \
    TIMESTAMP, TIMESTAMPTZ, TIME, TIMETZ, INTERVAL, UUID, ENUM, ARRAY, OTHER, CHAR = range(25)
# a type kept as PostgreSQL's text form: text values as they arrive, binary values rendered to the same text
# (spockwire.values.sendtext)
PGTEXT = 25

KIND_NAMES = ("raw", "bool", "int2", "int4", "int8", "oid", "float4", "float8", "numeric", "numeric", "text",
              "json", "jsonb", "bytea", "date", "timestamp", "timestamptz", "time", "timetz", "interval", "uuid",
              "enum", "array", "other", "char", "pgtext")


@dataclass(frozen=True)
class ColumnSpec:
    """How one column's values are decoded: kind, Arrow type and the parameters the kind needs."""

    kind: int
    type_name: str
    arrow_type: pa.DataType | None          # None for RAW/OTHER: string or binary depending on what arrives
    precision: int = 0
    scale: int = 0
    element: "ColumnSpec | None" = None
    type_oid: int = 0                       # PGTEXT: the type whose binary values `render` turns into text
    render: Any = field(default=None, compare=False, repr=False)   # PGTEXT: bytes -> str (send_to_text)

    @property
    def is_raw(self) -> bool:
        return self.kind in (RAW, OTHER)
