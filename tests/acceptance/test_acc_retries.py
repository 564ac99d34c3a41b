"""`retries` with the real daemon and CLI: a task that fails its first attempt runs again.

The task fails while a marker file is missing, and creates it: its first attempt
fails, its second succeeds, and its tree goes on as after a success. History
keeps both attempts, each its own run; `show` and `export` carry the field; a
bad value is refused naming the field, and nothing changes.
"""

from __future__ import annotations

import re

import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

WAIT = 30.0


def tree(marker: str) -> str:
    return f"""\
jobs:
  - name: nightly
    children:
      - name: flaky
        command: "test -e {marker} || {{ touch {marker}; exit 3; }}"
        retries: 2
        active: true
      - name: after
        command: "true"
        active: true
    on_error: abort
"""


def test_a_task_that_fails_once_is_retried_and_its_tree_succeeds(jc: JobControl) -> None:
    marker = jc.base / "ran-once"
    jc.upgraded().load(write(jc.base / "tree.yaml", tree(str(marker))))
    jc.ok("daemon", "start")
    shown = jc.ok("show", "flaky")
    assert re.search(r"^retries\s*:?\s+2$", shown.stdout, re.M), describe(shown)

    started = jc.ok("run", "nightly")
    root = int(re.search(r"started run (\d+)", started.stdout).group(1))  # type: ignore[union-attr]

    def ended() -> bool:
        return any(
            r["id"] == root and r["state"] not in ("queued", "running")
            for r in jc.history("nightly")
        )

    assert wait_until(ended, WAIT), describe(jc.ok("history", "nightly"))
    [box] = [r for r in jc.history("nightly") if r["id"] == root]
    assert (box["state"], box["exit_status"]) == ("succeeded", 0), box
    attempts = sorted(jc.history("flaky"), key=lambda r: r["id"])
    assert [(r["attempt"], r["state"], r["exit_status"]) for r in attempts] == [
        (1, "failed", 3),
        (2, "succeeded", 0),
    ]
    assert {r["root_run_id"] for r in attempts} == {root}
    assert [r["state"] for r in jc.history("after")] == ["succeeded"]

    exported = jc.ok("export")
    assert "retries: 2" in exported.stdout, describe(exported)

    refused = jc.fails("set", "flaky", "retries=-1")
    assert "retries" in refused.stderr, describe(refused)
    refused = jc.fails("set", "flaky", "retries=two")
    assert "retries" in refused.stderr, describe(refused)
    assert jc.json("show", "flaky")["retries"] == 2
