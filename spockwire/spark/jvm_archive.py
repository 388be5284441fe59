"""A class-data-sharing archive for the local driver JVM: a job's Spark starts in about half the time.

Most of a local Spark driver's start is the JVM loading, verifying and linking the same ~15,000 classes every
time. Java 17 can keep them, ready to map, in a dynamic class-data-sharing archive made by a JVM that loaded them
(``-XX:ArchiveClassesAtExit``); a JVM started with ``-XX:SharedArchiveFile`` maps it instead. Measured here on
two cores: a local session with the job's JVM options had its first query's result in 4.8-5.1 s instead of
9.2-9.3 s, with about 40% less CPU (benchmarks/analysis.md).

:func:`driver_java_options` gives the options for the local driver JVM: the archive when there is one for this
Java and this Spark, made first when there is none (once per machine and Spark install, about 15 s, in a child
process: a Spark session that runs a query and a short streaming query, then exits so its JVM writes the archive).
The archive is written under a temporary name and renamed only once that JVM has exited cleanly, since a
truncated archive crashes the JVM that maps it; an archive for another Java, Spark or set of options has another
name, and one the JVM cannot use is ignored with a warning on stderr. One process makes it at a time (a lock
file); others go on without it meanwhile.

``SPOCKWIRE_JVM_ARCHIVE``: ``off`` never uses or makes one; a directory keeps the archives there (default:
``$XDG_CACHE_HOME/spockwire`` or ``~/.cache/spockwire``).
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import uuid

__all__ = ["ENV", "driver_java_options", "archive_path", "make_archive"]

ENV = "SPOCKWIRE_JVM_ARCHIVE"
#: JVM warnings (an archive it cannot use, among others) go to stderr: the job's stdout is its JSON lines
LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr"
MAKE_TIMEOUT_S = 300


def _folder() -> str | None:
    where = os.environ.get(ENV, "")
    if where.lower() == "off":
        return None
    if where:
        return where
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "spockwire")


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def archive_path(base_options: str) -> str | None:
    """Where the archive for this Java, this Spark install and the JVM options `base_options` is kept (None:
    archives are off, or there is no Java)."""
    folder, java = _folder(), _java()
    if folder is None or java is None:
        return None
    import pyspark

    # (the archive holds the jars' paths and times: another install of the same Spark, or the same one installed
    # again, needs an archive of its own)
    folder_of_jars = os.path.realpath(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    jars = sorted(glob.glob(os.path.join(folder_of_jars, "*.jar")))
    key = hashlib.sha256()
    for part in [java, str(os.path.getmtime(java)), pyspark.__version__, base_options, folder_of_jars,
                 *(f"{os.path.basename(j)}:{os.path.getsize(j)}:{os.path.getmtime(j)}" for j in jars)]:
        key.update(part.encode() + b"\0")
    return os.path.join(folder, f"spark-driver-{key.hexdigest()[:20]}.jsa")


def driver_java_options(base_options: str, make: bool = True) -> str:
    """`base_options` with the archive's options (made first when `make` and there is none) and the JVM's
    warnings sent to stderr."""
    path = archive_path(base_options)
    if path is not None and not os.path.exists(path) and make:
        make_archive(path, base_options)
    shared = f" -XX:SharedArchiveFile={path}" if path is not None and os.path.exists(path) else ""
    return f"{base_options}{shared} {LOG_TO_STDERR}"


def make_archive(path: str, base_options: str, wait: bool = False) -> bool:
    """Make the archive at `path` (see the module) unless it is there; False when it failed, or when another process
    is making it and not `wait` (with `wait`: once that one is done, make it if it is still not there)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False                        # another process is making it: start without it this time
        if os.path.exists(path):
            return True
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        print("spockwire: making the Spark driver's class archive (once per machine and Spark install; later "
              "starts are faster)", file=sys.stderr, flush=True)
        env = {k: v for k, v in os.environ.items() if k != ENV}
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        try:
            done = subprocess.run([sys.executable, "-m", "spockwire.spark.jvm_archive", tmp, base_options],
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=MAKE_TIMEOUT_S)
            ok = done.returncode == 0 and os.path.exists(tmp) and os.path.getsize(tmp) > 0
            if ok:
                os.replace(tmp, path)
            else:
                print(f"spockwire: the class archive was not made (exit {done.returncode}): Spark starts without "
                      f"it. {done.stderr.decode(errors='replace').strip()[-300:]}", file=sys.stderr, flush=True)
            return ok
        except subprocess.TimeoutExpired:
            print(f"spockwire: the class archive was not made within {MAKE_TIMEOUT_S} s: Spark starts without it",
                  file=sys.stderr, flush=True)
            return False
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def _dump(tmp: str, base_options: str) -> int:
    """In the child process: a local session whose JVM writes its loaded classes to `tmp` as it exits; 0 once it
    has exited cleanly."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("spockwire-class-archive")
             .config("spark.driver.defaultJavaOptions", f"{base_options} -XX:ArchiveClassesAtExit={tmp} "
                                                         f"{LOG_TO_STDERR}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.adaptive.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    # what a job's start and micro-batches load: a query collected as Arrow, a streaming query with foreachBatch
    df = spark.range(1000).selectExpr("id", "id % 7 AS k", "cast(id AS string) AS s")
    df.groupBy("k").count().toArrow()
    query = (spark.readStream.format("rate").option("rowsPerSecond", "100").load().writeStream
             .foreachBatch(lambda batch, batch_id: batch.toArrow()).trigger(availableNow=True).start())
    query.awaitTermination(120)
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is None or proc.stdin is None:
        return 1
    proc.stdin.close()                          # the JVM exits with its stdin closed, writing the archive first
    return proc.wait(timeout=MAKE_TIMEOUT_S)


if __name__ == "__main__":
    sys.exit(_dump(sys.argv[1], sys.argv[2]))
