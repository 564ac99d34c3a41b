"""The package's shape as users of it see it: the API client is light, ``jobcontrol`` lazy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import jobcontrol
from jobcontrol.errors import UnknownJobError
from jobcontrol.model import MAX_ID, find_job

HEAVY = ("sqlalchemy", "alembic", "jobcontrol.store", "jobcontrol.service", "jobcontrol.dispatch")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


@pytest.mark.parametrize(
    "code",
    [
        "import jobcontrol.client",
        "from jobcontrol.client.locate import locate; locate(url='http://127.0.0.1:1')",
        "import jobcontrol; jobcontrol.__version__",
    ],
)
def test_the_api_client_and_the_package_load_no_engine_store_or_sqlalchemy(code: str) -> None:
    loaded = _loaded_after(code)
    assert [m for m in loaded if m.startswith(HEAVY)] == []


def test_a_public_name_of_the_package_is_loaded_on_first_use() -> None:
    loaded = _loaded_after("from jobcontrol import Engine")
    assert "jobcontrol.service.engine" in loaded
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = jobcontrol.Nope  # type: ignore[attr-defined]


def test_one_rule_resolves_a_job_reference() -> None:
    names = {"nightly": "N", "42": "named 42"}
    ids = {7: "seven", 42: "id 42"}
    find = lambda ref: find_job(ref, ids.get, names.get)  # noqa: E731
    assert find("nightly") == "N"
    assert find(7) == "seven"
    assert find("7") == "seven"  # digits name an id when no job has that name
    assert find("42") == "named 42"  # ... but a job's name wins
    with pytest.raises(UnknownJobError, match="'nope'|nope"):
        find("nope")
    with pytest.raises(UnknownJobError):
        find(str(MAX_ID + 1))  # never an id out of range
