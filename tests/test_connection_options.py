"""Plugin options and startup-message checks (no server needed)."""
from __future__ import annotations

import os

import pytest

from spockwire.connection import (StartupRejected, check_startup, format_lsn, load_pump, local_binary_params,
                                  native_options, parse_lsn, parse_startup_message, pgoutput_options)
from spockwire.connection.stream import ReplicationStream
from spockwire.testing.fake_upstream import SpockScript


def test_pgoutput_picks_the_highest_version_the_server_speaks():
    assert pgoutput_options(150020, "pub")["proto_version"] == "3"
    assert pgoutput_options(140010, "pub")["proto_version"] == "2"
    assert pgoutput_options(130000, "pub")["proto_version"] == "1"
    assert pgoutput_options(160002, "pub")["proto_version"] == "4"
    opts = pgoutput_options(150020, ["p1", 'we"ird'], proto_version=3, binary=True, streaming=True, two_phase=True,
                            messages=True)
    assert opts == {"proto_version": "3", "publication_names": '"p1","we""ird"', "binary": "true",
                    "streaming": "true", "two_phase": "true", "messages": "true"}
    assert pgoutput_options(160000, "p", streaming="parallel")["streaming"] == "parallel"


@pytest.mark.parametrize("kwargs, match", [
    ({"proto_version": 4}, "at most 3"),
    ({"proto_version": 5}, "1 to 4"),
    ({"proto_version": 1, "streaming": True}, "streaming"),
    ({"proto_version": 2, "two_phase": True}, "two_phase"),
    ({"streaming": "parallel"}, "parallel"),
    ({"origin": "none"}, "origin"),
])
def test_pgoutput_refuses_what_the_server_would(kwargs, match):
    with pytest.raises(StartupRejected, match=match):
        pgoutput_options(150020, "pub", **kwargs)


def test_native_options():
    pgl = native_options("pglogical", 150020)
    assert pgl["startup_params_format"] == "1"
    assert (pgl["min_proto_version"], pgl["max_proto_version"]) == ("1", "1")
    assert pgl["pglogical.replication_set_names"] == "default" and pgl["pglogical.forward_origins"] == "all"
    assert pgl["binary.want_binary_basetypes"] == "0" and pgl["binary.want_internal_basetypes"] == "0"
    sp = native_options("spock", 150020, replication_sets=["a", "b"], forward_origins=False, binary=True)
    assert (sp["min_proto_version"], sp["max_proto_version"], sp["spock_version_num"]) == ("4", "5", "60000")
    assert sp["spock.replication_set_names"] == "a,b" and "spock.forward_origins" not in sp
    assert sp["binary.basetypes_major_version"] == "1500"
    local = local_binary_params()
    assert set(local) <= set(sp) and local["binary.bigendian"] == ("1" if os.sys.byteorder == "big" else "0")
    with pytest.raises(ValueError):
        native_options("pgoutput", 150020)
    v4 = native_options("spock", 180006, proto_version=4)
    assert (v4["min_proto_version"], v4["max_proto_version"], v4["spock_version_num"]) == ("4", "4", "60000")
    for bad in (3, 6):
        with pytest.raises(StartupRejected, match=f"spock proto_version {bad} is not supported"):
            native_options("spock", 180006, proto_version=bad)
    with pytest.raises(StartupRejected, match="protocol 1 only"):
        native_options("pglogical", 150020, proto_version=1)


def test_startup_message_parsing_and_checks():
    params = {"proto_version": "5", "binary.internal_basetypes": "f", "binary.binary_basetypes": "f",
              "database_encoding": "UTF8", "encoding": "UTF8"}
    assert parse_startup_message(SpockScript.startup_message(params)) == params
    assert check_startup("spock", params) == 5
    assert check_startup("spock", {"spock_version_num": "50003"}) == 4
    assert check_startup("pglogical", {"max_proto_version": "1", "min_proto_version": "1"}) == 1
    with pytest.raises(StartupRejected, match="format 2"):
        parse_startup_message(b"S\x02a\0b\0")
    with pytest.raises(StartupRejected, match="no value"):
        parse_startup_message(b"S\x01a\0b\0c\0")
    with pytest.raises(StartupRejected, match="first message"):
        parse_startup_message(b"B\x00")
    with pytest.raises(StartupRejected, match="protocol 1 only"):
        check_startup("pglogical", {"max_proto_version": "2"})
    with pytest.raises(StartupRejected, match="major version 1400"):
        check_startup("spock", dict(params, **{"binary.binary_basetypes": "t",
                                               "binary.basetypes_major_version": "1400"}),
                      binary_asked=True, basetypes_major=1500)


def test_lsn_text():
    assert parse_lsn("16/B374D848") == 0x16B374D848
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn(None) == 0 and parse_lsn(5) == 5
    with pytest.raises(ValueError):
        parse_lsn("nonsense")


def test_pump_selection(monkeypatch):
    assert load_pump("python").IMPLEMENTATION == "python"
    assert load_pump("c").IMPLEMENTATION == "c"
    monkeypatch.setenv("SPOCKWIRE_IMPL", "python")
    assert load_pump().IMPLEMENTATION == "python"
    monkeypatch.setenv("SPOCKWIRE_IMPL", "rust")
    with pytest.raises(ImportError, match="not understood"):
        load_pump()


def test_stream_argument_checks():
    with pytest.raises(ValueError, match="publication"):
        ReplicationStream("dbname=x", slot="s", plugin="pgoutput")
    with pytest.raises(ValueError, match="replication_sets"):
        ReplicationStream("dbname=x", slot="s", plugin="pglogical", publication="p")
    with pytest.raises(StartupRejected, match="streaming"):
        ReplicationStream("dbname=x", slot="s", plugin="spock", streaming=True)
    with pytest.raises(StartupRejected, match="no proto_version option"):
        ReplicationStream("dbname=x", slot="s", plugin="pglogical", proto_version=1)
    with pytest.raises(ValueError, match="unknown output plugin"):
        ReplicationStream("dbname=x", slot="s", plugin="decoderbufs")
    with pytest.raises(ValueError, match="transport"):
        ReplicationStream("dbname=x", slot="s", publication="p", transport="walsender")
    with pytest.raises(ValueError, match="sql_batch_changes"):
        ReplicationStream("dbname=x", slot="s", publication="p", transport="sql", sql_batch_changes=0)
    with pytest.raises(ValueError, match="sql_split_bytes"):
        ReplicationStream("dbname=x", slot="s", publication="p", transport="sql", sql_split_bytes=-1)


def test_sql_options_and_cursor_slot_name():
    from spockwire.connection.sql import cursor_slot_name, sql_options

    opts = {"proto_version": "2", "publication_names": '"p"', "streaming": "true", "binary": "true"}
    assert sql_options(opts) == {"proto_version": "2", "publication_names": '"p"', "binary": "true"}
    name = cursor_slot_name("s" * 63, 4194304)
    assert len(name) <= 63 and name.endswith("_swsql_4194304")
