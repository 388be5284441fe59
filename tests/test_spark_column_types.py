"""The Spark source's decoder options against a real PostgreSQL and a real local Spark: `columnTypes` overrides
single columns (their Spark type is string from the schema on, the value the server's ::text), and
`onUnrepresentable=error` makes a value the column's type cannot hold fail the read."""
from __future__ import annotations

import pytest

from tests.spark_session import spark_session

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def spark():
    return spark_session()


@pytest.mark.parametrize("binary", ["false", "true"])
def test_column_types_option(spark, pg_db, binary):
    slot = f"{pg_db.name}_s1"[:63]
    pg_db.execute("CREATE TABLE grid (id int PRIMARY KEY, cells int[], amount numeric(10,2), at timestamp)")
    pg_db.execute("CREATE PUBLICATION pub FOR TABLE grid")
    pg_db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    pg_db.execute("INSERT INTO grid VALUES (1, '{{1,2},{3,4}}', 'NaN', '294270-01-01 00:00:00'), "
                  "(2, '[0:1]={5,6}', 2.50, '2024-01-01 00:00:00')")
    text = {r[0]: r[1:] for r in pg_db.query("SELECT id, cells::text, amount::text, at::text FROM grid")}

    def reader():
        return (spark.read.format("spockwire").option("dsn", pg_db.dsn).option("slot", slot)
                .option("publication", "pub").option("table", "public.grid").option("binary", binary))

    df = reader().option("columnTypes", "public.grid.cells=text,public.grid.amount=text,public.grid.at=text").load()
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert [types[c] for c in ("cells", "amount", "at")] == ["string"] * 3
    rows = {r["id"]: (r["cells"], r["amount"], r["at"]) for r in df.collect()}
    assert rows == text
    strict = reader().option("columnTypes", "public.grid.amount=text,public.grid.at=text") \
        .option("onUnrepresentable", "error").load()
    with pytest.raises(Exception, match="multi-dimensional"):
        strict.collect()
