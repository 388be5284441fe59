"""Typed values: PostgreSQL types mapped to Arrow types, and the value decoders both implementations share.

See `spockwire.values.catalog` for the mapping table and the type catalogs (`PostgresTypeCatalog` reads the
upstream catalog; `StaticTypeCatalog` takes types from the user).
"""
from .catalog import ColumnSpec, PostgresTypeCatalog, StaticTypeCatalog, TypeCatalog, TypeCatalogError, \
    TypeInfo, column_specs

__all__ = ["ColumnSpec", "PostgresTypeCatalog", "StaticTypeCatalog", "TypeCatalog", "TypeCatalogError",
           "TypeInfo", "column_specs"]
