"""The Inq test jobs (spec 9.2, ``testSetup.inq``) behave as Inq's docs describe.

Everything is created disabled, as in Inq; each test enables the jobs its
scenario needs. The clock is manual: nothing fires until a test moves it.
"""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest

from jobcontrol import JobChange, JobState
from tests.integration.helpers import JC, T0, USER, box, task

pytestmark = pytest.mark.timeout(60)

# A command that fails for sure and does not depend on gcc; 3 so a test can
# tell "the box reports gcc's status" from "the box reports some failure".
GCC_FAILS = "exit 3"

FOO_AT = T0.replace(hour=22, minute=56)
BAR_AT = T0.replace(hour=22, minute=59)


def testsetup(jc: JC, *, gcc: str = GCC_FAILS, foo: str = "ls -l") -> None:
    """The seven jobs of testSetup.inq, all disabled (spec 9.2)."""
    jc.create(
        box("Periodic", timer="every 10s", job_order=0),
        box("Box", "Periodic", on_error="abort", job_order=0),
        task("gcc error", gcc, "Box", job_order=0),
        task("no-op ok", "true", "Box", job_order=1),
        box("Absolute", box_type="timed", job_order=1),
        task("foo", foo, "Absolute", timer="daily 22:56", job_order=0),
        task("bar", "true", "Absolute", timer="daily 22:59", job_order=0),
    )


def enable(jc: JC, *names: str) -> None:
    jc.engine.modify_jobs([JobChange(n, {"active": True}) for n in names], user=USER)


def test_everything_starts_disabled_and_nothing_runs(jc: JC) -> None:
    testsetup(jc)
    assert jc.timers.armed() == {}
    assert jc.advance(3600 * 24) == 0
    assert jc.rec.signals("run_started") == []
    for job in jc.engine.list_jobs():
        assert job["active"] is False
        assert job["last_ran"] is None
        assert job["state"] == "idle"


def test_periodic_alone_fires_every_10s_after_each_run_and_children_do_nothing(jc: JC) -> None:
    testsetup(jc)
    enable(jc, "Periodic")
    assert jc.armed_at("Periodic") == T0 + timedelta(seconds=10)
    assert jc.job("Periodic").next_runs == T0 + timedelta(seconds=10)

    assert jc.advance(9.5) == 0  # not a moment early
    assert jc.rec.signals("run_started") == []

    for n in (1, 2, 3):
        mark = jc.rec.mark()
        assert jc.advance(0.5 if n == 1 else 10) == 1
        run = jc.rec.run_finished("Periodic", since=mark)
        fired_at = T0 + timedelta(seconds=10 * n)
        assert run["exit_status"] == 0
        assert run["trigger"] == "timer"
        periodic = jc.job("Periodic")
        assert periodic.last_ran == fired_at  # "Last Ran updates"
        assert periodic.next_runs == fired_at + timedelta(seconds=10)
        assert jc.armed_at("Periodic") == fired_at + timedelta(seconds=10)
        # The disabled children were not run, not even recorded as skipped.
        assert jc.rec.started_jobs(since=mark) == ["Periodic"]

    for name in ("Box", "gcc error", "no-op ok"):
        assert jc.job(name).last_ran is None
        assert jc.runs(name) == []
    assert [r.state for r in jc.runs("Periodic")] == ["succeeded"] * 3


def test_periodic_counts_its_10s_from_the_end_of_the_run(jc: JC) -> None:
    testsetup(jc)
    gate = jc.gate()
    jc.create(task("work", gate.command, "Periodic", active=True))
    enable(jc, "Periodic")

    mark = jc.rec.mark()
    jc.advance(10)  # the run starts at T0+10 and blocks on the gate
    assert jc.view("Periodic")["state"] == "running"
    assert jc.armed_at("Periodic") is None  # a running tree has no timer
    jc.advance(7)  # ... while the (manual) clock moves on
    assert jc.rec.finished_jobs(since=mark) == []
    gate.open()
    run = jc.rec.run_finished("Periodic", since=mark)

    assert run["duration_ms"] == 7000
    periodic = jc.job("Periodic")
    assert periodic.last_ran == T0 + timedelta(seconds=10)
    assert periodic.last_duration_ms == 7000
    # 10 s after the END (T0+17), not after the start or the previous firing.
    assert jc.armed_at("Periodic") == T0 + timedelta(seconds=27)
    assert periodic.next_runs == T0 + timedelta(seconds=27)

    gate.open()  # the next run's task will not block
    mark = jc.rec.mark()
    assert jc.advance(9.9) == 0
    assert jc.advance(0.1) == 1
    jc.rec.run_finished("Periodic", since=mark)
    assert jc.armed_at("Periodic") == T0 + timedelta(seconds=37)


def _enable_abort_scenario(jc: JC, gcc: str) -> None:
    testsetup(jc, gcc=gcc)
    enable(jc, "Periodic", "Box", "gcc error", "no-op ok")


def test_gcc_error_fails_and_abort_stops_before_no_op(jc: JC) -> None:
    _enable_abort_scenario(jc, GCC_FAILS)

    mark = jc.rec.mark()
    jc.advance(10)
    top = jc.rec.run_finished("Periodic", since=mark)

    runs = jc.tree_run(top["id"])
    assert set(runs) == {"Periodic", "Box", "gcc error"}  # no-op ok never started
    assert runs["gcc error"].exit_status == 3
    assert runs["gcc error"].state == "failed"
    # A box's status is its first non-zero child status: gcc's own, up the chain.
    assert runs["Box"].exit_status == 3
    assert runs["Periodic"].exit_status == 3
    assert jc.job("Box").exit_status == 3
    assert jc.job("Periodic").exit_status == 3
    assert jc.job("no-op ok").last_ran is None
    assert jc.runs("no-op ok") == []
    # Periodic is CONTINUE (Inq's default): it keeps firing after errors.
    assert jc.armed_at("Periodic") == T0 + timedelta(seconds=20)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_real_gcc_on_a_missing_file_fails_and_aborts_the_box(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    _enable_abort_scenario(jc, "gcc fred.c")
    jc.modify("gcc error", cwd=str(jc.tmp_path))  # where there is no fred.c

    mark = jc.rec.mark()
    jc.advance(10)
    top = jc.rec.run_finished("Periodic", since=mark)

    runs = jc.tree_run(top["id"])
    assert set(runs) == {"Periodic", "Box", "gcc error"}
    gcc_status = runs["gcc error"].exit_status
    assert gcc_status not in (0, None)
    assert runs["Box"].exit_status == gcc_status
    assert runs["Periodic"].exit_status == gcc_status
    assert jc.job("no-op ok").last_ran is None
    log_path = runs["gcc error"].log_path
    assert log_path is not None
    with open(log_path) as log:
        assert "fred.c" in log.read()  # gcc's complaint went to the job's log


def test_switching_box_to_continue_lets_no_op_run_and_box_still_reports_failure(
    jc: JC,
) -> None:
    _enable_abort_scenario(jc, GCC_FAILS)
    mark = jc.rec.mark()
    jc.advance(10)
    jc.rec.run_finished("Periodic", since=mark)
    assert jc.job("no-op ok").last_ran is None

    jc.modify("Box", on_error="continue")
    mark = jc.rec.mark()
    jc.advance(10)
    top = jc.rec.run_finished("Periodic", since=mark)

    runs = jc.tree_run(top["id"])
    assert set(runs) == {"Periodic", "Box", "gcc error", "no-op ok"}
    assert runs["no-op ok"].exit_status == 0
    assert runs["no-op ok"].state == "succeeded"
    assert runs["gcc error"].id < runs["no-op ok"].id  # job order: gcc first
    assert runs["Box"].exit_status == 3  # still the first failure
    assert runs["Periodic"].exit_status == 3
    assert jc.job("no-op ok").last_ran == T0 + timedelta(seconds=20)
    assert jc.job("no-op ok").exit_status == 0


def test_absolute_fires_at_foo_waits_for_bar_then_runs_bar(jc: JC) -> None:
    testsetup(jc)
    enable(jc, "Absolute", "foo", "bar")

    # Absolute has no timer of its own: it inherits its earliest child's.
    absolute = jc.job("Absolute")
    assert absolute.timer is None
    assert absolute.next_runs == FOO_AT
    assert jc.job("foo").next_runs == FOO_AT
    assert jc.job("bar").next_runs == BAR_AT
    assert jc.armed_at("Absolute") == FOO_AT

    mark = jc.rec.mark()
    assert jc.advance(to=FOO_AT - timedelta(seconds=1)) == 0
    assert jc.advance(to=FOO_AT) == 1
    foo = jc.rec.run_finished("foo", since=mark)
    assert foo["exit_status"] == 0

    # After foo the box waits for bar's time, and says so.
    jc.rec.wait_for(
        lambda s: s.name == "state_changed"
        and s.data["name"] == "Absolute"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    jc.sync()
    assert jc.view("Absolute")["state"] == "waiting"
    runs = jc.tree_run(foo["root_run_id"])
    assert runs["Absolute"].state == "waiting"
    assert "bar" not in runs
    assert jc.timers.armed()[("wait", runs["Absolute"].id)] == BAR_AT

    assert jc.advance(to=BAR_AT - timedelta(seconds=1)) == 0
    assert jc.rec.started_jobs(since=mark) == ["Absolute", "foo"]
    assert jc.view("Absolute")["state"] == "waiting"

    jc.advance(to=BAR_AT)
    top = jc.rec.run_finished("Absolute", since=mark)
    assert top["exit_status"] == 0
    runs = jc.tree_run(top["id"])
    assert runs["Absolute"].state == "succeeded"
    assert runs["bar"].started == BAR_AT
    assert runs["foo"].started == FOO_AT
    assert jc.job("bar").last_ran == BAR_AT
    assert jc.view("Absolute")["state"] == "idle"
    # Next firing: foo's time tomorrow.
    assert jc.armed_at("Absolute") == FOO_AT + timedelta(days=1)
    assert jc.job("Absolute").next_runs == FOO_AT + timedelta(days=1)


def test_children_sorted_by_next_runs_then_job_order_and_renumbered(jc: JC) -> None:
    # bar is created first and both say job_order 0; a timer-less child comes too.
    jc.create(
        box("Absolute", box_type="timed", active=True),
        task("bar", "true", "Absolute", timer="daily 22:59", job_order=0, active=True),
        task("foo", "true", "Absolute", timer="daily 22:56", job_order=0, active=True),
        task("untimed", "true", "Absolute", job_order=0, active=True),
    )
    order = {j["name"]: j["job_order"] for j in jc.engine.list_jobs()}
    assert order == {"Absolute": 0, "foo": 0, "bar": 1, "untimed": 2}
    children = [j["name"] for j in jc.engine.list_jobs() if j["depth"] == 1]
    assert children == ["foo", "bar", "untimed"]
    assert [jc.job(n).job_order for n in ("foo", "bar", "untimed")] == [0, 1, 2]

    # The Inq setup itself: foo 0, bar 1 once their timers count.
    jc.create(
        box("Absolute 2", box_type="timed"),
        task("foo 2", "true", "Absolute 2", timer="daily 22:56", job_order=0),
        task("bar 2", "true", "Absolute 2", timer="daily 22:59", job_order=0),
    )
    enable(jc, "Absolute 2", "foo 2", "bar 2")
    assert (jc.job("foo 2").job_order, jc.job("bar 2").job_order) == (0, 1)

    # Moving bar's time before foo's re-sorts them.
    jc.modify("bar", timer="daily 22:50")
    assert [jc.job(n).job_order for n in ("bar", "foo", "untimed")] == [0, 1, 2]
    assert jc.job("Absolute").next_runs == T0.replace(hour=22, minute=50)

    mark = jc.rec.mark()
    jc.advance(to=T0.replace(hour=22, minute=59))
    jc.rec.run_finished("Absolute", since=mark)
    ran = [n for n in jc.rec.finished_jobs(since=mark) if n in {"foo", "bar", "untimed"}]
    assert ran == ["bar", "foo", "untimed"]


def test_a_child_that_overruns_the_next_ones_time_makes_it_start_late_not_wait(
    jc: JC,
) -> None:
    gate = jc.gate()
    testsetup(jc, foo=gate.command)
    enable(jc, "Absolute", "foo", "bar")
    mark = jc.rec.mark()
    jc.advance(to=FOO_AT)
    jc.advance(to=BAR_AT + timedelta(minutes=1))  # foo is still running past bar's time
    assert jc.rec.finished_jobs(since=mark) == []
    gate.open()
    top = jc.rec.run_finished("Absolute", since=mark)

    runs = jc.tree_run(top["id"])
    assert runs["bar"].started == BAR_AT + timedelta(minutes=1)  # at once after foo
    waits = [
        s
        for s in jc.rec.signals("state_changed", since=mark)
        if s.data["state"] is JobState.WAITING
    ]
    assert waits == []


def test_a_timed_box_with_its_own_timer_waits_for_its_first_child(jc: JC) -> None:
    testsetup(jc)
    jc.modify("Absolute", timer="daily 22:00")  # its own timer overrides the children's
    enable(jc, "Absolute", "foo", "bar")
    assert jc.armed_at("Absolute") == T0.replace(hour=22, minute=0)

    mark = jc.rec.mark()
    jc.advance(to=T0.replace(hour=22, minute=0))
    jc.rec.wait_for(
        lambda s: s.name == "state_changed"
        and s.data["name"] == "Absolute"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    assert jc.rec.started_jobs(since=mark) == ["Absolute"]  # foo waits for 22:56
    jc.advance(to=FOO_AT)
    jc.rec.run_finished("foo", since=mark)
    jc.advance(to=BAR_AT)
    top = jc.rec.run_finished("Absolute", since=mark)
    runs = jc.tree_run(top["id"])
    assert (runs["foo"].started, runs["bar"].started) == (FOO_AT, BAR_AT)
