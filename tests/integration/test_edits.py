"""Edits: refusals leave the database as it was, batches are one reaction, the tree stays true.

Spec 5 (the tree-state protocol: one transaction, one dispatcher reaction,
the state always back to IDLE) and DESIGN decisions 1, 5, 6 and 7.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from jobcontrol import Batch, JobChange, JobControlError, NewJob
from jobcontrol.errors import (
    ConflictError,
    JobError,
    JobRunningError,
    UnknownJobError,
)
from jobcontrol.model import RunState, TreeState
from jobcontrol.store import queries
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from jobcontrol.store.schema import job as job_table
from tests.integration.helpers import JC, USER, box, poll_until, task

pytestmark = pytest.mark.timeout(60)


def build_tree(jc: JC) -> None:
    jc.create(
        box("Top", timer="every 1h", active=True),
        box("A", "Top", active=True),
        box("B", "A", active=True),
        task("b1", "true", "B", active=True),
        task("a1", "true", "A", active=True),
        task("t1", "true", "Top", active=True),
        box("Other", active=True),
        task("o1", "sleep 1000", "Other", active=True),
    )


def start_o1(jc: JC) -> None:
    """Get o1 running (its process up and its pid recorded) so nothing moves meanwhile."""
    mark = jc.rec.mark()
    jc.run_now("o1")
    sig = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "o1", since=mark
    )
    jc.wait_task_process(sig.run["id"])


def change(jc: JC, job: str, **fields: Any) -> None:
    jc.engine.modify_jobs([JobChange(job, fields)], user=USER)


def create(jc: JC, *jobs: NewJob) -> None:
    jc.create(*jobs)


def fifty_changes_last_bad(last: JobChange) -> Callable[[JC], None]:
    def edit(jc: JC) -> None:
        good = [JobChange("t1" if i % 2 else "a1", {"description": f"edit {i}"}) for i in range(49)]
        good[10] = JobChange("Top", {"timer": "every 5m"})  # one that would re-arm a timer
        jc.engine.modify_jobs([*good, last], user=USER)

    return edit


def fifty_creates_last_duplicate(jc: JC) -> None:
    jobs = [task(f"new {i}", "true", "Top") for i in range(49)]
    jc.create(*jobs, task("a1", "true", "Top"))


@dataclass(frozen=True)
class Refusal:
    edit: Callable[[JC], object]
    error: type[JobControlError]
    job: str
    words: tuple[str, ...]
    running: bool = False


REFUSALS: dict[str, Refusal] = {
    "unknown parent": Refusal(
        lambda jc: create(jc, task("new", "true", "Nowhere")),
        JobError,
        "new",
        ("unknown parent 'Nowhere'",),
    ),
    "task as a parent": Refusal(
        lambda jc: create(jc, task("new", "true", "t1")),
        JobError,
        "new",
        ("'t1' is a task", "must be a box"),
    ),
    "cycle: box into its descendant": Refusal(
        lambda jc: change(jc, "A", parent="B"), JobError, "A", ("cycle",)
    ),
    "cycle: box into itself": Refusal(
        lambda jc: change(jc, "A", parent="A"), JobError, "A", ("cycle",)
    ),
    "box becomes a task": Refusal(
        lambda jc: change(jc, "A", command="echo hi"),
        JobError,
        "A",
        ("a box cannot become a task",),
    ),
    "task becomes a box": Refusal(
        lambda jc: change(jc, "t1", command=None),
        JobError,
        "t1",
        ("a task cannot become a box",),
    ),
    "duplicate name on create": Refusal(
        lambda jc: create(jc, task("a1", "true", "Top")), JobError, "a1", ("already exists",)
    ),
    "duplicate name on rename": Refusal(
        lambda jc: change(jc, "t1", name="a1"), JobError, "t1", ("'a1'", "exists")
    ),
    "invalid schedule on modify": Refusal(
        lambda jc: change(jc, "Top", timer="every 10x"),
        JobError,
        "Top",
        ("invalid schedule 'every 10x' at position 8", "unit"),
    ),
    "invalid schedule on create": Refusal(
        lambda jc: create(jc, box("new", "Top", timer="daily 25:00")),
        JobError,
        "new",
        ("at position 6", "hour"),
    ),
    "command sh -n rejects": Refusal(
        lambda jc: change(jc, "t1", command="echo 'unterminated"), JobError, "t1", ("sh:",)
    ),
    "unknown job": Refusal(
        lambda jc: change(jc, "ghost", description="boo"),
        UnknownJobError,
        "ghost",
        ("no such job",),
    ),
    "a job written as a path": Refusal(
        lambda jc: change(jc, "Top/t1", description="boo"),
        UnknownJobError,
        "Top/t1",
        ("no such job", "a job is named alone: 't1'"),
    ),
    "last of 50 changes makes a box a task": Refusal(
        fifty_changes_last_bad(JobChange("B", {"command": "true"})),
        JobError,
        "B",
        ("a box cannot become a task",),
    ),
    "last of 50 changes names an unknown job": Refusal(
        fifty_changes_last_bad(JobChange("ghost", {"active": True})),
        UnknownJobError,
        "ghost",
        ("no such job",),
    ),
    "last of 50 changes is a cycle": Refusal(
        fifty_changes_last_bad(JobChange("Top", {"parent": "B"})),
        JobError,
        "Top",
        ("cycle",),
    ),
    "last of 50 changes has a bad timer": Refusal(
        fifty_changes_last_bad(JobChange("a1", {"timer": "every"})),
        JobError,
        "a1",
        ("invalid schedule",),
    ),
    "last of 50 creates is a duplicate": Refusal(
        fifty_creates_last_duplicate, JobError, "a1", ("already exists",)
    ),
    "delete a running job": Refusal(
        lambda jc: jc.engine.delete_jobs(["o1"], user=USER),
        JobRunningError,
        "o1",
        ("job is running",),
        running=True,
    ),
    # One request, one answer: Inq committed each sub-tree on its own, so the idle box
    # named with a running job was deleted under a "refused" answer.
    "delete an idle tree and a running job": Refusal(
        lambda jc: jc.engine.delete_jobs(["o1", "Top"], user=USER),
        JobRunningError,
        "o1",
        ("job is running",),
        running=True,
    ),
    "delete a running job's box and an idle box": Refusal(
        lambda jc: jc.engine.delete_jobs(["A", "Other"], user=USER),
        JobRunningError,
        "Other",
        ("job is running",),
        running=True,
    ),
    "delete the box of a running job": Refusal(
        lambda jc: jc.engine.delete_jobs(["Other"], user=USER),
        JobRunningError,
        "Other",
        ("job is running", "'o1'"),
        running=True,
    ),
    "re-parent a running job": Refusal(
        lambda jc: change(jc, "o1", parent="Top"),
        JobRunningError,
        "o1",
        ("job is running",),
        running=True,
    ),
    "reorder a running job": Refusal(
        lambda jc: change(jc, "o1", job_order=5),
        JobRunningError,
        "o1",
        ("job is running", "reordered"),
        running=True,
    ),
    "re-parent the box of a running job": Refusal(
        lambda jc: change(jc, "Other", parent="A"),
        JobRunningError,
        "Other",
        ("job is running", "'o1'"),
        running=True,
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_edit_names_the_job_and_changes_nothing(jc: JC, case: str) -> None:
    refusal = REFUSALS[case]
    build_tree(jc)
    if refusal.running:
        start_o1(jc)
    before = jc.dump()
    reactions = jc.dispatcher.stats.reactions
    armed = jc.timers.armed()

    with pytest.raises(refusal.error) as refused:
        refusal.edit(jc)

    assert isinstance(refused.value, JobError)
    assert refused.value.job == refusal.job
    message = str(refused.value)
    assert message.startswith(f"job {refusal.job!r}: ")
    for word in refusal.words:
        assert word in message
    assert jc.tree_state() is TreeState.IDLE
    assert jc.dump() == before  # the database is exactly as it was
    assert jc.dispatcher.stats.reactions == reactions
    assert jc.timers.armed() == armed
    jc.assert_tree_matches_db()


def test_stale_version_is_a_conflict_and_changes_nothing(jc: JC) -> None:
    build_tree(jc)
    seen = jc.job("t1").version
    change(jc, "t1", description="someone else's edit")
    before = jc.dump()

    stale = JobChange("t1", {"description": "mine"}, version=seen)
    with pytest.raises(ConflictError) as refused:
        jc.engine.modify_jobs([stale], user=USER)

    assert refused.value.job == "t1"
    assert f"you had {seen}" in str(refused.value)
    assert jc.tree_state() is TreeState.IDLE
    assert jc.dump() == before
    current = jc.job("t1")
    assert current.description == "someone else's edit"
    # With the version just read, the same edit goes through.
    jc.engine.modify_jobs([JobChange("t1", {"description": "mine"}, current.version)], user=USER)
    assert jc.job("t1").description == "mine"


def test_an_edit_held_for_a_deleted_job_never_reaches_a_new_job(jc: JC) -> None:
    # A client holds edits by id and version. A job deleted before it ever ran left no
    # run naming its id; on SQLite the next job created took that id (at version 1 again),
    # and a client's edit meant for the deleted job was written to the new one.
    build_tree(jc)
    jc.create(task("victim", "echo victim", "Top"), task("later", "true", "Top"))
    victim = jc.job("victim")
    later = jc.job("later")
    jc.engine.delete_jobs(["later"], user=USER)
    jc.engine.delete_jobs(["victim"], user=USER)
    jc.create(task("innocent", "echo innocent", "Top"), task("second", "true", "Top"))
    new_ids = {jc.job("innocent").id, jc.job("second").id}
    assert not new_ids & {victim.id, later.id}, (new_ids, victim.id, later.id)
    before = jc.dump()

    held = JobChange(victim.id, {"command": "echo meant for victim"}, version=victim.version)
    with pytest.raises(UnknownJobError):
        jc.engine.modify_jobs([held], user=USER)
    assert jc.dump() == before
    assert jc.job("innocent").command == "echo innocent"


def test_a_good_edit_is_one_reaction_and_leaves_the_tree_idle_and_true(jc: JC) -> None:
    build_tree(jc)
    reactions = jc.dispatcher.stats.reactions
    mark = jc.rec.mark()
    jc.engine.apply_batch(
        Batch(
            creates=[task("t2", "true", "A", active=True)],
            changes=[JobChange("Top", {"timer": "every 5m"}), JobChange("a1", {"name": "a one"})],
            deletes=["t1"],
        ),
        user=USER,
    )
    assert jc.dispatcher.stats.reactions == reactions + 1
    assert jc.tree_state() is TreeState.IDLE
    assert [s.name for s in jc.rec.signals(since=mark) if s.name.startswith("job")] == [
        "job_created",
        "jobs_modified",
        "jobs_deleted",
    ]
    jc.assert_tree_matches_db()
    assert jc.job("Top").next_runs == jc.armed_at("Top") == jc.clock.now() + timedelta(minutes=5)
    assert jc.job("a one").parent_id == jc.job("A").id
    with pytest.raises(UnknownJobError):
        jc.job("t1")


def test_batch_of_500_modifications_is_one_reaction_and_one_evaluation_per_tree(jc: JC) -> None:
    trees = ("North", "South", "East")
    creates: list[NewJob] = []
    for tree in trees:
        creates += [box(tree, timer="every 1h", active=True), box(f"{tree} inner", tree)]
        creates += [task(f"{tree} {i}", "true", f"{tree} inner") for i in range(170)]
    creates.append(box("Untouched", timer="every 1h", active=True))
    jc.create(*creates)
    stats = jc.dispatcher.stats
    reactions, evaluations = stats.reactions, stats.reevaluations
    mark = jc.rec.mark()

    changes = [
        JobChange(f"{tree} {i}", {"active": True, "description": f"batch {i}"})
        for tree in trees
        for i in range(170)
    ][:500]
    modified = jc.engine.modify_jobs(changes, user=USER)

    assert len(modified) == 500
    assert stats.reactions - reactions == 1
    assert stats.reevaluations - evaluations == len(trees)
    bundles = jc.rec.signals("jobs_modified", since=mark)
    assert len(bundles) == 1
    assert len(bundles[0].data["jobs"]) == 500
    assert jc.tree_state() is TreeState.IDLE
    jc.assert_tree_matches_db()
    assert all(jc.job(f"{tree} 0").active for tree in trees)


def test_a_modify_that_changes_nothing_causes_no_reaction(jc: JC) -> None:
    build_tree(jc)
    before = jc.dump()
    reactions = jc.dispatcher.stats.reactions
    mark = jc.rec.mark()

    modified = jc.engine.modify_jobs(
        [
            JobChange("t1", {"command": "true", "active": "yes"}),
            JobChange("Top", {"timer": "every 1h"}),
        ],
        user=USER,
    )

    assert modified == []
    assert jc.dispatcher.stats.reactions == reactions
    assert jc.rec.signals(since=mark) == []
    assert jc.tree_state() is TreeState.IDLE
    assert jc.dump() == before  # not even the version moved


def test_deleting_a_box_together_with_its_descendant_deletes_the_box_first(jc: JC) -> None:
    build_tree(jc)
    a, b, b1 = (jc.job(n).id for n in ("A", "B", "b1"))

    result = jc.engine.delete_jobs(["b1", "B", "A"], user=USER)  # deepest named first

    assert result.deleted == [a]  # one sub-tree, one transaction; its descendants went with it
    assert result.deleted_jobs == 4  # A, B, b1 and a1
    remaining = {j["name"] for j in jc.engine.list_jobs()}
    assert remaining == {"Top", "t1", "Other", "o1"}
    for job_id in (a, b, b1):
        with pytest.raises(UnknownJobError):
            jc.job(job_id)
    assert jc.tree_state() is TreeState.IDLE
    jc.assert_tree_matches_db()


def test_creating_moving_and_deleting_timed_children_reschedules_their_trees(jc: JC) -> None:
    jc.create(
        box("Absolute", box_type="timed", active=True),
        task("foo", "true", "Absolute", timer="daily 22:56", active=True),
        task("bar", "true", "Absolute", timer="daily 22:59", active=True),
        box("Other", box_type="timed", active=True),
    )
    at = jc.clock.now().replace
    assert jc.armed_at("Absolute") == at(hour=22, minute=56)
    assert jc.armed_at("Other") is None

    jc.create(task("early", "true", "Absolute", timer="daily 13:00", active=True))
    assert jc.armed_at("Absolute") == jc.job("Absolute").next_runs == at(hour=13, minute=0)
    assert [jc.job(n).job_order for n in ("early", "foo", "bar")] == [0, 1, 2]

    jc.engine.delete_jobs(["early"], user=USER)
    assert jc.armed_at("Absolute") == at(hour=22, minute=56)

    jc.modify("foo", parent="Other")  # both trees are re-evaluated
    assert jc.armed_at("Absolute") == jc.job("Absolute").next_runs == at(hour=22, minute=59)
    assert jc.armed_at("Other") == jc.job("Other").next_runs == at(hour=22, minute=56)
    assert jc.tree_state() is TreeState.IDLE
    jc.assert_tree_matches_db()


def test_a_job_deleted_or_moved_away_while_its_box_runs_is_not_run_by_it(jc: JC) -> None:
    gate = jc.gate()
    jc.create(
        box("Top", active=True),
        task("first", gate.command, "Top", active=True),
        task("deleted", "echo ran", "Top", active=True),
        task("moved", "echo ran", "Top", active=True),
        task("stays", "true", "Top", active=True),
        box("Elsewhere", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("Top")  # blocks in "first"
    jc.engine.delete_jobs(["deleted"], user=USER)  # not running yet: allowed
    jc.modify("moved", parent="Elsewhere")
    gate.open()
    jc.rec.run_finished("Top", since=mark)

    assert set(jc.tree_run(root)) == {"Top", "first", "stays"}
    assert jc.runs("moved") == []
    mark = jc.rec.mark()
    elsewhere = jc.run_now("Elsewhere")
    jc.rec.run_finished("Elsewhere", since=mark)
    assert set(jc.tree_run(elsewhere)) == {"Elsewhere", "moved"}
    jc.assert_tree_matches_db()


def test_a_run_waiting_in_the_queue_runs_its_task_as_edited_meanwhile(jc: JC) -> None:
    """A run queued in a drained lane, its task edited while it waits: it is claimed at
    once from the queue it was moved to, and runs the command as it is now."""
    jc.engine.lanes.add_lane("slow", {}, user=USER)
    jc.engine.lanes.drain("slow", user=USER)
    jc.create(task("waiter", "echo old", active=True, queue="slow", timeout_s=60))
    mark = jc.rec.mark()
    run_id = jc.run_now("waiter")
    jc.sync()
    assert jc.run(run_id).state is RunState.QUEUED

    jc.modify("waiter", command="echo new", queue="default", timeout_s=30)

    done = jc.rec.run_finished("waiter", since=mark)
    assert (done["id"], done["exit_status"]) == (run_id, 0)
    ran = jc.run(run_id)
    assert (ran.command, ran.queue, ran.timeout_s) == ("echo new", "default", 30)
    assert ran.log_path is not None
    assert Path(ran.log_path).read_text() == "new\n"


def test_a_queued_run_takes_its_tasks_new_priority_unless_reprioritized_by_hand(
    jc: JC,
) -> None:
    jc.engine.lanes.add_lane("slow", {}, user=USER)
    jc.engine.lanes.drain("slow", user=USER)
    jc.create(
        task("kept", "true", active=True, queue="slow"),
        task("follows", "true", active=True, queue="slow"),
    )
    kept, follows = jc.run_now("kept"), jc.run_now("follows")
    jc.sync()
    jc.engine.lanes.reprioritize(kept, 7, user=USER)

    jc.modify("kept", priority=7)  # the task given the run's own priority...
    jc.modify("kept", priority=3)  # ...and another: the run's was set by hand all the same
    jc.modify("follows", priority=3)

    assert jc.run(kept).priority == 7  # the operator's own
    assert (jc.run(kept).priority_by_hand, jc.run(follows).priority_by_hand) == (True, False)
    assert jc.run(follows).priority == 3
    assert jc.run(follows).state is RunState.QUEUED  # still waits in the drained lane


def test_a_sequences_next_task_waits_in_the_queue_from_its_predecessors_end(jc: JC) -> None:
    """Queued ahead when its predecessor started, it is claimable only from that end:
    its wait (the queue's view, health's oldest) counts from there, not from its row."""
    jc.engine.lanes.add_lane("slow", {}, user=USER)
    jc.engine.lanes.drain("slow", user=USER)
    gate = jc.gate()
    jc.create(
        box("Chain", active=True),
        task("c1", gate.command, "Chain", active=True),
        task("c2", "true", "Chain", active=True, queue="slow"),
    )
    mark = jc.rec.mark()
    jc.run_now("Chain")
    poll_until("c1 to run", lambda: jc.runs("c1") and jc.runs("c1")[0].pid is not None)
    jc.clock.set(jc.clock.now() + timedelta(minutes=10))
    gate.open()
    jc.rec.run_finished("c1", since=mark)
    ended = jc.runs("c1")[0].ended
    c2 = jc.runs("c2")[0]
    assert c2.state is RunState.QUEUED
    assert ended is not None
    assert c2.created < ended  # made ahead, ten minutes before

    [slow] = jc.engine.lanes.queue("slow")
    assert [(r["run_id"], r["queued_at"]) for r in slow["runs"]] == [(c2.id, ended)]
    with jc.store.read() as conn:
        assert queries.queued_by_queue(conn) == [("slow", 1, ended)]  # what health says


def test_a_tree_whose_task_waits_in_the_queue_is_said_to_wait_not_to_run(jc: JC) -> None:
    jc.engine.lanes.add_lane("slow", {}, user=USER)
    jc.engine.lanes.drain("slow", user=USER)
    jc.create(task("ticker", "true", active=True, queue="slow", timer="every 1m"))
    jc.run_now("ticker")
    jc.sync()

    with pytest.raises(JobRunningError, match=r"tree busy: 'ticker' waits in the queue \('slow'\)"):
        jc.run_now("ticker")
    jc.advance(to=jc.job("ticker").next_runs)  # its timer fires while the run waits
    skipped = jc.runs("ticker")[0]
    assert skipped.state is RunState.SKIPPED
    assert skipped.reason == "tree busy: 'ticker' waits in the queue ('slow')"


def test_a_running_task_run_keeps_the_command_it_started_with(jc: JC) -> None:
    gate = jc.gate()
    jc.create(task("busy", gate.command, active=True))
    mark = jc.rec.mark()
    run_id = jc.run_now("busy")
    poll_until("the task to be running", lambda: jc.run(run_id).pid is not None)

    jc.modify("busy", command="echo edited")
    gate.open()

    done = jc.rec.run_finished("busy", since=mark)
    assert done["exit_status"] == 0
    assert jc.run(run_id).command == gate.command
    assert jc.job("busy").command == "echo edited"


# ---------------------------------------------------------------- concurrency

THREADS = 8
ITERATIONS = 60


class Chaos:
    """Random edits and requests from many threads; only refusals are acceptable errors."""

    def __init__(self, jc: JC) -> None:
        self.jc = jc
        self.errors: list[BaseException] = []
        self.refused = 0
        self.done = 0
        self._lock = threading.Lock()

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        ops = [self.create, self.modify, self.modify, self.move, self.delete, self.run, self.run]
        ops += [self.tick, self.kill, self.restart]
        for i in range(ITERATIONS):
            op = rng.choice(ops)
            try:
                op(rng, f"{seed}.{i}")
            except JobControlError:
                with self._lock:
                    self.refused += 1
            except BaseException as exc:  # anything else is a bug
                with self._lock:
                    self.errors.append(exc)
            else:
                with self._lock:
                    self.done += 1

    def _jobs(self) -> list[dict[str, Any]]:
        return self.jc.engine.list_jobs()

    def _pick(self, rng: random.Random, kind: str | None = None) -> dict[str, Any] | None:
        jobs = [j for j in self._jobs() if kind is None or j["kind"] == kind]
        return rng.choice(jobs) if jobs else None

    def create(self, rng: random.Random, tag: str) -> None:
        parent = self._pick(rng, "box")
        name = f"new {tag}"
        parent_name = parent["name"] if parent else None
        if rng.random() < 0.3:
            self.jc.create(box(name, parent_name, active=rng.random() < 0.7))
        else:
            self.jc.create(
                task(
                    name, rng.choice(["true", "sleep 0.05"]), parent_name, active=rng.random() < 0.7
                )
            )

    def modify(self, rng: random.Random, tag: str) -> None:
        job = self._pick(rng)
        if job is None:
            return
        fields: dict[str, Any] = rng.choice(
            [
                {"active": not job["active"]},
                {"description": f"chaos {tag}"},
                {"job_order": rng.randint(0, 5)},
                {"timer": rng.choice([None, "every 30s", "daily 03:00"])},
                {"name": f"renamed {tag}"},
                {"on_error": rng.choice(["abort", "continue"])},
            ]
        )
        version = job["version"] if rng.random() < 0.5 else None
        self.jc.engine.modify_jobs([JobChange(job["id"], fields, version)], user=USER)

    def move(self, rng: random.Random, tag: str) -> None:
        job = self._pick(rng)
        parent = self._pick(rng, "box")
        if job is None:
            return
        target = parent["name"] if parent and rng.random() < 0.8 else None
        self.jc.engine.modify_jobs([JobChange(job["id"], {"parent": target})], user=USER)

    def delete(self, rng: random.Random, tag: str) -> None:
        jobs = [j for j in self._jobs() if j["depth"] > 0 or rng.random() < 0.2]
        if jobs:
            self.jc.engine.delete_jobs([rng.choice(jobs)["id"]], user=USER)

    def run(self, rng: random.Random, tag: str) -> None:
        job = self._pick(rng)
        if job is not None:
            self.jc.run_now(job["id"])

    def tick(self, rng: random.Random, tag: str) -> None:
        self.jc.timers.advance(timedelta(seconds=rng.choice([1, 10, 30])))

    def kill(self, rng: random.Random, tag: str) -> None:
        job = self._pick(rng)
        if job is not None:
            self.jc.engine.kill(job["id"], user=USER)

    def restart(self, rng: random.Random, tag: str) -> None:
        tops = [j for j in self._jobs() if j["depth"] == 0]
        if tops:
            self.jc.engine.restart(rng.choice(tops)["id"], user=USER)


@pytest.mark.timeout(120)
def test_concurrent_edits_and_runs_leave_the_tree_true_and_idle(jc: JC) -> None:
    build_tree(jc)
    jc.modify("o1", command="true")
    jc.create(
        box("Periodic", timer="every 30s", active=True),
        task("p1", "true", "Periodic", active=True),
        box("Timed", box_type="timed", active=True),
        task("early", "true", "Timed", timer="daily 12:01", active=True),
        task("late", "true", "Timed", timer="daily 12:03", active=True),
    )
    chaos = Chaos(jc)
    threads = [
        threading.Thread(target=chaos.worker, args=(seed,), name=f"chaos-{seed}")
        for seed in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not [t.name for t in threads if t.is_alive()], "a chaos thread hung"
    assert chaos.errors == []
    assert chaos.done + chaos.refused == THREADS * ITERATIONS
    assert chaos.done > THREADS * ITERATIONS // 3  # most operations went through

    jc.timers.advance(timedelta(hours=1))  # let waiting timed boxes go on
    # A timed box still waiting waits for a time the frozen clock never reaches (its child
    # was given "daily 03:00", or "every 30s" after a run in this last hour): kill it.
    for top in jc.engine.list_jobs():
        if top["depth"] == 0 and top["state"] != "idle":
            try:
                jc.engine.kill(top["id"], user=USER)
            except JobControlError:
                pass  # it ended meanwhile
    jc.wait_quiet(fire_due_timers=True)
    assert jc.tree_state() is TreeState.IDLE
    jc.assert_tree_matches_db()
    with jc.store.read() as conn:
        assert queries.active_runs(conn) == []  # every run ended and was recorded


def test_an_edit_takes_the_run_queued_ahead_away_in_its_own_commit(
    db_url: str, make_jc: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next task of a sequence waits queued ahead, made from the definitions as they
    were. An edit commits; a worker then records the running task's end before the
    dispatcher reacted to the edit (a busy moment, held open here). It must not take the
    run made before the edit: the next task runs with the definition as edited."""
    jc = make_jc(db_url, slots=0, poll_interval=3600.0)
    jc.create(
        box("Seq", active=True),
        task("first", "true", "Seq", active=True),
        task("second", "echo before", "Seq", active=True),
    )
    rq, now = _test_worker(jc), jc.clock.now()
    jc.run_now("Seq")
    (first,) = rq.claim("w1", "host-b", now, limit=4)
    assert first.job_name == "first"

    d = jc.dispatcher
    held, real = threading.Event(), d._handle

    def handle_when_let(*args: Any) -> None:
        held.wait(30)
        real(*args)

    monkeypatch.setattr(d, "_handle", handle_when_let)
    change = {"command": "echo after"}
    editing = threading.Thread(
        target=lambda: jc.engine.modify_jobs([JobChange("second", change)], user=USER)
    )
    editing.start()

    def committed() -> bool:
        with jc.store.read() as conn:
            query = select(job_table.c.command).where(job_table.c.name == "second")
            return conn.execute(query).scalar_one() == "echo after"

    try:
        poll_until("the edit to commit", committed)
        done = rq.finish(first.id, "w1", _success(now), 5, take_next=("host-b", lambda: now))
        assert done.recorded
        assert done.next is None, f"took {done.next.command!r}, made before the edit"
    finally:
        held.set()
        editing.join(30)
    jc.sync()
    _poll(jc)  # the end, heard by the back-up poll
    (second,) = rq.claim("w1", "host-b", jc.clock.now(), limit=4)
    assert (second.job_name, second.command) == ("second", "echo after")
    assert rq.finish(second.id, "w1", _success(jc.clock.now()), 5).recorded
    _poll(jc)  # its end heard, so no tree run is left for the teardown's stop


def test_a_run_queued_ahead_that_an_edit_took_away_is_forgotten_before_its_id_is_reused(
    sqlite_url: str, make_jc: Any
) -> None:
    """SQLite gives the largest id again once its row is gone: the dispatcher forgets the
    run queued ahead that an edit deleted before it inserts the next run, which may get
    that id, and it never cancels that other run in the old one's place."""
    jc = make_jc(sqlite_url, slots=0, poll_interval=3600.0)
    jc.create(
        box("Seq", active=True),
        task("first", "true", "Seq", active=True),
        task("second", "true", "Seq", active=True),
        task("Solo", "true", active=True),
    )
    rq, now = _test_worker(jc), jc.clock.now()
    jc.run_now("Seq")
    (first,) = rq.claim("w1", "host-b", now, limit=4)
    ahead = first.id + 1  # "second", queued ahead after it: the largest id
    jc.engine.modify_jobs([JobChange("Solo", {"description": "edited"})], user=USER)
    solo = jc.run_now("Solo")
    assert solo == ahead  # the id of the run the edit took away, given again

    assert rq.finish(first.id, "w1", _success(now), 5).recorded
    _poll(jc)  # the end, heard by the back-up poll
    assert jc.run(solo).state is RunState.QUEUED  # not cancelled as "second"'s run was
    claimed = {r.job_name: r for r in rq.claim("w1", "host-b", jc.clock.now(), limit=4)}
    assert sorted(claimed) == ["Solo", "second"]
    for run in claimed.values():
        assert rq.finish(run.id, "w1", _success(now), 5).recorded
    _poll(jc)
    assert jc.run(solo).state is RunState.SUCCEEDED
    assert jc.dispatcher.call(lambda: len(jc.dispatcher.runs.tree_runs)).result(10) == 0


def _test_worker(jc: JC) -> RunQueue:
    """The test as worker ``w1`` (the daemon has no embedded one: ``slots=0``)."""
    rq = RunQueue(jc.store, timedelta(seconds=30))
    now = jc.clock.now()
    rq.register(WorkerInfo("w1", "host-b", 4242, 4, "test", now), now)
    return rq


def _success(now: datetime) -> dict[str, Any]:
    """A task run's end: succeeded at ``now``."""
    return {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": now, "duration_ms": 5}


def _poll(jc: JC) -> None:
    """The dispatcher's back-up poll, now: it finds the ends nobody announced."""
    jc.dispatcher.post((jc.dispatcher._poll, None))
    jc.sync()


def test_a_new_job_never_takes_a_deleted_jobs_id_nor_its_history(jc: JC) -> None:
    """SQLite hands a new row the largest id + 1: the newest job deleted, the next one
    created took its id, and with it that job's runs (history, logs)."""
    jc.create(task("Alpha", "exit 3", active=True))
    alpha = jc.job("Alpha").id
    run_id = jc.run_now("Alpha")
    poll_until("Alpha's run to end", lambda: jc.run(run_id).state is RunState.FAILED)
    jc.wait_quiet()
    jc.engine.delete_jobs(["Alpha"], user=USER)

    beta = jc.create(task("Beta", "true"))["Beta"]

    assert beta > alpha
    assert jc.runs("Beta") == []


def test_a_batch_deleting_a_running_job_is_refused_naming_it_not_a_sibling(jc: JC) -> None:
    """`load --replace` of a file without a running task: the batch reorders the task's
    siblings and deletes it. The refusal names the running job it would delete, not the
    sibling whose reorder its deletion brings."""
    build_tree(jc)
    jc.create(task("o2", "true", "Other", active=True))
    mark = jc.rec.mark()
    jc.run_now("Other")  # a sequence: o1 runs, o2 waits
    sig = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "o1", since=mark
    )
    jc.wait_task_process(sig.run["id"])
    before = jc.dump()
    batch = Batch(changes=[JobChange("o2", {"job_order": 0})], deletes=["o1"])
    with pytest.raises(JobRunningError) as refused:
        jc.engine.apply_batch(batch, user=USER)
    assert refused.value.job == "o1", str(refused.value)
    assert "cannot be deleted" in str(refused.value)
    assert jc.dump() == before


def test_a_job_created_with_a_time_already_past_is_not_run_at_once(jc: JC) -> None:
    """A new job's time was never missed: `at` a year gone by (a typo in the year), or a
    box's child's, is skipped as after any edit, not run at once by the misfire rule
    (found by an outside trial: loading such a file started the work)."""
    jc.create(task("pastat", "echo past", timer="at 2001-01-14T09:00", active=True))
    jc.create(
        box("PastBox", active=True),
        task("pastchild", "echo past", "PastBox", timer="at 2020-05-05T05:05", active=True),
    )
    jc.create(task("soon", "true", timer="daily 12:30", active=True))  # later today
    jc.advance(0)
    jc.wait_quiet()
    assert [jc.runs(n) for n in ("pastat", "PastBox", "pastchild")] == [[], [], []]
    assert jc.armed_at("pastat") is None
    assert jc.armed_at("PastBox") is None
    assert jc.job("pastat").next_runs is None
    assert jc.armed_at("soon") == jc.clock.now().replace(hour=12, minute=30)
