"""The audit trail over the API: what the CLI's ``jobcontrol audit`` reads, for a viewer
that is not on the database's host."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from jobcontrol.api.bodies import MAX_BODY_BYTES, MAX_ID
from jobcontrol.api.deps import Context, JsonRoute, require
from jobcontrol.service import audit
from jobcontrol.service.users import Action, User

router = APIRouter(
    prefix="/api/v1", tags=["audit"], max_body_size=MAX_BODY_BYTES, route_class=JsonRoute
)

AUDIT_PAGE_MAX = 500


@router.get("/audit", summary="The audit trail, newest first, a page at a time")
async def audit_trail(
    ctx: Context,
    _user: Annotated[User, Depends(require(Action.READ))],
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MAX)] = 50,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="entries before id")] = None,
    user: Annotated[str | None, Query(max_length=200, description="only this user's")] = None,
    job: Annotated[str | None, Query(max_length=200, description="only those naming it")] = None,
) -> dict[str, Any]:
    """``{"entries", "next"}``; ``next`` is the ``before`` of the next page, or null."""
    entries = await run_in_threadpool(
        audit.list_entries, ctx.store, limit=limit, before_id=before, user=user, job=job
    )
    following = entries[-1].id if len(entries) == limit else None  # limit >= 1
    return {"entries": [e.as_dict() for e in entries], "next": following}
