"""The exception hierarchy: one root, small subclasses whose message names the thing."""

from __future__ import annotations

ECHO_MAX = 200  # characters of a caller's value an error message repeats


def one_line(text: str) -> str:
    """A message of several lines (a driver's error, with its tabbed hints) on one, for a
    log record of its own and one form of a reason."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def clip(text: str, limit: int = ECHO_MAX) -> str:
    """``text`` as an error may repeat it: at most ``limit`` characters, saying how many
    more, and any lone half of a surrogate pair written out (``visible``)."""
    text = visible(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def visible(text: str) -> str:
    """``text`` with each lone half of a surrogate pair (which JSON can carry escaped but
    UTF-8 cannot encode) written out as its escape, ``\\ud800``: a caller's value that
    is repeated in an answer, a log or the audit trail can then always be encoded."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class JobControlError(Exception):
    """Root of every error Job Control raises on purpose."""


class ValidationError(JobControlError):
    """Bad input: refused before anything is written."""


class ScheduleError(ValidationError):
    """A timer expression that does not parse.

    ``position`` is the 0-based character offset of the error in ``text``.
    """

    def __init__(self, text: str, position: int, reason: str) -> None:
        self.text = text
        self.position = position
        self.reason = reason
        super().__init__(f"invalid schedule {text!r} at position {position}: {reason}")


class CommandError(ValidationError):
    """A command line the shell refuses to parse."""


class DefinitionError(ValidationError):
    """A definition file that is refused; ``line`` is 1-based, or None when unknown."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")


class JobError(ValidationError):
    """An edit refused because of what it would do to a job."""

    def __init__(self, job: str, reason: str) -> None:
        self.job = job
        self.reason = reason
        super().__init__(f"job {clip(repr(job))}: {reason}")


class UnknownJobError(JobError):
    def __init__(self, job: str, hint: str = "") -> None:
        super().__init__(job, f"no such job{hint}")


class ConflictError(JobError):
    """Optimistic concurrency: the job changed since the caller read it."""


class JobRunningError(JobError):
    """Refused because the job, an ancestor or a descendant is running."""


class BusyError(JobControlError):
    """The job tree could not be had in time (tree-state protocol wait ran out)."""


class NotRunningError(JobControlError):
    """The dispatcher is not running."""


class AlreadyRunningError(JobControlError):
    """Another daemon already owns this database."""


class StoreError(JobControlError):
    """A database failure, wrapped."""


class StoreUnavailable(StoreError):
    """A transient database failure (connection lost, server restarting, database locked):
    the same work can succeed once the database answers again."""


class UserError(ValidationError):
    """A user-management request refused because of what it would do to a user."""

    def __init__(self, user: str, reason: str) -> None:
        self.user = user
        self.reason = reason
        super().__init__(f"user {user!r}: {reason}")


class UnknownUserError(UserError):
    def __init__(self, user: str) -> None:
        super().__init__(user, "no such user")


class DuplicateUserError(UserError):
    def __init__(self, user: str) -> None:
        super().__init__(user, "a user with this name already exists")


class BadRoleError(UserError):
    def __init__(self, user: str, role: str, roles: str) -> None:
        self.role = role
        super().__init__(user, f"unknown role {role!r} (one of {roles})")


class BadUserNameError(UserError):
    """A user name that is empty, too long or has characters outside the allowed set."""


class OptionError(ValidationError):
    """A command-line option or environment setting that is refused; the message names it."""


class TokenFileError(JobControlError):
    """The admin token file could not be written."""


class LaneError(ValidationError):
    """A lane request refused because of what it asks; ``field`` names the setting when one is to blame."""

    def __init__(self, lane: str, reason: str, field: str | None = None) -> None:
        self.lane = lane
        self.reason = reason
        self.field = field
        super().__init__(f"lane {clip(repr(lane))}: {reason}")


class UnknownLaneError(LaneError):
    def __init__(self, lane: str, reason: str = "no such lane") -> None:
        super().__init__(lane, reason)


class LaneConflictError(LaneError):
    """Refused because of the lane's state: it exists already, or still has runs."""


class RunError(ValidationError):
    """A request about one run refused; the message names the run."""

    def __init__(self, run_id: int, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id}: {reason}")


class UnknownRunError(RunError):
    def __init__(self, run_id: int) -> None:
        super().__init__(run_id, "no such run")


class RunStateError(RunError):
    """Refused because of the run's state (e.g. reprioritizing a run that is no longer queued)."""
