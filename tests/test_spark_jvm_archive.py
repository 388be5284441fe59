"""The local driver JVM's class archive (spockwire.spark.jvm_archive): Spark's classes come from it, a failed
making leaves no archive (a truncated one would crash the JVM that maps it) and says so in one line, one process
makes it at a time, and ``SPOCKWIRE_JVM_ARCHIVE=off`` turns it off."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spockwire.spark import jvm_archive
from spockwire.spark.job import LOCAL_DRIVER_JAVA_OPTIONS

ROOT = Path(__file__).resolve().parents[1]

SESSION = """
import sys
from spockwire.spark.job import spark_session
spark = spark_session(conf={"spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1]})
spark.range(10).selectExpr("sum(id)").toArrow()
print(spark.sparkContext.getConf().get("spark.driver.defaultJavaOptions"))
"""


def test_the_driver_loads_sparks_classes_from_the_archive(tmp_path):
    path = jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS)
    assert path is not None
    assert jvm_archive.make_archive(path, LOCAL_DRIVER_JAVA_OPTIONS, wait=True)
    log = tmp_path / "classes.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SESSION, str(log)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={path}" in done.stdout
    assert "Unable to use shared archive" not in done.stderr
    # (the lambdas' classes, generated as the JVM runs, are not archived)
    loads = [line for line in log.read_text().splitlines() if " org.apache.spark." in line and "$$Lambda" not in line]
    shared = [line for line in loads if "source: shared objects file (top)" in line]
    assert loads and len(shared) > 0.9 * len(loads), (len(shared), len(loads), [x for x in loads if x not in shared][:5])
    assert any("org.apache.spark.SparkContext " in line for line in shared)


def test_a_failed_making_leaves_no_archive_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path))
    bad = "-Xmx1k"       # (Spark starts its JVM ignoring unknown -XX options; a heap this small stops it)
    options = jvm_archive.driver_java_options(bad)
    assert "SharedArchiveFile" not in options and options.startswith(bad)
    assert not [p for p in os.listdir(tmp_path) if p.endswith((".jsa", ".tmp"))], os.listdir(tmp_path)
    err = capsys.readouterr().err
    assert "the class archive was not made" in err and "Spark starts without it" in err


def test_one_process_makes_it_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path))
    path = jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS)
    with open(path + ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert jvm_archive.make_archive(path, LOCAL_DRIVER_JAVA_OPTIONS) is False     # did not wait, made none
        options = jvm_archive.driver_java_options(LOCAL_DRIVER_JAVA_OPTIONS)
    assert "SharedArchiveFile" not in options and not os.path.exists(path)


def test_archives_are_per_options_and_off_turns_them_off(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.ENV, str(tmp_path))
    a = jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS)
    b = jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS + " -Xmx2g")
    assert a != b and os.path.dirname(a) == str(tmp_path)
    monkeypatch.setenv(jvm_archive.ENV, "off")
    assert jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS) is None
    assert jvm_archive.driver_java_options("-Xmx1g") == f"-Xmx1g {jvm_archive.LOG_TO_STDERR}"


def test_another_install_of_the_same_spark_has_an_archive_of_its_own(tmp_path, monkeypatch):
    """The archive records the jars' paths: a JVM of another install (a virtualenv's pyspark, the same jars) cannot
    map it, so it is another archive."""
    import pyspark

    here = jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS)
    copy = tmp_path / "pyspark"
    (copy / "jars").mkdir(parents=True)
    for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar"):      # the same names and sizes (sparse)
        with open(copy / "jars" / jar.name, "wb") as f:
            f.truncate(jar.stat().st_size)
    monkeypatch.setattr(pyspark, "__file__", str(copy / "__init__.py"))
    assert jvm_archive.archive_path(LOCAL_DRIVER_JAVA_OPTIONS) != here
