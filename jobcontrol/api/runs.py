"""The run routes: one run with its child runs, and a run's log (a range, the tail, or followed).

A log is only ever read from the run's own ``log_path`` as its worker
recorded it; a run whose output was empty has none (its worker keeps no
empty file), nor does a box run. A ``log_path`` of ``db:`` is a log kept in the
database (a remote worker's), read through the service the same way, byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from jobcontrol import views
from jobcontrol.api.bodies import MAX_BODY_BYTES, MAX_ID
from jobcontrol.api.deps import ApiContext, Context, JsonRoute, env_for, require
from jobcontrol.errors import StoreUnavailable
from jobcontrol.model import DB_LOG, RunRecord
from jobcontrol.service.users import Action, User

router = APIRouter(
    prefix="/api/v1", tags=["runs"], max_body_size=MAX_BODY_BYTES, route_class=JsonRoute
)

Viewer = Annotated[User, Depends(require(Action.READ))]
RunId = Annotated[int, Path(ge=1, le=MAX_ID)]

MAX_LOG_READ = 4 * 1024 * 1024  # the most one range or tail request answers
FOLLOW_CHUNK = 64 * 1024
# How often a followed log is looked at while it does not grow (doubling up to the max).
FOLLOW_POLL_MIN = 0.02
FOLLOW_POLL_MAX = 0.25
TEXT = "text/plain; charset=utf-8"


def run_json(run: RunRecord, user: User) -> dict[str, Any]:
    """A run as ``user`` may see it (its env snapshot masked unless an admin's)."""
    return env_for(user, views.run_json(run.as_dict()))


def _get_run(ctx: ApiContext, run_id: int) -> RunRecord | None:
    return ctx.engine.get_run(run_id)


def _known_run(ctx: ApiContext, run_id: int) -> RunRecord:
    run = _get_run(ctx, run_id)
    if run is None:
        raise HTTPException(404, f"run {run_id}: no such run")  # as UnknownRunError says it
    return run


@router.get("/runs/{run_id}", summary="One run, with the runs beneath it")
def get_run(ctx: Context, run_id: RunId, user: Viewer) -> dict[str, Any]:
    run = _known_run(ctx, run_id)
    tree = ctx.engine.tree_run(run.root_run_id or run.id)
    # The runs below this one: those whose chain of parent runs reaches it.
    below, children = {run.id}, []
    for r in tree:  # ids grow downwards: a parent run is always older than its children
        if r.parent_run_id in below:
            below.add(r.id)
            children.append(run_json(r, user))
    return {"run": run_json(run, user), "children": children}


# ---------------------------------------------------------------- logs


def _no_log(run: RunRecord) -> HTTPException:
    if run.kind == "box":
        return HTTPException(404, f"run {run.id} is a box run: only task runs have a log")
    if not run.state.is_final:
        return HTTPException(404, f"run {run.id} has no log yet (it is {run.state})")
    return HTTPException(
        404,
        f"run {run.id} has no log: its output was empty (no file is kept then) "
        "or the log was pruned (max_log_files)",
    )


def _open_log(run: RunRecord) -> int:
    """A descriptor of the run's own log file; 404 when there is none."""
    if run.log_path is None:
        raise _no_log(run)
    try:
        # O_NONBLOCK: opening something that is not a plain file must not hang.
        fd = os.open(run.log_path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise HTTPException(404, f"run {run.id} has no log: its file is gone") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HTTPException(404, f"run {run.id} has no log: {run.log_path} is not a file")
    return fd


def _read_log(
    ctx: ApiContext, run: RunRecord, offset: int, length: int, tail: int | None
) -> tuple[bytes, int, int]:
    """(bytes, where they start, the file's size) of a range or of the tail."""
    if run.log_path == DB_LOG:
        return ctx.engine.stored_log(run.id, offset, min(length, MAX_LOG_READ), tail)
    fd = _open_log(run)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - tail) if tail is not None else min(offset, size)
        data = os.pread(fd, min(length, MAX_LOG_READ), start)
    finally:
        os.close(fd)
    return data, start, size


def _read_from(ctx: ApiContext, run_id: int, path: str, offset: int) -> bytes | None:
    """Up to a chunk of the log from ``offset``; None when the file is gone."""
    if path == DB_LOG:
        return ctx.engine.stored_log(run_id, offset, FOLLOW_CHUNK)[0]
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(FOLLOW_CHUNK)
    except FileNotFoundError:
        return None


async def _follow(
    ctx: ApiContext, run_id: int, offset: int, request: Request
) -> AsyncIterator[bytes]:
    """The log from ``offset`` as it grows; ends once the run is final and all is sent."""
    delay = FOLLOW_POLL_MIN
    path: str | None = None
    while True:
        # The state first: a final run's log is complete, so an empty read after it is the end.
        # While the database is away the run goes on (its end waits for the database),
        # and so does the stream: a file log is still read from the path last known, and
        # the client hears of the outage from the event stream, not from a cut stream.
        away = False
        try:
            run = await run_in_threadpool(_get_run, ctx, run_id)
            final = run is None or run.state.is_final
            path = run.log_path if run is not None else None
        except StoreUnavailable:
            away, final = True, False
        try:
            chunk = await run_in_threadpool(_read_from, ctx, run_id, path, offset) if path else None
        except StoreUnavailable:  # a log kept in the database
            away, chunk = True, None
        if chunk:
            offset += len(chunk)
            delay = FOLLOW_POLL_MIN
            yield chunk
            continue
        if final or await request.is_disconnected():
            return
        await asyncio.sleep(FOLLOW_POLL_MAX if away else delay)
        delay = min(delay * 2, FOLLOW_POLL_MAX)


LOG_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The bytes of the log (headers X-Log-Size, X-Log-Offset)",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    404: {"description": "No such run, or the run has no log"},
}


@router.get(
    "/runs/{run_id}/log",
    summary="A byte range of a run's log, its tail, or the log followed while the run is live",
    response_class=Response,
    responses=LOG_RESPONSES,
)
async def run_log(
    ctx: Context,
    run_id: RunId,
    _user: Viewer,
    request: Request,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    length: Annotated[int, Query(ge=1, le=MAX_LOG_READ)] = 65536,
    tail: Annotated[
        int | None, Query(ge=1, le=MAX_LOG_READ, description="bytes from the end")
    ] = None,
    follow: Annotated[bool, Query(description="stream the log until the run ends")] = False,
) -> Response:
    run = await run_in_threadpool(_known_run, ctx, run_id)
    if not follow:
        data, start, size = await run_in_threadpool(_read_log, ctx, run, offset, length, tail)
        headers = {"X-Log-Size": str(size), "X-Log-Offset": str(start)}
        return Response(data, media_type=TEXT, headers=headers)
    if run.log_path is None and run.state.is_final:
        raise _no_log(run)
    if tail is not None and run.log_path is not None:
        _, offset, _ = await run_in_threadpool(_read_log, ctx, run, 0, 1, tail)
    return StreamingResponse(
        _follow(ctx, run_id, offset, request),
        media_type=TEXT,
        headers={"X-Log-Offset": str(offset), "Cache-Control": "no-cache"},
    )
