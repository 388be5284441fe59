"""Spark Connect: what differs when the session is a client of a Spark Connect server.

A Connect session (``SparkSession.builder.remote("sc://host:port")``) has no SparkContext, RDDs or JVM
gateway, and the functions it hands to the server -- a ``foreachBatch`` function above all -- are pickled and run
in a Python process of the server, not in the client. So a ``foreachBatch`` function cannot share objects with
the client (a lock, a list the client reads); what it must tell the client it writes to storage both see.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from .environment import is_connect

__all__ = ["is_connect", "connect_session", "start_query", "CheckpointQueryId", "ReportFiles", "tail_reports"]

#: what Spark says when a Python process it started did not connect back within its fixed 10 s
WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"


def connect_session(url: str, conf: dict[str, str] | None = None) -> Any:
    """A Spark Connect session on `url` (``sc://host:port``) with spockwire's data sources registered.

    `conf`: runtime settings of the session (the server's static settings -- master, executor environment --
    belong to the server's command line)."""
    # the Connect session's own builder: PySpark's generic one refuses a remote session in a process that also runs
    # a classic one (SESSION_ALREADY_EXIST)
    from pyspark.sql.connect.session import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
        spark.conf.set(key, value)
    import spockwire.spark

    spockwire.spark.register(spark)
    return spark


def start_query(start: Callable[[], Any], attempts: int = 5) -> Any:
    """``start()`` (a ``writeStream...start()``), tried again when the server's Python process for the query's
    ``foreachBatch`` did not connect back in time: Spark gives it a fixed 10 s, which a loaded server can miss (the
    process imports PySpark's Connect client first). The query did not start then, so starting it again is safe."""
    for attempt in range(attempts):
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 - PySpark's Connect errors have no common class for this
            if WORKER_DID_NOT_CONNECT not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")  # pragma: no cover


def _fs(path: str) -> tuple[Any, str]:
    from pyarrow import fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


class CheckpointQueryId:
    """The streaming query's id, read from its checkpoint (``<checkpoint>/metadata``, written when the query
    starts, before its first micro-batch): what a ``foreachBatch`` function running on the server knows of it."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint.rstrip("/")
        self._id: str | None = None

    def __call__(self) -> str:
        if self._id is None:
            fs, path = _fs(self.checkpoint + "/metadata")
            with fs.open_input_stream(path) as fh:
                self._id = str(json.loads(fh.read().decode().splitlines()[0])["id"])
        return self._id


class ReportFiles:
    """A ``foreachBatch`` function's report of each micro-batch (a dataclass) as one JSON file in `folder`,
    ``<batch id>.json`` (written under a temporary name, then renamed), for :func:`tail_reports` to read."""

    def __init__(self, folder: str) -> None:
        self.folder = folder.rstrip("/")

    def __call__(self, report: Any) -> None:
        fs, root = _fs(self.folder)
        fs.create_dir(root, recursive=True)
        data = asdict(report)
        final = f"{root}/{int(data.get('batch_id', 0)):012d}.json"
        with fs.open_output_stream(final + ".tmp") as out:
            out.write(json.dumps(data).encode())
        fs.move(final + ".tmp", final)


def tail_reports(folder: str, active: Callable[[], bool], make: Callable[[dict], Any],
                 on_report: Callable[[Any], None], interval: float = 0.2) -> threading.Thread:
    """A thread handing the reports :class:`ReportFiles` writes to `on_report` (``make`` turns one file's JSON
    into the report), in batch order, deleting each file once handed over; it ends once `active()` is false and
    the folder is drained."""
    fs, root = _fs(folder.rstrip("/"))

    def drain() -> None:
        from pyarrow import fs as pafs

        try:
            infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except FileNotFoundError:
            return
        for info in sorted((i for i in infos if i.path.endswith(".json")), key=lambda i: i.path):
            with fs.open_input_stream(info.path) as fh:
                data = json.loads(fh.read().decode())
            fs.delete_file(info.path)
            on_report(make(data))

    def run() -> None:
        checked = 0.0
        while True:
            drain()
            now = time.monotonic()
            if now - checked > 1.0:       # asking the server costs a round trip: once a second
                checked = now
                try:
                    running = active()
                except Exception:  # noqa: BLE001 - the session is gone: nothing more will come
                    running = False
                if not running:
                    drain()
                    return
            time.sleep(interval)

    thread = threading.Thread(target=run, name="spockwire-reports", daemon=True)
    thread.start()
    return thread
