"""Users, roles and bearer tokens (core: no web framework here).

A token is ``jc_`` + ``secrets.token_urlsafe(32)``; only its sha256 is stored,
so it is shown once, when made. The first start of the daemon, with no users
at all, makes user ``admin`` and leaves its token in a mode 0600 file in the
user's config directory, where the CLI and the Qt client find it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobcontrol import places
from jobcontrol.errors import (
    BadRoleError,
    BadUserNameError,
    DuplicateUserError,
    StoreUnavailable,
    TokenFileError,
    UnknownUserError,
    UserError,
)
from jobcontrol.model import DISPATCHER_USER, TIMER_USER
from jobcontrol.service import audit
from jobcontrol.store import Store
from jobcontrol.store import access_queries as q

log = logging.getLogger(__name__)

TOKEN_PREFIX = "jc_"
ADMIN_USER = "admin"
# Who the audit trail names for the first-start admin.
BOOTSTRAP_USER = "jobcontrol"
NAME_MAX = 64
# Letters, digits and . _ @ -, starting with a letter or digit: no ':' so no name
# can pass for the CLI's 'local:<login>' audit entries.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
LAST_SEEN_EVERY = timedelta(minutes=1)
# The names Job Control itself writes where a user's name goes (a run's BY, an audit
# entry's USER): no user may pass for it.
RESERVED_NAMES = frozenset(
    {TIMER_USER, DISPATCHER_USER, BOOTSTRAP_USER, "dispatcher", "daemon", "system", "worker"}
)


class Action(enum.StrEnum):
    """What a request does, as far as permissions go."""

    READ = "read"
    RUN = "run"
    KILL = "kill"
    RESTART = "restart"
    ACTIVATE = "activate"  # and deactivate
    PAUSE = "pause"  # and resume the timers
    CREATE = "create"
    MODIFY = "modify"
    DELETE = "delete"
    MANAGE_USERS = "manage_users"
    VIEW_WORKERS = "workers:view"  # workers, lanes, the queue
    MANAGE_WORKERS = "workers:manage"  # drain and resume lanes, reprioritize queued runs
    CONFIGURE_LANES = "lanes:configure"  # add, set and remove lanes

    @property
    def says(self) -> str:
        """What the action does, in words: "which may not {says}"."""
        return _ACTION_WORDS[self]

    @classmethod
    def for_fields(cls, fields: Iterable[str]) -> Action:
        """A change of ``active`` alone is activate/deactivate; any other field is modify."""
        return cls.ACTIVATE if set(fields) <= {"active"} else cls.MODIFY


_ACTION_WORDS = {
    Action.READ: "read",
    Action.RUN: "run jobs",
    Action.KILL: "kill runs",
    Action.RESTART: "restart jobs",
    Action.ACTIVATE: "activate or deactivate jobs",
    Action.PAUSE: "pause or resume the timers",
    Action.CREATE: "create jobs",
    Action.MODIFY: "modify jobs or settings",
    Action.DELETE: "delete jobs",
    Action.MANAGE_USERS: "manage users",
    Action.VIEW_WORKERS: "view workers, lanes and the queue",
    Action.MANAGE_WORKERS: "drain or resume lanes and reprioritize queued runs",
    Action.CONFIGURE_LANES: "add, change or remove lanes",
}


class Role(enum.StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    def can(self, action: Action) -> bool:
        return action in PERMISSIONS[self]


_VIEWER = frozenset({Action.READ, Action.VIEW_WORKERS})
_OPERATOR = _VIEWER | {
    Action.RUN,
    Action.KILL,
    Action.RESTART,
    Action.ACTIVATE,
    Action.PAUSE,
    Action.MANAGE_WORKERS,
}
_ADMIN = _OPERATOR | {
    Action.CREATE,
    Action.MODIFY,
    Action.DELETE,
    Action.MANAGE_USERS,
    Action.CONFIGURE_LANES,
}
# The one place that says who may do what.
PERMISSIONS: dict[Role, frozenset[Action]] = {
    Role.VIEWER: _VIEWER,
    Role.OPERATOR: _OPERATOR,
    Role.ADMIN: _ADMIN,
}


@dataclass(frozen=True)
class User:
    id: int
    name: str
    role: Role
    created: datetime
    token_created: datetime
    last_seen: datetime | None

    def can(self, action: Action) -> bool:
        return self.role.can(action)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": str(self.role),
            "created": self.created.isoformat(),
            "token_created": self.token_created.isoformat(),
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
        }


def _user(row: Any) -> User:
    return User(
        id=int(row.id),
        name=row.name,
        role=Role(row.role),
        created=row.created,
        token_created=row.token_created,
        last_seen=row.last_seen,
    )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_name(name: str) -> str:
    if not name:
        raise BadUserNameError(name, "a user name cannot be empty")
    if len(name) > NAME_MAX:
        raise BadUserNameError(name, f"a user name has at most {NAME_MAX} characters")
    if not _NAME_RE.fullmatch(name):
        raise BadUserNameError(
            name,
            "a user name has letters, digits and . _ @ - only, and starts with a letter or digit",
        )
    if name.lower() in RESERVED_NAMES:
        raise BadUserNameError(
            name, "the name is Job Control's own (its runs and audit entries are named so)"
        )
    return name


def parse_role(user: str, role: str | Role) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise BadRoleError(user, str(role), ", ".join(r.value for r in Role)) from None


# ---------------------------------------------------------------- management


def add_user(
    store: Store, name: str, role: str | Role, *, by: str | None = None
) -> tuple[User, str]:
    """Create a user; returns it with its token (shown once: only the hash is kept).

    ``by`` names who asks: the request is then audited as 'user.add'.
    """
    with _maybe_audited(store, by, "user.add") as note:
        check_name(name)
        parsed = parse_role(name, role)
        token, now = _new_token(), datetime.now(UTC)
        with store.write() as conn:
            if q.user_row(conn, name) is not None:
                raise DuplicateUserError(name)
            clash = next(
                (u.name for u in q.all_users(conn) if u.name.lower() == name.lower()), None
            )
            if clash is not None:  # in the audit trail, `ADMIN` would pass for `admin`
                raise UserError(
                    name, f"user {clash!r} has the same name in another case: choose another"
                )
            q.insert_user(
                conn,
                {
                    "name": name,
                    "role": str(parsed),
                    "token_hash": hash_token(token),
                    "created": now,
                    "token_created": now,
                },
            )
            row = q.user_row(conn, name)
            _note_success(conn, note, f"added user {name!r} with role {parsed}")
    return _user(row), token


def remove_user(store: Store, name: str, *, by: str | None = None) -> None:
    """Remove a user (its token stops working at once). The last admin cannot be removed."""
    with _maybe_audited(store, by, "user.remove") as note, store.write() as conn:
        row = q.user_row(conn, name)
        if row is None:
            raise UnknownUserError(name)
        if row.role == Role.ADMIN and q.count_role_locked(conn, Role.ADMIN) == 1:
            raise UserError(name, "the last admin cannot be removed (add another admin first)")
        q.delete_user(conn, name)
        _note_success(conn, note, f"removed user {name!r} ({row.role})")


def new_token(
    store: Store, name: str, *, by: str | None = None, write_to: Path | None = None
) -> str:
    """A new token for the user, replacing the old one (which stops working); shown once.

    ``write_to``: also write it to this token file (mode 0600), before the change is
    committed, so a file that cannot be written leaves the old token working.
    """
    with _maybe_audited(store, by, "user.token") as note:
        token = _new_token()
        with store.write() as conn:
            if not q.set_token(conn, name, hash_token(token), datetime.now(UTC)):
                raise UnknownUserError(name)
            detail = f"new token for user {name!r}"
            if write_to is not None:
                write_token_file(write_to, token)
                detail += f", written to {write_to}"
            _note_success(conn, note, detail)
    return token


def known_tokens(store: Store) -> dict[str, User]:
    """Every user by its token's hash: what a daemon remembers from its start, so that a
    token valid then still reads its status and health through an outage that begins
    before it was used (a daemon restarted, then the database gone)."""
    with store.read() as conn:
        return {str(r.token_hash): _user(r) for r in q.all_users(conn) if r.token_hash}


def list_users(store: Store) -> list[User]:
    with store.read() as conn:
        return [_user(r) for r in q.all_users(conn)]


def get_user(store: Store, name: str) -> User:
    with store.read() as conn:
        row = q.user_row(conn, name)
    if row is None:
        raise UnknownUserError(name)
    return _user(row)


def _maybe_audited(store: Store, by: str | None, operation: str) -> Any:
    if by is None:
        from contextlib import nullcontext

        return nullcontext(None)
    return audit.scope(store, by, operation)


def _note_success(conn: Any, note: audit.AuditNote | None, detail: str) -> None:
    if note is not None:
        note.detail = detail
        audit.record_note(conn, note)


# ---------------------------------------------------------------- authentication


def authenticate(
    store: Store,
    token: str,
    *,
    now: datetime | None = None,
    known: dict[str, User] | None = None,
) -> User | None:
    """The user the token belongs to, or None. Records last_seen at most once a minute,
    when the database takes the write at once (never waiting for its lock).

    ``known`` (token hash -> user) remembers who authenticated: while the database
    does not answer, a token it accepted before still reads the daemon's status
    and health; one never seen gets the outage's ``StoreUnavailable``. Revocation
    takes effect as soon as the database answers again.
    """
    if not token or not token.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    try:
        with store.read() as conn:
            row = q.user_by_token_hash(conn, digest)
    except StoreUnavailable:
        if known is not None and digest in known:
            return known[digest]
        raise
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        if known is not None:
            known.pop(digest, None)
        return None
    now = now or datetime.now(UTC)
    user = _user(row)
    if known is not None:
        known[digest] = user
    if user.last_seen is None or now - user.last_seen >= LAST_SEEN_EVERY:
        # Bookkeeping: a request never waits for it or fails by it. While SQLite's write
        # lock is held (a backup, a long maintenance transaction) or its disk is full,
        # the read above still answers, and a status read must go on answering.
        try:
            with store.write(wait=False) as conn:
                q.touch_user(conn, user.id, now, now - LAST_SEEN_EVERY)
        except StoreUnavailable as exc:
            log.info(
                "last use of %s's token not recorded (the next request tries): %s", user.name, exc
            )
    return user


# ---------------------------------------------------------------- first start


def ensure_admin_token(store: Store, config_dir: Path) -> Path | None:
    """On first start (no users at all): make user 'admin', write its token to this
    database's token file in ``config_dir`` (mode 0600) and return that path.
    Otherwise do nothing. Another database's token file is never touched.

    The file is written before the user is committed, so a failure leaves no
    admin whose token nobody has.
    """
    path = places.token_file(config_dir, store.url)
    with store.write() as conn:
        if q.count_users(conn) > 0:
            return None
        token, now = _new_token(), datetime.now(UTC)
        q.insert_user(
            conn,
            {
                "name": ADMIN_USER,
                "role": str(Role.ADMIN),
                "token_hash": hash_token(token),
                "created": now,
                "token_created": now,
            },
        )
        detail = f"first start: user {ADMIN_USER!r} with role admin, token written to {path}"
        audit.record(conn, BOOTSTRAP_USER, "user.add", [], audit.Result.OK, detail)
        write_token_file(path, token)
    return path


def adopt_legacy_token(store: Store, config_dir: Path) -> Path | None:
    """Versions before tokens were kept per database wrote one ``config_dir/token`` for
    whichever database started first. When this database has no token file of its own
    and that file's token is one of this database's users', copy it to this database's
    file and return that path; otherwise do nothing (the old file is never changed)."""
    path = places.token_file(config_dir, store.url)
    if path.exists():
        return None
    token = places.read_token_file(config_dir / places.TOKEN_FILE)
    if token is None or not token.startswith(TOKEN_PREFIX):
        return None
    with store.read() as conn:
        row = q.user_by_token_hash(conn, hash_token(token))
    if row is None:
        return None  # another database's token
    write_token_file(path, token)
    return path


def write_token_file(path: Path, token: str) -> None:
    """Write atomically, mode 0600 from the first byte (never readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True)
            os.chmod(path.parent, 0o700)  # mkdir's mode is subject to the umask
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask can only take bits away; make it exact
            data = (token + "\n").encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TokenFileError(f"cannot write the admin token to {path}: {exc.strerror}") from exc
