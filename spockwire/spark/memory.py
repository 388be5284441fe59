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
* :func:`stop_planning_workers` (after the query's first micro-batch was read): Spark's Python processes that
  planned the query, idle from then on (about 370 MB on 2 cores), are stopped.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Any

__all__ = ["DELTA_ALLOCATOR_ENV", "DELTA_ALLOCATOR_CONF", "PLANNING_WORKER_MODULES", "configure_delta_allocator",
           "release_memory", "stop_planning_workers"]

log = logging.getLogger("spockwire.pipeline")

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


#: the Python modules of the workers Spark runs to plan a query that reads a Python data source: finding the data
#: sources installed, creating the source (its schema), pushing filters down, planning its read. A streaming query
#: runs each once, when it starts; its micro-batches use the source's runner and the decoding workers, not these.
PLANNING_WORKER_MODULES = ("pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source",
                           "pyspark.sql.worker.data_source_pushdown_filters",
                           "pyspark.sql.worker.plan_data_source_read")


def stop_planning_workers(spark: Any) -> list[str]:
    """Stop the Python processes Spark keeps after planning a query that reads a Python data source: for each of
    :data:`PLANNING_WORKER_MODULES` it used, a daemon (about 48 MB) and an idle worker (55-110 MB; Spark stops an
    idle worker after a minute without work, never the daemon). Returns the modules whose processes were stopped.

    Call it on the driver of a classic session (its JVM in this process) once the query has started and while no
    query of the session is being planned: a worker busy planning would be stopped too. A later planning starts
    its daemon again. Spark keeps these processes in a private field of its ``SparkEnv``, read here
    through Java reflection: with a session that has no JVM here (Spark Connect), or a Spark whose internals
    differ, nothing is stopped and the result is empty."""
    try:
        jvm = spark.sparkContext._jvm
        find = jvm.java.lang.Class.forName
        # SparkEnv's own methods cannot be reflected by Py4J (a signature names a class Spark does not ship), so
        # both fields are read through java.lang.reflect.Field: the object's current SparkEnv, its worker factories
        current = find("org.apache.spark.SparkEnv$").getDeclaredField("env")
        current.setAccessible(True)
        factories = find("org.apache.spark.SparkEnv").getDeclaredField("pythonWorkers")
        factories.setAccessible(True)
        entries = factories.get(current.get(None)).iterator()
        stopped = []
        while entries.hasNext():
            entry = entries.next()
            module = entry._1().workerModule()
            if module in PLANNING_WORKER_MODULES:
                entry._2().stop()
                stopped.append(module)
        return stopped
    except Exception as exc:        # no JVM here (Spark Connect), or another Spark's internals (Py4JError)
        log.debug("Spark's planning workers were not stopped: %s", exc)
        return []
