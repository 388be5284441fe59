"""Keeping the pipeline driver's resident memory down between micro-batches.

Each micro-batch of :mod:`spockwire.spark.job` allocates its working set in three allocators of the driver's
Python process: delta-rs (the ``deltalake`` package: the MERGE, its reads and writes) in the jemalloc it is built
with, pyarrow in its own memory pool, and everything else in the C library's malloc. Each of them keeps pages it
freed for reuse, so without help the driver stays at about the high-water mark of its largest micro-batch between
batches and the next batch's working set comes on top of what the last one left behind.

* :func:`configure_delta_allocator` (run by :func:`spockwire.spark.job.spark_session`, before ``deltalake`` is
  loaded): delta-rs's jemalloc returns freed pages after about a second, from a background thread, instead of after
  ten seconds of further allocations (:data:`DELTA_ALLOCATOR_CONF`). Set ``_RJEM_MALLOC_CONF`` yourself to choose
  otherwise; it is read once, when ``deltalake`` is loaded.
* :func:`release_memory` (after every micro-batch): pyarrow's pool and the C library's malloc give their free pages
  back to the system.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["DELTA_ALLOCATOR_ENV", "DELTA_ALLOCATOR_CONF", "configure_delta_allocator", "release_memory"]

#: the environment variable delta-rs's jemalloc reads its options from (the deltalake wheels prefix jemalloc's names)
DELTA_ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
#: freed pages go back to the system after about a second (jemalloc's default: 10 s, and only while it allocates)
DELTA_ALLOCATOR_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"

_libc: ctypes.CDLL | None = None


def configure_delta_allocator() -> bool:
    """Set :data:`DELTA_ALLOCATOR_ENV` to :data:`DELTA_ALLOCATOR_CONF` unless it is set already; False when it was, or
    when ``deltalake`` is already loaded in this process (its allocator has read its options then)."""
    if DELTA_ALLOCATOR_ENV in os.environ or "deltalake" in sys.modules:
        return False
    os.environ[DELTA_ALLOCATOR_ENV] = DELTA_ALLOCATOR_CONF
    return True


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.malloc_trim.restype = ctypes.c_int
            _libc = lib
        except (OSError, AttributeError):     # another C library (musl has no malloc_trim)
            _libc = None
    return _libc


def release_memory() -> None:
    """Give the free pages of pyarrow's memory pool and of the C library's malloc back to the system (what is in use
    stays): between micro-batches, so the next one starts from what is live, not from the last one's high-water
    mark."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
