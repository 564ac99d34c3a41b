"""The client side of the daemon's event stream (``jobcontrol.service.eventlog``).

``apply_event`` updates a tree of job views (by id, as ``GET /api/v1/jobs`` or the
stream's snapshot gives them) in place with one event, so a snapshot and the events
after it, replayed, equal a later snapshot. The Qt client keeps its own model (Qt's
rows must be told of each change) and follows the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JobView = dict[str, Any]


def apply_event(views: dict[int, JobView], type_: str, data: Mapping[str, Any]) -> None:
    """Update a tree of job views (by id, from ``snapshot``) in place with one event."""
    if type_ in ("job.created", "job.modified", "schedule.changed"):
        moved = False
        for view in data["jobs"]:
            old = views.get(view["id"])
            moved = moved or old is None or old["parent"] != view["parent"]
            views[view["id"]] = dict(view)
        if moved:
            _recompute_depths(views)
    elif type_ == "job.deleted":
        doomed = set(data["ids"])
        for job_id in list(views):
            if any(a in doomed for a in _lineage(views, job_id)):
                del views[job_id]
    elif type_ == "state.changed":
        view = views.get(data["id"])
        if view is not None:
            view.update(state=data["state"], started=data["started"])
    elif type_ in ("run.started", "run.finished"):
        job = data.get("job")
        if job is not None and job["id"] in views:
            views[job["id"]] = dict(job)


def _lineage(views: Mapping[int, JobView], job_id: int | None) -> list[int]:
    out: list[int] = []
    while job_id is not None and job_id in views and len(out) <= len(views):
        out.append(job_id)
        job_id = views[job_id]["parent"]
    return out


def _recompute_depths(views: dict[int, JobView]) -> None:
    for job_id, view in views.items():
        view["depth"] = len(_lineage(views, job_id)) - 1
