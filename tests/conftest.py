"""Fixtures shared by the whole suite.

- ``postgres_server``: one throwaway PostgreSQL server for the session (tests/pgserver.py).
- ``postgres_url`` / ``sqlite_url``: a fresh, empty database per test, as a SQLAlchemy URL.
- ``db_url``: the contract-suite pattern, one test run against both stores:

      def test_roundtrip(db_url: str) -> None:
          store = open_store(db_url)  # runs as [sqlite] and as [postgresql]
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import JC
from tests.pgserver import PostgresServer

# Qt must never try to open a display: there is none on CI.
os.environ["QT_QPA_PLATFORM"] = "offscreen"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server started once for the session, stopped (and removed) at its end."""
    bindir = PostgresServer.available()
    if bindir is None:
        reason = (
            "PostgreSQL server binaries not found "
            "(neither /usr/lib/postgresql/*/bin/initdb nor pg_config --bindir)"
        )
        if _in_ci():
            pytest.fail(f"CI=true but {reason}: CI must test PostgreSQL", pytrace=False)
        pytest.skip(reason)
    server = PostgresServer(bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the module's own, which its tests may stop (``halt``) and
    start again without harming other tests."""
    bindir = PostgresServer.available()
    if bindir is None:
        if _in_ci():
            pytest.fail("CI=true but no PostgreSQL server binaries: CI must test PostgreSQL")
        pytest.skip("PostgreSQL server binaries not found")
    with PostgresServer(bindir) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a new database, unique to this test, dropped after it."""
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    name = f"t_{slug}_{uuid.uuid4().hex[:10]}"
    postgres_server.create_database(name)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)  # terminates leftover connections first


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a new SQLite database file in this test's tmp_path."""
    return f"sqlite:///{tmp_path}/jobcontrol.db"


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of each store in turn: the test runs once per store."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


MakeJC = Callable[..., JC]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keeps each phase's report on the test item: ``make_jc`` looks at its call's."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def make_jc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeJC]:
    made: list[JC] = []

    def make(url: str, *, start: bool = True, **config: Any) -> JC:
        jc = JC(url, tmp_path, **config)
        made.append(jc)
        return jc.start() if start else jc

    yield make
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        # What a failed wait cannot say: the runs and workers as the database has them,
        # and where each of the engine's threads is (printed before the stop changes them).
        for jc in made:
            sys.stdout.write(jc.diagnosis() + "\n")
    problems: list[str] = []
    for jc in made:
        leftovers = jc.close()
        if leftovers:
            problems.append(f"task processes outlived the dispatcher's stop: {leftovers}")
        problems += [f"Job Control logged an error: {m}" for m in jc.errors.messages()]
    if problems:
        pytest.fail("\n".join(problems))
