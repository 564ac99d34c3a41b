"""Pausing and resuming the timers: trees stay scheduled, nothing fires while paused.

Manual clock: a paused tree does not fire when its time passes; on resume a
missed time runs once (misfire ``run-once``) or is skipped for the next
occurrence (misfire ``skip``). Runs in flight are not affected.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.integration.helpers import JC, T0, box, task

pytestmark = pytest.mark.timeout(60)

AT = T0.replace(hour=13, minute=0)  # daily 13:00, an hour after the clock's start


def test_paused_tree_does_not_fire_and_runs_once_after_resume(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(task("nightly", "true", timer="daily 13:00", active=True, misfire="run-once"))
    assert jc.armed_at("nightly") == AT

    assert jc.dispatcher.pause_timers() == 1
    assert jc.dispatcher.paused
    assert jc.armed_at("nightly") is None  # no timer set...
    assert jc.job("nightly").next_runs == AT  # ...but still scheduled

    mark = jc.rec.mark()
    assert jc.advance(to=AT + timedelta(minutes=5)) == 0
    assert jc.rec.started_jobs(since=mark) == []

    assert jc.dispatcher.resume_timers() == 1
    assert not jc.dispatcher.paused
    assert jc.armed_at("nightly") == AT  # the missed time, due now
    jc.advance(0)
    run = jc.rec.run_finished("nightly", since=mark)
    assert run["trigger"] == "timer"
    assert jc.rec.started_jobs(since=mark) == ["nightly"]  # once, not twice
    assert jc.armed_at("nightly") == AT + timedelta(days=1)


def test_skip_misfire_waits_for_the_next_occurrence_after_resume(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(task("nightly", "true", timer="daily 13:00", active=True, misfire="skip"))
    jc.dispatcher.pause_timers()
    mark = jc.rec.mark()
    jc.advance(to=AT + timedelta(minutes=5))

    jc.dispatcher.resume_timers()
    assert jc.armed_at("nightly") == AT + timedelta(days=1)
    jc.advance(0)
    assert jc.rec.started_jobs(since=mark) == []
    assert jc.job("nightly").next_runs == AT + timedelta(days=1)


def test_a_tree_scheduled_while_paused_is_only_recorded(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.dispatcher.pause_timers()
    jc.create(task("later", "true", timer="daily 13:00", active=True))
    assert jc.job("later").next_runs == AT
    assert jc.armed_at("later") is None
    assert jc.advance(to=AT) == 0

    jc.dispatcher.resume_timers()
    assert jc.armed_at("later") == AT


def test_pause_leaves_runs_in_flight_alone(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    gate = jc.gate()
    jc.create(task("slow", gate.command, timer="daily 13:00", active=True))
    mark = jc.rec.mark()
    jc.advance(to=AT)  # fires: the run is in flight
    jc.rec.wait_for(lambda s: s.name == "run_started", since=mark)

    jc.dispatcher.pause_timers()
    gate.open()
    run = jc.rec.run_finished("slow", since=mark)
    assert run["state"] == "succeeded"
    # Re-armed after the run, but only recorded while paused.
    assert jc.job("slow").next_runs == AT + timedelta(days=1)
    assert jc.armed_at("slow") is None
    jc.dispatcher.resume_timers()
    assert jc.armed_at("slow") == AT + timedelta(days=1)


def test_pause_and_resume_are_idempotent(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(task("nightly", "true", timer="daily 13:00", active=True))
    jc.dispatcher.pause_timers()
    jc.dispatcher.pause_timers()
    assert jc.dispatcher.resume_timers() == 1
    assert jc.dispatcher.resume_timers() == 1
    assert jc.armed_at("nightly") == AT


def test_a_resume_keeps_the_times_not_missed_and_skips_on_the_grid(jc_sqlite: JC) -> None:
    """README: a time missed while the timers were paused follows ``misfire``; a time
    still ahead was not missed. A resume evaluated every tree from now: a never-run
    ``every 10m`` armed for 12:10 moved to 12:10:08, top-level or a TIMED box's child,
    and foo's missed ``every 5s`` went to now + 5 s, off its grid."""
    jc = jc_sqlite
    jc.create(
        task("Top", "true", timer="every 10m", misfire="skip", active=True),
        box("T", box_type="timed", misfire="skip", active=True),
        task("foo", "true", "T", timer="every 5s", active=True),
        task("bar", "true", "T", timer="every 10m", active=True),
    )
    ten = T0 + timedelta(minutes=10)
    assert (jc.armed_at("Top"), jc.job("bar").next_runs) == (ten, ten)
    jc.dispatcher.pause_timers()
    assert jc.advance(8) == 0  # foo's 12:00:05 passes while paused
    jc.dispatcher.resume_timers()
    on_grid = T0 + timedelta(seconds=10)
    shown = {n: jc.job(n).next_runs for n in ("Top", "T", "foo", "bar")}
    assert shown == {"Top": ten, "T": on_grid, "foo": on_grid, "bar": ten}
    assert (jc.armed_at("Top"), jc.armed_at("T")) == (ten, on_grid)
    assert jc.advance(0) == 0
