"""The pumps refuse to drive psycopg2's connection through a different libpq (psycopg2-binary, bundled libpqs)."""
from __future__ import annotations

import pytest

from spockwire.connection import ReplicationError
from spockwire.connection import libpq


def _maps(tmp_path, *paths):
    f = tmp_path / "maps"
    f.write_text("".join(f"7f00-7f10 r-xp 00000000 fe:00 {i}    {p}\n" for i, p in enumerate(paths, 1)))
    return str(f)


def test_one_libpq_mapped_several_times_is_one(tmp_path):
    maps = _maps(tmp_path, "/usr/lib/x86_64-linux-gnu/libpq.so.5.15", "/usr/lib/x86_64-linux-gnu/libpq.so.5.15",
                 "/usr/lib/libpqxx-7.so", "/usr/lib/x86_64-linux-gnu/libssl.so.3")
    assert libpq.loaded_libpqs(maps) == {"/usr/lib/x86_64-linux-gnu/libpq.so.5.15"}


def test_two_libpqs_are_refused_with_a_clear_error(tmp_path, monkeypatch):
    maps = _maps(tmp_path, "/usr/lib/x86_64-linux-gnu/libpq.so.5.15",
                 "/venv/site-packages/psycopg2_binary.libs/libpq-9d0b3e4a.so.5.16")
    real = libpq.loaded_libpqs
    monkeypatch.setattr(libpq, "loaded_libpqs", lambda: real(maps))
    with pytest.raises(ReplicationError, match="different libpq libraries .*--no-binary psycopg2"):
        libpq.check_single_libpq()


def test_this_process_has_one_libpq():
    import psycopg2  # noqa: F401 - loads psycopg2's libpq
    import spockwire.connection._pump  # noqa: F401 - loads the pump's
    assert len(libpq.loaded_libpqs()) == 1
    libpq.check_single_libpq()
