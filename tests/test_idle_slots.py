"""Quiet streams on a busy server do not hold WAL.

The published tables stay quiet while 200,000 rows are written to a table no stream publishes. A consumer that has
acknowledged everything must let the slot follow the server:

* bound while writing: sampled after each of the 100 write transactions of 2,000 rows (about 35 MiB of WAL in about
  10 seconds), the slot's confirmed_flush_lsn is never behind the WAL position the server had BEHIND_SECONDS (4 s)
  earlier: the slot lags by at most the WAL of the last 4 seconds, however long the writes go on (a slot
  that moved only with the stream's own changes would stay put, its lag growing by every byte written);
* bound afterwards: within SETTLE seconds, the slot's confirmed_flush_lsn reaches the server's WAL position at the
  end of the writes.

Checked for pgoutput and pglogical through `connect()` (replication transport with both pumps, SQL transport), the
ingest worker and the Spark source (there the bound is its `idleAdvanceBytes`, set to 1 MiB). The heartbeat moves
the slot when the server writes nothing at all, and is never handed out.
"""
from __future__ import annotations

import threading
import time

import pytest

from spockwire.connection import connect, create_slot
from spockwire.connection.slots import drop_slot, parse_lsn

pytestmark = pytest.mark.pg

BEHIND_SECONDS = 4.0
SETTLE = 15.0
TRANSACTIONS = 100
ROWS_PER_TRANSACTION = 2000


def _setup(db, plugin: str, slot: str) -> None:
    db.execute("CREATE TABLE quiet (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE busy (id bigserial PRIMARY KEY, v text)")
    if plugin == "pgoutput":
        db.execute("CREATE PUBLICATION pub FOR TABLE quiet")
    else:
        db.execute("CREATE EXTENSION pglogical")
        db.execute("SELECT pglogical.create_node(node_name := 'provider', dsn := %s)", (db.dsn,))
        db.execute("SELECT pglogical.replication_set_add_table('default', 'quiet')")
    create_slot(db.dsn, slot, plugin)


def _stream_kwargs(plugin: str) -> dict:
    return dict(publication="pub") if plugin == "pgoutput" else dict(replication_sets="default")


def _lag(db, slot: str) -> tuple[int, int]:
    """(server WAL position, slot lag behind it)."""
    (wal, confirmed), = db.query("SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text "
                                 "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return parse_lsn(wal), parse_lsn(wal) - parse_lsn(confirmed)


def _busy_writes(db, slot: str, samples: list[tuple[float, int, int]]) -> int:
    """Write the unpublished rows; after each transaction sample (time, server WAL position, slot position); return
    the WAL position at the end."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            for _ in range(TRANSACTIONS):
                cur.execute("INSERT INTO busy (v) SELECT repeat('x', 40) FROM generate_series(1, %s)",
                            (ROWS_PER_TRANSACTION,))
                wal, lag = _lag(db, slot)
                samples.append((time.monotonic(), wal, wal - lag))
                time.sleep(0.05)
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return parse_lsn(cur.fetchone()[0])
    finally:
        conn.close()


def _assert_follows(samples: list[tuple[float, int, int]]) -> None:
    """At every sample, the slot is at least where the server's WAL was BEHIND_SECONDS earlier."""
    checked = 0
    for t, _wal, confirmed in samples:
        earlier = [wal for (u, wal, _c) in samples if u <= t - BEHIND_SECONDS]
        if earlier:
            checked += 1
            assert confirmed >= earlier[-1], (f"slot {earlier[-1] - confirmed:,} bytes behind the server's position "
                                              f"of {BEHIND_SECONDS} s before")
    # the writes went on long enough, and made enough WAL, for the check to mean something
    assert checked >= len(samples) // 4 and samples[-1][1] - samples[0][1] > 20 << 20


def _wait_settled(db, slot: str, end: int, poll=None) -> int:
    deadline = time.monotonic() + SETTLE
    while True:
        if poll is not None:
            poll()
        (confirmed,), = db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                 (slot,))
        if parse_lsn(confirmed) >= end or time.monotonic() > deadline:
            return parse_lsn(confirmed)
        time.sleep(0.1)


def _drop(db, slot: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            drop_slot(db.dsn, slot)
            return
        except Exception:  # noqa: BLE001 - still active for a moment after the stream closed
            time.sleep(0.1)


class Reader(threading.Thread):
    """Reads a stream and acknowledges everything it was handed, like a consumer that persists at once."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.events: list = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.events += self.stream.read(0.2)
                self.stream.ack()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.parametrize("plugin, transport, pump", [
    ("pgoutput", "replication", "c"), ("pgoutput", "replication", "python"), ("pgoutput", "sql", "c"),
    ("pglogical", "replication", "c"), ("pglogical", "sql", "python"),
])
def test_connect_keeps_an_idle_slot_moving(pg_db, plugin, transport, pump):
    slot = f"idle_{plugin}_{transport}_{pump}"
    _setup(pg_db, plugin, slot)
    try:
        with connect(pg_db.dsn, slot=slot, plugin=plugin, transport=transport, pump=pump,
                     **_stream_kwargs(plugin)) as stream:
            pg_db.execute("INSERT INTO quiet VALUES (1, 'before')")
            reader = Reader(stream)
            reader.start()
            samples: list = []
            end = _busy_writes(pg_db, slot, samples)
            confirmed = _wait_settled(pg_db, slot, end)
            pg_db.execute("INSERT INTO quiet VALUES (2, 'after')")
            deadline = time.monotonic() + 10
            while sum(getattr(e, "num_rows", 0) for e in reader.events) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            reader.stop.set()
            reader.join(5)
            assert reader.error is None, reader.error
        _assert_follows(samples)
        assert confirmed >= end, f"slot still {end - confirmed:,} bytes behind {SETTLE} s after the writes"
        rows = [r for e in reader.events if hasattr(e, "to_arrow") for r in e.to_arrow().to_pylist()]
        assert [(str(r["id"]), r["v"]) for r in rows] == [("1", "before"), ("2", "after")]
    finally:
        _drop(pg_db, slot)


def test_heartbeat_moves_a_slot_on_a_silent_server_and_is_never_handed_out(pg_db):
    slot = "idle_heartbeat"
    _setup(pg_db, "pgoutput", slot)
    try:
        with connect(pg_db.dsn, slot=slot, publication="pub", messages=True, heartbeat_interval=0.2) as stream:
            start = _lag(pg_db, slot)[0]
            events: list = []
            deadline = time.monotonic() + 5
            confirmed = 0
            while time.monotonic() < deadline and confirmed <= start:
                events += stream.read(0.2)
                stream.ack()
                (c,), = pg_db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                    "WHERE slot_name = %s", (slot,))
                confirmed = parse_lsn(c)
            pg_db.execute("SELECT pg_logical_emit_message(false, 'app', 'hello')")
            deadline = time.monotonic() + 5
            while not events and time.monotonic() < deadline:
                events += stream.read(0.2)
        # the server wrote nothing but the heartbeats after `start`: only they can have moved the slot past it
        assert confirmed > start
        assert [(e.prefix, bytes(e.content)) for e in events] == [("app", b"hello")]
    finally:
        _drop(pg_db, slot)


@pytest.mark.parametrize("plugin, transport", [("pgoutput", "replication"), ("pglogical", "replication"),
                                               ("pgoutput", "sql")])
def test_ingest_keeps_an_idle_slot_moving(pg_db, tmp_path, plugin, transport):
    from spockwire.ingest.worker import IngestConfig, IngestWorker

    slot = f"idle_ingest_{plugin}_{transport}"
    _setup(pg_db, plugin, slot)
    config = IngestConfig(dsn=pg_db.dsn, slot=slot, out=str(tmp_path / "stage"), plugin=plugin,
                          publication=["pub"] if plugin == "pgoutput" else None,
                          replication_sets=["default"] if plugin != "pgoutput" else None,
                          transport=transport, flush_seconds=0.5, progress=False)
    worker = IngestWorker(config)
    result: list = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    try:
        pg_db.execute("INSERT INTO quiet VALUES (1, 'before')")
        thread.start()
        samples: list = []
        end = _busy_writes(pg_db, slot, samples)
        confirmed = _wait_settled(pg_db, slot, end)
        worker.stop()
        thread.join(30)
        assert result == [0]
        _assert_follows(samples)
        assert confirmed >= end, f"slot still {end - confirmed:,} bytes behind {SETTLE} s after the writes"
        from spockwire.ingest import read_staging

        staged = read_staging(str(tmp_path / "stage"), "public.quiet").to_pylist()
        assert [(str(r["id"]), r["v"]) for r in staged] == [("1", "before")]
    finally:
        worker.stop()
        thread.join(30)
        _drop(pg_db, slot)


@pytest.mark.parametrize("plugin", ["pgoutput", "pglogical"])
def test_spark_stream_keeps_an_idle_slot_moving(pg_db, tmp_path, plugin):
    from tests.spark_session import spark_session

    spark = spark_session()
    slot = f"idle_spark_{plugin}"
    _setup(pg_db, plugin, slot)
    idle_bytes = 1 << 20
    opts = {"dsn": pg_db.dsn, "slot": slot, "plugin": plugin, "table": "public.quiet",
            "idleAdvanceBytes": str(idle_bytes)}
    if plugin == "pgoutput":
        opts["publication"] = "pub"
    else:
        opts["replicationSets"] = "default"
    query = (spark.readStream.format("spockwire").options(**opts).load()
             .writeStream.format("memory").queryName(f"idle_{plugin}")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="300 milliseconds").start())
    try:
        pg_db.execute("INSERT INTO quiet VALUES (1, 'before')")
        samples: list = []
        end = _busy_writes(pg_db, slot, samples)
        deadline = time.monotonic() + 30
        lag = _lag(pg_db, slot)[1]
        while lag > idle_bytes and time.monotonic() < deadline:
            time.sleep(0.3)
            lag = _lag(pg_db, slot)[1]
        (confirmed,), = pg_db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                    "WHERE slot_name = %s", (slot,))
        assert lag <= idle_bytes, f"slot {lag:,} bytes behind after the writes"
        assert parse_lsn(confirmed) + idle_bytes >= end
        rows = spark.sql(f"SELECT id, v FROM idle_{plugin}").collect()
        assert [(r.id, r.v) for r in rows] == [(1, "before")]
    finally:
        query.stop()
        _drop(pg_db, slot)


def test_a_batch_that_failed_to_decode_is_never_passed(pg_db):
    """A batch whose decoding failed was never handed out: however quiet the stream is afterwards, and however much
    the consumer acknowledges, the slot does not move past it."""
    from spockwire.errors import protocol_error
    from spockwire.wire import load_implementation

    class Failing:
        def __init__(self, protocol):
            self.inner = load_implementation().Decoder(protocol)

        def feed_frames(self, data, partial_ok=False):
            if b"poison" in bytes(data):
                raise protocol_error("I", 0, "a value this consumer cannot decode")
            return self.inner.feed_frames(data)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    slot = "idle_poison"
    _setup(pg_db, "pgoutput", slot)
    try:
        with connect(pg_db.dsn, slot=slot, publication="pub", decoder_factory=Failing) as stream:
            (before,), = pg_db.query("SELECT pg_current_wal_lsn()::text")
            pg_db.execute("INSERT INTO quiet VALUES (1, 'poison')")
            failures = 0
            deadline = time.monotonic() + 10
            while not failures and time.monotonic() < deadline:
                try:
                    stream.read(0.2)
                except Exception as exc:  # noqa: BLE001 - the injected failure
                    assert "cannot decode" in str(exc)
                    failures += 1
            assert failures == 1
            samples: list = []
            end = _busy_writes(pg_db, slot, samples)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                stream.read(0.2)
                stream.ack()
        (confirmed,), = pg_db.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                    "WHERE slot_name = %s", (slot,))
        assert parse_lsn(confirmed) <= parse_lsn(before) < end
    finally:
        _drop(pg_db, slot)
