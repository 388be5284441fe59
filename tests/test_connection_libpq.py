"""The pumps call psycopg2's own libpq: whichever it is (the system's, psycopg2-binary's private copy), and whatever
other libpqs the process holds."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import spockwire
from spockwire.connection import libpq

PUMP_MODULES = {"c": "spockwire.connection._pump", "python": "spockwire.connection._pump_py"}


def _maps(tmp_path, *paths):
    f = tmp_path / "maps"
    f.write_text("".join(f"7f00-7f10 r-xp 00000000 fe:00 {i}    {p}\n" for i, p in enumerate(paths, 1)))
    return str(f)


def test_one_libpq_mapped_several_times_is_one(tmp_path):
    maps = _maps(tmp_path, "/usr/lib/x86_64-linux-gnu/libpq.so.5.15", "/usr/lib/x86_64-linux-gnu/libpq.so.5.15",
                 "/usr/lib/libpqxx-7.so", "/usr/lib/x86_64-linux-gnu/libssl.so.3")
    assert libpq.loaded_libpqs(maps) == {"/usr/lib/x86_64-linux-gnu/libpq.so.5.15"}


def test_the_compiled_pump_links_no_libpq():
    module = importlib.import_module(PUMP_MODULES["c"])
    out = subprocess.run(["ldd", module.__file__], capture_output=True, text=True, check=True).stdout
    assert "libpq" not in out, out


@pytest.mark.parametrize("name", sorted(PUMP_MODULES))
def test_pumps_call_the_libpq_psycopg2_loaded(name):
    import psycopg2  # noqa: F401 - loads psycopg2's libpq, the only one in this process

    module = importlib.import_module(PUMP_MODULES[name])
    (expected,) = libpq.loaded_libpqs()
    assert libpq.pump_libpq(module) == expected
    assert libpq.loaded_libpqs() == {expected}   # binding loaded nothing


def _system_libpq() -> str:
    import psycopg2  # noqa: F401

    (path,) = libpq.loaded_libpqs()
    return path


def test_another_libpq_in_the_process_makes_no_difference(pg_db, tmp_path):
    """A second copy of libpq loaded with RTLD_GLOBAL after psycopg2 (as another library could): both pumps still
    call psycopg2's and stream correctly."""
    copy = tmp_path / "elsewhere" / "libpq-other.so.5"
    copy.parent.mkdir()
    shutil.copy(_system_libpq(), copy)
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    script = textwrap.dedent(f"""
        import ctypes, json, os
        import psycopg2
        ctypes.CDLL({str(copy)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        import spockwire
        from spockwire.connection import create_publication, create_slot, libpq
        from spockwire.connection import _pump, _pump_py
        dsn = {pg_db.dsn!r}
        create_publication(dsn, "pub")
        out = {{"libpqs": sorted(libpq.loaded_libpqs())}}
        for pump, module in (("c", _pump), ("python", _pump_py)):
            slot = "s_" + pump + "_" + {pg_db.name!r}
            create_slot(dsn, slot, "pgoutput")
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            first = 1000 if pump == "c" else 2000
            conn.cursor().execute("INSERT INTO t SELECT g FROM generate_series(%s, %s) g", (first, first + 9))
            conn.close()
            with spockwire.connect(dsn, slot=slot, publication="pub", pump=pump) as stream:
                ids = [i for b in stream.record_batches(idle_timeout=1.0) for i in b.column("id").to_pylist()]
            out[pump] = {{"libpq": libpq.pump_libpq(module), "ids": ids}}
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["libpqs"]) == 2                   # the system's and the copy
    system = _system_libpq()
    assert out["c"]["libpq"] == out["python"]["libpq"] == system
    assert out["c"]["ids"] == list(range(1000, 1010)) and out["python"]["ids"] == list(range(2000, 2010))


def test_psycopg2_binary(pg_db, tmp_path):
    """With psycopg2-binary (its own private libpq, next to the system's) both pumps stream from a real server
    through psycopg2-binary's libpq. Runs in a virtualenv of its own holding psycopg2-binary, numpy and pyarrow
    (from the wheels the setup step fetched) and this spockwire."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # from the wheels the setup step fetched (scripts/setup-machine.sh), never from the network
    wheelhouse = Path(os.environ.get("SPOCKWIRE_WHEELHOUSE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                                     or Path.home() / ".cache") / "spockwire" / "wheelhouse")
    assert wheelhouse.is_dir(), f"{wheelhouse} is missing: scripts/setup-machine.sh fetches it"
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input",
                           "--no-index", "--find-links", str(wheelhouse), "psycopg2-binary", "numpy", "pyarrow"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip could not install psycopg2-binary from {wheelhouse}: " + proc.stderr[-2000:]
    # this spockwire (the installed one under test), without the rest of this interpreter's packages
    only = tmp_path / "only-spockwire"
    only.mkdir()
    os.symlink(Path(spockwire.__file__).parent, only / "spockwire")
    pg_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    script = textwrap.dedent(f"""
        import json
        import psycopg2
        import spockwire
        from spockwire.connection import create_publication, create_slot, libpq
        from spockwire.connection import _pump, _pump_py
        dsn = {pg_db.dsn!r}
        create_publication(dsn, "pub")
        out = {{"psycopg2": psycopg2.__file__, "libpqs": sorted(libpq.loaded_libpqs())}}
        for k, (pump, module) in enumerate((("c", _pump), ("python", _pump_py))):
            slot = "b_" + pump + "_" + {pg_db.name!r}
            create_slot(dsn, slot, "pgoutput")
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            conn.cursor().execute("INSERT INTO t SELECT g FROM generate_series(%s, %s) g", (k * 100, k * 100 + 49))
            conn.close()
            with spockwire.connect(dsn, slot=slot, publication="pub", pump=pump) as stream:
                ids = [i for b in stream.record_batches(idle_timeout=1.0) for i in b.column("id").to_pylist()]
            out[pump] = {{"libpq": libpq.pump_libpq(module), "ids": ids, "impl": stream.impl}}
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPOCKWIRE_IMPL")}
    env["PYTHONPATH"] = str(only)
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert str(venv) in out["psycopg2"]
    (binary_libpq,) = [p for p in out["libpqs"] if "psycopg2_binary.libs" in p]
    for k, pump in enumerate(("c", "python")):
        assert out[pump]["impl"] == pump
        assert out[pump]["libpq"] == binary_libpq
        assert out[pump]["ids"] == list(range(k * 100, k * 100 + 50))
