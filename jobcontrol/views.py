"""How jobs are shown: tree order and the per-job view ``ls --json`` and the API give."""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jobcontrol.model import JobRecord, Kind


def tree_order(records: Sequence[JobRecord]) -> list[tuple[JobRecord, int]]:
    children: dict[int | None, list[JobRecord]] = {}
    for rec in records:
        children.setdefault(rec.parent_id, []).append(rec)
    for sibs in children.values():
        sibs.sort(key=lambda r: (r.job_order, r.id))
    out: list[tuple[JobRecord, int]] = []
    stack = [(r, 0) for r in reversed(children.get(None, []))]
    while stack:
        rec, depth = stack.pop()
        out.append((rec, depth))
        stack.extend((c, depth + 1) for c in reversed(children.get(rec.id, [])))
    return out


# The fields of a job its view shows, read in one call: an event captures them when
# the change happens and builds the view only when a reader asks (``view_of``).
VIEW_FIELDS = operator.attrgetter(
    "id",
    "name",
    "parent_id",
    "kind",
    "active",
    "last_ran",
    "last_duration_ms",
    "exit_status",
    "next_runs",
    "timer",
    "command",
    "on_error",
    "box_type",
    "job_order",
    "version",
)
ViewFields = tuple[Any, ...]


def job_view(rec: JobRecord, depth: int, state: str, started: Any) -> dict[str, Any]:
    return view_of(VIEW_FIELDS(rec), depth, state, started)


def view_of(fields: ViewFields, depth: int, state: str, started: Any) -> dict[str, Any]:
    """The view of a job from its ``VIEW_FIELDS``, as they were when read."""
    (
        id_,
        name,
        parent_id,
        kind,
        active,
        last_ran,
        last_duration_ms,
        exit_status,
        next_runs,
        timer,
        command,
        on_error,
        box_type,
        job_order,
        version,
    ) = fields
    return {
        "id": id_,
        "name": name,
        "parent": parent_id,
        "depth": depth,
        "kind": str(kind),
        "active": active,
        "state": state,
        "started": started.isoformat() if started else None,
        "last_ran": last_ran.isoformat() if last_ran else None,
        "last_duration_ms": last_duration_ms,
        "exit_status": exit_status if last_ran else None,  # none before its first run
        "next_runs": next_runs.isoformat() if next_runs else None,
        "timer": timer,
        "command": command,
        "on_error": str(on_error),
        "box_type": str(box_type) if kind is Kind.BOX else None,
        "job_order": job_order,
        "version": version,
    }


_PLAIN = frozenset((str, int, float, bool, type(None)))


def jsonable(value: Any) -> Any:
    """A value as JSON can carry it: ISO datetimes, enum values, nested mappings and lists."""
    if type(value) in _PLAIN:  # most values: no ``Mapping`` check (an ABC's, slow) for them
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


# What a user who may not change a job's env sees of each value (README, Users and roles).
ENV_MASK = "********"


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """The names of ``env`` with every value masked."""
    return dict.fromkeys(env, ENV_MASK)


def run_json(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run (``RunRecord.as_dict()``) as the API and ``--json`` output give it."""
    return {key: jsonable(value) for key, value in run.items()}


def job_detail(
    rec: JobRecord, depth: int, state: str, started: datetime | None, run_id: int | None
) -> dict[str, Any]:
    """One job's stored fields and live state (its view, and what the view leaves out)."""
    return {
        **job_view(rec, depth, state, started),
        "run_id": run_id,
        "description": rec.description,
        "queue": rec.queue,
        "priority": rec.priority,
        "timeout": rec.timeout_s,
        "max_log_files": rec.max_log_files,
        "retries": rec.retries,
        "misfire": str(rec.misfire),
        "cwd": rec.cwd,
        "env": dict(rec.env),
        "last_updated": rec.last_updated.isoformat() if rec.last_updated else None,
        "updated_by": rec.updated_by,
    }
