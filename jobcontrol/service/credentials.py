"""Worker credentials: PostgreSQL logins that may work the run queue and nothing else.

Why a database role and not a token for the admin API: a worker's whole job is
the run queue's statements (claim with ``FOR UPDATE SKIP LOCKED``, heartbeat,
finish, LISTEN for wake-ups), and PostgreSQL can enforce exactly that set with
privileges, per table and per column, with no second network path through the
daemon to keep up (or to fail over when the daemon has a standby). The daemon's
API stays for people and their tools.

Each database has a group role, ``jc_workers_<database>``, holding the grants;
each login (``jobcontrol worker-credentials add NAME``) is ``jcw_<NAME>``, a member
of it. The grants:

* ``run``: read; update only the columns a worker writes (state, times, pid,
  host, worker, log path, outcome, lease, usage). It cannot queue, delete or
  re-aim runs (no insert, no update of command, env, cwd, queue, priority,
  kill_requested).
* ``worker``: read, insert, update (its own registry row and heartbeat).
* ``lane``: read, and update of ``updated_at`` alone, which PostgreSQL requires
  for the claim's ``FOR UPDATE`` lock on a capped lane's row.
* ``run_log``, where it exists: read, insert, delete (its runs' output).
* ``jc_meta``, ``alembic_version``: read (the instance id, the schema's revision).

Nothing on ``job``, ``app_user``, ``api_token``, ``audit``: a worker can neither
read nor change job definitions, users, tokens or the audit trail. It does read
the commands and environments of the runs in the queue, which it exists to run:
a worker host is trusted with every task of the lanes it may claim.

The password is made here and sent to the server only as a SCRAM-SHA-256
verifier, so it is in no server log; the URL with it is printed once (or written
0600) for the worker's ``$JOBCONTROL_DB``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from jobcontrol.errors import JobControlError, OptionError
from jobcontrol.service import audit
from jobcontrol.store import Store, redact

LOGIN = re.compile(r"[a-z0-9_]{1,40}")
SCRAM_ITERATIONS = 4096

RUN_COLUMNS = (
    "state",
    "started",
    "ended",
    "duration_ms",
    "pid",
    "host",
    "worker",
    "log_path",
    "reason",
    "exit_status",
    "signal",
    "lease_until",
    "cpu_us",
    "mem_peak_bytes",
)


def role_name(name: str) -> str:
    if not LOGIN.fullmatch(name):
        raise OptionError(
            f"worker login {name!r}: use 1 to 40 lower-case letters, digits and _ "
            "(it becomes the PostgreSQL role jcw_NAME)"
        )
    return f"jcw_{name}"


def group_name(database: str) -> str:
    return ("jc_workers_" + re.sub(r"[^a-z0-9_]", "_", database.lower()))[:63]


def _require_postgresql(store: Store) -> None:
    if store.is_sqlite:
        raise JobControlError(
            f"worker credentials are PostgreSQL logins; {redact(store.url)} is SQLite, whose "
            "tasks the daemon's embedded worker runs"
        )


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password (RFC 5802, 7677)."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def grant(conn: Any, group: str) -> None:
    """(Re)apply the group's grants: after ``add``, and after a schema upgrade."""
    database = conn.execute(text("SELECT current_database()")).scalar_one()
    schema = conn.execute(text("SELECT current_schema()")).scalar_one()
    tables = {
        r[0]
        for r in conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        )
    }
    q = _quote
    conn.execute(text(f"GRANT CONNECT ON DATABASE {q(database)} TO {q(group)}"))
    conn.execute(text(f"GRANT USAGE ON SCHEMA {q(schema)} TO {q(group)}"))
    conn.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA {q(schema)} FROM {q(group)}"))
    conn.execute(text(f"GRANT SELECT ON run, lane, jc_meta, alembic_version TO {q(group)}"))
    conn.execute(text(f"GRANT UPDATE ({', '.join(RUN_COLUMNS)}) ON run TO {q(group)}"))
    conn.execute(text(f"GRANT UPDATE (updated_at) ON lane TO {q(group)}"))
    conn.execute(text(f"GRANT SELECT, INSERT, UPDATE ON worker TO {q(group)}"))
    if "run_log" in tables:
        conn.execute(text(f"GRANT SELECT, INSERT, DELETE ON run_log TO {q(group)}"))


def add(store: Store, name: str, *, host: str | None = None, by: str = "local") -> str:
    """Create the login ``jcw_NAME``; its database URL (with the new password). Audited
    (``worker-credentials.add``), refusals too."""
    with audit.scope(store, by, "worker-credentials.add") as note:
        note.detail = f"login jcw_{name}"
        role = role_name(name)
        _require_postgresql(store)
        return _add(store, role, host)


def _add(store: Store, role: str, host: str | None) -> str:
    password = secrets.token_urlsafe(24)
    try:
        with store.write() as conn:
            database = str(conn.execute(text("SELECT current_database()")).scalar_one())
            group = group_name(database)
            rows = conn.execute(
                text("SELECT rolname FROM pg_roles WHERE rolname IN (:r, :g)"),
                {"r": role, "g": group},
            )
            found = {str(r[0]) for r in rows}
            if role in found:
                raise _Exists(
                    f"worker login {role} exists already: remove it first to issue a new password"
                )
            if group not in found:
                conn.execute(text(f"CREATE ROLE {_quote(group)} NOLOGIN"))
            grant(conn, group)
            verifier = scram_verifier(password)  # base64 and '$': nothing to escape
            conn.exec_driver_sql(
                f"CREATE ROLE {_quote(role)} LOGIN PASSWORD '{verifier}' IN ROLE {_quote(group)}"
            )
    except _Exists as exc:
        raise JobControlError(str(exc)) from None
    except Exception as exc:
        # Never the statement itself in the message: it holds the password's verifier.
        raise JobControlError(f"cannot create worker login {role}: {_why(exc)}") from None
    url = make_url(store.url).set(username=role, password=password)
    if host:
        url = url.set(host=host)
    return url.render_as_string(hide_password=False)


def remove(store: Store, name: str, *, by: str = "local") -> None:
    with audit.scope(store, by, "worker-credentials.remove") as note:
        note.detail = f"login jcw_{name}"
        role = role_name(name)
        _require_postgresql(store)
        _remove(store, role)


def _remove(store: Store, role: str) -> None:
    try:
        with store.write() as conn:
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                conn.execute(text(f"DROP ROLE {_quote(role)}"))
                return
    except Exception as exc:
        raise JobControlError(f"cannot drop worker login {role}: {_why(exc)}") from exc
    raise JobControlError(f"no worker login {role}")


def names(store: Store) -> list[str]:
    _require_postgresql(store)
    with store.read() as conn:
        group = group_name(conn.execute(text("SELECT current_database()")).scalar_one())
        rows = conn.execute(
            text(
                "SELECT m.rolname FROM pg_roles m JOIN pg_auth_members a ON a.member = m.oid "
                "JOIN pg_roles g ON g.oid = a.roleid WHERE g.rolname = :g ORDER BY 1"
            ),
            {"g": group},
        )
        return [r[0] for r in rows]


class _Exists(Exception):
    pass


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _why(exc: BaseException) -> str:
    """The server's reason alone (e.g. "permission denied to create role")."""
    while exc.__cause__ is not None and getattr(exc, "orig", None) is None:
        exc = exc.__cause__
    orig = getattr(exc, "orig", None)
    return str(orig or exc).strip().splitlines()[0]
