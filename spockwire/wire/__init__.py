"""Wire decoding: the protocol state machines for pgoutput, pglogical and spock streams.

`load_implementation()` picks the Cython hot path (`_decoder`) or the pure-Python twin (`_decoder_py`) following
`SPOCKWIRE_IMPL` (`c` | `python`; default: C when it imports). With `SPOCKWIRE_REQUIRE_EXT=1` a missing or broken
extension is an ImportError that says why, never a silent fallback.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load_implementation"]


def load_implementation() -> ModuleType:
    choice = os.environ.get("SPOCKWIRE_IMPL", "").strip().lower()
    required = os.environ.get("SPOCKWIRE_REQUIRE_EXT", "").strip() not in ("", "0")
    if choice not in ("", "c", "python"):
        raise ImportError(f"SPOCKWIRE_IMPL={choice!r} is not understood: use 'c' or 'python'")
    if choice == "python" and not required:
        return importlib.import_module("spockwire.wire._decoder_py")
    try:
        return importlib.import_module("spockwire.wire._decoder")
    except ImportError as exc:
        if choice == "c" or required:
            raise ImportError(
                "the compiled spockwire extension (spockwire.wire._decoder) could not be imported: "
                f"{exc}. Build it with `python setup.py build_ext --inplace` or install a wheel; "
                "set SPOCKWIRE_IMPL=python to use the pure-Python decoder on purpose") from exc
        return importlib.import_module("spockwire.wire._decoder_py")
