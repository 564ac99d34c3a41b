"""Serving the admin API from inside the daemon: uvicorn in a thread of its own."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import resource
import socket
import ssl
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from jobcontrol.api.app import create_app
from jobcontrol.api.deps import ApiContext, ConnectionStats
from jobcontrol.errors import JobControlError

log = logging.getLogger(__name__)
_UVICORN_LOG = logging.getLogger("uvicorn.error")

# A connection must have sent a whole request line and headers this long after it opened
# (or after it began its next request): uvicorn itself never gives up on one.
HEADER_TIMEOUT = 10.0
# asyncio accepts up to this many connections at a time (uvicorn's ``backlog``), before
# their protocols see them and refuse those over the limit: a few such batches may be
# open beyond the limit for a moment.
ACCEPT_BATCH = 16
# The kernel's queue of connections not yet accepted, set once the server listens: they
# hold none of the daemon's files, and clients in it need not retry their SYN.
LISTEN_BACKLOG = 1024
# The default connection limit is what the open-files limit leaves once this is kept back
# for the daemon's own files (database, logs, pipes), those accept batches, and each task
# slot's files (log file, /dev/null, the spawn's pipe, the child's handles), and never
# more than MAX_CONNECTIONS.
FD_RESERVE = 64 + 4 * ACCEPT_BATCH
FD_PER_SLOT = 8
MAX_CONNECTIONS = 1000
MIN_CONNECTIONS = 8
# A refusal or timeout is logged at most this often (a flood must not flood the log).
LOG_EVERY = 60.0


def fd_reserve(slots: int) -> int:
    """Open files kept back from the API for the daemon and its task slots."""
    return FD_RESERVE + FD_PER_SLOT * max(slots, 0)


def connection_limit(open_files: int, slots: int) -> int:
    """The default for ``--api-max-connections``: what ``open_files`` (the soft
    RLIMIT_NOFILE) leaves after ``fd_reserve``, at most MAX_CONNECTIONS."""
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, open_files - fd_reserve(slots)))


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _Guard:
    """What every connection of one server shares: its bounds, their counts, and the
    TLS context when it serves HTTPS."""

    def __init__(
        self, stats: ConnectionStats, header_timeout: float, tls: ssl.SSLContext | None
    ) -> None:
        self.stats = stats
        self.header_timeout = header_timeout
        self.tls = tls
        self._logged = {"refused": -LOG_EVERY, "timeout": -LOG_EVERY}
        self._unlogged: dict[str, tuple[float, int]] = {}  # uvicorn's lines: last logged, count
        message = f"the admin API is at its limit of {stats.limit} connections; try again shortly"
        self.full = _answer(503, "ServiceUnavailable", message, b"retry-after: 1\r\n")
        self.too_slow = _answer(
            408,
            "RequestTimeout",
            f"the request line and headers did not all arrive within {header_timeout:g}s "
            "(the server's --api-header-timeout)",
        )

    def _now_and_then(self, kind: str) -> bool:
        now = time.monotonic()
        if now - self._logged[kind] < LOG_EVERY:
            return False
        self._logged[kind] = now
        return True

    def refused(self) -> None:
        self.stats.refused += 1
        if self._now_and_then("refused"):
            log.warning(
                "the admin API refused connections at its limit of %d open "
                "(--api-max-connections): %d refused so far",
                self.stats.limit,
                self.stats.refused,
            )

    def uvicorn_said(self, line: str) -> None:
        """A line uvicorn logs for each bad request (malformed HTTP, an upgrade it does not
        do): anyone who can connect may send those, so each is logged at most once a
        minute, with how many there were."""
        now = time.monotonic()
        last, count = self._unlogged.get(line, (-LOG_EVERY, 0))
        count += 1
        if now - last < LOG_EVERY:
            self._unlogged[line] = (last, count)
            return
        self._unlogged[line] = (now, count)
        # Under uvicorn's own logger still: the line is uvicorn's, only counted.
        _UVICORN_LOG.warning(
            "the admin API: %s (%d so far; said at most once a minute)", line, count
        )

    def timed_out(self) -> None:
        self.stats.header_timeouts += 1
        if self._now_and_then("timeout"):
            log.warning(
                "the admin API closed connections whose request headers did not arrive "
                "within %gs (--api-header-timeout): %d so far",
                self.header_timeout,
                self.stats.header_timeouts,
            )


def _answer(status: int, error: str, message: str, headers: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer that closes its connection, with the API's JSON error body,
    for what the server answers before (or without) the app."""
    body = json.dumps({"error": error, "message": message}).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n%sconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s"
        % (status, HTTPStatus(status).phrase.encode(), headers, len(body), body)
    )


# What uvicorn's HTTP/1.1 protocol logs, as a warning, for a request anyone may send.
_PER_REQUEST_LINES = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."})
_BAD_REQUEST = _answer(
    400,
    "BadRequest",
    "the request is not valid HTTP/1.1 (a malformed request line or header, a "
    "Content-Length that is not a number or is given twice with different values, or a "
    "request line and headers over 16 KiB)",
)


class _CountedLog(logging.LoggerAdapter):
    """uvicorn's logger for one connection, with its per-request warnings (a malformed
    request, an unsupported upgrade) handed to the guard, which logs them rate-limited:
    unauthenticated clients must not write a line to the daemon's log each."""

    def __init__(self, logger: logging.Logger, guard: _Guard) -> None:
        super().__init__(logger, {})
        self.guard = guard

    @property
    def level(self) -> int:  # uvicorn reads it to skip its trace lines
        return self.logger.level

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and not args and msg in _PER_REQUEST_LINES:
            self.guard.uvicorn_said(msg)
            return
        if msg is not None and str(msg).startswith("No supported WebSocket library"):
            return  # said with "Unsupported upgrade request.", counted there
        super().log(level, msg, *args, **kwargs)


class _GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the two bounds it lacks.

    * A connection beyond the limit is answered 503 and closed at once, so the
      API never holds more descriptors than the limit, whatever the clients do.
    * A connection whose request line and headers are not all in within the
      header timeout (counted from when it opened, or from the first byte of its
      next request) is answered 408 and closed; one that sent nothing is closed.
      Once a request's headers are in, the timeout no longer applies (a body or
      an event stream takes as long as it takes).

    With TLS the server listens on plain TCP and this protocol starts TLS itself
    (``loop.start_tls``), so both bounds hold from the moment a connection opens:
    asyncio's own TLS server would hand a connection over only once its handshake
    is done, and hold it uncounted for up to 60 s until then. A TLS connection over
    the limit is closed before its handshake (it cannot be answered in HTTP), and
    the header timeout covers the handshake and the headers together.
    """

    guard: _Guard  # set on the subclass each server makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _CountedLog(self.logger, self.guard)  # type: ignore[assignment]
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._sent_bytes = False
        self._handshake: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if guard.tls is not None:
            transport.pause_reading()  # the bytes are the handshake's: start_tls reads them
        super().connection_made(transport)
        if len(self.connections) > guard.stats.limit:
            self._refused = True
            guard.refused()
            if guard.tls is None:
                transport.write(guard.full)
            transport.close()
            return
        guard.stats.open = len(self.connections)
        self._arm()
        if guard.tls is not None:
            self._handshake = self.loop.create_task(self._start_tls(transport, guard.tls))

    async def _start_tls(self, plain: asyncio.Transport, context: ssl.SSLContext) -> None:
        early = _Early()
        try:
            secure = await self.loop.start_tls(
                plain,
                early,
                context,
                server_side=True,
                # the header timer closes it first; this only bounds start_tls itself
                ssl_handshake_timeout=2 * self.guard.header_timeout,
            )
        except (OSError, asyncio.CancelledError):  # ssl.SSLError and resets are OSErrors
            secure = None
        if secure is None or secure.is_closing():
            # Not made (a failed, abandoned or timed-out handshake): start_tls closed
            # the socket, and no connection_lost will come for a connection never made.
            plain.close()
            self._disarm()
            self.connections.discard(self)
            self.guard.stats.open = len(self.connections)
            return
        secure.set_protocol(self)
        H11Protocol.connection_made(self, secure)  # now it speaks HTTP, over TLS
        for data in early.data:
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        self.guard.stats.open = len(self.connections)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._sent_bytes = True
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()  # a request whose headers are not all in yet
        else:
            self._disarm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(
                self.guard.header_timeout, self._headers_too_slow
            )

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # still answering the previous request
        self.guard.timed_out()
        if self._sent_bytes:
            self.transport.write(self.guard.too_slow)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as the API's JSON error (its
        own is text/plain). h11 is in its ERROR state by then, so the answer is written
        straight to the transport, as the 503 over the limit is."""
        del msg  # "Invalid HTTP request received.": said in the body in the API's words
        self._disarm()
        self.transport.write(_BAD_REQUEST)
        self.transport.close()


class _Early(asyncio.Protocol):
    """The TLS connection's protocol until ``start_tls`` returns its transport: what
    the client sent right behind its handshake arrives before then, and waits here."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.data.append(data)


def _guarded_protocol(guard: _Guard) -> type[_GuardedH11]:
    return type("GuardedH11", (_GuardedH11,), {"guard": guard})


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its tick: uvicorn wakes ten times a second to refresh the
    Date header and look for an exit request, which is most of an idle daemon's CPU. This
    one sleeps until ``request_exit`` wakes it, and ``_DateHeader`` dates each response."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
        while not self.should_exit:
            await self._wake.wait()
            self._wake.clear()

    def request_exit(self) -> None:
        self.should_exit = True
        with self._lock:
            if self._loop is not None and self._wake is not None:
                self._loop.call_soon_threadsafe(self._wake.set)


class _DateHeader:
    """Adds the Date header (RFC 9110 6.6.1) to every response, as uvicorn's tick did."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dated(message: Any) -> None:
            if message["type"] == "http.response.start":
                date = formatdate(usegmt=True).encode()
                message["headers"] = [*message.get("headers", []), (b"date", date)]
            await send(message)

        await self.app(scope, receive, dated)


class ApiServer:
    """The HTTP server; ``start`` returns its URL once it accepts connections."""

    def __init__(
        self,
        ctx: ApiContext,
        *,
        host: str = "127.0.0.1",
        port: int = 8640,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        max_connections: int | None = None,
        header_timeout: float = HEADER_TIMEOUT,
    ) -> None:
        """``max_connections`` None: ``connection_limit`` of the open-files limit (8 slots)."""
        if (certfile is None) != (keyfile is None):
            raise JobControlError(
                "TLS needs both a certificate (--tls-cert) and its key (--tls-key)"
            )
        if max_connections is not None and max_connections < 1:
            raise JobControlError(
                f"--api-max-connections must be at least 1, not {max_connections}"
            )
        if not 0 < header_timeout < float("inf"):
            raise JobControlError(
                f"--api-header-timeout must be a positive number of seconds, not {header_timeout:g}"
            )
        tls = _tls_context(certfile, keyfile) if certfile and keyfile else None
        self.host, self.tls = host, tls is not None
        stats = ctx.connections
        stats.limit = max_connections or connection_limit(open_files_limit(), 8)
        self.header_timeout = header_timeout
        config = uvicorn.Config(
            _DateHeader(create_app(ctx)),
            host=host,
            port=port,
            log_level="warning",
            log_config=None,  # uvicorn logs through the daemon's handler, in its format
            lifespan="off",
            access_log=False,
            date_header=False,  # _DateHeader dates each response instead
            http=_guarded_protocol(_Guard(stats, header_timeout, tls)),
            backlog=ACCEPT_BATCH,
        )
        self.max_connections = stats.limit
        self._server = _QuietServer(config)
        self._thread = threading.Thread(target=self._server.run, name="jc-api", daemon=True)
        self.url = ""

    def start(self, timeout: float = 15.0) -> str:
        if not self.tls and not _loopback(self.host):
            log.warning(
                "the API listens on %s without TLS: tokens cross the network in clear", self.host
            )
        self._thread.start()
        deadline = time.monotonic() + timeout
        # uvicorn has no readiness callback; its `started` flag is set once it listens.
        while not self._server.started:
            if not self._thread.is_alive():
                raise JobControlError(
                    f"the admin API could not listen on {self.host} (see the daemon log)"
                )
            if time.monotonic() > deadline:
                raise JobControlError(f"the admin API did not start within {timeout:g}s")
            time.sleep(0.01)
        for server in self._server.servers:
            for listening in server.sockets:
                with socket.fromfd(listening.fileno(), listening.family, listening.type) as dup:
                    dup.listen(LISTEN_BACKLOG)  # the same socket: only the queue grows
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if self.tls else 'http'}://{host}:{port}"
        log.info(
            "admin API at %s/api/v1: at most %d connections, request headers within %gs",
            self.url,
            self.max_connections,
            self.header_timeout,
        )
        return self.url

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.request_exit()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _tls_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """The server's TLS settings (Python's defaults for a server: TLS 1.2 or newer),
    with the certificate and key loaded now, so a bad pair is refused before the
    daemon starts rather than in the server's thread."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        raise JobControlError(
            f"TLS certificate {certfile} and key {keyfile}: not a PEM certificate and its "
            f"private key ({exc.reason or exc})"
        ) from None
    except OSError as exc:  # missing or unreadable
        raise JobControlError(
            f"TLS certificate {certfile} and key {keyfile} could not be read: "
            f"{exc.strerror or exc}"
        ) from None
    return context


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


tls_context = _tls_context  # the daemon's check before anything is made
