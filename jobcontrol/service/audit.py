"""The audit trail: who changed what, when, and whether it was allowed.

Every changing call records one entry. A successful edit records it in the
edit's own transaction (one INSERT), so the trail and the tables agree; a
refused one records it afterwards in a small transaction of its own, once the
refused transaction has rolled back, so a refusal still changes nothing but
the trail.

``scope`` is how callers do this: the outermost scope on a thread owns the
entry, and nested scopes (``load_definitions`` calling ``apply_batch``) share
it, so one request is one entry.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from jobcontrol.errors import (
    BusyError,
    JobControlError,
    StoreError,
    StoreUnavailable,
    clip,
    visible,
)
from jobcontrol.store import Store
from jobcontrol.store import access_queries as q

log = logging.getLogger(__name__)

DETAIL_MAX = 2000
# A refusal is recorded as its request (``POST /api/v1/jobs/<name>/run``): a path with a
# long name is cut, saying how much.
OPERATION_MAX = 500


class Result(enum.StrEnum):
    OK = "ok"
    REFUSED = "refused"
    ERROR = "error"


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    user: str
    operation: str
    jobs: list[str]
    result: Result
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "user": self.user,
            "operation": self.operation,
            "jobs": list(self.jobs),
            "result": str(self.result),
            "detail": self.detail,
        }


@dataclass
class AuditNote:
    """The entry a scope will write; the code inside fills in jobs and detail."""

    user: str
    operation: str
    jobs: list[str]
    detail: str = ""
    recorded: bool = False
    # Set when the work spans several transactions: then no single one records it.
    deferred: bool = False


_current: ContextVar[AuditNote | None] = ContextVar("jobcontrol_audit_note", default=None)


def record(
    conn_or_store: Connection | Store,
    user: str,
    operation: str,
    jobs: Iterable[str],
    result: Result | str,
    detail: str,
    *,
    at: datetime | None = None,
    wait: bool = True,
) -> None:
    """Write one entry: in the caller's transaction, or in a new one given a store
    (without ``wait``, one that fails at once where another write holds the database).

    What a caller gave (a refused request's path and job names) is kept as text any
    reader can encode: a lone half of a surrogate pair is written out (``visible``)."""
    args = (
        at or datetime.now(UTC),
        visible(user),
        clip(operation, OPERATION_MAX),
        json.dumps([visible(name) for name in jobs]),
        str(Result(result)),
        visible(detail)[:DETAIL_MAX],
    )
    if isinstance(conn_or_store, Store):
        with conn_or_store.write(wait=wait) as conn:
            q.insert_audit(conn, *args)
    else:
        q.insert_audit(conn_or_store, *args)


def record_note(conn: Connection, note: AuditNote) -> None:
    """Record a scope's success inside the transaction that makes the change."""
    if note.recorded or note.deferred:
        return
    record(conn, note.user, note.operation, note.jobs, Result.OK, note.detail)
    note.recorded = True


@contextmanager
def scope(store: Store, user: str, operation: str, jobs: Iterable[str] = ()) -> Iterator[AuditNote]:
    """Audit the block: one entry, ok or refused (a JobControlError) or error.

    A scope opened inside another one yields the outer note and records nothing itself.
    """
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    note = AuditNote(user, operation, list(jobs))
    token = _current.set(note)
    try:
        yield note
    except JobControlError as exc:
        result = Result.ERROR if isinstance(exc, StoreError) else Result.REFUSED
        # Refused for an outage or a database holding the dispatcher up: its entry is
        # tried once, at once. Waiting for the database (up to SQLite's busy timeout,
        # behind the dispatcher's own tries) would hold up the refusal itself.
        held_up = isinstance(exc, StoreUnavailable | BusyError)
        if _record_after(store, note, result, str(exc), wait=not held_up, say=not held_up):
            # Said in the refusal's own line (``api.deps.refusal_response``), not a second.
            exc.add_note(f"its audit entry ({note.operation} by {note.user}) not written")
        raise
    except Exception as exc:
        _record_after(store, note, Result.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        _current.reset(token)
    if not note.recorded:
        _record_after(store, note, Result.OK, note.detail)


def current() -> AuditNote | None:
    """The note of the scope this thread is in, if any."""
    return _current.get()


def _record_after(
    store: Store,
    note: AuditNote,
    result: Result,
    detail: str,
    *,
    wait: bool = True,
    say: bool = True,
) -> bool:
    """Write the scope's entry after its outcome. An entry that the database's outage
    costs is logged here, unless ``say`` is false: then True says the caller must."""
    try:
        record(store, note.user, note.operation, note.jobs, result, detail, wait=wait)
    except StoreUnavailable as exc:
        if not say:
            return True
        # The database is away (the outage is logged once by the part that met it, and in
        # health): one line for the entry it costs, no trace of a known cause.
        log.warning(
            "could not write the audit entry %s by %s (%s: %s): %s",
            note.operation,
            note.user,
            result,
            detail,
            exc,
        )
    except JobControlError:
        # The caller's own outcome matters more than the trail: report, don't mask it.
        log.exception(
            "could not write the audit entry %s by %s (%s: %s)",
            note.operation,
            note.user,
            result,
            detail,
        )
    return False


def list_entries(
    store: Store,
    limit: int = 50,
    before_id: int | None = None,
    user: str | None = None,
    job: str | None = None,
) -> list[AuditEntry]:
    """Entries newest first; the next page is ``before_id=<last id of this page>``."""
    if limit < 1:
        raise JobControlError(f"audit: limit must be at least 1, not {limit}")
    job_like = None
    if job is not None:
        quoted = json.dumps(job)  # as it appears in the JSON list, quotes included
        escaped = quoted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        job_like = f"%{escaped}%"
    with store.read() as conn:
        rows = q.audit_page(conn, limit=limit, before_id=before_id, user=user, job_like=job_like)
    entries = [_entry(r) for r in rows]
    if job is not None:  # LIKE narrowed it down; the JSON decides
        entries = [e for e in entries if job in e.jobs]
    return entries


def _entry(row: Any) -> AuditEntry:
    # ``visible``: an entry written before its values were kept encodable reads as one.
    return AuditEntry(
        id=int(row.id),
        at=row.at,
        user=visible(row.user_name),
        operation=visible(row.operation),
        jobs=[visible(name) for name in json.loads(row.jobs)],
        result=Result(row.result),
        detail=visible(row.detail),
    )


__all__ = ["AuditEntry", "AuditNote", "Result", "current", "list_entries", "record", "scope"]
