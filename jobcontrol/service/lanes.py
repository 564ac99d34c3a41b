"""Lanes and the queue, as operators see and steer them (README "Lanes").

List lanes with what runs and waits in each; add, set and remove lanes
(admin); drain and resume them, see the queue and reprioritize a queued run
(operator). Every change is one transaction that records its audit entry, and
every refusal is audited too (``audit.scope``). A change reaches the embedded
worker at once (``events.lanes_changed``); on PostgreSQL every worker at once
too (the lane table's trigger announces each write, ``store.relay``), on SQLite
any other within one poll interval (workers re-read the lane table then).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jobcontrol import events
from jobcontrol.clock import Clock
from jobcontrol.definitions.durations import format_duration, parse_duration
from jobcontrol.definitions.fields import queue_name_problem
from jobcontrol.errors import (
    LaneConflictError,
    LaneError,
    RunError,
    RunStateError,
    UnknownLaneError,
    UnknownRunError,
    clip,
)
from jobcontrol.model import RunState
from jobcontrol.service import audit
from jobcontrol.store import Store, lanes, queries
from jobcontrol.store.lanes import DEFAULT_LANE

MAX_SLOTS = 100_000
POLL_RANGE = (0.1, 3600.0)  # seconds
STALE_RANGE = (3.0, 7 * 86400.0)  # seconds: the heartbeat renews leases every third of it
PRIORITY_RANGE = (-1_000_000, 1_000_000)  # as a job's priority
FIELDS = ("max_slots", "poll_interval_s", "stale_timeout_s", "enabled")
# The CLI's short names (`lane set NAME poll=2s stale=30m`), accepted everywhere.
ALIASES = {
    "slots": "max_slots",
    "poll": "poll_interval_s",
    "poll_interval": "poll_interval_s",
    "stale": "stale_timeout_s",
    "stale_timeout": "stale_timeout_s",
}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise LaneError(str(name), "a lane name cannot be empty", "name")
    problem = queue_name_problem(name)
    if problem is not None:
        raise LaneError(name, f"{problem} (a lane's name is a queue's)", "name")
    return name


def parse_fields(lane: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (the CLI's text or the API's JSON values) as lane columns, each checked."""
    values: dict[str, Any] = {}
    for key, value in given.items():
        column = ALIASES.get(key, key)
        if column not in FIELDS:
            known = ", ".join(FIELDS + tuple(ALIASES))
            raise LaneError(lane, f"unknown setting {clip(repr(key))} (one of {known})", key)
        if column in values:
            raise LaneError(lane, f"{column} given twice", column)
        values[column] = _value(lane, column, value)
    return values


def _value(lane: str, column: str, value: Any) -> Any:
    if column == "max_slots":
        return _slots(lane, value)
    if column == "enabled":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in _TRUE | _FALSE:
            raise LaneError(lane, f"enabled must be true or false, not {clip(repr(value))}", column)
        return text in _TRUE
    low, high = POLL_RANGE if column == "poll_interval_s" else STALE_RANGE
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise LaneError(lane, f"{column}: {clip(str(exc))}", column) from None
    if not low <= seconds <= high:
        raise LaneError(
            lane,
            f"{column} must be between {format_duration(low)} and {format_duration(high)}, "
            f"not {format_duration(seconds) if math.isfinite(seconds) else seconds}",
            column,
        )
    return seconds


def _slots(lane: str, value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    if isinstance(value, bool):
        raise LaneError(
            lane, f"max_slots must be a whole number or none, not {clip(repr(value))}", "max_slots"
        )
    try:
        slots = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (ValueError, TypeError):
        slots = None
    if slots is None:
        raise LaneError(
            lane, f"max_slots must be a whole number or none, not {clip(repr(value))}", "max_slots"
        )
    if slots < 1:
        raise LaneError(
            lane,
            f"max_slots must be at least 1, not {slots} (to stop a lane's claims, "
            f"`jobcontrol lane drain {lane}`; none: no cap)",
            "max_slots",
        )
    if slots > MAX_SLOTS:
        raise LaneError(lane, f"max_slots must be at most {MAX_SLOTS}, not {slots}", "max_slots")
    return slots


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={'none' if v is None else v}" for k, v in sorted(values.items()))


class LaneService:
    """The lane and queue operations of one store (``Engine.lanes``)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    # ------------------------------------------------------------ views

    def list_lanes(self) -> list[dict[str, Any]]:
        """Every lane with its running and queued task runs and its oldest wait."""
        now = self.clock.now()
        with self.store.read() as conn:
            known = lanes.load(conn)
            rows = lanes.active_per_queue(conn)
        stats: dict[str, dict[str, Any]] = {
            name: {"running": 0, "queued": 0, "oldest": None, "queues": set()}
            for name in known.by_name
        }
        for queue, state, count, oldest in rows:
            entry = stats.setdefault(
                known.name_of(queue), {"running": 0, "queued": 0, "oldest": None, "queues": set()}
            )
            entry["queues"].add(queue)
            if state == "running":
                entry["running"] += int(count)
            else:
                entry["queued"] += int(count)
                if entry["oldest"] is None or oldest < entry["oldest"]:
                    entry["oldest"] = oldest
        out = []
        for name in sorted(stats):
            lane = known.of(name)
            s = stats[name]
            wait = (now - s["oldest"]).total_seconds() if s["oldest"] is not None else None
            out.append(
                {
                    **lane.as_dict(),
                    "running": s["running"],
                    "queued": s["queued"],
                    "oldest_queued": s["oldest"],
                    "oldest_wait_s": None if wait is None else round(max(0.0, wait), 3),
                    "free": None
                    if lane.max_slots is None
                    else max(0, lane.max_slots - s["running"]),
                    "queues": sorted(s["queues"] | {name}),
                }
            )
        return out

    def stopped(self) -> list[dict[str, Any]]:
        """The STOPPED lanes (the dispatcher stopped them after repeated worker ends): name,
        since when, why. For status and health."""
        with self.store.read() as conn:
            known = lanes.load(conn)
        return [
            {"name": n, "stopped_at": x.stopped_at, "reason": x.stopped_reason}
            for n, x in sorted(known.by_name.items())
            if x.stopped_at is not None
        ]

    def get_lane(self, name: str) -> dict[str, Any]:
        for lane in self.list_lanes():
            if lane["name"] == name:
                return lane
        raise UnknownLaneError(name)

    def queue(self, lane: str | None = None) -> list[dict[str, Any]]:
        """Queued task runs per lane, in the order claims take them: position (1 = next),
        how long each has waited."""
        now = self.clock.now()
        with self.store.read() as conn:
            known = lanes.load(conn)
            if lane is not None and lane not in known.by_name:
                raise UnknownLaneError(
                    lane,
                    f"no such lane (a queue {lane!r} without a lane row is in {DEFAULT_LANE!r})",
                )
            rows = lanes.queued_runs(conn)
        by_lane: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            name = known.name_of(r.queue)
            if lane is not None and name != lane:
                continue
            runs = by_lane.setdefault(name, [])
            runs.append(
                {
                    "run_id": r.id,
                    "job": r.job_name,
                    "job_id": r.job_id,
                    "queue": r.queue,
                    "priority": r.priority,
                    "position": len(runs) + 1,
                    "queued_at": r.created,
                    "wait_s": round(max(0.0, (now - r.created).total_seconds()), 3),
                    "requested_by": r.requested_by,
                }
            )
        names = [lane] if lane is not None else sorted(known.by_name.keys() | by_lane.keys())
        return [{"lane": n, "state": known.of(n).state, "runs": by_lane.get(n, [])} for n in names]

    # ------------------------------------------------------------ changes

    def add_lane(self, name: str, fields: Mapping[str, Any], *, user: str) -> dict[str, Any]:
        with audit.scope(self.store, user, "lane.add", [name]) as note:
            check_name(name)
            values = parse_fields(name, fields)
            with self.store.write() as conn:
                if lanes.get(conn, name) is not None:
                    raise LaneConflictError(name, "a lane with this name exists already")
                lanes.insert(conn, name, values, self.clock.now(), user)
                note.detail = f"added lane {name!r}" + (f": {_describe(values)}" if values else "")
                audit.record_note(conn, note)
        self._changed(name)
        return self.get_lane(name)

    def set_lane(self, name: str, fields: Mapping[str, Any], *, user: str) -> dict[str, Any]:
        with audit.scope(self.store, user, "lane.set", [name]) as note:
            if not fields:
                raise LaneError(name, "nothing to set (give key=value, e.g. max_slots=3)")
            values = parse_fields(name, fields)
            self._change(name, values, user, note, f"set {_describe(values)}")
        return self.get_lane(name)

    def drain(self, name: str, *, user: str) -> dict[str, Any]:
        """No new claims in the lane; its running runs finish."""
        with audit.scope(self.store, user, "lane.drain", [name]) as note:
            self._change(name, {"enabled": False}, user, note, "drained: no new claims")
        return self.get_lane(name)

    def resume(self, name: str, *, user: str) -> dict[str, Any]:
        """Claims again: enabled, and no longer STOPPED."""
        with audit.scope(self.store, user, "lane.resume", [name]) as note:
            values = {"enabled": True, "stopped_at": None, "stopped_reason": None}
            self._change(name, values, user, note, "resumed")
        return self.get_lane(name)

    def remove_lane(self, name: str, *, user: str) -> None:
        """Refused for ``default`` and for a lane with queued or running runs (drain it and
        let them end first): its queue's runs would move to ``default`` unannounced."""
        with audit.scope(self.store, user, "lane.remove", [name]) as note:
            if name == DEFAULT_LANE:
                raise LaneConflictError(
                    name,
                    "the default lane cannot be removed: every queue without a lane runs in it",
                )
            with self.store.write() as conn:
                found = lanes.get(conn, name)
                if found is None:
                    raise UnknownLaneError(name)
                busy = {
                    state: int(count)
                    for queue, state, count, _ in lanes.active_per_queue(conn)
                    if queue == name
                }
                if busy:
                    counts = " and ".join(f"{n} {state}" for state, n in sorted(busy.items()))
                    if found.claimable:
                        how = f"drain it (`jobcontrol lane drain {name}`) and remove it once they have ended"
                    elif busy.get(str(RunState.QUEUED)):
                        # Drained or stopped: its queued runs never start, so never end.
                        how = (
                            "it is drained, so its queued runs never start: kill their jobs "
                            f"(`jobcontrol queue --lane {name}` lists them), or resume the lane "
                            f"(`jobcontrol lane resume {name}`) and let them run, then remove it"
                        )
                    else:
                        how = "remove it once they have ended"
                    runs = "task run" if sum(busy.values()) == 1 else "task runs"
                    raise LaneConflictError(name, f"it has {counts} {runs}: {how}")
                lanes.remove(conn, name)
                note.detail = f"removed lane {name!r}: queue {name!r} now runs in {DEFAULT_LANE!r}"
                audit.record_note(conn, note)
        self._changed(name)

    def reprioritize(self, run_id: int, priority: int, *, user: str) -> dict[str, Any]:
        """A queued run's priority (higher first); refused for a run no longer queued."""
        with audit.scope(self.store, user, "run.reprioritize") as note:
            low, high = PRIORITY_RANGE
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise RunError(run_id, f"priority must be a whole number, not {priority!r}")
            if not low <= priority <= high:
                raise RunError(run_id, f"priority must be between {low} and {high}, not {priority}")
            with self.store.write() as conn:
                run = queries.get_run(conn, run_id)
                if run is None:
                    raise UnknownRunError(run_id)
                note.jobs.append(run.job_name)
                if not lanes.set_priority(conn, run_id, priority):
                    raise RunStateError(
                        run_id,
                        f"only a queued run can be reprioritized, and this one is {run.state}",
                    )
                note.detail = f"run {run_id} priority {run.priority} -> {priority}"
                audit.record_note(conn, note)
        return {"run_id": run_id, "job": run.job_name, "priority": priority}

    def _change(
        self, name: str, values: dict[str, Any], user: str, note: audit.AuditNote, what: str
    ) -> None:
        with self.store.write() as conn:
            if not lanes.change(conn, name, values, self.clock.now(), user):
                raise UnknownLaneError(name)
            note.detail = f"lane {name!r}: {what}"
            audit.record_note(conn, note)
        self._changed(name)

    def _changed(self, name: str) -> None:
        events.lanes_changed.send(self.store, names=[name])
