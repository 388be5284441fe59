"""spock negotiation, streaming, acknowledgement and resume, against the scripted upstream (spock cannot run here)."""
from __future__ import annotations

import time

import pytest

from spockwire.connection import ServerError, StartupRejected, connect
from spockwire.testing.fake_upstream import FakeSpockUpstream, SpockScript

PUMPS = ["c", "python"]


def make_script(proto: int = 5, ntxn: int = 6) -> SpockScript:
    script = SpockScript(proto)
    items = script.relation(16400, "public", "items", [("id", 23, True), ("name", 25, False), ("doc", 25, False)])
    other = script.relation(16410, "app", "other", [("k", 25, True)])
    for i in range(ntxn):
        script.transaction([("insert", items, (i, f"n{i}", "d")), ("insert", other, (f"k{i}",)),
                            ("update", items, (i, "upd", SpockScript.UNCHANGED), None)])
    script.transaction([("update", items, (100, "moved", "d"), (0, None, None)),
                        ("delete", other, ("k1",))], origin=(7, "n7", 0xABCDEF))
    return script


def read_rows(stream, n: int, timeout: float = 10.0) -> list[dict]:
    rows: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(rows) < n and time.monotonic() < deadline:
        for ev in stream.read(0.2):
            rel = ev.relation
            rows += [dict(r, _table=f"{rel.namespace}.{rel.name}") for r in ev.to_arrow().to_pylist()]
    return rows


@pytest.mark.parametrize("pump", PUMPS)
def test_a_read_ends_at_the_keepalive_that_shows_the_server_caught_up(pump):
    """A keepalive arriving a while after the last transaction, covering everything received, ends the read that
    waits for more (empty) at once: the reader learns that it caught up without waiting out its timeout."""
    script = make_script(5)
    with FakeSpockUpstream(script, keepalive_delay=1.0, keepalive_interval=30.0) as up, \
            connect(up.dsn, slot="sub", plugin="spock", pump=pump) as stream:
        assert len(read_rows(stream, 6 * 3 + 3)) == 6 * 3 + 3
        assert not stream.caught_up and stream.behind_since is not None
        started = time.monotonic()
        assert stream.read(20.0) == []
        waited = time.monotonic() - started
        assert stream.caught_up and stream.behind_since is None
        assert waited < 10.0, f"the read waited {waited:.1f} s for its timeout"


@pytest.mark.parametrize("pump", PUMPS)
@pytest.mark.parametrize("proto", [4, 5])
def test_spock_negotiation_and_rows(pump, proto):
    script = make_script(proto)
    with FakeSpockUpstream(script) as up, connect(up.dsn, slot="sub", plugin="spock", pump=pump) as stream:
        rows = read_rows(stream, 6 * 3 + 3)
        (req,) = up.start_requests
        assert req.slot == "sub" and req.start_lsn == 0
        assert req.options["startup_params_format"] == "1"
        assert (req.options["min_proto_version"], req.options["max_proto_version"]) == ("4", "5")
        assert req.options["spock.replication_set_names"] == "default"
        assert req.options["spock.forward_origins"] == "all"
        assert req.options["spock_version_num"] == "60000"
        assert req.options["binary.want_internal_basetypes"] == "0"
        assert stream.proto_version == proto
        assert stream.startup_params["spock_version"] == "6.0.0"
        assert len(rows) == 6 * 3 + 3
        rows.sort(key=lambda r: (r["_commit_lsn"], r["_seq"]))
        first = [r for r in rows if r["_commit_lsn"] == script.transactions[0].commit_lsn]
        assert [(r["_table"], r["_change_type"], r["_seq"]) for r in first] == [
            ("public.items", "insert", 0), ("app.other", "insert", 1), ("public.items", "update_postimage", 2)]
        assert first[2]["_unchanged_toast"] == ["doc"] and first[2]["doc"] is None
        last = [r for r in rows if r["_commit_lsn"] == script.transactions[-1].commit_lsn]
        origin = "n7" if proto == 5 else "7"  # v4 sends the node id only
        assert [(r["_change_type"], r["_origin"]) for r in last] == [
            ("update_preimage", origin), ("update_postimage", origin), ("delete", origin)]


@pytest.mark.parametrize("pump", PUMPS)
def test_acknowledgement_never_passes_what_was_confirmed(pump):
    script = make_script(5)
    with FakeSpockUpstream(script, keepalive_interval=0.05) as up:
        with connect(up.dsn, slot="sub", plugin="spock", pump=pump, status_interval=0.2) as stream:
            rows = read_rows(stream, 4)
            assert rows
            # nothing confirmed yet: the keepalive replies and periodic updates report flush 0
            time.sleep(0.5)
            stream.read(0.2)
            assert up.status_updates and all(s.flush_lsn == 0 for s in up.status_updates)
            first_end = script.transactions[0].end_lsn
            with pytest.raises(ValueError):
                stream.ack(script.last_end_lsn + 1)
            stream.ack(first_end, send=True)
            time.sleep(0.3)
            stream.read(0.2)
            assert up.flushed() == first_end
            read_rows(stream, 100, timeout=1.0)
            stream.ack()
            assert stream.acked_lsn == script.last_end_lsn == stream.delivered_lsn
        ends = {t.end_lsn for t in script.transactions} | {0}
        assert {s.flush_lsn for s in up.status_updates} <= ends
        assert up.flushed() == script.last_end_lsn  # sent at close
        assert all(s.write_lsn >= s.flush_lsn for s in up.status_updates)


@pytest.mark.parametrize("pump", PUMPS)
def test_resume_after_dropped_connection(pump):
    script = make_script(5, ntxn=8)
    txn = script.transactions
    # session 1 dies in the middle of the fourth transaction
    frames_before = 1 + sum(len(script.encode(t, set())) for t in txn[:3])
    with FakeSpockUpstream(script, drop_after=frames_before + 10, drop_sessions=1) as up:
        with connect(up.dsn, slot="sub", plugin="spock", pump=pump, max_backoff=0.1) as stream:
            seen: list[dict] = []
            deadline = time.monotonic() + 10
            while not any(r["_commit_lsn"] == txn[1].commit_lsn for r in seen) and time.monotonic() < deadline:
                seen += [r for ev in stream.read(0.2) for r in ev.to_arrow().to_pylist()]
            stream.ack(txn[1].end_lsn)  # the sink persisted the first two transactions only
            seen += read_rows(stream, 8 * 3 + 3 + 100, timeout=2.0)
            assert stream.reconnects == 1
            assert [r.start_lsn for r in up.start_requests] == [0, txn[1].end_lsn]
        keys = [(r["_commit_lsn"], r["_seq"]) for r in seen]
        # everything arrived, the unacknowledged third transaction twice (same keys: droppable)
        assert set(keys) == {(t.commit_lsn, s) for t in txn[:-1] for s in range(3)} | {
            (txn[-1].commit_lsn, s) for s in range(3)}
        assert keys.count((txn[2].commit_lsn, 0)) == 2
        assert keys.count((txn[0].commit_lsn, 0)) == 1


@pytest.mark.parametrize("overrides, match", [
    ({"binary.internal_basetypes": "t"}, "internal"),
    ({"binary.binary_basetypes": "t"}, "binary=False"),
    ({"proto_version": "3"}, "proto_version 3"),
    ({"proto_version": "9"}, "proto_version 9"),
    ({"proto_version": None, "spock_version_num": "40100"}, "older than 5.0"),
    ({"database_encoding": "LATIN1"}, "UTF-8"),
])
def test_startup_refusals(overrides, match):
    with FakeSpockUpstream(make_script(5), startup_overrides=overrides) as up:
        with connect(up.dsn, slot="sub", plugin="spock") as stream:
            with pytest.raises(StartupRejected, match=match):
                read_rows(stream, 1)


def test_binary_negotiated_when_asked():
    with FakeSpockUpstream(make_script(5)) as up, connect(up.dsn, slot="sub", plugin="spock", binary=True) as stream:
        read_rows(stream, 1)
        opts = up.start_requests[0].options
        assert opts["binary.want_binary_basetypes"] == "1" and opts["binary.basetypes_major_version"] == "1500"
        assert opts["binary.sizeof_datum"] == "8" and opts["binary.bigendian"] in ("0", "1")
        assert "binary.float4_byval" not in opts
        assert stream.startup_params["binary.binary_basetypes"] == "t"


def test_server_refusal_is_not_retried():
    with FakeSpockUpstream(make_script(5)) as up:
        with pytest.raises(ServerError, match="min_proto_version=6"):
            connect(up.dsn, slot="sub", plugin="spock", extra_options={"min_proto_version": "6"})
        assert up.sessions == 1


def test_status_thread_keeps_an_idle_consumer_alive():
    with FakeSpockUpstream(make_script(5), keepalive_interval=5.0) as up:
        with connect(up.dsn, slot="sub", plugin="spock", status_interval=0.1) as stream:
            read_rows(stream, 1)
            before = len(up.status_updates)
            time.sleep(0.8)  # the consumer is busy elsewhere; nobody calls read()
            assert len(up.status_updates) >= before + 3
