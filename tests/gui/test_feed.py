"""The event feed against a real daemon: resuming where it left off, resync, refusal."""

from __future__ import annotations

from typing import Any

import pytest

from jobcontrol.client import Client, Event
from jobcontrol_admin.feed import EventFeed
from jobcontrol_admin.session import Session
from tests.gui.conftest import WAIT_MS, AdminDaemon

pytestmark = pytest.mark.timeout(120)


class Seen:
    """What a feed delivered, in order."""

    def __init__(self, feed: EventFeed) -> None:
        self.snapshots: list[tuple[int, list[dict[str, Any]]]] = []
        self.events: list[Event] = []
        self.states: list[tuple[str, str]] = []
        feed.snapshot.connect(lambda seq, jobs: self.snapshots.append((seq, jobs)))
        feed.events.connect(self.events.extend)
        feed.connection.connect(lambda state, message: self.states.append((state, message)))

    def created(self) -> list[str]:
        return [j["name"] for e in self.events if e.type == "job.created" for j in e.data["jobs"]]


def test_a_feed_resumes_after_the_last_event_it_saw_without_a_new_snapshot(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    session = Session(admin_daemon.url, admin_daemon.token)
    first = EventFeed(session.new_client)
    seen = Seen(first)
    first.start()
    try:
        qtbot.waitUntil(lambda: ("live", "") in seen.states, timeout=WAIT_MS)
        with Client(admin_daemon.url, admin_daemon.token) as client:
            client.create_job("one", "task", command="true")
        qtbot.waitUntil(lambda: seen.created() == ["one"], timeout=WAIT_MS)
    finally:
        first.stop()
    seq, started = first.seq, first.daemon_started
    assert seq is not None

    # While no feed listens, the tree changes.
    with Client(admin_daemon.url, admin_daemon.token) as client:
        client.create_job("two", "task", command="true")
        client.create_job("three", "task", command="true")

    # A feed that knows where it was (as after a dropped connection) gets just what it missed.
    second = EventFeed(session.new_client)
    second.seq, second.daemon_started = seq, started
    resumed = Seen(second)
    second.start()
    try:
        qtbot.waitUntil(lambda: resumed.created() == ["two", "three"], timeout=WAIT_MS)
        assert resumed.snapshots == []
        assert all(e.seq is not None and e.seq > seq for e in resumed.events)
    finally:
        second.stop()
        session.close()


def test_a_number_the_daemon_never_reached_brings_a_fresh_snapshot(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    with Client(admin_daemon.url, admin_daemon.token) as client:
        client.create_job("kept", "task", command="true")
        started = client.status()["started"]
    session = Session(admin_daemon.url, admin_daemon.token)
    feed = EventFeed(session.new_client)
    feed.seq, feed.daemon_started = 10**17, started  # past any number this daemon reached
    seen = Seen(feed)
    feed.start()
    try:
        qtbot.waitUntil(lambda: bool(seen.snapshots), timeout=WAIT_MS)
        seq, jobs = seen.snapshots[0]
        assert seq < 10**17
        assert [j["name"] for j in jobs] == ["kept"]
        qtbot.waitUntil(lambda: seen.states[-1:] == [("live", "")], timeout=WAIT_MS)
    finally:
        feed.stop()
        session.close()


def test_a_refused_token_stops_the_feed_and_says_why(qtbot: Any, admin_daemon: AdminDaemon) -> None:
    session = Session(admin_daemon.url, "jc_not_a_token")
    feed = EventFeed(session.new_client)
    seen = Seen(feed)
    feed.start()
    try:
        qtbot.waitUntil(lambda: any(s == "refused" for s, _ in seen.states), timeout=WAIT_MS)
        message = next(m for s, m in seen.states if s == "refused")
        assert "unknown or revoked token" in message
        qtbot.waitUntil(lambda: not feed.running, timeout=WAIT_MS)  # it does not retry
    finally:
        feed.stop()
        session.close()
