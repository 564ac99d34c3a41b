"""Task output kept in the database (``run_log``): what a worker with no shared
filesystem (a remote one) writes instead of a log file, and what the readers read.

A run whose log is here has ``log_path`` = ``DB_LOG``. Its chunks are numbered from
0 (``seq``) and each says at which byte of the log it starts (``pos``), so a range
is read without adding up the chunks before it, and a chunk written twice (a commit
whose answer was lost in an outage, then retried) is recognised and not doubled.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, delete, func, select, update

from jobcontrol.model import DB_LOG
from jobcontrol.store import Store
from jobcontrol.store.schema import run, run_log

__all__ = ["DB_LOG", "append", "delete_runs", "read", "size", "stored", "took_log"]


def append(store: Store, run_id: int, seq: int, pos: int, data: bytes, at: datetime) -> None:
    """Add chunk ``seq`` (bytes ``pos``..) of a run's log, in its own transaction.

    Idempotent: a chunk already there (same run, same ``seq``) is left as it is, so a
    retry after a commit whose answer was lost does not fail or double the bytes.
    """
    with store.write() as conn:
        there = conn.execute(
            select(run_log.c.pos).where(run_log.c.run_id == run_id, run_log.c.seq == seq)
        ).first()
        if there is not None:
            if there.pos != pos:  # a bug, never an outage: say so rather than corrupt the log
                raise RuntimeError(
                    f"run {run_id} log chunk {seq}: stored at byte {there.pos}, given {pos}"
                )
            return
        conn.execute(
            run_log.insert().values(
                run_id=run_id, seq=seq, pos=pos, size=len(data), at=at, data=data
            )
        )


def size(conn: Connection, run_id: int) -> int:
    """How many bytes of the run's log are stored."""
    stmt = select(func.coalesce(func.max(run_log.c.pos + run_log.c.size), 0)).where(
        run_log.c.run_id == run_id
    )
    return int(conn.execute(stmt).scalar_one())


def stored(store: Store, run_id: int) -> tuple[int, int]:
    """(bytes stored, the next chunk's ``seq``) of a run's log: where an upload resumes."""
    with store.read() as conn:
        row = conn.execute(
            select(
                func.coalesce(func.max(run_log.c.pos + run_log.c.size), 0),
                func.coalesce(func.max(run_log.c.seq) + 1, 0),
            ).where(run_log.c.run_id == run_id)
        ).one()
        return int(row[0]), int(row[1])


def took_log(store: Store, run_id: int) -> bool:
    """Say the run's log is in the database, unless its row already names one (a spool
    stored after its run was settled, whose pid and log were never recorded)."""
    with store.write() as conn:
        stmt = (
            update(run).where(run.c.id == run_id, run.c.log_path.is_(None)).values(log_path=DB_LOG)
        )
        return conn.execute(stmt).rowcount == 1


def replace_in_reason(store: Store, run_id: int, said: str, instead: str) -> bool:
    """The run's reason says ``instead`` where it said ``said`` (a worker's note on its
    output, out of date once the output is stored); whether it said it."""
    with store.write() as conn:
        stmt = (
            update(run)
            .where(run.c.id == run_id, run.c.reason.contains(said, autoescape=True))
            .values(reason=func.replace(run.c.reason, said, instead))
        )
        return conn.execute(stmt).rowcount == 1


def read(conn: Connection, run_id: int, start: int, length: int) -> bytes:
    """Up to ``length`` bytes of the run's log from byte ``start`` (fewer at its end)."""
    if length <= 0:
        return b""
    end = start + length
    rows = conn.execute(
        select(run_log.c.pos, run_log.c.data)
        .where(
            run_log.c.run_id == run_id,
            run_log.c.pos < end,
            run_log.c.pos + run_log.c.size > start,
        )
        .order_by(run_log.c.seq)
    )
    out = bytearray()
    for row in rows:
        pos, data = int(row.pos), bytes(row.data)  # a memoryview on PostgreSQL
        lo = max(0, start - pos)
        hi = min(len(data), end - pos)
        out += data[lo:hi]
    return bytes(out)


def delete_runs(conn: Connection, run_ids: Sequence[int]) -> int:
    """Forget the stored output of these runs (pruned by ``max_log_files``); rows deleted."""
    if not run_ids:
        return 0
    return int(conn.execute(delete(run_log).where(run_log.c.run_id.in_(list(run_ids)))).rowcount)
