"""Every changing call of the Engine leaves one audit entry, refusals included.

A refused edit still leaves the job and run tables exactly as they were: its
entry is written in a transaction of its own after the refused one rolled back.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from jobcontrol import Batch, JobChange
from jobcontrol.definitions import commands
from jobcontrol.errors import ConflictError, DefinitionError, JobError, UnknownJobError
from jobcontrol.service.audit import AuditEntry, list_entries
from jobcontrol.service.loader import load_definitions
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, USER, box, task

pytestmark = pytest.mark.timeout(60)


def entries(jc: JC) -> list[AuditEntry]:
    return list_entries(jc.store, limit=100)


def newest(jc: JC) -> AuditEntry:
    return entries(jc)[0]


def brief(e: AuditEntry) -> tuple[str, str, list[str], str]:
    return (e.user, e.operation, e.jobs, str(e.result))


def test_batches_are_audited_by_their_content(jc: JC) -> None:
    jc.create(box("Top", timer="every 1h"), task("t1", "true", "Top"))
    assert brief(newest(jc)) == (USER, "jobs.create", ["Top", "t1"], "ok")
    assert newest(jc).detail == "2 created, 0 modified, 0 deleted"

    jc.engine.modify_jobs([JobChange("t1", {"description": "x"})], user="ann")
    assert brief(newest(jc)) == ("ann", "jobs.modify", ["t1"], "ok")

    top = jc.job("Top").id
    jc.engine.modify_jobs([JobChange(top, {"active": True})], user="ann")
    assert brief(newest(jc)) == ("ann", "jobs.modify", ["Top"], "ok")  # an id, named

    batch = Batch(creates=[task("t2", "true", "Top")], deletes=["t1"])
    jc.engine.apply_batch(batch, user="ben")
    assert brief(newest(jc)) == ("ben", "jobs.edit", ["t2", "t1"], "ok")
    assert newest(jc).detail == "1 created, 0 modified, 1 deleted"

    jc.engine.delete_jobs(["t2", "Top"], user="ben")
    assert brief(newest(jc)) == ("ben", "jobs.delete", ["Top", "t2"], "ok")
    assert len(entries(jc)) == 5  # one per call, delete_jobs' transactions included


def test_a_refused_edit_is_audited_and_changes_nothing_else(jc: JC) -> None:
    jc.create(box("Top"), task("t1", "true", "Top"))
    seen = jc.job("t1").version
    jc.modify("t1", description="someone else")
    before = jc.dump()
    count = len(entries(jc))

    with pytest.raises(ConflictError) as refused:
        jc.engine.modify_jobs([JobChange("t1", {"description": "mine"}, seen)], user="ann")

    assert jc.dump() == before  # job and run tables untouched
    assert len(entries(jc)) == count + 1
    entry = newest(jc)
    assert brief(entry) == ("ann", "jobs.modify", ["t1"], "refused")
    assert entry.detail == str(refused.value)
    assert "changed by someone else" in entry.detail


def test_refusals_of_every_kind_of_edit_are_audited(jc: JC) -> None:
    jc.create(box("Top"), task("t1", "true", "Top"))
    before = jc.dump()
    refusals = [
        (lambda: jc.create(task("t1", "true")), "jobs.create", ["t1"], "already exists"),
        (lambda: jc.modify("nope", description="x"), "jobs.modify", ["nope"], "no such job"),
        (
            lambda: jc.engine.delete_jobs(["Top", "ghost"], user=USER),
            "jobs.delete",
            ["Top", "ghost"],
            "'ghost': no such job",
        ),
        (lambda: jc.engine.run_now("ghost", user=USER), "job.run", ["ghost"], "no such job"),
        (lambda: jc.engine.kill("t1", user=USER), "job.kill", ["t1"], "'t1': not running"),
        (
            lambda: jc.engine.restart("t1", user=USER),
            "job.restart",
            ["t1"],
            "not a top-level job",
        ),
    ]
    for call, operation, jobs, words in refusals:
        with pytest.raises(JobError):
            call()
        entry = newest(jc)
        assert brief(entry) == (USER, operation, jobs, "refused"), words
        assert words in entry.detail
    assert jc.dump() == before


def test_runs_kills_and_restarts_are_audited(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    gate = jc.gate()
    jc.create(
        box("Top", timer="every 1h", active=True), task("wait", gate.command, "Top", active=True)
    )
    mark = jc.rec.mark()

    run_id = jc.engine.run_now("Top", user="ops")
    assert brief(newest(jc)) == ("ops", "job.run", ["Top"], "ok")
    assert newest(jc).detail == f"run {run_id}"

    with pytest.raises(JobError) as busy:
        jc.engine.run_now("Top", user="ops")
    assert brief(newest(jc)) == ("ops", "job.run", ["Top"], "refused")
    assert newest(jc).detail == str(busy.value)

    jc.rec.wait_for(lambda s: s.name == "run_started" and s.run["job_name"] == "wait", since=mark)
    killed = jc.engine.kill("wait", user="ops")
    assert brief(newest(jc)) == ("ops", "job.kill", ["wait"], "ok")
    assert newest(jc).detail == f"killed run {killed}"
    jc.rec.run_finished("Top", since=mark)

    jc.engine.restart(jc.job("Top").id, user="ops")
    assert brief(newest(jc)) == ("ops", "job.restart", ["Top"], "ok")
    assert newest(jc).detail.startswith("next run ")


FILE = """
jobs:
  - name: Loaded
    children:
      - name: l1
        command: "true"
"""


def test_a_definition_load_is_one_entry_for_the_file(jc: JC) -> None:
    load_definitions(jc.engine, FILE, "jobs.yaml", user="ann")
    [entry] = entries(jc)
    assert brief(entry) == ("ann", "definitions.load", ["Loaded", "l1"], "ok")
    assert entry.detail == "jobs.yaml: 2 created, 0 modified, 0 deleted"

    before = jc.dump()
    bad = FILE.replace('command: "true"', 'command: "true"\n        timer: "every never"')
    with pytest.raises(DefinitionError) as refused:
        load_definitions(jc.engine, bad, "bad.yaml", user="ann")
    assert jc.dump() == before
    entry = newest(jc)
    assert brief(entry)[:2] == ("ann", "definitions.load")
    assert str(entry.result) == "refused"
    assert entry.detail == str(refused.value)
    assert entry.detail.startswith("bad.yaml:")
    assert len(entries(jc)) == 2


def test_unknown_job_in_delete_is_refused_before_anything_goes(jc: JC) -> None:
    jc.create(task("keep", "true"))
    with pytest.raises(UnknownJobError):
        jc.engine.delete_jobs(["keep", "missing"], user=USER)
    assert jc.job("keep").name == "keep"


def test_an_offline_edit_by_id_is_audited_under_the_jobs_name(db_url: str, make_jc: MakeJC) -> None:
    """With no daemon running (the CLI's offline edits), a job given by id is named in the
    audit trail from the database; an id that names no job stays as given."""
    jc = make_jc(db_url, start=False)
    jc.create(box("Top"), task("t1", "true", "Top"))
    t1 = jc.job("t1").id
    jc.engine.modify_jobs([JobChange(t1, {"description": "offline"})], user="ann")
    assert brief(newest(jc)) == ("ann", "jobs.modify", ["t1"], "ok")
    assert jc.job("t1").description == "offline"
    count = len(entries(jc))
    with pytest.raises(UnknownJobError):
        jc.engine.modify_jobs([JobChange(t1 + 1000, {"description": "x"})], user="ann")
    assert len(entries(jc)) == count + 1
    assert brief(newest(jc)) == ("ann", "jobs.modify", [str(t1 + 1000)], "refused")


def test_a_command_is_checked_by_the_shell_once_not_at_each_load(
    sqlite_url: str, make_jc: MakeJC, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command went through ``/bin/sh -n`` twice a load (the file's parse, then the
    batch's fields), and again at every reload: 10,000 jobs took most of a minute. A
    command is checked once a process, and one the database holds is not checked again."""
    calls = tmp_path / "calls"
    shell = tmp_path / "sh"
    shell.write_text(f'#!/bin/sh\necho x >> {calls}\nexec /bin/sh "$@"\n')
    shell.chmod(0o755)
    monkeypatch.setattr(commands, "SHELL", str(shell))
    monkeypatch.setattr(commands, "_passed", collections.OrderedDict())
    jc = make_jc(sqlite_url)
    text = "jobs:\n" + "".join(
        f"  - name: t{i}\n    command: echo distinct {i} at load\n" for i in range(5)
    )

    load_definitions(jc.engine, text, "jobs.yaml", user="ann")
    assert len(calls.read_text().splitlines()) == 5  # each once
    commands._passed.clear()  # as a new process (``jobcontrol load`` offline) starts
    calls.write_text("")
    load_definitions(jc.engine, text, "jobs.yaml", user="ann")
    assert calls.read_text() == ""  # held by the database: none again
    with pytest.raises(DefinitionError, match="invalid command"):  # a new one is checked
        load_definitions(
            jc.engine, text + "  - name: bad\n    command: 'if true'\n", "b", user="ann"
        )
    assert len(calls.read_text().splitlines()) == 1
