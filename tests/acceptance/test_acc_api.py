"""The admin API as a user meets it: the real daemon, its token file, HTTP from outside."""

from __future__ import annotations

import os
import re
import stat

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until

pytestmark = pytest.mark.timeout(120)


def _api_url(jc: JobControl) -> str:
    status = jc.ok("daemon", "status")
    match = re.search(r"admin API: (\S+/api/v1)", status.stdout)
    assert match, describe(status)
    return match.group(1)


def test_the_daemon_serves_the_api_with_a_first_start_admin_token(jc: JobControl) -> None:
    jc.upgraded()
    jc.ok("daemon", "start")
    token_file = jc.token_file
    assert token_file.exists(), "the first start writes the admin token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    base = _api_url(jc)
    assert base.startswith("http://127.0.0.1:"), base  # loopback unless told otherwise
    auth = {"Authorization": f"Bearer {token}"}

    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/tree").status_code == 401  # no token, no answer
        assert http.get("/tree", headers={"Authorization": "Bearer jc_wrong"}).status_code == 401
        created = http.post(
            "/jobs", headers=auth, json={"name": "hello", "kind": "task", "command": "echo hi"}
        )
        assert created.status_code == 201, created.text
        tree = http.get("/tree", headers=auth).json()
        assert [j["name"] for j in tree["jobs"]] == ["hello"]
        assert tree["seq"] >= 1
        run = http.post("/jobs/hello/run", headers=auth)
        assert run.status_code == 202, run.text

        def finished() -> bool:
            runs = http.get("/jobs/hello/runs", headers=auth).json()["runs"]
            return bool(runs) and runs[0]["state"] == "succeeded"

        assert wait_until(finished, 30)

    # The CLI reads the same database: the job and its run, made over HTTP, are there.
    listing = jc.json("ls", "--json")
    assert [j["name"] for j in listing] == ["hello"]
    history = jc.json("history", "hello", "--json")
    assert history[0]["state"] == "succeeded"
    assert history[0]["requested_by"] == "admin"
    jc.ok("daemon", "stop")
    assert "admin API: " not in jc.run("daemon", "status").stdout
