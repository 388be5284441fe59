"""Which libpq the pumps use: always psycopg2's own.

The pumps drive psycopg2's connection handle (`pgconn_ptr`) with libpq calls, which is only sound through the very
libpq that made the connection. So neither pump links or loads a libpq of its own: both look the functions up
through psycopg2's extension module (`bind_libpq` in each pump module), which finds the libpq psycopg2 was linked
with -- the system's when psycopg2 was built from source, the private copy psycopg2-binary bundles otherwise. Other
libpqs loaded into the process (by other libraries) do not matter.

`library_of(address)` names the file a function address belongs to, `loaded_libpqs()` lists the libpq files mapped
into the process: both for diagnostics and tests.
"""
from __future__ import annotations

import ctypes
import os
import re

__all__ = ["loaded_libpqs", "library_of", "pump_libpq"]

_LIBPQ = re.compile(r"/libpq(?:-[^/]*)?\.so[^/]*$")


def loaded_libpqs(maps_path: str = "/proc/self/maps") -> set[str]:
    """The distinct libpq files mapped into this process (an empty set where /proc is not available)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "libpq" in line}
    except OSError:
        return set()
    return {os.path.realpath(p) for p in paths if _LIBPQ.search(p)}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(address: int) -> str | None:
    """The real path of the shared library that holds `address` (None when no loaded library does)."""
    libc = ctypes.CDLL(None)
    dladdr = libc.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not address or dladdr(address, ctypes.byref(info)) == 0 or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def pump_libpq(pump_module) -> str | None:
    """The file of the libpq a pump module (`spockwire.connection._pump` or its twin) calls."""
    return library_of(pump_module.bind_libpq())
