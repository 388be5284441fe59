"""The plan of a table read: which columns, which tables COPY reads, cut into which block ranges.

A partitioned table is read through its leaf partitions (``pg_partition_tree``), their rows presented as the
parent's: the parent's columns, by name, in the parent's order. With several workers every leaf larger than
``2 * MIN_CHUNK_PAGES`` pages is cut into about ``CHUNKS_PER_WORKER * workers`` block ranges (``ctid >= '(a,0)'
AND ctid < '(b,0)'``: TID range scans, PostgreSQL 14 and later; older servers read each leaf whole). The plan is
read inside the reading transaction, so it sees the tables as the snapshot does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import SpockwireError
from ..model import Column, Relation

__all__ = ["SnapshotReadError", "TableChunk", "TablePlan", "plan_table", "MIN_CHUNK_PAGES", "CHUNKS_PER_WORKER"]

#: smallest block range a leaf is cut into when several workers read it (8 MB with 8 kB blocks)
MIN_CHUNK_PAGES = 1024
#: ctid ranges per worker a large table is cut into (so that the workers finish close together)
CHUNKS_PER_WORKER = 4


class SnapshotReadError(SpockwireError):
    """A table cannot be read as asked (unknown table or column, bad option, a worker failed)."""


@dataclass(frozen=True)
class TableChunk:
    """One COPY of a read: a leaf table (its SQL name) and a block range of it (None: from the start / to the end)."""

    leaf: str
    leaf_oid: int
    first_page: int | None = None
    stop_page: int | None = None
    relkind: str = "r"


@dataclass
class TablePlan:
    """What a read COPYs: `relation` (the table and the columns read, as the decoder describes them), the leaf
    tables (oid, SQL name), the chunks, and the ``pg_class.reltuples`` estimate of the rows."""

    relation: Relation
    select_list: str
    partitioned: bool
    server_version: int
    leaves: list[tuple[int, str]] = field(default_factory=list)
    chunks: list[TableChunk] = field(default_factory=list)
    estimated_rows: int = 0

    @property
    def table(self) -> str:
        return self.relation.qualified_name

    def query(self, chunk: TableChunk, where: str | None = None) -> str:
        """The COPY statement of one chunk (`where`: an extra SQL condition)."""
        conds = []
        if chunk.first_page is not None and chunk.first_page > 0:
            conds.append(f"ctid >= '({chunk.first_page},0)'::tid")
        if chunk.stop_page is not None:
            conds.append(f"ctid < '({chunk.stop_page},0)'::tid")
        if where:
            conds.append(f"({where})")
        if not conds and chunk.relkind == "r":
            return f"COPY {chunk.leaf} ({self.select_list}) TO STDOUT (FORMAT binary)"
        condition = f" WHERE {' AND '.join(conds)}" if conds else ""
        return f"COPY (SELECT {self.select_list} FROM ONLY {chunk.leaf}{condition}) TO STDOUT (FORMAT binary)"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def plan_table(execute: Callable[..., list[tuple]], table: str | tuple[str, str], columns: Sequence[str] | None,
               workers: int) -> TablePlan:
    """The plan of reading `table` with `workers` connections; `execute(sql, params)` runs a query (rows)."""
    name = f"{quote_ident(table[0])}.{quote_ident(table[1])}" if isinstance(table, tuple) else str(table)
    rows = execute("SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident FROM pg_class c "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (name,))
    if not rows:
        raise SnapshotReadError(f"no table {name!r}")
    oid, nspname, relname, relkind, replident = rows[0]
    if relkind not in ("r", "p", "m", "f"):
        raise SnapshotReadError(f"{nspname}.{relname} is not a table (relkind {relkind!r})")
    attrs = execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attgenerated, "
        "COALESCE(a.attnum = ANY(i.indkey), false) FROM pg_attribute a "
        "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (oid,))
    by_name = {r[0]: r for r in attrs}
    if columns is None:
        # generated columns are not part of what logical replication sends by default: not read either unless named
        chosen = [r for r in attrs if not r[3]]
    else:
        chosen = []
        for col in columns:
            if col not in by_name:
                raise SnapshotReadError(f"{nspname}.{relname} has no column {col!r}")
            chosen.append(by_name[col])
        if len({c[0] for c in chosen}) != len(chosen):
            raise SnapshotReadError(f"columns names a column twice: {list(columns)}")
    if not chosen:
        raise SnapshotReadError(f"no columns to read from {nspname}.{relname}")
    relation = Relation(int(oid), nspname, relname,
                        tuple(Column(r[0], int(r[1]), int(r[2]), bool(r[4])) for r in chosen),
                        replident if replident in ("d", "n", "f", "i") else None, 1)
    if relkind == "p":
        leaves = execute(
            "SELECT t.relid::oid, t.relid::regclass::text, c.relkind, c.reltuples, "
            "pg_relation_size(t.relid), current_setting('block_size')::int "
            "FROM pg_partition_tree(%s) t JOIN pg_class c ON c.oid = t.relid "
            "WHERE t.isleaf ORDER BY t.relid::regclass::text", (oid,))
    else:
        leaves = execute(
            "SELECT c.oid, c.oid::regclass::text, c.relkind, c.reltuples, "
            "CASE WHEN c.relkind IN ('r', 'm') THEN pg_relation_size(c.oid) ELSE 0 END, "
            "current_setting('block_size')::int FROM pg_class c WHERE c.oid = %s", (oid,))
    plan = TablePlan(relation, ", ".join(quote_ident(r[0]) for r in chosen), relkind == "p",
                     int(execute("SHOW server_version_num")[0][0]))
    plan.leaves = [(int(r[0]), r[1]) for r in leaves]
    plan.estimated_rows = int(sum(max(float(r[3]), 0.0) for r in leaves))
    ranges = plan.server_version >= 140000 and workers > 1
    total_pages = sum(int(r[4]) // max(int(r[5]), 1) for r in leaves)
    step = max(MIN_CHUNK_PAGES, -(-total_pages // (workers * CHUNKS_PER_WORKER)))
    for leaf_oid, leaf, kind, _tuples, size, block in leaves:
        pages = int(size) // max(int(block), 1)
        if not ranges or kind not in ("r", "m") or pages < 2 * MIN_CHUNK_PAGES:
            plan.chunks.append(TableChunk(leaf, int(leaf_oid), relkind=kind))
            continue
        start = 0
        while start < pages:
            stop = start + step
            # the last range is open-ended: a row the snapshot sees never lies past the size seen now, but the
            # plan must not depend on that
            plan.chunks.append(TableChunk(leaf, int(leaf_oid), start, None if stop >= pages else stop, kind))
            start = stop
    return plan
