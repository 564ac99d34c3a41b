"""Fixtures of the acceptance tier: a ``JobControl`` per database, cleaned up after the test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, write
from tests.acceptance.hosts import Hosts, need_namespaces


@pytest.fixture
def make_jc(tmp_path: Path) -> Iterator[Callable[[str], JobControl]]:
    """``make_jc(url)``: a user of that database; its daemons and task processes are
    stopped after the test, which fails if any task process was left running."""
    made: list[JobControl] = []

    def make(url: str) -> JobControl:
        jc = JobControl(url, tmp_path / f"user{len(made)}")
        made.append(jc)
        return jc

    yield make
    problems = [problem for jc in made for problem in jc.cleanup()]
    assert not problems, "\n".join(problems)


@pytest.fixture
def jc(db_url: str, make_jc: Callable[[str], JobControl]) -> JobControl:
    """Job Control on a fresh database of each store (SQLite, PostgreSQL)."""
    return make_jc(db_url)


@pytest.fixture
def jc_sqlite(sqlite_url: str, make_jc: Callable[[str], JobControl]) -> JobControl:
    return make_jc(sqlite_url)


@pytest.fixture
def other_db_url(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A second fresh, empty database of the same store as ``db_url``."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path}/other.db"
        return
    server = request.getfixturevalue("postgres_server")
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:30]
    name = f"o_{slug}_{uuid.uuid4().hex[:10]}"
    server.create_database(name)
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)


# The jobs of the remote-worker tests (test_acc_remote_worker.py, test_acc_worker_netns.py).
REMOTE_TREE = """\
jobs:
  - name: hello
    command: "echo hello from $JOBCONTROL_WORKER; exit 3"
  - name: sleeper
    command: sleep 1000
  - name: chain
    box_type: sequence
    children:
      - name: one
        command: "true"
        active: true
      - name: two
        command: "true"
        active: true
      - name: three
        command: "true"
        active: true
"""


@pytest.fixture
def jcpg(postgres_url: str, make_jc: Callable[[str], JobControl]) -> JobControl:
    """Job Control on a fresh PostgreSQL database with the remote-worker tests' jobs."""
    jc = make_jc(postgres_url)
    jc.upgraded().load(write(jc.base / "tree.yaml", REMOTE_TREE))
    return jc


@pytest.fixture(params=["here", "netns"])
def hosts(request: pytest.FixtureRequest, jcpg: JobControl) -> Iterator[Hosts]:
    """Workers as separate processes on this host, then each in a namespace of its own."""
    if request.param == "netns":
        need_namespaces()
    placed = Hosts(jcpg, request.param)
    try:
        yield placed
    finally:
        placed.close()
