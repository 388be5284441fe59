"""Choosing between a compiled module and its pure-Python twin, the same way everywhere.

`SPOCKWIRE_IMPL=python` picks the twin; `SPOCKWIRE_IMPL=c` picks the compiled module and fails with an ImportError
that says why when it cannot be imported; unset, the compiled module is used when it imports. With
`SPOCKWIRE_REQUIRE_EXT=1` the compiled module is required unless the twin was asked for by name: never a silent
fallback.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["choose"]


def choose(compiled: str, pure: str, what: str, build_hint: str, choice: str | None = None) -> ModuleType:
    """The module for `choice` ("c" | "python"; default: SPOCKWIRE_IMPL)."""
    if choice is None:
        choice = os.environ.get("SPOCKWIRE_IMPL", "")
    choice = choice.strip().lower()
    required = os.environ.get("SPOCKWIRE_REQUIRE_EXT", "").strip() not in ("", "0")
    if choice not in ("", "c", "python"):
        raise ImportError(f"SPOCKWIRE_IMPL={choice!r} is not understood: use 'c' or 'python'")
    if choice == "python":
        return importlib.import_module(pure)
    try:
        return importlib.import_module(compiled)
    except ImportError as exc:
        if choice == "c" or required:
            raise ImportError(f"the compiled {what} ({compiled}) could not be imported: {exc}. {build_hint}, or "
                              f"set SPOCKWIRE_IMPL=python to use the pure-Python twin on purpose") from exc
        return importlib.import_module(pure)
