"""test_decoding as a live oracle: read a second slot of the same cluster and put its rows in the shapes the live
tests compare against (PostgreSQL 18 has no wal2json; the parsing is tests/oracles.py's)."""
from __future__ import annotations

from typing import Any

from tests.oracles import UNCHANGED_TOAST, changes_of, group_transactions, parse_lsn


def test_decoding_rows(db: Any, slot: str, *options: str) -> list[tuple[int, str]]:
    """(lsn, data) of every row a test_decoding slot has now (peeked: the slot does not move). `options` are
    extra option name/value pairs, e.g. ``"only-local", "1"``."""
    args = ["include-xids", "1", "skip-empty-xacts", "1", *options]
    placeholders = ", ".join(["%s"] * len(args))
    rows = db.query(f"SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {placeholders})",
                    (slot, *args))
    return [(parse_lsn(lsn), data) for lsn, data in rows]


def committed_changes(db: Any, slot: str, *options: str) -> list[dict[str, Any]]:
    """The changes that committed, in commit order (see tests/oracles.changes_of)."""
    return changes_of(group_transactions(test_decoding_rows(db, slot, *options)))


def as_type_text(value: Any, typ: str) -> Any:
    """A test_decoding value as the type's own text output (test_decoding prints booleans as true/false)."""
    if typ == "boolean" and value in ("true", "false"):
        return "t" if value == "true" else "f"
    return value


def oracle_items(db: Any, slot: str, full_tables=("public.full_t",), *options: str) -> tuple[list, list]:
    """Row changes and messages of a test_decoding slot in the shape of test_connection_pg's wal2json oracle:
    ``(action, "schema.table", sorted (column, text) pairs)``, ``("U-old", ...)`` for the old row of an UPDATE
    under REPLICA IDENTITY FULL, ``("T", table)`` per truncated table; messages ``(transactional, prefix,
    content)``. Unchanged TOAST columns and NULLs of old rows are left out."""
    items: list = []
    messages: list = []
    for change in committed_changes(db, slot, *options):
        action = change["action"]
        if action == "message":
            messages.append((change["transactional"], change["prefix"], change["content"].decode()))
            continue
        if action == "truncate":
            items += [("T", table) for table in change["tables"] if table.startswith("public.")]
            continue
        table = change["table"]
        if not table.startswith("public."):
            continue
        types = change.get("types") or {}

        def text(cols: dict, drop_null: bool) -> tuple:
            return tuple(sorted((k, as_type_text(v, types.get(k, ""))) for k, v in cols.items()
                                if v is not UNCHANGED_TOAST and not (drop_null and v is None)))

        if action == "insert":
            items.append(("I", table, text(change["new"], False)))
        elif action == "delete":
            items.append(("D", table, text(change["old"] or {}, True)))
        else:
            if table in full_tables and change["old"] is not None:
                items.append(("U-old", table, text(change["old"], True)))
            items.append(("U", table, text(change["new"], False)))
    return items, sorted(messages)
