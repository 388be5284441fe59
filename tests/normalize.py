"""Drained decoder events as plain, comparable Python data."""
from __future__ import annotations

__all__ = ["plain_events", "changes", "nontransactional", "relation_data", "check_ordering", "batch_rows",
           "check_batch_schema", "string_columns", "CHANGE_COLUMNS"]


def _table(relation) -> str:
    return f"{relation.namespace}.{relation.name}"


def _kind(event) -> str:
    if hasattr(event, "to_arrow"):
        return "batch"
    if hasattr(event, "restart_identity"):
        return "truncate"
    if hasattr(event, "prefix") and hasattr(event, "content"):
        return "message"
    raise TypeError(f"unknown event {event!r}")


def _truncate(event) -> dict:
    return {"kind": "truncate", "tables": [_table(r) for r in event.relations], "cascade": bool(event.cascade),
            "restart_identity": bool(event.restart_identity), "commit_lsn": event.commit_lsn,
            "commit_ts": event.commit_ts, "xid": event.xid, "seq": event.seq, "origin": event.origin}


def _message(event) -> dict:
    return {"kind": "message", "prefix": event.prefix, "content": bytes(event.content),
            "transactional": bool(event.transactional), "lsn": event.lsn, "xid": event.xid,
            "commit_lsn": event.commit_lsn, "commit_ts": event.commit_ts, "seq": event.seq, "origin": event.origin}


def batch_rows(batch) -> list[dict]:
    """Rows as Python values; ChangeBatch.to_pylist keeps values outside datetime's range as text."""
    return batch.to_pylist()


def plain_events(events) -> list:
    """Batches -> {"table", "version", "rows"}; truncates and messages -> dicts."""
    out = []
    for event in events:
        kind = _kind(event)
        if kind == "batch":
            out.append({"table": _table(event.relation), "version": event.relation.version,
                        "rows": batch_rows(event)})
        elif kind == "truncate":
            out.append(_truncate(event))
        else:
            out.append(_message(event))
    return out


def changes(events) -> list[dict]:
    """Every transactional item (row, truncate, transactional message) as one flat dict, in (commit_lsn, seq) order.

    Rows become {"kind": "row", "table", "version", <the batch row>}; independent of how the decoder cut batches."""
    items = []
    for event in events:
        kind = _kind(event)
        if kind == "batch":
            head = {"kind": "row", "table": _table(event.relation), "version": event.relation.version}
            items.extend(dict(head, **row) for row in batch_rows(event))
        elif kind == "truncate":
            items.append(_truncate(event))
        elif event.transactional:
            items.append(_message(event))
    items.sort(key=_order_key)
    return items


def _order_key(item: dict):
    if item["kind"] == "row":
        return item["_commit_lsn"], item["_seq"]
    return item["commit_lsn"], item["seq"]


def nontransactional(events) -> list[dict]:
    """Non-transactional logical messages, in event order."""
    return [_message(e) for e in events if _kind(e) == "message" and not e.transactional]


def relation_data(relation) -> dict:
    return {"relid": relation.relid, "namespace": relation.namespace, "name": relation.name,
            "replica_identity": relation.replica_identity, "version": relation.version,
            "columns": [(c.name, c.type_oid, c.type_modifier, bool(c.is_key)) for c in relation.columns]}


def check_ordering(events) -> None:
    """The ordering contract: rows of a batch in (commit_lsn, seq) order; a table's batches and truncates never
    overtake each other. (A batch may hold rows of several commits, so batches of different tables are free.)"""
    per_table: dict[str, tuple] = {}
    for event in events:
        kind = _kind(event)
        if kind == "message":
            continue
        if kind == "batch":
            rows = batch_rows(event)
            keys = [(r["_commit_lsn"], r["_seq"]) for r in rows]
            assert keys == sorted(keys) and len(set(keys)) == len(keys), keys
            tables = [_table(event.relation)]
            first, last = keys[0], keys[-1]
        else:
            tables = [_table(r) for r in event.relations]
            first = last = (event.commit_lsn, event.seq)
        for table in tables:
            if table in per_table:
                assert first > per_table[table], f"{table}: {first} overtakes {per_table[table]}"
            per_table[table] = last


CHANGE_COLUMNS = ("_change_type", "_commit_lsn", "_commit_ts", "_xid", "_seq", "_origin", "_unchanged_toast")


def check_batch_schema(batch) -> None:
    """The change columns with their Arrow types, then the relation's columns, each `string` or `binary`."""
    import pyarrow as pa

    record = batch.to_arrow()
    schema = record.schema
    expected_names = list(CHANGE_COLUMNS) + [c.name for c in batch.relation.columns]
    assert schema.names == expected_names, (schema.names, expected_names)
    assert batch.num_rows == record.num_rows
    assert schema.field("_change_type").type == pa.string()
    assert schema.field("_commit_lsn").type == pa.uint64()
    assert schema.field("_commit_ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("_xid").type == pa.uint32()
    assert schema.field("_seq").type == pa.int64()
    assert schema.field("_origin").type == pa.string()
    assert pa.types.is_list(schema.field("_unchanged_toast").type)
    assert schema.field("_unchanged_toast").type.value_type == pa.string()
    for col in batch.relation.columns:
        assert schema.field(col.name).type in (pa.string(), pa.binary()), (col.name, schema.field(col.name).type)


def string_columns(batch) -> set[str]:
    """The table columns of a batch that are Arrow `string` (the others are `binary`)."""
    import pyarrow as pa

    schema = batch.to_arrow().schema
    return {c.name for c in batch.relation.columns if schema.field(c.name).type == pa.string()}


def values_as_bytes(items: list[dict]) -> list[dict]:
    """Table-column values with text turned into its UTF-8 bytes (for comparisons across batch boundaries)."""
    out = []
    for item in items:
        if item.get("kind") == "row":
            item = {k: (v.encode() if isinstance(v, str) and not k.startswith("_") and k not in ("kind", "table")
                        else v) for k, v in item.items()}
        out.append(item)
    return out


def check_text_columns(events, expected: list[dict]) -> None:
    """Each batch column is `string` exactly when none of the batch's expected values for it is bytes.

    `expected` lists rows as the model wrote them: str for values that arrived as 't', bytes for 'b'/'i'."""
    by_key = {(e["_commit_lsn"], e["_seq"]): e for e in expected if e["kind"] == "row"}
    for event in events:
        if _kind(event) != "batch":
            continue
        nontext = set()
        for row in batch_rows(event):
            want = by_key[(row["_commit_lsn"], row["_seq"])]
            nontext |= {c.name for c in event.relation.columns if isinstance(want.get(c.name), bytes)}
        names = {c.name for c in event.relation.columns}
        assert string_columns(event) == names - nontext, (event.relation.name, string_columns(event), nontext)
