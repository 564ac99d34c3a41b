"""`retries` with the real daemon and CLI: a task that fails its first attempt runs again.

The task fails while a marker file is missing, and creates it: its first attempt
fails, its second succeeds, and its tree goes on as after a success. History
keeps both attempts, each its own run; `show` and `export` carry the field; a
bad value is refused naming the field, and nothing changes.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from jobcontrol.store import Store, lanes
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


def test_a_stopped_lane_is_visible_everywhere_and_resume_clears_it(jc: JobControl) -> None:
    """The dispatcher's STOPPED (its rule is tested in tests/integration/test_retries.py,
    on an injected clock) as the operator meets it: lanes, status, daemon status, resume."""
    jc.upgraded().load(
        write(
            jc.base / "tree.yaml",
            "jobs:\n  - name: fastjob\n" '    command: "true"\n    queue: fast\n',
        )
    )
    jc.ok("daemon", "start")
    jc.ok("lane", "add", "fast")
    reason = "5 unexpected worker ends within 10 minutes (workers w0, w1, w2, w3, w4)"
    store = Store(jc.url)
    try:
        with store.write() as conn:
            now = datetime.now(UTC)
            values = {"stopped_at": now, "stopped_reason": reason}
            lanes.change(conn, "fast", values, now, lanes.STOPPED_BY)
    finally:
        store.dispose()

    listed = jc.ok("lanes")
    assert re.search(r"^fast +stopped +- +0 +0 ", listed.stdout, re.M), describe(listed)
    assert f"\nlane fast STOPPED: {reason}\n" in listed.stdout, describe(listed)
    status = jc.ok("status")
    assert f"lane fast STOPPED: {reason}" in status.stdout, describe(status)
    daemon = jc.ok("daemon", "status")
    assert f"lane fast STOPPED: {reason}" in daemon.stdout, describe(daemon)

    started = jc.ok("run", "fastjob")
    run_id = int(re.search(r"started run (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
    assert not wait_until(
        lambda: jc.history("fastjob")[0]["state"] != "queued", 3.0
    ), "a stopped lane takes no claims"

    jc.ok("lane", "resume", "fast")
    assert wait_until(lambda: jc.history("fastjob")[0]["state"] == "succeeded", WAIT)
    assert jc.history("fastjob")[0]["id"] == run_id
    assert "STOPPED" not in jc.ok("status").stdout
    assert "STOPPED" not in jc.ok("daemon", "status").stdout
