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
* :func:`configure_arrow_allocator` (run by :mod:`spockwire.spark.job` and the ``pipeline`` and ``demo`` commands
  before pyarrow is loaded): pyarrow's pool (mimalloc) gives a freed page back to the system at once
  (:data:`ARROW_ALLOCATOR_CONF`). By default mimalloc keeps what a thread freed until that thread allocates again,
  and the threads that read and write a batch's Parquet files hold it through the rest of the batch: with it the
  driver peaked at 612-651 MiB in a 5,000,000-change backlog's micro-batches instead of 704-731 MiB, the job as
  fast. Spark's Python workers keep mimalloc's default (``spark.executorEnv``). Set ``MIMALLOC_PURGE_DELAY``
  yourself to choose otherwise; mimalloc reads it once, when pyarrow is loaded.
* :func:`release_memory` (after every micro-batch): pyarrow's pool and the C library's malloc give their free pages
  back to the system.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["DELTA_ALLOCATOR_ENV", "DELTA_ALLOCATOR_CONF", "ARROW_ALLOCATOR_ENV", "ARROW_ALLOCATOR_CONF",
           "WORKER_ARROW_ALLOCATOR_CONF", "configure_delta_allocator", "configure_arrow_allocator", "worker_environment",
           "release_memory"]

#: the environment variable delta-rs's jemalloc reads its options from (the deltalake wheels prefix jemalloc's names)
DELTA_ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
#: freed pages go back to the system after about a second (jemalloc's default: 10 s, and only while it allocates)
DELTA_ALLOCATOR_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"

#: the environment variable pyarrow's mimalloc reads its purge delay from (milliseconds)
ARROW_ALLOCATOR_ENV = "MIMALLOC_PURGE_DELAY"
#: the driver's: freed pages go back at once
ARROW_ALLOCATOR_CONF = "0"
#: Spark's Python workers': mimalloc's own default
WORKER_ARROW_ALLOCATOR_CONF = "10"

_libc: ctypes.CDLL | None = None
_arrow_allocator_set = False


def configure_delta_allocator() -> bool:
    """Set :data:`DELTA_ALLOCATOR_ENV` to :data:`DELTA_ALLOCATOR_CONF` unless it is set already; False when it was, or
    when ``deltalake`` is already loaded in this process (its allocator has read its options then)."""
    if DELTA_ALLOCATOR_ENV in os.environ or "deltalake" in sys.modules:
        return False
    os.environ[DELTA_ALLOCATOR_ENV] = DELTA_ALLOCATOR_CONF
    return True


def configure_arrow_allocator() -> bool:
    """Set :data:`ARROW_ALLOCATOR_ENV` to :data:`ARROW_ALLOCATOR_CONF` unless it is set already; False when it was, or
    when pyarrow is already loaded in this process (its allocator has read its options then)."""
    global _arrow_allocator_set
    if ARROW_ALLOCATOR_ENV in os.environ or "pyarrow" in sys.modules:
        return False
    os.environ[ARROW_ALLOCATOR_ENV] = ARROW_ALLOCATOR_CONF
    _arrow_allocator_set = True
    return True


def worker_environment() -> dict[str, str]:
    """What Spark's Python workers get in place of the driver's allocator setting (``spark.executorEnv.*``): mimalloc's
    default, when :func:`configure_arrow_allocator` set the driver's (they inherit the driver's environment)."""
    if _arrow_allocator_set and os.environ.get(ARROW_ALLOCATOR_ENV) == ARROW_ALLOCATOR_CONF:
        return {ARROW_ALLOCATOR_ENV: WORKER_ARROW_ALLOCATOR_CONF}
    return {}


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
