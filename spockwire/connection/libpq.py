"""One libpq per process: the pumps drive psycopg2's connection handle (`pgconn_ptr`) with libpq calls, which is
only sound when they and psycopg2 use the very same libpq library.

That holds when psycopg2 is built from source against the system libpq (what the set-up scripts install). It does
not hold with psycopg2-binary, or with a wheel that bundles a private libpq: then a connection made by one libpq
(and its OpenSSL) would be read through another. `check_single_libpq()` refuses that with a clear error.
"""
from __future__ import annotations

import os
import re

from .errors import ReplicationError

__all__ = ["loaded_libpqs", "check_single_libpq"]

_LIBPQ = re.compile(r"/libpq(?:-[^/]*)?\.so[^/]*$")


def loaded_libpqs(maps_path: str = "/proc/self/maps") -> set[str]:
    """The distinct libpq files mapped into this process (an empty set where /proc is not available)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "libpq" in line}
    except OSError:
        return set()
    return {os.path.realpath(p) for p in paths if _LIBPQ.search(p)}


def check_single_libpq() -> None:
    """Raise ReplicationError when more than one libpq is loaded (psycopg2's and the pump's differ)."""
    found = loaded_libpqs()
    if len(found) > 1:
        raise ReplicationError(
            "psycopg2 and spockwire's replication pump use different libpq libraries (" + ", ".join(sorted(found))
            + "): a connection cannot be shared between them. Install psycopg2 built from source against the "
            "system libpq (`pip install --no-binary psycopg2 psycopg2`, with libpq-dev installed) and spockwire "
            "built against the same libpq")
