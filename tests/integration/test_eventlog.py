"""The event log behind the live stream: numbering, replay after a reconnect, gaps,
slow readers, snapshots consistent with a sequence number (issue 3, "event stream").

Everything runs against the real dispatcher on the manual clock with real task
processes; waits are on signals, the dispatcher barrier (``jc.sync``) or
subscriptions, each bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcontrol.client.events import apply_event
from jobcontrol.service.eventlog import (
    Event,
    EventGap,
    EventLog,
    JobView,
    SequenceAhead,
    Subscription,
)
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, WAIT, box, task

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def elog(jc_sqlite: JC) -> Iterator[EventLog]:
    log = EventLog(jc_sqlite.dispatcher)
    log.start()
    yield log
    log.stop()


def drain(sub: Subscription, until_seq: int) -> list[Event]:
    """Everything ``sub`` gets up to and including event ``until_seq`` (bounded waits)."""
    got: list[Event] = []
    while not got or got[-1].seq < until_seq:
        event = sub.get(WAIT)
        assert event is not None, f"no event after {got[-1].seq if got else None}"
        got.append(event)
    return got


def by_id(views: list[JobView]) -> dict[int, JobView]:
    return {v["id"]: dict(v) for v in views}


def replay(views: list[JobView], events: list[Event]) -> dict[int, JobView]:
    tree = by_id(views)
    for event in events:
        apply_event(tree, event.type, event.data)
    return tree


def assert_consecutive(events: list[Event], first: int = 1) -> None:
    assert [e.seq for e in events] == list(range(first, first + len(events)))


# ---------------------------------------------------------------- what the stream says


def test_every_change_arrives_in_order_with_consecutive_numbers(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    jc.create(box("Nightly"), task("backup", "exit 3", "Nightly", active=True))
    jc.modify("backup", command="true")
    mark = jc.rec.mark()
    jc.run_now("Nightly")
    jc.rec.run_finished("Nightly", since=mark)
    jc.sync()
    jc.engine.delete_jobs(["Nightly"], user="tester")

    events = elog.since(0)
    assert_consecutive(events)
    assert elog.last_seq == events[-1].seq
    ids = {v["name"]: v["id"] for v in events[0].data["jobs"]}
    summary = [
        (e.type, e.data.get("name") or e.data.get("run", {}).get("job_name")) for e in events
    ]
    assert summary == [
        ("job.created", None),
        ("job.modified", None),
        ("state.changed", "Nightly"),
        ("run.started", "Nightly"),
        ("state.changed", "backup"),
        ("run.started", "backup"),
        ("state.changed", "backup"),
        ("run.finished", "backup"),
        ("state.changed", "Nightly"),
        ("run.finished", "Nightly"),
        ("job.deleted", None),
    ]
    assert sorted(ids) == ["Nightly", "backup"]
    assert events[1].data["jobs"][0]["command"] == "true"
    assert [e.data["state"] for e in events if e.type == "state.changed"] == [
        "running",
        "running",
        "idle",
        "idle",
    ]
    finished = events[7].data
    assert finished["run"]["state"] == "succeeded"
    assert finished["job"]["exit_status"] == 0
    assert finished["job"]["last_ran"] is not None  # JSON-ready: an ISO string
    assert events[2].data["started"] == jc.clock.now().isoformat()
    assert events[-1].data == {"ids": [ids["Nightly"]]}
    assert all(e.at == jc.clock.now() for e in events)


def test_an_event_read_later_shows_the_job_as_it_was_at_the_event(
    jc_sqlite: JC, elog: EventLog
) -> None:
    # Events are built on their first read (no client reads most of them); what they
    # show is copied when they happen, since the engine changes a job's record in place.
    jc = jc_sqlite
    jc.create(task("flaky", "exit 3", active=True))
    mark = jc.rec.mark()
    jc.run_now("flaky")
    jc.rec.run_finished("flaky", since=mark)
    jc.sync()
    jc.modify("flaky", command="true")
    mark = jc.rec.mark()
    jc.run_now("flaky")
    jc.rec.run_finished("flaky", since=mark)
    jc.sync()

    finished = [e.data for e in elog.since(0) if e.type == "run.finished"]
    assert [(f["run"]["state"], f["job"]["exit_status"]) for f in finished] == [
        ("failed", 3),
        ("succeeded", 0),
    ]
    assert [f["job"]["command"] for f in finished] == ["exit 3", "true"]
    assert [f["job"]["version"] for f in finished] == [1, 2]
    started = [e.data["job"] for e in elog.since(0) if e.type == "run.started"]
    assert [v["state"] for v in started] == ["running", "running"]
    assert started[1]["exit_status"] == 3  # the first run's, until the second ended


def test_a_timer_run_announces_the_rearmed_schedule(jc_sqlite: JC, elog: EventLog) -> None:
    jc = jc_sqlite
    jc.create(task("hourly", "true", timer="every 1h", active=True))
    armed = jc.armed_at("hourly")
    assert armed is not None
    mark = jc.rec.mark()
    jc.advance(to=armed)
    jc.rec.run_finished("hourly", since=mark)
    jc.sync()

    schedules = [e for e in elog.since(0) if e.type == "schedule.changed"]
    rearmed = jc.armed_at("hourly")
    assert rearmed is not None
    assert rearmed > armed
    assert schedules[-1].data["next_runs"] == rearmed.isoformat()
    assert [v["name"] for v in schedules[-1].data["jobs"]] == ["hourly"]
    assert schedules[-1].data["jobs"][0]["next_runs"] == schedules[-1].data["next_runs"]


# ---------------------------------------------------------------- reconnecting


def test_a_client_that_reconnects_gets_exactly_what_it_missed(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    always = elog.subscribe()
    client = elog.subscribe()
    jc.create(task("a", "true"), task("b", "true"))
    seen = drain(client, elog.last_seq)
    client.close()  # the connection drops...
    mark = jc.rec.mark()
    jc.run_now("a")
    jc.modify("b", command="exit 1")
    jc.rec.run_finished("a", since=mark)
    jc.sync()
    missed = elog.since(seen[-1].seq)  # ...and comes back with Last-Event-ID

    assert missed, "the test made changes while the client was away"
    assert seen + missed == drain(always, elog.last_seq)
    assert elog.since(elog.last_seq) == []
    assert client.get(0) is None  # a closed subscription hears nothing more


def test_a_reconnect_from_before_the_kept_events_is_told_to_take_a_snapshot(
    jc_sqlite: JC,
) -> None:
    jc = jc_sqlite
    log = EventLog(jc.dispatcher, capacity=5)
    log.start()
    try:
        jc.create(*(task(f"t{i}", "true") for i in range(3)))
        for i in range(3):
            jc.modify(f"t{i}", command=f"exit {i + 1}")
        for i in range(3):
            jc.modify(f"t{i}", command="true")
        last = log.last_seq
        assert last == 7

        with pytest.raises(EventGap) as gap:
            log.since(1)
        assert gap.value.oldest_available == 3
        assert "take a fresh snapshot" in str(gap.value)
        assert [e.seq for e in log.since(2)] == [3, 4, 5, 6, 7]
        with pytest.raises(EventGap):
            log.subscribe(after=0)
        with pytest.raises(SequenceAhead, match="event 9 has not happened yet"):
            log.since(9)
    finally:
        log.stop()


def test_numbering_can_continue_from_a_given_start(jc_sqlite: JC) -> None:
    log = EventLog(jc_sqlite.dispatcher, start_after=41)
    log.start()
    try:
        assert log.since(41) == []
        with pytest.raises(EventGap):
            log.since(40)
        jc_sqlite.create(task("one", "true"))
        assert [e.seq for e in log.since(41)] == [42]
    finally:
        log.stop()


def test_subscribing_after_a_seq_replays_then_streams_without_loss(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    jc.create(task("a", "true"))
    jc.modify("a", command="exit 2")
    with elog.subscribe(after=1) as sub:
        jc.modify("a", command="true")
        got = drain(sub, elog.last_seq)
    assert [e.seq for e in got] == [2, 3]
    assert [e.type for e in got] == ["job.modified", "job.modified"]


# ---------------------------------------------------------------- slow readers


def test_a_reader_that_never_reads_is_cut_off_without_holding_up_the_dispatcher(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    stuck = elog.subscribe(maxsize=3)
    reader = elog.subscribe()
    jc.create(task("job", "true"))
    for _ in range(3):
        mark = jc.rec.mark()
        jc.run_now("job")
        jc.rec.run_finished("job", since=mark)  # bounded: fails if the dispatcher stalls
    jc.sync()

    assert len(drain(reader, elog.last_seq)) == elog.last_seq == 13
    with pytest.raises(EventGap, match="fell more than 3 events behind after event 0") as gap:
        stuck.get(0)
    assert stuck.overflowed
    # The log still has what it lost: it can resume from there instead of a snapshot.
    assert elog.since(gap.value.after) == drain(elog.subscribe(after=0), 13)


def test_an_asyncio_reader_is_woken_by_changes(jc_sqlite: JC, elog: EventLog) -> None:
    jc = jc_sqlite
    sub = elog.subscribe()

    async def read_two() -> list[Event | None]:
        first = asyncio.create_task(sub.get_async(WAIT))
        await asyncio.sleep(0)  # a yield, not a timing: the reader is usually blocked by now
        await asyncio.to_thread(jc.create, task("a", "true"))
        second = await asyncio.to_thread(jc.modify, "a", command="false")
        assert second
        return [await first, await sub.get_async(WAIT), await sub.get_async(0.01)]

    got = asyncio.run(read_two())
    assert [e.type if e else None for e in got] == ["job.created", "job.modified", None]
    sub.close()


# ---------------------------------------------------------------- snapshots


def test_snapshot_plus_replay_equals_a_later_snapshot_under_a_stream_of_runs(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    jc.create(
        box("Pipeline", timer="every 1h", active=True),
        task("extract", "true", "Pipeline", active=True),
        task("load", "true", "Pipeline", active=True),
        *(task(f"solo{i}", "true") for i in range(4)),
    )
    done = threading.Event()
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(12):
                mark = jc.rec.mark()
                jc.run_now(f"solo{i % 4}")
                jc.modify(f"solo{(i + 1) % 4}", command=f"exit {i % 2}")
                jc.create(task(f"extra{i}", "true", "Pipeline", active=True))
                if i % 3 == 2:
                    jc.engine.delete_jobs([f"extra{i - 1}"], user="tester")
                    jc.advance(3600)  # the Pipeline timer fires
                jc.rec.run_finished(f"solo{i % 4}", since=mark)
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=churn)
    worker.start()
    snaps: list[tuple[int, list[JobView]]] = [elog.snapshot()]
    while not done.is_set() and len(snaps) < 200:
        snaps.append(elog.snapshot())
    worker.join(WAIT)
    assert not failures, failures
    jc.wait_quiet()
    snaps.append(elog.snapshot())

    assert any(v["state"] == "running" for _, views in snaps for v in views), "no run caught"
    for (seq, views), (later_seq, later) in zip(snaps, snaps[1:], strict=False):
        events = [e for e in elog.since(seq) if e.seq <= later_seq]
        assert replay(views, events) == by_id(later), (seq, later_seq)
    for seq, views in snaps:  # no change numbered after the snapshot's seq is in it, and back
        present = {v["id"] for v in views}
        created_after: set[int] = set()
        for event in elog.since(seq):
            if event.type == "job.created":
                created_after |= {v["id"] for v in event.data["jobs"]}
                assert not present & created_after, (seq, event)
            elif event.type == "job.deleted":
                assert set(event.data["ids"]) - created_after <= present, (seq, event)
    final_seq, final = snaps[-1]
    assert final_seq == elog.last_seq
    assert by_id(final) == {v["id"]: v for v in jc.engine.list_jobs()}


def test_snapshot_views_are_the_engine_views_in_tree_order(jc_sqlite: JC, elog: EventLog) -> None:
    jc = jc_sqlite
    gate = jc.gate()
    jc.create(box("B"), task("slow", gate.command, "B", active=True), task("after", "true", "B"))
    jc.run_now("B")
    jc.rec.wait_for(lambda s: s.name == "run_started" and s.run["job_name"] == "slow")
    seq, views = elog.snapshot()
    assert seq == elog.last_seq
    assert [(v["name"], v["depth"], v["state"]) for v in views] == [
        ("B", 0, "running"),
        ("slow", 1, "running"),
        ("after", 1, "idle"),
    ]
    assert views == jc.engine.list_jobs()
    mark = jc.rec.mark()
    gate.open()
    jc.rec.run_finished("B", since=mark)


# ---------------------------------------------------------------- life cycle, threads


def test_stop_disconnects_and_ends_subscriptions(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    log = EventLog(jc.dispatcher)
    log.start()
    jc.create(task("a", "true"))
    sub = log.subscribe()
    log.stop()
    last = log.last_seq
    jc.modify("a", command="false")
    jc.sync()
    assert log.last_seq == last == 1
    assert sub.closed
    assert sub.get(WAIT) is None  # returns at once: closed, not timed out


def test_another_dispatchers_signals_are_not_logged(
    jc_sqlite: JC, make_jc: MakeJC, tmp_path: Path
) -> None:
    other = make_jc(f"sqlite:///{tmp_path}/other.db")
    log = EventLog(jc_sqlite.dispatcher)
    log.start()
    try:
        other.create(task("elsewhere", "true"))
        jc_sqlite.create(task("here", "true"))
        assert [v["name"] for e in log.since(0) for v in e.data["jobs"]] == ["here"]
    finally:
        log.stop()


def test_eight_concurrent_readers_each_get_every_event_once_in_order(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    subs = [elog.subscribe() for _ in range(8)]
    jc.create(*(task(f"t{i}", "true") for i in range(4)))
    results: list[list[Event]] = [[] for _ in subs]
    finished = threading.Event()
    last: list[int] = []

    def read(i: int) -> None:
        while not (finished.is_set() and results[i] and results[i][-1].seq >= last[0]):
            event = subs[i].get(0.05)
            if event is not None:
                results[i].append(event)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for r in readers:
        r.start()
    for round_ in range(5):
        marks = jc.rec.mark()
        for i in range(4):
            jc.run_now(f"t{i}")
        for i in range(4):
            jc.rec.run_finished(f"t{i}", since=marks)
        jc.modify(f"t{round_ % 4}", command=f"exit {round_}")
    jc.sync()
    last.append(elog.last_seq)
    finished.set()
    for r in readers:
        r.join(WAIT)
        assert not r.is_alive()
    expected = elog.since(0)
    assert_consecutive(expected)
    assert all(got == expected for got in results)
    for sub in subs:
        sub.close()


def test_replay_follows_sibling_renumbering_after_a_delete_in_an_unarmed_box(
    jc_sqlite: JC, elog: EventLog
) -> None:
    jc = jc_sqlite
    jc.create(box("Idle"), *(task(n, "true", "Idle") for n in ("a", "b", "c")))
    seq, views = elog.snapshot()
    jc.engine.delete_jobs(["a"], user="tester")
    later_seq, later = elog.snapshot()
    assert replay(views, elog.since(seq)) == by_id(later)
