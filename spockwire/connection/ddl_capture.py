"""DDL capture: where in the stream each ALTER TABLE happened, and what it did to the table's columns.

A Relation message shows a table's new columns, not how they came to be: a rename looks like a drop and an add,
and a column added with a default, or a volatile one, sends no change for the rows already there. With the
capture installed (once, by a superuser: :func:`install`, ``spockwire ddl-capture --dsn ...``), every ALTER TABLE
writes a transactional logical message (``pg_logical_emit_message``, prefix :data:`PREFIX`) in its own
transaction, so the stream carries it at the exact place the change happened (pgoutput sends it with its
``messages`` option). Its content is JSON:

``{"table": "schema.name", "relid": oid, "rewritten": bool, "statement": the client's statement text,
"columns": [[name, type oid, type modifier, is key, has missing value, has default, generated or identity], ...]}``

`columns` lists the table's columns after the statement, in order (dropped ones left out), the key flags as pgoutput
sets them (the replica identity's columns, all of them under REPLICA IDENTITY FULL); `rewritten` says whether the
statement rewrote the table (a volatile default, a type change, ...; PostgreSQL's ``table_rewrite`` event).
The pipeline job reads them (spockwire.spark.schema_changes): a column added without a default, a column renamed
or dropped, and a column widened without ``USING`` are applied to the Delta table in place; whatever else is read
again.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["PREFIX", "install", "uninstall", "installed", "parse_message", "INSTALL_SQL", "UNINSTALL_SQL"]

#: the logical message prefix of a captured DDL statement
PREFIX = "spockwire.ddl"

_SCHEMA = "spockwire_ddl"

INSTALL_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {_SCHEMA};

CREATE OR REPLACE FUNCTION {_SCHEMA}.table_columns(rel oid) RETURNS json LANGUAGE sql STABLE AS $f$
    SELECT coalesce(json_agg(json_build_array(
               a.attname, a.atttypid::bigint, a.atttypmod,
               c.relreplident = 'f' OR coalesce(a.attnum = ANY (i.indkey::int2[]), false),
               a.atthasmissing, a.atthasdef, a.attgenerated <> '' OR a.attidentity <> '')
           ORDER BY a.attnum), '[]'::json)
      FROM pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN LATERAL (SELECT x.indkey FROM pg_index x WHERE x.indrelid = a.attrelid AND
           ((c.relreplident = 'd' AND x.indisprimary) OR (c.relreplident = 'i' AND x.indisreplident)) LIMIT 1) i
        ON true
     WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
$f$;

CREATE OR REPLACE FUNCTION {_SCHEMA}.table_rewrite() RETURNS event_trigger LANGUAGE plpgsql AS $f$
BEGIN
    -- remembered for the statement's ddl_command_end (same transaction)
    PERFORM set_config('spockwire_ddl.rewritten',
                       coalesce(current_setting('spockwire_ddl.rewritten', true), '') || ','
                       || pg_event_trigger_table_rewrite_oid()::text, true);
END
$f$;

CREATE OR REPLACE FUNCTION {_SCHEMA}.ddl_command_end() RETURNS event_trigger LANGUAGE plpgsql AS $f$
DECLARE
    r record;
    rewritten text := coalesce(current_setting('spockwire_ddl.rewritten', true), '');
BEGIN
    FOR r IN SELECT DISTINCT e.objid, c.relkind
               FROM pg_event_trigger_ddl_commands() e JOIN pg_class c ON c.oid = e.objid
              WHERE e.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p')
    LOOP
        PERFORM pg_logical_emit_message(true, '{PREFIX}', json_build_object(
            'table', (SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE c.oid = r.objid),
            'relid', r.objid::bigint,
            'rewritten', (',' || rewritten || ',') LIKE ('%,' || r.objid::text || ',%'),
            'statement', current_query(),
            'columns', {_SCHEMA}.table_columns(r.objid))::text);
    END LOOP;
    PERFORM set_config('spockwire_ddl.rewritten', '', true);
END
$f$;

DROP EVENT TRIGGER IF EXISTS spockwire_ddl_rewrite;
CREATE EVENT TRIGGER spockwire_ddl_rewrite ON table_rewrite EXECUTE FUNCTION {_SCHEMA}.table_rewrite();
DROP EVENT TRIGGER IF EXISTS spockwire_ddl_end;
CREATE EVENT TRIGGER spockwire_ddl_end ON ddl_command_end WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION {_SCHEMA}.ddl_command_end();
"""

UNINSTALL_SQL = f"""
DROP EVENT TRIGGER IF EXISTS spockwire_ddl_end;
DROP EVENT TRIGGER IF EXISTS spockwire_ddl_rewrite;
DROP SCHEMA IF EXISTS {_SCHEMA} CASCADE;
"""


def _run(dsn: str, sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def install(dsn: str) -> None:
    """Install the capture in the database of `dsn` (needs a superuser: event triggers); idempotent."""
    _run(dsn, INSTALL_SQL)


def uninstall(dsn: str) -> None:
    """Remove the capture from the database of `dsn`."""
    _run(dsn, UNINSTALL_SQL)


def installed(cur: Any) -> bool:
    """Whether the capture's event trigger is installed and enabled in the cursor's database."""
    cur.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname = 'spockwire_ddl_end' AND evtenabled <> 'D'")
    return bool(cur.fetchone()[0])


def parse_message(content: bytes) -> dict:
    """The content of a captured DDL message."""
    return json.loads(bytes(content).decode())
