"""The dispatcher as a whole: health, status, pause / resume, log level, shutdown, metrics."""

from __future__ import annotations

import enum
import logging
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict

from jobcontrol import logbatch
from jobcontrol.api.bounded import DatabaseNotAnswering
from jobcontrol.api.deps import ApiContext, Context, JsonRoute, NoBody, capped, require
from jobcontrol.errors import BusyError, StoreUnavailable
from jobcontrol.service import audit
from jobcontrol.service.metrics import CONTENT_TYPE
from jobcontrol.service.users import Action, User

log = logging.getLogger(__name__)

router = APIRouter(route_class=JsonRoute)

LOGGER = "jobcontrol"  # the logger whose level setLogLevel (spec 11) changes
# /healthz: a dispatcher on one event this long (the database answering) schedules
# nothing meanwhile: 503. A handler takes milliseconds; a SQLite lock held by another
# process holds one up for the busy timeout at most (30 s), then it is an outage.
STUCK_S = 60.0
# /healthz: a timer fired this late within the last minute or two says the dispatcher
# is behind (a flood of work, a starved host): said in the body, still 200.
LATE_S = 5.0


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class LogLevelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: LogLevel


class ShutdownBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "yes" or 1 is no ``true``
    force: bool = False


# ---------------------------------------------------------------- health and status


@router.get("/healthz", tags=["system"])
def healthz(ctx: Context) -> JSONResponse:
    """No authentication: 200 while the dispatcher runs and the database answers, else 503.

    Low disk space is said in the body (``status: low disk space``) but keeps 200: the
    daemon still records every run, and a restart would not free a byte. So are lines of
    the daemon's own log that could not be written (``status: log not written``), and
    timers that fired ``LATE_S`` or more after their time lately (``status: timers
    late``: the dispatcher is behind). A dispatcher on one event for ``STUCK_S`` is
    503 (``status: dispatcher stuck``): it schedules nothing meanwhile.
    """
    if not ctx.engine.running:
        return JSONResponse({"status": "stopped"}, status_code=503)
    db = ctx.database_state()
    if not db["ok"]:
        body = {"status": "database unavailable", "reason": db["error"], "since": _iso(db["since"])}
        return JSONResponse(body, status_code=503)
    alive = ctx.engine.dispatcher_liveness()
    if alive["handler_s"] >= STUCK_S:
        reason = (
            f"the dispatcher has been on one event for {alive['handler_s']:.0f}s: no timer "
            "fires and no run's end is reacted to meanwhile (a database that holds it up, "
            "or a fault: see the daemon's log)"
        )
        return JSONResponse({"status": "dispatcher stuck", "reason": reason}, status_code=503)
    late = (
        [
            f"timers late: one fired {alive['timer_late_s']:.1f}s after its time within the "
            "last minute (the dispatcher is behind: too much work at once, a starved host, or "
            "a database slow to answer: see the daemon's log)"
        ]
        if alive["timer_late_s"] >= LATE_S
        else []
    )
    try:  # one bounded wait for the three reads
        stopped, troubled, unserved = ctx.reads.call(
            lambda: (
                _stopped_lanes(ctx),
                _workers_with_log_problems(ctx),
                _unserved(ctx, "/healthz"),
            ),
            "health",
        )
    except DatabaseNotAnswering as exc:  # no outage says it: the database fails nothing
        return JSONResponse(
            {"status": "database not answering", "reason": str(exc)}, status_code=503
        )
    lost = logbatch.lost()
    # The daemon's own log: it goes on without it (every run is in the database).
    unlogged = (
        [
            f"the daemon's log: {lost.pending} lines not written since {_iso(lost.since)}: {lost.error}"
        ]
        if lost is not None and lost.pending
        else []
    )
    if not (ctx.disk or stopped or troubled or unserved or unlogged or late):
        return JSONResponse({"status": "ok"})
    spaces = ctx.disk() if ctx.disk is not None else {}
    low = [space.describe() for space in spaces.values() if space.low]
    # A STOPPED lane keeps 200 too: the other lanes run; the body says which and why.
    # So does a worker whose task output met a problem (a full spool, a failed write):
    # its runs go on, and the output it could not keep is said in the run's reason.
    problems = [
        *low,
        *late,
        *unlogged,
        *(f"lane {s['name']} STOPPED: {s['reason']}" for s in stopped),
        *(
            f"worker {w['name']}: {w['log_problems']} task runs' output met a problem, "
            f"the last: {w['log_problem']}"
            for w in troubled
        ),
        *(_unserved_text(u) for u in unserved),
    ]
    status = "ok"
    if low:
        status = "low disk space"
    elif late:
        status = "timers late"
    elif unlogged:
        status = "log not written"
    elif stopped:
        status = "lane stopped"
    elif unserved:
        status = "runs waiting for a worker"
    elif troubled:
        status = "worker log problems"
    health: dict[str, Any] = {"status": status}
    if ctx.disk is not None:
        health["disk"] = {key: space.as_dict() for key, space in spaces.items()}
    if stopped:
        health["stopped_lanes"] = stopped
    if troubled:
        health["worker_log_problems"] = troubled
    if unserved:
        health["unserved_queues"] = unserved
    if problems:
        health["reason"] = "; ".join(problems)
    return JSONResponse(health)


def _stopped_lanes(ctx: Context) -> list[dict[str, Any]]:
    """STOPPED lanes, read from the database. While it does not answer, none are listed:
    ``/status`` is served from memory then, and says the database is away.

    What an outage keeps these reads from is logged at DEBUG only: the answer itself says
    the database is away, and the parts that meet it log the outage once, when it begins
    and when it ends; a line per request would bury those two in a polled daemon's log."""
    try:
        stopped = ctx.engine.lanes.stopped()
    except StoreUnavailable as exc:  # the outage itself is in /status's `database`
        log.debug("stopped lanes not read for /status: %s", exc)
        return []
    return [
        {**s, "stopped_at": s["stopped_at"].isoformat() if s["stopped_at"] else None}
        for s in stopped
    ]


def _live_workers(ctx: ApiContext, where: str) -> list[dict[str, Any]] | None:
    """The workers not stopped, or None while the database does not answer."""
    try:
        return ctx.engine.live_workers()
    except StoreUnavailable as exc:
        log.debug("workers not read for %s: %s", where, exc)
        return None


def _unserved(ctx: ApiContext, where: str) -> list[dict[str, Any]]:
    """Queues whose runs wait with no live worker serving them (JSON-ready); none listed
    while the database does not answer (the outage is said instead)."""
    try:
        unserved = ctx.engine.unserved_queues()
    except StoreUnavailable as exc:
        log.debug("unserved queues not read for %s: %s", where, exc)
        return []
    out = []
    for u in unserved:
        last = u["last_worker"]
        out.append(
            {
                "queue": u["queue"],
                "runs": u["runs"],
                "oldest": u["oldest"].isoformat(),
                "last_worker": None
                if last is None
                else {"name": last["name"], "heartbeat": last["heartbeat"].isoformat()},
            }
        )
    return out


def _unserved_text(u: dict[str, Any]) -> str:
    last = u["last_worker"]
    heard = (
        "no worker has served it"
        if last is None
        else f"its last worker {last['name']} was last heard of at {last['heartbeat']}"
    )
    runs = "1 run waits" if u["runs"] == 1 else f"{u['runs']} runs wait"
    return (
        f"queue {u['queue']}: {runs} (since {u['oldest']}) and no live worker serves it; "
        f"{heard}"
    )


def _workers_with_log_problems(ctx: Context) -> list[dict[str, Any]]:
    """Workers not stopped whose task output met a problem in this life (their registry
    row, renewed with each heartbeat). None listed while the database does not answer."""
    return [w for w in _live_workers(ctx, "/healthz") or [] if w["log_problems"]]


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat() if epoch is not None else None


@router.get("/api/v1/whoami", tags=["system"])
def whoami(user: Annotated[User, Depends(require(Action.READ))]) -> dict[str, Any]:
    """The token's user, its role and what that role may do (the admin client enables its
    actions by it; the server still checks every request)."""
    return {
        "name": user.name,
        "role": str(user.role),
        "permissions": sorted(str(a) for a in Action if user.can(a)),
    }


@router.get("/api/v1/status", tags=["system"])
def status(ctx: Context, _user: Annotated[User, Depends(require(Action.READ))]) -> dict[str, Any]:
    """Tree state, timers armed (and the next few), timers come due and not yet run, paused,
    runs in flight, version, uptime, the database and disk space."""
    view = ctx.engine.status()
    now = datetime.now(UTC)
    db = ctx.database_state()
    hangs: str | None = None
    try:
        stopped, unserved = ctx.reads.call(
            lambda: (_stopped_lanes(ctx), _unserved(ctx, "/status")), "status"
        )
    except DatabaseNotAnswering as exc:  # said below; the rest is served from memory
        stopped, unserved, hangs = [], [], str(exc)
    return {
        "database": {
            "ok": db["ok"],
            "since": _iso(db["since"]),
            "error": db["error"],
            "outages": db["outages"],
            # Which parts meet the outage: the dispatcher, the worker, the notifications.
            "parts": {
                name: {**part, "since": _iso(part["since"])}
                for name, part in db.get("parts", {}).items()
            },
            # A write under way for a second or more: the database is slow to answer (a
            # lock another process holds, a server that does not answer) before the
            # busy or connect timeout makes it an outage.
            "slow_write": _slow_write(ctx),
            # A read that the database did not answer within the API's patience: it
            # hangs without failing (no outage says so until a timeout does).
            "not_answering": hangs,
        },
        "version": ctx.version,
        "containment": ctx.containment() if ctx.containment is not None else None,
        "started": ctx.started.isoformat(),
        "uptime_s": round((now - ctx.started).total_seconds(), 3),
        "tree_state": view["tree_state"],
        "paused": view["paused"],
        "timers_armed": view["timers_armed"],
        "next_timers": [{"job": t["job"], "at": t["at"].isoformat()} for t in view["next_timers"]],
        "timers_due": view["timers_due"],
        "due_timers": [{"job": t["job"], "at": t["at"].isoformat()} for t in view["due_timers"]],
        "runs_in_flight": [
            {**r, "started": r["started"].isoformat() if r["started"] else None}
            for r in view["runs_in_flight"]
        ],
        "event_seq": ctx.eventlog.last_seq,
        "stopped_lanes": stopped,
        "unserved_queues": unserved,
        "disk": {key: d.as_dict() for key, d in ctx.disk().items()} if ctx.disk else None,
        "daemon_log": _daemon_log(),
    }


SLOW_WRITE_S = 1.0


def _slow_write(ctx: ApiContext) -> dict[str, Any] | None:
    longest = ctx.store.longest_write()
    if longest is None or longest[1] < SLOW_WRITE_S:
        return None
    return {"thread": longest[0], "seconds": round(longest[1], 3)}


def _daemon_log() -> dict[str, Any] | None:
    """Lines of the daemon's own log that could not be written (None: no such log)."""
    lost = logbatch.lost()
    if lost is None:
        return None
    return {
        "lines_lost": lost.total,
        "losing_since": _iso(lost.since) if lost.pending else None,
        "lines_lost_since": lost.pending,
        "error": lost.error,
    }


# ---------------------------------------------------------------- timers


@router.post("/api/v1/timers/pause", tags=["system"])
def pause_timers(
    ctx: Context, user: Annotated[User, Depends(require(Action.PAUSE))], _: NoBody
) -> dict[str, Any]:
    """Timers stop firing (trees stay scheduled); runs in flight go on."""
    armed = ctx.engine.pause_timers(user=user.name)
    return {"paused": True, "timers_armed": armed}


@router.post("/api/v1/timers/resume", tags=["system"])
def resume_timers(
    ctx: Context, user: Annotated[User, Depends(require(Action.PAUSE))], _: NoBody
) -> dict[str, Any]:
    """Re-arm every scheduled tree; a time missed while paused follows the tree's misfire."""
    armed = ctx.engine.resume_timers(user=user.name)
    return {"paused": False, "timers_armed": armed}


# ---------------------------------------------------------------- log level


def _level() -> str:
    return logging.getLevelName(logging.getLogger(LOGGER).getEffectiveLevel())


@router.get("/api/v1/log-level", tags=["system"])
def get_log_level(_user: Annotated[User, Depends(require(Action.READ))]) -> dict[str, str]:
    return {"level": _level()}


@router.put("/api/v1/log-level", tags=["system"])
def set_log_level(
    body: LogLevelBody, ctx: Context, user: Annotated[User, Depends(require(Action.MODIFY))]
) -> dict[str, str]:
    """Spec 11 ``setLogLevel``: the level of the ``jobcontrol`` loggers."""
    with audit.scope(ctx.store, user.name, "log.level") as note:
        old = _level()
        logging.getLogger(LOGGER).setLevel(body.level.value)
        note.detail = f"log level {old} -> {body.level.value}"
    log.warning("Log level set to %s by %s", body.level.value, user.name)
    return {"level": _level()}


# ---------------------------------------------------------------- shutdown


@router.post("/api/v1/shutdown", status_code=202, tags=["system"])
def shutdown(
    ctx: Context,
    # Stopping the daemon is an admin's, as modifying is: the refusal says what it asked.
    user: Annotated[User, Depends(require(Action.MODIFY, doing="stop the daemon"))],
    body: ShutdownBody | None = None,
) -> JSONResponse:
    """Stop the daemon; refused (409) while jobs run unless ``force`` (which kills them).
    A tree whose task waits in the queue, or runs on a worker of its own, is not in the
    way: it goes on, for the next start or its worker. No body (or ``null``) is
    ``{"force": false}``."""
    body = body or ShutdownBody()
    running = ctx.engine.busy_jobs() if body.force else ctx.engine.trees_a_stop_ends()[0]
    if running and not body.force:
        message = (
            f"jobs are running: {', '.join(sorted(running))}; "
            "wait for them, kill them, or shut down with force"
        )
        audit.record(ctx.store, user.name, "daemon.shutdown", running, "refused", message)
        return JSONResponse(
            {"error": "JobsRunning", "message": capped(message), "jobs": sorted(running)},
            status_code=409,
        )
    with audit.scope(ctx.store, user.name, "daemon.shutdown", running) as note:
        note.detail = "forced, killing running jobs" if running else "graceful"
        ctx.request_shutdown(body.force)
    log.warning("Shutdown requested by %s (force=%s)", user.name, body.force)
    return JSONResponse({"shutting_down": True, "force": body.force}, status_code=202)


# ---------------------------------------------------------------- metrics

# What the dispatcher holds in memory (Engine.dispatcher_gauges): -1 while it cannot say.
DISPATCHER_GAUGES = ("timers_armed", "timers_due", "paused", "tree_state_waits", "failures")


def _database_gauges(ctx: ApiContext) -> tuple[int, list[dict[str, Any]] | None, int]:
    """Runs queued, the live workers (None: not read) and runs no live worker serves
    (-1: not read)."""
    queued = ctx.engine.count_queued()
    workers = _live_workers(ctx, "/metrics")
    try:
        unserved = sum(u["runs"] for u in ctx.engine.unserved_queues())
    except StoreUnavailable as exc:
        log.debug("unserved queues not read for /metrics: %s", exc)
        unserved = -1
    return queued, workers, unserved


def _gauges(ctx: ApiContext) -> dict[str, tuple[str, float]]:
    db = ctx.database_state()
    up = 1 if db["ok"] else 0
    queued = live = log_problems = unserved = -1  # unknown while the database is away
    if db["ok"]:
        try:  # one bounded wait: a database that hangs leaves them unknown, and down
            queued, workers, unserved = ctx.reads.call(lambda: _database_gauges(ctx), "metrics")
        except StoreUnavailable as exc:
            log.debug("the database's gauges not read for /metrics: %s", exc)
            workers, up = None, 0
        if workers is not None:
            live, log_problems = len(workers), sum(w["log_problems"] for w in workers)
    try:
        d = ctx.engine.dispatcher_gauges()
    except BusyError as exc:  # its handler has held the tree too long: unknown meanwhile
        log.warning("the dispatcher's gauges not read for /metrics: %s", exc)
        d = dict.fromkeys(DISPATCHER_GAUGES, -1)
    lost = logbatch.lost()
    conns = ctx.connections
    alive = ctx.engine.dispatcher_liveness()
    return {
        "jobcontrol_workers": ("Workers registered and not stopped.", live),
        "jobcontrol_worker_log_problems": (
            "Task runs whose output a live worker could not keep whole (this life).",
            log_problems,
        ),
        "jobcontrol_queue_depth": ("Task runs queued for a free slot.", queued),
        "jobcontrol_queue_unserved": (
            "Task runs queued where no live worker serves their queue.",
            unserved,
        ),
        "jobcontrol_timers_armed": ("Top-level trees scheduled.", d["timers_armed"]),
        "jobcontrol_timers_due": (
            "Top-level trees whose timer came due and whose run has not started yet "
            "(waiting for the database, or held while timers are paused).",
            d["timers_due"],
        ),
        "jobcontrol_timer_late_seconds": (
            "The most a timer fired after its time within the last minute (a time missed "
            "while paused, stopped or in an outage counts from when it was armed again).",
            alive["timer_late_s"],
        ),
        "jobcontrol_dispatcher_event_seconds": (
            "How long the dispatcher has been on the event in hand (0 between events).",
            alive["handler_s"],
        ),
        "jobcontrol_timers_paused": (
            "1 while timers are paused.",
            d["paused"],
        ),
        "jobcontrol_tree_state_waits_total": (
            "Edits that had to wait for the job tree.",
            d["tree_state_waits"],
        ),
        "jobcontrol_events_seq": ("Sequence number of the last event.", ctx.eventlog.last_seq),
        "jobcontrol_log_lines_lost_total": (
            "Lines of the daemon's own log that could not be written (a full disk).",
            lost.total if lost is not None else 0,
        ),
        "jobcontrol_log_losing": (
            "1 while the daemon's own log cannot be written.",
            1 if lost is not None and lost.pending else 0,
        ),
        "jobcontrol_database_up": ("1 while the database answers, 0 during an outage.", up),
        "jobcontrol_database_outages_total": ("Database outages ridden out.", db["outages"]),
        "jobcontrol_database_write_seconds": (
            "How long the database write under way the longest has taken so far, its wait "
            "for a lock included (0 when none is under way).",
            round(longest[1], 3) if (longest := ctx.store.longest_write()) else 0,
        ),
        "jobcontrol_database_errors_total": (
            "Database operations that failed on a transient error and were retried.",
            db["errors"],
        ),
        "jobcontrol_dispatcher_failures_total": (
            "Dispatcher handlers that failed on something other than the database (bugs).",
            d["failures"],
        ),
        **_disk_gauges(ctx),
        **(ctx.gauges() if ctx.gauges is not None else {}),
        "jobcontrol_api_connections": ("Connections the admin API holds open.", conns.open),
        "jobcontrol_api_connections_limit": (
            "The most connections the admin API holds open at once.",
            conns.limit,
        ),
        "jobcontrol_api_connections_refused_total": (
            "Connections refused because the admin API held its limit.",
            conns.refused,
        ),
        "jobcontrol_api_header_timeouts_total": (
            "Connections closed because their request headers did not arrive in time.",
            conns.header_timeouts,
        ),
    }


def _disk_gauges(ctx: ApiContext) -> dict[str, tuple[str, float]]:
    if ctx.disk is None:
        return {}
    gauges: dict[str, tuple[str, float]] = {}
    for key, space in ctx.disk().items():
        what = space.what
        free = -1 if space.free_bytes is None else space.free_bytes  # -1: cannot be read
        gauges[f"jobcontrol_{key}_free_bytes"] = (f"Bytes free on the {what}'s filesystem.", free)
        gauges[f"jobcontrol_{key}_disk_low"] = (
            f"1 while the {what}'s free space is below --disk-low (or unreadable).",
            int(space.low),
        )
    return gauges


@router.get("/metrics", response_class=PlainTextResponse, tags=["system"])
def metrics(
    ctx: Context, _user: Annotated[User, Depends(require(Action.READ))]
) -> PlainTextResponse:
    """Prometheus text format 0.0.4."""
    collector = ctx.metrics
    return PlainTextResponse(collector.render(_gauges(ctx)), media_type=CONTENT_TYPE)
