"""Fixtures of the engine's integration tests: a running Job Control per test.

- ``jc``: on both stores (``db_url``), for tests where the store matters
  (transactions, refusals, history, scheduling state written and read back).
- ``jc_sqlite``: SQLite only, for tests about processes, logs and the
  executor, where the store adds nothing and PostgreSQL would only add time.
- ``make_jc``: a factory for a differently configured one (``slots=1``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import JC

MakeJC = Callable[..., JC]


@pytest.fixture
def make_jc(tmp_path: Path) -> Iterator[MakeJC]:
    made: list[JC] = []

    def make(url: str, *, start: bool = True, **config: Any) -> JC:
        jc = JC(url, tmp_path, **config)
        made.append(jc)
        return jc.start() if start else jc

    yield make
    problems: list[str] = []
    for jc in made:
        leftovers = jc.close()
        if leftovers:
            problems.append(f"task processes outlived the dispatcher's stop: {leftovers}")
        problems += [f"Job Control logged an error: {m}" for m in jc.errors.messages()]
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def jc(db_url: str, make_jc: MakeJC) -> JC:
    return make_jc(db_url)


@pytest.fixture
def jc_sqlite(sqlite_url: str, make_jc: MakeJC) -> JC:
    return make_jc(sqlite_url)
