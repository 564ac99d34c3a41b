"""Definition files over the API: load a whole file as one batch, export trees as YAML.

``load`` is the same call as ``jobcontrol load`` offline (one batch, one
'definitions.load' audit entry), made against the daemon's live engine in the
authenticated user's name; a bad file answers 422 with ``file:LINE:``.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import Field, StringConstraints

from jobcontrol.api.bodies import MAX_BODY_BYTES, JobName, NoNul, Printable, Strict
from jobcontrol.api.deps import ApiContext, Context, JsonRoute, require, sees_env
from jobcontrol.service.loader import export_definitions, load_definitions
from jobcontrol.service.users import Action, User

router = APIRouter(
    prefix="/api/v1", tags=["definitions"], max_body_size=MAX_BODY_BYTES, route_class=JsonRoute
)

YAML = "text/yaml; charset=utf-8"


class DefinitionsBody(Strict):
    text: Annotated[str, StringConstraints(max_length=MAX_BODY_BYTES), NoNul]
    source: Annotated[
        str,
        StringConstraints(min_length=1, max_length=4096),
        NoNul,
        Printable,
        Field(description="file name"),
    ] = "<api>"
    replace: bool = Field(
        False, description="also delete jobs of the file's trees that it no longer has"
    )


@router.post("/definitions", summary="Load a definition file (YAML or JSON) as one batch")
def load(
    ctx: Context, body: DefinitionsBody, user: Annotated[User, Depends(require(Action.MODIFY))]
) -> dict[str, Any]:
    result = load_definitions(
        ctx.engine, body.text, body.source, user=user.name, replace=body.replace
    )
    return {
        "created": result.created,
        "modified": result.modified,
        "deleted": result.deleted,  # the roots of the sub-trees deleted
        "deleted_jobs": result.deleted_jobs,  # every job that went with them
    }


@router.get(
    "/definitions",
    summary="Every job tree, or one job's sub-tree, as a YAML definition file",
    response_class=Response,
    responses={200: {"content": {"text/yaml": {"schema": {"type": "string"}}}}},
)
async def export(
    ctx: Context,
    user: Annotated[User, Depends(require(Action.READ))],
    job: Annotated[JobName | None, Query(description="only this job's sub-tree")] = None,
) -> Response:
    """env values are masked for a user who may not change them (the file says so)."""
    mask = not sees_env(user)
    dump = functools.partial(export_definitions, ctx.engine, job, mask_env=mask)
    text = await anyio.to_thread.run_sync(dump, limiter=_exports(ctx))
    return Response(text, media_type=YAML)


# Exports that may run at once; the others wait their turn. An export is Python from
# end to end (YAML written by hand): fifty at once in the server's forty threads held
# the interpreter lock away from the dispatcher for seconds, and its timers ran late.
EXPORTS_AT_ONCE = 2


def _exports(ctx: ApiContext) -> anyio.CapacityLimiter:
    if ctx.export_limiter is None:  # made in the server's event loop, which it belongs to
        ctx.export_limiter = anyio.CapacityLimiter(EXPORTS_AT_ONCE)
    return typing.cast(anyio.CapacityLimiter, ctx.export_limiter)
