"""test_decoding as a live oracle: read a second slot of the same cluster and put its rows in the shapes the live
tests compare against (PostgreSQL 18 has no wal2json; the parsing is tests/oracles.py's); and `ours()`, the decoded
events of a live stream in the same shapes."""
from __future__ import annotations

import decimal
import struct
from typing import Any, Collection

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


def as_text(value: Any, typ: str) -> Any:
    """A decoded value (typed, text, or binary send bytes) as PostgreSQL's text output."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (int, decimal.Decimal)):
        return str(value)
    if typ == "integer":
        return str(struct.unpack(">i", value)[0])
    if typ == "bigint":
        return str(struct.unpack(">q", value)[0])
    if typ == "boolean":
        return "t" if value == b"\x01" else "f"
    return value.decode("utf-8")


_KINDS = {"insert": "I", "update_postimage": "U", "delete": "D", "update_preimage": "U-old"}


def ours(events: Any, types: dict, full_tables: Collection[str] | None = None) -> tuple[list, list]:
    """(row changes and truncates in commit order, sorted messages) of decoded events, in the shape of the oracles
    (`oracle_items` here, test_connection_pg's wal2json reading): ``(kind, "schema.table", sorted (column, text)
    pairs)`` with kind I / U / D / U-old, ``("T", table)``; messages ``(transactional, prefix, content)``, the
    content as text when it is UTF-8. Only tables of schema public; unchanged TOAST columns and NULLs of old rows
    are left out. `types`: {(schema, table): {column: type name}} (test_connection_pg.column_types).

    The old row of an UPDATE (U-old) is kept for REPLICA IDENTITY FULL tables only: the relation's replica identity
    tells (pgoutput, pglogical), or - Spock's 'R' does not carry it - `full_tables` names them ("schema.table")."""
    items: list = []
    messages: list = []
    for ev in events:
        if hasattr(ev, "to_arrow"):
            rel = ev.relation
            if rel.namespace != "public":
                continue
            name = f"{rel.namespace}.{rel.name}"
            full = rel.replica_identity == "f" if full_tables is None else name in full_tables
            typ = types[(rel.namespace, rel.name)]
            for row in ev.to_arrow().to_pylist():
                toast = set(row["_unchanged_toast"] or ())
                vals = {c.name: as_text(row[c.name], typ[c.name]) for c in rel.columns if c.name not in toast}
                kind = _KINDS[row["_change_type"]]
                if kind == "U-old" and not full:
                    continue
                if kind in ("D", "U-old"):
                    vals = {k: v for k, v in vals.items() if v is not None}
                items.append(((row["_commit_lsn"], row["_seq"]), (kind, name, tuple(sorted(vals.items())))))
        elif hasattr(ev, "restart_identity"):
            for i, rel in enumerate(ev.relations):
                items.append(((ev.commit_lsn, ev.seq, i), ("T", f"{rel.namespace}.{rel.name}")))
        else:
            content = bytes(ev.content)
            try:
                text: Any = content.decode()
            except UnicodeDecodeError:
                text = content
            messages.append((bool(ev.transactional), ev.prefix, text))
    items.sort(key=lambda x: x[0])
    return [i[1] for i in items], sorted(messages)
