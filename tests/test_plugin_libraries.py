"""A server whose output_plugin_libraries setting leaves a plugin out (Debian's PostgreSQL 15.19+, PostgreSQL 18.6+):
creating a slot for that plugin, through every path spockwire creates slots by, is one line naming the setting
and the line to add, not the server's raw error."""
from __future__ import annotations

import pytest

from spockwire.connection.errors import PluginNotAllowed
from spockwire.connection.slots import create_slot
from spockwire.snapshot.initial import create_slot_with_snapshot
from spockwire.spark.slot import SlotSpec, ensure_slot
from spockwire.testing import PostgresCluster


@pytest.fixture(scope="module", params=[15, 18], ids=["pg15", "pg18"])
def restricted(request):
    with PostgresCluster({"output_plugin_libraries": "pgoutput, test_decoding"}, major=request.param) as pg:
        yield pg


def _check(exc: PluginNotAllowed, library: str) -> None:
    text = str(exc)
    assert "\n" not in text and "output_plugin_libraries" in text and library in text
    assert "may not be used" not in text


def _plugin(pg) -> tuple[str, str]:
    """A plugin the server has installed but the setting leaves out: pglogical's (15), Spock's (18)."""
    return ("pglogical", "pglogical_output") if pg.major == 15 else ("spock", "spock_output")


def test_a_plugin_the_server_does_not_allow_is_one_line(restricted):
    plugin, library = _plugin(restricted)
    dsn = restricted.dsn()
    with pytest.raises(PluginNotAllowed) as raised:
        create_slot(dsn, "s_sql", plugin)
    _check(raised.value, library)
    assert "'pgoutput, test_decoding, " + library + "'" in str(raised.value)    # the setting as it is, plus it
    with pytest.raises(PluginNotAllowed) as raised:
        create_slot_with_snapshot(dsn, "s_repl", plugin, temporary=True)
    _check(raised.value, library)
    allowed = create_slot(dsn, "s_ok", "pgoutput")                               # an allowed plugin still works
    assert allowed.plugin == "pgoutput"


def test_the_spark_source_says_the_same(restricted):
    plugin, library = _plugin(restricted)
    with pytest.raises(PluginNotAllowed) as raised:
        ensure_slot(SlotSpec(dsn=restricted.dsn(), slot="s_spark", plugin=library))
    _check(raised.value, library)
