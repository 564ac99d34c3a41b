"""Serving the admin API from inside the daemon: uvicorn in a thread of its own."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import uvicorn

from jobcontrol.api.app import create_app
from jobcontrol.api.deps import ApiContext
from jobcontrol.errors import JobControlError

log = logging.getLogger(__name__)


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
    ) -> None:
        if (certfile is None) != (keyfile is None):
            raise JobControlError(
                "TLS needs both a certificate (--tls-cert) and its key (--tls-key)"
            )
        self.host, self.tls = host, certfile is not None
        config = uvicorn.Config(
            _DateHeader(create_app(ctx)),
            host=host,
            port=port,
            ssl_certfile=str(certfile) if certfile else None,
            ssl_keyfile=str(keyfile) if keyfile else None,
            log_level="warning",
            lifespan="off",
            access_log=False,
            date_header=False,  # _DateHeader dates each response instead
        )
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
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if self.tls else 'http'}://{host}:{port}"
        log.info("admin API at %s/api/v1", self.url)
        return self.url

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.request_exit()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
