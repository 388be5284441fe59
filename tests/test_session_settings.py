"""Session settings a database sets for its sessions (DateStyle, IntervalStyle, extra_float_digits, TimeZone,
lc_monetary, bytea_output) and its encoding (LATIN1) change nothing in what spockwire delivers.

The same rows are written to a database with the server's defaults, to one whose sessions default to settings that
change the text forms of values (`ALTER DATABASE ... SET`), and to a LATIN1 database with those settings too. Each
is read through `connect()` (replication and SQL transports, text and binary values) and the Spark source; both
decoder implementations decode every stream (a twin decoder compares them message batch by message batch). The
values must be the same in every database, and the text values the very strings that were inserted.
"""
from __future__ import annotations

import time

import pytest

from spockwire.connection import connect, create_slot
from spockwire.connection.session import SESSION_SETTINGS, pinned_kwargs, session_options
from spockwire.connection.slots import drop_slot
from tests.conftest import load_impl

pytestmark = pytest.mark.pg

HOSTILE = {"DateStyle": "SQL, DMY", "IntervalStyle": "sql_standard", "extra_float_digits": "0",
           "TimeZone": "Asia/Kolkata", "lc_monetary": "C.utf8", "bytea_output": "escape"}

TEXTS = ["café crème", "ÿ ñ ß Ø ½ «»", "plain"]

SCHEMA = """
CREATE TABLE v (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, iv interval, f4 real, f8 float8,
                m money, b bytea, t text, r tstzrange, ta text[], "nämé" varchar(20));
"""
ROWS = f"""
INSERT INTO v VALUES
 (1, '2024-03-04', '2024-03-04 05:06:07.123456', '2024-03-04 05:06:07.123456+00',
  '1 year 2 mons 3 days 04:05:06.789', 0.1, 0.1, 1234.56, '\\x00ff10'::bytea, '{TEXTS[0]}',
  '[2024-03-04 05:06:07+00,2024-03-05 00:00:00+00)', ARRAY['{TEXTS[1]}', 'a b'], '{TEXTS[0]}'),
 (2, '1999-12-31', '1999-12-31 23:59:59', '1999-12-31 23:59:59.5-08', '-1 days +02:00:00.000001',
  3.4028235e38, 1.7976931348623157e308, -0.01, '\\x'::bytea, '{TEXTS[1]}', 'empty', '{{}}', 'x'),
 (3, '0044-03-15', '2000-02-29 12:00:00', '2000-02-29 12:00:00+05:30', '-1 mons -2 days -00:00:03',
  1.17549435e-38, 2.2250738585072014e-308, 0, '\\x5c27'::bytea, '{TEXTS[2]}',
  '(,2024-01-01 00:00:00+00]', NULL, NULL)
"""


class TwinDecoder:
    """Feeds every batch of frames to the C and the Python decoder; hands out the C events and keeps what the
    Python decoder made of the same frames (compared by the test)."""

    def __init__(self, protocol: str, **kwargs) -> None:
        self.c = load_impl("c").Decoder(protocol, **kwargs)
        self.py = load_impl("python").Decoder(protocol, **kwargs)
        self.mismatches: list = []

    def feed_frames(self, data, partial_ok=False):
        n = self.c.feed_frames(data)
        assert self.py.feed_frames(data) == n
        return n

    def drain(self):
        ce, pe = self.c.drain(), self.py.drain()
        if [_rows(e) for e in ce] != [_rows(e) for e in pe]:
            self.mismatches.append(([_rows(e) for e in ce], [_rows(e) for e in pe]))
        return ce

    def __getattr__(self, name):
        return getattr(self.c, name)


def _rows(event) -> list:
    if hasattr(event, "to_arrow"):
        return [{k: v for k, v in row.items() if not k.startswith("_") or k == "_change_type"}
                for row in event.to_arrow().to_pylist()]
    return [repr(event)]


def _make_db(cluster, *, hostile: bool, latin1: bool) -> str:
    name = cluster.new_database_name("latin1" if latin1 else ("odd" if hostile else "plain"))
    if latin1:
        cluster.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    else:
        cluster.create_database(name)
    if hostile:
        for key, value in HOSTILE.items():
            cluster.execute(f"ALTER DATABASE {name} SET {key} = '{value}'")
    dsn = cluster.dsn(name)
    import psycopg2

    # a plain connection (no pinned settings): the database's own defaults are in force while the rows are written
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    conn.set_client_encoding("UTF8")
    with conn.cursor() as cur:
        if hostile:
            cur.execute("SHOW IntervalStyle")  # (psycopg2 itself sets DateStyle's ISO part on plain connections)
            assert cur.fetchone()[0] == "sql_standard"
        cur.execute(SCHEMA)
        cur.execute("CREATE PUBLICATION pub FOR TABLE v")
        cur.execute("CREATE EXTENSION pglogical")
        cur.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (dsn,))
        cur.execute("SELECT pglogical.replication_set_add_table('default', 'v')")
    conn.close()
    for slot in SLOTS:
        create_slot(dsn, f"{name}_{slot}"[:63], "pglogical" if slot.startswith("gl") else "pgoutput")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    conn.set_client_encoding("UTF8")
    with conn.cursor() as cur:
        cur.execute(ROWS)
    conn.close()
    return name


# slot suffix -> (plugin, transport, binary)
SLOTS = {"po_r_t": ("pgoutput", "replication", False), "po_s_t": ("pgoutput", "sql", False),
         "po_r_b": ("pgoutput", "replication", True), "po_s_b": ("pgoutput", "sql", True),
         "gl_r_t": ("pglogical", "replication", False), "gl_s_t": ("pglogical", "sql", False),
         "gl_r_b": ("pglogical", "replication", True), "spark": ("pgoutput", None, False)}


@pytest.fixture(scope="module")
def databases(pg_cluster):
    made = {kind: _make_db(pg_cluster, hostile=kind != "plain", latin1=kind == "latin1")
            for kind in ("plain", "odd", "latin1")}
    yield made
    for name in made.values():
        for slot in SLOTS:
            try:
                drop_slot(pg_cluster.dsn(name), f"{name}_{slot}"[:63])
            except Exception:  # noqa: BLE001 - cleanup only
                pass


def _stream_rows(cluster, db: str, suffix: str) -> list:
    plugin, transport, binary = SLOTS[suffix]
    twins: list[TwinDecoder] = []

    def factory(protocol):
        from spockwire.values import PostgresTypeCatalog

        twins.append(TwinDecoder(protocol, type_catalog=PostgresTypeCatalog(cluster.dsn(db))))
        return twins[-1]

    kwargs = dict(publication="pub") if plugin == "pgoutput" else dict(replication_sets="default")
    rows: list = []
    with connect(cluster.dsn(db), slot=f"{db}_{suffix}"[:63], plugin=plugin, transport=transport, binary=binary,
                 decoder_factory=factory, **kwargs) as stream:
        deadline = time.monotonic() + 30
        while len(rows) < 3 and time.monotonic() < deadline:
            for event in stream.read(0.2):
                rows += _rows(event)
    assert twins and not any(t.mismatches for t in twins), [t.mismatches for t in twins]
    return sorted(rows, key=lambda r: r["id"])


def test_session_options_merge():
    ours = session_options()
    assert all(f"-c {k}={v}" in ours for k, v in SESSION_SETTINGS.items())
    assert session_options("-c work_mem=64MB").startswith("-c work_mem=64MB -c ")
    kw = pinned_kwargs("host=x options='-c statement_timeout=5s'", {"options": "-c work_mem=1MB"})
    assert kw["options"].startswith("-c statement_timeout=5s -c work_mem=1MB -c DateStyle=ISO")


@pytest.mark.parametrize("suffix", [s for s in SLOTS if s != "spark"])
def test_same_values_whatever_the_database_settings(pg_cluster, databases, suffix):
    plain = _stream_rows(pg_cluster, databases["plain"], suffix)
    assert [r["t"] for r in plain] == TEXTS
    assert [r["nämé"] for r in plain] == [TEXTS[0], "x", None]
    assert plain[0]["ta"] in ([TEXTS[1], "a b"], f'{{"{TEXTS[1]}","a b"}}')
    odd = _stream_rows(pg_cluster, databases["odd"], suffix)
    assert odd == plain
    latin1 = _stream_rows(pg_cluster, databases["latin1"], suffix)
    assert latin1 == plain


def test_same_values_through_the_spark_source(pg_cluster, databases):
    from tests.spark_session import spark_session

    spark = spark_session()
    got = {}
    for kind, db in databases.items():
        df = (spark.read.format("spockwire").option("dsn", pg_cluster.dsn(db)).option("slot", f"{db}_spark"[:63])
              .option("publication", "pub").option("table", "public.v").load())
        rows = [r.asDict(recursive=True) for r in df.orderBy("id").collect()]
        got[kind] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    assert [r["t"] for r in got["plain"]] == TEXTS
    assert got["odd"] == got["plain"]
    assert got["latin1"] == got["plain"]
