"""Where Job Control keeps things on a machine: the default database, the state and
config directories, and the files a running daemon leaves for its clients.

A leaf: the CLI, the daemon and the API client (so the Qt client) all find a
daemon through this, and none of them needs the engine or SQLAlchemy for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# The one token file of versions before tokens were kept per database (still read).
TOKEN_FILE = "token"


def normalise_url(url_or_path: str) -> str:
    """A bare path means a SQLite file; URLs pass through."""
    if "://" in url_or_path:
        return url_or_path
    return f"sqlite:///{Path(url_or_path).expanduser().resolve()}"


def default_db_path() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return str(Path(base) / "jobcontrol" / "jobcontrol.db")


def state_dir_default() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "jobcontrol"


def default_config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "jobcontrol"


def read_token_file(path: Path) -> str | None:
    """The token in the file ``path``, or None when there is no such file."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def database_identity(db_url: str) -> str:
    """The database a (normalised) URL names: the URL without its password, which can
    change while the database stays the same."""
    parts = urlsplit(db_url)
    if parts.password is None:
        return db_url
    netloc = parts.netloc.rpartition("@")[2]
    if parts.username is not None:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def daemon_tag(db_url: str) -> str:
    """A database's daemon files and token file are named after its identity."""
    return hashlib.sha256(database_identity(db_url).encode()).hexdigest()[:10]


def token_file(config_dir: Path, db_url: str) -> Path:
    """Where the admin token of this database is kept for its local clients: one file
    per database, so two databases of one user never overwrite each other's."""
    return config_dir / f"{TOKEN_FILE}-{daemon_tag(db_url)}"


def pid_file(state_dir: Path, db_url: str) -> Path:
    return state_dir / f"daemon-{daemon_tag(db_url)}.pid"


def url_file(state_dir: Path, db_url: str) -> Path:
    """Where a running daemon leaves its admin API's URL for clients to find."""
    return state_dir / f"daemon-{daemon_tag(db_url)}.url"


def live_pid(path: Path) -> int | None:
    """The pid of the daemon holding the pid file ``path``, or None if no live daemon holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            content = os.pread(fd, 64, 0).decode().strip()
            return int(content) if content.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # stale: nobody holds it
    finally:
        os.close(fd)
