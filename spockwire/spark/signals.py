"""SIGINT and SIGTERM as a request to stop the pipeline job (`python -m spockwire.spark.job`, `spockwire pipeline`):
the micro-batch being applied is finished and committed first; a second signal stops at once."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

__all__ = ["stop_on_signals"]

log = logging.getLogger("spockwire.pipeline")


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

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
