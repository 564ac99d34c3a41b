"""A daemon with more task slots than the connections it used to keep runs them all.

Each slot's thread keeps a database connection of its own once it has written (a
task that runs past 50 ms records its pid), and the daemon's pool used to hold 30
whatever its slots: with ``--slots 40`` and 40 tasks at once, the 31st slot waited
for a connection while it held the process's turn to write, every other writer
waited behind it for the busy timeout, and its thread died with the runs it held.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.acceptance.harness import JobControl, wait_until, write
from tests.acceptance.test_acc_full_disk import api_base

pytestmark = pytest.mark.timeout(240)

SLOTS = 40


def test_forty_slots_run_forty_tasks_at_once_and_record_every_end(jc: JobControl) -> None:
    gate = jc.base / "gate"
    gate.mkdir()
    # Each task says it started, waits (bounded) until all of them have, then runs on
    # past the pid's record: every slot holds a connection at the same time.
    script = (
        f'touch "{gate}/$JOBCONTROL_JOB"; '
        f'for i in $(seq 600); do [ "$(ls "{gate}" | wc -l)" -ge {SLOTS} ] && break; '
        "sleep 0.1; done; "
        f'[ "$(ls "{gate}" | wc -l)" -ge {SLOTS} ] || exit 3; sleep 0.5'
    )
    trees = "\n".join(
        f"  - name: tree-{i:02d}\n"
        "    active: true\n"
        "    timer: every 1s\n"
        "    children:\n"
        f"      - name: task-{i:02d}\n"
        "        active: true\n"
        f"        command: {script!r}\n"
        for i in range(SLOTS)
    )
    jc.upgraded().load(write(jc.base / "jobs.yaml", f"jobs:\n{trees}"))
    # Every tree's timer fires a second after the start: 40 tasks due at once.
    jc.ok("daemon", "start", "--slots", str(SLOTS))

    base = f"{api_base(jc)}/api/v1"
    auth = {"Authorization": f"Bearer {jc.token_file.read_text().strip()}"}

    def ended() -> list[dict[str, Any]] | None:
        """Each task's first run, once every one has ended (the API: 40 CLI calls a
        look would take longer than the tasks)."""
        firsts = []
        for i in range(SLOTS):
            answer = httpx.get(
                f"{base}/jobs/task-{i:02d}/runs?limit=1000", headers=auth, timeout=10
            )
            assert answer.status_code == 200, answer.text
            runs = answer.json()["runs"]
            if not runs or runs[-1]["ended"] is None:
                return None
            firsts.append(runs[-1])
        return firsts

    assert wait_until(ended, 120, interval=0.5), "not every task's end was recorded"
    finished = ended()
    assert finished is not None
    assert sorted((r["state"], r["exit_status"]) for r in finished) == [("succeeded", 0)] * SLOTS
    assert len(list(gate.iterdir())) == SLOTS
    log = "".join(p.read_text() for p in jc.state_dir.glob("daemon-*.log"))
    assert "uncaught exception" not in log
    assert "does not answer" not in log
