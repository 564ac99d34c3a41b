"""Checking and normalising the editable fields of a job, whatever the caller sent.

The CLI sends text (``active=yes``), the definition loader sends parsed values,
the API will send JSON: all go through ``normalise_fields`` before anything is
written, so a bad value is refused with the field's name and nothing changes.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from jobcontrol.definitions.commands import check_command
from jobcontrol.errors import CommandError, JobError, ScheduleError, clip
from jobcontrol.model import (
    EDITABLE_FIELDS,
    MAX_DESCRIPTION,
    MAX_ENV_ITEMS,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_LOG_FILES,
    MAX_PATH,
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_TIMEOUT_DAYS,
    MAX_TIMER,
    BoxType,
    Misfire,
    OnError,
    queue_name_problem,
)
from jobcontrol.timerexpr.expression import validate_timer

NAME_MAX = 128
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TRUE = {"true", "yes", "y", "1", "on"}
_FALSE = {"false", "no", "n", "0", "off"}


def _bool(job: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise JobError(job, f"{key} must be true or false, not {clip(repr(value))}")


def _int(job: str, key: str, value: Any, low: int, high: int) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise JobError(job, f"{key} must be a whole number, not {clip(repr(value))}") from None
    if not low <= number <= high:
        raise JobError(job, f"{key} must be between {low} and {high}, not {number}")
    return number


def _choice(job: str, key: str, value: Any, enum: type[Any]) -> Any:
    try:
        return enum(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise JobError(job, f"{key} must be one of {allowed}, not {clip(repr(value))}") from None


def _optional_text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value == ""):
        return None
    return str(value)


def _long_text(job: str, key: str, value: Any, most: int) -> str | None:
    text = _optional_text(value)
    if text is not None and len(text) > most:
        raise JobError(job, f"{key} has {len(text)} characters; at most {most}")
    return text


def check_name(job: str, value: Any) -> str:
    """The name, in Unicode's composed form (NFC): one spelling per name, so that "é"
    typed as "e" and a combining accent names the same job as "é" typed as one."""
    if not isinstance(value, str) or not value.strip():
        raise JobError(job or "?", "the name must not be empty")
    value = unicodedata.normalize("NFC", value)
    if value != value.strip() or len(value) > NAME_MAX:
        raise JobError(
            job or value,
            f"the name must be 1 to {NAME_MAX} characters without leading or trailing spaces",
        )
    problem = unprintable_problem(value)
    if problem is not None:
        raise JobError(job or value, f"the name {problem}")
    return value


def unprintable_problem(name: str) -> str | None:
    """Why ``name`` cannot be a job's name for a character it holds, or None: one that
    is invisible or moves the line (a control character, a no-break space, a line
    separator), named by its code point."""
    odd = next((ch for ch in name if not ch.isprintable()), None)
    if odd is None:
        return None
    kinds = {"Cn": "unassigned", "Co": "for private use", "Cs": "half of a surrogate pair"}
    what = unicodedata.name(odd, "").lower() or kinds.get(
        unicodedata.category(odd), "a control character"
    )
    return f"must contain only printable characters and plain spaces, not U+{ord(odd):04X} ({what})"


def unaddressable(name: str) -> str | None:
    """Why a job could not be named by ``name`` everywhere a job is named, or None. The
    API names a job in a URL path (``/jobs/{job}/runs``), where '/' separates the parts
    and '.' and '..' are folded away by HTTP clients. (A name of digits only is fine:
    it is a name first, and a client that means an id says so, ``?by=id``.)"""
    if "/" in name:
        return "must not contain '/' (the API names jobs in URL paths)"
    if name in (".", ".."):
        return "must not be '.' or '..' (a URL path cannot carry them)"
    return None


def check_new_name(job: str, value: str) -> None:
    """Refuse a name a job is about to get (create, rename) that could not name it
    (``unaddressable``). A job named so before this rule keeps its name until renamed
    (README, Behaviour)."""
    problem = unaddressable(value)
    if problem is not None:
        raise JobError(job or value, f"cannot be named {clip(repr(value))}: a job name {problem}")


# Job Control sets these for every run (its job, run id, worker, the marker that finds
# its processes) and never passes the daemon's own: a definition's would be dropped.
RESERVED_ENV_PREFIX = "JOBCONTROL_"


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a variable of a job's ``env``, or None."""
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        return f"is Job Control's own: it sets {RESERVED_ENV_PREFIX}* variables for every run"
    return None


def cwd_problem(path: str) -> str | None:
    """Why ``path`` cannot be a job's ``cwd``, or None."""
    if not path or "\0" in path:
        return "must be a non-empty path without NUL bytes"
    if not path.startswith("/"):
        return "must be an absolute path: a task starts there whichever worker runs it"
    return None


def _env(job: str, value: Any) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise JobError(job, "env must be a mapping (JSON object) of names to strings") from None
    if not isinstance(value, Mapping):
        raise JobError(job, "env must be a mapping of names to strings")
    if len(value) > MAX_ENV_ITEMS:
        raise JobError(job, f"env has {len(value)} variables; at most {MAX_ENV_ITEMS}")
    out: dict[str, str] = {}
    for key, val in value.items():
        if isinstance(key, str) and len(key) > MAX_ENV_NAME:
            raise JobError(job, f"env name {clip(key)!r} is longer than {MAX_ENV_NAME} characters")
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise JobError(job, f"env name {key!r} is not a valid environment variable name")
        problem = env_name_problem(key)
        if problem is not None:
            raise JobError(job, f"env name {key!r} {problem}")
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise JobError(job, f"env {key} must be a string, not {clip(repr(val))}")
        text = str(val)
        if len(text) > MAX_ENV_VALUE:
            raise JobError(job, f"env {key} has {len(text)} characters; at most {MAX_ENV_VALUE}")
        out[key] = text
    return out


def _timeout(job: str, value: Any) -> float | None:
    from jobcontrol.definitions.parse import parse_duration

    if value is None or value == "":
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise JobError(job, f"timeout: {exc}") from None
    if seconds <= 0:
        raise JobError(job, "timeout must be positive")
    if seconds > MAX_TIMEOUT_DAYS * 86400:
        raise JobError(job, f"timeout must be at most {MAX_TIMEOUT_DAYS}d")
    return seconds


def normalise_field(job: str, key: str, value: Any) -> Any:
    """One field's value in the engine's type, or a JobError naming the job and field."""
    if key == "name":
        return check_name(job, value)
    if key == "active":
        return _bool(job, key, value)
    if key == "on_error":
        return _choice(job, key, value, OnError)
    if key == "box_type":
        return _choice(job, key, value, BoxType)
    if key == "misfire":
        return _choice(job, key, value, Misfire)
    if key == "priority":
        return _int(job, key, value, -MAX_PRIORITY, MAX_PRIORITY)
    if key == "job_order":
        return _int(job, key, value, 0, 2**31 - 1)
    if key == "max_log_files":
        return None if value in (None, "") else _int(job, key, value, 1, MAX_LOG_FILES)
    if key == "retries":
        if isinstance(value, float) and not value.is_integer():
            raise JobError(job, f"retries must be a whole number, not {clip(repr(value))}")
        return _int(job, key, value, 0, MAX_RETRIES)
    if key == "timeout_s":
        return _timeout(job, value)
    if key == "env":
        return _env(job, value)
    if key == "queue":
        queue = str(value).strip() if value is not None else ""
        problem = queue_name_problem(queue)
        if problem is not None:
            raise JobError(job, f"queue {clip(value)!r}: {problem}")
        return queue
    if key == "timer":
        timer = _long_text(job, key, value, MAX_TIMER)
        try:
            validate_timer(timer)
        except ScheduleError as exc:
            raise JobError(job, str(exc)) from None
        return timer
    if key == "command":
        command = _optional_text(value)
        if command is not None:
            try:
                check_command(command)
            except CommandError as exc:
                raise JobError(job, str(exc)) from None
        return command
    if key == "cwd":
        cwd = _long_text(job, key, value, MAX_PATH)
        problem = cwd_problem(cwd) if cwd is not None else None
        if problem is not None:
            raise JobError(job, f"cwd {cwd!r} {problem}")
        return cwd
    if key == "description":
        return _long_text(job, key, value, MAX_DESCRIPTION)
    if key == "parent_id":
        return value
    raise JobError(
        job, f"unknown field {key!r}; editable fields are {', '.join(sorted(EDITABLE_FIELDS))}"
    )


def normalise_fields(job: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    aliases = {"timeout": "timeout_s", "parent": "parent_id"}
    fields = {aliases.get(k, k): v for k, v in fields.items()}
    return {key: normalise_field(job, key, value) for key, value in fields.items()}
