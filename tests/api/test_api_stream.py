"""The live event stream (``GET /api/v1/events``): numbering, resume, resync, keepalive.

The SSE generator is driven directly for what needs exact control (slow
readers, keepalives, closing); the rest goes end to end through the
TestClient, reading lines until the expected event. Every wait is bounded: the
stream sends a keepalive every 50 ms, so a read never blocks for long, and
``read_until`` fails at its deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from jobcontrol.api.stream import KEEPALIVE, RECHECK_S, event_stream
from jobcontrol.service.eventlog import EventLog
from jobcontrol.service.users import Role, add_user, remove_user
from tests.api.conftest import Api
from tests.integration.helpers import WAIT, poll_until, task

pytestmark = pytest.mark.timeout(60)

HEARTBEAT = 0.05


@dataclass
class Sse:
    id: int | None
    type: str
    data: dict[str, Any]


def parse(lines: Iterator[str], want: Callable[[Sse], bool], timeout: float = WAIT) -> list[Sse]:
    """The events read from SSE ``lines`` up to and including the first that ``want``s."""
    deadline = time.monotonic() + timeout
    got: list[Sse] = []
    fields: dict[str, str] = {}
    for line in lines:
        assert time.monotonic() < deadline, f"no matching event within {timeout}s; got {got}"
        if line.startswith(":"):
            continue
        if line:
            key, _, value = line.partition(": ")
            fields[key] = value
            continue
        if not fields:
            continue
        event = Sse(
            int(fields["id"]) if "id" in fields else None,
            fields.get("event", "message"),
            json.loads(fields["data"]),
        )
        fields = {}
        got.append(event)
        if want(event):
            return got
    raise AssertionError(f"the stream ended before the expected event; got {got}")


@pytest.fixture
def fast(api: Api) -> Api:
    api.ctx.event_heartbeat = HEARTBEAT
    return api


def subscribers(log: EventLog) -> int:
    return len(log._subscribers)


# ---------------------------------------------------------------- end to end


def test_events_arrive_live_with_increasing_ids(fast: Api) -> None:
    api = fast
    seq0 = api.ctx.eventlog.last_seq
    with api.client.stream(
        "GET", "/api/v1/events", params={"after": seq0}, headers=api.headers("viewer")
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        api.jc.create(task("hello", "true"))
        created = parse(lines, lambda e: e.type == "job.created")
        api.jc.run_now("hello")
        rest = parse(lines, lambda e: e.type == "run.finished")
    got = created + rest
    ids = [e.id for e in got]
    assert ids == list(range(seq0 + 1, seq0 + 1 + len(got)))
    assert created[-1].data["jobs"][0]["name"] == "hello"
    assert "run.started" in [e.type for e in rest]
    assert rest[-1].data["run"]["job_name"] == "hello"
    poll_until("the stream's subscription to close", lambda: subscribers(api.ctx.eventlog) == 0)


def test_reconnect_with_last_event_id_gets_exactly_what_was_missed(fast: Api) -> None:
    api = fast
    api.jc.create(task("first", "true"))
    seen = api.ctx.eventlog.last_seq
    api.jc.create(task("second", "true"), task("third", "true"))
    api.jc.modify("second", description="changed")
    missed = [e.seq for e in api.ctx.eventlog.since(seen)]
    assert missed

    headers = {**api.headers("viewer"), "Last-Event-ID": str(seen)}
    with api.client.stream("GET", "/api/v1/events", headers=headers) as response:
        got = parse(response.iter_lines(), lambda e: e.id == missed[-1])
    assert [e.id for e in got] == missed
    assert [e.type for e in got][-1] == "job.modified"


def test_last_event_id_wins_over_the_query(fast: Api) -> None:
    api = fast
    api.jc.create(task("first", "true"))
    seen = api.ctx.eventlog.last_seq
    api.jc.create(task("second", "true"))
    headers = {**api.headers("viewer"), "Last-Event-ID": str(seen)}
    with api.client.stream("GET", "/api/v1/events?after=0", headers=headers) as response:
        got = parse(response.iter_lines(), lambda e: True)
    assert got[0].id == seen + 1


def test_a_too_old_id_gets_resync_and_the_stream_ends(fast: Api) -> None:
    api = fast
    small = EventLog(api.jc.dispatcher, capacity=2)
    small.start()
    try:
        api.ctx.eventlog = small
        for name in ("a", "b", "c", "d"):
            api.jc.create(task(name, "true"))
        headers = {**api.headers("viewer"), "Last-Event-ID": "1"}
        with api.client.stream("GET", "/api/v1/events", headers=headers) as response:
            assert response.status_code == 200
            lines = list(response.iter_lines())  # the stream ends by itself
    finally:
        small.stop()
    got = parse(iter(lines), lambda e: True)
    assert [e.type for e in got] == ["resync"]
    assert got[0].data["oldest_available"] == small.oldest_available
    assert "snapshot" in got[0].data["reason"]
    assert subscribers(small) == 0


def test_an_id_from_another_daemon_run_gets_resync(fast: Api) -> None:
    api = fast
    headers = {**api.headers("viewer"), "Last-Event-ID": "999999"}
    with api.client.stream("GET", "/api/v1/events", headers=headers) as response:
        got = parse(response.iter_lines(), lambda e: True)
    assert got[0].type == "resync"
    assert got[0].data["oldest_available"] == api.ctx.eventlog.last_seq + 1


def test_bad_last_event_id_is_refused(api: Api) -> None:
    headers = {**api.headers("viewer"), "Last-Event-ID": "yesterday"}
    response = api.client.get("/api/v1/events", headers=headers)
    assert response.status_code == 422
    assert "Last-Event-ID" in response.text
    response = api.client.get("/api/v1/events?after=-3", headers=api.headers("viewer"))
    assert response.status_code == 422


def test_the_stream_needs_a_token(api: Api) -> None:
    assert api.client.get("/api/v1/events").status_code == 401
    bad = {"Authorization": "Bearer jc_not-a-token"}
    assert api.client.get("/api/v1/events", headers=bad).status_code == 401


# ---------------------------------------------------------------- the generator


async def _take(stream: Any, n: int) -> list[str]:
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(anext(stream), WAIT))
    return out


def test_an_idle_stream_sends_keepalives_and_closes_its_subscription(api: Api) -> None:
    log = api.ctx.eventlog

    async def main() -> list[str]:
        stream = event_stream(log, None, heartbeat=HEARTBEAT)
        try:
            return await _take(stream, 2)
        finally:
            await stream.aclose()

    assert asyncio.run(main()) == [KEEPALIVE, KEEPALIVE]
    assert subscribers(log) == 0


def test_a_stream_ends_when_the_client_has_gone(api: Api) -> None:
    log = api.ctx.eventlog

    async def gone() -> bool:
        return True

    async def main() -> list[str]:
        return [
            chunk async for chunk in event_stream(log, None, heartbeat=HEARTBEAT, disconnected=gone)
        ]

    assert asyncio.run(main()) == []
    assert subscribers(log) == 0


def test_a_reader_that_falls_behind_gets_resync_not_a_blocked_dispatcher(api: Api) -> None:
    log = api.ctx.eventlog
    seq0 = log.last_seq

    async def main() -> list[str]:
        stream = event_stream(log, seq0, heartbeat=HEARTBEAT, maxsize=2)
        first = await _take(stream, 1)  # keepalive: subscribed, now falls behind
        # The edits go through the dispatcher while this reader reads nothing.
        await asyncio.to_thread(
            api.jc.create, task("a", "true"), task("b", "true"), task("c", "true")
        )
        await asyncio.to_thread(api.jc.modify, "a", description="x")
        await asyncio.to_thread(api.jc.modify, "b", description="y")
        rest = [chunk async for chunk in stream]
        return first + rest

    chunks = asyncio.run(main())
    assert chunks[0] == KEEPALIVE
    assert chunks[-1].startswith("event: resync\n")
    assert "fell more than 2 events behind" in chunks[-1]
    assert subscribers(log) == 0


def test_a_removed_users_stream_ends_within_a_recheck(fast: Api) -> None:
    """ "Its token stops working at once": a stream opened before the user was removed
    ends within ``RECHECK_S``, not when the client lets go; other streams go on."""
    api = fast
    _, token = add_user(api.jc.store, "leaving", Role.VIEWER)
    kept_open = api.client.stream("GET", "/api/v1/events", headers=api.headers("viewer"))
    with (
        kept_open as other,
        api.client.stream(
            "GET", "/api/v1/events", headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)  # open: a keepalive or an event
        remove_user(api.jc.store, "leaving")
        began = time.monotonic()
        for _ in lines:  # keepalives, until the stream ends
            assert time.monotonic() - began < RECHECK_S + WAIT, "the stream did not end"
        assert time.monotonic() - began < RECHECK_S + WAIT
        assert other.status_code == 200
        assert next(other.iter_lines()) is not None  # the other user's stream goes on
