"""PostgreSQL stops under the real daemon, for 2 s and for 20 s, and comes back.

A tree ticks every second and a task is running when the server stops
(``pg_ctl stop -m fast``); the task ends during the outage. While the database
is away ``/healthz`` answers 503 with the reason and ``status`` says so.
Afterwards ticks resume within seconds, the task's real outcome is recorded
(not ``lost``), and nothing stays running or queued.

The server is this module's own, so stopping it disturbs no other test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.pgserver import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

TREES = """\
jobs:
  - name: Ticker
    timer: every 1s
    active: true
    children:
      - {name: tick, active: true, command: "true"}
  - name: Through
    active: true
    children:
      - {name: through, active: true, command: "read line < GATE; echo made it"}
      - {name: after, active: true, command: "echo after"}
"""


@pytest.fixture
def outage_jc(
    own_server: PostgresServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[JobControl]:
    callspec = getattr(request.node, "callspec", None)
    name = f"outage_{callspec.id if callspec else 'stop'}"
    own_server.create_database(name)
    jc = JobControl(own_server.url(name), tmp_path / "user")
    try:
        yield jc
    finally:
        if not own_server.running or not _answers(own_server):
            own_server.resume()
        jc.cleanup()
        own_server.drop_database(name)


def _answers(server: PostgresServer) -> bool:
    try:
        server.connect().close()
    except Exception:
        return False
    return True


def _health(base: str) -> tuple[int, dict[str, object]]:
    try:
        r = httpx.get(base.removesuffix("/api/v1") + "/healthz", timeout=5)
    except httpx.HTTPError:
        return 0, {}
    return r.status_code, r.json()


def _dispatcher_ok(jc: JobControl) -> bool:
    """Whether the daemon's dispatcher, as its status says, has the database."""
    return bool(jc.json("status")["database"]["parts"]["dispatcher"]["ok"])


def _ticks(jc: JobControl) -> int:
    result = jc.run("history", "tick", "--json", "--limit", "1000")
    return len(json.loads(result.stdout)) if result.returncode == 0 else -1


def _start_ticking(jc: JobControl) -> str:
    """Start the daemon and wait for the ticker's second tick; the admin API's base URL."""
    jc.ok("daemon", "start")
    status = jc.ok("daemon", "status")
    match = re.search(r"admin API: (\S+/api/v1)", status.stdout)
    assert match, describe(status)
    assert wait_until(lambda: _ticks(jc) >= 2, 20), "the ticker does not tick"
    return match.group(1)


@pytest.mark.parametrize("seconds", [2, 20], ids=["2s", "20s"])
def test_the_daemon_rides_out_a_postgresql_outage(
    outage_jc: JobControl, own_server: PostgresServer, seconds: int
) -> None:
    jc = outage_jc
    gate = jc.base / "gate.fifo"
    os.mkfifo(gate)
    jc.upgraded().load(write(jc.base / "trees.yaml", TREES.replace("GATE", str(gate))))
    base = _start_ticking(jc)

    jc.ok("run", "Through")
    running = wait_until(lambda: [r["state"] for r in jc.history("through")] == ["running"], 10)
    assert running, jc.history("through")

    assert jc.marked(), "the task runs"  # (also learns the marker while the database answers)
    feed_out = jc.base / "events.out"
    feed = jc.popen(
        "events",
        "--after",
        str(jc.json("status")["event_seq"]),
        output=feed_out,
        errors=jc.base / "events.err",
    )
    own_server.halt()  # the outage begins while `through` runs
    try:
        assert wait_until(lambda: _health(base)[0] == 503, 15), "healthz stayed 200"
        code, body = _health(base)
        assert body["status"] == "database unavailable", body
        assert body["reason"], body
        online = jc.run("status", "--json")
        assert online.returncode == 0, describe(online)
        assert '"ok": false' in online.stdout, online.stdout
        human = jc.run("status")
        assert human.returncode == 0, describe(human)
        assert "database: UNAVAILABLE since " in human.stdout, human.stdout
        # The daemon runs: `daemon status` says so (0), with the database's problem.
        daemon_status = jc.run("daemon", "status")
        assert daemon_status.returncode == 0, describe(daemon_status)
        assert daemon_status.stdout.startswith("daemon running: pid "), describe(daemon_status)
        assert "database: UNAVAILABLE: " in daemon_status.stdout, describe(daemon_status)
        # A request that needs the database is refused, in one line, audit and all.
        refused = jc.run("run", "Ticker")
        assert refused.returncode != 0, describe(refused)
        assert "Traceback" not in refused.stderr, describe(refused)
        # The job tree still reads, as the database last left it, once the dispatcher
        # itself waits for the database (the ticker's next tick meets the outage).
        assert wait_until(lambda: not _dispatcher_ok(jc), 15), jc.json("status")["database"]
        listed = jc.run("ls", "--json")
        assert listed.returncode == 0, describe(listed)
        states = {j["name"]: j["state"] for j in json.loads(listed.stdout)}
        assert set(states) == {"Ticker", "tick", "Through", "through", "after"}, states
        assert states["through"] == "running", states
        shown = jc.run("show", "through", "--json")
        assert shown.returncode == 0, describe(shown)
        assert json.loads(shown.stdout)["state"] == "running", shown.stdout
        # The task ends during the outage; its outcome waits in the worker.
        fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
        assert wait_until(lambda: not jc.marked(), 15), "the task never ended"
        threading.Event().wait(seconds)  # the outage's length: the fault itself
    finally:
        own_server.resume()

    back = wait_until(lambda: _health(base)[0] == 200, 30)
    assert back, f"{_health(base)}\n{jc.run('status', '--json').stdout}\n{jc.daemon_log()}"
    done = wait_until(lambda: [r["state"] for r in jc.history("after")] == ["succeeded"], 30)
    through = jc.history("through")
    assert done, (through, jc.history("after"))
    assert [(r["state"], r["exit_status"]) for r in through] == [("succeeded", 0)]
    assert [(r["state"], r["exit_status"]) for r in jc.history("Through")] == [("succeeded", 0)]

    before = _ticks(jc)
    assert wait_until(lambda: _ticks(jc) >= before + 2, 15), "ticks did not resume"
    status_after = jc.json("status")
    assert status_after["database"]["ok"] is True, status_after
    assert status_after["database"]["outages"] >= 1, status_after
    assert "database:" not in jc.ok("status").stdout

    # The event stream (what the admin client shows) said when it went and came back.
    def database_events() -> list[dict[str, object]]:
        lines = [line.split(" ", 2) for line in feed_out.read_text().splitlines()]
        return [json.loads(data) for _, kind, data in lines if kind == "database.changed"]

    def told() -> bool:  # down first, up last, each change once (a part that met the
        # server still starting may have said "down" once more after the first "up")
        oks = [e["ok"] for e in database_events()]
        return (
            len(oks) >= 2
            and oks[0] is False
            and oks[-1] is True
            and oks[::2] == [False] * len(oks[::2])
        )

    assert wait_until(told, 15), (feed_out.read_text(), (jc.base / "events.err").read_text())
    feed.send_signal(signal.SIGINT)
    down, up = database_events()[0], database_events()[-1]
    assert down["since"], down
    assert down["error"], down
    assert (up["since"], up["error"]) == (None, None), up
    for job in ("through", "after", "Through"):
        assert all(r["state"] not in ("queued", "running") for r in jc.history(job)), job
    # The log says the database was away; not that the daemon was stopped or paused.
    log_text = jc.daemon_log(400)
    assert "the database answers again after" in log_text, log_text
    assert "did not run for" not in log_text, log_text
    # ...once when it went and once when it came back: no line for each request that the
    # outage kept from the database (the status polls above, the refused run), and no
    # trace of a cause already known.
    assert "not read for" not in log_text, log_text
    assert "Traceback" not in log_text, log_text
    # The refused run is one line, which says its audit entry was not written.
    refused = [line for line in log_text.splitlines() if "job.run by" in line]
    assert len(refused) == 1, log_text
    assert "request failed: " in refused[0], refused
    assert "its audit entry (job.run by" in refused[0], refused
    metrics = jc.run("daemon", "status")
    assert metrics.returncode == 0, describe(metrics)
    jc.ok("daemon", "stop", "--kill")


LONG = """\
jobs:
  - name: Long
    active: true
    children:
      - {name: long, active: true, command: "sleep 300"}
"""


def test_a_daemon_stopped_during_an_outage_stops_and_its_runs_keep_their_end(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """``daemon stop --kill`` while PostgreSQL is down: the daemon kills its task, waits a
    little for the database, keeps the end it could not record on disk and stops (the
    CLI's own wait is 60 s: it used to give up on a daemon still waiting). The next start
    records that end before its recovery would call the run lost."""
    jc = outage_jc
    jc.upgraded().load(write(jc.base / "trees.yaml", LONG))
    jc.ok("daemon", "start")
    jc.ok("run", "Long")
    assert wait_until(lambda: [r["state"] for r in jc.history("long")] == ["running"], 10)
    assert jc.marked(), "the task runs"
    kept = jc.state_dir / "spool" / "ends.jsonl"

    own_server.halt()
    try:
        # Without --kill the stop must know whether jobs run: it cannot, and says so.
        refused = jc.run("daemon", "stop")
        assert refused.returncode == 1, describe(refused)
        assert "stop refused: whether jobs are running cannot be read" in refused.stderr
        assert "use --kill" in refused.stderr, refused.stderr
        assert len(jc.live_daemons()) == 1, "nothing changed"
        assert jc.marked(), "the task still runs"
        stopped = jc.run("daemon", "stop", "--kill")
        assert stopped.returncode == 0, describe(stopped) + jc.daemon_log()
        assert jc.live_daemons() == []
        jc.assert_no_task_processes()
        assert kept.stat().st_mode & 0o777 == 0o600
        (entry,) = [json.loads(line) for line in kept.read_text().splitlines()]
        assert (entry["values"]["state"], entry["values"]["exit_status"]) == ("killed", 255)
    finally:
        own_server.resume()

    jc.ok("daemon", "start")
    assert not kept.exists(), "recorded at the start, the file goes"
    (run,) = jc.history("long")
    assert (run["state"], run["exit_status"]) == ("killed", 255), run
    assert run["reason"] == "killed: the daemon stopped", run
    # Its box records the kill, as after a stop whose database answers.
    ended = wait_until(lambda: [r["state"] for r in jc.history("Long")] != ["running"], 15)
    assert ended, jc.history("Long")
    assert [(r["state"], r["exit_status"]) for r in jc.history("Long")] == [("killed", 255)]
    assert "kept on disk by worker" in jc.daemon_log(200)
    jc.ok("daemon", "stop")


def test_a_worker_stopped_during_an_outage_has_its_kept_end_recorded_at_its_restart(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """``worker stop --kill`` while PostgreSQL is down: the worker process kills its task
    and keeps the end on disk. Its next start records that end before its own recovery
    would settle the run lost because its worker restarted."""
    jc = outage_jc
    jc.upgraded().load(write(jc.base / "trees.yaml", LONG))
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "w-out", "--slots", "1")
    jc.ok("run", "Long")
    assert wait_until(lambda: [r["state"] for r in jc.history("long")] == ["running"], 10)
    assert jc.marked(), "the task runs"
    kept = jc.state_dir / "spool" / "w-out" / "ends.jsonl"

    own_server.halt()
    try:
        stopped = jc.run("worker", "stop", "--name", "w-out", "--kill")
        assert stopped.returncode == 0, describe(stopped)
        jc.assert_no_task_processes()
        (entry,) = [json.loads(line) for line in kept.read_text().splitlines()]
        assert (entry["values"]["state"], entry["values"]["exit_status"]) == ("killed", 255)
    finally:
        own_server.resume()

    jc.ok("worker", "start", "--name", "w-out", "--slots", "1")
    assert wait_until(lambda: not kept.exists(), 15), "recorded at the start, the file goes"
    (run,) = jc.history("long")
    assert (run["state"], run["exit_status"]) == ("killed", 255), run
    assert run["reason"] == "killed: its worker was stopped", run
    assert run["worker"] == "w-out", run
    ended = wait_until(lambda: [r["state"] for r in jc.history("Long")] != ["running"], 15)
    assert ended, jc.history("Long")
    assert [(r["state"], r["exit_status"]) for r in jc.history("Long")] == [("killed", 255)]
    jc.ok("worker", "stop", "--name", "w-out")
    jc.ok("daemon", "stop")


ADVISORY_KEY = 0x4A6F62436F6E  # the daemon's lock (jobcontrol.daemon.ADVISORY_KEY)


def _lock_holders(server: PostgresServer, dbname: str) -> int:
    with server.connect(dbname, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = %s",
            (dbname,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_daemon_takes_its_lock_again_when_its_connections_were_dropped(
    outage_jc: JobControl, own_server: PostgresServer, tmp_path: Path
) -> None:
    """A session's advisory lock dies with it: after a server restart a second daemon
    started on the database, and every tree ran twice. The daemon takes the lock again."""
    jc = outage_jc
    dbname = "outage_stop"
    jc.upgraded().load(write(jc.base / "trees.yaml", LONG))
    jc.ok("daemon", "start")
    assert _lock_holders(own_server, dbname) == 1
    own_server.terminate_connections(dbname)  # what a restart or a failover does
    assert wait_until(
        lambda: "the daemon's database lock is held again" in jc.daemon_log(), 20
    ), jc.daemon_log()
    assert _lock_holders(own_server, dbname) == 1
    second = JobControl(jc.url, tmp_path / "second")
    try:
        refused = second.run("daemon", "start")
        assert refused.returncode != 0, describe(refused)
        assert "another Job Control daemon is running" in refused.stdout + refused.stderr
    finally:
        second.cleanup()
    assert len(jc.live_daemons()) == 1
    jc.ok("daemon", "stop")


def test_a_daemon_whose_lock_another_took_meanwhile_stops(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """When another process took the lock while the daemon's connection was lost, the
    daemon stops (killing what it runs) rather than run every tree a second time."""
    jc = outage_jc
    dbname = "outage_stop"
    jc.upgraded().load(write(jc.base / "trees.yaml", LONG))
    jc.ok("daemon", "start")
    jc.ok("run", "Long")
    assert wait_until(lambda: [r["state"] for r in jc.history("long")] == ["running"], 10)
    other = None
    for _ in range(5):  # the daemon checks every 2 s: it may take the lock back first
        own_server.terminate_connections(dbname)
        other = own_server.connect(dbname, autocommit=True)
        taken = other.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_KEY,)).fetchone()
        if taken == (True,):
            break
        other.close()
        other = None
    assert other is not None, "the test never took the lock before the daemon"
    with other:
        assert wait_until(lambda: jc.live_daemons() == [], 30), jc.daemon_log()
        log = jc.daemon_log(200)
        assert "another Job Control daemon took" in log, log
        assert "so that no tree runs twice" in log
        jc.assert_no_task_processes()


def test_an_outage_right_after_a_start_still_lets_known_tokens_read_the_daemon(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """The token check needs the database: an outage that began before anyone used the
    API after a start showed nothing (503 on /tree and /status, the admin client empty
    and saying the daemon was lost). Every token valid at the start still reads."""
    jc = outage_jc
    jc.upgraded().load(write(jc.base / "trees.yaml", LONG))
    jc.ok("daemon", "start")
    own_server.halt()  # before any request used the token
    try:
        status = jc.run("status")
        assert status.returncode == 0, describe(status) + jc.daemon_log()
        assert "database: UNAVAILABLE since " in status.stdout, status.stdout
        listing = jc.run("ls")
        assert listing.returncode == 0, describe(listing)
        assert "Long" in listing.stdout
    finally:
        own_server.resume()
    jc.ok("daemon", "stop")


def test_a_hung_postgresql_still_gets_answers_from_health_and_status(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """A server frozen by SIGSTOP fails nothing: every statement waits. /healthz and
    /status (and the token check in front of it) read the database: they gave no answer
    at all while it hung, so a monitor could not tell it from a dead daemon."""
    jc = outage_jc
    jc.upgraded().load(write(jc.base / "trees.yaml", TREES.replace("GATE", "/dev/null")))
    base = _start_ticking(jc)
    jc.ok("status")  # the token is known while the database answers
    pids = own_server.freeze()
    try:
        code, body = _health(base)  # answers within its 5 s timeout
        assert code == 503, (code, body)
        assert body["status"] == "database not answering", body
        assert "has not answered a read" in str(body["reason"]), body
        human = jc.run("status", timeout=30)
        assert human.returncode == 0, describe(human)
        assert "database: NOT ANSWERING: " in human.stdout, human.stdout
        assert "timers:" in human.stdout, human.stdout  # the rest from memory
        assert "run None" not in human.stdout, human.stdout  # a tree run not written yet
        # Polled on, it goes on answering at once (no pile of waiting reads).
        for _ in range(6):
            assert _health(base)[0] == 503
        # So do the metrics, which say the database is down.
        token = jc.token_file.read_text().strip()
        metrics = httpx.get(
            base.removesuffix("/api/v1") + "/metrics",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert metrics.status_code == 200, metrics.text
        assert re.search(r"^jobcontrol_database_up 0$", metrics.text, re.M), metrics.text
        # The daemon's log says it too (once), where before it went quiet.
        assert wait_until(
            lambda: "the database has not answered for" in jc.daemon_log(4000), 30
        ), jc.daemon_log()
    finally:
        own_server.thaw(pids)
    assert wait_until(lambda: _health(base)[0] == 200, 30), _health(base)
    assert wait_until(
        lambda: "the database answers again, after" in jc.daemon_log(4000), 30
    ), jc.daemon_log()
    assert jc.daemon_log(4000).count("the database has not answered for") == 1, jc.daemon_log()
    before = _ticks(jc)
    assert wait_until(lambda: _ticks(jc) > before + 1, 20), "the ticks did not resume"
    jc.ok("daemon", "stop")


CHATTY = """\
jobs:
  - name: chat
    active: true
    command: "for i in $(seq 1 8); do echo line-$i; read x < GATE; done; echo all-done"
"""


def test_a_followed_log_goes_on_through_an_outage(
    outage_jc: JobControl, own_server: PostgresServer
) -> None:
    """``logs -f`` (and the admin client's log pane) stopped for good at an outage with
    "lost the daemon", though the daemon and the run went on."""
    jc = outage_jc
    gate = jc.base / "gate.fifo"
    os.mkfifo(gate)
    jc.upgraded().load(write(jc.base / "chat.yaml", CHATTY.replace("GATE", str(gate))))
    jc.ok("daemon", "start")
    jc.ok("run", "chat")
    assert wait_until(lambda: [r["state"] for r in jc.history("chat")] == ["running"], 10)
    out = jc.base / "follow.out"
    follower = jc.popen("logs", "chat", "-f", output=out, errors=jc.base / "follow.err")

    def release_until(seen: str) -> None:
        """One line to the task at a time (two writes before its next read would be
        one), until the follower has shown ``seen``."""
        while seen not in out.read_text():
            shown = out.read_text()
            with open(gate, "w") as g:
                g.write("go\n")
            assert wait_until(lambda shown=shown: out.read_text() != shown, 15), shown

    assert wait_until(lambda: "line-1" in out.read_text(), 15), out.read_text()
    release_until("line-3")
    own_server.halt()
    try:
        release_until("line-6")  # the task goes on writing while the database is away
        assert follower.poll() is None, (jc.base / "follow.err").read_text()
    finally:
        own_server.resume()
    release_until("all-done")
    assert follower.wait(30) == 0, (jc.base / "follow.err").read_text()
    text = out.read_text()
    assert [f"line-{i}" for i in range(1, 9)] + ["all-done"] == text.split(), text
    jc.ok("daemon", "stop")
