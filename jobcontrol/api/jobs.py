"""The job routes: the tree, one job, create, batch modify, delete, run, kill, restart, history.

Every change is one ``Engine`` call (one transaction, one dispatcher reaction)
made in the authenticated user's name, so the audit trail and ``updated_by``
carry it. Live state is read through the engine (on the dispatcher's thread), never from
the tree directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.convertors import Convertor, register_url_convertor

from jobcontrol.api.bodies import (
    MAX_BODY_BYTES,
    MAX_ID,
    BoxTypeBody,
    JobsBody,
    ModifyBody,
    NewJobBody,
    OnErrorBody,
)
from jobcontrol.api.deps import (
    ApiContext,
    Context,
    JsonRoute,
    NoBody,
    env_for,
    least_action,
    may_not,
    require,
)
from jobcontrol.api.runs import run_json
from jobcontrol.errors import UnknownJobError, ValidationError, clip
from jobcontrol.model import RUNS_PAGE_MAX, JobRef, Kind
from jobcontrol.service.engine import JobChange
from jobcontrol.service.users import Action, User

router = APIRouter(
    prefix="/api/v1", tags=["jobs"], max_body_size=MAX_BODY_BYTES, route_class=JsonRoute
)

T = TypeVar("T")

Viewer = Annotated[User, Depends(require(Action.READ))]
Operator = Annotated[User, Depends(require(Action.RUN))]
Activator = Annotated[User, Depends(require(Action.ACTIVATE))]
Admin = Annotated[User, Depends(require(Action.MODIFY))]

# ---------------------------------------------------------------- reading the live tree


def _job_ref(
    job: str,
    by: Annotated[
        Literal["name", "id"] | None,
        Query(
            description="`id`: the path is a job's id, never a name. Without it a path of "
            "digits names the job that has it as its name, else the job with that id."
        ),
    ] = None,
) -> JobRef:
    """The job a ``/jobs/{job}`` path names: with ``?by=id`` an id only (the admin client,
    which names jobs by id, must never reach a job named ``"3"`` for the job of id 3)."""
    if by != "id":
        return job
    if not (job.isascii() and job.isdigit()) or int(job) > MAX_ID:
        raise ValidationError(f"?by=id needs a job id (digits), not {clip(repr(job))}")
    return int(job)


# A job named in the path: by name, or id (see ``_job_ref``).
JobPath = Annotated[JobRef, Depends(_job_ref)]


def resolve_job(ctx: ApiContext, ref: JobRef) -> int:
    """The id of the job a path names (``/jobs/{job}``)."""
    return ctx.engine.job_id(ref)


def _modified(ctx: ApiContext, ids: list[int]) -> dict[str, Any]:
    return {"modified": ids, "jobs": ctx.engine.live_views(ids)}


def _batch(ctx: ApiContext, user: User, jobs: Sequence[JobRef], **fields: Any) -> dict[str, Any]:
    changes = [JobChange(job, dict(fields)) for job in jobs]
    return _modified(ctx, ctx.engine.modify_jobs(changes, user=user.name))


# ---------------------------------------------------------------- the tree and one job


@router.get("/tree", summary="Every job with its live state, and the event it is consistent with")
def get_tree(ctx: Context, _user: Viewer) -> JSONResponse:
    seq, views = ctx.eventlog.snapshot()
    # Built straight into JSON: the views are JSON-ready, and 10,000 of them must be quick.
    return JSONResponse({"seq": seq, "jobs": views})


@router.post("/jobs", status_code=201, summary="Create a box or a task")
def create_job(
    ctx: Context, body: NewJobBody, user: Annotated[User, Depends(require(Action.CREATE))]
) -> dict[str, Any]:
    fields = body.given()
    for key in ("name", "kind", "parent"):
        fields.pop(key, None)
    rec = ctx.engine.create_job(
        body.name, Kind(body.kind), parent=body.parent, user=user.name, **fields
    )
    return env_for(user, ctx.engine.job_detail(rec.id))


@router.patch("/jobs", summary="Modify a batch of jobs in one transaction, all or nothing")
@least_action(Action.ACTIVATE)  # an operator may change ``active``, a viewer nothing
def modify_jobs(ctx: Context, body: ModifyBody, user: Viewer, request: Request) -> dict[str, Any]:
    fields = {key for change in body.changes for key in change.fields.given()}
    action = Action.for_fields(fields)
    if not user.can(action):
        refused = fields - {"active"} if user.can(Action.ACTIVATE) else fields
        message = may_not(user, action, refused)
        # Refused like any other change the role may not make, so audited like one.
        operation = f"{request.method} {request.url.path}"
        ctx.engine.record_refusal(user.name, operation, [c.job for c in body.changes], message)
        raise HTTPException(403, message)
    changes = [JobChange(c.job, c.fields.given(), c.version) for c in body.changes]
    return _modified(ctx, ctx.engine.modify_jobs(changes, user=user.name))


@router.post("/jobs/delete", summary="Delete jobs with their sub-trees (parents first)")
def delete_jobs(
    ctx: Context, body: JobsBody, user: Annotated[User, Depends(require(Action.DELETE))]
) -> dict[str, Any]:
    result = ctx.engine.delete_jobs(body.jobs, user=user.name)
    # ``deleted``: the sub-trees' roots (parents first); ``deleted_jobs``: every job that
    # went with them, the roots included.
    return {"deleted": result.deleted, "deleted_jobs": result.deleted_jobs}


@router.post("/jobs/activate", summary="Activate jobs (one batch)")
def activate_jobs(ctx: Context, body: JobsBody, user: Activator) -> dict[str, Any]:
    return _batch(ctx, user, body.jobs, active=True)


@router.post("/jobs/deactivate", summary="Deactivate jobs (one batch)")
def deactivate_jobs(ctx: Context, body: JobsBody, user: Activator) -> dict[str, Any]:
    return _batch(ctx, user, body.jobs, active=False)


@router.post("/jobs/on-error", summary="Set on_error of jobs (one batch)")
def set_on_error(ctx: Context, body: OnErrorBody, user: Admin) -> dict[str, Any]:
    return _batch(ctx, user, body.jobs, on_error=body.on_error)


@router.post("/jobs/box-type", summary="Set box_type of boxes (one batch)")
def set_box_type(ctx: Context, body: BoxTypeBody, user: Admin) -> dict[str, Any]:
    return _batch(ctx, user, body.jobs, box_type=body.box_type)


# The routes below name a job in the path: a name (URL-encoded; never holding '/') or an id.
class _JobPath(Convertor[str]):
    """A job reference in a path, whatever it holds: Starlette's ``path`` matches with
    ``.*``, which stops at a line break, so ``flaky%0A`` was taken for ``flaky`` and
    ``a%0Ab`` was no route at all. The name is then refused as any unknown one is."""

    regex = "[\\s\\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return str(value)


register_url_convertor("jobref", _JobPath())


# Those with a suffix come before GET /jobs/{job}, which would take the suffix as part of the name.


@router.post("/jobs/{job:jobref}/run", status_code=202, summary="Run a job and its sub-tree now")
def run_job(ctx: Context, job: JobPath, user: Operator, _: NoBody) -> dict[str, Any]:
    # The ref as given: one that names no job is refused inside the engine's audit scope.
    return {"run_id": ctx.engine.run_now(job, user=user.name)}


@router.post("/jobs/{job:jobref}/kill", summary="Kill the run the job is part of")
def kill_job(
    ctx: Context,
    job: JobPath,
    user: Annotated[User, Depends(require(Action.KILL))],
    _: NoBody,
) -> dict[str, Any]:
    run_id = ctx.engine.kill(job, user=user.name)
    # A task's kill stops the run of the nearest sub-tree root above it (spec 8.1): say whose.
    killed = ctx.engine.get_run(run_id)
    if killed is None:
        return {"run_id": run_id, "job": None}
    # The job's name now: the run keeps the name it started under, which a rename since
    # has changed (one that is gone keeps it).
    try:
        name = ctx.engine.get_job(killed.job_id).name if killed.job_id is not None else None
    except UnknownJobError:
        name = None
    return {"run_id": run_id, "job": name or killed.job_name}


@router.post("/jobs/{job:jobref}/restart", summary="Re-arm a top-level job's timer")
def restart_job(
    ctx: Context,
    job: JobPath,
    user: Annotated[User, Depends(require(Action.RESTART))],
    _: NoBody,
) -> dict[str, Any]:
    result = ctx.engine.restart(job, user=user.name)
    when = result.next_runs
    return {
        "next_runs": when.isoformat() if when else None,
        "armed": when is not None,
        "reason": result.not_armed,  # why nothing is armed (inactive, no time left)
        "held": result.held,  # armed, but the timers are paused until resumed
    }


@router.get("/jobs/{job:jobref}/runs", summary="A job's runs, newest first, paged by run id")
def job_runs(
    ctx: Context,
    job: JobPath,
    user: Viewer,
    limit: Annotated[int, Query(ge=1, le=RUNS_PAGE_MAX)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="the `next` of the previous page")
    ] = None,
) -> dict[str, Any]:
    runs = ctx.engine.history(resolve_job(ctx, job), limit=limit, before_id=before)
    more = len(runs) == limit
    return {"runs": [run_json(r, user) for r in runs], "next": runs[-1].id if more else None}


@router.get("/jobs/{job:jobref}", summary="One job's stored fields and live state")
def get_job(ctx: Context, job: JobPath, user: Viewer) -> dict[str, Any]:
    """An env's values are masked for a user who may not change them."""
    return env_for(user, ctx.engine.job_detail(job))
