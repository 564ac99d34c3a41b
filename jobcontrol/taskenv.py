"""Which of the daemon's environment variables a task gets: the pass-through list.

A task's environment is built from nothing: the variables of the daemon's
environment that this list names, then the job's ``env``, then what the worker
sets for the run (``JOBCONTROL_JOB``, ``JOBCONTROL_RUN_ID``, the marker, ...).
The daemon's own settings (every ``JOBCONTROL_*`` variable: the database URL
with its password, the API token) and what systemd addresses to the daemon
(``NOTIFY_SOCKET``, socket activation, the watchdog) are never passed, even
when the list names them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobcontrol.errors import OptionError

DEFAULT_PASS_ENV = ("PATH", "HOME", "LANG", "LC_*", "TZ", "USER", "LOGNAME", "SHELL")
ENV_VAR = "JOBCONTROL_PASS_ENV"

# Meant for the daemon alone: a task never gets these, whatever the list says.
NEVER_PASSED_PREFIX = "JOBCONTROL_"
NEVER_PASSED = frozenset(
    {"NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC"}
)

_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?|\*")


def never_passed(name: str) -> bool:
    return name.startswith(NEVER_PASSED_PREFIX) or name in NEVER_PASSED


@dataclass(frozen=True)
class PassEnv:
    """Names (``PATH``) and prefixes (``LC_*``; ``*`` alone is every variable)."""

    entries: tuple[str, ...] = DEFAULT_PASS_ENV

    @classmethod
    def parse(cls, values: Iterable[str], *, source: str) -> PassEnv:
        """Comma-separated entries, from one or more ``values``; ``source`` names the option
        or variable they came from in an error. Empty values pass nothing."""
        entries: list[str] = []
        for value in values:
            for raw in value.split(","):
                entry = raw.strip()
                if not entry:
                    continue
                if not _ENTRY.fullmatch(entry):
                    raise OptionError(
                        f"{source}: {entry!r} is neither a variable name nor a PREFIX* pattern"
                    )
                if entry not in entries:
                    entries.append(entry)
        return cls(tuple(entries))

    @property
    def text(self) -> str:
        """The list as ``--pass-env`` takes it."""
        return ",".join(self.entries)

    def say(self, log: logging.Logger, whose: str) -> None:
        """What a daemon's or a worker's log says as it starts: which of its variables its
        tasks get, and each listed one (or covered by a ``PREFIX*``) they never get."""
        log.info("tasks get these of the %s's variables: %s", whose, self.text or "none")
        for name in self.ignored():
            log.warning("the pass-through list names %s, which is never passed to tasks", name)
        for entry, covered in self.withheld():
            log.warning(
                "the pass-through list's %s does not pass %s: never passed to tasks",
                entry,
                ", ".join(covered),
            )

    def ignored(self) -> list[str]:
        """Entries naming a variable that is never passed (said at start, not an error)."""
        return [e for e in self.entries if not e.endswith("*") and never_passed(e)]

    def withheld(self) -> list[tuple[str, list[str]]]:
        """``PREFIX*`` entries that cover variables never passed, each with those it
        covers (``J*``: ``JOBCONTROL_*``): said at start as a listed name is."""
        found = []
        for entry in self.entries:
            if not entry.endswith("*"):
                continue
            prefix = entry[:-1]
            covered = [n for n in sorted(NEVER_PASSED) if n.startswith(prefix)]
            if NEVER_PASSED_PREFIX.startswith(prefix):
                covered.insert(0, f"{NEVER_PASSED_PREFIX}*")
            elif prefix.startswith(NEVER_PASSED_PREFIX):
                covered.insert(0, entry)
            if covered:
                found.append((entry, covered))
        return found

    def matches(self, name: str) -> bool:
        if never_passed(name):
            return False
        for entry in self.entries:
            if entry.endswith("*"):
                if name.startswith(entry[:-1]):
                    return True
            elif name == entry:
                return True
        return False

    def select(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables of ``environ`` a task gets."""
        return {name: value for name, value in environ.items() if self.matches(name)}


def resolve(option: list[str] | None, environ: Mapping[str, str]) -> PassEnv:
    """``--pass-env`` (repeatable) if given, else ``$JOBCONTROL_PASS_ENV``, else the default."""
    if option is not None:
        return PassEnv.parse(option, source="--pass-env")
    if ENV_VAR in environ:
        return PassEnv.parse([environ[ENV_VAR]], source=ENV_VAR)
    return PassEnv()
