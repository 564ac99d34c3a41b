"""An admin API over a real dispatcher (manual clock), with one user of each role.

``api.client`` is a FastAPI TestClient; ``api.headers(role)`` gives the
Authorization header of the viewer, operator or admin; ``api.jc`` is the
integration harness underneath (engine, dispatcher, manual timers, signals).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from jobcontrol.api.app import create_app
from jobcontrol.api.deps import ApiContext
from jobcontrol.service.eventlog import EventLog
from jobcontrol.service.metrics import RunMetrics
from jobcontrol.service.users import Role, add_user
from tests.conftest import MakeJC
from tests.integration.helpers import JC


@dataclass
class Api:
    client: TestClient
    jc: JC
    ctx: ApiContext
    tokens: dict[str, str]
    shutdown_requests: list[bool]

    def headers(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def _api(url: str, make_jc: MakeJC) -> Iterator[Api]:
    jc = make_jc(url)
    tokens = {role.value: add_user(jc.store, f"{role.value}-user", role)[1] for role in Role}
    log = EventLog(jc.dispatcher)
    log.start()
    metrics = RunMetrics(jc.dispatcher)
    metrics.start()
    requests: list[bool] = []
    ctx = ApiContext(
        store=jc.store,
        engine=jc.engine,
        eventlog=log,
        version="test",
        started=datetime.now(UTC),
        request_shutdown=requests.append,
        metrics=metrics,
    )
    # PUT /log-level (spec 11) changes this process's jobcontrol loggers: the fuzz test
    # sends it too. Put the level back for the tests that follow in this process.
    ours = logging.getLogger("jobcontrol")
    level = ours.level
    try:
        with TestClient(create_app(ctx)) as client:
            yield Api(client, jc, ctx, tokens, requests)
    finally:
        ours.setLevel(level)
    metrics.stop()
    log.stop()


@pytest.fixture
def api(sqlite_url: str, make_jc: MakeJC) -> Iterator[Api]:
    yield from _api(sqlite_url, make_jc)


@pytest.fixture
def api_any(db_url: str, make_jc: MakeJC) -> Iterator[Api]:
    """The same on both stores, for routes where the store matters."""
    yield from _api(db_url, make_jc)
