"""A throwaway Spark Connect server from the pyspark wheel, for tests and examples.

    with SparkConnectServer() as server:              # local[2], 127.0.0.1:<free port>
        spark = server.session()                       # SparkSession.builder.remote(server.url)
        spockwire.spark.register(spark)

The server is the wheel's ``org.apache.spark.sql.connect.service.SparkConnectServer`` started with
``bin/spark-submit`` (what ``sbin/start-connect-server.sh`` runs), in the foreground, in a process group of its own;
its Python workers (data source readers, ``foreachBatch`` functions) run `python` (default: this interpreter, so
they import the spockwire this process imports) with this process's ``PYTHONPATH``.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from ..spark.environment import spark_home

__all__ = ["SparkConnectServer", "spark_home", "SERVER_CLASS"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = re.compile(r"Spark Connect server started at: [^\s:]*:(\d+)")
_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.started.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.started.level = info
"""



def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SparkConnectServer:
    """A Spark Connect server on 127.0.0.1 (a free port), started by :meth:`start`, stopped by :meth:`stop`.

    `conf`: extra Spark settings (``--conf``); `env`: extra environment of the server (and so of its Python
    workers); `log`: the server's output file (default: in a temporary folder, see :attr:`log`)."""

    def __init__(self, *, master: str = "local[2]", conf: Mapping[str, str] | None = None,
                 python: str | None = None, env: Mapping[str, str] | None = None, driver_memory: str = "1g",
                 log: str | os.PathLike[str] | None = None) -> None:
        self.master = master
        self.python = python or sys.executable
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.streaming.pollingDelay": "10ms",
            # a Python process the JVM starts may take long to connect back on a busy machine (default 15 s)
            "spark.python.authenticate.socketTimeout": "120s",
            **dict(conf or {}),
        }
        self.env = dict(env or {})
        self.driver_memory = driver_memory
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.log = Path(log) if log is not None else None
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:<port>``, for ``SparkSession.builder.remote``."""
        if self.port is None:
            raise RuntimeError("the Spark Connect server is not started")
        return f"sc://127.0.0.1:{self.port}"

    def command(self, port: int, log4j: Path | None = None) -> list[str]:
        """The server's command line."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", self.master,
               "--name", "spockwire Spark Connect", "--driver-memory", self.driver_memory]
        if log4j is not None:
            cmd += ["--driver-java-options", f"-Dlog4j.configurationFile=file:{log4j}"]
        for key, value in {**self.conf, "spark.connect.grpc.binding.port": str(port)}.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + ["spark-internal"]

    def start(self, timeout: float = 300.0) -> "SparkConnectServer":
        """Start the server and wait until it accepts clients."""
        if self.proc is not None:
            return self
        self._tmp = tempfile.TemporaryDirectory(prefix="spockwire-connect-")
        if self.log is None:
            self.log = Path(self._tmp.name) / "server.log"
        # warnings and errors only, but the line saying where the server listens
        log4j = Path(self._tmp.name) / "log4j2.properties"
        log4j.write_text(_LOG4J)
        env = dict(os.environ, SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=self.python,
                   PYSPARK_DRIVER_PYTHON=self.python, **self.env)
        with open(self.log, "ab") as out:
            # a process group of its own: stop() ends the launcher script and the JVM together
            self.proc = subprocess.Popen(self.command(_free_port(), log4j), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            found = _STARTED.search(self.log.read_text(errors="replace"))
            if found:       # the port it bound (Spark moves to the next one when the chosen port was taken)
                self.port = int(found.group(1))
                return self
            code = self.proc.poll()
            if code is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start (exit code {code}):\n{tail}")
            time.sleep(0.2)

    def session(self) -> Any:
        """A Spark Connect session on this server."""
        from pyspark.sql.connect.session import SparkSession   # (also beside a classic session in this process)

        return SparkSession.builder.remote(self.url).getOrCreate()

    def log_tail(self, lines: int = 40) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after `timeout` seconds)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            except ProcessLookupError:
                pass
        self.port = None

    def cleanup(self) -> None:
        """Stop the server and remove its temporary folder (the log, unless one was given)."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "SparkConnectServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()
