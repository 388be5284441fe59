"""A throwaway Spark standalone cluster on this machine: one master and N workers, from the pyspark wheel.

``SparkCluster`` starts ``bin/spark-class org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``
(SPARK_HOME is the installed pyspark package, which ships Spark's jars and scripts; Java 17 must be on the PATH or
in JAVA_HOME) on 127.0.0.1 with free ports, each worker with its own work directory, waits until the master lists
every worker as ALIVE, and stops them all again at ``stop()`` (or at interpreter exit): every JVM, the executors
the workers started and their Python workers. ``kill_worker(i)`` crashes a worker and its executors with SIGKILL;
``start_worker(i)`` starts it again.

Example::

    with SparkCluster(workers=2, cores=1) as cluster:
        spark = (SparkSession.builder.master(cluster.master_url)
                 .config("spark.executor.memory", "512m").getOrCreate())

The executors run in processes of their own: their Python workers run the interpreter the driver's
``PYSPARK_PYTHON`` names, which must have spockwire installed, or find it through ``spark.executorEnv.PYTHONPATH``.
Set ``SPOCKWIRE_KEEP_SPARK=1`` to keep the work directory and the logs after ``stop()``.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Mapping

from ..spark.environment import spark_home
from .pgserver import _children_of, _free_port, _pid_alive

__all__ = ["SparkCluster", "SparkClusterError", "spark_home", "descendants"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class SparkClusterError(RuntimeError):
    """The cluster did not start, or a process of it did not stop."""



def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in _children_of(todo.pop()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class _Daemon:
    """A master or worker JVM (spark-class execs java, so the process is the JVM)."""

    name: str
    args: list[str]
    port: int
    webui_port: int
    workdir: Path
    proc: subprocess.Popen | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _stop_at_exit(ref: "weakref.ReferenceType[SparkCluster]") -> None:
    cluster = ref()
    if cluster is not None and not cluster.stopped:
        try:
            cluster.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


class SparkCluster:
    """A Spark standalone cluster on 127.0.0.1: a master and `workers` workers of `cores` cores and `memory` each.

    `env`: extra environment of the master and the workers (their executors inherit it). The JVMs run with
    ``SPARK_DAEMON_MEMORY`` = `daemon_memory`."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", *, daemon_memory: str = "256m",
                 env: Mapping[str, str] | None = None, base_dir: str | os.PathLike[str] | None = None,
                 start_timeout: float = 120.0, worker_timeout: int = 10, keep: bool | None = None) -> None:
        self.home = spark_home()
        self.host = "127.0.0.1"
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.keep = keep if keep is not None else os.environ.get("SPOCKWIRE_KEEP_SPARK", "") not in ("", "0")
        self.tmpdir = Path(tempfile.mkdtemp(prefix="spockwire-spark-", dir=base_dir))
        self._env = dict(os.environ)
        self._env.update({"SPARK_HOME": str(self.home), "SPARK_DAEMON_MEMORY": daemon_memory,
                          "SPARK_LOCAL_IP": self.host, "SPARK_LOG_DIR": str(self.tmpdir / "logs"),
                          "SPARK_CONF_DIR": str(self.tmpdir / "conf")})
        self._env.update(env or {})
        (self.tmpdir / "conf").mkdir()
        # the master declares a worker lost after `worker_timeout` seconds without a heartbeat (Spark: 60)
        (self.tmpdir / "conf" / "spark-defaults.conf").write_text(f"spark.worker.timeout {worker_timeout}\n")
        port, ui = _free_port(), _free_port()
        self.master = _Daemon("master", [MASTER_CLASS, "--host", self.host, "--port", str(port),
                                         "--webui-port", str(ui)], port, ui, self.tmpdir / "master")
        #: the web UI port of every worker started, and its index (a worker started again gets new ports)
        self.webui_ports: dict[int, int] = {}
        self.workers: list[_Daemon] = [self._worker(i) for i in range(workers)]
        self.stopped = False
        atexit.register(_stop_at_exit, weakref.ref(self))

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: what a SparkSession's master is set to."""
        return f"spark://{self.host}:{self.master.port}"

    @property
    def master_webui(self) -> str:
        return f"http://{self.host}:{self.master.webui_port}"

    def _worker(self, index: int) -> _Daemon:
        port, ui = _free_port(), _free_port()
        workdir = self.tmpdir / f"worker-{index}"
        self.webui_ports[ui] = index
        return _Daemon(f"worker-{index}", [WORKER_CLASS, self.master_url, "--host", self.host, "--port", str(port),
                                           "--webui-port", str(ui), "--cores", str(self.cores), "--memory",
                                           self.memory, "--work-dir", str(workdir)], port, ui, workdir)

    # -- starting ----------------------------------------------------------------------------------------------
    def __enter__(self) -> "SparkCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _launch(self, daemon: _Daemon) -> None:
        daemon.workdir.mkdir(parents=True, exist_ok=True)
        daemon.log = open(self.tmpdir / f"{daemon.name}.log", "ab")
        # a session of its own: stop() signals the whole group, whatever the JVM started
        daemon.proc = subprocess.Popen([str(self.home / "bin" / "spark-class"), *daemon.args], env=self._env,
                                       cwd=daemon.workdir, stdin=subprocess.DEVNULL, stdout=daemon.log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> "SparkCluster":
        """Start the master, then the workers; return once the master lists every worker as ALIVE."""
        try:
            if not self.master.running:
                self._launch(self.master)
                self._wait(lambda s: s is not None, "the master's web UI to answer")
            for worker in self.workers:
                if not worker.running:
                    self._launch(worker)
            self.wait_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, index: int, wait: bool = True) -> None:
        """Start worker `index` again (after :meth:`kill_worker`), on new ports; with `wait`, return once the master
        lists it as ALIVE. (The master lists the killed one as ALIVE until its worker timeout passed:
        :meth:`wait_workers` waits for both.)"""
        if self.workers[index].running:
            return
        worker = self.workers[index] = self._worker(index)
        self._launch(worker)
        if wait:
            self._wait(lambda s: s is not None and any(int(w["port"]) == worker.port and w.get("state") == "ALIVE"
                                                       for w in s.get("workers", [])), f"{worker.name} to register")

    def state(self) -> dict[str, Any] | None:
        """The master's state (its web UI's ``/json/``: workers, applications), or None when it does not answer."""
        try:
            with urllib.request.urlopen(self.master_webui + "/json/", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):      # not listening yet, or still starting (its HTML page answers)
            return None

    def wait_workers(self) -> None:
        """Until the workers the master lists as ALIVE are exactly the running ones (each registered with its
        cores; a killed one declared lost: after the master's worker timeout)."""
        def ready(state: dict[str, Any] | None) -> bool:
            if state is None:
                return False
            alive = {int(w["port"]) for w in state.get("workers", []) if w.get("state") == "ALIVE"}
            return alive == {w.port for w in self.workers if w.running}

        self._wait(ready, "the running workers, and only them, to be ALIVE at the master")

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            for daemon in [self.master, *self.workers]:
                if daemon.proc is not None and daemon.proc.poll() is not None and daemon.log is not None:
                    raise SparkClusterError(f"the {daemon.name} exited with {daemon.proc.returncode} while waiting "
                                            f"for {what}: {self.log_tail(daemon.name)}")
            if ready(self.state()):
                return
            if time.monotonic() > deadline:
                raise SparkClusterError(f"timed out after {self.start_timeout:.0f}s waiting for {what}: "
                                        f"{self.log_tail('master')}")
            time.sleep(0.2)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.tmpdir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # -- processes ---------------------------------------------------------------------------------------------
    def worker_of(self, pid: int) -> int | None:
        """The index of the worker `pid` runs under (the worker JVM itself, an executor, a Python worker)."""
        for i, worker in enumerate(self.workers):
            if worker.pid is not None and (pid == worker.pid or pid in descendants(worker.pid)):
                return i
        return None

    def executors(self, index: int) -> list[int]:
        """The pids of the executor JVMs worker `index` runs."""
        worker = self.workers[index]
        if not worker.running or worker.pid is None:
            return []
        return [p for p in descendants(worker.pid) if EXECUTOR_CLASS in _cmdline(p)]

    def kill_worker(self, index: int, timeout: float = 60.0) -> list[int]:
        """SIGKILL worker `index` and its executor JVMs at once (a machine of the cluster lost). Waits until every
        process that ran under it (its executors' Python workers too) is gone; returns their pids."""
        worker = self.workers[index]
        if worker.pid is None or not worker.running:
            return []
        family = descendants(worker.pid)
        for pid in [worker.pid, *[p for p in family if EXECUTOR_CLASS in _cmdline(p)]]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while any(_pid_alive(p) for p in family):
            if time.monotonic() > deadline:
                left = [p for p in family if _pid_alive(p)]
                raise SparkClusterError(f"processes of the killed {worker.name} still alive after {timeout:.0f}s: "
                                        f"{[(p, _cmdline(p)[:120]) for p in left]}")
            time.sleep(0.05)
        if worker.log is not None:
            worker.log.close()
        return [worker.pid, *family]

    # -- stopping ----------------------------------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers (and every executor and Python worker under them), then the master; SIGTERM first,
        SIGKILL for whatever is still alive after `timeout` seconds. Removes the work directory."""
        daemons = [d for d in [*self.workers, self.master] if d.proc is not None]
        family: set[int] = set()
        for daemon in daemons:
            if daemon.running:
                family.update(descendants(daemon.proc.pid))
                family.add(daemon.proc.pid)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in family:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for daemon in daemons:
                try:
                    os.killpg(daemon.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + timeout
            while any(_pid_alive(p) for p in family) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not any(_pid_alive(p) for p in family):
                break
        for daemon in daemons:
            try:
                daemon.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            if daemon.log is not None and not daemon.log.closed:
                daemon.log.close()
        self.stopped = True
        left = [p for p in family if _pid_alive(p)]
        if not self.keep:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if left:
            raise SparkClusterError(f"processes of the Spark cluster still alive: {left}")
