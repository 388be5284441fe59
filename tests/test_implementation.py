"""Choosing the compiled module or its pure-Python twin: one rule for the decoder and the replication pump."""
from __future__ import annotations

import pytest

from spockwire.connection.stream import load_pump
from spockwire.wire import load_implementation

LOADERS = {"decoder": load_implementation, "pump": lambda: load_pump()}


@pytest.mark.parametrize("what", sorted(LOADERS))
def test_impl_python_gives_the_twin_even_when_the_extension_is_required(monkeypatch, what):
    monkeypatch.setenv("SPOCKWIRE_REQUIRE_EXT", "1")
    monkeypatch.setenv("SPOCKWIRE_IMPL", "python")
    assert LOADERS[what]().IMPLEMENTATION == "python"
    monkeypatch.setenv("SPOCKWIRE_IMPL", "c")
    assert LOADERS[what]().IMPLEMENTATION == "c"


@pytest.mark.parametrize("what", sorted(LOADERS))
def test_unknown_choice_is_an_import_error(monkeypatch, what):
    monkeypatch.setenv("SPOCKWIRE_IMPL", "rust")
    with pytest.raises(ImportError, match="not understood"):
        LOADERS[what]()


def test_a_missing_compiled_module_is_never_a_silent_fallback(monkeypatch):
    from spockwire._implementation import choose

    monkeypatch.setenv("SPOCKWIRE_IMPL", "")
    monkeypatch.setenv("SPOCKWIRE_REQUIRE_EXT", "1")
    with pytest.raises(ImportError, match="could not be imported.*SPOCKWIRE_IMPL=python"):
        choose("spockwire.no_such_module", "spockwire.wire._decoder_py", "decoder", "Build it")
    monkeypatch.setenv("SPOCKWIRE_REQUIRE_EXT", "0")
    assert choose("spockwire.no_such_module", "spockwire.wire._decoder_py", "decoder", "Build it").IMPLEMENTATION \
        == "python"
