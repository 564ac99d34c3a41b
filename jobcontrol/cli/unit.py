"""``jobcontrol daemon unit``: a systemd unit that runs the daemon of one database.

``contrib/systemd/jobcontrol.service`` is this module's output with the defaults
(``--command /usr/local/bin/jobcontrol``); a test keeps the two the same.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from jobcontrol.store import redact

DEFAULT_USER = "jobcontrol"
DEFAULT_STATE_DIR = Path("/var/lib/jobcontrol")
ENV_FILE = "/etc/jobcontrol/jobcontrol.env"


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

    notes = []
    state = state_dir or DEFAULT_STATE_DIR
    words = [*shlex.split(command or this_command()), "--state-dir", str(state)]
    url = make_url(db_url) if db_url else None
    postgres = url is not None and url.get_backend_name() == "postgresql"
    if url is not None and url.password:
        # Never in the unit: unit files and `systemctl show` are readable by everyone.
        notes.append(
            f"the database URL holds a password: put JOBCONTROL_DB={redact(db_url or '')} "
            f"(with the real password) in {ENV_FILE}, owned by root, mode 0600"
        )
    else:
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
        "Type=notify",
        "NotifyAccess=main",
        "# A user of its own: tasks run as this user, and can read what it can.",
        f"User={user}",
        f"Group={user}",
        f"ExecStart={' '.join(_quote(w) for w in words)}",
        "# Secrets (JOBCONTROL_DB with a password, JOBCONTROL_PASS_ENV, ...) go here, mode 0600;",
        "# the daemon never passes a JOBCONTROL_* variable to its tasks.",
        f"EnvironmentFile=-{ENV_FILE}",
        "# The admin token file: <state directory>/jobcontrol/token-<id>, private to the user.",
        f"Environment={_assignment('XDG_CONFIG_HOME', str(state))}",
        "# SIGTERM to the daemon alone: it kills its running tasks itself and records them",
        "# (exit status 255); whatever is left after it exits is killed by systemd.",
        "KillMode=mixed",
        "TimeoutStopSec=60",
        "Restart=on-failure",
        "RestartSec=5s",
        "# The service's cgroup is the daemon's to divide: each task run gets a cgroup of its",
        "# own, killed whole (cgroup.kill), its CPU time recorded (see the README for memory).",
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
    ]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return Unit("\n".join(lines), notes)
