"""Definition files over the API: load a whole file as one batch, export trees as YAML.

``load`` is the same call as ``jobcontrol load`` offline (one batch, one
'definitions.load' audit entry), made against the daemon's live engine in the
authenticated user's name; a bad file answers 422 with ``file:LINE:``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import Field, StringConstraints
from starlette.concurrency import run_in_threadpool

from jobcontrol.api.bodies import MAX_BODY_BYTES, JobName, NoNul, Strict
from jobcontrol.api.deps import Context, require, sees_env
from jobcontrol.service.loader import export_definitions, load_definitions
from jobcontrol.service.users import Action, User

router = APIRouter(prefix="/api/v1", tags=["definitions"], max_body_size=MAX_BODY_BYTES)

YAML = "text/yaml; charset=utf-8"


class DefinitionsBody(Strict):
    text: Annotated[str, StringConstraints(max_length=MAX_BODY_BYTES), NoNul]
    source: Annotated[
        str, StringConstraints(min_length=1, max_length=4096), NoNul, Field(description="file name")
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
    return {"created": result.created, "modified": result.modified, "deleted": result.deleted}


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
    text = await run_in_threadpool(export_definitions, ctx.engine, job, mask_env=mask)
    return Response(text, media_type=YAML)
