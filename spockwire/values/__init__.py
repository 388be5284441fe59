"""Typed values: PostgreSQL types mapped to Arrow types, and the value decoders both implementations share.

See `spockwire.values.catalog` for the mapping table and the type catalogs (`PostgresTypeCatalog` reads the
upstream catalog; `StaticTypeCatalog` takes types from the user; `RecordedTypeCatalog` is what `spockwire capture`
records beside the frames, for decoding offline). `send_to_text(type_oid, raw)` gives
PostgreSQL's text output of a value in its binary send format (spockwire.values.sendtext).
"""
from .catalog import ColumnSpec, PostgresTypeCatalog, StaticTypeCatalog, TypeCatalog, TypeCatalogError, \
    TypeInfo, column_specs
from .recorded import RecordedTypeCatalog
from .sendtext import send_to_text

__all__ = ["ColumnSpec", "PostgresTypeCatalog", "RecordedTypeCatalog", "StaticTypeCatalog", "TypeCatalog",
           "TypeCatalogError", "TypeInfo", "column_specs", "send_to_text"]
