"""Slot groups (``--queues "fast:1 manual,*:4"``): a worker's slots split into groups,
each with a workloop of its own, on both stores, with real task processes.

The slot-group design's test list: each group claims on its own, with its own queue
list and never more than its free slots; a group at capacity stops claiming; a run's
end resumes only its own group; a work-available wake-up makes every group with room
claim at once, whatever its back-off; an idle pinned group backs off (1 s doubling to
10 s) while the default group stays busy, neither slowing the other; ``manual,*:5``
is the old pool of 5. What the workers do is watched through the run queue they call
(``SpyQueue`` records each claim and look, then does it for real); the back-off's
clock is injected, so nothing here sleeps.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import events
from jobcontrol.clock import SystemClock
from jobcontrol.model import Kind, RunRecord, RunState, Trigger
from jobcontrol.slotgroups import parse
from jobcontrol.store import Store, lanes, queries
from jobcontrol.store.runqueue import Finished, RunQueue, ThenClaim, WorkerInfo, list_workers
from jobcontrol.worker import Worker
from tests.integration.helpers import Gate, poll_until

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class SpyQueue(RunQueue):
    """The real run queue, recording who claimed or looked, with what, and when."""

    def __init__(self, store: Store, mono: ManualMonotonic | None = None) -> None:
        super().__init__(store)
        self.mono = mono
        self.calls: list[tuple[str, str, list[str] | None, int, float]] = []

    def _record(self, what: str, queues: Sequence[str] | None, limit: int) -> None:
        when = self.mono() if self.mono is not None else 0.0
        group = threading.current_thread().name
        if group.startswith("jc-slot-"):  # a slot thread of the group: its end's claim
            group = "jc-group-" + group.split("-")[2]
        self.calls.append((group, what, None if queues is None else list(queues), limit, when))

    def claim(
        self,
        name: str,
        host: str,
        now: datetime,
        *,
        run_id: int | None = None,
        queues: Sequence[str] | None = None,
        limit: int = 1,
        clock: Callable[[], datetime] | None = None,
    ) -> list[RunRecord]:
        self._record("claim" if run_id is None else "offer", queues, limit)
        return super().claim(
            name, host, now, run_id=run_id, queues=queues, limit=limit, clock=clock
        )

    def finish(self, *args: Any, then_claim: ThenClaim | None = None, **kwargs: Any) -> Finished:
        if then_claim is not None:
            self._record("end+claim", then_claim.queues, 1)
        return super().finish(*args, then_claim=then_claim, **kwargs)

    def any_queued(self, queues: Sequence[str] | None = None) -> bool:
        self._record("look", queues, 0)
        return super().any_queued(queues)

    def of(self, group: int) -> list[tuple[str, list[str] | None, int, float]]:
        return [c[1:] for c in list(self.calls) if c[0] == f"jc-group-{group}"]


class ManualMonotonic:
    """The groups' back-off clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.upgrade()
    yield s
    s.dispose()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.kill_all("test over")
        w.stop(10)


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[dict[str, Gate]]:
    made: dict[str, Gate] = {}
    yield made
    for g in made.values():
        g.close()


def gated(gates: dict[str, Gate], tmp_path: Path, name: str) -> str:
    """A task command that waits for its gate (one per job name)."""
    gates[name] = Gate(tmp_path / f"{name}.fifo")
    return gates[name].command


def queue_run(store: Store, name: str, command: str, *, queue: str, priority: int = 0) -> int:
    with store.write() as conn:
        return queries.insert_run(
            conn,
            {
                "job_id": None,
                "job_name": name,
                "kind": Kind.TASK,
                "trigger": Trigger.MANUAL,
                "state": RunState.QUEUED,
                "queue": queue,
                "priority": priority,
                "created": NOW,
                "command": command,
            },
        )


def state_of(store: Store, run_id: int) -> RunState:
    with store.read() as conn:
        row = queries.get_run(conn, run_id)
    assert row is not None
    return row.state


def start_worker(
    started: list[Worker],
    rq: RunQueue,
    tmp_path: Path,
    *,
    spec: str | None = None,
    slots: int = 8,
    mono: ManualMonotonic | None = None,
    name: str = "w1",
    pushes: Callable[[], bool] | None = None,
    watch: bool = True,
) -> Worker:
    extra: dict[str, Any] = {"monotonic": mono} if mono is not None else {}
    if pushes is not None:
        extra["pushes"] = pushes
    w = Worker(
        rq,
        clock=SystemClock(),
        log_root=tmp_path / f"logs-{name}",
        instance_id="test",
        name=name,
        slots=slots,
        groups=parse(spec) if spec is not None else None,
        heartbeat_interval=0.2,
        watch=watch,
        **extra,
    )
    w.start()
    started.append(w)
    return w


def used(w: Worker) -> list[int]:
    return [g.used for g in w.groups()]


# ------------------------------------------------------------------ the claim itself


def test_preference_mode_takes_the_named_queues_first_in_order_then_the_rest(
    store: Store,
) -> None:
    rq = RunQueue(store)
    other_hi = queue_run(store, "o", "true", queue="other", priority=9)
    plain = queue_run(store, "d", "true", queue="default", priority=5)
    fast = queue_run(store, "f", "true", queue="fast", priority=1)
    manual_lo = queue_run(store, "m0", "true", queue="manual", priority=0)
    manual_hi = queue_run(store, "m1", "true", queue="manual", priority=3)

    # Filter mode: only the queues named.
    assert [r.id for r in rq.claim("w", "h", NOW, queues=["fast"], limit=5)] == [fast]
    # Preference mode: manual first (priority, then age, within it), then every other run
    # by priority then age.
    got = rq.claim("w", "h", NOW, queues=["manual", "*"], limit=5)
    assert [r.id for r in got] == [manual_hi, manual_lo, other_hi, plain]


def test_preference_mode_keeps_the_lane_rules_drained_and_capped(store: Store) -> None:
    rq = RunQueue(store)
    with store.write() as conn:
        lanes.insert(conn, "manual", {"enabled": False}, NOW, "tester")
        lanes.insert(conn, "gpu", {"max_slots": 1}, NOW, "tester")
    drained = queue_run(store, "m", "true", queue="manual", priority=9)
    gpu = [queue_run(store, f"g{i}", "true", queue="gpu") for i in range(2)]
    plain = queue_run(store, "d", "true", queue="default")
    got = rq.claim("w", "h", NOW, queues=["manual", "gpu", "*"], limit=5)
    assert [r.id for r in got] == [gpu[0], plain], "drained skipped, gpu capped at 1"
    assert state_of(store, drained) is RunState.QUEUED
    assert rq.any_queued(["manual", "gpu", "*"]) is False


# ------------------------------------------------------------------ workloops


def test_each_group_claims_on_its_own_stops_at_capacity_and_only_its_end_resumes_it(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path
) -> None:
    mono = ManualMonotonic()  # never moves: no back-off runs out, only ends and wakes count
    rq = SpyQueue(store, mono)
    fast = [
        queue_run(store, f"fast{i}", gated(gates, tmp_path, f"fast{i}"), queue="fast")
        for i in range(2)
    ]
    m0 = queue_run(store, "m0", gated(gates, tmp_path, "m0"), queue="manual")
    w = start_worker(workers, rq, tmp_path, spec="fast:1 manual:2", mono=mono)

    w.wait_for("both groups' first claims", lambda: used(w) == [1, 1] and w.groups()[1].looks)
    assert [set(g.runs) for g in w.groups()] == [{fast[0]}, {m0}]
    assert state_of(store, fast[1]) is RunState.QUEUED, "the fast group is at capacity"
    # Each claim said its own group's queues and asked for no more than its free slots.
    assert rq.of(0) == [("look", ["fast"], 0, 0.0), ("claim", ["fast"], 1, 0.0)]
    assert rq.of(1) == [("look", ["manual"], 0, 0.0), ("claim", ["manual"], 2, 0.0)]

    # Work nobody announced, for the manual group (which has room, and waits).
    m1 = queue_run(store, "m1", gated(gates, tmp_path, "m1"), queue="manual")
    # The fast run's end resumes the fast group, and it alone: the slot that ends claims
    # the next one itself, with the end.
    gates["fast0"].open()
    w.wait_for("the fast group's next run", lambda: fast[1] in w.groups()[0].runs)
    assert rq.of(0)[2:] == [("end+claim", ["fast"], 1, 0.0)]
    assert len(rq.of(1)) == 2, "the manual group did not claim"
    assert state_of(store, m1) is RunState.QUEUED

    # News of work: the group with room claims; the one at capacity does not.
    w.wake()
    w.wait_for("the manual group's claim", lambda: m1 in w.groups()[1].runs)
    assert rq.of(1)[2:] == [("claim", ["manual"], 1, 0.0)]
    assert len(rq.of(0)) == 3
    for name in ("fast1", "m0", "m1"):
        gates[name].open()
    w.wait_for("every run to end", lambda: used(w) == [0, 0])


def test_work_available_makes_every_group_with_room_claim_at_once(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path
) -> None:
    mono = ManualMonotonic()  # never moves: no back-off ever runs out
    rq = SpyQueue(store, mono)
    hold = queue_run(store, "hold", gated(gates, tmp_path, "hold"), queue="hold")
    w = start_worker(workers, rq, tmp_path, spec="fast:1 slow:2 *:1", mono=mono)
    w.wait_for(
        "the * group full, the others backed off",
        lambda: hold in w.groups()[2].runs and all(g.empty for g in w.groups()[:2]),
    )
    before = [len(rq.of(i)) for i in range(3)]

    fast = queue_run(store, "fast", gated(gates, tmp_path, "fast"), queue="fast")
    slow = [
        queue_run(store, f"s{i}", gated(gates, tmp_path, f"s{i}"), queue="slow") for i in range(3)
    ]
    any_ = queue_run(store, "any", gated(gates, tmp_path, "any"), queue="elsewhere")
    # Announced (the dispatcher's signal): every group with free slots claims at once with
    # its own queues, though its back-off has not run out; the one at capacity does not.
    events.runs_queued.send(store, run_ids=[any_])
    w.wait_for(
        "every group with room to claim",
        lambda: [set(g.runs) for g in w.groups()[:2]] == [{fast}, set(slow[:2])],
    )
    assert rq.of(0)[before[0] :] == [("claim", ["fast"], 1, 0.0)]
    assert rq.of(1)[before[1] :] == [("claim", ["slow"], 2, 0.0)], "no more than its room"
    assert len(rq.of(2)) == before[2], "the group at capacity did not claim"
    assert state_of(store, slow[2]) is RunState.QUEUED
    assert state_of(store, any_) is RunState.QUEUED

    # Its run's end resumes the * group: the slot claims with that end the most urgent
    # run of its queues, the slow run queued before the announced one, then that one.
    gates["hold"].open()
    w.wait_for("the * group's next run", lambda: slow[2] in w.groups()[2].runs)
    assert rq.of(2)[before[2] :] == [("end+claim", None, 1, 0.0)]
    assert state_of(store, any_) is RunState.QUEUED
    gates["s2"].open()
    w.wait_for("the announced run", lambda: any_ in w.groups()[2].runs)
    assert rq.of(2)[before[2] :] == [("end+claim", None, 1, 0.0)] * 2
    for g in gates.values():
        g.open()
    every = [hold, fast, *slow, any_]
    poll_until("every run", lambda: all(state_of(store, r) is RunState.SUCCEEDED for r in every))


def test_many_runs_announced_at_once_are_claimed_together_most_urgent_first(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path
) -> None:
    """Many trees due together: one claim fills the free slots, by priority, instead of a
    transaction per announced run (which capped a worker at ~350 runs a second)."""
    mono = ManualMonotonic()
    rq = SpyQueue(store, mono)
    w = start_worker(workers, rq, tmp_path, slots=3, mono=mono)
    w.wait_for("the first look, empty", lambda: w.groups()[0].empty >= 1)
    before = len(rq.of(0))

    runs = {
        p: queue_run(store, f"p{p}", gated(gates, tmp_path, f"p{p}"), queue="default", priority=p)
        for p in range(5)
    }
    # Announced oldest first, as the dispatcher queued them; the most urgent are the last.
    events.runs_queued.send(store, run_ids=list(runs.values()))
    w.wait_for("three runs in hand", lambda: len(w.groups()[0].runs) == 3)
    assert rq.of(0)[before:] == [("claim", None, 3, 0.0)], "one claim for the free slots"
    assert set(w.groups()[0].runs) == {runs[4], runs[3], runs[2]}
    assert [state_of(store, runs[p]) for p in (0, 1)] == [RunState.QUEUED] * 2

    # A slot frees: of the announced runs still queued, the most urgent comes next.
    gates["p4"].open()
    w.wait_for("the next most urgent", lambda: runs[1] in w.groups()[0].runs)
    assert state_of(store, runs[0]) is RunState.QUEUED
    for g in gates.values():
        g.open()
    poll_until(
        "every run", lambda: all(state_of(store, r) is RunState.SUCCEEDED for r in runs.values())
    )


def test_runs_announced_but_taken_elsewhere_cost_one_claim_not_a_spin(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path
) -> None:
    """Announced runs another worker took first: one claim finds nothing, and the group
    does not claim again for them (it would spin on the same announcements)."""
    mono = ManualMonotonic()
    rq = SpyQueue(store, mono)
    w = start_worker(workers, rq, tmp_path, slots=3, mono=mono)
    w.wait_for("the first look, empty", lambda: w.groups()[0].empty >= 1)
    taken = [queue_run(store, f"t{i}", "true", queue="default") for i in range(2)]
    other = RunQueue(store).claim("w2", "elsewhere", datetime.now(UTC), limit=2)
    assert sorted(r.id for r in other) == taken

    events.runs_queued.send(store, run_ids=taken)
    # Its claim for them came back empty (the spy records a claim as it begins: the late
    # run queued before this claim's statement ran would be claimed by it, no offer).
    w.wait_for("its claim for them, empty", lambda: w.groups()[0].empty >= 2)
    assert w.groups()[0].runs == ()
    late = queue_run(store, "late", gated(gates, tmp_path, "late"), queue="default")
    events.runs_queued.send(store, run_ids=[late])
    w.wait_for("the run announced next", lambda: late in w.groups()[0].runs)
    calls = rq.of(0)
    assert calls[1:] == [("claim", None, 3, 0.0), ("offer", None, 1, 0.0)], calls
    assert [state_of(store, r) for r in taken] == [RunState.RUNNING] * 2  # still w2's
    gates["late"].open()
    poll_until("the late run", lambda: state_of(store, late) is RunState.SUCCEEDED)


def test_an_idle_pinned_lane_backs_off_alone_while_the_default_group_stays_busy(
    store: Store, workers: list[Worker], tmp_path: Path
) -> None:
    with store.write() as conn:  # a quick lane: the seed's 1 s is then the least wait
        lanes.insert(conn, "fast", {"poll_interval_s": 0.5}, NOW, "tester")
    mono = ManualMonotonic()
    rq = SpyQueue(store, mono)
    done = tmp_path / "done"
    done.mkdir()
    runs = [queue_run(store, f"d{i}", f"touch {done}/{i}", queue="default") for i in range(6)]
    # Unwatched: on a watched SQLite database an idle group looks only at news of a write
    # (``test_idle_worker.py``); the back-off is how it finds unannounced work elsewhere.
    w = start_worker(workers, rq, tmp_path, spec="fast:1 default:2", mono=mono, watch=False)

    # The default group runs all six, one claim after another as its runs end, while the
    # clock stands still: the fast group's back-off holds nothing up.
    poll_until("the six runs", lambda: all(state_of(store, r) is RunState.SUCCEEDED for r in runs))
    w.wait_for("the default group to be idle", lambda: used(w) == [0, 0])
    assert len(list(done.iterdir())) == 6
    assert len(rq.of(0)) == 1, "the fast group looked once, found nothing, and waits"
    assert rq.of(0)[0] == ("look", ["fast"], 0, 0.0)

    # Its looks from then on: 1 s doubling to 10 s, on its own clock, never earlier:
    # after each empty look its next one is due that much later, and it comes then.
    when = 0.0
    for gap in (1, 2, 4, 8, 10, 10):
        looked, empty = len(rq.of(0)), w.groups()[0].empty
        assert w.groups()[0].next_poll == when + gap, (when, gap, rq.of(0))
        when += gap
        mono.t = when
        w.poke()
        # Done looking (its next wait set) before the clock moves on.
        w.wait_for(f"the fast group's look at {when}", lambda n=empty: w.groups()[0].empty > n)
        assert rq.of(0)[looked:] == [("look", ["fast"], 0, when)], rq.of(0)
    # A claim that finds work sets it back to the least wait: its run's end claims the
    # group's next with it, that claim finds nothing, and the next look is 1 s later.
    fast = queue_run(store, "f", "true", queue="fast")
    w.wake()
    poll_until("the fast run", lambda: state_of(store, fast) is RunState.SUCCEEDED)
    w.wait_for("the end's claim", lambda: used(w)[0] == 0 and w.groups()[0].empty == 8)
    assert rq.of(0)[-2:] == [("claim", ["fast"], 1, when), ("end+claim", ["fast"], 1, when)]
    assert w.groups()[0].next_poll == when + 1
    mono.t = when + 1
    w.poke()
    w.wait_for("the look 1 s on", lambda: w.groups()[0].empty == 9)
    assert rq.of(0)[-1] == ("look", ["fast"], 0, when + 1)


def test_while_pushes_are_cut_a_group_polls_at_its_lanes_interval_without_backing_off(
    store: Store, workers: list[Worker], tmp_path: Path
) -> None:
    """A remote worker whose relay does not listen hears of no new work: a lost push must
    cost at most the lane's poll interval, not the back-off's up to 10 s."""
    with store.write() as conn:
        lanes.insert(conn, "fast", {"poll_interval_s": 0.5}, NOW, "tester")
    mono = ManualMonotonic()
    rq = SpyQueue(store, mono)
    listening = threading.Event()
    listening.set()
    w = start_worker(workers, rq, tmp_path, spec="fast:1", mono=mono, pushes=listening.is_set)
    w.wait_for("the first look", lambda: w.groups()[0].empty == 1)
    assert w.groups()[0].next_poll == 1.0, "pushes reach it: the seed's back-off"

    listening.clear()  # the listener's connection is cut
    for when in (0.5, 1.0, 1.5, 2.0):
        empty = w.groups()[0].empty
        mono.t = when
        w.poke()
        w.wait_for(f"the look at {when}", lambda n=empty: w.groups()[0].empty > n)
        assert rq.of(0)[-1] == ("look", ["fast"], 0, when), rq.of(0)
    # Work queued meanwhile, its push lost: found at the next poll, half a second on.
    empty = w.groups()[0].empty
    run_id = queue_run(store, "f", "true", queue="fast")
    mono.t = 2.5
    w.poke()
    poll_until("the run found by the poll", lambda: state_of(store, run_id) is RunState.SUCCEEDED)

    listening.set()  # back: the group keeps to its back-off again
    # (the claim its run's end made found nothing at 2.5: the next look is 1 s on)
    w.wait_for("the claim after the run", lambda: w.groups()[0].empty == empty + 1)
    assert (used(w), w.groups()[0].next_poll) == ([0], 3.5)
    looks = len(rq.of(0))
    mono.t = 3.0  # a poll interval on: cut, it would look now
    w.poke()
    with pytest.raises(TimeoutError):
        w.wait_for("a look at 3.0", lambda: len(rq.of(0)) > looks, timeout=1.0)
    assert rq.of(0)[-1][3] == 2.5, rq.of(0)


@pytest.mark.parametrize("spec", [None, "manual,*:5"], ids=["old-pool-of-5", "manual,*:5"])
def test_manual_star_5_is_the_old_pool_of_5(
    store: Store,
    workers: list[Worker],
    gates: dict[str, Gate],
    tmp_path: Path,
    spec: str | None,
) -> None:
    rq = SpyQueue(store)
    prio = [0, 4, 1, 4, 2, 0, 3, 1]  # runs without a "manual" queue, as before groups
    runs = [
        queue_run(store, f"r{i}", gated(gates, tmp_path, f"r{i}"), queue=q, priority=p)
        for i, (p, q) in enumerate(zip(prio, ["default", "x", "y"] * 3, strict=False))
    ]
    w = start_worker(workers, rq, tmp_path, spec=spec, slots=5)
    assert w.slots == 5
    assert len(w.groups()) == 1
    w.wait_for("five runs", lambda: used(w) == [5])
    queues = None if spec is None else ["manual", "*"]
    claims = [c for c in rq.of(0) if c[0] == "claim"]
    assert claims
    assert all(c[1] == queues and c[2] <= 5 for c in claims), claims
    # The five most urgent, priority then age, whichever way the pool was given.
    expected = sorted(range(8), key=lambda i: (-prio[i], i))[:5]
    assert set(w.groups()[0].runs) == {runs[i] for i in expected}
    assert [state_of(store, runs[i]) for i in range(8) if i not in expected] == [
        RunState.QUEUED
    ] * 3
    gates["r1"].open()  # one ends: the next most urgent takes its slot
    nxt = sorted(range(8), key=lambda i: (-prio[i], i))[5]
    w.wait_for("the sixth run", lambda: runs[nxt] in w.groups()[0].runs)
    assert used(w) == [5]
    for name, g in gates.items():
        if name != "r1":
            g.open()
    poll_until("every run", lambda: all(state_of(store, r) is RunState.SUCCEEDED for r in runs))


# ------------------------------------------------------------------ the registry


def test_the_registry_shows_the_groups_and_their_use_and_reads_old_rows(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path
) -> None:
    rq = RunQueue(store)
    fast = queue_run(store, "fast", gated(gates, tmp_path, "fast"), queue="fast")
    w = start_worker(workers, rq, tmp_path, spec="fast:1 manual,*:4")
    # Either group may take it: "manual,*" serves every queue, and both look at start.
    w.wait_for("the fast run", lambda: sum(used(w)) == 1)
    held = used(w)
    with store.read() as conn:
        row = conn.exec_driver_sql("SELECT slots, queues FROM worker").one()
    assert row.slots == 5, "the join record's capacity: every group's slots"
    assert [(g["queues"], g["slots"]) for g in json.loads(row.queues)] == [
        (["fast"], 1),
        (["manual", "*"], 4),
    ]

    def listed() -> dict[str, Any]:
        with store.read() as conn:
            return {x["name"]: x for x in list_workers(conn, datetime.now(UTC))}

    poll_until(
        "the group's use reported",
        lambda: [g["used"] for g in listed()["w1"]["groups"]] == held,
    )
    me = listed()["w1"]
    assert (me["slots"], me["used"], me["free"], me["queues"]) == (5, 1, 4, None)
    assert me["groups"] == [
        {"queues": ["fast"], "slots": 1, "used": held[0], "runs": [fast] * held[0]},
        {"queues": ["manual", "*"], "slots": 4, "used": held[1], "runs": [fast] * held[1]},
    ]

    # A row written before slot groups (a list of queues, or nothing) is one group.
    old = WorkerInfo("old", "h", 1, 3, "1.0", NOW, queues=["gpu", "io"])
    rq.register(old, NOW)
    rq.register(WorkerInfo("older", "h", 2, 2, "1.0", NOW), NOW)
    assert listed()["old"]["queues"] == ["gpu", "io"]
    assert listed()["old"]["groups"] == [
        {"queues": ["gpu", "io"], "slots": 3, "used": 0, "runs": []}
    ]
    assert listed()["older"]["groups"] == [{"queues": ["*"], "slots": 2, "used": 0, "runs": []}]
    gates["fast"].open()
    w.wait_for("the end", lambda: used(w) == [0, 0])


def test_a_queue_that_no_lane_and_no_job_names_is_warned_of_at_the_start(
    store: Store, workers: list[Worker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped queue (``gpux`` for ``gpu``) is a slot group that never takes anything:
    said once as the worker starts. A queue with a lane, or with a job, is not."""
    with store.write() as conn:
        lanes.insert(conn, "fast", {}, NOW, "tester")
        queries.insert_job(
            conn, {"name": "render", "kind": "task", "command": "true", "queue": "render"}
        )
    with caplog.at_level(logging.WARNING, logger="jobcontrol.worker.local"):
        start_worker(workers, RunQueue(store), tmp_path, spec="fast:1 render:1 gpux:1 *:1")
    said = [r.getMessage() for r in caplog.records if "mistyped" in r.getMessage()]
    assert said == [
        "worker w1: no lane is named 'gpux' and no job runs in that queue (mistyped?): its "
        "slots take nothing until a job of queue 'gpux' runs"
    ]


class AnnouncingQueue(SpyQueue):
    """Queues and announces a run just after an end's claim found nothing: news that
    came while the group was still at capacity, so it did not kick the group."""

    def __init__(self, store: Store, mono: ManualMonotonic, queue: str) -> None:
        super().__init__(store, mono)
        self.queue = queue
        self.late: list[int] = []

    def finish(self, *args: Any, **kwargs: Any) -> Finished:
        done = super().finish(*args, **kwargs)
        if done.looked and done.next is None and not self.late:
            self.late.append(queue_run(self.store, "late", "true", queue=self.queue))
            events.runs_queued.send(self.store, run_ids=self.late)
        return done


@pytest.mark.parametrize("spec", ["fast:1", "*:1"])
def test_a_run_announced_while_an_ends_claim_found_nothing_is_claimed_at_once(
    store: Store, workers: list[Worker], gates: dict[str, Gate], tmp_path: Path, spec: str
) -> None:
    mono = ManualMonotonic()  # never moves: no back-off runs out, only news counts
    rq = AnnouncingQueue(store, mono, "fast")
    first = queue_run(store, "f0", gated(gates, tmp_path, "f0"), queue="fast")
    w = start_worker(workers, rq, tmp_path, spec=spec, mono=mono)
    w.wait_for("the first run", lambda: first in w.groups()[0].runs)
    gates["f0"].open()  # its end claims with it (the group is full), finds nothing...
    poll_until("the run announced meanwhile", lambda: bool(rq.late))
    # ... and the run announced meanwhile is claimed by the group's workloop at once.
    poll_until("the late run to succeed", lambda: state_of(store, rq.late[0]) is RunState.SUCCEEDED)
