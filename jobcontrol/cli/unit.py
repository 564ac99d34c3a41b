"""``jobcontrol daemon unit`` and ``jobcontrol worker unit``: systemd units that run
the daemon of one database, or a worker process of it.

``contrib/systemd/jobcontrol.service`` is the daemon's with the defaults
(``--command /usr/local/bin/jobcontrol``); a test keeps the two the same.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobcontrol.errors import JobControlError
from jobcontrol.store import redact, url_password

DEFAULT_USER = "jobcontrol"
DEFAULT_STATE_DIR = Path("/var/lib/jobcontrol")
ENV_FILE = "/etc/jobcontrol/jobcontrol.env"
WORKER_ENV_FILE = "/etc/jobcontrol/worker.env"
# A worker's unit: runs still in hand this long after `systemctl stop` are killed (255).
DEFAULT_DRAIN_S = 300.0


@dataclass(frozen=True)
class Unit:
    text: str
    # What the user must still do, for stderr (never a secret).
    notes: list[str]


def this_command() -> str:
    """The ``jobcontrol`` of this installation: the script beside the interpreter, else
    the interpreter with ``-m jobcontrol``."""
    script = Path(sys.executable).parent / "jobcontrol"
    if script.is_file():
        return str(script)
    return f"{sys.executable} -m jobcontrol"


def _quote(word: str) -> str:
    """A word of ExecStart=: systemd splits like a shell, and expands % and $."""
    return shlex.quote(word).replace("%", "%%").replace("$", "$$")


def _assignment(name: str, value: str) -> str:
    """One Environment= assignment, quoted whole when it has to be."""
    text = f"{name}={value}".replace("%", "%%")
    if any(c in text for c in " \t\"'\\"):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def add_options(parser: Any, *, user_default: str | None) -> None:
    """``--user`` and ``--command`` of ``daemon unit`` and ``worker unit``."""
    parser.add_argument(
        "--user",
        default=user_default,
        help=f"unit: the user it and its tasks run as (default {DEFAULT_USER})",
    )
    parser.add_argument(
        "--command",
        dest="unit_command",  # not `command`: that is which jobcontrol command this is
        default=None,
        metavar="PATH",
        help="unit: the jobcontrol command the unit runs (default: this one)",
    )


def _database(db_url: str | None, env_file: str, notes: list[str]) -> bool:
    """Whether ``db_url`` may go on the command line: not with a password, which goes in
    ``env_file`` instead (unit files and `systemctl show` are readable by everyone)."""
    if db_url and url_password(db_url) is not None:
        notes.append(
            f"the database URL holds a password: put JOBCONTROL_DB={redact(db_url or '')} "
            f"(with the real password) in {env_file}, owned by root, mode 0600"
        )
        return False
    return True


# What systemd takes for User= and Group=: a name of letters, digits, '_', '.', '-' (not
# starting with a digit, '.' or '-'), at most 31 characters; or a number (a uid).
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,30}|[0-9]+")


def check_user(user: str) -> str:
    """``user`` as the unit's User= and Group=, or refused naming why."""
    if not _USER_NAME.fullmatch(user):
        raise JobControlError(
            f"--user {user!r}: not a user name systemd takes (letters, digits, '_', '.' and "
            "'-', not starting with a digit, '.' or '-', at most 31 characters; or a uid)"
        )
    return user


def _process(user: str, words: list[str], env_file: str, *, env_needed: bool) -> list[str]:
    """The [Service] lines of a Type=notify process running as ``user``. ``env_needed``:
    the database URL is in ``env_file`` (it holds a password), so the unit fails to start
    without it rather than run on a default database."""
    return [
        "Type=notify",
        "NotifyAccess=main",
        "# A user of its own: tasks run as this user, and can read what it can.",
        f"User={user}",
        f"Group={user}",
        f"ExecStart={' '.join(_quote(w) for w in words)}",
        "# Secrets (JOBCONTROL_DB with a password, JOBCONTROL_PASS_ENV, ...) go here, mode 0600;",
        "# a JOBCONTROL_* variable never reaches a task.",
        f"EnvironmentFile={'' if env_needed else '-'}{env_file}",
    ]


def _contained(state_dir: Path | None) -> list[str]:
    """The [Service] lines every unit ends with: restart, cgroup, state directory, hardening."""
    lines = [
        "Restart=on-failure",
        "RestartSec=5s",
        "# The service's cgroup is its to divide: each task run gets a cgroup of its own,",
        "# killed whole (cgroup.kill), its CPU time and peak memory recorded (the daemon",
        "# moves itself into the leaf 'supervisor' so that memory can be passed down).",
        "Delegate=yes",
    ]
    if state_dir is None:
        lines += [
            "# /var/lib/jobcontrol, made for the user, mode 0700.",
            "StateDirectory=jobcontrol",
            "StateDirectoryMode=0700",
        ]
    lines += [
        "# Hardening that leaves tasks working: no setuid or sudo (NoNewPrivileges), /usr,",
        "# /boot and /etc read-only (ProtectSystem=full); tasks still write anywhere else the",
        "# user may. The machine's /tmp is the tasks' /tmp (no PrivateTmp): files they share",
        "# there with other programs, or keep between runs, stay where those expect them.",
        "NoNewPrivileges=yes",
        "ProtectSystem=full",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return lines


def service_unit(
    db_url: str | None,
    state_dir: Path | None,
    *,
    user: str = DEFAULT_USER,
    command: str | None = None,
) -> Unit:
    """The unit for ``db_url`` (None: a SQLite file in the state directory) and
    ``state_dir`` (None: /var/lib/jobcontrol, made by systemd for ``user``)."""
    from sqlalchemy.engine import make_url

    notes: list[str] = []
    state = state_dir or DEFAULT_STATE_DIR
    words = [*shlex.split(command or this_command()), "--state-dir", str(state)]
    url = make_url(db_url) if db_url else None
    postgres = url is not None and url.get_backend_name() == "postgresql"
    check_user(user)
    in_env_file = not _database(db_url, ENV_FILE, notes)
    if not in_env_file:
        words += ["--db", db_url or str(state / "jobcontrol.db")]
    words += ["daemon", "run"]
    lines = [
        "# Job Control's dispatcher daemon (made by `jobcontrol daemon unit`; see the README,",
        '# "Running it as a service").',
        "[Unit]",
        "Description=Job Control workload scheduler",
        "Wants=network-online.target",
        "After=network-online.target" + (" postgresql.service" if postgres else ""),
        "",
        "[Service]",
        "# READY=1 once the schema is up to date, crash recovery done and the timers armed;",
        "# STOPPING=1 when it stops.",
        *_process(user, words, ENV_FILE, env_needed=in_env_file),
        "# The admin token file: <state directory>/jobcontrol/token-<id>, private to the user.",
        f"Environment={_assignment('XDG_CONFIG_HOME', str(state))}",
        "# SIGTERM to the daemon alone: it kills its running tasks itself and records them",
        "# (exit status 255); whatever is left after it exits is killed by systemd.",
        "KillMode=mixed",
        "TimeoutStopSec=60",
        *_contained(state_dir),
    ]
    return Unit("\n".join(lines), notes)


def worker_unit(
    db_url: str,
    state_dir: Path | None,
    *,
    name: str,
    groups: str,
    drain_timeout: float | None = None,
    log_root: Path | None = None,
    pass_env: list[str] | None = None,
    log_group: str | None = None,
    user: str = DEFAULT_USER,
    command: str | None = None,
) -> Unit:
    """The unit of worker ``name`` serving ``groups`` (a ``--queues`` spec) on the
    PostgreSQL database ``db_url``; ``state_dir`` as for the daemon's unit."""
    notes: list[str] = []
    state = state_dir or DEFAULT_STATE_DIR
    drain = drain_timeout or DEFAULT_DRAIN_S
    words = [*shlex.split(command or this_command()), "--state-dir", str(state)]
    check_user(user)
    in_env_file = not _database(db_url, WORKER_ENV_FILE, notes)
    if not in_env_file:
        words += ["--db", db_url]
    words += ["worker", "run", "--name", name, "--queues", groups, "--drain-timeout", f"{drain:g}"]
    words += ["--log-root", str(log_root)] if log_root is not None else []
    for text in pass_env or []:
        words += ["--pass-env", text]
    words += ["--log-group", log_group] if log_group else []
    # The drain, the kill's grace and the recording of the outcomes, before systemd's SIGKILL.
    stop_s = math.ceil(drain) + 60
    lines = [
        f"# Job Control worker {name} (made by `jobcontrol worker unit`; see the README,",
        '# "Workers as services").',
        "[Unit]",
        f"Description=Job Control worker {name}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "# READY=1 once it has joined the worker registry (what an earlier life of it left",
        "# running killed and recorded); STOPPING=1 when it stops.",
        *_process(user, words, WORKER_ENV_FILE, env_needed=in_env_file),
        "# It waits for the database to join: starting lasts as long as an outage does.",
        "TimeoutStartSec=infinity",
        "# SIGTERM to the worker alone: it claims nothing more and lets the runs in hand end;",
        f"# those still running {drain:g}s on (--drain-timeout) it kills and records (255).",
        "KillMode=mixed",
        f"TimeoutStopSec={stop_s}",
        *_contained(state_dir),
    ]
    return Unit("\n".join(lines), notes)
