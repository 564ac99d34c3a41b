"""Finding a daemon and the token to use, as the CLI and the Qt client both do.

The daemon is ``--url`` (or ``$JOBCONTROL_URL``), else the URL file the daemon
of the database left in the state directory while its pid file is live. The
token is ``--token``, else ``$JOBCONTROL_TOKEN``, else the database's token file
in the config directory (written by the daemon's first start). Nothing here needs the
engine, the store or SQLAlchemy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobcontrol import places
from jobcontrol.errors import JobControlError


@dataclass(frozen=True)
class Target:
    url: str
    source: str  # where the URL came from, for messages


@dataclass(frozen=True)
class Token:
    value: str | None
    source: str  # where it came from; never the token itself


def find_daemon(url: str | None, db: str, state_dir: Path | None) -> Target | None:
    """The daemon to talk to: ``url``, ``$JOBCONTROL_URL``, or the live daemon of ``db``."""
    if url:
        return Target(url, "--url")
    if os.environ.get("JOBCONTROL_URL"):
        return Target(os.environ["JOBCONTROL_URL"], "$JOBCONTROL_URL")
    state = state_dir or places.state_dir_default()
    url_file = places.url_file(state, db)
    try:
        found = url_file.read_text().strip()
    except OSError:
        return None
    if not found or places.live_pid(places.pid_file(state, db)) is None:
        return None
    return Target(found, f"the daemon's URL file {url_file}")


def token_path(db: str | None = None) -> Path:
    """The token file of the database ``db`` (default ``$JOBCONTROL_DB``, else the default)."""
    return places.token_file(places.default_config_dir(), _db_url(db))


def find_token(token: str | None, db: str | None = None) -> Token:
    """The token to use: ``token`` (from ``--token``), ``$JOBCONTROL_TOKEN``, the token
    file of the database ``db``, else the one token file older versions kept for every
    database (a daemon adopts it as its database's file when it is that database's)."""
    if token:
        return Token(token, "the token given with --token")
    if os.environ.get("JOBCONTROL_TOKEN"):
        return Token(os.environ["JOBCONTROL_TOKEN"], "the token in $JOBCONTROL_TOKEN")
    path = token_path(db)
    legacy = places.default_config_dir() / places.TOKEN_FILE
    for candidate, source in (
        (path, f"the token file {path}"),
        (legacy, f"the token file {legacy} (of an older version)"),
    ):
        try:
            value = places.read_token_file(candidate)
        except OSError as exc:
            raise JobControlError(
                f"cannot read the token file {candidate}: {exc.strerror}"
            ) from None
        if value is not None:
            return Token(value, source)
    return Token(None, f"no token: neither --token nor $JOBCONTROL_TOKEN, and no {path}")


def token_option_warning(db: str | None = None) -> str:
    """What to say when a token is given with ``--token``: a command line is public."""
    return (
        "warning: --token puts the token on the command line, where every local user "
        "sees it (ps, /proc); set $JOBCONTROL_TOKEN instead, or leave the token in the "
        f"token file {token_path(db)} (mode 0600), which is read when neither is given"
    )


def _db_url(db: str | None) -> str:
    """The normalised URL of ``db``, ``$JOBCONTROL_DB`` or the default database."""
    return places.normalise_url(db or os.environ.get("JOBCONTROL_DB") or places.default_db_path())


def daemon_url(db: str | None, state_dir: Path | None) -> str | None:
    """The address of the live local daemon of ``db`` as its URL file says now (None when
    none runs): a client that found it there reads it again to follow a restart."""
    target = find_daemon(None, _db_url(db), state_dir)
    return target.url if target is not None else None


def locate(
    url: str | None = None,
    token: str | None = None,
    db: str | None = None,
    state_dir: Path | None = None,
) -> tuple[Target | None, Token]:
    """The daemon and the token to use, found as the online CLI finds them (for other clients)."""
    # As the CLI does: the daemon's files are named after the normalised URL.
    db_url = _db_url(db)
    return find_daemon(url, db_url, state_dir), find_token(token, db_url)
