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


def read_token_file(config_dir: Path) -> str | None:
    """The token in ``config_dir/token``, or None when there is no such file."""
    try:
        return (config_dir / TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def daemon_tag(db_url: str) -> str:
    """The daemon's files are named after its (normalised) database URL."""
    return hashlib.sha256(db_url.encode()).hexdigest()[:10]


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
