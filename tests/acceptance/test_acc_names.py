"""Job names and '/' with the real CLI and daemon (issue 9, item 4).

New names with '/' are refused on every path (the API names jobs in URL
paths); a job that got such a name before keeps it and keeps working, the
daemon says how to rename it, and renaming it by id works.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.acceptance.harness import JobControl, write

pytestmark = pytest.mark.timeout(180)


def test_a_slash_name_is_refused_and_an_old_one_keeps_working(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    path = jc.url.removeprefix("sqlite:///")

    refused = jc.fails(
        "load",
        str(write(jc.base / "bad.yaml", "jobs:\n  - name: nightly/db\n    command: 'true'\n")),
    )
    assert "invalid job name 'nightly/db'" in refused.stderr
    assert "must not contain '/'" in refused.stderr
    assert jc.json("ls") == []  # nothing was loaded

    jc.load(write(jc.base / "good.yaml", "jobs:\n  - name: nightly-db\n    command: 'true'\n"))
    # What an older version allowed: the same job, named with '/'.
    with sqlite3.connect(path) as db:
        db.execute("UPDATE job SET name = 'nightly/db' WHERE name = 'nightly-db'")
    (job_id,) = [j["id"] for j in jc.json("ls")]

    jc.ok("daemon", "start")
    daemon_log = next(jc.state_dir.glob("daemon-*.log")).read_text()
    assert f"job 'nightly/db' (id {job_id}) has '/' in its name" in daemon_log
    assert f"jobcontrol set {job_id} name=NEW" in daemon_log

    # It runs and is edited by id; a new '/' name is refused; renaming it away works.
    jc.ok("set", str(job_id), "description=kept")
    bad = jc.fails("set", str(job_id), "name=other/db")
    assert "must not contain '/'" in bad.stderr
    assert jc.json("show", str(job_id))["name"] == "nightly/db"
    jc.ok("set", str(job_id), "name=nightly-db")
    shown = jc.json("show", "nightly-db")
    assert (shown["id"], shown["description"]) == (job_id, "kept")
