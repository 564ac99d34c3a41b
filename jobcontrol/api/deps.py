"""What every route shares: the daemon's context, bearer-token authentication, error answers."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jobcontrol.api.bodies import MAX_BODY_BYTES
from jobcontrol.api.bounded import BoundedReads, DatabaseNotAnswering
from jobcontrol.api.problems import readable_errors
from jobcontrol.diskspace import DiskSpace
from jobcontrol.errors import (
    AlreadyRunningError,
    BusyError,
    ConflictError,
    DefinitionError,
    DuplicateUserError,
    JobControlError,
    JobRunningError,
    LaneConflictError,
    NotRunningError,
    RunStateError,
    StoreError,
    StoreUnavailable,
    UnknownJobError,
    UnknownLaneError,
    UnknownRunError,
    UnknownUserError,
    ValidationError,
    clip,
    visible,
)
from jobcontrol.service import audit
from jobcontrol.service.engine import Engine
from jobcontrol.service.eventlog import EventLog
from jobcontrol.service.metrics import RunMetrics
from jobcontrol.service.users import Action, User, authenticate, hash_token
from jobcontrol.store import Store
from jobcontrol.views import masked_env

log = logging.getLogger(__name__)


@dataclass
class ConnectionStats:
    """The API server's connections, for /metrics (kept by ``api.server``'s protocol)."""

    limit: int = 0  # the most it holds open at once (0: not served by ApiServer)
    open: int = 0
    refused: int = 0  # connections refused because ``limit`` were open
    header_timeouts: int = 0  # connections closed because their headers did not arrive in time


@dataclass
class ApiContext:
    """The daemon's parts the API serves; one per app."""

    store: Store
    engine: Engine
    eventlog: EventLog
    version: str
    started: datetime
    # Run counters for /metrics (started by whoever makes the context).
    metrics: RunMetrics
    # Asks the daemon to stop; ``force`` kills running jobs. Refusals are raised.
    request_shutdown: Callable[[bool], None] = field(default=lambda force: None)
    # Seconds between keepalive comments on an idle event stream.
    event_heartbeat: float = 15.0
    # Whether the database answers (``Runtime.database``); None: as the dispatcher sees it.
    database: Callable[[], dict[str, Any]] | None = None
    # How the daemon's worker contains task runs (``Runtime.containment_view``).
    containment: Callable[[], str] | None = None
    # More series for /metrics from the daemon's runtime (``Runtime.gauges``).
    gauges: Callable[[], dict[str, tuple[str, float]]] | None = None
    # Who authenticated (token hash -> user): answers status reads during an outage.
    known_users: dict[str, User] = field(default_factory=dict)
    # Free space of the state directory and log root (``DaemonOptions.disk_space``).
    disk: Callable[[], dict[str, DiskSpace]] | None = None
    connections: ConnectionStats = field(default_factory=ConnectionStats)
    # Reads that must answer though the database hangs (the token, health, status).
    reads: BoundedReads = field(default_factory=BoundedReads)
    # How many exports run at once (``api.definitions``), made on first use.
    export_limiter: Any = None

    def database_state(self) -> dict[str, Any]:
        if self.database is not None:
            return self.database()
        state = self.engine.outage()
        return {
            "ok": not state.down,
            "since": state.since,
            "error": state.error,
            "outages": state.outages,
            "errors": state.failures,
        }


def get_context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


Context = Annotated[ApiContext, Depends(get_context)]


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise HTTPException(
            401,
            "this request needs a bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            401,
            "the Authorization header must be 'Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token.strip()


def authenticated_user(ctx: ApiContext, authorization: str | None) -> User:
    token = _bearer(authorization)
    try:
        user = ctx.reads.call(
            lambda: authenticate(ctx.store, token, known=ctx.known_users), "the token"
        )
    except DatabaseNotAnswering:
        # A database that hangs, as one that is away: a token it accepted before reads.
        known = ctx.known_users.get(hash_token(token)) if token else None
        if known is None:
            raise
        user = known
    if user is None:
        raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return user


# Where TokenGate leaves the user it authenticated, for ``require`` to take.
USER_KEY = "jobcontrol.user"
# The only route that answers without a token.
PUBLIC_PATHS = frozenset({"/healthz"})


class TokenGate:
    """Authenticates every request but ``/healthz`` before anything reads its body.

    FastAPI reads and parses a body before it runs a route's dependencies, so
    without this a request with no token would learn how its body was malformed
    (422), or be read whole up to the size limit (413), before being told 401.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        ctx: ApiContext = request.app.state.ctx
        try:
            user = await run_in_threadpool(
                authenticated_user, ctx, request.headers.get("authorization")
            )
        except StarletteHTTPException as exc:
            await http_error_response(exc)(scope, receive, send)
            return
        except JobControlError as exc:  # the database does not answer: 503, with the reason
            await refusal_response(exc)(scope, receive, send)
            return
        scope[USER_KEY] = user
        least = _least_action(request.app, scope)
        if least is not None and not user.can(least[0][0]):
            # Refused before its body is read whole: a role that may not make the request
            # cannot hold a connection by never sending the body it announced. Before the
            # size too: a request it may never make is a 403 (audited) whatever its body.
            await _refuse_early(ctx, user, least, scope, receive, send)
            return
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_BODY_BYTES:
            # Starlette's own answer to this is plain text: the API's errors are JSON.
            message = f"the request body is {int(size)} bytes; {_TAKES_AT_MOST}"
            too_large = HTTPException(413, message, headers={"connection": "close"})
            await http_error_response(too_large)(scope, receive, send)
            return
        await self.app(scope, receive, send)


_TAKES_AT_MOST = f"the API takes at most {MAX_BODY_BYTES} ({MAX_BODY_BYTES // (1024 * 1024)} MiB)"

# How long, and how much, of the body of a request refused for its role is read to
# name the jobs it names in the audit trail.
EARLY_BODY_WAIT, EARLY_BODY_MAX = 2.0, 64 * 1024


# The least action a route's user must be allowed, and what a refusal says it does
# (None: the action's own words).
Need = tuple[Action, str | None]


def _least_action(app: Any, scope: Scope) -> tuple[Need, dict[str, Any]] | None:
    """The least a user must be allowed to make the request ``scope`` (``role_table``),
    with its path's parameters; None for a request no route takes (answered 404 or 405
    as usual) or one that asks no more than a token."""
    for regex, methods, need in app.state.least_actions:
        if scope["method"] in methods and (match := regex.match(scope["path"])):
            return need, match.groupdict()
    return None


def role_table(routes: Iterable[Any]) -> list[tuple[Any, set[str], Need]]:
    """Each route's path, methods and the least action its user must be allowed: its
    ``require`` or, for a route that checks its role itself, the endpoint's mark
    (``least_action``). Made once, with the app."""
    table = []
    for route in routes:
        dependant = getattr(route, "dependant", None)
        action = getattr(getattr(route, "endpoint", None), "least_action", None)
        need = (action, None) if action is not None else _required(dependant)
        if need is not None and need[0] is not Action.READ:
            table.append((route.path_regex, set(route.methods), need))
    return table


def _required(dependant: Any) -> Need | None:
    for sub in getattr(dependant, "dependencies", ()):
        action = getattr(sub.call, "required_action", None)
        if action is not None:
            return typing.cast(Action, action), getattr(sub.call, "required_doing", None)
        need = _required(sub)
        if need is not None:
            return need
    return None


def least_action(action: Action) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a route that checks its role itself (by what its body asks) with the least
    role it can ever be allowed, so a lesser one is refused before its body is read."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        endpoint.least_action = action  # type: ignore[attr-defined]
        return endpoint

    return mark


async def _refuse_early(
    ctx: ApiContext,
    user: User,
    least: tuple[Need, dict[str, Any]],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    (action, doing), params = least
    jobs: list[Any] = [params["job"]] if "job" in params else []
    fields: set[str] = set()
    body = await _read_some(receive, EARLY_BODY_WAIT, EARLY_BODY_MAX)
    if body is not None:
        # A body's "name" is a new job's on POST /jobs only (a lane's on POST /lanes: the
        # trail's jobs are jobs, and a lane route's path names its lane already).
        named, fields = _named(body, new_job=scope["path"].rstrip("/") == "/api/v1/jobs")
        jobs += named
    if fields:
        # A batch's fields say what it asks (``modify_jobs``): a viewer that changes a
        # timer may not modify jobs, whatever the least the route could be allowed.
        action, doing = Action.for_fields(fields), None
    message = may_not(user, action, fields, doing)
    operation = f"{scope['method']} {scope['path']}"  # never READ: every role may read
    try:
        await run_in_threadpool(ctx.engine.record_refusal, user.name, operation, jobs, message)
    except JobControlError as exc:
        log.warning("the refusal of %s for %s was not audited: %s", operation, user.name, exc)
    headers = {} if body is not None else {"connection": "close"}
    await http_error_response(HTTPException(403, message, headers=headers))(scope, receive, send)


async def _read_some(receive: Receive, wait: float, most: int) -> bytes | None:
    """The request's body, if all of it (at most ``most`` bytes) arrives within ``wait``
    seconds; None otherwise."""
    chunks: list[bytes] = []
    size = 0

    async def read() -> bool:
        nonlocal size
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > most:
                return False
            chunks.append(chunk)
            if not message.get("more_body", False):
                return True

    try:
        whole = await asyncio.wait_for(read(), wait)
    except TimeoutError:
        return None
    return b"".join(chunks) if whole else None


def _named(body: bytes, *, new_job: bool) -> tuple[list[Any], set[str]]:
    """The jobs a JSON body names (``jobs``, ``changes[].job``, and with ``new_job`` the
    new job's ``name``) and the fields its ``changes`` set."""
    try:
        data = json.loads(body)
    except ValueError:
        return [], set()
    if not isinstance(data, dict):
        return [], set()
    named: list[Any] = []
    fields: set[str] = set()
    if isinstance(data.get("jobs"), list):
        named += data["jobs"]
    for change in data.get("changes") or []:
        if isinstance(change, dict):
            named.append(change.get("job"))
            if isinstance(change.get("fields"), dict):
                fields.update(str(key)[:64] for key in change["fields"])
    if new_job and isinstance(data.get("name"), str):
        named.append(data["name"])
    jobs = [j for j in named if isinstance(j, str | int) and not isinstance(j, bool)]
    return jobs[:100], set(sorted(fields)[:50])


def may_not(
    user: User, action: Action, fields: Iterable[str] = (), doing: str | None = None
) -> str:
    """What a 403 says: who, with which role, may not do what (``doing``, or the action's
    own words; and which fields)."""
    message = f"user {user.name!r} has role {user.role}, which may not {doing or action.says}"
    return f"{message} (fields: {', '.join(sorted(fields))})" if fields else message


def require(action: Action, doing: str | None = None) -> Callable[..., User]:
    """A dependency: the authenticated user, who must be allowed ``action`` (401 / 403
    otherwise). ``doing`` is what a 403 says the request does, when the action's own
    words ("modify jobs or settings") are not it."""

    def dependency(
        request: Request, ctx: Context, authorization: Annotated[str | None, Header()] = None
    ) -> User:
        user: User | None = request.scope.get(USER_KEY)
        if user is None:  # an app without the TokenGate
            user = authenticated_user(ctx, authorization)
        if not user.can(action):
            message = may_not(user, action, doing=doing)
            if action is not Action.READ:  # a refused change belongs in the audit trail
                audit.record(
                    ctx.store,
                    user.name,
                    f"{request.method} {request.url.path}",
                    [],
                    "refused",
                    message,
                )
            raise HTTPException(403, message)
        return user

    dependency.required_action = action  # type: ignore[attr-defined]
    dependency.required_doing = doing  # type: ignore[attr-defined]
    return dependency


def sees_env(user: User) -> bool:
    """Env values may hold secrets: only who may change them (an admin) reads them."""
    return user.can(Action.MODIFY)


def env_for(user: User, view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a job's detail or a run) with its env values masked unless ``user`` sees them."""
    if sees_env(user) or not view.get("env"):
        return view
    return {**view, "env": masked_env(view["env"])}


# Most specific first: the first matching class decides the status.
ERROR_STATUS: list[tuple[type[JobControlError], int]] = [
    (UnknownJobError, 404),
    (UnknownUserError, 404),
    (UnknownLaneError, 404),
    (UnknownRunError, 404),
    (LaneConflictError, 409),
    (RunStateError, 409),
    (ConflictError, 409),
    (JobRunningError, 409),
    (DuplicateUserError, 409),
    (DefinitionError, 422),
    (ValidationError, 422),
    (BusyError, 503),
    (NotRunningError, 503),
    (AlreadyRunningError, 409),
    (StoreError, 503),
]


def error_status(exc: JobControlError) -> int:
    for cls, status in ERROR_STATUS:
        if isinstance(exc, cls):
            return status
    return 400


def error_body(exc: JobControlError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": type(exc).__name__, "message": capped(str(exc))}
    for attr in ("job", "lane", "field", "run_id", "reason", "line"):
        value = getattr(exc, attr, None)
        if value is not None:
            body[attr] = capped(value) if isinstance(value, str) else value
    return body


# An error answer lists at most this many problems of a malformed request.
MAX_PROBLEMS = 50
# Longer messages are cut (a safety net: each value a message repeats is clipped already).
MESSAGE_MAX = 4000


def capped(text: str) -> str:
    """``text`` cut so that it, with the note of what was cut, is at most ``MESSAGE_MAX``
    characters (``clip`` alone would add its note past the limit)."""
    text = visible(text)
    if len(text) <= MESSAGE_MAX:
        return text
    keep = MESSAGE_MAX - len(f"... ({len(text)} more characters)")
    return f"{text[:keep]}... ({len(text) - keep} more characters)"


class JSONAnswer(JSONResponse):
    """Every answer's JSON (the app's default response class): a string UTF-8 cannot
    encode (a lone half of a surrogate pair that came in escaped in a request's JSON)
    is written out as its escape rather than failing the answer with a plain 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(_visible_all(content))


def _visible_all(value: Any) -> Any:
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {_visible_all(k): _visible_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_visible_all(v) for v in value]
    return value


def refusal_response(exc: JobControlError) -> JSONResponse:
    status = error_status(exc)
    if status >= 500:
        # One line, what it cost included (an audit entry the outage kept out: audit.scope).
        notes = getattr(exc, "__notes__", ())
        # A read refused for an outage costs nothing: the outage is logged once, by the
        # parts that meet it, and a line per request would bury those in a polled log.
        level = (
            logging.DEBUG if isinstance(exc, StoreUnavailable) and not notes else logging.WARNING
        )
        log.log(level, "request failed: %s", "; ".join([str(exc), *notes]))
    return JSONAnswer(error_body(exc), status_code=status)


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    # Every 422 is InvalidRequest, whichever part of the request was refused.
    phrase = HTTPStatus(exc.status_code).phrase.replace(" ", "")
    body = {
        "error": "InvalidRequest" if exc.status_code == 422 else phrase,
        "message": capped(str(exc.detail)),
        "detail": _clipped(exc.detail),
    }
    return JSONAnswer(body, status_code=exc.status_code, headers=exc.headers)


def _clipped(value: Any) -> Any:
    """``value`` as an error answer may echo it: every string at most ``ECHO_MAX`` characters,
    and a number JSON cannot carry (NaN, Infinity: Python's JSON reads them) as its text."""
    if isinstance(value, str):
        return clip(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {clip(str(k)): _clipped(v) for k, v in list(value.items())[:MAX_PROBLEMS]}
    if isinstance(value, list | tuple):
        return [_clipped(v) for v in value[:MAX_PROBLEMS]]
    return value


def install_error_handlers(app: FastAPI) -> None:
    """Engine refusals become 4xx (or 503) answers with the engine's message."""

    async def on_refusal(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, JobControlError)
        return refusal_response(exc)

    async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = readable_errors(exc.errors())
        problems: list[str] = []
        allowed: list[str] = []  # each model's fields, once, for the unknown ones named
        for err in errors[:MAX_PROBLEMS]:
            if err.get("type") == "json_invalid":
                why = clip(str(err.get("ctx", {}).get("error", err["msg"])))
                at = err["loc"][-1]
                where = f" at character {at}" if isinstance(at, int) and at >= 0 else ""
                problems.append(f"body: not valid JSON{where}: {why}")
                continue
            where = clip(".".join(str(p) for p in err["loc"] if p != "body") or "body")
            fields = _fields_beside(request, err)
            if err.get("type") == "extra_forbidden" and err["msg"] == NO_BODY:
                problems.append(f"body: {NO_BODY} (send none, or an empty one: {{}} or null)")
                continue
            if fields is None:
                problems.append(f"{where}: {clip(err['msg'])}")
                continue
            problems.append(f"{where}: unknown field")
            if fields and fields not in allowed:
                allowed.append(fields)
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"and {len(errors) - MAX_PROBLEMS} more problems")
        problems.extend(f"allowed: {fields}" for fields in allowed)
        message = capped("; ".join(problems))
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            _audit_invalid(request, message)
        # The caller's values are echoed clipped: a 9 MB name must not come back whole.
        detail = _clipped(jsonable_encoder(errors))
        body = {"error": "InvalidRequest", "message": message, "detail": detail}
        return JSONAnswer(body, status_code=422)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        exc = _routing_said(request, exc)
        if exc.status_code == 413 and not str(exc.detail).startswith("the request body"):
            # A body sent without its length (chunked) stopped at the limit as it came.
            exc = StarletteHTTPException(
                413, f"the request body is more than {MAX_BODY_BYTES} bytes; {_TAKES_AT_MOST}"
            )
        return http_error_response(exc)

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's answer is plain text; it logs the traceback itself after this.
        message = (
            f"the daemon failed to answer {request.method} {clip(request.url.path)}: "
            f"{type(exc).__name__} (a bug; the daemon's log has the traceback)"
        )
        return JSONAnswer({"error": "InternalServerError", "message": message}, status_code=500)

    app.add_exception_handler(Exception, on_bug)
    app.add_exception_handler(JobControlError, on_refusal)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(StarletteHTTPException, on_http)


def _routing_said(request: Request, exc: StarletteHTTPException) -> StarletteHTTPException:
    """The router's own 404 and 405 (its detail the bare status phrase) say the method
    and the path, and for a 405 the methods the path takes."""
    path = clip(request.url.path)
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"no route {path} in this API (its routes: /api/v1/openapi.json)"
        return StarletteHTTPException(404, message, exc.headers)
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        allow = (exc.headers or {}).get("Allow", "")
        takes = f"; it takes {allow}" if allow else ""
        message = f"method {clip(request.method)} is not allowed on {path}{takes}"
        return StarletteHTTPException(405, message, exc.headers)
    return exc


def _fields_beside(request: Request, err: Mapping[str, Any]) -> str | None:
    """For a field the body's model does not have (pydantic's "Extra inputs are not
    permitted"): the fields it has, as a definition file's unknown key is told (empty
    when the model is not found). None for any other error."""
    if err.get("type") != "extra_forbidden":
        return None
    route = request.scope.get("route")
    body = getattr(route, "body_field", None)
    model = _model_in(getattr(getattr(body, "field_info", None), "annotation", None))
    for part in [p for p in err["loc"] if p != "body"][:-1]:
        if isinstance(part, int) or model is None:
            continue  # an item of a list: the same model
        info = model.model_fields.get(str(part))
        model = _model_in(info.annotation) if info is not None else None
    if model is None:
        return ""
    return ", ".join(sorted(f.alias or name for name, f in model.model_fields.items()))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model ``annotation`` is, or holds (``list[M]``, ``M | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _audit_invalid(request: Request, message: str) -> None:
    """A change refused as malformed is a refusal too: audit it when we know who asked."""
    ctx: ApiContext = request.app.state.ctx
    user: User | None = request.scope.get(USER_KEY)
    if user is None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return
        user = authenticate(ctx.store, token.strip())
    if user is not None:
        operation = f"{request.method} {request.url.path}"
        audit.record(ctx.store, user.name, operation, [], "refused", message)


class DuplicateKeyError(json.JSONDecodeError):
    """A key given twice in one JSON object (``json`` would keep the last, silently)."""


def _once_each(doc: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        made: dict[str, Any] = {}
        for key, value in pairs:
            if key in made:
                quoted = json.dumps(key)
                first = doc.find(quoted)
                at = doc.find(quoted, first + 1) if first >= 0 else -1
                # Not found (a key written with escapes): say no place rather than a wrong one.
                raise DuplicateKeyError(
                    f"key {clip(key)!r} is given twice in one object",
                    doc,
                    at if at >= 0 else NO_POSITION,
                )
            made[key] = value
        return made

    return pairs_hook


# The position a JSON error gives when the reader cannot say where (too deep a nesting).
NO_POSITION = -1
# A JSON string, or one of the constants Python's ``json`` takes and JSON has not.
_STRING_OR_CONSTANT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(NaN|-?Infinity)')


def _not_json(doc: str) -> Callable[[str], Any]:
    def constant(name: str) -> Any:
        # ``json`` calls this with the name only: the first one outside a string is it.
        where = next(
            (m.start() for m in _STRING_OR_CONSTANT.finditer(doc) if m.group(1)), NO_POSITION
        )
        why = f"{name} is not JSON (RFC 8259 has no such number)"
        raise json.JSONDecodeError(why, doc, where)

    return constant


class _StrictJsonRequest(Request):
    """A request whose JSON body refuses a key given twice in one object, and the
    ``NaN`` and ``Infinity`` that Python's ``json`` takes and JSON has not."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            # Each way a body fails to parse is a JSONDecodeError, which FastAPI answers
            # 422 saying where (any other error would be its bare 400).
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                why = f"not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start})"
                text = raw[: exc.start].decode("utf-8")  # what comes before it is UTF-8
                raise json.JSONDecodeError(why, text, len(text)) from None
            try:
                self._json = json.loads(
                    text, object_pairs_hook=_once_each(text), parse_constant=_not_json(text)
                )
            except RecursionError:
                # Python's reader gives up at a depth its stack sets, saying not where.
                why = "nested too deeply (arrays and objects inside each other)"
                raise json.JSONDecodeError(why, text, NO_POSITION) from None
        return self._json


def is_json_type(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON (``application/json``, ``application/*+json``)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


class JsonRoute(APIRoute):
    """A route whose body is JSON, read strictly: a body sent as anything else (a form,
    text, no Content-Type) is refused with 415 rather than a 422 about its shape, and a
    key given twice in one object is refused (422) rather than the last one kept."""

    def get_route_handler(self) -> Callable[[Request], typing.Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strictly(request: Request) -> Response:
            kind = request.headers.get("content-type")
            length = request.headers.get("content-length", "")
            sent = length.strip() not in ("", "0") or "transfer-encoding" in request.headers
            if sent and not is_json_type(kind):
                said = f"is sent as {clip(kind)!r}" if kind else "has no Content-Type"
                raise HTTPException(
                    415, f"the request body {said}: send it as JSON (application/json)"
                )
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strictly


NO_BODY = "this request takes no body"


async def _no_body(request: Request) -> None:
    """A request that takes no body refuses one (422), as a body with an unknown field is:
    ``{"force": true}`` sent to pause must not pass for something it does not do. An empty
    body, ``{}`` or ``null`` is none."""
    body = (await request.body()).strip()
    if body in (b"", b"{}", b"null"):
        return
    raise RequestValidationError(
        [
            {
                "type": "extra_forbidden",
                "loc": ("body",),
                "msg": NO_BODY,
                "input": body[:200].decode("utf-8", "replace"),
            }
        ]
    )


# The last parameter of a route that takes no body (after the user: a 401 comes first).
NoBody = Annotated[None, Depends(_no_body)]
