"""Named queries: every read and write the engine makes, in one place.

Values are always bound. Run state writes are compare-and-set
(``WHERE state IN :expected``); a zero row count means a lost race and the
caller decides what that means.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, delete, func, insert, or_, select, update

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
from jobcontrol.store.schema import job, run

# ---------------------------------------------------------------- jobs


def _job_from_row(row: Row[Any]) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        name=m["name"],
        kind=Kind(m["kind"]),
        parent_id=m["parent_id"],
        description=m["description"],
        job_order=m["job_order"],
        command=m["command"],
        timer=m["timer"],
        active=bool(m["active"]),
        on_error=OnError(m["on_error"]),
        box_type=BoxType(m["box_type"]),
        exit_status=m["exit_status"],
        last_ran=m["last_ran"],
        next_runs=m["next_runs"],
        last_duration_ms=m["last_duration_ms"],
        last_updated=m["last_updated"],
        updated_by=m["updated_by"],
        version=m["version"],
        queue=m["queue"],
        priority=m["priority"],
        timeout_s=m["timeout_s"],
        max_log_files=m["max_log_files"],
        misfire=Misfire(m["misfire"]),
        cwd=m["cwd"],
        env=json.loads(m["env"]) if m["env"] else {},
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
    return [_job_from_row(r) for r in conn.execute(select(job).order_by(job.c.id))]


def load_jobs(conn: Connection, ids: Iterable[int]) -> list[JobRecord]:
    ids = list(ids)
    found: list[JobRecord] = []
    for start in range(0, len(ids), 500):  # keep IN lists within SQLite's variable limit
        chunk = ids[start : start + 500]
        found.extend(_job_from_row(r) for r in conn.execute(select(job).where(job.c.id.in_(chunk))))
    return found


def get_job(conn: Connection, job_id: int) -> JobRecord | None:
    row = conn.execute(select(job).where(job.c.id == job_id)).first()
    return _job_from_row(row) if row else None


def get_job_by_name(conn: Connection, name: str) -> JobRecord | None:
    row = conn.execute(select(job).where(job.c.name == name)).first()
    return _job_from_row(row) if row else None


def job_ids_by_name(conn: Connection, names: Iterable[str]) -> dict[str, int]:
    names = list(names)
    found: dict[str, int] = {}
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        for r in conn.execute(select(job.c.name, job.c.id).where(job.c.name.in_(chunk))):
            found[r.name] = r.id
    return found


def parent_links(conn: Connection) -> dict[int, int | None]:
    return {r.id: r.parent_id for r in conn.execute(select(job.c.id, job.c.parent_id))}


def insert_job(conn: Connection, values: Mapping[str, Any]) -> int:
    result = conn.execute(insert(job).values(**job_values(values)).returning(job.c.id))
    return int(result.scalar_one())


def update_job(
    conn: Connection, job_id: int, values: Mapping[str, Any], expected_version: int | None
) -> bool:
    """A user edit: bumps the version; with ``expected_version`` it is compare-and-set."""
    stmt = update(job).where(job.c.id == job_id)
    if expected_version is not None:
        stmt = stmt.where(job.c.version == expected_version)
    stmt = stmt.values(**job_values(values), version=job.c.version + 1)
    return conn.execute(stmt).rowcount == 1


def delete_job(conn: Connection, job_id: int) -> None:
    # Children go by ON DELETE CASCADE.
    conn.execute(delete(job).where(job.c.id == job_id))


def write_schedule(conn: Connection, rows: Sequence[tuple[int, datetime | None, int]]) -> None:
    """The dispatcher's (id, next_runs, job_order) writes after an evaluation."""
    if not rows:
        return
    stmt = (
        update(job)
        .where(job.c.id == bindparam("b_id"))
        .values(next_runs=bindparam("b_next"), job_order=bindparam("b_order"))
    )
    conn.execute(stmt, [{"b_id": i, "b_next": n, "b_order": o} for i, n, o in rows])


def write_next_runs(conn: Connection, job_id: int, next_runs: datetime | None) -> None:
    conn.execute(update(job).where(job.c.id == job_id).values(next_runs=next_runs))


def write_job_result(
    conn: Connection, job_id: int, last_ran: datetime, exit_status: int, duration_ms: int
) -> None:
    conn.execute(
        update(job)
        .where(job.c.id == job_id)
        .values(last_ran=last_ran, exit_status=exit_status, last_duration_ms=duration_ms)
    )


# ---------------------------------------------------------------- runs

_RUN_JSON = ("env",)


def _run_from_row(row: Row[Any]) -> RunRecord:
    m = dict(row._mapping)
    m.pop("kill_requested", None)
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
    return int(conn.execute(insert(run).values(**vals).returning(run.c.id)).scalar_one())


def get_run(conn: Connection, run_id: int) -> RunRecord | None:
    row = conn.execute(select(run).where(run.c.id == run_id)).first()
    return _run_from_row(row) if row else None


def transition_run(
    conn: Connection, run_id: int, expected: Iterable[RunState], values: Mapping[str, Any]
) -> bool:
    """Compare-and-set a run's state (and other columns); False if the state was not expected."""
    vals = {k: (str(v) if k == "state" else v) for k, v in values.items()}
    stmt = (
        update(run)
        .where(run.c.id == run_id, run.c.state.in_([str(s) for s in expected]))
        .values(**vals)
    )
    return conn.execute(stmt).rowcount == 1


def claim_run(
    conn: Connection,
    *,
    queues: Sequence[str] | None,
    worker: str,
    host: str,
    now: datetime,
    skip_locked: bool,
) -> RunRecord | None:
    """Take the most urgent queued task run, atomically.

    On PostgreSQL the candidate row is locked with ``FOR UPDATE SKIP LOCKED`` so
    concurrent claimers never wait on each other; on SQLite the caller's
    ``BEGIN IMMEDIATE`` serialises claimers.
    """
    pick = select(run.c.id).where(run.c.state == str(RunState.QUEUED))
    if queues is not None:
        pick = pick.where(run.c.queue.in_(list(queues)))
    pick = pick.order_by(run.c.priority.desc(), run.c.id).limit(1)
    if skip_locked:
        pick = pick.with_for_update(skip_locked=True)
    run_id = conn.execute(pick).scalar_one_or_none()
    if run_id is None:
        return None
    claimed = transition_run(
        conn,
        run_id,
        [RunState.QUEUED],
        {"state": RunState.RUNNING, "started": now, "worker": worker, "host": host},
    )
    return get_run(conn, run_id) if claimed else None


def set_run_pid(conn: Connection, run_id: int, pid: int, log_path: str | None) -> None:
    conn.execute(update(run).where(run.c.id == run_id).values(pid=pid, log_path=log_path))


def request_kill(conn: Connection, run_id: int) -> None:
    conn.execute(update(run).where(run.c.id == run_id).values(kill_requested=True))


def kill_requested(conn: Connection, run_id: int) -> bool:
    return bool(conn.execute(select(run.c.kill_requested).where(run.c.id == run_id)).scalar())


def active_runs(conn: Connection) -> list[RunRecord]:
    rows = conn.execute(
        select(run).where(run.c.state.in_([str(s) for s in ACTIVE_RUN_STATES])).order_by(run.c.id)
    )
    return [_run_from_row(r) for r in rows]


def job_history(
    conn: Connection, job_id: int, *, limit: int = 50, before_id: int | None = None
) -> list[RunRecord]:
    """A job's runs, newest first, keyset-paginated (``before_id`` = last id of the previous page)."""
    stmt = select(run).where(run.c.job_id == job_id)
    if before_id is not None:
        stmt = stmt.where(run.c.id < before_id)
    stmt = stmt.order_by(run.c.id.desc()).limit(limit)
    return [_run_from_row(r) for r in conn.execute(stmt)]


def runs_of_tree_run(conn: Connection, root_run_id: int) -> list[RunRecord]:
    stmt = select(run).where(or_(run.c.root_run_id == root_run_id, run.c.id == root_run_id))
    return [_run_from_row(r) for r in conn.execute(stmt.order_by(run.c.id))]


def log_paths_to_prune(conn: Connection, job_id: int, keep: int) -> list[tuple[int, str]]:
    """(run id, log path) of a job's logs beyond the newest ``keep``."""
    stmt = (
        select(run.c.id, run.c.log_path)
        .where(and_(run.c.job_id == job_id, run.c.log_path.is_not(None)))
        .order_by(run.c.id.desc())
        .offset(keep)
    )
    return [(r.id, r.log_path) for r in conn.execute(stmt)]


def forget_log(conn: Connection, run_ids: Sequence[int]) -> None:
    if run_ids:
        conn.execute(update(run).where(run.c.id.in_(list(run_ids))).values(log_path=None))


def count_runs(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(run)).scalar_one())
