"""Fixtures of the engine's integration tests: a running Job Control per test.

- ``jc``: on both stores (``db_url``), for tests where the store matters
  (transactions, refusals, history, scheduling state written and read back).
- ``jc_sqlite``: SQLite only, for tests about processes, logs and the
  executor, where the store adds nothing and PostgreSQL would only add time.
- ``make_jc``: a factory for a differently configured one (``slots=1``...).
"""

from __future__ import annotations

import pytest

from tests.conftest import MakeJC  # noqa: F401  (re-exported for the test modules)
from tests.integration.helpers import JC


@pytest.fixture
def jc(db_url: str, make_jc: MakeJC) -> JC:
    return make_jc(db_url)


@pytest.fixture
def jc_sqlite(sqlite_url: str, make_jc: MakeJC) -> JC:
    return make_jc(sqlite_url)
