"""The Spark source's schema comes from the values catalog (the one mapping of PostgreSQL types to Arrow types),
and equals what the decoder really produces for a table holding every builtin type (tests/test_types_live.py's
type table) on a real server, text and binary; the spockwire.spark modules import each other one way."""
from __future__ import annotations

import ast
import pathlib

import pyarrow as pa
import pytest

import spockwire.spark as sws
from spockwire.connection.slots import parse_lsn
from spockwire.spark.schema import read_table_relation, table_arrow_schema
from spockwire.spark.slot import SlotSpec, read_range
from spockwire.values import PostgresTypeCatalog
from tests.test_types_live import COLUMNS, SCHEMA

SPARK_DIR = pathlib.Path(sws.__file__).parent


def _unit(module: str) -> str:
    """The resolution's modules (resolve.py, resolve_frame.py, resolve_sequential.py) are one unit, `resolve`."""
    return "resolve" if module.startswith("resolve_") else module


def _imports(path: pathlib.Path) -> set[str]:
    """The spockwire.spark modules a module imports (relative imports inside the package), by unit."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(_unit(node.module.split(".")[0]))
            else:
                found.update(_unit(a.name) for a in node.names)
    return found - {_unit(path.stem)}


def test_spark_modules_import_one_way():
    """data source -> its readers (source_reader) -> readers (slot, staging, frame files, snapshot, batch files) ->
    conform (schema) ; apply -> targets (Delta, Arrow, the Delta read-ahead; the keyless apply; the check of a Delta
    table's features) -> resolve, and apply -> schema; the Delta targets -> the files held between batches
    (file_rows). No cycle, the data source is imported by nobody, and the conform layer, the resolution and the
    files held import no module of the package."""
    graph: dict[str, set[str]] = {}
    for p in SPARK_DIR.glob("*.py"):
        if p.stem != "__init__":
            graph.setdefault(_unit(p.stem), set()).update(_imports(p))
    assert graph["schema"] == set()
    assert graph["resolve"] == set()
    assert graph["arrow_target"] <= {"resolve"}
    assert graph["file_rows"] == set()
    assert graph["delta_rewrite"] <= {"arrow_target", "file_rows"}
    assert graph["delta_target"] <= {"resolve", "arrow_target", "delta_rewrite", "file_rows"}
    assert graph["read_ahead"] <= {"delta_rewrite", "delta_target"}
    assert graph["apply"] <= {"schema", "resolve", "arrow_target", "delta_target", "read_ahead", "environment",
                              "keyless", "delta_features"}
    assert graph["keyless"] <= {"schema", "resolve", "arrow_target", "delta_rewrite", "delta_target",
                                "delta_features"}
    assert graph["delta_features"] <= {"delta_target"}
    assert graph["batch_files"] <= {"schema", "manifest"}
    assert all("datasource" not in deps for name, deps in graph.items())
    # the data source itself loads no reader until Spark asks for one (its planning processes stay small)
    assert graph["datasource"] <= {"manifest", "source_options", "source_reader", "slot"}   # slot: in annotations
    assert graph["manifest"] == set()
    assert graph["source_options"] <= {"slot"}
    assert graph["source_reader"] <= {"slot", "snapshot", "batch_files", "schema", "source_options", "memory"}
    assert graph["memory"] == set()
    readers = {"slot", "staging", "distributed", "snapshot"} & set(graph)
    for reader in readers:
        assert graph[reader] <= readers | {"schema"}, (reader, graph[reader])
    # acyclic
    state: dict[str, int] = {}

    def visit(node: str, trail: tuple) -> None:
        assert state.get(node) != 1, f"import cycle: {' -> '.join(trail + (node,))}"
        if state.get(node) == 2:
            return
        state[node] = 1
        for dep in graph.get(node, ()):
            visit(dep, trail + (node,))
        state[node] = 2

    for name in graph:
        visit(name, ())
    # no encoder of the wire format inside the schema code
    assert "struct.pack" not in (SPARK_DIR / "schema.py").read_text()


@pytest.mark.pg
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_catalog_schema_equals_the_decoded_batches(pg_db, binary):
    pg_db.execute(SCHEMA)
    pg_db.execute("CREATE TABLE everything (id int PRIMARY KEY, "
                  + ", ".join(f"{name} {typ}" for name, typ, _a, _b in COLUMNS) + ")")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE everything")
    slot = f"{pg_db.name}_{'b' if binary else 't'}"[:63]
    start = parse_lsn(pg_db.query("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                                  (slot,))[0][0])
    pg_db.execute("INSERT INTO everything (id) VALUES (3)")
    # row 1 of the type table, but for the 2-D array (a value the list type cannot hold: the column switches to
    # text under a new relation version, by design)
    values = [("NULL" if name == "c_a2_int4range" else a) for name, _t, a, _b in COLUMNS]
    pg_db.execute(f"INSERT INTO everything VALUES (1, {', '.join(values)})")
    end = parse_lsn(pg_db.query("SELECT pg_current_wal_flush_lsn()::text")[0][0])

    spec = SlotSpec(dsn=pg_db.dsn, slot=slot, publication=("pub",), binary=binary)
    batches = [b for _t, b in read_range(spec, start, end, ["public.everything"])]
    assert sum(b.num_rows for b in batches) == 2
    conn = pg_db.connect()
    try:
        with conn.cursor() as cur:
            relation = read_table_relation(cur, "public.everything")
    finally:
        conn.close()
    expected = table_arrow_schema(relation, PostgresTypeCatalog(pg_db.dsn), binary=binary)
    for batch in batches:
        assert batch.schema.metadata[b"spockwire.relation_version"] == b"1"
        got = pa.schema([pa.field(f.name, f.type) for f in batch.schema])
        want = pa.schema([pa.field(f.name, f.type) for f in expected])
        mismatched = {f.name: (f.type, want.field(f.name).type) for f in got if f.type != want.field(f.name).type}
        assert mismatched == {}
        assert got.names == want.names
