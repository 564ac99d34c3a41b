"""Named queries: every read and write the engine makes, in one place.

Values are always bound. Run state writes are compare-and-set
(``WHERE state IN :expected``); a zero row count means a lost race and the
caller decides what that means.

The statements on the dispatcher's and workers' hot paths (one set per task
run, one per edited job) are built once with ``bindparam`` placeholders and
reused: building a statement and computing its cache key costs more than
executing it (bench/README.md).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    Connection,
    Integer,
    Row,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy import Text as SqlText
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobcontrol.model import (
    ACTIVE_RUN_STATES,
    BoxType,
    JobRecord,
    Kind,
    Misfire,
    OnError,
    RunRecord,
    RunState,
    Trigger,
)
from jobcontrol.store import lanes
from jobcontrol.store.prepared import Prepared
from jobcontrol.store.schema import UTCDateTime, job, meta, run

# ---------------------------------------------------------------- jobs


# The columns every JobRecord is read from, in the order _job_from_row unpacks them.
_JOB_COLUMNS = (
    job.c.id,
    job.c.name,
    job.c.kind,
    job.c.parent_id,
    job.c.description,
    job.c.job_order,
    job.c.command,
    job.c.timer,
    job.c.active,
    job.c.on_error,
    job.c.box_type,
    job.c.exit_status,
    job.c.last_ran,
    job.c.next_runs,
    job.c.last_duration_ms,
    job.c.last_updated,
    job.c.updated_by,
    job.c.version,
    job.c.queue,
    job.c.priority,
    job.c.timeout_s,
    job.c.max_log_files,
    job.c.misfire,
    job.c.cwd,
    job.c.env,
    job.c.retries,
)
# Enum(value) is slow; a dict lookup per column matters when loading 100,000 jobs.
_KINDS = {str(m): m for m in Kind}
_ON_ERRORS = {str(m): m for m in OnError}
_BOX_TYPES = {str(m): m for m in BoxType}
_MISFIRES = {str(m): m for m in Misfire}


def _select_jobs() -> Select[Any]:
    return select(*_JOB_COLUMNS)


def _job_from_row(row: Row[Any]) -> JobRecord:
    """A row of ``_select_jobs()`` as a JobRecord."""
    (
        id_,
        name,
        kind,
        parent_id,
        description,
        job_order,
        command,
        timer,
        active,
        on_error,
        box_type,
        exit_status,
        last_ran,
        next_runs,
        last_duration_ms,
        last_updated,
        updated_by,
        version,
        queue,
        priority,
        timeout_s,
        max_log_files,
        misfire,
        cwd,
        env,
        retries,
    ) = cast(tuple[Any, ...], row)
    return JobRecord(
        id=id_,
        name=name,
        kind=_KINDS[kind],
        parent_id=parent_id,
        description=description,
        job_order=job_order,
        command=command,
        timer=timer,
        active=bool(active),
        on_error=_ON_ERRORS[on_error],
        box_type=_BOX_TYPES[box_type],
        exit_status=exit_status,
        last_ran=last_ran,
        next_runs=next_runs,
        last_duration_ms=last_duration_ms,
        last_updated=last_updated,
        updated_by=updated_by,
        version=version,
        queue=queue,
        priority=priority,
        timeout_s=timeout_s,
        max_log_files=max_log_files,
        misfire=_MISFIRES[misfire],
        cwd=cwd,
        env=json.loads(env) if env else {},
        retries=retries,
    )


def job_values(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Definition fields (JobRecord names and types) to column values."""
    values: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "env":
            values[key] = json.dumps(dict(value), sort_keys=True) if value else None
        elif key in ("kind", "on_error", "box_type", "misfire") and value is not None:
            values[key] = str(value)
        else:
            values[key] = value
    return values


def load_all_jobs(conn: Connection) -> list[JobRecord]:
    result = conn.execute(_select_jobs().order_by(job.c.id))
    return [_job_from_row(r) for rows in result.partitions(5000) for r in rows]


def load_jobs(conn: Connection, ids: Iterable[int]) -> list[JobRecord]:
    ids = list(ids)
    found: list[JobRecord] = []
    for start in range(0, len(ids), 500):  # keep IN lists within SQLite's variable limit
        chunk = ids[start : start + 500]
        rows = conn.execute(_select_jobs().where(job.c.id.in_(chunk)))
        found.extend(_job_from_row(r) for r in rows)
    return found


_GET_JOB = _select_jobs().where(job.c.id == bindparam("w_id"))
_GET_JOB_BY_NAME = _select_jobs().where(job.c.name == bindparam("w_name"))


def get_job(conn: Connection, job_id: int) -> JobRecord | None:
    row = conn.execute(_GET_JOB, {"w_id": job_id}).first()
    return _job_from_row(row) if row else None


def get_job_by_name(conn: Connection, name: str) -> JobRecord | None:
    row = conn.execute(_GET_JOB_BY_NAME, {"w_name": name}).first()
    return _job_from_row(row) if row else None


def job_names(conn: Connection, ids: Iterable[int]) -> dict[int, str]:
    """The names of the jobs with these ids (those that exist)."""
    ids = list(ids)
    found: dict[int, str] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for r in conn.execute(select(job.c.id, job.c.name).where(job.c.id.in_(chunk))):
            found[r.id] = r.name
    return found


def jobs_named_with(conn: Connection, text: str) -> list[tuple[int, str]]:
    """(id, name) of the jobs whose name contains ``text``."""
    stmt = select(job.c.id, job.c.name).where(job.c.name.contains(text, autoescape=True))
    return [(r.id, r.name) for r in conn.execute(stmt.order_by(job.c.id))]


_INSERT_JOB = insert(job).returning(job.c.id)
# SQLite gives a new row the largest id + 1: the id of a job just deleted, and with it the
# runs that job left (its history, its logs), and the edits a client holds for it by id and
# version (a new job starts at version 1 again). There a new job's id is past every id a
# run names and past every id a job had when one was deleted (``_ID_MARK`` in jc_meta,
# set by ``delete_job``). (PostgreSQL's sequence never goes back; ``db copy`` sets it past
# both.)
_ID_MARK = "job_id_mark"
_INSERT_JOB_SQLITE = (
    insert(job)
    .values(
        id=func.max(
            func.coalesce(select(func.max(job.c.id)).scalar_subquery(), 0),
            func.coalesce(select(func.max(run.c.job_id)).scalar_subquery(), 0),
            func.coalesce(
                select(sql_cast(meta.c.value, Integer))
                .where(meta.c.key == _ID_MARK)
                .scalar_subquery(),
                0,
            ),
        )
        + 1
    )
    .returning(job.c.id)
)
_MARK_IDS_SQLITE = (
    sqlite_insert(meta)
    .from_select(
        ["key", "value"],
        select(literal(_ID_MARK), sql_cast(func.max(job.c.id), SqlText)).where(
            job.c.id.is_not(None)
        ),
    )
    .on_conflict_do_update(
        index_elements=[meta.c.key],
        set_={
            "value": sql_cast(
                func.max(
                    sql_cast(meta.c.value, Integer), sql_cast(text("excluded.value"), Integer)
                ),
                SqlText,
            )
        },
    )
)


def insert_job(conn: Connection, values: Mapping[str, Any]) -> int:
    # The columns are the keys given; the others get their defaults, as with .values().
    stmt = _INSERT_JOB_SQLITE if conn.dialect.name == "sqlite" else _INSERT_JOB
    return int(conn.execute(stmt, job_values(values)).scalar_one())


@functools.lru_cache(maxsize=512)
def _update_job_stmt(columns: tuple[str, ...], versioned: bool) -> Update:
    stmt = update(job).where(job.c.id == bindparam("w_id"))
    if versioned:
        stmt = stmt.where(job.c.version == bindparam("w_version"))
    sets: dict[str, Any] = {col: bindparam(f"v_{col}") for col in columns}
    return stmt.values({**sets, "version": job.c.version + 1})


def update_job(
    conn: Connection, job_id: int, values: Mapping[str, Any], expected_version: int | None
) -> bool:
    """A user edit: bumps the version; with ``expected_version`` it is compare-and-set."""
    vals = job_values(values)
    vals.pop("version", None)  # always bumped by one, never set
    stmt = _update_job_stmt(tuple(sorted(vals)), expected_version is not None)
    params = {f"v_{k}": v for k, v in vals.items()}
    params["w_id"] = job_id
    if expected_version is not None:
        params["w_version"] = expected_version
    return conn.execute(stmt, params).rowcount == 1


# A run waiting in the queue runs its job as it is when a worker takes it (README
# "Lanes"): these job fields are copied into the run row when it is queued.
FOLLOWED_BY_QUEUED = {
    "name": "job_name",
    "command": "command",
    "cwd": "cwd",
    "env": "env",
    "timeout_s": "timeout_s",
    "max_log_files": "max_log_files",
    "queue": "queue",
}


def follow_edit(conn: Connection, job_id: int, values: Mapping[str, Any]) -> list[int]:
    """An edit of a task, in its own transaction, onto its runs still queued (no worker
    took them): what ``FOLLOWED_BY_QUEUED`` names, and a new priority (but a run's
    priority set by hand, ``reprioritize``, stays). A worker's claim
    comes before the edit (the run goes as it was) or after it (as it is). The runs that
    followed."""
    vals = job_values({k: v for k, v in values.items() if k in FOLLOWED_BY_QUEUED})
    cols: dict[str, Any] = {FOLLOWED_BY_QUEUED[k]: v for k, v in vals.items()}
    if "priority" in values:
        by_hand = run.c.priority_by_hand.is_(True)
        cols["priority"] = case((by_hand, run.c.priority), else_=values["priority"])
    if not cols:
        return []
    queued = and_(run.c.job_id == job_id, run.c.state == str(RunState.QUEUED))
    stmt = update(run).where(queued).values(**cols).returning(run.c.id)
    return sorted(conn.execute(stmt).scalars())


def delete_job(conn: Connection, job_id: int) -> None:
    if conn.dialect.name == "sqlite":
        conn.execute(_MARK_IDS_SQLITE)  # no id up to the largest now is given again
    # Children go by ON DELETE CASCADE.
    conn.execute(delete(job).where(job.c.id == job_id))


def write_schedule(conn: Connection, rows: Sequence[tuple[int, datetime | None, int]]) -> None:
    """The dispatcher's (id, next_runs, job_order) writes after an evaluation.

    On PostgreSQL a large evaluation (a daemon's first start, an edit of many trees)
    goes as one statement over arrays: the 21,000 rows a first start of 100,000 jobs
    writes took 0.40-0.50 s so, against 0.63-0.68 s as one ``UPDATE`` a row, pipelined
    (bench/README.md, thirty-sixth round). A few rows (a tree's re-arm, on every run)
    keep the prepared statement."""
    if len(rows) >= _SET_WRITE_MIN and conn.dialect.name == "postgresql":
        to_utc = UTCDateTime().process_bind_param
        conn.execute(
            _WRITE_SCHEDULE_SET,
            {
                "ids": [i for i, _n, _o in rows],
                "nexts": [to_utc(n, conn.dialect) for _i, n, _o in rows],
                "orders": [o for _i, _n, o in rows],
            },
        )
        return
    _WRITE_SCHEDULE.execute_many(conn, [{"b_id": i, "b_next": n, "b_order": o} for i, n, o in rows])


_SET_WRITE_MIN = 64
_WRITE_SCHEDULE_SET = text(
    "UPDATE job SET next_runs = v.next_runs, job_order = v.job_order"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:nexts AS timestamp[]),"
    " CAST(:orders AS integer[])) AS v(id, next_runs, job_order)"
    " WHERE job.id = v.id"
)


_WRITE_SCHEDULE = Prepared(
    update(job)
    .where(job.c.id == bindparam("b_id"))
    .values(next_runs=bindparam("b_next"), job_order=bindparam("b_order"))
)


_WRITE_NEXT_RUNS = (
    update(job).where(job.c.id == bindparam("w_id")).values(next_runs=bindparam("v_next"))
)
_WRITE_JOB_RESULT = Prepared(
    update(job)
    .where(job.c.id == bindparam("w_id"))
    .values(
        last_ran=bindparam("v_ran"),
        exit_status=bindparam("v_status"),
        last_duration_ms=bindparam("v_duration"),
    )
)


def write_next_runs(conn: Connection, job_id: int, next_runs: datetime | None) -> None:
    conn.execute(_WRITE_NEXT_RUNS, {"w_id": job_id, "v_next": next_runs})


def write_job_result(
    conn: Connection, job_id: int, last_ran: datetime, exit_status: int, duration_ms: int
) -> None:
    _WRITE_JOB_RESULT.execute(
        conn,
        {"w_id": job_id, "v_ran": last_ran, "v_status": exit_status, "v_duration": duration_ms},
    )


# ---------------------------------------------------------------- runs

_RUN_JSON = ("env",)


def run_from_row(row: Row[Any] | Mapping[str, Any]) -> RunRecord:
    m = dict(row) if isinstance(row, Mapping) else dict(row._mapping)
    m["kill_requested"] = bool(m.get("kill_requested"))
    m["after_ok_only"] = bool(m.get("after_ok_only"))
    m["priority_by_hand"] = bool(m.get("priority_by_hand"))
    m["kind"] = Kind(m["kind"])
    m["trigger"] = Trigger(m["trigger"])
    m["state"] = RunState(m["state"])
    m["env"] = json.loads(m["env"]) if m["env"] else {}
    return RunRecord(**m)


def insert_run(conn: Connection, values: Mapping[str, Any]) -> int:
    vals = dict(values)
    for key in _RUN_JSON:
        if key in vals:
            vals[key] = json.dumps(vals[key], sort_keys=True) if vals[key] else None
    for key in ("kind", "trigger", "state"):
        if key in vals:
            vals[key] = str(vals[key])
    unknown = vals.keys() - _RUN_DEFAULTS.keys()
    if unknown:
        raise ValueError(f"not columns of a run: {sorted(unknown)}")
    params = {key: vals.get(name, default) for key, name, default in _RUN_PARAMS}
    (row,) = _INSERT_RUN.execute(conn, params).fetchall()
    return int(row[0])


# Every column is given (the schema's scalar default where the caller gives none), so the
# insert is one statement compiled once (store.prepared).
_RUN_DEFAULTS = {
    col.name: (
        getattr(col.default, "arg", None)
        if col.default is not None and col.default.is_scalar
        else None
    )
    for col in run.c
    if col.name != "id"
}
_RUN_PARAMS = tuple((f"v_{name}", name, default) for name, default in _RUN_DEFAULTS.items())
_INSERT_RUN = Prepared(
    insert(run).values({name: bindparam(f"v_{name}") for name in _RUN_DEFAULTS}).returning(run.c.id)
)
_GET_RUN = select(run).where(run.c.id == bindparam("w_id"))


def get_run(conn: Connection, run_id: int) -> RunRecord | None:
    row = conn.execute(_GET_RUN, {"w_id": run_id}).first()
    return run_from_row(row) if row else None


class RunEnd(NamedTuple):
    state: RunState
    exit_status: int | None
    cpu_us: int | None = None  # from the run's cgroup, for the finished event
    mem_peak_bytes: int | None = None
    ended: datetime | None = None  # as its worker recorded it: a box ends when it did
    # When a worker started it (None while queued): a run adopted after it started
    # (queued ahead, taken with its predecessor's end) ran from then, not from the
    # dispatcher's reaction.
    started: datetime | None = None


_END_COLUMNS = (
    run.c.state,
    run.c.exit_status,
    run.c.cpu_us,
    run.c.mem_peak_bytes,
    run.c.ended,
    run.c.started,
)
_GET_RUN_END = Prepared(select(*_END_COLUMNS).where(run.c.id == bindparam("w_id")), _END_COLUMNS)


def ended_runs(conn: Connection, run_ids: Sequence[int]) -> dict[int, RunEnd]:
    """Which of ``run_ids`` have ended, with their state and exit status."""
    active = [str(s) for s in ACTIVE_RUN_STATES]
    found: dict[int, RunEnd] = {}
    ids = list(run_ids)
    for start in range(0, len(ids), 500):
        rows = conn.execute(
            select(run.c.id, *_END_COLUMNS).where(
                run.c.id.in_(ids[start : start + 500]), run.c.state.not_in(active)
            )
        )
        found.update((r.id, _run_end(dict(r._mapping))) for r in rows)
    return found


def run_end(conn: Connection, run_id: int) -> RunEnd | None:
    """A run's state and exit status: what the dispatcher reacts to (a narrow read)."""
    row = _GET_RUN_END.first(conn, {"w_id": run_id})
    return _run_end(row) if row else None


_GET_TWO_RUN_ENDS = Prepared(
    select(run.c.id, *_END_COLUMNS).where(run.c.id.in_([bindparam("w_a"), bindparam("w_b")])),
    (run.c.id, *_END_COLUMNS),
)


def two_run_ends(conn: Connection, first: int, second: int) -> dict[int, RunEnd]:
    """``run_end`` of two runs in one statement (one snapshot, one round trip): a task's
    end and the run its end released, as one commit of the worker left them."""
    rows = _GET_TWO_RUN_ENDS.all(conn, {"w_a": first, "w_b": second})
    return {r["id"]: _run_end(r) for r in rows}


def _run_end(row: Mapping[str, Any]) -> RunEnd:
    """A ``RunEnd`` from a row of ``_END_COLUMNS`` (result processing applied)."""
    return RunEnd(
        RunState(row["state"]),
        row["exit_status"],
        row["cpu_us"],
        row["mem_peak_bytes"],
        row["ended"],
        row["started"],
    )


@functools.lru_cache(maxsize=256)
def _transition_stmt(columns: tuple[str, ...], expected: int) -> Prepared:
    # The expected states are bound one by one (not an expanding IN), so that the
    # statement compiles once: a box's end is on every tree run's path.
    return Prepared(
        update(run)
        .where(
            run.c.id == bindparam("w_id"),
            run.c.state.in_([bindparam(f"w_expected{i}") for i in range(expected)]),
        )
        .values({col: bindparam(f"v_{col}") for col in columns})
    )


def transition_run(
    conn: Connection, run_id: int, expected: Iterable[RunState], values: Mapping[str, Any]
) -> bool:
    """Compare-and-set a run's state (and other columns); False if the state was not expected."""
    params = {f"v_{k}": (str(v) if k == "state" else v) for k, v in values.items()}
    params["w_id"] = run_id
    states = tuple(sorted({str(s) for s in expected}))
    params.update({f"w_expected{i}": s for i, s in enumerate(states)})
    return _transition_stmt(tuple(sorted(values)), len(states)).execute(conn, params).rowcount == 1


def unfinished_tree_runs(conn: Connection) -> list[RunRecord]:
    """Every run of every tree run whose root is still active, oldest first."""
    active = [str(s) for s in ACTIVE_RUN_STATES]
    roots = select(run.c.id).where(run.c.parent_run_id.is_(None), run.c.state.in_(active))
    stmt = select(run).where(
        or_(run.c.id.in_(roots), run.c.root_run_id.in_(roots)),
        run.c.state != str(RunState.PENDING),
    )
    return [run_from_row(r) for r in conn.execute(stmt.order_by(run.c.id))]


def newest_ended_task_roots(conn: Connection) -> list[RunRecord]:
    """Of each job, its newest tree run rooted at the job itself when that root is a task
    run that has ended (what start-up checks was reacted to). A run skipped (a timer that
    found the tree busy) never ran: nothing to react to."""
    newest = (
        select(func.max(run.c.id))
        .where(
            run.c.parent_run_id.is_(None),
            run.c.job_id.is_not(None),
            run.c.kind == str(Kind.TASK),
            run.c.state.not_in([str(RunState.PENDING), str(RunState.SKIPPED)]),
        )
        .group_by(run.c.job_id)
    )
    active = [str(s) for s in ACTIVE_RUN_STATES]
    stmt = select(run).where(run.c.id.in_(newest), run.c.state.not_in(active))
    return [run_from_row(r) for r in conn.execute(stmt.order_by(run.c.id))]


def newest_children(conn: Connection, parent_ids: list[int]) -> dict[int, RunRecord]:
    """Of each of the box runs ``parent_ids``, its newest child run (by parent run id)."""
    if not parent_ids:
        return {}
    newest = (
        select(func.max(run.c.id))
        .where(run.c.parent_run_id.in_(parent_ids), run.c.state != str(RunState.PENDING))
        .group_by(run.c.parent_run_id)
    )
    rows = [run_from_row(r) for r in conn.execute(select(run).where(run.c.id.in_(newest)))]
    return {r.parent_run_id: r for r in rows if r.parent_run_id is not None}


def active_runs(conn: Connection) -> list[RunRecord]:
    rows = conn.execute(
        select(run).where(run.c.state.in_([str(s) for s in ACTIVE_RUN_STATES])).order_by(run.c.id)
    )
    return [run_from_row(r) for r in rows]


def job_history(
    conn: Connection, job_id: int, *, limit: int = 50, before_id: int | None = None
) -> list[RunRecord]:
    """A job's runs, newest first, keyset-paginated (``before_id`` = last id of the previous page)."""
    stmt = select(run).where(run.c.job_id == job_id, run.c.state != str(RunState.PENDING))
    if before_id is not None:
        stmt = stmt.where(run.c.id < before_id)
    stmt = stmt.order_by(run.c.id.desc()).limit(limit)
    return [run_from_row(r) for r in conn.execute(stmt)]


def runs_of_tree_run(conn: Connection, root_run_id: int) -> list[RunRecord]:
    stmt = select(run).where(
        or_(run.c.root_run_id == root_run_id, run.c.id == root_run_id),
        run.c.state != str(RunState.PENDING),
    )
    return [run_from_row(r) for r in conn.execute(stmt.order_by(run.c.id))]


def drop_pending(conn: Connection, run_id: int | None = None) -> int:
    """Forget a run queued ahead that never became claimable (all of them without an id)."""
    stmt = delete(run).where(run.c.state == str(RunState.PENDING))
    if run_id is not None:
        stmt = stmt.where(run.c.id == run_id)
    return int(conn.execute(stmt).rowcount)


def drop_released_aheads(conn: Connection, run_id: int | None = None) -> int:
    """Forget the runs queued ahead that their predecessor's end made claimable and no
    worker claimed yet (start-up recovery: their box goes on from that end instead, and
    queues its next task again); or the one ``run_id``, whose box stopped before it."""
    stmt = delete(run).where(run.c.state == str(RunState.QUEUED), run.c.after_run_id.is_not(None))
    if run_id is not None:
        stmt = stmt.where(run.c.id == run_id)
    return int(conn.execute(stmt).rowcount)


def forget_log(conn: Connection, run_ids: Sequence[int]) -> None:
    if run_ids:
        conn.execute(update(run).where(run.c.id.in_(list(run_ids))).values(log_path=None))


def count_runs(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(run)).scalar_one())


def queued_by_queue(conn: Connection) -> list[tuple[str, int, datetime]]:
    """(queue, task runs queued in it, when the oldest of them was created), by queue."""
    stmt = (
        select(run.c.queue, func.count(), func.min(lanes.queued_since()))
        .where(run.c.state == str(RunState.QUEUED))
        .group_by(run.c.queue)
        .order_by(run.c.queue)
    )
    return [(r[0], int(r[1]), r[2]) for r in conn.execute(stmt)]


def count_queued(conn: Connection) -> int:
    """Task runs waiting for a free slot (the queue depth)."""
    stmt = select(func.count()).select_from(run).where(run.c.state == str(RunState.QUEUED))
    return int(conn.execute(stmt).scalar_one())


# ------------------------------------------------------------------ settings kept

# The key of ``jc_meta`` that says the timers are paused (a pause outlives its daemon).
TIMERS_PAUSED = "timers_paused"


def get_meta(conn: Connection, key: str) -> str | None:
    found = conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar_one_or_none()
    return None if found is None else str(found)


def set_meta(conn: Connection, key: str, value: str | None) -> None:
    """Keep ``value`` under ``key``; None removes it."""
    conn.execute(delete(meta).where(meta.c.key == key))
    if value is not None:
        conn.execute(insert(meta).values(key=key, value=value))
