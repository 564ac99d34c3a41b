"""The run queue: the one seam between the dispatcher and any worker (DESIGN "Components").

A worker only ever calls ``RunQueue``'s methods (an import-linter contract keeps it off
``queries`` and the schema); each is one short transaction of its own. The dispatcher
queues task runs and reads finished ones inside its own transactions (``queries``),
and settles the runs of workers whose lease ran out (``expired_leases``, with the
final columns of ``lost_end``).

Every state write is compare-and-set: a claim takes a run only while it is
``queued``; a finish, a pid or a lease renewal touches a run only while it is
``running`` *and held by the worker that says so*, so a worker that comes back
after its runs were settled can change nothing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Boolean,
    Connection,
    Integer,
    Select,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    null,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from jobcontrol.errors import JobControlError
from jobcontrol.model import DB_LOG, KILLED_STATUS, RunRecord, RunState
from jobcontrol.slotgroups import WILDCARD, SlotGroup
from jobcontrol.store import Store, lanes, queries, runlogs
from jobcontrol.store.lanes import Lanes
from jobcontrol.store.prepared import Prepared
from jobcontrol.store.schema import UTCDateTime, job, run, run_log, worker

DEFAULT_LEASE = timedelta(seconds=30)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker says of itself when it joins (the registry row)."""

    name: str
    host: str
    pid: int
    slots: int
    version: str
    started: datetime
    queues: list[str] | None = None  # None: every queue
    proc_start: int | None = None
    containment: str | None = None  # how it contains task runs (cgroups.py)
    groups: list[SlotGroup] | None = None  # its slot groups (None: one group of ``queues``)

    def registry_queues(self) -> str | None:
        """The registry row's ``queues`` text: its slot groups, as JSON."""
        if self.groups is None:
            return json.dumps(self.queues) if self.queues is not None else None
        return groups_json(self.groups)


def groups_json(groups: Sequence[SlotGroup], runs: Sequence[Sequence[int]] = ()) -> str:
    """The registry's ``queues`` column of a worker with slot groups: one object per
    group, its queues in order and its slots, and the runs each holds (``runs``, as the
    worker last reported them)."""
    out: list[dict[str, Any]] = []
    for i, g in enumerate(groups):
        item: dict[str, Any] = {"queues": list(g.queues), "slots": g.slots}
        if runs:
            item["runs"] = sorted(runs[i])
        out.append(item)
    return json.dumps(out)


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat tells the worker: runs to kill, and runs no longer its own."""

    kill: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # every run running under the worker
    queued: bool = False  # whether any run at all is queued (an idle worker's look)


@dataclass(frozen=True)
class Finished:
    """The result of ``finish``: whether the outcome was recorded, logs to prune, and the
    run queued ahead after it, now claimed by the same worker (or None)."""

    recorded: bool
    stale_logs: list[str] = field(default_factory=list)
    next: RunRecord | None = None
    # ``then_claim`` was tried (not on PostgreSQL while a lane has a cap): ``next`` is
    # what it found, and None means no run of those queues was claimable at the time.
    looked: bool = False


@dataclass(frozen=True)
class ThenClaim:
    """With ``finish``: the slot that recorded an end claims one more queued run, of
    ``queues`` (a slot group's, as ``claim`` takes them), in the same transaction on
    SQLite and on the same connection on PostgreSQL, when no run queued ahead was
    taken. A busy worker's next run then needs no claim of its own, and no hand-off
    from the thread that claims to the slot's thread (bench/README.md, forty-fourth
    round)."""

    host: str
    clock: Callable[[], datetime]
    queues: Sequence[str] | None


# What a claim writes: the run is this worker's, from now, under a lease: the lease its
# lane gives (``stale_timeout_s``), or the run queue's own when it was given one.
def _claimed(fixed_lease: bool) -> dict[str, Any]:
    return {
        "state": str(RunState.RUNNING),
        "started": bindparam("v_started"),
        "worker": bindparam("v_worker"),
        "host": bindparam("v_host"),
        "lease_until": bindparam("v_lease") if fixed_lease else lanes.run_lease("v_started"),
    }


_QUEUED = and_(run.c.id == bindparam("w_id"), run.c.state == str(RunState.QUEUED))
# After the lane-aware pick (``RunQueue.claim``), which counted what a capped lane has room for.
_CLAIM_PICKED = {
    fixed: Prepared(
        update(run).where(_QUEUED).values(_claimed(fixed)).returning(*run.c), list(run.c)
    )
    for fixed in (True, False)
}
# A run named by its id, in one statement, while its lane needs no count (no cap, open).
_CLAIM_BY_ID = {
    fixed: Prepared(
        update(run).where(_QUEUED, lanes.fast_lane()).values(_claimed(fixed)).returning(*run.c),
        list(run.c),
    )
    for fixed in (True, False)
}


@functools.lru_cache(maxsize=64)
def _pick_stmt(
    by_queue: bool,
    skip_locked: bool,
    excluding: bool = False,
    named_only: bool = False,
    skipping: bool = False,
    by_id: bool = False,
    preferred: int = 0,
) -> Select[Any]:
    """Queued runs in claim order (priority, then oldest): of the served queues, not of the
    excluded lanes (``w_excluded``; ``w_named``: only the queues with a lane row, when
    ``default`` is excluded), not the runs already turned down (``w_skip``).

    ``preferred``: a slot group in preference mode named that many queues before its ``*``
    (``w_pref0``...): their runs come first, in the order named, then every other run."""
    pick = select(run.c.id, run.c.queue).where(run.c.state == str(RunState.QUEUED))
    if by_id:
        pick = pick.where(run.c.id == bindparam("w_id"))
    if by_queue:
        pick = pick.where(run.c.queue.in_(bindparam("w_queues", expanding=True)))
    if excluding:
        pick = pick.where(run.c.queue.not_in(bindparam("w_excluded", expanding=True)))
    if named_only:
        pick = pick.where(run.c.queue.in_(bindparam("w_named", expanding=True)))
    if skipping:
        pick = pick.where(run.c.id.not_in(bindparam("w_skip", expanding=True)))
    order: list[Any] = [run.c.priority.desc(), run.c.id]
    if preferred:
        position = case(
            *((run.c.queue == bindparam(f"w_pref{i}"), i) for i in range(preferred)),
            else_=preferred,
        )
        order.insert(0, position)
    pick = pick.order_by(*order).limit(bindparam("w_limit"))
    if skip_locked:
        pick = pick.with_for_update(skip_locked=True)
    return pick


@functools.lru_cache(maxsize=64)
def _claim_stmt(
    by_queue: bool,
    skip_locked: bool,
    excluding: bool,
    named_only: bool,
    preferred: int,
    fixed: bool,
) -> Prepared:
    """The claim in one statement, for when no lane needs a count: the pick (claim order,
    locked ``SKIP LOCKED``) is the subquery of the update that takes its runs. The update
    checks each run's lane again (``fast_lane``), so a lane capped, drained or stopped
    since the caller last read the lanes loses no run to it."""
    pick = _pick_stmt(by_queue, skip_locked, excluding, named_only, False, False, preferred)
    # A materialized CTE, evaluated once: as a plain ``IN (subquery)`` PostgreSQL may
    # re-run the locked pick while re-checking a row a concurrent claim changed, and
    # hand out more runs than the limit.
    picked = (
        pick.with_only_columns(run.c.id)
        .cte("picked")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    claim = (
        update(run)
        .where(
            run.c.id.in_(select(picked.c.id)),
            run.c.state == str(RunState.QUEUED),
            lanes.fast_lane(),
        )
        .values(_claimed(fixed))
        .returning(*run.c)
    )
    return Prepared(claim, list(run.c))


# How long a claimer trusts its last read of the lanes to choose the one-statement
# claim (it re-reads sooner when a claim comes back short). The statement itself
# reads each run's lane as it is, so a stale read can only cost claim order.
LANES_FRESH = timedelta(seconds=1)

_HELD = and_(run.c.worker == bindparam("w_worker"), run.c.state == str(RunState.RUNNING))
_RECORD_PID = (
    update(run)
    .where(run.c.id == bindparam("w_id"), _HELD)
    .values(pid=bindparam("v_pid"), log_path=bindparam("v_log"))
)
# Each run's lease renewed for its own lane's length, in one statement.
_RENEW = {
    True: Prepared(update(run).where(_HELD).values(lease_until=bindparam("v_lease"))),
    False: Prepared(update(run).where(_HELD).values(lease_until=lanes.run_lease("v_now"))),
}


def _successor(ok: bool, after: Any = None) -> Any:
    """The run queued ahead after ``w_id`` (or the runs ``after`` names) that the end
    just recorded releases."""
    if after is None:
        after = run.c.after_run_id == bindparam("w_id")
    cond = and_(after, run.c.state == str(RunState.PENDING))
    return cond if ok else and_(cond, run.c.after_ok_only.is_(False))


def _lease(fixed: bool) -> Any:
    """The lease a claim gives: the run queue's own, or the run's lane's."""
    return bindparam("v_lease", type_=UTCDateTime()) if fixed else lanes.run_lease("v_started")


def _take_or_release(go: Any, lease: Any) -> dict[str, Any]:
    """Claimed at once when its lane needs no count (``go``, the lane's rule, with the
    ``lease`` it gives); else released to the queue, where a claim that counts (or a
    resume) takes it: one statement either way."""

    def when(value: Any) -> Any:
        return case((go, value), else_=null())

    return {
        "state": case((go, str(RunState.RUNNING)), else_=str(RunState.QUEUED)),
        "started": when(bindparam("v_started", type_=UTCDateTime())),
        "worker": when(bindparam("v_worker", type_=String())),
        "host": when(bindparam("v_host", type_=String())),
        "lease_until": when(lease),
    }


def _next_rule(ok: bool, fixed: bool, after: Any = None) -> Select[Any]:
    """The run(s) queued after ``w_id`` (or the runs ``after`` names) that the end just
    recorded releases, with their lane's rule (``go``) and the lease a claim gives."""
    go = lanes.fast_lane().label("go")
    return select(run.c.id, go, _lease(fixed).label("lease")).where(_successor(ok, after))


# SQLite's take-next, in two statements of the finish's transaction: the lane rule read
# once, then each run taken (or released) by id. As one UPDATE whose every column re-read
# the rule (twelve subqueries, sixty parameters) it cost SQLite 0.4 ms of CPU per task.
def _prepared_rule(ok: bool, fixed: bool) -> Prepared:
    rule = _next_rule(ok, fixed)
    return Prepared(rule.order_by(run.c.id), list(rule.selected_columns))


_NEXT_RULE = {
    (ok, fixed): _prepared_rule(ok, fixed) for ok in (True, False) for fixed in (True, False)
}
_TAKE_BY_ID = Prepared(
    update(run)
    .where(run.c.id == bindparam("w_next"), run.c.state == str(RunState.PENDING))
    .values(
        _take_or_release(
            bindparam("v_go", type_=Boolean()), bindparam("v_lease_until", type_=UTCDateTime())
        )
    )
    .returning(*run.c),
    list(run.c),
)
# A job's logs past its newest ``w_keep`` (``_prune``): none, nearly always.
_LOGS_PAST = Prepared(
    select(run.c.id, run.c.log_path)
    .where(run.c.job_id == bindparam("w_job"), run.c.log_path.is_not(None))
    .order_by(run.c.id.desc())
    .offset(bindparam("w_keep", type_=Integer())),
    (run.c.id, run.c.log_path),
)
_RELEASE_NEXT = {
    ok: Prepared(update(run).where(_successor(ok)).values(state=str(RunState.QUEUED)))
    for ok in (True, False)
}
_BEAT = update(worker).where(worker.c.name == bindparam("w_worker"))
# The heartbeat's statements, prepared: an idle worker's heartbeat is most of what an
# idle daemon does, and Core's statement building and caching touched enough memory to
# cost twice the driver's CPU after a few seconds asleep on a host that takes back
# memory left alone (bench/README.md, twelfth round).
_BEAT_ONLY = Prepared(_BEAT.values(heartbeat=bindparam("v_beat"), beat_s=bindparam("v_every")))
_BEAT_PROBLEMS = Prepared(
    _BEAT.values(
        heartbeat=bindparam("v_beat"),
        beat_s=bindparam("v_every"),
        log_problems=bindparam("v_problems"),
        log_problem=bindparam("v_problem"),
    )
)
_HELD_ROWS = Prepared(
    select(run.c.id, run.c.kill_requested).where(_HELD), [run.c.id, run.c.kill_requested]
)
# Whether any run at all is queued: an idle group's back-off look, answered on the driver.
_SOME_QUEUED = Prepared(
    select(run.c.id).where(run.c.state == str(RunState.QUEUED)).limit(1), [run.c.id]
)


class RunQueue:
    """The run-queue operations of one store, each its own transaction."""

    def __init__(self, store: Store, lease: timedelta | None = None) -> None:
        """``lease``: one lease length for every run this queue hands out; None (the
        daemon's way): each run's lane's ``stale_timeout_s``."""
        self.store = store
        self.lease = lease
        self._lanes_read: tuple[datetime, Lanes] | None = None  # (when, what): ``_read_lanes``

    def _read_lanes(self, conn: Connection, now: datetime) -> Lanes:
        """The lanes as they are, kept for the next claims' choice of statement."""
        known = lanes.load(conn)
        self._lanes_read = (now, known)
        return known

    def _lanes_read_since(self, now: datetime) -> Lanes | None:
        """The last read of the lanes while it is fresh (``LANES_FRESH``), else None."""
        seen = self._lanes_read
        if seen is not None and seen[0] <= now < seen[0] + LANES_FRESH:
            return seen[1]
        return None

    def _times(self, now: datetime) -> dict[str, Any]:
        return {"v_now": now, "v_lease": now + (self.lease or DEFAULT_LEASE)}

    def _stamp(self, name: str, host: str, at: datetime) -> dict[str, Any]:
        """What a claim writes of its worker and time: started, worker, host, lease."""
        return {"v_started": at, "v_worker": name, "v_host": host, **self._times(at)}

    def lanes(self) -> Lanes:
        """The lane table as it is now (a worker re-reads it when told and as a back-up)."""
        with self.store.read_one() as conn:
            return lanes.load(conn)

    def lanes_if_written(self, mark: Hashable | None) -> tuple[Lanes | None, Hashable | None]:
        """The lane table and a mark of the database as it was read, or ``(None, mark)``
        when nothing at all was written to the database since ``mark`` was taken (SQLite,
        on the same pinned connection: ``Store.change_mark``). Elsewhere always a read."""
        now = self.store.change_mark()
        if now is not None and now == mark:
            return None, mark
        return self.lanes(), now

    # ---------------------------------------------------------- the registry

    def register(self, info: WorkerInfo, now: datetime) -> None:
        """Join (or re-join under the same name): the row says who, where, how big, since when."""
        values = {
            "host": info.host,
            "pid": info.pid,
            "proc_start": info.proc_start,
            "slots": info.slots,
            "queues": info.registry_queues(),
            "version": info.version,
            "started": info.started,
            "heartbeat": now,
            "beat_s": None,  # said by its first beat, at once
            "stopped": None,
            "containment": info.containment,
            "log_problems": 0,  # a new life: what the last one met is in its log
            "log_problem": None,
        }
        with self.store.write() as conn:
            if conn.dialect.name == "postgresql":
                values["login"] = func.current_user()  # whose rows these are (0013)
            updated = conn.execute(
                update(worker).where(worker.c.name == info.name).values(values)
            ).rowcount
            if not updated:
                try:
                    conn.execute(worker.insert().values(name=info.name, **values))
                except IntegrityError:
                    # The name is there, but row-level security hid it from this login.
                    raise JobControlError(
                        f"worker name {info.name!r} belongs to another worker login: "
                        "give this one another --name"
                    ) from None

    def report_groups(self, name: str, groups: str) -> None:
        """Which runs each of the worker's slot groups holds now (``groups_json``): the
        per-group use ``jobcontrol workers`` shows."""
        with self.store.write() as conn:
            conn.execute(update(worker).where(worker.c.name == name).values(queues=groups))

    def deregister(self, name: str, now: datetime) -> None:
        with self.store.write() as conn:
            conn.execute(update(worker).where(worker.c.name == name).values(stopped=now))

    def heartbeat(
        self,
        name: str,
        now: datetime,
        mine: Sequence[int] = (),
        *,
        log_problems: tuple[int, str | None] | None = None,
        every: float | None = None,
    ) -> Heartbeat:
        """Say the worker lives, renew the lease of every run it holds, and hear of kills,
        of which of ``mine`` (the runs it thinks it holds) were settled meanwhile and of
        whether any run is queued at all. ``log_problems``: (how many runs' output met a
        problem, the last one), for its row. ``every``: the longest it means to go until
        its next beat (``beat_s``: whoever judges whether it lives goes by it)."""
        beat = {"w_worker": name, "v_beat": now, "v_every": every}
        with self.store.write() as conn:
            if log_problems is None:
                _BEAT_ONLY.execute(conn, beat)
            else:
                problems, problem = log_problems
                _BEAT_PROBLEMS.execute(conn, {**beat, "v_problems": problems, "v_problem": problem})
            _RENEW[self.lease is not None].execute(conn, {"w_worker": name, **self._times(now)})
            rows = _HELD_ROWS.all(conn, {"w_worker": name})
            kill = [r["id"] for r in rows if r["kill_requested"]]
            held = {r["id"] for r in rows}
            return Heartbeat(
                kill=kill,
                settled=[r for r in mine if r not in held],
                held=sorted(held),
                queued=bool(_SOME_QUEUED.all(conn, {})),
            )

    def release_strays(self, name: str, run_ids: Sequence[int]) -> list[int]:
        """Put back in the queue runs held by worker ``name`` that it never started.

        A claim (or a sequence's next task taken with an end) whose COMMIT reached the
        database while its answer was lost with the connection: the run is the worker's
        in the database, but the worker never heard so and runs nothing for it. Only a
        run with no process recorded (``pid``) goes back, compare-and-set, as it was
        before the claim."""
        if not run_ids:
            return []
        stmt = (
            update(run)
            .where(run.c.id.in_(list(run_ids)), _HELD, run.c.pid.is_(None))
            .values(
                state=str(RunState.QUEUED), started=None, worker=None, host=None, lease_until=None
            )
            .returning(run.c.id)
        )
        with self.store.write() as conn:
            return sorted(r.id for r in conn.execute(stmt, {"w_worker": name}))

    def holds(self, name: str, run_ids: Sequence[int]) -> list[int]:
        """Which of ``run_ids`` are still running under this worker (the others were settled)."""
        with self.store.read() as conn:
            return _held(conn, name, run_ids)

    # ---------------------------------------------------------- claiming

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
        """Take up to ``limit`` queued runs (most urgent first), or the one named, atomically.

        ``queues``: a slot group's list (``slotgroups``): without ``*`` only runs of those
        queues (filter mode); ending in ``*`` every run, those of the queues named first in
        the order named (preference mode); None: every run.

        ``limit`` is the caller's free slots: never more is returned. On PostgreSQL the
        candidates are locked ``FOR UPDATE SKIP LOCKED``, so claimers never wait on each
        other; on SQLite ``BEGIN IMMEDIATE`` serialises them.

        ``clock``: read again once a capped lane has been counted (its row locked), so a
        run's ``started`` is no earlier than the count that gave it its slot: ``now`` is
        read before the claim waits for the lock, meanwhile a run of the lane may end,
        and the run rows' intervals would then show more runs at once than the cap let
        run (a loaded worker waits tens of milliseconds).
        """
        if limit < 1:
            return []

        def stamped_in_lock() -> dict[str, Any]:
            # SQLite: the write lock is had only now, maybe a busy timeout after ``now``
            # (another process held it): the runs start now, not before.
            return (
                self._stamp(name, host, clock())
                if clock is not None and self.store.is_sqlite
                else params
            )

        params = self._stamp(name, host, now)
        fixed = self.lease is not None
        claimed: list[RunRecord] = []
        read = self._lanes_read_since(now) if run_id is None else None
        if read is not None and not read.capped():
            # The usual case: one statement, no transaction around it.
            with self.store.single() as conn:
                claimed = self._claim_uncounted(conn, stamped_in_lock(), read, queues, limit)
            if len(claimed) == limit:
                return claimed
        with self.store.write() as conn:
            params = stamped_in_lock()
            if run_id is not None:
                row = _CLAIM_BY_ID[fixed].first(conn, {"w_id": run_id, **params})
                if row is not None:
                    return [queries.run_from_row(row)]
                # Taken by someone else, or its lane needs a count (capped) or refuses it
                # (drained, stopped): the lane-aware claim decides, for this run alone.
                return self._claim_in_lanes(conn, params, None, 1, only_id=run_id, clock=clock)
            # The queue may be short, or a lane may have changed since the last read:
            # read them again, and claim the rest by the rules they say now.
            known = self._read_lanes(conn, now)
            rest = limit - len(claimed)
            if known.capped():
                return claimed + self._claim_in_lanes(
                    conn, params, queues, rest, known=known, clock=clock
                )
            return claimed + self._claim_uncounted(conn, params, known, queues, rest)

    def _claim_uncounted(
        self,
        conn: Connection,
        params: dict[str, Any],
        known: Lanes,
        queues: Sequence[str] | None,
        limit: int,
    ) -> list[RunRecord]:
        """Up to ``limit`` runs in one statement, while no lane has a cap: the usual case,
        and the one that must be fast (README "Lanes")."""
        excluded = known.blocked()
        named_only = lanes.DEFAULT_LANE in excluded
        queues, preferred = _preference(queues)
        stmt = _claim_stmt(
            queues is not None,
            not self.store.is_sqlite,
            bool(excluded),
            named_only,
            len(preferred),
            self.lease is not None,
        )
        args = {**params, **_pick_params(known, queues, preferred, excluded, limit)}
        runs = [queries.run_from_row(row) for row in stmt.all(conn, args)]
        # RETURNING keeps no order: hand them out in claim order.
        position = {q: i for i, q in enumerate(preferred)}
        runs.sort(key=lambda r: (position.get(r.queue, len(preferred)), -r.priority, r.id))
        return runs

    def _claim_in_lanes(
        self,
        conn: Connection,
        params: dict[str, Any],
        queues: Sequence[str] | None,
        limit: int,
        *,
        only_id: int | None = None,
        known: Lanes | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> list[RunRecord]:
        """Pick in claim order, skipping drained and stopped lanes; for a capped lane, lock
        its row first (PostgreSQL; SQLite's write transaction is already the only one),
        count its running runs, and take no more than it has room for. A run of a lane
        found full is turned down and the pick goes on without that lane, until ``limit``
        runs are taken.
        After a count, the runs are stamped from ``clock`` (see ``claim``)."""
        if known is None:
            known = lanes.load(conn)
        excluded = known.blocked()
        room: dict[str, int] = {}  # capped lanes counted (and locked) so far: runs they may start
        skip: list[int] = []
        claimed: list[RunRecord] = []
        if only_id is None and not self.store.is_sqlite:
            # Lock the capped lanes this claim can take from before picking, so claimers of
            # one capped lane pick in turn: a claimer that picked past runs another had
            # locked (SKIP LOCKED) could otherwise win the lane's last slot for a less urgent
            # run. (SQLite's write transaction already makes each claim the only one.)
            served = {lane_.name for lane_ in known.served(_preference(queues)[0])}
            ahead = (known.capped() & served) - excluded
            if ahead:
                self._count(conn, known, ahead, room, excluded, params, clock)
                excluded.update(name for name, left in room.items() if left <= 0)
        while len(claimed) < limit:
            picked = self._pick(conn, known, queues, excluded, skip, limit - len(claimed), only_id)
            if not picked:
                break
            uncounted = {known.name_of(q) for _, q in picked} & (known.capped() - room.keys())
            if uncounted:
                self._count(conn, known, uncounted, room, excluded, params, clock)
            turned_down = False
            for run_id, queue in picked:
                name = known.name_of(queue)
                if name in excluded or room.get(name, 1) <= 0:
                    excluded.add(name)
                    skip.append(run_id)
                    turned_down = True
                    continue
                row = _CLAIM_PICKED[self.lease is not None].first(conn, {"w_id": run_id, **params})
                if row is None:
                    continue
                claimed.append(queries.run_from_row(row))
                if name in room:
                    room[name] -= 1
            if not turned_down:
                break
        return claimed

    def _pick(
        self,
        conn: Connection,
        known: Lanes,
        queues: Sequence[str] | None,
        excluded: set[str],
        skip: list[int],
        limit: int,
        only_id: int | None,
        *,
        skip_locked: bool | None = None,
    ) -> list[tuple[int, str]]:
        named_only = lanes.DEFAULT_LANE in excluded
        queues, preferred = _preference(queues)
        stmt = _pick_stmt(
            queues is not None,
            (not self.store.is_sqlite) if skip_locked is None else skip_locked,
            bool(excluded),
            named_only,
            bool(skip),
            only_id is not None,
            len(preferred),
        )
        params = _pick_params(known, queues, preferred, excluded, limit)
        if skip:
            params["w_skip"] = skip
        if only_id is not None:
            params["w_id"] = only_id
        return [(r.id, r.queue) for r in conn.execute(stmt, params)]

    def _count(
        self,
        conn: Connection,
        known: Lanes,
        names: set[str],
        room: dict[str, int],
        excluded: set[str],
        params: dict[str, Any],
        clock: Callable[[], datetime] | None,
    ) -> None:
        """How many runs each capped lane of ``names`` may still start, counted after its
        row is locked (PostgreSQL), so two claimers never both see the last free slot.
        Then the claim's times are read again from ``clock`` (see ``claim``)."""
        if not self.store.is_sqlite:
            for fresh in lanes.lock(conn, names):
                known.by_name[fresh.name] = fresh  # as it is now, not as first read
        running = lanes.running_per_lane(conn, known)
        for name in names:
            current = known.by_name.get(name)
            if current is None or not current.claimable:
                excluded.add(name)
                room[name] = 0
            elif current.max_slots is None:
                room.pop(name, None)
            else:
                room[name] = current.max_slots - running[name]
        if clock is not None:
            stamp = max(clock(), params["v_started"])
            params.update(v_started=stamp, **self._times(stamp))

    def any_queued(self, queues: Sequence[str] | None = None) -> bool:
        """Whether a claim could find work (a read: no write lock is taken). It agrees with
        ``claim``: runs of drained, stopped or full lanes do not count."""
        with self.store.read_one() as conn:  # on PostgreSQL one round trip, no BEGIN
            if not _SOME_QUEUED.all(conn, {}):
                return False  # nothing queued at all, an idle look's usual answer
        with self.store.read() as conn:
            known = lanes.load(conn)
            excluded = known.blocked()
            capped = known.capped() - excluded
            if capped:
                running = lanes.running_per_lane(conn, known)
                excluded |= {n for n in capped if running[n] >= (known.of(n).max_slots or 0)}
            return bool(self._pick(conn, known, queues, excluded, [], 1, None, skip_locked=False))

    def unknown_queues(self, queues: Sequence[str]) -> list[str]:
        """Those of ``queues`` that no lane is named after and no job runs in: a worker
        that serves only them takes nothing (a mistyped name, most likely)."""
        names = sorted({q for q in queues if q != WILDCARD})
        if not names:
            return []
        with self.store.read() as conn:
            known = {x.name for x in lanes.load(conn).by_name.values()}
            left = [q for q in names if q not in known]
            if not left or not _may_read_jobs(conn):
                # A worker login (``worker-credentials``) may not read the jobs: it cannot
                # tell, and says nothing rather than something untrue.
                return []
            used: set[str] = set(
                conn.execute(select(job.c.queue).where(job.c.queue.in_(left)).distinct())
                .scalars()
                .all()
            )
        return [q for q in left if q not in used]

    # ---------------------------------------------------------- a run's life

    def record_pid(self, run_id: int, name: str, pid: int, log_path: str | None) -> bool:
        with self.store.write() as conn:
            params = {"w_id": run_id, "w_worker": name, "v_pid": pid, "v_log": log_path}
            return conn.execute(_RECORD_PID, params).rowcount == 1

    def recorded_end(self, run_id: int, name: str, ended: datetime, exit_status: int) -> bool:
        """Whether the run's row holds this very end: the ``ended`` instant and exit status
        a finish by worker ``name`` wrote. A finish whose COMMIT went through while its
        answer was lost (the connection dropped) recorded it; its retry is refused by the
        compare-and-set, and this tells that refusal from a run settled meanwhile."""
        with self.store.read() as conn:
            row = queries.get_run(conn, run_id)
        return (
            row is not None
            and row.worker == name
            and row.ended == ended
            and row.exit_status == exit_status
        )

    def finish(
        self,
        run_id: int,
        name: str,
        values: dict[str, Any],
        default_max_log_files: int,
        *,
        take_next: tuple[str, Callable[[], datetime]] | None = None,
        then_claim: ThenClaim | None = None,
    ) -> Finished:
        """Record a task run's outcome, compare-and-set from running under this worker.

        ``values`` are the run row's final columns. Returns whether it was recorded
        (False: the run was settled meanwhile, e.g. its lease ran out) and the log
        files past the job's ``max_log_files`` to delete once committed.

        In the same transaction, the run queued ahead after this one (the next task
        of its sequence) becomes claimable if the status lets its box go on; with
        ``take_next`` (host, clock) this worker claims it at once and gets it back,
        started at the clock's time once the write lock is had (on SQLite a write may
        wait up to the busy timeout for another process's lock: a time read before
        would start the next task that much before its process did).

        ``then_claim``: see ``ThenClaim``; ``looked`` says it was tried. It was not on
        PostgreSQL while a lane has a cap: the count that needs is the group's claim's.
        """
        ok = values.get("exit_status") == 0
        if not self.store.is_sqlite:
            done = self._finish_pg(run_id, name, values, default_max_log_files, ok, take_next)
            if not done.recorded or done.next is not None or then_claim is None:
                return done
            with self.store.single() as conn:
                return self._then_claim(conn, name, then_claim, done)
        with self.store.write() as conn:
            params = _finish_params(run_id, name, values)
            m = _finish_stmt(tuple(sorted(values)), returning=True).first(conn, params)
            if m is None:
                return Finished(False)
            stale: list[str] = []
            if values.get("log_path") is not None and m["job_id"] is not None:
                stale = _prune(conn, m["job_id"], m["max_log_files"] or default_max_log_files)
            done = Finished(True, stale)
            if m["ahead"]:
                if take_next is None:
                    _RELEASE_NEXT[ok].execute(conn, {"w_id": run_id})
                else:
                    host, clock = take_next
                    taken = self._take_next(conn, run_id, name, ok, host, clock())
                    done = Finished(True, stale, taken)
            if done.next is not None or then_claim is None:
                return done
            return self._then_claim(conn, name, then_claim, done)

    def _then_claim(self, conn: Connection, name: str, then: ThenClaim, done: Finished) -> Finished:
        """``finish``'s claim of one more run (``ThenClaim``), on its connection."""
        now = then.clock()
        params = self._stamp(name, then.host, now)
        cached = self._lanes_read_since(now)
        got = self._one_by(conn, params, cached or self._read_lanes(conn, now), then)
        if got == [] and cached is not None:
            # The read kept may be a second old: a lane drained since leaves its run picked
            # and refused. As ``claim`` does when it comes back short: the lanes as they
            # are now, and the claim again by them.
            got = self._one_by(conn, params, self._read_lanes(conn, now), then)
        if got is None:
            return done
        return replace(done, next=got[0] if got else None, looked=True)

    def _one_by(
        self, conn: Connection, params: dict[str, Any], known: Lanes, then: ThenClaim
    ) -> list[RunRecord] | None:
        """``_then_claim``'s claim by the lanes ``known``; None when it is not for it: on
        PostgreSQL a capped lane's count locks its row for a transaction of its own,
        which the group's claim makes."""
        if not known.capped():
            return self._claim_uncounted(conn, params, known, then.queues, 1)
        if self.store.is_sqlite:  # its write transaction is the only one: counted in it
            return self._claim_in_lanes(conn, params, then.queues, 1, known=known, clock=then.clock)
        return None

    def _take_next(
        self, conn: Connection, run_id: int, name: str, ok: bool, host: str, now: datetime
    ) -> RunRecord | None:
        """SQLite: the run queued after ``run_id`` claimed by ``name`` if its lane needs no
        count, else released to the queue; the run claimed, if one was."""
        params = {"w_id": run_id, **self._stamp(name, host, now)}
        taken = None
        for rule in _NEXT_RULE[ok, self.lease is not None].all(conn, params):
            values = {"w_next": rule["id"], "v_go": rule["go"], "v_lease_until": rule["lease"]}
            row = _TAKE_BY_ID.first(conn, {**params, **values})
            if taken is None and row is not None and row["state"] == str(RunState.RUNNING):
                taken = queries.run_from_row(row)
        return taken  # none, or released for a claim that counts

    def _finish_pg(
        self,
        run_id: int,
        name: str,
        values: dict[str, Any],
        default_max_log_files: int,
        ok: bool,
        take_next: tuple[str, Callable[[], datetime]] | None,
    ) -> Finished:
        """``finish`` on PostgreSQL: one statement (``_finish_and_next_stmt``), with no
        transaction around it."""
        fixed = self.lease is not None
        logged = values.get("log_path") is not None
        columns = tuple(sorted(values))
        stmt, nxt = _finish_and_next_stmt(columns, ok, take_next is not None, fixed, logged)
        params = _finish_params(run_id, name, values)
        params["w_keep"] = default_max_log_files
        if take_next is not None:
            host, clock = take_next
            now = clock()
            params.update(self._stamp(name, host, now))
        # No transaction around it: one round trip, where a task that left a log took
        # four (BEGIN, the finish, the read of the logs to prune, COMMIT).
        with self.store.single() as conn:
            m = stmt.first(conn, params)
        if m is None:
            return Finished(False)
        stale: list[str] = m.get("f_stale") or []
        if m[f"{nxt}id"] is None or m[f"{nxt}state"] != str(RunState.RUNNING):
            return Finished(True, stale)  # none, released, or released for a claim that counts
        taken = {c.name: m[f"{nxt}{c.name}"] for c in run.c}
        return Finished(True, stale, queries.run_from_row(taken))


# ------------------------------------------------------------------ statements


def _preference(
    queues: Sequence[str] | None,
) -> tuple[Sequence[str] | None, Sequence[str]]:
    """A slot group's queues as (the filter, the queues preferred first): ending in ``*``
    it is preference mode, every queue with those named first; else a filter (or None)."""
    if queues and queues[-1] == WILDCARD:
        return None, queues[:-1]
    return queues, ()


def _pick_params(
    known: Lanes,
    queues: Sequence[str] | None,
    preferred: Sequence[str],
    excluded: set[str],
    limit: int,
) -> dict[str, Any]:
    """The parameters of a pick (``_pick_stmt``) that serves ``queues`` (filter mode) or
    ``preferred`` first (preference mode), not the ``excluded`` lanes."""
    params: dict[str, Any] = {"w_limit": limit}
    params.update({f"w_pref{i}": q for i, q in enumerate(preferred)})
    if queues is not None:
        params["w_queues"] = list(queues)
    if excluded:
        params["w_excluded"] = sorted(excluded)
    if lanes.DEFAULT_LANE in excluded:  # only the queues with a lane row (``named_only``)
        params["w_named"] = sorted(known.by_name.keys() - excluded)
    return params


def _held(conn: Connection, name: str, run_ids: Sequence[int]) -> list[int]:
    if not run_ids:
        return []
    stmt = select(run.c.id).where(run.c.id.in_(list(run_ids)), _HELD)
    return [r.id for r in conn.execute(stmt, {"w_worker": name})]


def _finish_params(run_id: int, name: str, values: dict[str, Any]) -> dict[str, Any]:
    """``_finish_stmt``'s parameters: the run's final columns, compare-and-set on its worker."""
    params = {f"v_{k}": (str(v) if k == "state" else v) for k, v in values.items()}
    params.update(w_id=run_id, w_worker=name)
    return params


@functools.lru_cache(maxsize=32)
def _finish_stmt(columns: tuple[str, ...], returning: bool = False) -> Prepared:
    """The run's end recorded, compare-and-set on its worker; ``returning``: the row's
    job and ``max_log_files`` for pruning come back (no row: settled meanwhile)."""
    stmt = (
        update(run)
        .where(run.c.id == bindparam("w_id"), _HELD)
        .values({col: bindparam(f"v_{col}") for col in columns})
    )
    if not returning:
        return Prepared(stmt)
    # Whether a run waits queued ahead after this one (``_successor``, whatever the
    # status): none after a lone task or a box's last, and then the finish reads no lane
    # rule. Written out: in RETURNING, SQLAlchemy drops the table names that tell the two
    # rows apart.
    waits = literal_column(
        "EXISTS (SELECT 1 FROM run AS ahead WHERE ahead.after_run_id = run.id"
        f" AND ahead.state = '{RunState.PENDING}')",
        Boolean(),
    )
    returns = (run.c.job_id, run.c.max_log_files, waits.label("ahead"))
    return Prepared(stmt.returning(*returns), returns)


@functools.lru_cache(maxsize=64)
def _finish_and_next_stmt(
    columns: tuple[str, ...], ok: bool, take: bool, fixed: bool, prune: bool
) -> tuple[Prepared, str]:
    """PostgreSQL: the end recorded, the job's logs past its ``max_log_files`` forgotten
    (``prune``: the run left a log; ``_prune``) and the run queued after it released
    (``take``: and claimed by this worker), in one statement. One row when the end was
    recorded (with ``prune``, ``f_stale``: the log files to delete once committed; then
    the run taken next, or nulls), none when the run was settled meanwhile. Also the
    prefix of the taken run's column names in that row: ``n_`` without ``prune``, where
    it is the statement it was before pruning came into it; none with it."""
    record: Any = _finish_stmt(columns).stmt
    fin = record.returning(run.c.id, run.c.job_id, run.c.max_log_files)
    if prune:
        fin = fin.returning(run.c.log_path)
    fin = fin.cte("fin")
    after = run.c.after_run_id.in_(select(fin.c.id))
    follows = _successor(ok, after)
    if take:
        # The lane's rule read once per run, in a CTE, not once per column set: the
        # statement stays under psycopg's 4 KiB limit for caching its parsed form (each
        # finish parsed it again: half a millisecond of CPU per run).
        rule = _next_rule(ok, fixed, after).cte("rule")
        values = _take_or_release(rule.c.go, rule.c.lease)
        taking = run.c.id == rule.c.id, run.c.state == str(RunState.PENDING)
        nxt = update(run).where(*taking).values(values).returning(*run.c).cte("nxt")
    else:
        release = {"state": str(RunState.QUEUED)}
        nxt = update(run).where(follows).values(release).returning(*run.c).cte("nxt")
    if not prune:  # no log left (a quiet task): nothing to prune, nor to plan for it
        nexts = (c.label(f"n_{c.name}") for c in nxt.c)
        both = select(fin.c.job_id, fin.c.max_log_files, *nexts)
        both = both.select_from(fin.outerjoin(nxt, literal(True)))
        return Prepared(both, list(both.selected_columns)), "n_"
    # The run taken next unlabelled here (``nxt.id``, not ``nxt.id AS n_id``): with the
    # pruning in it, the statement must still stay under that 4 KiB.
    past = _past_stmt(fin)
    forgot = update(run).where(run.c.id.in_(select(past.c.id))).values(log_path=None)
    in_db = select(past.c.id).where(past.c.log_path == DB_LOG)
    dropped = delete(run_log).where(run_log.c.run_id.in_(in_db))
    stale = select(func.array_agg(past.c.log_path)).where(past.c.log_path != DB_LOG)
    both = (
        select(fin.c.job_id.label("f_job_id"), stale.scalar_subquery().label("f_stale"), *nxt.c)
        .select_from(fin.outerjoin(nxt, literal(True)))
        .add_cte(
            forgot.returning(run.c.id).cte("forgot"),
            dropped.returning(run_log.c.run_id).cte("dropped"),
        )
    )
    return Prepared(both, list(both.selected_columns)), ""


def _past_stmt(fin: Any) -> Any:
    """The CTE of the finished run's job's logs past its newest ``max_log_files`` (that
    run's own counted as it was just written), as ``_LOGS_PAST`` reads after the
    finish's own update. That run's own log is never among them: one statement must
    not update its row twice."""
    others = select(run.c.id, run.c.log_path).where(
        run.c.job_id == fin.c.job_id, run.c.log_path.is_not(None), run.c.id != fin.c.id
    )
    mine = select(fin.c.id, fin.c.log_path).where(fin.c.log_path.is_not(None))
    logs = others.union_all(mine).subquery("logs")
    newest = func.row_number().over(order_by=logs.c.id.desc())
    ranked = select(logs.c.id, logs.c.log_path, newest.label("n")).subquery("ranked")
    keep = func.coalesce(fin.c.max_log_files, bindparam("w_keep", type_=Integer()))
    return (
        select(ranked.c.id, ranked.c.log_path)
        .where(ranked.c.n > keep, ranked.c.id != fin.c.id)
        .select_from(ranked.join(fin, literal(True)))
        .cte("past")
    )


def _prune(conn: Connection, job_id: int, keep: int) -> list[str]:
    """Forget the logs of the job past its newest ``keep``: the paths of those in files,
    to delete once committed; those in the database (``run_log``) go here and now."""
    rows = _LOGS_PAST.all(conn, {"w_job": job_id, "w_keep": keep})
    stale = [(r["id"], r["log_path"]) for r in rows]
    queries.forget_log(conn, [rid for rid, _ in stale])
    runlogs.delete_runs(conn, [rid for rid, path in stale if path == DB_LOG])
    return [path for _, path in stale if path != DB_LOG]


def lost_end(
    run: RunRecord, reason: str, now: datetime, state: RunState = RunState.LOST
) -> dict[str, Any]:
    """The final columns of a run that no worker will finish: ended now with 255 and
    ``reason``, its lease gone. Its duration runs from its start (never below zero when
    the clock that stamped the start ran ahead of this one)."""
    values: dict[str, Any] = {
        "state": state,
        "exit_status": KILLED_STATUS,
        "ended": now,
        "reason": reason,
        "lease_until": None,
    }
    if run.started is not None:
        values["duration_ms"] = max(0, int((now - run.started).total_seconds() * 1000))
    return values


def expired_leases(conn: Connection, now: datetime) -> list[RunRecord]:
    """Running task runs whose worker stopped vouching for them."""
    rows = conn.execute(
        select(run)
        .where(
            run.c.state == str(RunState.RUNNING),
            run.c.lease_until.is_not(None),
            run.c.lease_until < now,
        )
        .order_by(run.c.id)
    )
    return [queries.run_from_row(r) for r in rows]


def lease_lapsed(conn: Connection, names: Sequence[str]) -> None:
    """Workers whose runs' leases ran out: whatever beat they last stated (an idle one's
    minute, said before it claimed them), they held runs, so from now they are judged by
    the lease alone (``heard_of_lately``) until their next beat states its interval
    again. A worker stopped with SIGSTOP just after a claim reads as late once its runs
    are settled, not up to two idle beats later."""
    if names:
        conn.execute(
            update(worker)
            .where(worker.c.name.in_(sorted(set(names))), worker.c.stopped.is_(None))
            .values(beat_s=None)
        )


def request_kill(conn: Connection, run_id: int) -> bool:
    """Ask the worker holding a running task run to kill it; False if it is not running."""
    stmt = (
        update(run)
        .where(run.c.id == run_id, run.c.state == str(RunState.RUNNING))
        .values(kill_requested=True)
    )
    return conn.execute(stmt).rowcount == 1


def list_workers(conn: Connection, now: datetime) -> list[dict[str, Any]]:
    """Every registered worker with its slot use and the runs it holds, live ones first."""
    held: dict[str, list[dict[str, Any]]] = {}
    rows = conn.execute(
        select(run.c.id, run.c.job_name, run.c.worker, run.c.started, run.c.pid, run.c.lease_until)
        .where(run.c.state == str(RunState.RUNNING), run.c.worker.is_not(None))
        .order_by(run.c.id)
    )
    for r in rows:
        held.setdefault(r.worker, []).append(
            {
                "run_id": r.id,
                "job": r.job_name,
                "since": r.started,
                "pid": r.pid,
                "lease_until": r.lease_until,
            }
        )
    out = []
    for w in conn.execute(select(worker).order_by(worker.c.stopped.is_not(None), worker.c.name)):
        runs = held.get(w.name, [])
        queues, groups = _registry_groups(w.queues, w.slots, [r["run_id"] for r in runs])
        out.append(
            {
                "name": w.name,
                "host": w.host,
                "pid": w.pid,
                "slots": w.slots,
                "used": len(runs),
                "free": max(0, w.slots - len(runs)),
                "queues": queues,
                "groups": groups,
                "version": w.version,
                "started": w.started,
                "heartbeat": w.heartbeat,
                "heartbeat_age_s": round((now - w.heartbeat).total_seconds(), 3),
                "beat_s": w.beat_s,
                "stopped": w.stopped,
                "containment": w.containment,
                "log_problems": w.log_problems,
                "log_problem": w.log_problem,
                "runs": runs,
            }
        )
    return out


def _registry_groups(
    text: str | None, slots: int, held: list[int]
) -> tuple[list[str] | None, list[dict[str, Any]]]:
    """A registry row's ``queues`` column read back: the queues the worker serves (None:
    every queue) and its slot groups with their use. Rows written before slot groups hold
    a plain list of queue names (or nothing): one group of all the worker's slots."""
    value = json.loads(text) if text else None
    if not value or not isinstance(value[0], dict):
        group = {"queues": value or [WILDCARD], "slots": slots}
        return value or None, [{**group, "used": len(held), "runs": held}]
    groups = []
    for g in value:
        # One group holds all; of several, each holds what the worker last reported of it
        # (at each heartbeat and lane re-read) while still running under the worker.
        mine = held if len(value) == 1 else [r for r in g.get("runs", []) if r in held]
        groups.append({"queues": g["queues"], "slots": g["slots"], "used": len(mine), "runs": mine})
    if any(g["queues"][-1] == WILDCARD for g in value):
        return None, groups
    named = [q for g in value for q in g["queues"]]
    return list(dict.fromkeys(named)), groups


def queues_of(row: Mapping[str, Any]) -> list[str] | None:
    """The queues a worker's raw registry row (``get_worker``) says it serves (None: all)."""
    return _registry_groups(row["queues"], row["slots"], [])[0]


def heard_of_lately(row: Mapping[str, Any], now: datetime, lease_s: float) -> bool:
    """Whether a worker's last beat is recent enough for it to be taken as alive: within
    the lease, or within twice the interval it said its next beat would come in (an idle
    worker beats less often than it renews leases: ``beat_s``, migration 0011)."""
    every = row.get("beat_s")
    window = lease_s if not every else max(lease_s, 2 * float(every))
    return (now - row["heartbeat"]).total_seconds() <= window


def live_workers(conn: Connection) -> list[dict[str, Any]]:
    """The workers not stopped, with the task-output problems of their life so far: what
    health and metrics watch (one read of the registry, none of the runs)."""
    stmt = (
        select(worker.c.name, worker.c.log_problems, worker.c.log_problem)
        .where(worker.c.stopped.is_(None))
        .order_by(worker.c.name)
    )
    return [dict(r._mapping) for r in conn.execute(stmt)]


def unstopped_workers_of(conn: Connection, host: str) -> list[dict[str, Any]]:
    """The registry rows of ``host`` not marked stopped (whether their process lives)."""
    stmt = select(worker).where(worker.c.host == host, worker.c.stopped.is_(None))
    return [dict(r._mapping) for r in conn.execute(stmt)]


def mark_stopped(conn: Connection, name: str, when: datetime) -> bool:
    """Mark a worker stopped at ``when`` (one that could not say so itself); False if it
    was marked already."""
    stmt = update(worker).where(worker.c.name == name, worker.c.stopped.is_(None))
    return conn.execute(stmt.values(stopped=when)).rowcount == 1


def get_worker(conn: Connection, name: str) -> dict[str, Any] | None:
    row = conn.execute(select(worker).where(worker.c.name == name)).first()
    return dict(row._mapping) if row else None


def _may_read_jobs(conn: Connection) -> bool:
    """Whether this connection's role may read the job table (always, on SQLite)."""
    if conn.dialect.name != "postgresql":
        return True
    query = text("SELECT has_table_privilege(current_user, 'job', 'SELECT')")
    return bool(conn.execute(query).scalar_one())
