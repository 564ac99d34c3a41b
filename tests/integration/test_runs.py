"""Runs: manual runs, conflicts, rescheduling, kill, timeout, task environment, logs, history.

Spec 7 and 8 with DESIGN decisions 2 (a manual run covers its whole sub-tree),
3 (a timer firing on a busy tree is recorded as skipped) and 4 (a kill is 255
and counts as a failure).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from jobcontrol.errors import JobError, JobRunningError
from jobcontrol.model import JobState, RunState
from jobcontrol.procs import pid_alive
from jobcontrol.store import queries
from jobcontrol.store.schema import run
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, T0, USER, box, poll_until, task

pytestmark = pytest.mark.timeout(60)

FOO_AT = T0.replace(hour=22, minute=56)
BAR_AT = T0.replace(hour=22, minute=59)


def first_started(jc: JC, job: str, since: int) -> int:
    """The run id of ``job``'s first run started after ``since``."""
    sig = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == job, since=since
    )
    run_id: int = sig.run["id"]
    return run_id


# ---------------------------------------------------------------- manual runs


def test_manual_run_of_a_child_runs_its_subtree_only_even_when_inactive(jc: JC) -> None:
    jc.create(
        box("Top", timer="every 1h", active=True),
        box("A", "Top", active=False),
        task("a1", "true", "A", active=True),
        task("a2", "true", "A", active=False),
        box("A2", "A", active=False),
        task("deep", "true", "A2", active=True),
        task("B", "true", "Top", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("A")
    done = jc.rec.run_finished("A", since=mark)
    assert done["id"] == root
    assert done["exit_status"] == 0

    runs = jc.tree_run(root)
    assert set(runs) == {"A", "a1", "a2", "A2"}  # not Top, not B, not below a skipped box
    assert runs["A"].state == "succeeded"  # ran although inactive
    assert runs["a1"].state == "succeeded"
    for skipped in ("a2", "A2"):
        assert runs[skipped].state == "skipped"
        assert runs[skipped].reason == "inactive"
    assert {r.trigger for r in runs.values()} == {"manual"}
    assert {r.requested_by for r in runs.values()} == {USER}
    assert jc.runs("Top") == []
    assert jc.runs("B") == []
    assert jc.job("a2").last_ran is None  # skipped: its bookkeeping is untouched
    # DESIGN decision 3: a manual run leaves the tree's schedule alone.
    assert jc.armed_at("Top") == T0 + timedelta(hours=1)
    assert jc.job("Top").next_runs == T0 + timedelta(hours=1)


def test_manual_run_of_a_timed_box_does_not_wait(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(
        box("Absolute", box_type="timed", active=True),
        task("foo", "true", "Absolute", timer="daily 22:56", active=True),
        task("bar", "true", "Absolute", timer="daily 22:59", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("Absolute")
    done = jc.rec.run_finished("Absolute", since=mark)  # the clock never moves
    assert done["exit_status"] == 0
    runs = jc.tree_run(root)
    assert [runs["foo"].started, runs["bar"].started] == [T0, T0]
    assert not [s for s in jc.rec.signals("state_changed") if s.data["state"] is JobState.WAITING]
    assert jc.armed_at("Absolute") == FOO_AT  # still scheduled as before


def test_run_now_refused_while_an_ancestor_or_descendant_runs(jc: JC) -> None:
    jc.create(
        box("Top", active=True),
        box("A", "Top", active=True),
        task("slow", "sleep 1000", "A", active=True),
        task("a2", "true", "A", active=True),
        task("B", "true", "Top", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("A")
    jc.wait_task_process(first_started(jc, "slow", mark))
    before = jc.dump()

    for job, busy in (("a2", "A"), ("slow", "slow"), ("Top", "A"), ("A", "A")):
        with pytest.raises(JobRunningError) as refused:
            jc.run_now(job)
        assert refused.value.job == job
        assert f"job {job!r}" in str(refused.value)
        assert f"{busy!r} is running" in str(refused.value)
    assert jc.dump() == before  # a refused run records nothing

    # An unrelated part of the same tree may run meanwhile (spec 7.2).
    b_mark = jc.rec.mark()
    jc.run_now("B")
    assert jc.rec.run_finished("B", since=b_mark)["exit_status"] == 0

    assert jc.engine.kill("a2", user=USER) == root  # the nearest running sub-tree root
    assert jc.rec.run_finished("A", since=mark)["exit_status"] == 255


def test_timer_firing_on_a_busy_tree_is_recorded_as_skipped_and_rearmed(jc: JC) -> None:
    gate = jc.gate()
    jc.create(
        box("Periodic", timer="every 10s", active=True),
        task("work", gate.command, "Periodic", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("work")  # a manual run of a child keeps the tree busy

    assert jc.advance(10) == 1
    skipped = jc.runs("Periodic")
    assert len(skipped) == 1
    assert skipped[0].state == "skipped"
    assert skipped[0].trigger == "timer"
    assert "tree busy" in (skipped[0].reason or "")
    assert "'work'" in (skipped[0].reason or "")
    assert jc.armed_at("Periodic") == T0 + timedelta(seconds=20)  # re-armed for the next one
    assert jc.job("Periodic").next_runs == T0 + timedelta(seconds=20)

    gate.open(2)
    jc.rec.run_finished("work", since=mark)
    mark = jc.rec.mark()
    jc.advance(10)
    done = jc.rec.run_finished("Periodic", since=mark)
    assert done["exit_status"] == 0
    assert [(r.trigger, r.state) for r in jc.runs("Periodic")] == [
        ("timer", "succeeded"),
        ("timer", "skipped"),
    ]


# ---------------------------------------------------------------- rescheduling


def test_a_timer_inherited_from_inside_an_inactive_box_fires_once_per_occurrence(
    jc: JC,
) -> None:
    """Spec 4.5: an inactive box still passes its first child's timer up, but the run
    skips that box, so the child does not run and its schedule does not move on. The
    tree must wait for the next occurrence, not fire again at once, for ever."""
    jc.create(
        box("Top", active=True),
        box("Dormant", "Top", active=True),
        task("ticker", "true", "Dormant", timer="every 30s", active=True),
        task("work", "true", "Top", active=True),
    )
    mark = jc.rec.mark()
    assert jc.advance(30) == 1  # ticker's first occurrence: everything runs
    jc.rec.run_finished("Top", since=mark)
    assert jc.armed_at("Top") == T0 + timedelta(seconds=60)
    jc.modify("Dormant", active=False)

    mark = jc.rec.mark()
    assert jc.advance(30) == 1
    jc.rec.run_finished("Top", since=mark)
    jc.wait_quiet(fire_due_timers=True)
    assert [r.state for r in jc.runs("Top")] == ["succeeded", "succeeded"]
    assert [r.state for r in jc.runs("ticker")] == ["succeeded"]  # not since Dormant went
    assert [r.state for r in jc.runs("work")] == ["succeeded", "succeeded"]
    # Re-armed for ticker's next occurrence after now, as a periodic timer would be.
    assert jc.armed_at("Top") == T0 + timedelta(seconds=90)
    assert jc.job("Top").next_runs == T0 + timedelta(seconds=90)


def test_failed_abort_tree_stays_unscheduled_until_restart(jc: JC) -> None:
    jc.create(
        box("Top", timer="every 10s", on_error="abort", active=True),
        task("fails", "exit 1", "Top", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    assert jc.rec.run_finished("Top", since=mark)["exit_status"] == 1
    assert jc.armed_at("Top") is None
    assert jc.job("Top").next_runs is None  # "will not run again"
    assert jc.view("Top")["next_runs"] is None

    assert jc.advance(600) == 0
    assert len(jc.runs("Top")) == 1

    with pytest.raises(JobError, match="not a top-level job"):
        jc.engine.restart("fails", user=USER)
    due = jc.engine.restart("Top", user=USER).next_runs
    assert due == T0 + timedelta(seconds=620)  # 10 s after the restart, as Inq's "now + 10s"
    assert jc.armed_at("Top") == due
    assert jc.job("Top").next_runs == due

    mark = jc.rec.mark()
    assert jc.advance(0) == 0  # a restart never fires at once
    assert jc.advance(10) == 1
    again = jc.rec.run_finished("Top", since=mark)
    assert again["trigger"] == "restart"
    assert again["exit_status"] == 1
    assert jc.armed_at("Top") is None  # failed again: unscheduled again


def test_failed_abort_tree_stays_unscheduled_even_if_its_timer_was_edited_meanwhile(
    jc: JC,
) -> None:
    gate = jc.gate()
    jc.create(
        box("Top", timer="every 10s", on_error="abort", active=True),
        task("fails", f"{gate.command}; exit 1", "Top", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(10)  # the run starts and blocks on the gate
    jc.modify("Top", timer="every 20s")  # an edit while it runs re-evaluates the tree
    gate.open()
    assert jc.rec.run_finished("Top", since=mark)["exit_status"] == 1

    # The run failed and Top is ABORT: it must not run again until restarted.
    assert jc.job("Top").next_runs is None
    assert jc.armed_at("Top") is None
    mark = jc.rec.mark()
    assert jc.advance(3600) == 0
    assert jc.rec.started_jobs(since=mark) == []
    assert len(jc.runs("Top")) == 1


def test_failed_continue_tree_is_rearmed(jc: JC) -> None:
    jc.create(
        box("Top", timer="every 10s", on_error="continue", active=True),
        task("fails", "exit 1", "Top", active=True),
    )
    for n in (1, 2):
        mark = jc.rec.mark()
        jc.advance(10)
        assert jc.rec.run_finished("Top", since=mark)["exit_status"] == 1
        assert jc.armed_at("Top") == T0 + timedelta(seconds=10 * (n + 1))
        assert jc.job("Top").next_runs == T0 + timedelta(seconds=10 * (n + 1))


# ---------------------------------------------------------------- kill and timeout


def test_kill_of_a_long_task_is_255_up_the_chain_and_a_failure(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(
        box("Top", timer="every 10s", on_error="abort", active=True),
        box("Box", "Top", active=True),
        task("long", "sleep 1000", "Box", active=True),
        task("after", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    long_run = first_started(jc, "long", mark)
    jc.wait_task_process(long_run)

    root = jc.engine.kill("long", user=USER)
    top = jc.rec.run_finished("Top", since=mark)
    assert top["id"] == root
    runs = jc.tree_run(root)
    assert set(runs) == {"Top", "Box", "long"}  # later children do not run
    for name in ("long", "Box", "Top"):
        assert runs[name].exit_status == 255, name
        assert runs[name].state == "killed", name
        assert jc.job(name).exit_status == 255, name
    assert USER in (runs["long"].reason or "")
    # DESIGN decision 4: a kill is a failure, so the ABORT tree is not re-armed.
    assert jc.armed_at("Top") is None
    assert jc.job("Top").next_runs is None
    poll_until("the killed task to be gone", lambda: not jc.task_pids(long_run))


def test_a_sequence_queues_its_next_task_ahead_and_a_kill_runs_it_not(jc: JC) -> None:
    """While a task runs, the two after it wait as pending runs, each after the one
    before it (the worker recording an end takes the next in the same transaction);
    killing the tree drops them, and no run of them is left or recorded."""
    gate = jc.gate("g")
    jc.create(
        box("Seq", timer="every 10s", on_error="abort", active=True),
        task("t1", gate.command, "Seq", active=True),
        *(task(f"t{i}", "true", "Seq", active=True) for i in (2, 3, 4)),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    r1 = first_started(jc, "t1", mark)
    jc.wait_task_process(r1)

    def pending() -> list[tuple[str, int | None, bool | None]]:
        with jc.store.read() as conn:
            rows = conn.execute(
                select(run.c.id, run.c.job_name, run.c.after_run_id, run.c.after_ok_only)
                .where(run.c.state == str(RunState.PENDING))
                .order_by(run.c.id)
            ).all()
        ids = {r.id: r.job_name for r in rows}
        return [
            (r.job_name, ids.get(r.after_run_id, r.after_run_id), r.after_ok_only) for r in rows
        ]

    # Under an ABORT box, each is released only by a success; t4 waits for t2's start.
    assert pending() == [("t2", r1, True), ("t3", "t2", True)]

    root = jc.engine.kill("Seq", user=USER)
    jc.rec.run_finished("Seq", since=mark)
    assert set(jc.tree_run(root)) == {"Seq", "t1"}
    assert pending() == []
    assert jc.runs("t2") == []
    assert jc.runs("t3") == []
    assert jc.runs("t4") == []


def test_a_sequence_of_quick_tasks_runs_each_once_in_order(jc: JC) -> None:
    """Tasks taken ahead by the worker run once each, in order, and the box sees every end."""
    out = jc.tmp_path / "order"
    jc.create(
        box("Seq", timer="every 10s", active=True),
        *(task(f"t{i}", f"echo {i} >> {out}", "Seq", active=True) for i in range(1, 8)),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    assert jc.rec.run_finished("Seq", since=mark)["exit_status"] == 0
    assert out.read_text().split() == [str(i) for i in range(1, 8)]
    assert [len(jc.runs(f"t{i}")) for i in range(1, 8)] == [1] * 7


def _run_abort_chain(jc: JC, out: Path, second: str, **options: Any) -> dict[str, Any]:
    """ABORT sequence ``Seq`` of t1..t4, each appending its number to ``out`` (t2 runs
    ``second``, with ``options``), fired by its timer; its finished run."""
    jc.create(
        box("Seq", timer="every 10s", on_error="abort", active=True),
        task("t1", f"echo 1 >> {out}", "Seq", active=True),
        task("t2", second, "Seq", active=True, **options),
        *(task(f"t{i}", f"echo {i} >> {out}", "Seq", active=True) for i in (3, 4)),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    return jc.rec.run_finished("Seq", since=mark)


def test_a_task_taken_ahead_that_fails_releases_nothing_after_it_under_abort(jc: JC) -> None:
    """Quick tasks chain two deep on the worker: t2 failing stops the box there even when
    the worker recorded it before the dispatcher heard of t1's end, and t3 (queued after
    t2, released only by its success) never runs."""
    out = jc.tmp_path / "order"
    done = _run_abort_chain(jc, out, f"echo 2 >> {out}; exit 4")
    assert (done["state"], done["exit_status"]) == ("failed", 4)
    assert out.read_text().split() == ["1", "2"]
    assert (jc.runs("t3"), jc.runs("t4")) == ([], [])
    with jc.store.read() as conn:
        left = conn.execute(select(run.c.job_name).where(run.c.state == str(RunState.PENDING)))
        assert left.all() == []


def test_a_task_taken_ahead_that_fails_and_is_retried_goes_on_from_its_retry(
    jc: JC,
) -> None:
    """t2 may be retried, so only its success releases t3: its failed attempt runs
    nothing after it, its retry does, and every task after runs once, in order."""
    out, flag = jc.tmp_path / "order", jc.tmp_path / "failed-once"
    flaky = f"echo 2 >> {out}; test -e {flag} || {{ touch {flag}; exit 5; }}"
    done = _run_abort_chain(jc, out, flaky, retries=1)
    assert (done["state"], done["exit_status"]) == ("succeeded", 0)
    assert out.read_text().split() == ["1", "2", "2", "3", "4"]
    assert [(r.state, r.attempt) for r in sorted(jc.runs("t2"), key=lambda r: r.id)] == [
        (RunState.FAILED, 1),
        (RunState.SUCCEEDED, 2),
    ]
    assert [len(jc.runs(t)) for t in ("t1", "t3", "t4")] == [1, 1, 1]


def test_kill_stops_the_whole_process_tree_even_a_setsid_child(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    pidfile = jc.tmp_path / "escaped.pid"
    escape = "setsid sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 1000' & sleep 1000"
    jc.create(task("escaper", escape, active=True, env={"PIDFILE": str(pidfile)}))
    mark = jc.rec.mark()
    root = jc.run_now("escaper")

    def escaped_pid() -> int | None:
        try:
            text = pidfile.read_text()
            pid = int(text) if text.endswith("\n") else 0
            comm = Path(f"/proc/{pid}/comm").read_text().strip() if pid else ""
        except (OSError, ValueError):
            return None
        return pid if comm == "sleep" else None  # past its exec: a settled process

    escaped: int = poll_until("the setsid child", escaped_pid)
    assert os.getsid(escaped) == escaped  # it left the task's session and group
    # A task that keeps running has its pid recorded within PID_RECORD_DELAY.
    pid = poll_until("the task's pid to be recorded", lambda: jc.run(root).pid)
    assert os.getsid(escaped) != pid
    pids = jc.task_pids(root)
    assert escaped in pids
    assert len(pids) >= 3  # sh, its sleep, the escaped sleep

    jc.engine.kill("escaper", user=USER)
    assert jc.rec.run_finished("escaper", since=mark)["exit_status"] == 255
    poll_until("every process of the run to be gone", lambda: not jc.task_pids(root))
    assert not pid_alive(escaped)  # gone (at most a zombie its new parent has to reap)


def test_a_kill_is_recorded_once_what_ignored_the_term_is_dead(jc_sqlite: JC) -> None:
    """The task's shell died of the TERM and its end was recorded at once, while a child
    that ignores TERM lived on until the grace ran out: the job could be run again beside
    its killed instance. The end now waits for the kill, as a timeout's does."""
    jc = jc_sqlite
    stubborn = "(trap '' TERM; exec sleep 1000) & wait"
    jc.create(task("stubborn", stubborn, active=True))
    mark = jc.rec.mark()
    root = jc.run_now("stubborn")
    poll_until("the task and its child", lambda: len(jc.task_pids(root)) >= 2)

    jc.engine.kill("stubborn", user=USER)
    ended = jc.rec.run_finished("stubborn", since=mark)
    assert ended["exit_status"] == 255
    assert jc.task_pids(root) == []  # nothing of it alive once its end is recorded


def test_kill_of_a_task_waiting_for_a_free_slot_ends_it_at_once(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    jc = make_jc(sqlite_url, slots=1)
    jc.create(task("hog", "sleep 1000", active=True), task("starved", "true", active=True))
    mark = jc.rec.mark()
    hog = jc.run_now("hog")
    jc.wait_task_process(hog)
    starved = jc.run_now("starved")  # the only slot is taken: it stays queued
    assert jc.run(starved).state == "queued"

    jc.engine.kill("starved", user=USER)
    done = jc.rec.run_finished("starved", since=mark)
    assert done["exit_status"] == 255
    run = jc.run(starved)
    assert run.state == "killed"
    assert run.pid is None  # it never started
    assert jc.job("starved").exit_status == 255
    assert jc.run(hog).state == "running"  # the other tree is not touched


def test_kill_while_waiting_in_a_timed_box_ends_the_run_at_once(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(
        box("Absolute", box_type="timed", active=True),
        task("foo", "true", "Absolute", timer="daily 22:56", active=True),
        task("bar", "true", "Absolute", timer="daily 22:59", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(to=FOO_AT)
    jc.rec.wait_for(
        lambda s: s.name == "state_changed"
        and s.data["name"] == "Absolute"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    root = jc.engine.kill("Absolute", user=USER)
    done = jc.rec.run_finished("Absolute", since=mark)  # no clock move needed
    assert done["id"] == root
    assert done["exit_status"] == 255
    assert done["state"] == "killed"
    assert jc.clock.now() == FOO_AT
    assert ("wait", root) not in jc.timers.armed()
    assert set(jc.tree_run(root)) == {"Absolute", "foo"}  # bar never ran
    assert jc.job("Absolute").exit_status == 255
    assert jc.view("Absolute")["state"] == "idle"
    assert jc.run(root).reason == f"killed by {USER}"  # the box says who, as a task does
    assert jc.tree_run(root)["foo"].reason is None  # it ended before the kill


def test_a_killed_box_run_says_who_killed_it_as_its_task_does(jc_sqlite: JC) -> None:
    """``history`` of a killed tree: the box rows carried no reason while the task's said
    "killed by tester"; each row of the tree run says who killed it (BY stays who
    started it: the timer)."""
    jc = jc_sqlite
    jc.create(
        box("Top", timer="every 10s", active=True),
        box("Box", "Top", active=True),
        task("long", "sleep 1000", "Box", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    jc.wait_task_process(first_started(jc, "long", mark))
    root = jc.engine.kill("long", user=USER)
    jc.rec.run_finished("Top", since=mark)
    runs = jc.tree_run(root)
    assert {n: r.reason for n, r in runs.items()} == dict.fromkeys(
        ("Top", "Box", "long"), f"killed by {USER}"
    )
    assert {r.requested_by for r in runs.values()} == {"timer"}


def test_a_timer_of_a_tree_whose_timed_box_waits_says_it_waits_not_runs(jc: JC) -> None:
    """A timer that fires while its tree's TIMED box waits for a child's time records a
    skipped run; its reason said the box "is running" while ``ls`` showed it waiting."""
    jc.create(
        box("TW", box_type="timed", active=True),
        task("foo", "true", "TW", timer="every 3s", active=True),
        task("bar", "true", "TW", timer="every 2m", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(3)
    jc.rec.run_finished("foo", since=mark)
    assert jc.view("TW")["state"] == "waiting"
    jc.modify("foo", timer="every 4s")  # re-arms the tree: foo's time comes first
    assert jc.armed_at("TW") == T0 + timedelta(seconds=7)
    assert jc.advance(4) == 1
    (skipped,) = [r for r in jc.runs("TW") if r.state == "skipped"]
    assert skipped.reason == "tree busy: 'TW' is waiting for the time of 'bar'"


def test_timeout_gives_124_and_the_box_rules_apply(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(
        box("Top", on_error="abort", active=True),
        task("slow", "sleep 1000", "Top", timeout=0.5, active=True),
        task("after", "true", "Top", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("Top")
    top = jc.rec.run_finished("Top", since=mark, timeout=20)
    runs = jc.tree_run(root)
    assert runs["slow"].exit_status == 124
    assert runs["slow"].state == "failed"
    assert "timed out" in (runs["slow"].reason or "")
    assert "after" not in runs  # ABORT: stops at the timed-out child
    assert top["exit_status"] == 124
    poll_until("the timed-out task to be gone", lambda: not jc.task_pids(runs["slow"].id))

    jc.modify("Top", on_error="continue")
    mark = jc.rec.mark()
    root = jc.run_now("Top")
    top = jc.rec.run_finished("Top", since=mark, timeout=20)
    runs = jc.tree_run(root)
    assert runs["slow"].exit_status == 124
    assert runs["after"].state == "succeeded"  # CONTINUE: the next child runs
    assert top["exit_status"] == 124  # and the box still reports the failure


def test_a_timeout_of_weeks_waits_for_the_task_and_keeps_its_outcome_and_log(
    jc_sqlite: JC,
) -> None:
    """poll(2) takes an int of milliseconds (24.8 days at most): a longer timeout raised
    after the task had started, which ran on unsupervised while its run was recorded
    'could not run' (and each retry started another copy)."""
    jc = jc_sqlite
    jc.create(
        task(
            "weeks",
            "sleep 0.5; echo still-watched; exit 3",
            timeout=30 * 86400,
            retries=2,
            active=True,
        )
    )
    mark = jc.rec.mark()
    jc.run_now("weeks")
    done = jc.rec.run_finished("weeks", since=mark, timeout=20)
    assert (done["state"], done["exit_status"]) == ("failed", 3)
    run = jc.run(done["id"])
    assert "could not run" not in (run.reason or "")
    assert run.log_path
    assert "still-watched" in Path(run.log_path).read_text()


# ---------------------------------------------------------------- task environment and logs


def test_task_sees_its_job_run_id_env_and_cwd(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    workdir = jc.tmp_path / "work dir"
    workdir.mkdir()
    command = (
        'printf "%s|%s|%s|%s\\n" "$JOBCONTROL_JOB" "$JOBCONTROL_RUN_ID" "$GREETING" "$(pwd -P)"'
    )
    jc.create(
        task("env task", command, active=True, env={"GREETING": "hello world"}, cwd=str(workdir))
    )
    mark = jc.rec.mark()
    run_id = jc.run_now("env task")
    jc.rec.run_finished("env task", since=mark)
    log_path = jc.run(run_id).log_path
    assert log_path is not None
    expected = f"env task|{run_id}|hello world|{workdir.resolve()}\n"
    assert Path(log_path).read_text() == expected


def test_a_jobs_env_cannot_set_the_variables_its_processes_are_found_by(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """Kill and crash recovery find a task's processes by its marker: a job's ``env``
    naming those variables is refused when saved and, in a row written before that
    refusal, changes nothing, nor passes the task off as a worker process's (which the
    daemon's recovery leaves alone)."""
    jc = make_jc(sqlite_url, start=False)
    marker = ("JOBCONTROL_RUN_ID", "JOBCONTROL_INSTANCE", "JOBCONTROL_WORKER")
    command = 'printf "%s|%s|%s\n" "$JOBCONTROL_RUN_ID" "$JOBCONTROL_INSTANCE" "${JOBCONTROL_WORKER-unset}"'
    with pytest.raises(JobError, match="is Job Control's own"):
        jc.create(task("spoof", command, active=True, env={k: "spoofed" for k in marker}))
    jc.create(task("spoof", command, active=True))
    with jc.store.write() as conn:  # as a row written before that refusal could hold it
        queries.update_job(conn, jc.job("spoof").id, {"env": dict.fromkeys(marker, "x")}, None)
    jc.start()
    assert jc.job("spoof").env == dict.fromkeys(marker, "x")
    mark = jc.rec.mark()
    run_id = jc.run_now("spoof")
    jc.rec.run_finished("spoof", since=mark)
    log_path = jc.run(run_id).log_path
    assert log_path is not None
    assert Path(log_path).read_text() == f"{run_id}|{jc.instance_id}|unset\n"


def test_log_holds_stdout_and_stderr_and_empty_output_leaves_no_file(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(
        task("chatty", "echo to-stdout; echo to-stderr >&2; exit 4", active=True),
        task("quiet", "true", active=True),
    )
    mark = jc.rec.mark()
    chatty = jc.run_now("chatty")
    quiet = jc.run_now("quiet")
    jc.rec.run_finished("chatty", since=mark)
    jc.rec.run_finished("quiet", since=mark)

    log_path = jc.run(chatty).log_path
    assert log_path is not None
    assert Path(log_path).read_text().splitlines() == ["to-stdout", "to-stderr"]
    assert jc.run(chatty).exit_status == 4

    assert jc.run(quiet).log_path is None
    quiet_dir = jc.log_root / f"job-{jc.job('quiet').id}"
    assert not quiet_dir.exists() or list(quiet_dir.iterdir()) == []


def test_only_the_newest_max_log_files_are_kept(jc: JC) -> None:
    jc.create(task("rotating", 'echo "run $JOBCONTROL_RUN_ID"', max_log_files=2, active=True))
    run_ids = []
    for _ in range(4):
        mark = jc.rec.mark()
        run_ids.append(jc.run_now("rotating"))
        jc.rec.run_finished("rotating", since=mark)

    job_dir = jc.log_root / f"job-{jc.job('rotating').id}"
    kept = sorted(job_dir.iterdir())
    assert len(kept) == 2
    newest, second, *older = jc.runs("rotating")
    assert [r.id for r in (newest, second)] == run_ids[:1:-1]
    assert {newest.log_path, second.log_path} == {str(p) for p in kept}
    assert [r.log_path for r in older] == [None, None]
    for r in (newest, second):
        assert r.log_path is not None
        assert Path(r.log_path).read_text() == f"run {r.id}\n"


# ---------------------------------------------------------------- history


def test_history_lists_runs_newest_first_and_paginates(jc: JC) -> None:
    jc.create(
        box("Periodic", timer="every 10s", active=True),
        task("t", "true", "Periodic", active=True),
    )
    for _ in range(2):
        mark = jc.rec.mark()
        jc.advance(10)
        jc.rec.run_finished("Periodic", since=mark)
    mark = jc.rec.mark()
    jc.run_now("t")
    jc.rec.run_finished("t", since=mark)
    jc.modify("t", command="exit 2")
    mark = jc.rec.mark()
    jc.run_now("t")
    jc.rec.run_finished("t", since=mark)

    history = jc.runs("t")
    assert [(r.trigger, r.state, r.exit_status) for r in history] == [
        ("manual", "failed", 2),
        ("manual", "succeeded", 0),
        ("timer", "succeeded", 0),
        ("timer", "succeeded", 0),
    ]
    ids = [r.id for r in history]
    assert ids == sorted(ids, reverse=True)
    # Who started each run: the user of a manual run, "timer" for a timer's.
    assert [r.requested_by for r in history] == [USER, USER, "timer", "timer"]
    assert [r.started for r in history][2:] == [
        T0 + timedelta(seconds=20),
        T0 + timedelta(seconds=10),
    ]

    page1 = jc.runs("t", limit=3)
    page2 = jc.runs("t", limit=3, before_id=page1[-1].id)
    assert [r.id for r in page1 + page2] == ids
    assert jc.runs("t", limit=3, before_id=page2[-1].id) == []


def test_a_restarted_tree_records_who_restarted_it_and_the_timer_after(jc: JC) -> None:
    # The run a restart arms is the restarting user's, child runs included; once it
    # has run, the tree is re-armed by its timer, and the next run is the timer's.
    jc.create(
        box("Top", timer="every 10s", active=True),
        task("t", "true", "Top", active=True),
    )
    due = jc.engine.restart("Top", user="restarter").next_runs
    assert due is not None
    assert due > T0
    mark = jc.rec.mark()
    jc.advance(to=due)
    restarted = jc.rec.run_finished("Top", since=mark)
    assert (restarted["trigger"], restarted["requested_by"]) == ("restart", "restarter")
    runs = jc.tree_run(restarted["id"])
    assert {name: r.requested_by for name, r in runs.items()} == {
        "Top": "restarter",
        "t": "restarter",
    }
    mark = jc.rec.mark()
    jc.advance(10)
    timed = jc.rec.run_finished("Top", since=mark)
    assert (timed["trigger"], timed["requested_by"]) == ("timer", "timer")
    assert [r.requested_by for r in jc.runs("t")] == ["timer", "restarter"]


def test_a_short_task_records_its_pid_and_outcome_with_its_end(jc: JC) -> None:
    # Tasks shorter than PID_RECORD_DELAY write their pid with the outcome, in the
    # dispatcher's transaction: the run row still ends up complete.
    jc.create(task("quick", "echo out; echo err >&2", active=True))
    mark = jc.rec.mark()
    root = jc.run_now("quick")
    assert jc.rec.run_finished("quick", since=mark)["exit_status"] == 0
    run = jc.run(root)
    assert run.state == "succeeded"
    assert run.pid is not None
    assert run.ended is not None
    assert run.log_path is not None
    assert Path(run.log_path).read_text() == "out\nerr\n"


def test_a_task_killed_while_it_waits_for_a_slot_ran_for_no_time(
    db_url: str, make_jc: MakeJC
) -> None:
    """Killed while queued (no slot free): its run row and its job say it ran for 0 ms,
    not for the time it waited; the kill counts (255) as a failure."""
    jc = make_jc(db_url, slots=1)
    gate = jc.gate()
    jc.create(
        box("Busy", active=True),
        task("hold", gate.command, "Busy", active=True),
        box("Waits", active=True),
        task("waiting", "true", "Waits", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("Busy")
    held = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "hold", since=mark
    ).run["id"]
    jc.wait_task_process(held)
    jc.run_now("Waits")
    jc.sync()
    (queued,) = jc.runs("waiting")
    assert queued.state is RunState.QUEUED, queued
    jc.clock.set(jc.clock.now() + timedelta(seconds=2))  # it waits 2 s for the slot

    jc.engine.kill("Waits", user=USER)
    done = jc.rec.run_finished("waiting", since=mark)
    assert (done["state"], done["exit_status"], done["duration_ms"]) == ("killed", 255, 0)
    row = jc.run(queued.id)
    assert (row.started, row.duration_ms) == (None, 0)
    job = jc.job("waiting")
    assert (job.exit_status, job.last_duration_ms) == (255, 0)
    gate.open()
    jc.rec.run_finished("Busy", since=mark)
