"""Where the port used to differ from Inq (issue 9, items 13-15), on the real engine.

The clock is manual: nothing fires until a test moves it, and every run's times
are the clock's, so the assertions name exact instants.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from jobcontrol import JobState
from tests.conftest import MakeJC
from tests.integration.helpers import JC, T0, USER, box, poll_until, task

pytestmark = pytest.mark.timeout(60)

A_AT = T0.replace(hour=22, minute=56)
DORMANT_AT = T0.replace(hour=22, minute=58)


def waits_of(jc: JC, name: str, since: int) -> list[object]:
    return [
        s.data["state"]
        for s in jc.rec.signals("state_changed", since=since)
        if s.data["name"] == name and s.data["state"] is JobState.WAITING
    ]


# ---------------------------------------------------------------- item 13


def test_a_timed_box_waits_for_an_inactive_childs_time_before_skipping_it(jc: JC) -> None:
    """Spec 7.6: the wait comes before the child's run, and only the run skips it."""
    jc.create(
        box("T", box_type="timed", active=True),
        task("a", "true", "T", timer="daily 22:56", active=True),
        # Inactive, but it has a time: its first child's, passed up (spec 4.5).
        box("Dormant", "T"),
        task("x", "true", "Dormant", timer="daily 22:58", active=True),
        task("untimed", "true", "T", active=True),
    )
    assert jc.job("Dormant").next_runs == DORMANT_AT
    assert [jc.job(n).job_order for n in ("a", "Dormant", "untimed")] == [0, 1, 2]
    assert jc.armed_at("T") == A_AT

    mark = jc.rec.mark()
    assert jc.advance(to=A_AT) == 1
    jc.rec.run_finished("a", since=mark)
    jc.sync()
    # After a, the box waits for Dormant's time; untimed has not started.
    assert jc.view("T")["state"] == "waiting"
    assert jc.rec.started_jobs(since=mark) == ["T", "a"]
    root = jc.rec.signals("run_started", since=mark)[0].run["id"]
    assert jc.timers.armed()[("wait", root)] == DORMANT_AT

    assert jc.advance(to=DORMANT_AT - timedelta(seconds=1)) == 0
    assert jc.rec.started_jobs(since=mark) == ["T", "a"]

    jc.advance(to=DORMANT_AT)
    top = jc.rec.run_finished("T", since=mark)
    assert top["exit_status"] == 0
    runs = jc.tree_run(top["id"])
    # Dormant was skipped (no run, no bookkeeping: spec 7.6), then untimed ran at its time.
    assert set(runs) == {"T", "a", "untimed"}
    assert runs["untimed"].started == DORMANT_AT
    assert jc.job("Dormant").last_ran is None
    assert jc.job("x").last_ran is None
    assert waits_of(jc, "T", mark) == [JobState.WAITING]


def test_a_box_rebuilt_while_it_waits_for_an_inactive_child_still_waits_for_it(
    jc: JC, caplog: pytest.LogCaptureFixture
) -> None:
    """After a rebuild from the database (an outage, a failed batch) the wait resumes as it was."""
    jc.create(
        box("T", box_type="timed", active=True),
        task("a", "true", "T", timer="daily 22:56", active=True),
        box("Dormant", "T"),
        task("x", "true", "Dormant", timer="daily 22:58", active=True),
        task("untimed", "true", "T", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(to=A_AT)
    jc.rec.run_finished("a", since=mark)
    jc.sync()
    root = jc.rec.signals("run_started", since=mark)[0].run["id"]
    assert jc.timers.armed()[("wait", root)] == DORMANT_AT

    def bug() -> None:
        raise RuntimeError("a bug: the dispatcher rebuilds from the database")

    caplog.set_level(logging.WARNING, logger="jobcontrol")
    failures = jc.dispatcher.stats.failures
    # A failed batch of two events is rolled back and rebuilt (README "Events that
    # arrive together"): hold the dispatcher so that both go in one batch.
    with jc.dispatcher.protocol.user_edit():
        seen = jc.dispatcher.stats.events
        jc.dispatcher.post((lambda: None, None))
        poll_until("the dispatcher takes the event", lambda: jc.dispatcher.stats.events > seen)
        jc.dispatcher.post((bug, None))
        jc.dispatcher.post((lambda: None, None))
    jc.sync()
    assert jc.dispatcher.stats.failures == failures + 1
    assert "dispatcher rebuilt from the database" in caplog.text
    jc.errors.records.clear()  # that failure was the point
    assert jc.timers.armed()[("wait", root)] == DORMANT_AT
    assert jc.view("T")["state"] == "waiting"

    jc.advance(to=DORMANT_AT)
    top = jc.rec.run_finished("T", since=mark)
    runs = jc.tree_run(top["id"])
    assert set(runs) == {"T", "a", "untimed"}
    assert runs["untimed"].started == DORMANT_AT


def test_an_inactive_task_in_a_timed_box_is_skipped_at_once(jc: JC) -> None:
    """An inactive task's own timer does not count (spec 4.5): it has no time to wait for."""
    jc.create(
        box("T", box_type="timed", active=True),
        task("a", "true", "T", timer="daily 22:56", active=True),
        task("off", "true", "T", timer="daily 22:58"),
        task("untimed", "true", "T", active=True),
    )
    assert jc.job("off").next_runs is None
    mark = jc.rec.mark()
    jc.advance(to=A_AT)
    top = jc.rec.run_finished("T", since=mark)
    runs = jc.tree_run(top["id"])
    assert set(runs) == {"T", "a", "untimed"}
    assert runs["untimed"].started == A_AT
    assert waits_of(jc, "T", mark) == []


# ---------------------------------------------------------------- item 14


@pytest.mark.parametrize("box_type", ["timed", "sequence"])
def test_every_on_a_child_counts_from_the_trees_completion(jc: JC, box_type: str) -> None:
    """Inq re-evaluates ``now + 3s`` when the tree completes, not 3 s after the child ended."""
    gate = jc.gate()
    jc.create(
        box("T", box_type=box_type, active=True),
        task("tick", "true", "T", timer="every 3s", active=True),
        task("slow", gate.command, "T", active=True),
    )
    assert jc.armed_at("T") == T0 + timedelta(seconds=3)

    mark = jc.rec.mark()
    jc.advance(3)
    tick = jc.rec.run_finished("tick", since=mark)
    assert tick["exit_status"] == 0
    jc.rec.wait_for(lambda s: s.name == "run_started" and s.run["job_name"] == "slow", since=mark)
    jc.advance(10)  # slow runs past tick's old next time (T0 + 6 s)
    gate.open()
    assert jc.rec.run_finished("T", since=mark)["exit_status"] == 0
    jc.sync()

    done = T0 + timedelta(seconds=13)
    assert jc.job("tick").last_end == T0 + timedelta(seconds=3)
    assert jc.armed_at("T") == done + timedelta(seconds=3)
    assert jc.job("T").next_runs == done + timedelta(seconds=3)
    assert jc.job("tick").next_runs == done + timedelta(seconds=3)
    # Nothing re-fires at once.
    again = jc.rec.mark()
    assert jc.advance(0) == 0
    assert jc.advance(2.9) == 0
    assert jc.rec.started_jobs(since=again) == []
    gate.open()  # for slow's next run
    assert jc.advance(0.1) == 1
    assert jc.rec.run_finished("T", since=again)["exit_status"] == 0


def test_every_after_a_manual_run_counts_from_its_completion(jc: JC) -> None:
    gate = jc.gate()
    jc.create(
        box("T", active=True),
        task("tick", "true", "T", timer="every 3s", active=True),
        task("slow", gate.command, "T", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("T")
    jc.rec.wait_for(lambda s: s.name == "run_started" and s.run["job_name"] == "slow", since=mark)
    jc.advance(10)  # the timer fires during the run: recorded skipped, re-armed
    gate.open()
    top = jc.rec.run_finished("T", since=mark)
    assert top["trigger"] == "manual"
    jc.sync()

    assert jc.armed_at("T") == T0 + timedelta(seconds=13)
    again = jc.rec.mark()
    assert jc.advance(0) == 0
    assert jc.rec.started_jobs(since=again) == []


# ---------------------------------------------------------------- item 15


def test_restart_after_a_failure_arms_a_time_after_now(jc: JC) -> None:
    jc.create(
        box("Top", timer="every 10s", on_error="abort", active=True),
        task("fails", "exit 1", "Top", active=True),
        box("Nightly", timer="daily 22:56", on_error="abort", active=True),
        task("fails too", "exit 1", "Nightly", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(to=A_AT)  # both fire and fail
    assert jc.rec.run_finished("Top", since=mark)["exit_status"] == 1
    assert jc.rec.run_finished("Nightly", since=mark)["exit_status"] == 1
    jc.sync()
    assert (jc.job("Top").next_runs, jc.job("Nightly").next_runs) == (None, None)

    later = A_AT + timedelta(hours=1)
    jc.advance(to=later)
    # every: as Inq's "now + 10 s", counted from the restart.
    assert jc.engine.restart("Top", user=USER).next_runs == later + timedelta(seconds=10)
    # daily: the next 22:56 after now, not today's (already past).
    assert jc.engine.restart("Nightly", user=USER).next_runs == A_AT + timedelta(days=1)
    assert jc.job("Top").next_runs == jc.armed_at("Top") == later + timedelta(seconds=10)
    assert jc.job("Nightly").next_runs == jc.armed_at("Nightly") == A_AT + timedelta(days=1)

    mark = jc.rec.mark()
    assert jc.advance(0) == 0  # nothing fires at once
    assert jc.advance(9.9) == 0
    assert jc.advance(0.1) == 1
    assert jc.rec.run_finished("Top", since=mark)["trigger"] == "restart"


def test_restart_of_an_inactive_top_level_job_arms_nothing(jc: JC) -> None:
    jc.create(box("Idle", timer="every 10s"), task("t", "true", "Idle", active=True))
    # As in Inq, an inactive top-level job shows when its timer would fire.
    assert jc.job("Idle").next_runs == T0 + timedelta(seconds=10)

    result = jc.engine.restart("Idle", user=USER)
    assert result.next_runs is None
    assert result.not_armed == "it is inactive; activate it to schedule it"
    assert jc.armed_at("Idle") is None
    assert jc.job("Idle").next_runs is None  # Inq: jobComplete sets NextRuns to null
    assert jc.advance(60) == 0

    # Activating it schedules it again.
    jc.modify("Idle", active=True)
    assert jc.armed_at("Idle") == T0 + timedelta(seconds=70)


def test_a_waiting_timed_box_follows_an_edit_of_the_child_it_waits_for(jc: JC) -> None:
    """The box waits for a child's time; an edit moves that time (``ls`` shows it): the
    wait follows it, and the child runs at the time shown, not at its old one. A child
    deleted while it is waited for is waited for no more: its box goes on at once."""
    jc.create(
        box("T", box_type="timed", active=True),
        task("a", "true", "T", timer="daily 22:56", active=True),
        task("later", "true", "T", timer="daily 23:30", active=True),
        task("untimed", "true", "T", active=True),
        box("U", box_type="timed", active=True),
        task("b", "true", "U", timer="daily 22:56", active=True),
        task("gone", "true", "U", timer="daily 23:30", active=True),
        task("after", "true", "U", active=True),
    )
    mark = jc.rec.mark()
    assert jc.advance(to=A_AT) == 2
    jc.rec.run_finished("a", since=mark)
    jc.rec.run_finished("b", since=mark)
    jc.sync()
    roots = {s.run["job_name"]: s.run["id"] for s in jc.rec.signals("run_started", since=mark)}
    was = T0.replace(hour=23, minute=30)
    assert jc.timers.armed()[("wait", roots["T"])] == was
    assert jc.timers.armed()[("wait", roots["U"])] == was

    jc.modify("later", timer="daily 23:00")
    moved = T0.replace(hour=23, minute=0)
    assert jc.job("later").next_runs == moved
    assert jc.timers.armed()[("wait", roots["T"])] == moved

    jc.engine.delete_jobs(["gone"], user=USER)  # waited for: U goes on now
    u = jc.rec.run_finished("U", since=mark)
    assert jc.tree_run(u["id"])["after"].started == A_AT
    assert ("wait", roots["U"]) not in jc.timers.armed()

    jc.advance(to=moved)
    t = jc.rec.run_finished("T", since=mark)
    runs = jc.tree_run(t["id"])
    assert (runs["later"].started, runs["untimed"].started) == (moved, moved)


def test_activating_or_retiming_a_tree_never_fires_a_time_that_passed_meanwhile(
    jc: JC,
) -> None:
    """Spec 5.5: a change to a tree's timer or to ``active`` re-arms it as a restart does.
    A tree activated after an idle spell longer than its ``every``, or whose ``every``
    an edit makes shorter than the time since its last run, is not run at once: its
    next time is the first after now (misfire is for times missed while the daemon
    was down)."""
    jc.create(
        box("Tick", timer="every 5s", active=True),
        task("t", "true", "Tick", active=True),
        box("Slow", timer="every 1h", active=True),
        task("s", "true", "Slow", active=True),
    )
    mark = jc.rec.mark()
    assert jc.advance(5) == 1  # Tick runs once: its next time is 5 s after its end
    ended = jc.rec.run_finished("Tick", since=mark)
    jc.wait_quiet()
    jc.modify("Tick", active=False)
    assert jc.advance(30) == 0  # inactive: nothing fires

    now = jc.clock.now()
    jc.modify("Tick", active=True)
    assert jc.armed_at("Tick") == now + timedelta(seconds=5), "as Inq's now + 5 s"
    assert jc.advance(0) == 0, "activated: not run at once"
    assert jc.runs("Tick")[0].id == ended["id"]

    # Slow last ran long ago by its new timer's measure: made `every 10s`, not run at once.
    jc.advance(to=now + timedelta(minutes=2))
    now = jc.clock.now()
    jc.modify("Slow", timer="every 10s")
    armed = jc.armed_at("Slow")
    assert armed == now + timedelta(seconds=10), (armed, now)
    assert jc.job("Slow").next_runs == armed
    assert jc.runs("Slow") == []


def test_a_daemon_restarted_keeps_a_time_armed_that_has_not_come(
    db_url: str, make_jc: MakeJC
) -> None:
    """A tree an edit re-armed from now (``every 10m``: 10 min after the edit, spec 5.5)
    and a ``daily`` made later in the day: a daemon restarted 2 s later must not take
    them as missed because, counted from their last runs, their times are past. Nothing
    was missed: the times armed have not come (misfire is for times that passed)."""
    first = make_jc(db_url)
    first.create(
        box("Tick", timer="every 10m"),
        task("t", "true", "Tick", active=True),
        box("Daily", timer="daily 09:00"),
        task("d", "true", "Daily", active=True),
    )
    for name in ("Tick", "Daily"):
        mark = first.rec.mark()
        first.run_now(name)
        first.rec.run_finished(name, since=mark)
    first.wait_quiet()
    first.advance(to=T0 + timedelta(hours=1))  # T0 is 12:00: 09:00 has passed today
    first.modify("Tick", active=True)
    first.modify("Daily", active=True)
    first.modify("Daily", timer="daily 12:30")
    tick, daily = first.armed_at("Tick"), first.armed_at("Daily")
    assert tick == T0 + timedelta(hours=1, minutes=10)
    assert daily == T0 + timedelta(days=1, minutes=30)  # tomorrow 12:30
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(hours=1, seconds=2))
    second.start()
    assert (second.armed_at("Tick"), second.armed_at("Daily")) == (tick, daily)
    assert second.advance(0) == 0, "nothing was missed: nothing runs at once"
    assert [len(second.runs(n)) for n in ("Tick", "Daily")] == [1, 1]


@pytest.mark.parametrize(("misfire", "runs"), [("run-once", 1), ("skip", 0)])
def test_a_never_run_daily_whose_time_passed_while_no_daemon_ran_is_a_missed_run(
    db_url: str, make_jc: MakeJC, misfire: str, runs: int
) -> None:
    """A ``daily`` that never ran counts from now: at a start after its first time had
    passed, its next time was tomorrow and the day's run was lost, whatever ``misfire``
    said. The time it was armed for passed: ``misfire`` decides."""
    first = make_jc(db_url)
    first.create(
        box("Daily", timer="daily 12:30", misfire=misfire, active=True),
        task("d", "true", "Daily", active=True),
        box("Cron", timer="cron 30 12 * * *", misfire=misfire, active=True),
        task("c", "true", "Cron", active=True),
    )
    armed = T0 + timedelta(minutes=30)  # T0 is 12:00
    assert (first.armed_at("Daily"), first.armed_at("Cron")) == (armed, armed)
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(armed + timedelta(seconds=5))  # down while 12:30 came
    second.start()
    assert second.advance(0) == 2 * runs
    tomorrow = armed + timedelta(days=1)
    if runs:
        for name in ("Daily", "Cron"):
            assert len(second.runs(name)) == 1, name
    else:
        assert (second.armed_at("Daily"), second.armed_at("Cron")) == (tomorrow, tomorrow)


def test_a_never_run_every_keeps_its_time_across_restarts_sooner_than_its_interval(
    db_url: str, make_jc: MakeJC
) -> None:
    """A never-run ``every 30s`` counts from now: each start 20 s apart moved it 30 s on,
    and it never ran. The time armed first is kept, and comes."""
    first = make_jc(db_url)
    first.create(
        box("Half", timer="every 30s", active=True), task("h", "true", "Half", active=True)
    )
    armed = first.armed_at("Half")
    assert armed == T0 + timedelta(seconds=30)
    first.close()
    for seconds in (10, 20):  # two starts, each sooner than the interval after the last
        again = make_jc(db_url, start=False)
        again.clock.set(T0 + timedelta(seconds=seconds))
        again.start()
        assert again.armed_at("Half") == armed
        assert again.advance(0) == 0
        if seconds == 20:
            mark = again.rec.mark()
            assert again.advance(to=armed) == 1
            again.rec.run_finished("Half", since=mark)
        again.close()


def test_an_abort_tree_a_failure_left_unscheduled_is_armed_from_now_at_a_start(
    db_url: str, make_jc: MakeJC
) -> None:
    """Spec 7.9: a failed ABORT tree stays unscheduled until restarted; a restart of Job
    Control re-arms it (7.4), from now. It ran again at once: counted from its last end,
    its time was long past and ``misfire: run-once`` took it for a missed run."""
    first = make_jc(db_url)
    first.create(
        box("Deploy", timer="every 5s", on_error="abort", active=True),
        task("step", "exit 1", "Deploy", active=True),
    )
    mark = first.rec.mark()
    assert first.advance(5) == 1
    assert first.rec.run_finished("Deploy", since=mark)["exit_status"] == 1
    first.wait_quiet()
    assert first.job("Deploy").next_runs is None
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(minutes=10))
    second.start()
    assert second.advance(0) == 0, "nothing was missed"
    assert second.armed_at("Deploy") == T0 + timedelta(minutes=10, seconds=5)
    assert len(second.runs("Deploy")) == 1


def test_an_edit_with_no_daemon_clears_the_time_armed_and_the_next_start_arms_from_now(
    db_url: str, make_jc: MakeJC
) -> None:
    """A time stored is one a daemon armed: an edit made with no daemon running (the CLI
    offline) that changes when a tree runs clears it, as a daemon would re-arm it."""
    from jobcontrol.service.engine import Engine, JobChange

    first = make_jc(db_url)
    first.create(box("Hourly", timer="every 1h", active=True), task("x", "true", "Hourly"))
    assert first.armed_at("Hourly") == T0 + timedelta(hours=1)
    store = first.store
    first.close()
    Engine(store).modify_jobs([JobChange("Hourly", {"timer": "every 10s"})], user=USER)
    with store.read() as conn:
        from jobcontrol.store import queries

        (hourly,) = [j for j in queries.load_all_jobs(conn) if j.name == "Hourly"]
    assert hourly.next_runs is None

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(minutes=1))
    second.start()
    assert second.armed_at("Hourly") == T0 + timedelta(minutes=1, seconds=10)
    assert second.advance(0) == 0


def test_restart_of_a_tree_with_no_time_left_says_so(jc: JC) -> None:
    jc.create(
        box("Once", timer="at 2026-11-22T13:00", active=True),
        task("t", "true", "Once", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(to=T0.replace(hour=13))
    assert jc.rec.run_finished("Once", since=mark)["exit_status"] == 0
    assert jc.job("Once").next_runs is None  # it ran: an `at` fires once

    result = jc.engine.restart("Once", user=USER)
    assert result.next_runs is None
    assert result.not_armed == "no schedule in its tree gives a time after now"
    assert jc.armed_at("Once") is None
    assert jc.advance(3600) == 0


def test_a_run_is_logged_once_committed_and_a_rolled_back_one_not_at_all(
    jc: JC, caplog: pytest.LogCaptureFixture
) -> None:
    """Inq's lines for a run come after the transaction that did it has committed, in
    the order it did them; a transaction rolled back writes none of its lines."""
    caplog.set_level(logging.INFO, logger="jobcontrol")
    jc.create(box("T", timer="every 10s", active=True), task("a", "true", "T", active=True))
    mark = jc.rec.mark()
    jc.advance(10)
    jc.rec.run_finished("T", since=mark)
    jc.sync()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("jobcontrol.dispatch")]
    wanted = [
        "Running Task a",
        "Job a completed exit status 0",
        "Job T completed exit status 0",
        "Restarting timer for job T : runs",
    ]
    at = [next(i for i, line in enumerate(lines) if line.startswith(w)) for w in wanted]
    assert at == sorted(at), lines

    log = logging.getLogger("jobcontrol.dispatch.dispatcher")

    def logs_then_fails() -> None:
        jc.dispatcher.tx.log(log, "a line of a transaction rolled back")
        raise RuntimeError("a bug: the batch rolls back")

    def logs() -> None:
        jc.dispatcher.tx.log(log, "a line of a transaction committed")

    with jc.dispatcher.protocol.user_edit():  # both in one batch, rolled back together
        seen = jc.dispatcher.stats.events
        jc.dispatcher.post((lambda: None, None))
        poll_until("the dispatcher takes the event", lambda: jc.dispatcher.stats.events > seen)
        jc.dispatcher.post((logs, None))
        jc.dispatcher.post((logs_then_fails, None))
    jc.sync()
    jc.dispatcher.call(logs).result(10)  # a request is handled alone: committed
    jc.errors.records.clear()  # the bug was the point
    said = [r.getMessage() for r in caplog.records]
    assert "a line of a transaction rolled back" not in said
    assert said.count("a line of a transaction committed") == 1


def test_timers_paused_stay_paused_across_a_daemon_restart(db_url: str, make_jc: MakeJC) -> None:
    """A pause is what holds every tree through maintenance: a daemon restarted meanwhile
    (a crash, an upgrade) came back with its timers running and fired what was held."""
    first = make_jc(db_url)
    first.create(
        box("Tick", timer="every 10s", active=True), task("t", "true", "Tick", active=True)
    )
    assert first.dispatcher.pause_timers() == 1
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(minutes=5))  # Tick's time came while no daemon ran
    second.start()
    assert second.dispatcher.paused
    assert second.advance(60) == 0, "held: nothing fires"
    assert second.runs("Tick") == []
    mark = second.rec.mark()
    second.dispatcher.resume_timers()
    assert second.advance(0) == 1, "resumed: the time missed runs once (run-once)"
    second.rec.run_finished("Tick", since=mark)
    second.close()

    third = make_jc(db_url, start=False)
    third.clock.set(T0 + timedelta(minutes=10))
    third.start()
    assert not third.dispatcher.paused, "a resume is kept too"


def test_a_timed_box_whose_time_was_skipped_runs_each_child_at_its_own_time(
    db_url: str, make_jc: MakeJC
) -> None:
    """``misfire: skip`` moved only the tree's time: a TIMED box's children kept theirs,
    past, and ran back to back at the box's new time, at times their schedules never
    name. Each timer of the tree that is past moves to its own next time, and the box's
    children are sorted by them again (spec 4.5): bar's time is still to come, foo's
    next is the day after."""
    first = make_jc(db_url)
    first.create(
        box("Absolute", box_type="timed", misfire="skip", active=True),
        task("foo", "true", "Absolute", timer="daily 12:30", active=True),
        task("bar", "true", "Absolute", timer="daily 12:33", active=True),
    )
    today, day = T0 + timedelta(minutes=30), timedelta(days=1)  # T0 is 12:00
    mark = first.rec.mark()
    first.advance(to=today)
    first.advance(to=today + timedelta(minutes=3))
    first.rec.run_finished("Absolute", since=mark)  # one whole cycle: foo, then bar
    assert first.armed_at("Absolute") == today + day
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(today + day + timedelta(minutes=1))  # down while foo's 12:30 came
    second.start()
    bar_at, foo_at = today + day + timedelta(minutes=3), today + 2 * day
    assert second.armed_at("Absolute") == bar_at
    shown = {n: second.job(n).next_runs for n in ("Absolute", "foo", "bar")}
    assert shown == {"Absolute": bar_at, "foo": foo_at, "bar": bar_at}

    mark = second.rec.mark()
    assert second.advance(to=bar_at) == 1
    second.rec.run_finished("bar", since=mark)
    second.rec.wait_for(  # the box waits for foo's time
        lambda s: s.name == "state_changed"
        and s.data["name"] == "Absolute"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    assert len(second.runs("foo")) == 1  # yesterday's only: not at bar's time
    assert second.job("foo").next_runs == foo_at


def test_an_inactive_tree_shows_its_schedule_evaluated_at_each_start(
    db_url: str, make_jc: MakeJC
) -> None:
    """Spec 4.2, 4.5: a start evaluates every top-level timer, active or not. An inactive
    tree kept the time stored last, past by the next start (never armed: nothing fires)."""
    first = make_jc(db_url)
    first.create(task("Idle", "true", timer="every 10s"))
    assert first.job("Idle").next_runs == T0 + timedelta(seconds=10)
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(minutes=5))
    second.start()
    assert second.job("Idle").next_runs == T0 + timedelta(minutes=5, seconds=10)
    assert second.armed_at("Idle") is None
    assert second.advance(0) == 0


def test_a_skip_at_a_start_moves_only_the_timed_childrens_times_that_passed(
    db_url: str, make_jc: MakeJC
) -> None:
    """README "Missed runs": a skip moves the timers of the tree that are past, each to
    its own next occurrence; a time still ahead when the daemon starts keeps the time it
    was armed for. A never-run ``every`` child counts from now: a start moved bar's
    10-minute time by the whole downtime, and foo's missed time to now + 5 s, off the
    grid a top-level ``every`` that missed its time is moved on."""
    first = make_jc(db_url)
    first.create(
        box("T", box_type="timed", misfire="skip", active=True),
        task("foo", "true", "T", timer="every 5s", active=True),
        task("bar", "true", "T", timer="every 10m", active=True),
        task("Top", "true", timer="every 5s", misfire="skip", active=True),
    )
    assert first.job("bar").next_runs == T0 + timedelta(minutes=10)
    assert first.armed_at("T") == first.armed_at("Top") == T0 + timedelta(seconds=5)
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(seconds=8))  # down while foo's and Top's time came
    second.start()
    on_grid = T0 + timedelta(seconds=10)
    shown = {n: second.job(n).next_runs for n in ("T", "foo", "bar", "Top")}
    assert shown == {
        "T": on_grid,
        "foo": on_grid,
        "bar": T0 + timedelta(minutes=10),  # not missed: kept
        "Top": on_grid,
    }
    assert second.armed_at("T") == on_grid
    assert second.advance(0) == 0


def test_a_run_once_at_a_start_runs_the_missed_child_and_keeps_the_others_time(
    db_url: str, make_jc: MakeJC
) -> None:
    """``misfire: run-once``: the missed time runs at once (foo, even though a never-run
    ``every`` counted from now is 5 s ahead), and the TIMED box then waits for bar's
    time as it was armed, not for now + 10 minutes."""
    first = make_jc(db_url)
    first.create(
        box("T", box_type="timed", misfire="run-once", active=True),
        task("foo", "true", "T", timer="every 5s", active=True),
        task("bar", "true", "T", timer="every 10m", active=True),
    )
    first.close()

    second = make_jc(db_url, start=False)
    second.clock.set(T0 + timedelta(seconds=8))
    second.start()
    mark = second.rec.mark()
    assert second.advance(0) == 1
    second.rec.run_finished("foo", since=mark)
    second.rec.wait_for(
        lambda s: s.name == "state_changed"
        and s.data["name"] == "T"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    assert second.job("bar").next_runs == T0 + timedelta(minutes=10)
    assert second.runs("bar") == []
    second.advance(to=T0 + timedelta(minutes=10))
    assert second.rec.run_finished("T", since=mark)["exit_status"] == 0
    assert [r.started for r in second.runs("bar")] == [T0 + timedelta(minutes=10)]
