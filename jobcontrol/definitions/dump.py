"""Writing definition files: job records back to YAML that parses to the same definitions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from jobcontrol.definitions.durations import format_duration
from jobcontrol.errors import JobError
from jobcontrol.model import BoxType, JobRecord, Misfire, OnError

__all__ = ["dump_definitions"]

_ODD_LINE_BREAKS = "\r\x85\u2028\u2029"


class _Dumper(yaml.SafeDumper):
    """Block style, lists indented under their key, multi-line text as ``|`` blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # PyYAML puts "- " flush with the parent key; indenting reads like the docs.
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # PyYAML (allow_unicode) mangles NEL and friends outside double quotes; YAML 1.1
    # counts them as line breaks. Otherwise the emitter still picks quotes itself when
    # a literal block cannot hold the text.
    style: str | None = None
    if any(ch in data for ch in _ODD_LINE_BREAKS):
        style = '"'
    elif "\n" in data:
        style = "|"
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_definitions(jobs: Sequence[JobRecord], parents: Mapping[int, str] | None = None) -> str:
    """YAML for whole job trees; a record whose parent is not in ``jobs`` is a root.
    ``parents``: the box a root goes under (root id -> its name), said as ``parent:``:
    the export of a sub-tree loads back under its box."""
    ids = {record.id for record in jobs}
    children: dict[int | None, list[JobRecord]] = {}
    for record in jobs:
        parent = record.parent_id if record.parent_id in ids else None
        children.setdefault(parent, []).append(record)
    for siblings in children.values():
        siblings.sort(key=lambda record: (record.job_order, record.id))
    _refuse_parent_cycles(jobs, children)
    above = parents or {}
    document = {
        "jobs": [
            _job_mapping(record, children, above.get(record.id))
            for record in children.get(None, [])
        ]
    }
    return yaml.dump(
        document,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1_000_000,
    )


def _refuse_parent_cycles(
    jobs: Sequence[JobRecord], children: dict[int | None, list[JobRecord]]
) -> None:
    # A record not reachable from a root sits on (or under) a parent_id cycle and
    # would silently vanish from the export.
    reached: set[int] = set()
    stack = list(children.get(None, []))
    while stack:
        record = stack.pop()
        reached.add(record.id)
        stack.extend(children.get(record.id, []))
    for record in jobs:
        if record.id not in reached:
            raise JobError(record.name, "cannot export: its parent links form a cycle")


def _job_mapping(
    record: JobRecord, children: dict[int | None, list[JobRecord]], parent: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": record.name}
    if parent is not None:
        out["parent"] = parent
    if record.description is not None:
        out["description"] = record.description
    if record.timer is not None:
        out["timer"] = record.timer
    if record.is_task:
        if record.command is None:
            raise JobError(record.name, "cannot export a task without a command")
        out["command"] = record.command
    out["active"] = record.active
    if record.on_error != OnError.CONTINUE:
        out["on_error"] = str(record.on_error)
    if record.is_box and record.box_type != BoxType.SEQUENCE:
        out["box_type"] = str(record.box_type)
    if record.queue != "default":
        out["queue"] = record.queue
    if record.priority != 0:
        out["priority"] = record.priority
    if record.timeout_s is not None:
        out["timeout"] = format_duration(record.timeout_s)
    if record.max_log_files is not None:
        out["max_log_files"] = record.max_log_files
    if record.retries:
        out["retries"] = record.retries
    if record.misfire != Misfire.RUN_ONCE:
        out["misfire"] = str(record.misfire)
    if record.cwd is not None:
        out["cwd"] = record.cwd
    if record.env:
        out["env"] = dict(record.env)
    kids = children.get(record.id, [])
    if record.is_box:
        out["children"] = [_job_mapping(child, children) for child in kids]
    elif kids:
        raise JobError(record.name, "cannot export a task that has children")
    return out
