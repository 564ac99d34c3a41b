"""The engine's Python API: every edit, request and view the CLI and API handlers use.

Edits are batches: one transaction, all or nothing, and (when the dispatcher
runs) one turn of the tree-state protocol with exactly one dispatcher
reaction. Everything is checked before it is written; a refusal names the job
and the reason and leaves the database as it was. Every changing call records
one audit entry (``jobcontrol.service.audit``), refusals included.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection

from jobcontrol import events
from jobcontrol.clock import Clock, SystemClock
from jobcontrol.definitions.fields import check_name, check_new_name, normalise_fields
from jobcontrol.dispatch.dispatcher import Dispatcher, EditChange
from jobcontrol.dispatch.recovery import worker_alive
from jobcontrol.errors import (
    ConflictError,
    JobError,
    JobRunningError,
    NotRunningError,
    StoreUnavailable,
    UnknownJobError,
)
from jobcontrol.model import (
    RESCHEDULING_FIELDS,
    JobRecord,
    JobRef,
    JobState,
    Kind,
    Restarted,
    RunRecord,
    find_job,
    trees_a_stop_ends,
)
from jobcontrol.outage import OutageState
from jobcontrol.service import audit
from jobcontrol.service.lanes import LaneService
from jobcontrol.store import Store, lanes, queries, runlogs, runqueue
from jobcontrol.views import job_detail, job_view, tree_order

log = logging.getLogger(__name__)

T = TypeVar("T")

# The fields of a task whose edit its runs still queued follow (``queries.follow_edit``).
_FOLLOWED = {*queries.FOLLOWED_BY_QUEUED, "priority"}


@dataclass
class NewJob:
    name: str
    kind: Kind
    parent: JobRef | None = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobChange:
    job: JobRef
    fields: dict[str, Any]
    version: int | None = None  # the version the caller saw; None = last writer wins


@dataclass
class Batch:
    creates: list[NewJob] = field(default_factory=list)
    changes: list[JobChange] = field(default_factory=list)
    deletes: list[JobRef] = field(default_factory=list)


@dataclass
class BatchResult:
    created: dict[str, int] = field(default_factory=dict)
    modified: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)  # the roots of the sub-trees deleted
    deleted_jobs: int = 0  # how many jobs went with them, the roots included


@dataclass
class _Entry:
    id: int
    name: str
    kind: Kind
    parent_id: int | None
    version: int


class _Structure:
    """Who is whose parent, by id and by name, as of the start of the edit."""

    def __init__(self, entries: Sequence[_Entry], running: set[int]) -> None:
        self.by_id = {e.id: e for e in entries}
        self.by_name = {e.name: e.id for e in entries}
        self.running = running
        self.children: dict[int | None, list[int]] = {}
        for e in entries:
            self.children.setdefault(e.parent_id, []).append(e.id)

    def resolve(self, ref: JobRef) -> _Entry:
        return find_job(
            ref, self.by_id.get, lambda name: self.by_id.get(self.by_name.get(name, -1))
        )

    def subtree(self, job_id: int) -> Iterator[int]:
        stack = [job_id]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(self.children.get(current, ()))

    def ancestors(self, job_id: int | None) -> Iterator[int]:
        while job_id is not None:
            yield job_id
            job_id = self.by_id[job_id].parent_id

    def depth(self, job_id: int) -> int:
        return sum(1 for _ in self.ancestors(job_id)) - 1

    def running_in(self, job_id: int) -> str | None:
        for i in self.subtree(job_id):
            if i in self.running:
                return self.by_id[i].name
        return None


class Engine:
    def __init__(
        self, store: Store, dispatcher: Dispatcher | None = None, *, clock: Clock | None = None
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.clock = clock or (dispatcher.clock if dispatcher else SystemClock())
        self.lanes = LaneService(store, self.clock)  # lanes, the queue, reprioritize

    # ------------------------------------------------------------ the edit turn

    @property
    def _live(self) -> bool:
        return self.dispatcher is not None and self.dispatcher.running

    @contextmanager
    def _edit(self) -> Iterator[tuple[Connection, _Structure, EditChange]]:
        """One edit transaction inside the tree-state protocol (spec 5.4)."""
        change = EditChange()
        if not self._live:
            with self.store.write() as conn:
                struct = self._structure(conn)
                parents = {job_id: e.parent_id for job_id, e in struct.by_id.items()}
                yield conn, struct, change
                _drop_aheads(conn, change)
                _unarm_edited(conn, struct, parents, change)
            return
        assert self.dispatcher is not None
        error = self.dispatcher.unavailable()
        if error is not None:
            # Refused at once, as a run or a kill is: the parts that met the outage ride
            # it out (their tries hold the database's turn), and an edit would wait
            # behind them.
            raise StoreUnavailable(f"the database does not answer: {error}")
        with self.dispatcher.protocol.user_edit() as ticket:
            with self.store.write() as conn:
                yield conn, self._structure(conn), change
                _drop_aheads(conn, change)
            ticket.change = change if change else None
        if change:
            self.dispatcher.post((lambda: None, None))
            change.done.result(self.dispatcher.config.edit_timeout)

    def _structure(self, conn: Connection) -> _Structure:
        if self._live:
            assert self.dispatcher is not None
            nodes = self.dispatcher.tree.nodes.values()
            entries = [
                _Entry(n.id, n.job.name, n.job.kind, n.job.parent_id, n.job.version) for n in nodes
            ]
            running = {n.id for n in nodes if n.state is not JobState.IDLE}
            return _Structure(entries, running)
        from sqlalchemy import select

        from jobcontrol.store.schema import job

        rows = conn.execute(
            select(job.c.id, job.c.name, job.c.kind, job.c.parent_id, job.c.version)
        )
        entries = [_Entry(r.id, r.name, Kind(r.kind), r.parent_id, r.version) for r in rows]
        running = {r.job_id for r in queries.active_runs(conn) if r.job_id is not None}
        return _Structure(entries, running)

    # ------------------------------------------------------------ edits

    def create_job(
        self, name: str, kind: Kind, *, parent: JobRef | None = None, user: str, **fields: Any
    ) -> JobRecord:
        result = self.apply_batch(Batch(creates=[NewJob(name, kind, parent, fields)]), user=user)
        return self.get_job(result.created[name])

    def modify_jobs(self, changes: Sequence[JobChange], *, user: str) -> list[int]:
        """Modify many jobs in one transaction with one dispatcher reaction (Inq's ``modifyJobs``)."""
        return self.apply_batch(Batch(changes=list(changes)), user=user).modified

    def record_refusal(
        self, user: str, operation: str, jobs: Sequence[JobRef], message: str
    ) -> None:
        """Audit a change refused before it reached the engine (a role that may not)."""
        names = self._job_names(jobs)
        audit.record(self.store, user, operation, names, audit.Result.REFUSED, message)

    def apply_batch(self, batch: Batch, *, user: str) -> BatchResult:
        """Create, modify and delete jobs in one transaction, all or nothing; audited."""
        change_names = self._job_names([c.job for c in batch.changes])
        names = [c.name for c in batch.creates] + change_names + self._job_names(batch.deletes)
        with audit.scope(self.store, user, _batch_operation(batch), names):
            return self._apply_batch(batch, user, change_names)

    def _apply_batch(
        self, batch: Batch, user: str, change_names: Sequence[str] = ()
    ) -> BatchResult:
        """``change_names``: the names of ``batch.changes``' jobs (for their messages)."""
        note = audit.current()
        creates = [(c, normalise_fields(c.name, c.fields)) for c in batch.creates]
        changes = [
            (c, normalise_fields(name, c.fields))
            for c, name in zip(batch.changes, change_names, strict=True)
        ]
        for c, _ in creates:
            check_name(c.name, c.name)
            check_new_name(c.name, c.name)
        result = BatchResult()
        with self._edit() as (conn, struct, change):
            now = self.clock.now()
            for new, fields in creates:
                job_id = self._create_one(conn, struct, new, fields, user, now)
                result.created[new.name] = job_id
                change.created.append(job_id)
            twice = _named_twice(struct, [edit for edit, _ in changes])
            if twice is not None:
                raise JobError(
                    twice, "named twice in one batch: give all of its fields in one change"
                )
            # A running job the batch deletes is its refusal, said first: not the move or
            # reorder of a sibling that its deletion brings (`load --replace`).
            for job_ref in batch.deletes:
                self._check_deletable(struct, struct.resolve(job_ref))
            prefetched = self._prefetch(conn, struct, [edit for edit, _ in changes])
            followed: list[int] = []  # runs still queued that took an edit of their task
            for edit, fields in changes:
                changed = self._modify_one(
                    conn, struct, edit, fields, user, now, prefetched, followed
                )
                if changed:
                    change.modified[changed[0]] = changed[1]
            # Deletes go last, so a job the batch moves out of a doomed box survives it.
            for job_ref in batch.deletes:
                result.deleted_jobs += self._delete_one(conn, struct, job_ref, change)
            result.modified = list(change.modified)
            result.deleted = list(change.deleted)
            if note is not None:
                _note_batch(note, result)
                audit.record_note(conn, note)
        if followed:
            # A queue or priority may have changed: the workers look again (a run moved
            # out of a drained lane is claimable now).
            events.runs_queued.send(self.store, run_ids=followed)
        return result

    def _create_one(
        self,
        conn: Connection,
        struct: _Structure,
        new: NewJob,
        fields: dict[str, Any],
        user: str,
        now: Any,
    ) -> int:
        name = check_name(new.name, new.name)  # composed (NFC): one spelling per name
        if name in struct.by_name:
            raise JobError(name, "a job with this name already exists")
        parent_id = None
        if new.parent is not None:
            parent = self._resolve_parent(struct, name, new.parent)
            parent_id = parent.id
        self._check_kind(name, new.kind, fields, creating=True)
        if new.kind is Kind.TASK and not fields.get("command"):
            raise JobError(name, "a task needs a command")
        fields.pop("parent_id", None)
        if "job_order" not in fields:
            fields["job_order"] = len(struct.children.get(parent_id, ()))
        values = {
            **fields,
            "name": name,
            "kind": new.kind,
            "parent_id": parent_id,
            "last_updated": now,
            "updated_by": user,
            "version": 1,
        }
        job_id = queries.insert_job(conn, values)
        entry = _Entry(job_id, name, new.kind, parent_id, 1)
        struct.by_id[job_id] = entry
        struct.by_name[name] = job_id
        struct.children.setdefault(parent_id, []).append(job_id)
        return job_id

    @staticmethod
    def _prefetch(
        conn: Connection, struct: _Structure, edits: Sequence[JobChange]
    ) -> dict[int, JobRecord]:
        """The current rows of the jobs a batch modifies, in one query instead of one per job."""
        ids: set[int] = set()
        for edit in edits:
            try:
                ids.add(struct.resolve(edit.job).id)
            except UnknownJobError:
                pass  # refused in its turn by _modify_one
        return {rec.id: rec for rec in queries.load_jobs(conn, sorted(ids))}

    def _resolve_parent(self, struct: _Structure, name: str, ref: JobRef) -> _Entry:
        try:
            parent = struct.resolve(ref)
        except UnknownJobError:
            raise JobError(name, f"unknown parent {ref!r}") from None
        if parent.kind is not Kind.BOX:
            raise JobError(name, f"parent {parent.name!r} is a task; the parent must be a box")
        return parent

    @staticmethod
    def _check_kind(name: str, kind: Kind, fields: Mapping[str, Any], *, creating: bool) -> None:
        if kind is Kind.TASK and "box_type" in fields:
            raise JobError(name, "box_type is for boxes; this job is a task")
        if "command" not in fields:
            return
        if kind is Kind.BOX and fields["command"] is not None:
            reason = (
                "a box has no command"
                if creating
                else "a box cannot become a task (it has no command)"
            )
            raise JobError(name, reason)
        if kind is Kind.TASK and fields["command"] is None:
            raise JobError(name, "a task cannot become a box (its command cannot be removed)")

    def _modify_one(
        self,
        conn: Connection,
        struct: _Structure,
        edit: JobChange,
        fields: dict[str, Any],
        user: str,
        now: Any,
        prefetched: dict[int, JobRecord],
        followed: list[int],
    ) -> tuple[int, set[str]] | None:
        """``followed``: gets the ids of the task's runs still queued that took the edit."""
        entry = struct.resolve(edit.job)
        name = entry.name
        if edit.version is not None and edit.version != entry.version:
            raise ConflictError(
                name, f"changed by someone else (version {entry.version}, you had {edit.version})"
            )
        self._check_kind(name, entry.kind, fields, creating=False)
        if "parent_id" in fields:
            fields["parent_id"] = self._check_move(struct, entry, fields["parent_id"])
        if "name" in fields and fields["name"] != name:
            check_new_name(name, fields["name"])
        if "name" in fields and fields["name"] != name and fields["name"] in struct.by_name:
            raise JobError(
                name, f"cannot rename to {fields['name']!r}: a job with that name exists"
            )
        # A prefetched row is used once: a second change to the same job reads it afresh.
        current = (prefetched or {}).pop(entry.id, None) or queries.get_job(conn, entry.id)
        assert current is not None
        changed = {k for k, v in fields.items() if getattr(current, k) != v}
        if not changed:
            return None  # nothing changed: no event (spec 5.4)
        if "job_order" in changed and "parent_id" not in changed:
            self._check_reorder(struct, entry)
        values = {k: fields[k] for k in changed}
        values.update(last_updated=now, updated_by=user)
        if not queries.update_job(conn, entry.id, values, edit.version):
            raise ConflictError(name, "changed by someone else meanwhile")
        if current.kind is Kind.TASK and changed & _FOLLOWED:
            followed += queries.follow_edit(conn, entry.id, values)
        if "name" in changed:
            del struct.by_name[name]
            struct.by_name[fields["name"]] = entry.id
            entry.name = fields["name"]
        if "parent_id" in changed:
            struct.children[entry.parent_id].remove(entry.id)
            entry.parent_id = fields["parent_id"]
            struct.children.setdefault(entry.parent_id, []).append(entry.id)
        entry.version += 1
        return entry.id, changed

    def _check_move(self, struct: _Structure, entry: _Entry, ref: JobRef | None) -> int | None:
        if ref is None or ref == "":
            new_parent = None
        else:
            new_parent = self._resolve_parent(struct, entry.name, ref).id
        if new_parent == entry.parent_id:
            return new_parent
        if new_parent is not None and entry.id in struct.ancestors(new_parent):
            raise JobError(
                entry.name, "cannot move a job into itself or one of its descendants (a cycle)"
            )
        busy = struct.running_in(entry.id)
        if busy is not None:
            raise JobRunningError(entry.name, f"job is running ({busy!r}); it cannot be moved")
        return new_parent

    def _check_reorder(self, struct: _Structure, entry: _Entry) -> None:
        """A running job, or a child of a running box, keeps its place until the run ends."""
        busy = struct.running_in(entry.id)
        if busy is None and entry.parent_id in struct.running:
            busy = struct.by_id[entry.parent_id].name
        if busy is not None:
            raise JobRunningError(entry.name, f"job is running ({busy!r}); it cannot be reordered")

    @staticmethod
    def _check_deletable(struct: _Structure, entry: _Entry) -> None:
        busy = struct.running_in(entry.id)
        if busy is None:
            return
        raise JobRunningError(entry.name, f"job is running ({busy!r}); it cannot be deleted")

    def _delete_one(
        self, conn: Connection, struct: _Structure, ref: JobRef, change: EditChange
    ) -> int:
        """Delete the job and its sub-tree; how many jobs went."""
        entry = struct.resolve(ref)
        self._check_deletable(struct, entry)
        gone = list(struct.subtree(entry.id))
        queries.delete_job(conn, entry.id)
        change.deleted.append(entry.id)
        struct.children[entry.parent_id].remove(entry.id)
        for job_id in gone:
            struct.by_name.pop(struct.by_id.pop(job_id).name, None)
            struct.children.pop(job_id, None)
        return len(gone)

    def delete_jobs(self, jobs: Sequence[JobRef], *, user: str) -> BatchResult:
        """Delete jobs with their sub-trees in one transaction: all or nothing. (Inq's
        ``deleteJobs`` commits each sub-tree on its own, spec 5.4, so a refusal midway,
        a running job, left those before it deleted under a "refused" answer.)
        ``deleted``: the roots of the sub-trees; ``deleted_jobs``: how many jobs went."""
        names = self._job_names(jobs)
        with audit.scope(self.store, user, "jobs.delete", names) as note:
            with self.store.read() as conn:
                struct = self._structure(conn)
            targets = {struct.resolve(j).id for j in jobs}
            note.jobs = [struct.by_id[i].name for i in sorted(targets, key=struct.depth)]
            roots: list[JobRef] = [
                job_id
                for job_id in sorted(targets, key=struct.depth)
                if not targets.intersection(struct.ancestors(struct.by_id[job_id].parent_id))
            ]
            return self._apply_batch(Batch(deletes=roots), user)

    # ------------------------------------------------------------ runs

    def _require_dispatcher(self) -> Dispatcher:
        if not self._live:
            raise NotRunningError("Job Control is not running")
        assert self.dispatcher is not None
        return self.dispatcher

    def _attached(self) -> Dispatcher:
        """The dispatcher, running or not: for what it holds in memory (read even while it
        stops, as /metrics and a shutdown request do)."""
        if self.dispatcher is None:
            raise NotRunningError("Job Control is not running")
        return self.dispatcher

    def _job_name(self, job: JobRef) -> str:
        """The name of a job given by id, for the audit trail (the id when unknown)."""
        return self._job_names([job])[0]

    def _job_names(self, jobs: Sequence[JobRef]) -> list[str]:
        """The names of jobs given by name or id, for the audit trail: read from the
        database in one statement (the id where no such job is, or while the database
        does not answer, when the audited call itself is refused with the outage)."""
        ids = [job for job in jobs if not isinstance(job, str)]
        names: dict[int, str] = {}
        if ids:
            try:
                with self.store.read() as conn:
                    names = queries.job_names(conn, ids)
            except StoreUnavailable as exc:
                log.debug("job names for the audit trail not read: %s", exc)
        return [job if isinstance(job, str) else names.get(job, str(job)) for job in jobs]

    def run_now(self, job: JobRef, *, user: str) -> int:
        with audit.scope(self.store, user, "job.run", [self._job_name(job)]) as note:
            run_id = self._require_dispatcher().run_now(job, user)
            note.detail = f"run {run_id}"
            return run_id

    def kill(self, job: JobRef, *, user: str) -> int:
        with audit.scope(self.store, user, "job.kill", [self._job_name(job)]) as note:
            run_id = self._require_dispatcher().kill(job, user)
            note.detail = f"killed run {run_id}"
            return run_id

    def restart(self, job: JobRef, *, user: str) -> Restarted:
        """Re-arm a top-level tree: when it next runs, or why nothing is armed."""
        with audit.scope(self.store, user, "job.restart", [self._job_name(job)]) as note:
            result = self._require_dispatcher().restart(job, user)
            when = result.next_runs
            note.detail = (
                f"next run {when.isoformat()}" if when else f"not armed: {result.not_armed}"
            )
            if result.held:
                note.detail += " (timers paused)"
            return result

    # ------------------------------------------------------------ views

    def get_job(self, job: JobRef) -> JobRecord:
        with self.store.read() as conn:
            return find_job(
                job,
                lambda i: queries.get_job(conn, i),
                lambda name: queries.get_job_by_name(conn, name),
            )

    def history(
        self, job: JobRef, *, limit: int = 50, before_id: int | None = None
    ) -> list[RunRecord]:
        rec = self.get_job(job)
        with self.store.read() as conn:
            return queries.job_history(conn, rec.id, limit=limit, before_id=before_id)

    def list_jobs(self) -> list[dict[str, Any]]:
        """Every job, tree order, with its live state (from the dispatcher, or from the run table)."""
        if self._live:
            assert self.dispatcher is not None
            return [
                job_view(n.job, depth, str(n.state), n.started)
                for n, depth in self.dispatcher.snapshot()
            ]
        with self.store.read() as conn:
            records = queries.load_all_jobs(conn)
            active = queries.active_runs(conn)
        states: dict[int, tuple[str, Any]] = {}
        for run in active:
            if run.job_id is not None:
                state = "waiting" if run.state == "waiting" else "running"
                states[run.job_id] = (state, run.started)
        return [
            job_view(rec, depth, *states.get(rec.id, ("idle", None)))
            for rec, depth in tree_order(records)
        ]

    # ------------------------------------------------------------ the live tree and the dispatcher

    def _on_dispatcher(self, read: Callable[[Dispatcher], T]) -> T:
        """``read`` where the tree is consistent (``Dispatcher.read``): between handlers, or
        while the dispatcher waits out an outage."""
        dispatcher = self._require_dispatcher()
        return dispatcher.read(lambda: read(dispatcher), dispatcher.config.edit_timeout)

    def job_id(self, job: JobRef) -> int:
        """The id of the job ``job`` names, in the live tree."""
        return self._on_dispatcher(lambda d: d.tree.find(job).id)

    def job_detail(self, job: JobRef) -> dict[str, Any]:
        """One job's stored fields and live state, read consistently."""

        def read(d: Dispatcher) -> dict[str, Any]:
            node = d.tree.find(job)
            return job_detail(node.job, node.depth(), str(node.state), node.started, node.run_id)

        return self._on_dispatcher(read)

    def live_views(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """The views of these jobs (those still there), read in one go."""

        def read(d: Dispatcher) -> list[dict[str, Any]]:
            nodes = (d.tree.get(i) for i in ids)
            return [
                job_view(n.job, n.depth(), str(n.state), n.started) for n in nodes if n is not None
            ]

        return self._on_dispatcher(read)

    @property
    def running(self) -> bool:
        """Whether the dispatcher runs (the daemon's health)."""
        return self._live

    def status(self) -> dict[str, Any]:
        """Tree state, paused, timers armed and the next few, timers come due and not yet run,
        root runs in flight."""
        d = self._require_dispatcher()
        return {**d.status(), "tree_state": str(d.protocol.state)}

    def pause_timers(self, *, user: str) -> int:
        """Timers stop firing (trees stay scheduled); how many are held."""
        with audit.scope(self.store, user, "timers.pause") as note:
            armed = self._require_dispatcher().pause_timers()
            note.detail = f"{armed} timers held"
        log.info("Timers paused by %s", user)
        return armed

    def resume_timers(self, *, user: str) -> int:
        """Re-arm every scheduled tree; how many are armed."""
        with audit.scope(self.store, user, "timers.resume") as note:
            armed = self._require_dispatcher().resume_timers()
            note.detail = f"{armed} timers armed"
        log.info("Timers resumed by %s", user)
        return armed

    def busy_jobs(self) -> list[str]:
        """The top-level trees with a run in flight."""
        return self._attached().busy_jobs()

    def trees_a_stop_ends(self) -> tuple[list[str], list[str]]:
        """The top-level trees a stop that leaves the workers their work kills, and those
        it leaves in flight (``model.trees_a_stop_ends``), as the database has them."""
        with self.store.read() as conn:
            return trees_a_stop_ends(queries.active_runs(conn))

    def dispatcher_gauges(self) -> dict[str, int]:
        """Timers armed, timers come due and not yet run, paused (0/1), edits that waited for
        the tree, handler failures."""
        return self._attached().gauges()

    def dispatcher_liveness(self) -> dict[str, float]:
        """How long the dispatcher has been on one event, and how late timers fired
        lately (``Dispatcher.liveness``): read without a turn of the dispatcher's."""
        return self._attached().liveness()

    def outage(self) -> OutageState:
        """Whether the database answers, as the dispatcher sees it."""
        return self._attached().outage.state()

    # ------------------------------------------------------------ runs and workers

    def get_run(self, run_id: int) -> RunRecord | None:
        with self.store.read() as conn:
            return queries.get_run(conn, run_id)

    def stored_log(
        self, run_id: int, offset: int, length: int, tail: int | None = None
    ) -> tuple[bytes, int, int]:
        """(bytes, where they start, the log's size) of a range or of the tail of a log
        kept in the database (``log_path`` = ``db:``), as a file's would be read."""
        with self.store.read() as conn:
            size = runlogs.size(conn, run_id)
            start = max(0, size - tail) if tail is not None else min(offset, size)
            return runlogs.read(conn, run_id, start, length), start, size

    def tree_run(self, root_run_id: int) -> list[RunRecord]:
        """Every run of one tree run (the root's and those beneath it)."""
        with self.store.read() as conn:
            return queries.runs_of_tree_run(conn, root_run_id)

    def count_queued(self) -> int:
        """Task runs queued for a free slot."""
        with self.store.read() as conn:
            return queries.count_queued(conn)

    def workers(self) -> list[dict[str, Any]]:
        """Every registered worker, live ones first (the daemon's clock when it runs), each
        with its ``state`` (``worker_state``)."""
        now = self.clock.now()
        with self.store.read() as conn:
            workers = runqueue.list_workers(conn, now)
            known = lanes.load(conn)
        host = socket.gethostname()
        for w in workers:
            w["state"] = worker_state(w, now, host, known)
        return workers

    def live_workers(self) -> list[dict[str, Any]]:
        """The workers not stopped: name, ``log_problems``, ``log_problem``."""
        with self.store.read() as conn:
            return runqueue.live_workers(conn)

    def unserved_queues(self) -> list[dict[str, Any]]:
        """Queues whose task runs wait with no live worker that serves them: ``queue``,
        ``runs`` queued, ``oldest`` (when the oldest was queued), ``last_worker`` (the
        last that served it and when it was last heard of, if any). A STOPPED lane's
        runs are left out: they wait for the lane (said as such)."""
        now = self.clock.now()
        with self.store.read() as conn:
            waiting = queries.queued_by_queue(conn)
            if not waiting:  # the usual answer: one small read per health poll
                return []
            workers = runqueue.list_workers(conn, now)
            known = lanes.load(conn)
        stopped = {n for n, x in known.by_name.items() if x.stopped_at}
        host = socket.gethostname()
        serving = [w for w in workers if worker_state(w, now, host, known) == "online"]
        if any(w["queues"] is None for w in serving):
            return []  # a worker that takes every queue
        served = {q for w in serving for q in w["queues"]}
        out = []
        for queue, count, oldest in waiting:
            if queue in served or queue in stopped:
                continue
            gone = [w for w in workers if w["queues"] is None or queue in w["queues"]]
            last = max(gone, key=lambda w: w["heartbeat"], default=None)
            out.append(
                {
                    "queue": queue,
                    "runs": count,
                    "oldest": oldest,
                    "last_worker": None
                    if last is None
                    else {"name": last["name"], "heartbeat": last["heartbeat"]},
                }
            )
        return out

    def daemon_view(self) -> tuple[list[RunRecord], list[str]]:
        """(the active runs, the names of the top-level jobs with a next run) from the database."""
        with self.store.read() as conn:
            active = queries.active_runs(conn)
            armed = [
                j.name
                for j in queries.load_all_jobs(conn)
                if j.parent_id is None and j.active and j.next_runs
            ]
        return active, armed

    def timers_paused_since(self) -> str | None:
        """When the timers were paused (``pause``), as the database has it; None if not."""
        with self.store.read() as conn:
            return queries.get_meta(conn, queries.TIMERS_PAUSED)


def worker_state(worker: dict[str, Any], now: datetime, host: str, known: lanes.Lanes) -> str:
    """What a registered worker is doing, as the operator is told (``jobcontrol workers``,
    ``GET /api/v1/workers``):

    - ``online``: it takes runs: heard of lately (within the lease of its runs, the
      shortest stale timeout of the lanes it serves, ``known``, as its own renewals go by;
      or twice the beat interval an idle worker stated), and
      on this host its process alive (``worker_alive``). The daemon's own embedded worker
      goes by its process alone: its heartbeat may lag behind a busy daemon, never its
      claims;
    - ``late``: not heard of for longer than that, though it never said it stopped: a
      process stopped (SIGSTOP), cut off from the database, or a host down. Its runs are
      settled once their leases run out;
    - ``gone``: on this host, its process is not running and it never said it stopped
      (killed);
    - ``stopped``: it said it stopped (or a daemon's start on its host found it gone).
    """
    if worker["stopped"] is not None:
        return "stopped"
    if worker["host"] == host:
        if not worker_alive(worker, host):
            return "gone"
        if int(worker["pid"]) == os.getpid():
            return "online"
    lately = runqueue.heard_of_lately(worker, now, known.lease_of(worker["queues"]))
    return "online" if lately else "late"


def _batch_operation(batch: Batch) -> str:
    parts = [
        op
        for op, items in (
            ("jobs.create", batch.creates),
            ("jobs.modify", batch.changes),
            ("jobs.delete", batch.deletes),
        )
        if items
    ]
    return parts[0] if len(parts) == 1 else "jobs.edit"


def _named_twice(struct: _Structure, edits: Sequence[JobChange]) -> str | None:
    """The name of a job that two changes of one batch name (by name or id), one of
    them with the version it expects, if any: the later was refused as someone else's
    change, the version bumped by the earlier. (Without versions they apply in order.)"""
    seen: dict[int, bool] = {}  # job id -> whether a change of it gave a version
    for edit in edits:
        try:
            entry = struct.resolve(edit.job)
        except UnknownJobError:
            continue  # refused as unknown where it is applied
        versioned = edit.version is not None
        if entry.id in seen and (versioned or seen[entry.id]):
            return entry.name
        seen[entry.id] = seen.get(entry.id, False) or versioned
    return None


def _note_batch(note: audit.AuditNote, result: BatchResult) -> None:
    summary = (
        f"{len(result.created)} created, {len(result.modified)} modified, "
        f"{result.deleted_jobs} deleted"
    )
    note.detail = f"{note.detail}: {summary}" if note.detail else summary


def _unarm_edited(
    conn: Connection, struct: _Structure, parents: dict[int, int | None], change: EditChange
) -> None:
    """With no daemon, an edit that changes when a tree runs clears the time the tree
    was armed for (its top's ``next_runs``, and the edited jobs'): the next daemon arms
    it from now, as a daemon re-arms a tree an edit touched (spec 5.5). A time it finds
    stored is one a daemon armed, kept across its restart (``Evaluator.start_due``)."""
    touched = {j for j, fields in change.modified.items() if fields & RESCHEDULING_FIELDS}
    touched |= set(change.created) | set(change.deleted)
    unarmed = set(touched)
    for job_id in touched:
        if job_id in parents:  # the tree it was in (a move or a delete took it out)
            unarmed.add(_top(job_id, parents.__getitem__))
        if job_id in struct.by_id:  # the tree it is in
            unarmed.add(_top(job_id, lambda j: struct.by_id[j].parent_id))
    for job_id in sorted(unarmed - set(change.deleted)):
        queries.write_next_runs(conn, job_id, None)


def _top(job_id: int, parent_of: Callable[[int], int | None]) -> int:
    while (up := parent_of(job_id)) is not None:
        job_id = up
    return job_id


def _drop_aheads(conn: Connection, change: EditChange) -> None:
    """An edit that changed something takes away, in its own commit, every run queued
    ahead (``pending``): each was made from the definitions before it (a command, the
    box's order, whether a failure releases it), and a worker must not take one between
    this commit and the dispatcher's reaction, which queues them again as it goes on."""
    if change:
        queries.drop_pending(conn)
