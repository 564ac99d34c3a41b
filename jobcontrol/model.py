"""Enumerations and the plain records the engine passes around."""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from jobcontrol.errors import UnknownJobError

DISPATCHER_USER = "jobdispatcher"
# The daemon's own worker is named after its host and pid, with this at the end.
EMBEDDED_WORKER_SUFFIX = ":embedded"


def embedded_worker_name(host: str, pid: int) -> str:
    return f"{host}:{pid}{EMBEDDED_WORKER_SUFFIX}"


def is_remote_worker(name: str | None) -> bool:
    """Whether a run's ``worker`` is a worker of its own (a ``jobcontrol worker``
    process), not a daemon's embedded one; False for no worker."""
    return name is not None and name != "" and not name.endswith(EMBEDDED_WORKER_SUFFIX)


# Who a run its timer started was requested by (the runs' ``requested_by``, shown as
# Who/BY); a restart-armed run is the restarting user's, a manual one its user's.
TIMER_USER = "timer"


class Kind(enum.StrEnum):
    BOX = "box"
    TASK = "task"


class OnError(enum.StrEnum):
    CONTINUE = "continue"
    ABORT = "abort"


class BoxType(enum.StrEnum):
    SEQUENCE = "sequence"
    TIMED = "timed"


class Misfire(enum.StrEnum):
    RUN_ONCE = "run-once"
    SKIP = "skip"


class JobState(enum.StrEnum):
    """Volatile per-job state (memory only), spec 2.2."""

    IDLE = "idle"
    RUNNING = "running"
    WAITING = "waiting"


class TreeState(enum.StrEnum):
    """The coordination variable of spec 5."""

    STARTUP = "startup"
    IDLE = "idle"
    USER_START = "user_start"
    USER_END = "user_end"
    DISPATCHER = "dispatcher"


class Trigger(enum.StrEnum):
    TIMER = "timer"
    MANUAL = "manual"
    RESTART = "restart"


class RunState(enum.StrEnum):
    # Queued ahead: the next task of a sequence, claimable only once the run it
    # follows (``after_run_id``) ends with a status its box goes on after.
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    SKIPPED = "skipped"
    LOST = "lost"

    @property
    def is_final(self) -> bool:
        return self in FINAL_RUN_STATES


ACTIVE_RUN_STATES = frozenset({RunState.QUEUED, RunState.RUNNING, RunState.WAITING})
FINAL_RUN_STATES = frozenset(set(RunState) - ACTIVE_RUN_STATES - {RunState.PENDING})

KILLED_STATUS = 255
MAX_RETRIES = 100  # a task run again more often than this wants a fix, not a retry
MAX_PRIORITY = 1_000_000  # a priority is between -MAX_PRIORITY and MAX_PRIORITY
MAX_LOG_FILES = 100_000  # the most task logs a job may keep
DEFAULT_MAX_LOG_FILES = 5  # the task logs a job keeps when its max_log_files is not set
MAX_TIMEOUT_DAYS = 36500  # as long as a timer's longest interval
# The longest texts a job keeps, the same through the API, the CLI and a definition
# file. A command goes to ``/bin/sh -c`` as one argument, which Linux caps at 128 KiB
# (MAX_ARG_STRLEN) with Job Control's prelude in front of it: bytes, not characters.
MAX_COMMAND_BYTES = 100_000
MAX_DESCRIPTION = 10_000
MAX_PATH = 4095  # PATH_MAX with its NUL
MAX_QUEUE = 64  # a queue names a lane
MAX_TIMER = 1000
MAX_ENV_ITEMS, MAX_ENV_NAME, MAX_ENV_VALUE = 1000, 256, 32_768
# A run's ``log_path`` when its output is in the database (``run_log``), not in a file:
# a file's path is absolute, so it can never be this.
DB_LOG = "db:"
# Where a worker puts its tasks' output: log files, or the database (``run_log``).
LOG_STORES = ("file", "database")
# The daemon's embedded worker keeps files unless this says otherwise (advanced: what a
# remote worker does, on one host; see the README).
TASK_LOGS_ENV = "JOBCONTROL_TASK_LOGS"
TIMEOUT_STATUS = 124

# Fields a user may change through an edit; everything else is the dispatcher's.
EDITABLE_FIELDS = frozenset(
    {
        "name",
        "description",
        "parent_id",
        "job_order",
        "command",
        "timer",
        "active",
        "on_error",
        "box_type",
        "queue",
        "priority",
        "timeout_s",
        "max_log_files",
        "retries",
        "misfire",
        "cwd",
        "env",
    }
)

# A change to one of these makes the dispatcher re-evaluate the tree's timers.
RESCHEDULING_FIELDS = frozenset({"timer", "job_order", "active", "parent_id", "misfire"})
# Those whose change re-arms a tree as a restart does (spec 5.5: restartSubtreeTimer),
# from now: a time that passed meanwhile is not run at once.
RESTARTING_FIELDS = frozenset({"timer", "active"})


@dataclass
class JobRecord:
    """One row of the job table, as the engine sees it."""

    id: int
    name: str
    kind: Kind
    parent_id: int | None = None
    description: str | None = None
    job_order: int = 0
    command: str | None = None
    timer: str | None = None
    active: bool = False
    on_error: OnError = OnError.CONTINUE
    box_type: BoxType = BoxType.SEQUENCE
    exit_status: int = 0
    last_ran: datetime | None = None
    next_runs: datetime | None = None
    last_duration_ms: int | None = None
    last_updated: datetime | None = None
    updated_by: str | None = None
    version: int = 1
    queue: str = "default"
    priority: int = 0
    timeout_s: float | None = None
    max_log_files: int | None = None
    misfire: Misfire = Misfire.RUN_ONCE
    retries: int = 0  # more runs a task may have after a failed or lost one
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def is_box(self) -> bool:
        return self.kind is Kind.BOX

    @property
    def is_task(self) -> bool:
        return self.kind is Kind.TASK

    @property
    def is_top_level(self) -> bool:
        return self.parent_id is None

    @property
    def last_end(self) -> datetime | None:
        if self.last_ran is None or self.last_duration_ms is None:
            return None
        from datetime import timedelta

        return self.last_ran + timedelta(milliseconds=self.last_duration_ms)


@dataclass(frozen=True)
class Restarted:
    """What a restart did (spec 8.2): when the tree next runs, or why nothing is armed."""

    next_runs: datetime | None
    not_armed: str | None = None
    # Armed, but the timers are paused: it fires only once they are resumed.
    held: bool = False


@dataclass
class RunRecord:
    """One row of the run table."""

    id: int
    job_id: int | None
    job_name: str
    kind: Kind
    trigger: Trigger
    state: RunState
    parent_run_id: int | None = None
    root_run_id: int | None = None
    queue: str = "default"
    priority: int = 0
    exit_status: int | None = None
    signal: int | None = None
    created: datetime | None = None
    started: datetime | None = None
    ended: datetime | None = None
    duration_ms: int | None = None
    pid: int | None = None
    host: str | None = None
    worker: str | None = None
    log_path: str | None = None
    requested_by: str | None = None
    reason: str | None = None
    command: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    max_log_files: int | None = None
    lease_until: datetime | None = None
    kill_requested: bool = False
    after_run_id: int | None = None
    after_ok_only: bool = False
    cpu_us: int | None = None  # CPU time (user + system) from the run's cgroup
    mem_peak_bytes: int | None = None  # peak memory from the run's cgroup
    attempt: int = 1  # which attempt of its job in its tree run (a retry is a new run)
    priority_by_hand: bool = False  # set by ``reprioritize``: a task's edit leaves it

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


MAX_ID = 2**63 - 1  # the largest id a database column holds
MAX_PORT = 65535  # the admin API's port: 0 (any free one) to this
RUNS_PAGE_MAX = 1000  # the most runs one page of the admin API gives

JobRef = int | str  # a job named by its id or by its name

_T = TypeVar("_T")


def find_job(
    ref: JobRef, by_id: Callable[[int], _T | None], by_name: Callable[[str], _T | None]
) -> _T:
    """The job ``ref`` names: an id, or a name; a name of digits only is an id unless a job has
    it. The one rule every part resolves job references by (API paths, the CLI, edits, requests).
    """
    if isinstance(ref, int):
        found = by_id(ref)
    else:
        found = by_name(ref)
        if found is None and (composed := unicodedata.normalize("NFC", ref)) != ref:
            found = by_name(composed)  # names are stored composed (NFC): one spelling each
        if found is None and ref.isascii() and ref.isdigit() and int(ref) <= MAX_ID:
            found = by_id(int(ref))
    if found is None:
        raise UnknownJobError(str(ref), _path_hint(ref, by_name))
    return found


def _path_hint(ref: JobRef, by_name: Callable[[str], object | None]) -> str:
    """For a reference written as a path (``tree/task``), which no job is named: the
    job its last part names, if there is one. A job is named by its name alone, unique
    across every tree."""
    if not isinstance(ref, str) or "/" not in ref:
        return ""
    last = ref.rstrip("/").rpartition("/")[2]
    if not last or by_name(last) is None:
        return ""
    return f"; job names are unique across all trees, so a job is named alone: {last!r}"


def trees_a_stop_ends(active: list[RunRecord]) -> tuple[list[str], list[str]]:
    """Of the runs in flight (``active``), the top-level trees a daemon's stop that leaves
    the workers their work (SIGTERM, ``daemon stop``) would kill, and those it leaves:
    a tree is left when each task run of it in flight waits in the queue (nothing of it
    started: a worker takes it as before, the next start goes on from its row) or runs
    on a worker of its own. A tree with a task on the daemon's embedded worker, or with
    none in flight (a TIMED box waiting for a child's time), is killed."""
    tasks: dict[int, list[RunRecord]] = {}
    for run in active:
        if run.kind is Kind.TASK:
            tasks.setdefault(run.root_run_id or run.id, []).append(run)
    killed: list[str] = []
    left: list[str] = []
    for root in active:
        if root.parent_run_id is not None:
            continue
        mine = tasks.get(root.id, [])
        leaves = bool(mine) and all(left_by_a_stop(t) for t in mine)
        (left if leaves else killed).append(root.job_name)
    return killed, left


def left_by_a_stop(task_run: RunRecord) -> bool:
    """Whether a task run goes on through a stop that leaves the workers their work: it
    waits in the queue (nothing of it started, a worker takes it as before), or runs on
    a worker of its own (not a daemon's embedded one)."""
    if task_run.state in (RunState.QUEUED, RunState.PENDING):
        return True
    return task_run.state is RunState.RUNNING and is_remote_worker(task_run.worker)


def queue_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a queue, and so a lane, or None. A lane's name is a
    path segment in the API (``/lanes/{name}``) and a column in tables."""
    if not name:
        return "a queue name cannot be empty"
    if len(name) > MAX_QUEUE:
        return f"a queue name has at most {MAX_QUEUE} characters"
    if any(ch.isspace() or not ch.isprintable() or ch == "/" for ch in name):
        return "a queue name has no spaces, control characters or '/'"
    if name in (".", ".."):
        return "a queue name cannot be '.' or '..' (a URL path cannot carry them)"
    return None
