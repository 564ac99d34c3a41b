"""Lanes: the rules the runs of a queue are claimed by (README "Lanes").

A run's lane is the lane row named by its ``queue``; a queue with no lane row
is in the lane ``default`` (its rules, and its slots). A lane caps how many of
its runs run at once across every worker (``max_slots``, null: no cap), says
how often workers look for its work (``poll_interval_s``) and how long the
lease of its runs is (``stale_timeout_s``), and is claimable only while it is
``enabled`` (not drained) and not STOPPED (``stopped_at``).

The SQL pieces the run queue's one-statement paths use live here too: the
lease a run's lane gives it (``run_lease``), and whether a run's lane lets a
claim take it without counting (``fast_lane``: enabled, not stopped, no cap).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from jobcontrol.model import Kind, RunRecord, RunState
from jobcontrol.store.access_queries import insert_audit
from jobcontrol.store.prepared import Prepared
from jobcontrol.store.schema import UTCDateTime, lane, run, worker, worker_end

DEFAULT_LANE = "default"
DEFAULT_POLL_S = 2.0
DEFAULT_STALE_S = 30.0  # the run lease before lanes (runqueue.DEFAULT_LEASE)
TASK = "task"
# The WLM rule (seed-wlm-queueing-manager.txt): five unexpected worker ends within ten
# minutes on a lane put it in STOPPED (no new claims) until an operator resumes it.
STOP_AFTER_ENDS = 5
STOP_WINDOW = timedelta(minutes=10)
STOPPED_BY = "dispatcher"  # who the audit trail says stopped a lane


@dataclass(frozen=True)
class Lane:
    name: str
    max_slots: int | None = None
    poll_interval_s: float = DEFAULT_POLL_S
    stale_timeout_s: float = DEFAULT_STALE_S
    enabled: bool = True
    stopped_at: datetime | None = None
    stopped_reason: str | None = None
    updated_at: datetime | None = None
    updated_by: str | None = None

    @property
    def claimable(self) -> bool:
        """Neither drained nor STOPPED."""
        return self.enabled and self.stopped_at is None

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        return "open" if self.enabled else "draining"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "max_slots": self.max_slots,
            "poll_interval_s": self.poll_interval_s,
            "stale_timeout_s": self.stale_timeout_s,
            "enabled": self.enabled,
            "stopped_at": self.stopped_at,
            "stopped_reason": self.stopped_reason,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
        }


# What a queue without a lane row runs under when even ``default`` is missing.
_BUILT_IN = Lane(DEFAULT_LANE)


class Lanes:
    """One read of the lane table, and the rule that maps a queue to its lane."""

    def __init__(self, rows: Iterable[Lane]) -> None:
        self.by_name = {lane_.name: lane_ for lane_ in rows}

    @property
    def default(self) -> Lane:
        return self.by_name.get(DEFAULT_LANE, _BUILT_IN)

    def name_of(self, queue: str) -> str:
        return queue if queue in self.by_name else DEFAULT_LANE

    def of(self, queue: str) -> Lane:
        return self.by_name.get(queue) or self.default

    def served(self, queues: Sequence[str] | None) -> list[Lane]:
        """The lanes a worker serving ``queues`` (None: every queue) claims from."""
        if queues is None:
            return list(self.by_name.values()) or [self.default]
        return [
            self.by_name[n] for n in {self.name_of(q) for q in queues} if n in self.by_name
        ] or [self.default]

    def lease_of(self, queues: Sequence[str] | None) -> float:
        """The lease, in seconds, of the runs of a worker serving ``queues``: the shortest
        stale timeout of its lanes. Its busy beat renews them every third of it."""
        return min(x.stale_timeout_s for x in self.served(queues))

    def blocked(self) -> set[str]:
        """Lanes nobody may claim from: drained or STOPPED."""
        return {n for n, lane_ in self.by_name.items() if not lane_.claimable}

    def capped(self) -> set[str]:
        return {n for n, lane_ in self.by_name.items() if lane_.max_slots is not None}

    def signature(self) -> tuple[Any, ...]:
        """Changes whenever a rule a worker follows changes."""
        return tuple(
            (lane_.name, lane_.max_slots, lane_.poll_interval_s, lane_.stale_timeout_s)
            + (lane_.claimable,)
            for lane_ in sorted(self.by_name.values(), key=lambda x: x.name)
        )


def _lane(row: Mapping[Any, Any]) -> Lane:
    return Lane(
        name=row["name"],
        max_slots=row["max_slots"],
        poll_interval_s=float(row["poll_interval_s"]),
        stale_timeout_s=float(row["stale_timeout_s"]),
        enabled=bool(row["enabled"]),
        stopped_at=row["stopped_at"],
        stopped_reason=row["stopped_reason"],
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
    )


# Read by every worker at each heartbeat (PostgreSQL) and whenever the table changed:
# on the driver, like the heartbeat itself (runqueue.py).
_ALL_LANES = Prepared(select(lane).order_by(lane.c.name), list(lane.c))


def load(conn: Connection) -> Lanes:
    return Lanes(_lane(r) for r in _ALL_LANES.all(conn, {}))


def lock(conn: Connection, names: Iterable[str]) -> list[Lane]:
    """The rows of ``names``, locked ``FOR UPDATE`` in name order (PostgreSQL): claimers of
    one capped lane take turns, and each counts its running runs after the last one committed."""
    stmt = (
        select(lane).where(lane.c.name.in_(sorted(names))).order_by(lane.c.name).with_for_update()
    )
    return [_lane(r._mapping) for r in conn.execute(stmt)]


def running_per_lane(conn: Connection, lanes: Lanes) -> Counter[str]:
    """Task runs running now, per lane (a fresh read: on PostgreSQL, after the lane lock)."""
    rows = conn.execute(
        select(run.c.queue, func.count())
        .where(run.c.state == str(RunState.RUNNING), run.c.kind == TASK)
        .group_by(run.c.queue)
    )
    counts: Counter[str] = Counter()
    for row in rows:
        counts[lanes.name_of(row[0])] += int(row[1])
    return counts


# ------------------------------------------------------------------ SQL pieces


class lease_from(FunctionElement[datetime]):  # noqa: N801 (an SQL function's name)
    """``start`` plus ``seconds``, as the UTC timestamp the run table stores."""

    type = UTCDateTime()
    inherit_cache = True
    name = "lease_from"


@compiles(lease_from, "postgresql")
def _lease_pg(element: lease_from, compiler: SQLCompiler, **kw: Any) -> str:
    start, seconds = (compiler.process(c, **kw) for c in element.clauses)
    return f"(CAST({start} AS TIMESTAMP) + make_interval(secs => {seconds}))"


@compiles(lease_from, "sqlite")
def _lease_sqlite(element: lease_from, compiler: SQLCompiler, **kw: Any) -> str:
    start, seconds = (compiler.process(c, **kw) for c in element.clauses)
    # %f is seconds to the millisecond; the stored text has microseconds (6 digits).
    return f"(strftime('%Y-%m-%d %H:%M:%f', {start}, '+' || ({seconds}) || ' seconds') || '000')"


def _of_run_lane(column: ColumnElement[Any], missing: Any) -> ColumnElement[Any]:
    """``column`` of the run's lane: the row named by its queue, else ``default``'s."""
    return func.coalesce(
        select(column).where(lane.c.name == run.c.queue).scalar_subquery(),
        select(column).where(lane.c.name == DEFAULT_LANE).scalar_subquery(),
        literal(missing),
    )


def run_lease(start_param: str) -> ColumnElement[datetime]:
    """The lease of a run (in an UPDATE of ``run``): from ``start_param`` for its lane's
    ``stale_timeout_s``."""
    start = bindparam(start_param, type_=UTCDateTime())
    return lease_from(start, _of_run_lane(lane.c.stale_timeout_s, DEFAULT_STALE_S))


def fast_lane() -> ColumnElement[bool]:
    """Whether the run's lane lets a claim take it with no count: enabled, not STOPPED,
    no cap (a capped, drained or stopped lane's runs go through ``RunQueue.claim``)."""
    ok = case(
        (
            and_(lane.c.enabled.is_(True), lane.c.stopped_at.is_(None), lane.c.max_slots.is_(None)),
            1,
        ),
        else_=0,
    )
    return _of_run_lane(ok, 1) == 1


# ------------------------------------------------------------------ edits and views


def insert(conn: Connection, name: str, values: dict[str, Any], now: datetime, by: str) -> None:
    conn.execute(lane.insert().values(name=name, updated_at=now, updated_by=by, **values))


def change(conn: Connection, name: str, values: dict[str, Any], now: datetime, by: str) -> bool:
    stmt = update(lane).where(lane.c.name == name).values(updated_at=now, updated_by=by, **values)
    return conn.execute(stmt).rowcount == 1


def remove(conn: Connection, name: str) -> bool:
    return conn.execute(delete(lane).where(lane.c.name == name)).rowcount == 1


def get(conn: Connection, name: str) -> Lane | None:
    row = conn.execute(select(lane).where(lane.c.name == name)).first()
    return _lane(row._mapping) if row is not None else None


def queued_since() -> Any:
    """When a run became claimable: a sequence's next task is queued ahead of its time
    (``pending``, made when its predecessor started) and waits in the queue only from
    its predecessor's end, which released it; any other run from its creation."""
    before = run.alias("before")
    ended = select(before.c.ended).where(before.c.id == run.c.after_run_id).scalar_subquery()
    return case((ended > run.c.created, ended), else_=run.c.created)


def active_per_queue(conn: Connection) -> list[Any]:
    """(queue, state, count, oldest queued since) of the queued and running task runs."""
    return list(
        conn.execute(
            select(run.c.queue, run.c.state, func.count(), func.min(queued_since()))
            .where(
                run.c.state.in_([str(RunState.QUEUED), str(RunState.RUNNING)]), run.c.kind == TASK
            )
            .group_by(run.c.queue, run.c.state)
        )
    )


def queued_runs(conn: Connection) -> list[Any]:
    """Every queued task run, in the order claims take them."""
    return list(
        conn.execute(
            select(
                run.c.id,
                run.c.job_id,
                run.c.job_name,
                run.c.queue,
                run.c.priority,
                queued_since().label("created"),
                run.c.requested_by,
            )
            .where(run.c.state == str(RunState.QUEUED), run.c.kind == TASK)
            .order_by(run.c.priority.desc(), run.c.id)
        )
    )


def set_priority(conn: Connection, run_id: int, priority: int) -> bool:
    """Compare-and-set: only a run still queued changes."""
    stmt = (
        update(run)
        .where(run.c.id == run_id, run.c.state == str(RunState.QUEUED))
        .values(priority=priority, priority_by_hand=True)
    )
    return conn.execute(stmt).rowcount == 1


# ------------------------------------------------------------------ unexpected worker ends


def record_worker_ends(conn: Connection, lost: Sequence[RunRecord], now: datetime) -> set[str]:
    """Record each worker whose task runs were just settled lost (lease expired, or gone at
    start-up recovery), once per lane it held runs in; the lanes that saw an end.

    A worker's life is told apart by its registry row's start time: runs of one life
    settled by two passes (their leases ran out a poll apart) are one end, while a worker
    that re-joined under the same name and died again is a new one.
    """
    known = load(conn)
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in lost:
        if r.worker and r.kind is Kind.TASK:
            groups.setdefault((known.name_of(r.queue), r.worker), []).append(r)
    touched: set[str] = set()
    for (name, who), runs in sorted(groups.items()):
        reg = conn.execute(select(worker.c.started).where(worker.c.name == who)).first()
        life = reg.started if reg is not None else None
        if life is not None and any(r.started is not None and r.started < life for r in runs):
            life = None  # runs of an earlier life: the worker has re-joined since
        mine = select(worker_end.c.id).where(worker_end.c.lane == name, worker_end.c.worker == who)
        seen: Select[Any] | None = None
        if life is not None:
            seen = mine.where(worker_end.c.worker_started == life)
        else:
            # An earlier life, settled by the worker's next one run by run (each end
            # reaches the dispatcher on its own): an end of this worker in this lane
            # recorded since these runs started is that life's death, already counted.
            started = [r.started for r in runs if r.started is not None]
            if started and len(started) == len(runs):
                seen = mine.where(worker_end.c.at >= min(started))
        if seen is not None and conn.execute(seen).first() is not None:
            continue
        conn.execute(
            worker_end.insert().values(
                lane=name,
                worker=who,
                worker_started=life,
                at=now,
                runs=json.dumps(sorted(r.id for r in runs)),
            )
        )
        touched.add(name)
    return touched


def recent_worker_ends(conn: Connection, name: str, now: datetime) -> list[tuple[str, datetime]]:
    """(worker, when) of the lane's unexpected worker ends within ``STOP_WINDOW`` of ``now``."""
    rows = conn.execute(
        select(worker_end.c.worker, worker_end.c.at)
        .where(worker_end.c.lane == name, worker_end.c.at > now - STOP_WINDOW)
        .order_by(worker_end.c.at, worker_end.c.id)
    )
    return [(r.worker, r.at) for r in rows]


def stop_after_worker_ends(conn: Connection, names: Iterable[str], now: datetime) -> list[str]:
    """Put each lane of ``names`` that saw ``STOP_AFTER_ENDS`` unexpected worker ends within
    ``STOP_WINDOW`` in STOPPED, with the reason naming the workers, audited; the lanes
    stopped (to announce once committed)."""
    stopped = []
    for name in sorted(names):
        current = get(conn, name)
        if current is None or current.stopped_at is not None:
            continue
        ends = recent_worker_ends(conn, name, now)
        if len(ends) < STOP_AFTER_ENDS:
            continue
        workers = ", ".join(dict.fromkeys(w for w, _ in ends))
        minutes = int(STOP_WINDOW.total_seconds() // 60)
        reason = (
            f"{len(ends)} unexpected worker ends within {minutes} minutes "
            f"(workers {workers}; first at {ends[0][1]:%Y-%m-%d %H:%M:%S} UTC); "
            f"`jobcontrol lane resume {name}` to claim again"
        )
        values = {"stopped_at": now, "stopped_reason": reason}
        if not change(conn, name, values, now, STOPPED_BY):
            continue
        insert_audit(conn, now, STOPPED_BY, "lane.stop", json.dumps([name]), "ok", reason)
        stopped.append(name)
    return stopped
