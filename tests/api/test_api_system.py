"""The dispatcher's routes: health, status, pause / resume, log level, shutdown, metrics."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from jobcontrol.api import system
from jobcontrol.service.audit import list_entries
from jobcontrol.store import lanes as store_lanes
from tests.api.conftest import Api
from tests.integration.helpers import T0, poll_until, task

pytestmark = pytest.mark.timeout(60)

AT = T0.replace(hour=13, minute=0)
V1 = "/api/v1"


# ---------------------------------------------------------------- health and status


def test_healthz_needs_no_token_and_says_503_once_stopped(api: Api) -> None:
    response = api.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}

    api.jc.dispatcher.stop(timeout=10)
    response = api.client.get("/healthz")
    assert response.status_code == 503


def test_status_shows_timers_runs_and_state(api: Api) -> None:
    gate = api.jc.gate()
    api.jc.create(
        task("nightly", "true", timer="daily 13:00", active=True),
        task("slow", gate.command),
    )
    mark = api.jc.rec.mark()
    run_id = api.jc.run_now("slow")
    api.jc.rec.wait_for(lambda s: s.name == "run_started", since=mark)

    body = api.client.get("/api/v1/status", headers=api.headers("viewer")).json()
    assert body["version"] == "test"
    assert body["tree_state"] == "idle"
    assert body["paused"] is False
    assert body["timers_armed"] == 1
    assert body["next_timers"] == [{"job": "nightly", "at": AT.isoformat()}]
    [running] = body["runs_in_flight"]
    assert (running["job"], running["run_id"]) == ("slow", run_id)
    assert running["started"] == T0.isoformat()
    assert body["event_seq"] == api.ctx.eventlog.last_seq
    assert body["uptime_s"] >= 0
    gate.open()
    api.jc.rec.run_finished("slow", since=mark)


# ---------------------------------------------------------------- pause and resume


def test_pause_stops_a_due_timer_and_resume_fires_it(api: Api) -> None:
    api.jc.create(task("nightly", "true", timer="daily 13:00", active=True))
    response = api.client.post("/api/v1/timers/pause", headers=api.headers("operator"))
    assert response.status_code == 200
    assert response.json() == {"paused": True, "timers_armed": 1}
    status = api.client.get("/api/v1/status", headers=api.headers("viewer")).json()
    assert status["paused"] is True
    assert status["next_timers"] == [{"job": "nightly", "at": AT.isoformat()}]

    mark = api.jc.rec.mark()
    api.jc.advance(to=AT + timedelta(minutes=1))
    assert api.jc.rec.started_jobs(since=mark) == []

    response = api.client.post("/api/v1/timers/resume", headers=api.headers("operator"))
    assert response.status_code == 200
    assert response.json()["paused"] is False
    api.jc.advance(0)
    assert api.jc.rec.run_finished("nightly", since=mark)["trigger"] == "timer"

    ops = [(e.user, e.operation, e.result) for e in list_entries(api.jc.store)]
    assert ("operator-user", "timers.pause", "ok") in ops
    assert ("operator-user", "timers.resume", "ok") in ops


@pytest.mark.parametrize("path", ["/api/v1/timers/pause", "/api/v1/timers/resume"])
def test_a_viewer_may_not_pause_or_resume(api: Api, path: str) -> None:
    assert api.client.post(path).status_code == 401
    response = api.client.post(path, headers=api.headers("viewer"))
    assert response.status_code == 403
    assert not api.jc.dispatcher.paused


# ---------------------------------------------------------------- log level


@pytest.fixture
def restore_level() -> Iterator[None]:
    logger = logging.getLogger("jobcontrol")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.mark.usefixtures("restore_level")
def test_log_level_round_trip(api: Api) -> None:
    response = api.client.put(
        "/api/v1/log-level", json={"level": "DEBUG"}, headers=api.headers("admin")
    )
    assert response.status_code == 200
    assert response.json() == {"level": "DEBUG"}
    assert logging.getLogger("jobcontrol.dispatch.dispatcher").isEnabledFor(logging.DEBUG)
    got = api.client.get("/api/v1/log-level", headers=api.headers("viewer")).json()
    assert got == {"level": "DEBUG"}

    api.client.put("/api/v1/log-level", json={"level": "WARNING"}, headers=api.headers("admin"))
    got = api.client.get("/api/v1/log-level", headers=api.headers("viewer")).json()
    assert got == {"level": "WARNING"}
    assert not logging.getLogger("jobcontrol.dispatch.dispatcher").isEnabledFor(logging.INFO)


@pytest.mark.usefixtures("restore_level")
def test_log_level_refuses_unknown_levels_and_non_admins(api: Api) -> None:
    before = logging.getLogger("jobcontrol").getEffectiveLevel()
    response = api.client.put(
        "/api/v1/log-level", json={"level": "CHATTY"}, headers=api.headers("admin")
    )
    assert response.status_code == 422
    response = api.client.put(
        "/api/v1/log-level", json={"level": "DEBUG"}, headers=api.headers("operator")
    )
    assert response.status_code == 403
    assert logging.getLogger("jobcontrol").getEffectiveLevel() == before


# ---------------------------------------------------------------- shutdown


def test_shutdown_is_refused_while_a_job_runs_unless_forced(api: Api) -> None:
    api.jc.create(task("forever", "sleep 1000"))
    mark = api.jc.rec.mark()
    api.jc.run_now("forever")
    api.jc.rec.wait_for(lambda s: s.name == "run_started", since=mark)

    response = api.client.post("/api/v1/shutdown", json={}, headers=api.headers("admin"))
    assert response.status_code == 409
    assert response.json()["jobs"] == ["forever"]
    assert "forever" in response.json()["message"]
    assert api.shutdown_requests == []

    response = api.client.post(
        "/api/v1/shutdown", json={"force": True}, headers=api.headers("admin")
    )
    assert response.status_code == 202
    assert api.shutdown_requests == [True]
    results = [(e.operation, e.result) for e in list_entries(api.jc.store)]
    assert ("daemon.shutdown", "refused") in results
    assert ("daemon.shutdown", "ok") in results


def test_shutdown_when_idle_is_accepted_and_needs_an_admin(api: Api) -> None:
    response = api.client.post("/api/v1/shutdown", json={}, headers=api.headers("operator"))
    assert response.status_code == 403
    assert api.shutdown_requests == []
    response = api.client.post(
        "/api/v1/shutdown", json={"force": False}, headers=api.headers("admin")
    )
    assert response.status_code == 202
    assert api.shutdown_requests == [False]


def test_shutdown_rejects_a_malformed_body(api: Api) -> None:
    # "yes" and 1 are not true: a forced shutdown kills every run.
    for force in ("later", "yes", 1, "true"):
        response = api.client.post(
            "/api/v1/shutdown", json={"force": force}, headers=api.headers("admin")
        )
        assert response.status_code == 422, (force, response.text)
        assert "force" in response.json()["message"]
    assert api.shutdown_requests == []


def test_numbers_json_cannot_carry_are_refused_as_bad_input_not_a_500(api: Api) -> None:
    """Python's JSON reads NaN and Infinity; the refusal that echoes them must still be
    JSON (it was a plain-text 500), and nothing is made."""
    h = {**api.headers("admin"), "Content-Type": "application/json"}
    before = api.client.get("/api/v1/tree", headers=h).json()["jobs"]
    for body in (
        '{"name": "n", "kind": "task", "command": "true", "priority": NaN}',
        '{"name": "n", "kind": "task", "command": "true", "priority": Infinity}',
        '{"name": "n", "kind": "task", "command": "true", "timeout": NaN}',
    ):
        response = api.client.post("/api/v1/jobs", content=body, headers=h)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"], response.text
    assert api.client.get("/api/v1/tree", headers=h).json()["jobs"] == before


# ---------------------------------------------------------------- metrics

SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample line, name{labels} -> value; fails on a line that is not well formed."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        samples[match[1] + (match[2] or "")] = float(match[3])
    return samples


def test_metrics_parse_and_count_runs(api: Api) -> None:
    response = api.client.get("/metrics", headers=api.headers("viewer"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    before = parse_metrics(response.text)
    assert before["jobcontrol_runs_started_total"] == 0
    assert before['jobcontrol_run_duration_seconds_bucket{le="+Inf"}'] == 0
    assert before["jobcontrol_queue_depth"] == 0
    assert "# TYPE jobcontrol_run_duration_seconds histogram" in response.text

    api.jc.create(task("ok", "true"), task("bad", "exit 3", timer="daily 13:00", active=True))
    mark = api.jc.rec.mark()
    api.jc.run_now("ok")
    api.jc.run_now("bad")
    api.jc.rec.run_finished("ok", since=mark)
    api.jc.rec.run_finished("bad", since=mark)

    after = parse_metrics(api.client.get("/metrics", headers=api.headers("viewer")).text)
    assert after["jobcontrol_runs_started_total"] == 2
    assert after['jobcontrol_runs_finished_total{state="succeeded"}'] == 1
    assert after['jobcontrol_runs_finished_total{state="failed"}'] == 1
    assert after['jobcontrol_run_duration_seconds_bucket{le="3600"}'] == 2
    assert after["jobcontrol_run_duration_seconds_count"] == 2
    assert after["jobcontrol_timers_armed"] == 1
    assert after["jobcontrol_events_seq"] == api.ctx.eventlog.last_seq
    assert "jobcontrol_tree_state_waits_total" in after


def test_metrics_need_a_token(api: Api) -> None:
    assert api.client.get("/metrics").status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/v1/status"), ("GET", "/api/v1/log-level"), ("PUT", "/api/v1/log-level")],
)
def test_routes_need_a_valid_token(api: Api, method: str, path: str) -> None:
    assert api.client.request(method, path).status_code == 401
    bad = {"Authorization": "Bearer jc_nobody"}
    assert api.client.request(method, path, headers=bad).status_code == 401


def test_healthz_says_when_timers_fire_late_and_when_the_dispatcher_is_stuck(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher held on one event schedules nothing: past ``STUCK_S`` health is 503.
    A timer whose fire waited behind it is handled late: said in the body, still 200."""
    jc = api.jc
    jc.create(task("ticker", "true", timer="every 10s", active=True))
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(30)

    held = jc.dispatcher.call(hold)
    try:
        assert entered.wait(30)
        monkeypatch.setattr(system, "STUCK_S", 0.05)
        poll_until("a stuck dispatcher", lambda: api.client.get("/healthz").status_code == 503)
        stuck = api.client.get("/healthz").json()
        assert stuck["status"] == "dispatcher stuck", stuck
        assert "the dispatcher has been on one event for" in stuck["reason"]
        monkeypatch.setattr(system, "STUCK_S", 3600.0)
        # Its timer comes due while it is held, and is handled 6 s after its time.
        assert jc.timers.advance(timedelta(seconds=10)) == 1
        jc.clock.set(jc.clock.now() + timedelta(seconds=6))
    finally:
        release.set()
    held.result(30)
    jc.sync()
    health = api.client.get("/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "timers late"
    assert "timers late: one fired 6.0s after its time" in health.json()["reason"]
    gauges = parse_metrics(api.client.get("/metrics", headers=api.headers("viewer")).text)
    assert gauges["jobcontrol_timer_late_seconds"] == 6.0
    assert gauges["jobcontrol_dispatcher_event_seconds"] == 0.0


def test_a_time_missed_while_paused_and_run_on_resume_is_not_late(api: Api) -> None:
    """A misfire's catch-up is due from when its timer is armed again, not late: health
    must not page anyone for the run an operator's resume (or a daemon's start) makes."""
    jc = api.jc
    jc.create(task("ticker", "true", timer="every 10s", active=True))
    jc.engine.pause_timers(user="tester")
    mark = jc.rec.mark()
    jc.advance(15)  # its time passes while paused: nothing runs
    jc.engine.resume_timers(user="tester")
    jc.advance(0)  # the missed time runs at once (misfire: run-once)
    jc.rec.run_finished("ticker", since=mark)
    assert api.client.get("/healthz").json() == {"status": "ok"}
    gauges = parse_metrics(api.client.get("/metrics", headers=api.headers("viewer")).text)
    assert gauges["jobcontrol_timer_late_seconds"] == 0.0


def test_a_stopped_lane_shows_in_health_and_status_until_resumed(api: Api) -> None:
    jc = api.jc
    jc.engine.lanes.add_lane("fast", {}, user="tester")
    with jc.store.write() as conn:
        reason = "5 unexpected worker ends within 10 minutes (workers w0, w1)"
        store_lanes.change(
            conn,
            "fast",
            {"stopped_at": jc.clock.now(), "stopped_reason": reason},
            jc.clock.now(),
            store_lanes.STOPPED_BY,
        )
    health = api.client.get("/healthz")
    assert health.status_code == 200  # the other lanes run
    assert health.json()["status"] == "lane stopped"
    assert health.json()["stopped_lanes"][0]["name"] == "fast"
    assert "lane fast STOPPED: " + reason in health.json()["reason"]
    status = api.client.get(f"{V1}/status", headers=api.headers("viewer")).json()
    assert [(s["name"], s["reason"]) for s in status["stopped_lanes"]] == [("fast", reason)]

    r = api.client.post(f"{V1}/lanes/fast/resume", headers=api.headers("operator"))
    assert r.status_code == 200, r.text
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert (
        api.client.get(f"{V1}/status", headers=api.headers("viewer")).json()["stopped_lanes"] == []
    )
