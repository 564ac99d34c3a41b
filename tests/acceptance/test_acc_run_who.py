"""Who started each run, as the real daemon records it and the CLI and the API show it.

A timer's run is "timer"'s; a run started (``jobcontrol run``) or a tree restarted
(``jobcontrol restart``) through the API is the API user's, the restarted tree's
run included, whenever its timer then fires.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0

TREE = """\
jobs:
  - name: Who
    timer: every 2s
    active: true
    children:
      - name: w
        active: true
        command: "true"
"""


def _runs(jc: JobControl) -> list[dict[str, Any]]:
    return [r for r in jc.history("w") if r["state"] == "succeeded"]


def test_history_and_the_api_say_who_started_each_run(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.upgraded()
    jc.load(write(jc.base / "who.yaml", TREE))
    jc.ok("daemon", "start")
    assert wait_until(lambda: any(r["trigger"] == "timer" for r in _runs(jc)), WAIT)

    jc.ok("run", "w")  # through the API, as the admin of the token file
    assert wait_until(lambda: any(r["trigger"] == "manual" for r in _runs(jc)), WAIT)

    def restarted() -> bool:
        # A restart is refused while the tree runs (every 2 s, briefly): asked again then.
        result = jc.run("restart", "Who")
        assert result.returncode == 0 or "busy" in result.stderr, describe(result)
        return result.returncode == 0

    assert wait_until(restarted, WAIT)
    assert wait_until(lambda: any(r["trigger"] == "restart" for r in _runs(jc)), WAIT)

    who = {(r["trigger"], r["requested_by"]) for r in _runs(jc)}
    assert who == {("timer", "timer"), ("manual", "admin"), ("restart", "admin")}, who

    table = jc.ok("history", "w").stdout
    header, *rows = table.splitlines()
    assert "BY" in header.split(), table
    by = {
        (m.group(1), m.group(2))
        for row in rows
        if (m := re.match(r"\s*\d+\s+(\w+)\s+succeeded\b.*\s(timer|admin)\s*$", row))
    }
    assert by == who, table

    status = jc.ok("daemon", "status")
    match = re.search(r"admin API: (\S+/api/v1)", status.stdout)
    assert match, describe(status)
    token = jc.token_file.read_text().strip()
    with httpx.Client(base_url=match.group(1), timeout=10) as http:
        answer = http.get("/jobs/w/runs", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        api = {
            (r["trigger"], r["requested_by"])
            for r in answer.json()["runs"]
            if r["state"] == "succeeded"
        }
    assert api == who
    # --kill: Who runs every 2 s, and a plain stop is refused while it runs.
    jc.ok("daemon", "stop", "--kill")
