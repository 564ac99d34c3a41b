"""The dispatcher's in-memory job tree and timer evaluation (spec 2.6, 4.5, 6.2).

Each node carries the job's stored fields (a ``JobRecord``), its volatile
state, and ``timer_due`` / ``timer_source``: the evaluated firing time of the
node's own or inherited schedule and the node whose schedule supplies it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from jobcontrol.errors import ScheduleError
from jobcontrol.model import JobRecord, JobRef, JobState, Misfire, find_job
from jobcontrol.timerexpr.expression import parse_timer

log = logging.getLogger(__name__)

_FAR = datetime.max


@dataclass(eq=False)
class Node:
    job: JobRecord
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    state: JobState = JobState.IDLE
    started: datetime | None = None
    run_id: int | None = None
    timer_due: datetime | None = None
    timer_source: Node | None = None

    @property
    def id(self) -> int:
        return self.job.id

    def top(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def ancestors(self) -> Iterator[Node]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def walk(self) -> Iterator[Node]:
        """This node and its descendants, pre-order, without recursion."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def depth(self) -> int:
        # A loop, not a count of ``ancestors()``: every event the tree's changes send
        # carries it, and the generator took 2.8 % of a busy daemon's lock-holding
        # samples (bench/README.md, thirtieth round).
        depth = 0
        node = self.parent
        while node is not None:
            depth += 1
            node = node.parent
        return depth


def sort_key(node: Node) -> tuple[bool, datetime, int]:
    """Next runs ascending with nulls last, then job order (spec 4.5)."""
    nr = node.job.next_runs
    return (nr is None, nr.replace(tzinfo=None) if nr else _FAR, node.job.job_order)


class JobTree:
    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.roots: list[Node] = []
        self.by_name: dict[str, Node] = {}

    @classmethod
    def build(cls, jobs: Iterable[JobRecord]) -> JobTree:
        tree = cls()
        records = list(jobs)
        for rec in records:
            node = Node(rec)
            tree.nodes[rec.id] = node
            tree.by_name[rec.name] = node
        for rec in sorted(records, key=lambda r: (r.job_order, r.id)):
            node = tree.nodes[rec.id]
            if rec.parent_id is None:
                tree.roots.append(node)
            else:
                parent = tree.nodes[rec.parent_id]
                node.parent = parent
                parent.children.append(node)
        return tree

    def in_order(self) -> list[tuple[Node, int]]:
        """Every node with its depth, parents before children, siblings in order."""
        out: list[tuple[Node, int]] = []
        stack = [(n, 0) for n in reversed(self.roots)]
        while stack:
            node, depth = stack.pop()
            out.append((node, depth))
            stack.extend((c, depth + 1) for c in reversed(node.children))
        return out

    def find(self, ref: JobRef) -> Node:
        """The node ``ref`` names (``model.find_job``'s rule); UnknownJobError if none."""
        return find_job(ref, self.nodes.get, self.by_name.get)

    def get(self, job_id: int) -> Node | None:
        return self.nodes.get(job_id)

    def add(self, rec: JobRecord) -> Node:
        node = Node(rec)
        self.nodes[rec.id] = node
        self.by_name[rec.name] = node
        self._attach(node)
        return node

    def _attach(self, node: Node) -> None:
        if node.job.parent_id is None:
            node.parent = None
            self.roots.append(node)  # new top-level jobs are appended (spec 2.6)
        else:
            parent = self.nodes[node.job.parent_id]
            node.parent = parent
            parent.children.append(node)

    def _detach(self, node: Node) -> None:
        siblings = self.roots if node.parent is None else node.parent.children
        siblings.remove(node)
        node.parent = None

    def update(self, rec: JobRecord) -> Node:
        """Replace a node's stored fields; moves it when its parent changed."""
        node = self.nodes[rec.id]
        old = node.job
        if old.name != rec.name:
            self.by_name.pop(old.name, None)
            self.by_name[rec.name] = node
        node.job = rec
        if old.parent_id != rec.parent_id:
            self._detach(node)
            self._attach(node)
        return node

    def remove(self, job_id: int) -> list[Node]:
        """Drop a node and its descendants; returns what was removed."""
        node = self.nodes.get(job_id)
        if node is None:
            return []
        self._detach(node)
        gone = list(node.walk())
        for n in gone:
            self.nodes.pop(n.id, None)
            if self.by_name.get(n.job.name) is n:
                del self.by_name[n.job.name]
        return gone


@dataclass
class Evaluator:
    """Evaluates schedules bottom-up and re-sorts levels; records what changed."""

    now: datetime
    default_tz: tzinfo
    changed: dict[int, Node] = field(default_factory=dict)
    # Evaluating as Inq does when a tree completes or is restarted (spec 7.9, 8.2): its
    # expressions read "now + 3s" then, so an ``every`` is at least its interval from now.
    from_now: bool = False
    # Evaluating a tree whose time was missed under ``misfire: skip`` (``skip_missed``):
    # each of its timers that is past moves to its own next occurrence after now.
    skipping: bool = False
    # At a daemon's start (and a resume of paused timers): the times the timed jobs inside
    # the active trees were armed for (their ``next_runs``), by job id (``keep_armed``).
    armed: dict[int, datetime] = field(default_factory=dict)

    def keep_armed(self, tops: Iterable[Node], ran: Collection[int] = ()) -> None:
        """At a daemon's start or a resume, before the evaluation: each timed job in an armed
        tree keeps the time it was armed for, as its top does (``start_due``). A time still
        ahead was not missed, whatever its schedule counted from its last run says (a
        never-run ``every`` counts from now, and would move at each start); a time past was
        missed, and its tree's ``misfire`` decides (skip: its next occurrence on the
        schedule's grid, as a top-level ``every``'s). One the job ran for (its run ended by
        the crash's recovery) counts from that run, as after any end, and so does the time
        of a job in ``ran`` (by id: it ran in a tree run recovery ended, a manual one too)."""
        for top in tops:
            if not top.job.active or top.job.next_runs is None:
                continue  # never armed, or an edit with no daemon cleared it: from now
            for node in top.walk():
                stored, last = node.job.next_runs, node.job.last_ran
                if node is top or node.job.timer is None or stored is None:
                    continue
                if node.id in ran or (stored <= self.now and last is not None and last >= stored):
                    continue
                self.armed[node.id] = stored

    def own_due(self, node: Node) -> datetime | None:
        job = node.job
        assert job.timer is not None
        try:
            schedule = parse_timer(job.timer)
        except ScheduleError:
            log.error("job %r has an invalid timer %r; it is not scheduled", job.name, job.timer)
            return None
        due = schedule.next_fire(
            now=self.now, last_ran=job.last_ran, last_end=job.last_end, default_tz=self.default_tz
        )
        if self.from_now and due is not None and schedule.kind == "every":
            # A child's ``every`` counts from its own end, which may be long past when
            # the rest of its tree completes: never sooner than the interval from now.
            floor = schedule.next_after(self.now, default_tz=self.default_tz)
            due = max(due, floor) if floor is not None else due
        # Armed before this start, and not run for since: kept, even where a run of its
        # tree that recovery ended counts as an end (a TIMED box's child not reached).
        due = self.armed.get(node.id, due)
        if self.skipping and due is not None and due <= self.now:
            due = schedule.skip_missed(due, now=self.now, default_tz=self.default_tz)
        return due

    def _set(self, node: Node, next_runs: datetime | None, job_order: int | None = None) -> None:
        job = node.job
        if job.next_runs != next_runs:
            job.next_runs = next_runs
            self.changed[job.id] = node
        if job_order is not None and job.job_order != job_order:
            job.job_order = job_order
            self.changed[job.id] = node

    def evaluate_level(self, level: list[Node], *, sort: bool = True) -> None:
        """Spec 4.5 ``evaluateChildTimers``, post-order, with the stale-timer fix of 14.6."""
        for node in level:
            if node.children:
                self.evaluate_level(node.children)
            job = node.job
            if job.timer is not None and (job.active or job.is_top_level):
                due = self.own_due(node)
                node.timer_due, node.timer_source = due, (node if due else None)
                self._set(node, due)
                continue
            first = node.children[0] if node.children else None
            if first is not None and first.timer_due is not None:
                node.timer_due, node.timer_source = first.timer_due, first.timer_source
                self._set(node, first.job.next_runs)
            else:
                node.timer_due, node.timer_source = None, None
                self._set(node, None)
        if sort and len(level) > 1:
            level.sort(key=sort_key)
            for i, node in enumerate(level):
                self._set(node, node.job.next_runs, i)
                if i > 0 and not node.job.is_top_level:
                    # Only the earliest timer of a level can be inherited upwards.
                    node.timer_due = node.timer_source = None

    def evaluate_tree(self, top: Node) -> datetime | None:
        """Re-evaluate one top-level tree; returns when its timer should fire (misfire applied)."""
        self.evaluate_level([top], sort=False)
        return self.tree_due(top)

    def tree_due(self, top: Node) -> datetime | None:
        """When an already evaluated top-level tree's timer should fire (misfire applied)."""
        due = top.timer_due
        if due is None or due > self.now or top.job.misfire is Misfire.RUN_ONCE:
            return due
        return self.skip_missed(top, due)

    def start_due(
        self, top: Node, stored: datetime | None, *, ended: bool = False
    ) -> datetime | None:
        """When an evaluated top-level tree's timer fires at a daemon's start, given the
        time ``stored`` that it was armed for (``next_runs``):

        * a time still ahead was armed for then (by the daemon before, or an edit's re-arm
          from now, spec 5.5) and is kept, whatever the schedule counted from the last
          run says (a never-run ``every`` counts from now, and would move at each start);
        * a time past was missed while no daemon ran: the tree's ``misfire`` decides,
          even where the schedule counted from the last run is ahead (a never-run
          ``daily`` counts from now, and would lose the day's run);
        * no time: nothing was armed (a tree never armed, an ABORT tree a failure left
          unscheduled, an edit made with no daemon): armed from now, as a restart of Job
          Control re-arms it (spec 7.4); nothing was missed;
        * a time past that the tree ran for (it started then or later: the daemon before
          died while that run was in flight, and start-up recovery ended it lost): it was
          not missed. The schedule counts from that run, as after any end; a time of it
          past since, while no daemon ran, is missed (``misfire``). Armed for the time it
          ran for, it ran that time twice, ``retries`` or not.
        * ``ended``: start-up recovery ended a run of the tree (lost), a manual one too:
          that end counts as any end of a run of it does (``TreeTimers.tree_done``),
          whatever time was stored.

        A tree whose run recovery ended is evaluated from that end, now, as after any
        end: an ``every`` of it at least its interval after it. Counted from its own
        end, long before, a child's ``every`` showed (and fired at) a time past, before
        its last run.
        """
        due = top.timer_due
        if due is None:
            return None
        if stored is None:
            return due if due > self.now else self.skip_missed(top, due)
        ran = top.job.last_ran
        if ended or (stored <= self.now and ran is not None and ran >= stored):
            self.from_now = True
            try:
                self.evaluate_level([top], sort=False)
            finally:
                self.from_now = False
            return self.tree_due(top)
        top.timer_due = stored
        self._set(top, stored)
        return stored if stored > self.now else self.tree_due(top)

    def skip_missed(self, top: Node, due: datetime) -> datetime | None:
        """The next occurrence after now of the schedule that supplies ``top``'s timer.

        Where a child supplies it, the tree is evaluated again with every timer of it
        that is past moved to its own next occurrence: the child's time too, and a TIMED
        box's other children, which would otherwise keep their past times and run at
        once, at times their schedules never name (their level is sorted again, spec 4.5).
        """
        source = top.timer_source
        if source is None or source.job.timer is None:
            return None
        if source is not top:
            self.skipping = True
            try:
                self.evaluate_level([top], sort=False)
            finally:
                self.skipping = False
            return top.timer_due
        schedule = parse_timer(source.job.timer)
        nxt = schedule.skip_missed(due, now=self.now, default_tz=self.default_tz)
        top.timer_due = nxt
        self._set(top, nxt)
        return nxt
