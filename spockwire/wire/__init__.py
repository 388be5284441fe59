"""Wire decoding: the protocol state machines for pgoutput, pglogical and spock streams.

`load_implementation()` picks the Cython hot path (`_decoder`) or the pure-Python twin (`_decoder_py`) following
`SPOCKWIRE_IMPL` (`c` | `python`; default: C when it imports). With `SPOCKWIRE_REQUIRE_EXT=1` a missing or broken
extension is an ImportError that says why, never a silent fallback (spockwire._implementation).
"""
from __future__ import annotations

from types import ModuleType

from .._implementation import choose

__all__ = ["load_implementation"]


def load_implementation() -> ModuleType:
    return choose("spockwire.wire._decoder", "spockwire.wire._decoder_py", "decoder",
                  "Build it with `python setup.py build_ext --inplace` or install a wheel")
