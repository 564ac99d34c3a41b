"""Lanes and the queue: list, add, set, drain, resume, remove lanes; the queue; reprioritize.

Viewers see lanes and the queue (``workers:view``); operators drain, resume and
reprioritize (``workers:manage``); admins add, set and remove lanes
(``lanes:configure``). Every change, and every refusal, is in the audit trail.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query

from jobcontrol import views
from jobcontrol.api.bodies import MAX_BODY_BYTES, MAX_ID, LaneSettings, PriorityBody
from jobcontrol.api.deps import Context, JsonRoute, NoBody, require
from jobcontrol.service.users import Action, User

router = APIRouter(
    prefix="/api/v1", tags=["lanes"], max_body_size=MAX_BODY_BYTES, route_class=JsonRoute
)

Viewer = Annotated[User, Depends(require(Action.VIEW_WORKERS))]
Manager = Annotated[User, Depends(require(Action.MANAGE_WORKERS))]
Configurer = Annotated[User, Depends(require(Action.CONFIGURE_LANES))]
LaneName = Annotated[str, Path(min_length=1, max_length=64)]


@router.get("/lanes", summary="Every lane: its rules, running and queued runs, oldest wait")
def list_lanes(ctx: Context, _user: Viewer) -> dict[str, Any]:
    """Per lane: ``state`` (open, draining, stopped), ``max_slots`` (null: no cap),
    ``poll_interval_s``, ``stale_timeout_s``, ``running``, ``queued``, ``free``,
    ``oldest_wait_s``, the ``queues`` seen in it. A queue without a lane row is in ``default``."""
    return {"lanes": [views.jsonable(x) for x in ctx.engine.lanes.list_lanes()]}


@router.post("/lanes", status_code=201, summary="Add a lane (admin)")
def add_lane(
    ctx: Context, body: Annotated[LaneSettings, Body()], user: Configurer
) -> dict[str, Any]:
    """``{"name": "gpu", "max_slots": 2, "poll_interval_s": "1s", ...}``."""
    fields = dict(body)
    name = fields.pop("name", None)
    if not isinstance(name, str):
        name = "" if name is None else str(name)
    return views.jsonable(ctx.engine.lanes.add_lane(name, fields, user=user.name))


@router.patch("/lanes/{name}", summary="Change a lane's settings (admin)")
def set_lane(
    ctx: Context, name: LaneName, body: Annotated[LaneSettings, Body()], user: Configurer
) -> dict[str, Any]:
    """Only the settings given change: ``max_slots`` (null or "none": no cap),
    ``poll_interval_s`` / ``stale_timeout_s`` (seconds or "2s", "30m"), ``enabled``."""
    return views.jsonable(ctx.engine.lanes.set_lane(name, body, user=user.name))


@router.delete("/lanes/{name}", summary="Remove a lane with no queued or running runs (admin)")
def remove_lane(ctx: Context, name: LaneName, user: Configurer, _: NoBody) -> dict[str, Any]:
    ctx.engine.lanes.remove_lane(name, user=user.name)
    return {"removed": name}


@router.post("/lanes/{name}/drain", summary="No new claims in the lane; running runs finish")
def drain_lane(ctx: Context, name: LaneName, user: Manager, _: NoBody) -> dict[str, Any]:
    return views.jsonable(ctx.engine.lanes.drain(name, user=user.name))


@router.post("/lanes/{name}/resume", summary="Claims again (also ends STOPPED)")
def resume_lane(ctx: Context, name: LaneName, user: Manager, _: NoBody) -> dict[str, Any]:
    return views.jsonable(ctx.engine.lanes.resume(name, user=user.name))


@router.get("/queue", summary="Queued task runs per lane, in claim order, with their wait")
def queue(
    ctx: Context,
    _user: Viewer,
    lane: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> dict[str, Any]:
    return {"lanes": [views.jsonable(x) for x in ctx.engine.lanes.queue(lane)]}


@router.patch("/runs/{run_id}/priority", summary="Change a queued run's priority")
def reprioritize(
    ctx: Context,
    run_id: Annotated[int, Path(ge=1, le=MAX_ID)],
    body: PriorityBody,
    user: Manager,
) -> dict[str, Any]:
    return ctx.engine.lanes.reprioritize(run_id, body.priority, user=user.name)
