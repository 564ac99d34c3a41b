"""A small typed client of the admin API (``/api/v1``) over httpx, for the CLI and scripts.

Every refusal is raised as :class:`ApiError` carrying the HTTP status and the
server's own message; a daemon that cannot be reached is a
:class:`DaemonUnreachableError`. Job names go in the path URL-encoded (they may
hold ``/``).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from jobcontrol.errors import JobControlError

API_PREFIX = "/api/v1"
# Longer than the daemon's own wait for a locked SQLite database (30 s): a request it
# cannot serve comes back refused with its reason, not cut off here without one.
DEFAULT_TIMEOUT = 45.0
# Streams (a followed log, the event stream) wait for data without limit.
STREAM_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT, read=None)

JobRef = int | str
T = TypeVar("T")


class ApiError(JobControlError):
    """The daemon refused a request: ``status`` is the HTTP status, the message is the server's."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        self.status = status
        self.body = dict(body or {})
        super().__init__(message)


class DaemonUnreachableError(JobControlError):
    """No answer from the daemon's URL (not running, wrong address, TLS mismatch)."""


class DaemonTimeoutError(DaemonUnreachableError):
    """The daemon took the request and did not answer in time: whether it took effect
    is not known."""


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event; ``seq`` is None for a ``resync`` (which carries no id)."""

    seq: int | None
    type: str
    data: Any


class StreamHandle:
    """Lets another thread end a stream (the event stream, a followed log) at once.

    Closing an httpx response does not wake a thread blocked reading it, so
    :meth:`abort` shuts the connection's socket down, which does; the reading
    thread's iteration then ends with :class:`DaemonUnreachableError` (or
    simply ends), and ``aborted`` tells the two apart.
    """

    def __init__(self, on_open: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        self._on_open = on_open
        self.aborted = False

    def opened(self) -> None:
        """The server accepted the stream (called on the reading thread, before any data)."""
        if self._on_open is not None:
            self._on_open()

    def attach(self, response: httpx.Response) -> None:
        with self._lock:
            self._response = response
            aborted = self.aborted
        if aborted:
            self._shut(response)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            response = self._response
        if response is not None:
            self._shut(response)

    @staticmethod
    def _shut(response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


def base_url(url: str) -> str:
    """The daemon's root URL, whether given with or without ``/api/v1``."""
    url = url.strip().rstrip("/")
    return url.removesuffix(API_PREFIX)


def _job(job: JobRef) -> str:
    return quote(str(job), safe="")


def _by(job: JobRef) -> dict[str, Any]:
    """A job given by id is named by id alone (``?by=id``): a job named ``"3"`` is not the
    job of id 3. A name goes as it is (a name first, then an id, as the CLI's)."""
    return {"by": "id"} if isinstance(job, int) else {}


class Client:
    """The admin API of one daemon; use as a context manager (or call :meth:`close`)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = base_url(url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            waited = self._http.timeout.read or 0.0
            # Not `jobcontrol status`: it asks this same daemon, and waits as long.
            text = (
                f"the daemon at {self.url} took the request but did not answer within "
                f"{waited:g} s (its database may be locked or away, or the daemon stopped: "
                "`jobcontrol daemon status` reads the database without it)"
            )
            if method.upper() != "GET":  # a read changes nothing: nothing to look for
                text += "; whether it took effect is not known: look before you ask again"
            raise DaemonTimeoutError(text) from exc
        except httpx.TransportError as exc:
            raise DaemonUnreachableError(f"cannot reach the daemon at {self.url}: {exc}") from exc
        check(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _stream(
        self,
        path: str,
        params: Mapping[str, Any],
        read: Callable[[httpx.Response], Iterator[T]],
        handle: StreamHandle | None = None,
    ) -> Iterator[T]:
        """What ``read`` makes of a streamed answer, as it arrives."""
        try:
            with self._http.stream("GET", path, params=params, timeout=STREAM_TIMEOUT) as response:
                if handle is not None:
                    handle.attach(response)
                if response.is_error:
                    response.read()
                    check(response)
                if handle is not None:
                    handle.opened()
                yield from read(response)
        except httpx.TransportError as exc:
            raise DaemonUnreachableError(f"lost the daemon at {self.url}: {exc}") from exc

    # ------------------------------------------------------------ jobs

    def tree(self) -> dict[str, Any]:
        """``{"seq", "jobs"}``: every job's view in tree order, and the event it is consistent with."""
        result: dict[str, Any] = self._json("GET", "/tree")
        return result

    def job(self, job: JobRef) -> dict[str, Any]:
        """One job's stored fields and live state (``version`` included)."""
        result: dict[str, Any] = self._json("GET", f"/jobs/{_job(job)}", params=_by(job))
        return result

    def create_job(self, name: str, kind: str, **fields: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._json(
            "POST", "/jobs", json={"name": name, "kind": kind, **fields}
        )
        return result

    def modify(self, changes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One batch: each change is ``{"job", "version", "fields"}``; all or nothing (409 on a stale version)."""
        result: dict[str, Any] = self._json("PATCH", "/jobs", json={"changes": list(changes)})
        return result

    def delete(self, jobs: Sequence[JobRef]) -> dict[str, Any]:
        """``deleted``: the ids of the sub-trees' roots; ``deleted_jobs``: how many jobs
        went with them, the roots included."""
        result: dict[str, Any] = self._json("POST", "/jobs/delete", json={"jobs": list(jobs)})
        return result

    def activate(self, jobs: Sequence[JobRef], active: bool = True) -> dict[str, Any]:
        path = "/jobs/activate" if active else "/jobs/deactivate"
        result: dict[str, Any] = self._json("POST", path, json={"jobs": list(jobs)})
        return result

    def set_on_error(self, jobs: Sequence[JobRef], on_error: str) -> dict[str, Any]:
        """``on_error`` ("abort" | "continue") of these jobs, one batch."""
        body = {"jobs": list(jobs), "on_error": on_error}
        result: dict[str, Any] = self._json("POST", "/jobs/on-error", json=body)
        return result

    def set_box_type(self, jobs: Sequence[JobRef], box_type: str) -> dict[str, Any]:
        """``box_type`` ("sequence" | "timed") of these boxes, one batch."""
        body = {"jobs": list(jobs), "box_type": box_type}
        result: dict[str, Any] = self._json("POST", "/jobs/box-type", json=body)
        return result

    def run_now(self, job: JobRef) -> int:
        """The id of the run started."""
        return int(self._json("POST", f"/jobs/{_job(job)}/run", params=_by(job))["run_id"])

    def kill(self, job: JobRef) -> int:
        """The id of the run killed."""
        return int(self.kill_run(job)["run_id"])

    def kill_run(self, job: JobRef) -> dict[str, Any]:
        """Kill the run the job is part of: ``run_id`` and ``job``, the name of the job
        whose run that is (the nearest running sub-tree root at or above ``job``)."""
        reply: dict[str, Any] = self._json("POST", f"/jobs/{_job(job)}/kill", params=_by(job))
        return reply

    def restart(self, job: JobRef) -> str | None:
        """When the re-armed timer fires next (ISO text), or None."""
        when: str | None = self.rearm(job)["next_runs"]
        return when

    def rearm(self, job: JobRef) -> dict[str, Any]:
        """Restart a top-level job: the daemon's whole answer, ``next_runs`` (ISO text or
        None), ``armed`` and, when nothing is armed, the ``reason``."""
        reply: dict[str, Any] = self._json("POST", f"/jobs/{_job(job)}/restart", params=_by(job))
        return reply

    # ------------------------------------------------------------ runs and logs

    def runs(self, job: JobRef, *, limit: int = 50, before: int | None = None) -> dict[str, Any]:
        """``{"runs", "next"}``: a page of the job's runs, newest first."""
        params: dict[str, Any] = {"limit": limit, **_by(job)}
        if before is not None:
            params["before"] = before
        result: dict[str, Any] = self._json("GET", f"/jobs/{_job(job)}/runs", params=params)
        return result

    def get_run(self, run_id: int) -> dict[str, Any]:
        """``{"run", "children"}``."""
        result: dict[str, Any] = self._json("GET", f"/runs/{run_id}")
        return result

    def log(self, run_id: int, *, offset: int = 0, length: int = 1 << 20) -> tuple[bytes, int]:
        """(bytes of the log from ``offset``, the log's size)."""
        response = self._request(
            "GET", f"/runs/{run_id}/log", params={"offset": offset, "length": length}
        )
        return response.content, int(response.headers.get("X-Log-Size", "0"))

    def whole_log(self, run_id: int) -> Iterator[bytes]:
        """The log as it is now, in chunks."""
        offset = 0
        while True:
            data, size = self.log(run_id, offset=offset)
            if data:
                yield data
            offset += len(data)
            if not data or offset >= size:
                return

    def follow_log(
        self, run_id: int, *, offset: int = 0, handle: StreamHandle | None = None
    ) -> Iterator[bytes]:
        """The log from ``offset`` as it grows, until the run ends (or ``handle`` aborts it)."""
        params = {"follow": "true", "offset": offset}
        yield from self._stream(f"/runs/{run_id}/log", params, lambda r: r.iter_bytes(), handle)

    # ------------------------------------------------------------ the dispatcher

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/status")
        return result

    def whoami(self) -> dict[str, Any]:
        """``{"name", "role", "permissions"}`` of this client's token."""
        result: dict[str, Any] = self._json("GET", "/whoami")
        return result

    def pause(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", "/timers/pause")
        return result

    def resume(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", "/timers/resume")
        return result

    def events(
        self, after: int | None = None, *, handle: StreamHandle | None = None
    ) -> Iterator[Event]:
        """The event stream (from after ``after``, else live only) until the server ends it."""
        params = {} if after is None else {"after": after}
        yield from self._stream("/events", params, lambda r: parse_sse(r.iter_lines()), handle)

    def audit(
        self,
        *,
        limit: int = 50,
        before: int | None = None,
        user: str | None = None,
        job: str | None = None,
    ) -> dict[str, Any]:
        """``{"entries", "next"}``: a page of the audit trail, newest first."""
        given = {"limit": limit, "before": before, "user": user, "job": job}
        params = {key: value for key, value in given.items() if value is not None}
        result: dict[str, Any] = self._json("GET", "/audit", params=params)
        return result

    def workers(self) -> list[dict[str, Any]]:
        """Every registered worker, live ones first: slots (``used``, ``free``), ``queues``
        (None: every queue), ``heartbeat`` / ``heartbeat_age_s`` / ``beat_s`` (the most it
        goes between beats now), ``stopped`` (None while it runs), the ``runs`` it
        holds and its ``state`` (online, late, gone or stopped); times are ISO text."""
        workers: list[dict[str, Any]] = self._json("GET", "/workers")["workers"]
        return workers

    # ------------------------------------------------------------ lanes and the queue

    def lanes(self) -> list[dict[str, Any]]:
        """Every lane: its settings, ``state``, ``running``, ``queued``, ``oldest_wait_s``."""
        lanes: list[dict[str, Any]] = self._json("GET", "/lanes")["lanes"]
        return lanes

    def add_lane(self, name: str, **fields: Any) -> dict[str, Any]:
        body = {"name": name, **fields}
        lane: dict[str, Any] = self._json("POST", "/lanes", json=body)
        return lane

    def set_lane(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change the settings given (``max_slots=None`` removes the cap)."""
        lane: dict[str, Any] = self._json("PATCH", f"/lanes/{_job(name)}", json=fields)
        return lane

    def remove_lane(self, name: str) -> None:
        self._json("DELETE", f"/lanes/{_job(name)}")

    def drain_lane(self, name: str) -> dict[str, Any]:
        lane: dict[str, Any] = self._json("POST", f"/lanes/{_job(name)}/drain")
        return lane

    def resume_lane(self, name: str) -> dict[str, Any]:
        lane: dict[str, Any] = self._json("POST", f"/lanes/{_job(name)}/resume")
        return lane

    def queue(self, lane: str | None = None) -> list[dict[str, Any]]:
        """Queued task runs per lane in claim order (``position``, ``wait_s``)."""
        params = {} if lane is None else {"lane": lane}
        lanes: list[dict[str, Any]] = self._json("GET", "/queue", params=params)["lanes"]
        return lanes

    def reprioritize(self, run_id: int, priority: int) -> dict[str, Any]:
        body = {"priority": priority}
        result: dict[str, Any] = self._json("PATCH", f"/runs/{run_id}/priority", json=body)
        return result

    def log_level(self) -> str:
        return str(self._json("GET", "/log-level")["level"])

    def set_log_level(self, level: str) -> str:
        return str(self._json("PUT", "/log-level", json={"level": level})["level"])

    def shutdown(self, *, force: bool = False) -> dict[str, Any]:
        """Stop the daemon; refused (409) while jobs run unless ``force``."""
        result: dict[str, Any] = self._json("POST", "/shutdown", json={"force": force})
        return result

    # ------------------------------------------------------------ definitions

    def load(self, text: str, source: str, *, replace: bool = False) -> dict[str, Any]:
        """``{"created", "modified", "deleted"}`` of loading a whole file as one batch."""
        body = {"text": text, "source": source, "replace": replace}
        result: dict[str, Any] = self._json("POST", "/definitions", json=body)
        return result

    def export(self, job: str | None = None) -> str:
        params = {} if job is None else {"job": job}
        return self._request("GET", "/definitions", params=params).text


def check(response: httpx.Response) -> None:
    """Raise :class:`ApiError` with the server's message when ``response`` is a refusal."""
    if not response.is_error:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        raise ApiError(response.status_code, body["message"], body)
    text = response.text.strip() or response.reason_phrase
    raise ApiError(response.status_code, f"HTTP {response.status_code}: {text[:500]}")


def parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    """Events of a Server-Sent Events text; comments (keepalives) are skipped."""
    seq: int | None = None
    kind, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    value: Any = json.loads(text)
                except ValueError:
                    value = text
                yield Event(seq, kind, value)
            seq, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value_text = line.partition(":")
        value_text = value_text.removeprefix(" ")
        if name == "id":
            seq = int(value_text) if value_text.isdigit() else None
        elif name == "event":
            kind = value_text
        elif name == "data":
            data.append(value_text)
