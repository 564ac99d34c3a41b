"""Named queries of the users and the audit trail.

Kept apart from ``queries.py`` (the jobs and runs, already at its size limit);
the same rules hold: values are always bound, statements on a hot path are
built once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Insert, Row, bindparam, delete, func, insert, select, update

from jobcontrol.store.schema import app_user, audit

# ---------------------------------------------------------------- users


def count_users(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(app_user)).scalar_one())


def user_row(conn: Connection, name: str) -> Row[Any] | None:
    return conn.execute(select(app_user).where(app_user.c.name == name)).first()


def user_by_token_hash(conn: Connection, token_hash: str) -> Row[Any] | None:
    return conn.execute(select(app_user).where(app_user.c.token_hash == token_hash)).first()


def all_users(conn: Connection) -> list[Row[Any]]:
    return list(conn.execute(select(app_user).order_by(app_user.c.name)))


def count_role_locked(conn: Connection, role: str) -> int:
    """How many users have ``role``, their rows locked until the transaction ends
    (PostgreSQL; SQLite's write transaction holds the whole database already): two
    removals of the role's last two users cannot both count two."""
    locked = select(app_user.c.id).where(app_user.c.role == role).with_for_update()
    return len(conn.execute(locked).all())


def insert_user(conn: Connection, values: Mapping[str, Any]) -> int:
    stmt = insert(app_user).values(**values).returning(app_user.c.id)
    return int(conn.execute(stmt).scalar_one())


def delete_user(conn: Connection, name: str) -> bool:
    return conn.execute(delete(app_user).where(app_user.c.name == name)).rowcount == 1


def set_token(conn: Connection, name: str, token_hash: str, now: datetime) -> bool:
    stmt = (
        update(app_user)
        .where(app_user.c.name == name)
        .values(token_hash=token_hash, token_created=now)
    )
    return conn.execute(stmt).rowcount == 1


def touch_user(conn: Connection, user_id: int, now: datetime, seen_before: datetime) -> None:
    """Set last_seen, unless another request already did so since ``seen_before``."""
    stmt = (
        update(app_user)
        .where(app_user.c.id == user_id)
        .where((app_user.c.last_seen.is_(None)) | (app_user.c.last_seen < seen_before))
        .values(last_seen=now)
    )
    conn.execute(stmt)


# ---------------------------------------------------------------- audit


@functools.cache
def _insert_audit_stmt() -> Insert:
    return insert(audit).values(
        at=bindparam("a_at"),
        user_name=bindparam("a_user"),
        operation=bindparam("a_operation"),
        jobs=bindparam("a_jobs"),
        result=bindparam("a_result"),
        detail=bindparam("a_detail"),
    )


def insert_audit(
    conn: Connection,
    at: datetime,
    user: str,
    operation: str,
    jobs_json: str,
    result: str,
    detail: str,
) -> None:
    conn.execute(
        _insert_audit_stmt(),
        {
            "a_at": at,
            "a_user": user,
            "a_operation": operation,
            "a_jobs": jobs_json,
            "a_result": result,
            "a_detail": detail,
        },
    )


def audit_page(
    conn: Connection,
    *,
    limit: int,
    before_id: int | None,
    user: str | None,
    job_like: str | None,
) -> list[Row[Any]]:
    """Entries newest first, keyset-paged by id; ``job_like`` is a LIKE pattern (escape '\\')."""
    stmt = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if before_id is not None:
        stmt = stmt.where(audit.c.id < before_id)
    if user is not None:
        stmt = stmt.where(audit.c.user_name == user)
    if job_like is not None:
        stmt = stmt.where(audit.c.jobs.like(job_like, escape="\\"))
    return list(conn.execute(stmt))
