"""SIGINT and SIGTERM as a request to stop the pipeline job (`python -m spockwire.spark.job`, `spockwire pipeline`):
the micro-batch being applied is finished and committed first; a second signal stops at once.

PySpark's SparkContext installs a SIGINT handler of its own when it starts (it cancels every running Spark job and
raises KeyboardInterrupt: the micro-batch in flight is cut off, and the next run reads it again), so the job calls
:func:`reclaim_signals` once its session has started."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

__all__ = ["stop_on_signals", "reclaim_signals"]

log = logging.getLogger("spockwire.pipeline")

#: the handler of the innermost `stop_on_signals` block running (None: none)
_active: Any = None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event that SIGINT and SIGTERM set (instead of ending the process) while the block runs."""
    stop = threading.Event()
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            # a second signal: at once (as after kill -9, the next run applies again what was not committed; the
            # JVM ends when its driver's pipe closes)
            log.warning("%s again: stopping at once", name)
            logging.shutdown()
            os._exit(128 + signum)
        log.info("%s: finishing the micro-batch being applied, then stopping (again: at once)", name)
        stop.set()

    global _active
    outer = _active
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        _active = handler
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _active = outer


def reclaim_signals() -> bool:
    """Install the running `stop_on_signals` block's handler for SIGINT again, after something else replaced it
    (PySpark's SparkContext does when it starts). False when no block runs, or not in the main thread."""
    if _active is None or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, _active)
    return True
