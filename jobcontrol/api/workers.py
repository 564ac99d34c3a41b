"""The worker registry: every worker that joined, its slots, its heartbeat and the runs it holds."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from jobcontrol import views
from jobcontrol.api.deps import Context, JsonRoute, require
from jobcontrol.service.users import Action, User

router = APIRouter(prefix="/api/v1", tags=["workers"], route_class=JsonRoute)

Viewer = Annotated[User, Depends(require(Action.VIEW_WORKERS))]


@router.get("/workers", summary="Every registered worker, live ones first")
def list_workers(ctx: Context, _user: Viewer) -> dict[str, Any]:
    """Name, host, pid, slots (used / free), queues (null: every queue), version, when it
    started, its last heartbeat and how old that is on the daemon's clock, the most it
    said it would go until its next (``beat_s``: a third of a lease while it holds runs,
    a minute while idle), when it stopped (null while it runs), the task runs it holds,
    and its ``state``: online, late (not heard of within its lease), gone (on the daemon's
    host, its process is not running) or stopped."""
    workers = ctx.engine.workers()
    return {"workers": [views.jsonable(w) for w in workers]}
