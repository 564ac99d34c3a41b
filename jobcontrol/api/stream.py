"""The live event stream: ``GET /api/v1/events`` as Server-Sent Events.

Each event is ``id: <seq>`` / ``event: <type>`` / ``data: <json>``. A client
that reconnects with ``Last-Event-ID`` (or ``?after=``) first gets what it
missed, then live events; when those are no longer kept, or it falls too far
behind, it gets one ``resync`` event and the stream ends: it must take a fresh
snapshot (``GET /api/v1/tree``) and reconnect from that snapshot's ``seq``.
The dispatcher never waits for a reader: each has a bounded queue.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from jobcontrol.api.deps import Context, JsonRoute, authenticated_user, require
from jobcontrol.errors import JobControlError, clip
from jobcontrol.service.eventlog import Event, EventGap, EventLog
from jobcontrol.service.users import Action, User

log = logging.getLogger(__name__)

router = APIRouter(route_class=JsonRoute)

KEEPALIVE = ": keepalive\n\n"
# How often an open stream asks again whether its token still reads: a removed user's or
# a rotated token's stream ends within this (a new request is refused at once).
RECHECK_S = 2.0
SUBSCRIBER_QUEUE = 1000  # events a reader may fall behind before it must resync


def format_event(event: Event) -> str:
    data = json.dumps(event.data, separators=(",", ":"), default=str)
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"


def format_resync(gap: EventGap) -> str:
    data = json.dumps(
        {"reason": str(gap), "oldest_available": gap.oldest_available, "snapshot": "/api/v1/tree"}
    )
    return f"event: resync\ndata: {data}\n\n"


async def event_stream(
    eventlog: EventLog,
    after: int | None,
    *,
    heartbeat: float,
    disconnected: Callable[[], Awaitable[bool]] | None = None,
    allowed: Callable[[], Awaitable[bool]] | None = None,
    maxsize: int = SUBSCRIBER_QUEUE,
) -> AsyncIterator[str]:
    """The SSE text of the events after ``after`` (live only when None), then live ones.

    Ends after a ``resync`` event, when the log stops, when ``disconnected`` says the
    client has gone, or when ``allowed`` (asked at most every ``RECHECK_S``) says its
    token no longer reads (its user removed, its token rotated); the subscription is
    closed however it ends.
    """
    checked = sent = time.monotonic()
    wait = heartbeat if allowed is None else min(heartbeat, RECHECK_S)
    try:
        sub = eventlog.subscribe(after, maxsize=maxsize)
    except EventGap as gap:
        yield format_resync(gap)
        return
    try:
        while True:
            try:
                event = await sub.get_async(timeout=wait)
            except EventGap as gap:
                yield format_resync(gap)
                return
            if allowed is not None and time.monotonic() - checked >= RECHECK_S:
                checked = time.monotonic()
                if not await allowed():
                    return
            if event is not None:
                sent = time.monotonic()
                yield format_event(event)
                continue
            if sub.closed:
                return
            if disconnected is not None and await disconnected():
                return
            if time.monotonic() - sent >= heartbeat:
                sent = time.monotonic()
                yield KEEPALIVE
    finally:
        sub.close()


def _after(last_event_id: str | None, after: int | None) -> int | None:
    if last_event_id is None or not last_event_id.strip():
        return after
    try:
        value = int(last_event_id)
    except ValueError:
        raise HTTPException(
            422,
            f"Last-Event-ID must be an event's sequence number, not {clip(repr(last_event_id))}",
        ) from None
    if value < 0:
        raise HTTPException(422, "Last-Event-ID cannot be negative")
    return value


@router.get(
    "/api/v1/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
    tags=["events"],
)
async def events(
    request: Request,
    ctx: Context,
    _user: Annotated[User, Depends(require(Action.READ))],
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[
        int | None, Query(ge=0, description="for clients that cannot set Last-Event-ID")
    ] = None,
) -> StreamingResponse:
    """Every change as Server-Sent Events; resume with ``Last-Event-ID`` or ``?after=``."""
    authorization = request.headers.get("authorization")

    async def allowed() -> bool:
        try:
            user = await run_in_threadpool(authenticated_user, ctx, authorization)
        except HTTPException:
            return False  # unknown or revoked now
        except JobControlError:
            return True  # the database does not answer: the token it accepted stands
        return user.can(Action.READ)

    stream = event_stream(
        ctx.eventlog,
        _after(last_event_id, after),
        heartbeat=ctx.event_heartbeat,
        disconnected=request.is_disconnected,
        allowed=allowed,
    )
    headers: dict[str, Any] = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
