"""One local SparkSession for the whole test run (local[2], 2 shuffle partitions, no UI), shared by every
tests/test_spark*.py module through `spark_session()`; stopped when the interpreter exits."""
from __future__ import annotations

import atexit
import os
import pathlib
import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_SESSION: Any = None
ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def spark_session() -> Any:
    global _SESSION
    with _LOCK:
        if _SESSION is None:
            from pyspark.sql import SparkSession

            # Python workers are started by the JVM: they run this interpreter (the one spockwire is installed in)
            # and also find the test helpers through PYTHONPATH
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
            paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            if ROOT not in paths:
                os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])
            import spockwire
            from spockwire.spark.job import LOCAL_DRIVER_JAVA_OPTIONS
            from spockwire.spark.jvm_archive import driver_java_options

            _SESSION = (SparkSession.builder.master("local[2]").appName("spockwire-tests")
                        .config("spark.driver.defaultJavaOptions",        # as the job's session
                                driver_java_options(LOCAL_DRIVER_JAVA_OPTIONS))
                        # the workers decode with the implementation this process selected, whatever the
                        # environment held when the JVM started
                        .config("spark.executorEnv.SPOCKWIRE_IMPL", spockwire.__impl__)
                        .config("spark.ui.enabled", "false")
                        .config("spark.ui.showConsoleProgress", "false")
                        .config("spark.sql.shuffle.partitions", "2")
                        .config("spark.default.parallelism", "2")
                        .config("spark.sql.session.timeZone", "UTC")
                        .config("spark.driver.memory", "1g")
                        .config("spark.sql.streaming.pollingDelay", "10ms")
                        # a Python process the JVM starts may take long to connect back on a busy machine (the default is 15 s)
                        .config("spark.python.authenticate.socketTimeout", "120s")
                        # tiny test data: adaptive re-planning only adds jobs
                        .config("spark.sql.adaptive.enabled", "false")
                        .getOrCreate())
            _SESSION.sparkContext.setLogLevel("ERROR")
            import spockwire.spark

            spockwire.spark.register(_SESSION)
            atexit.register(_SESSION.stop)
        return _SESSION
