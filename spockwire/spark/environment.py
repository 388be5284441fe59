"""What Spark needs outside this process, checked before it fails deep inside Spark.

* :func:`check_java`: the Java runtime the JVM is started with (``$JAVA_HOME/bin/java``, else ``java`` on
  ``PATH``, as Spark's launch scripts look for it), checked before a SparkSession is started.
* :func:`check_workers`: Spark's Python workers (the interpreter ``PYSPARK_PYTHON`` names, ``python3`` by default)
  can import this spockwire and what it needs there, the same version, checked by one tiny Python task;
  :class:`WorkerCheck` runs it in a thread while the caller goes on starting its query.

Both raise :class:`~spockwire.errors.SparkEnvironmentError` with one line that says what to install or set.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import SparkEnvironmentError

__all__ = ["JAVA_MAJOR", "check_java", "check_workers", "WorkerCheck", "worker_modules"]

JAVA_MAJOR = 17   # PySpark 4 runs on Java 17 or newer
JAVA_HINT = (f"install a Java {JAVA_MAJOR} runtime (Debian/Ubuntu: apt-get install openjdk-{JAVA_MAJOR}-jre-headless) "
             f"or set JAVA_HOME to a Java {JAVA_MAJOR} installation")

# Spark applications whose workers passed check_workers (by application id): Python workers are reused, so one
# check per application is enough
_CHECKED: set[str] = set()


def _java_release_major(java: str) -> int | None:
    """The major version a Java installation's ``release`` file states (``<home>/release`` beside ``bin/java``),
    or None when there is no such file: reading it costs no JVM start."""
    home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
    try:
        with open(os.path.join(home, "release"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major   # "1.8.0_402" is Java 8


def check_java() -> str:
    """The ``java`` Spark's launch scripts will run (``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``); raises
    SparkEnvironmentError, naming what to install, when there is none or it is older than Java 17.

    Nothing is checked when this process already runs a JVM for PySpark (an active SparkContext, or a gateway
    handed over through ``PYSPARK_GATEWAY_PORT``)."""
    if os.environ.get("PYSPARK_GATEWAY_PORT") or _active_spark_context():
        return ""
    home = os.environ.get("JAVA_HOME", "")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise SparkEnvironmentError(f"Spark needs Java and JAVA_HOME={home} has no bin/java: {JAVA_HINT}")
    else:
        found = shutil.which("java")
        if found is None:
            raise SparkEnvironmentError(f"Spark needs Java and there is none (no java on PATH, JAVA_HOME is not "
                                        f"set): {JAVA_HINT}")
        java = found
    major = _java_release_major(java)
    if major is not None and major < JAVA_MAJOR:
        raise SparkEnvironmentError(f"Spark needs Java {JAVA_MAJOR} or newer and {java} is Java {major}: "
                                    f"{JAVA_HINT}")
    return java


def _active_spark_context() -> bool:
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    return getattr(getattr(context, "SparkContext", None), "_active_spark_context", None) is not None


def worker_modules() -> tuple[str, ...]:
    """What Spark's Python workers must import for the spockwire sources, in the order they are reported: this
    spockwire's dependencies, psycopg2 (when this process has it: the sources' tasks connect to the server),
    spockwire, and its compiled modules when this process decodes with them."""
    import spockwire

    names = ["numpy", "pyarrow"]
    if importlib.util.find_spec("psycopg2") is not None:
        names.append("psycopg2")
    names.append("spockwire")
    if spockwire.__impl__ == "c":
        names += [m for m in ("spockwire.wire._decoder", "spockwire.connection._pump")
                  if importlib.util.find_spec(m) is not None]
    return tuple(names)


#: imported by the check's tasks once the modules it checks are there, so the workers it leaves are ready for the
#: sources' tasks (what they unpickle first); not reported: a worker without them fails the first task plainly
WARM_MODULES = ("spockwire.spark.datasource", "spockwire.spark.batch_files", "spockwire.spark.snapshot")


def _probe_function(modules: tuple[str, ...], warm: tuple[str, ...] = WARM_MODULES) -> Any:
    """The function one Python task runs on a worker: what it imports and what it cannot. A closure, so that it
    travels by value (the worker needs nothing of spockwire to run it) and never raises."""
    def probe() -> str:
        import importlib
        import json
        import os
        import sys

        found: dict[str, Any] = {"python": sys.executable, "prefix": sys.prefix,
                                 "version": "%d.%d.%d" % sys.version_info[:3], "errors": {}}
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - reported to the driver, whatever it is
                found["errors"][name] = f"{type(exc).__name__}: {exc}"
        module = sys.modules.get("spockwire")
        if module is not None and "spockwire" not in found["errors"]:
            found["spockwire"] = [getattr(module, "__version__", "?"),
                                  os.path.dirname(os.path.realpath(module.__file__ or ""))]
        if not found["errors"]:
            for name in warm:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001 - a warm-up only
                    pass
        return json.dumps(found)

    return probe


def _worker_python(spark: Any) -> str:
    """The interpreter Spark starts its Python workers with, as the driver knows it."""
    try:
        return str(spark.sparkContext.pythonExec)
    except Exception:  # noqa: BLE001 - a Spark Connect session has no SparkContext
        return os.environ.get("PYSPARK_PYTHON", "python3")


def _conf(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - not every session shows every setting
        return None


def _task_failure(exc: BaseException) -> str:
    """The line of a failed task's error (a JVM stack trace with the Python one inside) that says why."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for pattern in (r"\[[A-Z_]+\].*", r"Cannot run program.*", r"\w+(Error|Exception): .*"):
        for line in lines:
            found = re.search(pattern, line)
            if found:
                return found.group(0)[:400]
    return (lines[0] if lines else type(exc).__name__)[:400]


def _fix(worker_prefix: str | None) -> str:
    """What to set, for workers that run the environment at `worker_prefix` (None: not known)."""
    import spockwire

    if worker_prefix is not None and os.path.realpath(worker_prefix) == os.path.realpath(sys.prefix):
        # this very environment, with another import path
        where = os.path.dirname(os.path.dirname(os.path.realpath(spockwire.__file__)))
        return f"the workers run this driver's Python with another import path: put {where} first on PYTHONPATH"
    return (f"set PYSPARK_PYTHON (spark.pyspark.python under spark-submit) to {sys.executable}, the interpreter "
            "this spockwire runs in, before the SparkSession starts")


#: the most tasks the worker check runs at once (one per slot: each leaves a Python worker started)
MAX_PROBE_TASKS = 32


def check_workers(spark: Any) -> None:
    """Run one tiny Python task on `spark` and raise SparkEnvironmentError, in one line that names the worker
    interpreter and the fix, when Spark's Python workers cannot import this spockwire and what it needs there
    (:func:`worker_modules`), or import another spockwire: another version, or on a local master another copy.

    One check per Spark application, as one task per slot of the default parallelism (at most
    `MAX_PROBE_TASKS`): Python workers are reused, so the workers started here, their imports done, serve the
    first micro-batch's tasks side by side (a worker started by a task costs that task its start: 0.3-0.9 s on a
    busy 2-core machine)."""
    import spockwire

    app = _conf(spark, "spark.app.id")
    if app is not None and app in _CHECKED:
        return
    from pyspark.sql.functions import udf

    python = _worker_python(spark)
    fix = _fix(None)
    probe = udf(_probe_function(worker_modules()), "string", useArrow=False)
    try:
        tasks = max(1, min(int(spark.sparkContext.defaultParallelism), MAX_PROBE_TASKS))
        rows = spark.range(0, tasks, 1, tasks).select(probe().alias("found")).collect()
        row = next((r for r in rows if json.loads(r["found"])["errors"]), rows[0])
    except Exception as exc:  # noqa: BLE001 - whatever stopped the task is the message
        raise SparkEnvironmentError(f"Spark's Python workers ({python}) could not run a Python task "
                                    f"({_task_failure(exc)}): {fix}") from None
    found = json.loads(row["found"])
    python = found["python"] or python
    fix = _fix(found["prefix"])
    errors: dict[str, str] = found["errors"]
    if errors:
        names = ", ".join(errors)
        raise SparkEnvironmentError(f"Spark's Python workers run {python} (Python {found['version']}), which "
                                    f"cannot import {names} ({next(iter(errors.values()))}): {fix}")
    version, where = found["spockwire"]
    here = os.path.dirname(os.path.realpath(spockwire.__file__))
    local = (_conf(spark, "spark.master") or "local").startswith("local")
    if version != spockwire.__version__ or (local and where != here):
        raise SparkEnvironmentError(f"Spark's Python workers run {python}, which imports spockwire {version} "
                                    f"from {where}, not spockwire {spockwire.__version__} from {here} as this "
                                    f"driver does: {fix}")
    if app is not None:
        _CHECKED.add(app)


class WorkerCheck:
    """:func:`check_workers` of `spark` in a thread, started at once: the workers start and import while the caller
    registers its sources and starts its query (about 3.7 s of a pipeline job's start on 2 cores, otherwise spent
    before anything else). :meth:`result` waits for it and raises its SparkEnvironmentError."""

    def __init__(self, spark: Any) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(spark,), name="spockwire-worker-check", daemon=True)
        self._thread.start()

    def _run(self, spark: Any) -> None:
        try:
            check_workers(spark)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by result()
            self._error = exc

    def result(self) -> None:
        """Wait for the check; raise what it raised (SparkEnvironmentError when the workers cannot run spockwire)."""
        self._thread.join()
        if self._error is not None:
            raise self._error


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (a DataFrame's ``sparkSession`` included)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_home() -> Path:
    """SPARK_HOME: the environment's, else the installed pyspark package (which carries bin/, sbin/, jars/)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent
