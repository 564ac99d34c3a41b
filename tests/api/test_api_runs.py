"""The run routes of the admin API: one run with its children, and a run's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import Api
from tests.integration.helpers import box, poll_until, task

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"
LINES = "".join(f"line {i:03d}\n" for i in range(100)).encode()  # 9 bytes a line
PRINT_LINES = "for i in $(seq 0 99); do printf 'line %03d\\n' $i; done"


def finished_run(api: Api, job: str) -> int:
    """Run ``job`` now and wait for it to end; its run id."""
    mark = api.jc.rec.mark()
    run_id = api.jc.run_now(job)
    api.jc.rec.run_finished(job, since=mark)
    return run_id


def task_run_of(api: Api, root: int, job: str) -> int:
    return api.jc.tree_run(root)[job].id


def test_a_run_with_its_child_runs(api: Api) -> None:
    api.jc.create(
        box("Top"),
        box("Sub", "Top", active=True),
        task("a", "true", "Sub", active=True),
        task("b", "false", "Top", active=True),
    )
    root = finished_run(api, "Top")
    runs = api.jc.tree_run(root)
    h = api.headers("viewer")
    r = api.client.get(f"{V1}/runs/{root}", headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["run"]["id"], body["run"]["job_name"], body["run"]["state"]) == (
        root,
        "Top",
        "failed",
    )
    assert body["run"]["exit_status"] == 1
    assert sorted(c["job_name"] for c in body["children"]) == ["Sub", "a", "b"]
    sub = api.client.get(f"{V1}/runs/{runs['Sub'].id}", headers=h).json()
    assert [c["job_name"] for c in sub["children"]] == ["a"]
    leaf = api.client.get(f"{V1}/runs/{runs['a'].id}", headers=h).json()
    assert leaf["children"] == []
    assert leaf["run"]["parent_run_id"] == runs["Sub"].id


def test_unknown_runs_are_404(api: Api) -> None:
    h = api.headers("viewer")
    for path in ("/runs/12345", "/runs/12345/log"):
        r = api.client.get(V1 + path, headers=h)
        assert r.status_code == 404
        assert r.json()["detail"] == "run 12345: no such run"
    assert api.client.get(f"{V1}/runs/0", headers=h).status_code == 422
    assert api.client.get(f"{V1}/runs/1").status_code == 401


def test_log_range_and_tail(api: Api) -> None:
    api.jc.create(task("printer", PRINT_LINES))
    run_id = finished_run(api, "printer")
    h = api.headers("viewer")
    whole = api.client.get(f"{V1}/runs/{run_id}/log", headers=h)
    assert whole.status_code == 200, whole.text
    assert whole.content == LINES
    assert whole.headers["content-type"].startswith("text/plain")
    assert whole.headers["x-log-size"] == str(len(LINES))
    part = api.client.get(f"{V1}/runs/{run_id}/log?offset=18&length=18", headers=h)
    assert part.content == b"line 002\nline 003\n"
    assert (part.headers["x-log-offset"], part.headers["x-log-size"]) == ("18", "900")
    tail = api.client.get(f"{V1}/runs/{run_id}/log?tail=18", headers=h)
    assert tail.content == b"line 098\nline 099\n"
    assert tail.headers["x-log-offset"] == "882"
    past = api.client.get(f"{V1}/runs/{run_id}/log?offset=5000", headers=h)
    assert (past.status_code, past.content) == (200, b"")
    bad = api.client.get(f"{V1}/runs/{run_id}/log?length=0", headers=h)
    assert bad.status_code == 422


def test_no_log_for_empty_output_a_box_or_a_pruned_file(api: Api) -> None:
    api.jc.create(box("Top"), task("quiet", "true", "Top", active=True))
    root = finished_run(api, "Top")
    h = api.headers("viewer")
    quiet = task_run_of(api, root, "quiet")
    r = api.client.get(f"{V1}/runs/{quiet}/log", headers=h)
    assert r.status_code == 404
    assert "output was empty" in r.json()["detail"]
    assert api.client.get(f"{V1}/runs/{quiet}/log?follow=true", headers=h).status_code == 404
    r = api.client.get(f"{V1}/runs/{root}/log", headers=h)
    assert r.status_code == 404
    assert "box run" in r.json()["detail"]

    api.jc.create(task("printer", PRINT_LINES))
    printed = finished_run(api, "printer")
    Path(api.jc.run(printed).log_path or "").unlink()
    r = api.client.get(f"{V1}/runs/{printed}/log", headers=h)
    assert r.status_code == 404
    assert "gone" in r.json()["detail"]


def test_follow_streams_the_log_while_the_run_is_live_and_ends_with_it(api: Api) -> None:
    gate = api.jc.gate()
    api.jc.create(task("talker", f"echo first; {gate.command}; echo second"))
    mark = api.jc.rec.mark()
    run_id = api.jc.run_now("talker")
    api.jc.wait_task_process(run_id)
    log_path = Path(api.jc.run(run_id).log_path or "")
    poll_until("the first line in the log", lambda: log_path.read_bytes() == b"first\n")
    url = f"{V1}/runs/{run_id}/log?follow=true"
    with api.client.stream("GET", url, headers=api.headers("viewer")) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()
        assert next(chunks) == b"first\n"  # sent while the run is still live
        assert api.jc.run(run_id).state == "running"
        gate.open()
        rest = b"".join(chunks)  # ends by itself once the run is final
    assert rest == b"second\n"
    assert api.jc.rec.run_finished("talker", since=mark)["state"] == "succeeded"


def test_follow_with_tail_and_a_client_that_leaves_early(api: Api) -> None:
    api.jc.create(task("printer", PRINT_LINES))
    run_id = finished_run(api, "printer")
    h = api.headers("viewer")
    r = api.client.get(f"{V1}/runs/{run_id}/log?follow=true&tail=9", headers=h)
    assert r.content == b"line 099\n"

    gate = api.jc.gate()
    api.jc.create(task("waiter", f"echo hello; {gate.command}"))
    mark = api.jc.rec.mark()
    waiter = api.jc.run_now("waiter")
    with api.client.stream("GET", f"{V1}/runs/{waiter}/log?follow=true", headers=h) as r:
        assert next(r.iter_bytes()) == b"hello\n"
    # The client left: the stream was cancelled, and the run goes on unharmed.
    assert api.jc.run(waiter).state == "running"
    gate.open()
    assert api.jc.rec.run_finished("waiter", since=mark)["state"] == "succeeded"
