"""A throwaway PostgreSQL server for tests and benchmarks.

``PostgresServer`` runs ``initdb`` on a fresh temporary directory and starts a
server on a free TCP port of 127.0.0.1, tuned for speed rather than durability
(fsync off). As root, the server binaries are run as the ``postgres`` user
through ``runuser``, since initdb and postgres refuse to run as root.

    bindir = PostgresServer.available()
    if bindir is not None:
        with PostgresServer(bindir) as server:
            server.create_database("demo")
            engine = sqlalchemy.create_engine(server.url("demo"))
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

__all__ = ["PostgresServer", "PostgresServerError"]

_DEBIAN_GLOB = "/usr/lib/postgresql/*/bin"
_OS_USER = "postgres"
_DB_SUPERUSER = "postgres"
_HOST = "127.0.0.1"


class PostgresServerError(RuntimeError):
    """The server could not be initialised, started or stopped."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres", "pg_ctl"))


def _version_key(bindir: Path) -> tuple[int, ...]:
    """(15,) for /usr/lib/postgresql/15/bin; non-numeric versions sort first."""
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (-1,)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; an exited process that no one has reaped yet counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
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
    state = stat.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"])


class PostgresServer:
    """One temporary PostgreSQL cluster, started by ``start()`` and removed by ``stop()``."""

    def __init__(
        self,
        bindir: Path | str | None = None,
        *,
        startup_timeout: float = 30.0,
        shutdown_timeout: float = 15.0,
        max_connections: int = 200,
    ) -> None:
        found = Path(bindir) if bindir is not None else self.available()
        if found is None or not _has_server(found):
            where = found or _DEBIAN_GLOB
            raise PostgresServerError(
                f"no PostgreSQL server binaries (initdb, postgres, pg_ctl) in {where}"
            )
        self.bindir: Path = found
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.max_connections = max_connections
        self._as_root = os.geteuid() == 0
        self._tmpdir: Path | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ discovery

    @classmethod
    def available(cls) -> Path | None:
        """The bin directory of the newest PostgreSQL server installed, or None.

        Looks at Debian's /usr/lib/postgresql/*/bin first, then ``pg_config --bindir``.
        """
        candidates = sorted(
            (p for p in Path("/").glob(_DEBIAN_GLOB.lstrip("/")) if _has_server(p)),
            key=_version_key,
        )
        if candidates:
            return candidates[-1]
        pg_config = shutil.which("pg_config")
        if pg_config is None:
            return None
        try:
            out = subprocess.run(
                [pg_config, "--bindir"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        bindir = Path(out)
        return bindir if out and _has_server(bindir) else None

    # ------------------------------------------------------------------ properties

    @property
    def running(self) -> bool:
        return self._port is not None

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise PostgresServerError("the server is not running")
        return self._port

    @property
    def user(self) -> str:
        return _DB_SUPERUSER

    @property
    def datadir(self) -> Path:
        return self._dir / "data"

    @property
    def logfile(self) -> Path:
        return self._dir / "postgres.log"

    @property
    def _dir(self) -> Path:
        if self._tmpdir is None:
            raise PostgresServerError("the server has not been started")
        return self._tmpdir

    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy URL of database ``dbname`` on this server (psycopg 3 driver)."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{dbname}"

    def conninfo(self, dbname: str = "postgres") -> str:
        """libpq connection string of database ``dbname``, for psycopg.connect()."""
        return make_conninfo(host=self.host, port=self.port, user=self.user, dbname=dbname)

    def connect(
        self, dbname: str = "postgres", *, autocommit: bool = False
    ) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.conninfo(dbname), autocommit=autocommit, connect_timeout=5)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PostgresServer:
        """initdb a temporary cluster and start it; returns once it accepts connections."""
        if self._tmpdir is not None:
            raise PostgresServerError("the server was already started")
        tmpdir = Path(tempfile.mkdtemp(prefix="jobcontrol-pg-"))
        tmpdir.chmod(0o700)
        if self._as_root:
            entry = pwd.getpwnam(_OS_USER)
            os.chown(tmpdir, entry.pw_uid, entry.pw_gid)
        self._tmpdir = tmpdir
        atexit.register(self.stop)
        try:
            self._initdb()
            self._start_postmaster()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Fast shutdown (then immediate, then SIGKILL), and remove the temporary dir."""
        atexit.unregister(self.stop)
        tmpdir, self._tmpdir, self._port = self._tmpdir, None, None
        if tmpdir is None:
            return
        try:
            datadir = tmpdir / "data"
            pid = self._postmaster_pid(datadir)
            if pid is not None and _pid_alive(pid):
                for mode in ("fast", "immediate"):
                    try:
                        self._run(
                            [self._bin("pg_ctl"), "-D", str(datadir), "-m", mode, "-w"]
                            + ["-t", str(int(self.shutdown_timeout)), "stop"],
                            cwd=tmpdir,
                            timeout=self.shutdown_timeout + 10,
                        )
                    except (OSError, subprocess.SubprocessError):
                        pass
                    if self._wait_gone(pid, 5.0):
                        break
                else:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self._wait_gone(pid, 5.0)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    def halt(self) -> None:
        """Stop the server as an outage would (``pg_ctl stop -m fast``), keeping data and port."""
        if self._tmpdir is None:
            raise PostgresServerError("the server is not started")
        pid = self._postmaster_pid(self.datadir)
        self._run(
            [self._bin("pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"],
            cwd=self._dir,
            timeout=self.shutdown_timeout + 10,
        )
        if pid is not None and not self._wait_gone(pid, self.shutdown_timeout):
            raise PostgresServerError(f"postgres (pid {pid}) did not stop")

    def resume(self) -> None:
        """Start a halted server again on the same port."""
        if self._tmpdir is None or self._port is None:
            raise PostgresServerError("the server was never started")
        self._start_postmaster(port=self._port)

    def freeze(self) -> list[int]:
        """Hang the server without failing anything (SIGSTOP to the postmaster and every
        process of it): connections stay open and every statement waits. Its pids, for
        ``thaw``."""
        if self._tmpdir is None:
            raise PostgresServerError("the server is not started")
        pid = self._postmaster_pid(self.datadir)
        if pid is None:
            raise PostgresServerError("the server is not running")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids = [pid, *map(int, children)]
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        return pids

    @staticmethod
    def thaw(pids: list[int]) -> None:
        """Let a frozen server go on (SIGCONT to the pids ``freeze`` stopped)."""
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ databases

    def create_database(self, name: str) -> None:
        with self.connect(autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def terminate_connections(self, name: str) -> None:
        with self.connect(autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, after terminating the connections still open to it."""
        self.terminate_connections(name)
        with self.connect(autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    # ------------------------------------------------------------------ internals

    def _bin(self, name: str) -> str:
        return str(self.bindir / name)

    def _run(
        self, argv: list[str], *, cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        if self._as_root:
            argv = ["runuser", "-u", _OS_USER, "--", *argv]
        return subprocess.run(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _initdb(self) -> None:
        argv = [self._bin("initdb"), "-D", str(self.datadir), "-A", "trust"]
        argv += ["-U", _DB_SUPERUSER, "--no-sync", "-E", "UTF8", "--locale=C"]
        result = self._run(argv, cwd=self._dir, timeout=120)
        if result.returncode != 0:
            raise PostgresServerError(
                f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def _start_postmaster(self, port: int | None = None) -> None:
        last_error = ""
        fixed = port
        for _attempt in range(1 if fixed else 3):  # a free port may be taken before it binds
            port = fixed or _free_port()
            settings = {
                "port": str(port),
                "listen_addresses": _HOST,
                "unix_socket_directories": str(self._dir),
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "max_connections": str(self.max_connections),
            }
            options = " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
            argv = [self._bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile)]
            argv += ["-o", options, "-w", "-t", str(int(self.startup_timeout)), "start"]
            try:
                result = self._run(argv, cwd=self._dir, timeout=self.startup_timeout + 10)
            except subprocess.TimeoutExpired:
                raise PostgresServerError(
                    f"pg_ctl start timed out after {self.startup_timeout}s:\n{self._log_tail()}"
                ) from None
            if result.returncode == 0:
                self._port = port
                self._wait_ready()
                return
            last_error = f"{result.stdout}{result.stderr}\n{self._log_tail()}"
            if "could not bind" not in last_error and "already in use" not in last_error:
                break
        raise PostgresServerError(f"could not start postgres:\n{last_error}")

    def _wait_ready(self) -> None:
        """Poll with a real connection until the server answers, at most startup_timeout."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                with psycopg.connect(self.conninfo(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise PostgresServerError(
                        f"postgres did not accept connections within {self.startup_timeout}s:"
                        f" {exc}\n{self._log_tail()}"
                    ) from exc
                time.sleep(0.1)

    @staticmethod
    def _postmaster_pid(datadir: Path) -> int | None:
        try:
            first_line = (datadir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first_line)
        except (OSError, ValueError):
            return None

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except (OSError, PostgresServerError):
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])
