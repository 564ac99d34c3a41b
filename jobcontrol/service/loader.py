"""Definition files in and out of the database: ``load`` is one batch, ``export`` whole trees."""

from __future__ import annotations

import dataclasses
from typing import Any

from jobcontrol.definitions import commands
from jobcontrol.definitions.parse import (
    JobDef,
    dump_definitions,
    field_defaults,
    iter_defs,
    parse_definitions,
)
from jobcontrol.errors import DefinitionError, JobError, UnknownJobError
from jobcontrol.model import JobRecord, Kind
from jobcontrol.service import audit
from jobcontrol.service.engine import Batch, BatchResult, Engine, JobChange, NewJob
from jobcontrol.store import queries
from jobcontrol.views import ENV_MASK, masked_env, tree_order


def load_definitions(
    engine: Engine, text: str, source: str, *, user: str, replace: bool = False
) -> BatchResult:
    """Create or update every job of the file in ONE batch; refused whole with the file's line.

    The file is the whole definition of the jobs it names: a field it leaves
    out goes back to its default. With ``replace``, jobs of the file's trees
    that the file no longer has are deleted in the same batch. Audited as one
    'definitions.load' entry naming the file, refusals included.
    """
    with audit.scope(engine.store, user, "definitions.load") as note:
        note.detail = source
        return _load(engine, text, source, note, replace=replace)


def _load(
    engine: Engine, text: str, source: str, note: audit.AuditNote, *, replace: bool
) -> BatchResult:
    with engine.store.read() as conn:
        records = queries.load_all_jobs(conn)
    # What the database holds was checked when saved: a reload does not check it again.
    commands.known_good(r.command for r in records if r.command is not None)
    roots = parse_definitions(text, source)
    note.jobs = [d.name for d, _ in iter_defs(roots)]
    existing = {r.name: r for r in records}
    lines = {d.name: d.line for d, _ in iter_defs(roots)}
    batch = Batch()
    for d, parent in iter_defs(roots):
        fields = _definition_fields(d)
        parent_name = parent.name if parent else d.parent
        if parent is None:
            # The top of the file: the top level's order is the dispatcher's (by next run,
            # spec 4.5), and a sub-tree (``parent:``) keeps its place among its siblings
            # (a new one goes last). The file's order would change them all on a reload.
            fields.pop("job_order", None)
        current = existing.get(d.name)
        if current is None:
            batch.creates.append(NewJob(d.name, d.kind, parent_name, fields))
            continue
        if current.kind is not d.kind:
            raise DefinitionError(
                source,
                d.line,
                f"job {d.name!r}: is a {current.kind} in the database; a {current.kind} cannot become a {d.kind}",
            )
        batch.changes.append(JobChange(d.name, {**fields, "parent_id": parent_name}))
    if replace:
        batch.deletes = _dropped(records, roots, existing)
        note.jobs += _subtree_names(records, batch.deletes)
    try:
        return engine.apply_batch(batch, user=note.user)
    except JobError as exc:
        raise DefinitionError(source, lines.get(exc.job), str(exc)) from exc


def _definition_fields(d: JobDef) -> dict[str, Any]:
    fields = {**field_defaults(), **d.fields}
    if d.kind is Kind.TASK:
        fields.pop("box_type", None)
    else:
        fields.pop("command", None)
    return fields


def _dropped(
    records: list[JobRecord], roots: list[JobDef], existing: dict[str, JobRecord]
) -> list[int | str]:
    """Jobs under the file's existing top-level jobs that the file no longer names (outermost only)."""
    in_file = {d.name for d, _ in iter_defs(roots)}
    children: dict[int | None, list[JobRecord]] = {}
    for r in records:
        children.setdefault(r.parent_id, []).append(r)
    dropped: list[int | str] = []
    stack = [existing[root.name] for root in roots if root.name in existing]
    while stack:
        node = stack.pop()
        for child in children.get(node.id, []):
            if child.name in in_file:
                stack.append(child)
            else:
                dropped.append(child.id)
                stack.extend(c for c in children.get(child.id, []) if c.name in in_file)
    return dropped


def _subtree_names(records: list[JobRecord], ids: list[int | str]) -> list[str]:
    """The names of the jobs ``ids`` and of all below them: what their delete removes."""
    children: dict[int | None, list[JobRecord]] = {}
    for r in records:
        children.setdefault(r.parent_id, []).append(r)
    by_id = {r.id: r for r in records}
    names: list[str] = []
    stack = [by_id[i] for i in ids if isinstance(i, int) and i in by_id]
    while stack:
        node = stack.pop()
        names.append(node.name)
        stack.extend(children.get(node.id, []))
    return names


# Heads an export whose env values are masked, so that nobody loads it back unawares.
MASKED_HEADER = (
    f"# env values are masked ({ENV_MASK}): this user may not read them.\n"
    "# Loading this file would set them to the mask.\n"
)


def export_definitions(engine: Engine, job: str | None = None, *, mask_env: bool = False) -> str:
    """YAML for every tree, or for the sub-tree rooted at ``job``; ``mask_env`` masks
    the values of every env (for a user who may not read them)."""
    with engine.store.read() as conn:
        records = queries.load_all_jobs(conn)
    if job is not None:
        root = next((r for r in records if r.name == job), None)
        if root is None:
            raise UnknownJobError(job)
        above = next((r.name for r in records if r.id == root.parent_id), None)
        names = {root.id: above} if above is not None else {}
        records = _subtree(records, root)
    else:
        names = {}
    ordered = [r for r, _ in tree_order(records)]
    if not mask_env:
        return dump_definitions(ordered, parents=names)
    ordered = [dataclasses.replace(r, env=masked_env(r.env)) if r.env else r for r in ordered]
    return MASKED_HEADER + dump_definitions(ordered, parents=names)


def _subtree(records: list[JobRecord], root: JobRecord) -> list[JobRecord]:
    children: dict[int | None, list[JobRecord]] = {}
    for r in records:
        children.setdefault(r.parent_id, []).append(r)
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(children.get(node.id, []))
    root_copy = JobRecord(**{**root.__dict__, "parent_id": None})  # the root of the export
    return [root_copy if r is root else r for r in out]
