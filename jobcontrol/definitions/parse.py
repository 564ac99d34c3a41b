"""Definition files: job trees as YAML (JSON accepted on input).

``parse_definitions`` refuses a file whole at its first problem, naming the
line, the job and the reason; ``dump_definitions`` writes job records back so
that parsing the result gives the same definitions.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, NoReturn

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from jobcontrol.definitions.commands import check_command
from jobcontrol.definitions.dump import dump_definitions
from jobcontrol.definitions.durations import format_duration, parse_duration
from jobcontrol.definitions.fields import (
    cwd_problem,
    env_name_problem,
    normalise_field,
    queue_name_problem,
    unaddressable,
    unprintable_problem,
)
from jobcontrol.errors import CommandError, DefinitionError, JobError, ScheduleError, clip
from jobcontrol.model import (
    MAX_LOG_FILES,
    MAX_PRIORITY,
    MAX_RETRIES,
    BoxType,
    JobRecord,
    Kind,
    Misfire,
    OnError,
)
from jobcontrol.timerexpr.expression import validate_timer

__all__ = [
    "DEFINITION_FIELDS",
    "JOB_KEYS",
    "MAX_DEPTH",
    "NAME_MAX",
    "TOP_LEVEL_KEYS",
    "JobDef",
    "dump_definitions",
    "field_defaults",
    "format_duration",
    "iter_defs",
    "parse_definitions",
    "parse_duration",
]

NAME_MAX = 128
# Real trees are a few levels deep; the bound keeps a hostile file from exhausting the stack.
MAX_DEPTH = 64

# The keys of a job, in the order dump_definitions writes them.
JOB_KEYS = tuple(
    "name parent description timer command active on_error box_type queue priority timeout"
    " max_log_files retries misfire cwd env children".split()
)
# The JobRecord attributes a definition file sets (besides name, kind and job_order).
DEFINITION_FIELDS = tuple(
    "description timer command active on_error box_type queue priority timeout_s"
    " max_log_files retries misfire cwd env".split()
)
TOP_LEVEL_KEYS = ("jobs",)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def field_defaults() -> dict[str, Any]:
    """Each definition field's value when a file does not give it (JobRecord's defaults)."""
    blank = JobRecord(id=0, name="", kind=Kind.BOX)
    return {name: getattr(blank, name) for name in DEFINITION_FIELDS}


@dataclass
class JobDef:
    """One job of a definition file.

    ``fields`` holds the fields the file gives, under JobRecord attribute
    names with model types (``timeout_s``, enums, ``env`` as a dict), plus
    ``job_order`` (index among siblings) and ``active`` (always: a job is
    inactive unless the file says otherwise). ``name`` and ``kind`` are not in it.
    """

    name: str
    kind: Kind
    line: int
    fields: dict[str, Any]
    children: list[JobDef] = field(default_factory=list)
    # A top-level entry's box in the database (``parent:``): a sub-tree's export says
    # where the sub-tree sits, so that loading it back leaves it there. None: top level.
    parent: str | None = None


def iter_defs(roots: list[JobDef]) -> Iterator[tuple[JobDef, JobDef | None]]:
    """Every job as ``(job, parent)``, parents before children, in file order."""
    stack: list[tuple[JobDef, JobDef | None]] = [(job, None) for job in reversed(roots)]
    while stack:
        job, parent = stack.pop()
        yield job, parent
        stack.extend((child, job) for child in reversed(job.children))


def parse_definitions(text: str, source: str = "<input>") -> list[JobDef]:
    """The top-level jobs of a definition file, in file order.

    Raises :class:`DefinitionError` (with the 1-based line) at the first problem.
    """
    loader, root = _compose(text, source)
    try:
        jobs = _jobs_list(root, source)
        roots = _Parser(source, loader).job_list(jobs, depth=0)
    finally:
        loader.dispose()
    return _parents_first(roots, source)


def _parents_first(roots: list[JobDef], source: str) -> list[JobDef]:
    """The top-level entries in file order, except that an entry whose ``parent:`` the
    file defines comes after the entry that holds that parent (decided: the order of a
    file's entries does not matter). Refuses a cycle of ``parent:`` with the file's line."""
    root_of = {d.name: root for root in roots for d, _ in iter_defs([root])}
    roots_by_name = {root.name: root for root in roots}
    done: set[str] = set()
    ordered: list[JobDef] = []
    for first in roots:
        path: dict[str, int] = {}  # entries whose parent's entry goes first: their places
        entry: JobDef | None = first
        while entry is not None and entry.name not in done:
            if entry.name in path:
                cycle = [roots_by_name[n] for n in path][path[entry.name] :]
                chain = " -> ".join(f"{d.name!r} under {d.parent!r}" for d in cycle)
                raise DefinitionError(
                    source,
                    cycle[0].line,
                    f"job {cycle[0].name!r}: 'parent' makes a cycle in this file ({chain})",
                )
            path[entry.name] = len(path)
            entry = root_of.get(entry.parent) if entry.parent is not None else None
        for name in reversed(path):  # distinct, and none placed yet
            done.add(name)
            ordered.append(roots_by_name[name])
    return ordered


def _untab_json(text: str) -> str:
    # PyYAML refuses tabs as indentation, which JSON allows; valid JSON has no raw
    # tab inside a string, so swapping them for spaces keeps meaning and lines.
    if "\t" not in text or not text.lstrip().startswith(("{", "[")):
        return text
    try:
        json.loads(text)
    except ValueError:
        return text
    return text.replace("\t", " ")


def _compose(text: str, source: str) -> tuple[yaml.SafeLoader, Node | None]:
    # The loader is kept: it turns scalar nodes into values later, resolving like PyYAML.
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(_untab_json(text))
        return loader, loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise DefinitionError(
            source, mark.line + 1 if mark else None, f"invalid YAML: {reason}"
        ) from exc
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else exc.character
        raise DefinitionError(
            source, line, f"invalid YAML: character {char}: {exc.reason}"
        ) from exc
    except yaml.YAMLError as exc:
        raise DefinitionError(source, None, f"invalid YAML: {exc}") from exc
    except RecursionError as exc:
        # Python's stack, at some 500 levels of brackets: no file of jobs nests so deep.
        raise DefinitionError(source, None, "invalid YAML: nested too deeply") from exc
    except ValueError as exc:  # an escape past Unicode ("\U00110000")
        at = int(loader.line) + 1 if loader is not None else None
        raise DefinitionError(source, at, f"invalid YAML: {clip(str(exc))}") from exc


def _jobs_list(root: Node | None, source: str) -> SequenceNode:
    expected = "expected a mapping with a 'jobs' list at the top level"
    if root is None:
        raise DefinitionError(source, 1, f"empty file: {expected}")
    if not isinstance(root, MappingNode):
        raise DefinitionError(source, _line(root), f"{expected}, got {_node_kind(root)}")
    jobs: SequenceNode | None = None
    for key_node, value_node in root.value:
        key = key_node.value if isinstance(key_node, ScalarNode) else None
        if key != "jobs":
            raise DefinitionError(
                source, _line(key_node), _unknown_key(key_node, TOP_LEVEL_KEYS, "top-level key")
            )
        if jobs is not None:
            raise DefinitionError(source, _line(key_node), "key 'jobs' given twice")
        if not isinstance(value_node, SequenceNode):
            raise DefinitionError(
                source, _line(value_node), f"'jobs' must be a list, got {_node_kind(value_node)}"
            )
        jobs = value_node
    if jobs is None:
        raise DefinitionError(source, _line(root), f"no 'jobs' key: {expected}")
    return jobs


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _node_kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == "tag:yaml.org,2002:null":
        return "null"
    return clip(repr(node.value))


def _unknown_key(key_node: Node, allowed: Sequence[str], what: str) -> str:
    key = str(key_node.value) if isinstance(key_node, ScalarNode) else _node_kind(key_node)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {clip(repr(key))}{hint}; allowed: {', '.join(allowed)}"


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}".lower()
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, date):
        return f"date {value.isoformat()}"
    return clip(repr(value))


def _number(value: float, *, bare: bool = False) -> str:
    """A number for a message: one of a thousand digits is not written out (past 4,300
    Python refuses to, and no field takes one near that long)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a number of {len(hex(abs(value))) - 2} hexadecimal digits"
    return repr(value) if bare else f"number {value!r}"


class _Parser:
    """Walks the composed YAML nodes so every refusal can name its line."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self.source = source
        self.loader = loader
        self.name_lines: dict[str, int] = {}
        self.seen_nodes: set[int] = set()

    def fail(self, node: Node, job: str | None, reason: str) -> NoReturn:
        prefix = f"job {clip(repr(job))}: " if job is not None else ""
        raise DefinitionError(self.source, _line(node), prefix + reason)

    def job_list(self, node: SequenceNode, depth: int) -> list[JobDef]:
        return [self.job(item, order, depth) for order, item in enumerate(node.value)]

    def job(self, node: Node, order: int, depth: int) -> JobDef:
        if not isinstance(node, MappingNode):
            self.fail(node, None, f"a job must be a mapping, got {_node_kind(node)}")
        if depth >= MAX_DEPTH:
            self.fail(node, None, f"jobs nested more than {MAX_DEPTH} deep")
        if id(node) in self.seen_nodes:
            self.fail(node, None, "the same job appears twice (a YAML alias)")
        self.seen_nodes.add(id(node))
        name = self.job_name(node)
        given = self.job_keys(node, name)
        if "command" in given and "children" in given:
            self.fail(node, name, "a job has 'command' (a task) or 'children' (a box), not both")
        kind = Kind.TASK if "command" in given else Kind.BOX
        if kind is Kind.TASK and "box_type" in given:
            self.fail(given["box_type"][0], name, "'box_type' is for boxes, not tasks")
        fields: dict[str, Any] = {"job_order": order, "active": False}
        for key, (_, value_node) in given.items():
            if key in _FIELD_PARSERS:
                field_name, parse = _FIELD_PARSERS[key]
                fields[field_name] = self.checked(value_node, name, field_name, parse)
        parent: str | None = None
        if "parent" in given:
            key_node, value_node = given["parent"]
            if depth > 0:
                self.fail(
                    key_node,
                    name,
                    "'parent' is for a job at the top of the file (the box it goes under); "
                    "a nested job's parent is the box it is listed in",
                )
            parent = self.string(value_node, name, "parent")
            if parent == name:
                self.fail(value_node, name, "a job cannot be its own parent")
        children: list[JobDef] = []
        if "children" in given:
            children = self.job_list(self.children_list(given["children"][1], name), depth + 1)
        return JobDef(
            name=name, kind=kind, line=_line(node), fields=fields, children=children, parent=parent
        )

    def job_name(self, node: MappingNode) -> str:
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == "name":
                # One spelling per name: "é" typed as e and a combining accent is "é".
                name = unicodedata.normalize("NFC", self.string(value_node, None, "name"))
                break
        else:
            self.fail(node, None, "a job needs a 'name'")
        problem = _name_problem(name)
        if problem is not None:
            self.fail(value_node, None, f"invalid job name {clip(repr(name))}: {problem}")
        if name in self.name_lines:
            first = self.name_lines[name]
            self.fail(value_node, name, f"duplicate job name (first at line {first})")
        self.name_lines[name] = _line(value_node)
        return name

    def job_keys(self, node: MappingNode, name: str) -> dict[str, tuple[Node, Node]]:
        given: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key not in JOB_KEYS:
                self.fail(key_node, name, _unknown_key(key_node, JOB_KEYS, "key"))
            if key in given:
                first = _line(given[key][0])
                self.fail(
                    key_node, name, f"key {clip(repr(key))} given twice (first at line {first})"
                )
            given[key] = (key_node, value_node)
        return given

    def checked(self, node: Node, job: str, field_name: str, parse: _FieldParser) -> Any:
        """A field as its parser reads it, then checked as an edit through the API or
        the CLI checks it (its limits): a file and a request are the same call."""
        value = parse(self, node, job)
        if field_name not in _EDIT_CHECKED:
            return value
        try:
            normalise_field(job, field_name, value)
        except JobError as exc:
            self.fail(node, job, exc.reason)
        return value

    def scalar(self, node: Node, job: str | None, key: str, expected: str) -> Any:
        if not isinstance(node, ScalarNode):
            self.fail(node, job, f"{clip(repr(key))} must be {expected}, got {_node_kind(node)}")
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.fail(node, job, f"{clip(repr(key))}: {exc}")
        except (ValueError, TypeError, LookupError, AttributeError) as exc:
            # What YAML's resolution took it for cannot be built: a date-shaped value out
            # of range (2001-13-14), an integer of 4,300 digits, ``!!int abc``.
            kind = node.tag.rsplit(":", 1)[-1]
            plain = not node.style and self.loader.resolve(ScalarNode, node.value, (True, False))
            hint = " (put it in quotes to make it a string)" if plain == node.tag else ""
            self.fail(
                node,
                job,
                f"{clip(repr(key))}: {clip(repr(node.value))} is no {kind}: {clip(str(exc))}{hint}",
            )
        if isinstance(value, str) and _SURROGATE.search(value):
            # JSON writes a character beyond the BMP as a pair of \u escapes, which
            # YAML reads as two halves: joined here, as a JSON reader does.
            try:
                value = value.encode("utf-16", "surrogatepass").decode("utf-16")
            except UnicodeDecodeError:
                self.fail(node, job, f"{clip(repr(key))} has a lone UTF-16 surrogate (\\u escape)")
        return value

    def wrong(self, node: Node, job: str | None, key: str, expected: str, value: Any) -> NoReturn:
        hint = ""
        if expected == "a string" and isinstance(node, ScalarNode) and not node.style:
            hint = " (put it in quotes to make it a string)"
        self.fail(node, job, f"{clip(repr(key))} must be {expected}, got {_describe(value)}{hint}")

    def string(self, node: Node, job: str | None, key: str, *, optional: bool = False) -> Any:
        value = self.scalar(node, job, key, "a string")
        if not isinstance(value, str) and not (optional and value is None):
            self.wrong(node, job, key, "a string", value)
        return value

    def integer(self, node: Node, job: str, key: str, low: int, high: int) -> int:
        value = self.scalar(node, job, key, "an integer")
        if not isinstance(value, int) or isinstance(value, bool):
            self.wrong(node, job, key, "an integer", value)
        if not low <= value <= high:
            self.fail(
                node,
                job,
                f"{clip(repr(key))} must be between {low} and {high}, got {_number(value, bare=True)}",
            )
        return value

    def choice(self, node: Node, job: str, key: str, enum: type[Any]) -> Any:
        allowed = ", ".join(member.value for member in enum)
        value = self.scalar(node, job, key, f"one of {allowed}")
        if not isinstance(value, str) or value not in {member.value for member in enum}:
            self.wrong(node, job, key, f"one of {allowed}", value)
        return enum(value)

    def children_list(self, node: Node, job: str) -> SequenceNode:
        if not isinstance(node, SequenceNode):
            got = _node_kind(node)
            self.fail(node, job, f"'children' must be a list (use [] for none), got {got}")
        return node


def _name_problem(name: str) -> str | None:
    if not 1 <= len(name) <= NAME_MAX:
        return f"must be 1 to {NAME_MAX} characters long"
    if name != name.strip():
        return "must not start or end with spaces"
    return unprintable_problem(name) or unaddressable(name)


def _parse_description(p: _Parser, node: Node, job: str) -> str | None:
    value: str | None = p.string(node, job, "description", optional=True)
    return value


def _parse_timer(p: _Parser, node: Node, job: str) -> str | None:
    value: str | None = p.string(node, job, "timer", optional=True)
    if value is not None:
        try:
            validate_timer(value)
        except ScheduleError as exc:
            p.fail(node, job, str(exc))
    return value


def _parse_command(p: _Parser, node: Node, job: str) -> str:
    value: str = p.string(node, job, "command")
    try:
        check_command(value)
    except CommandError as exc:
        p.fail(node, job, f"invalid command: {exc}")
    return value


def _parse_active(p: _Parser, node: Node, job: str) -> bool:
    value = p.scalar(node, job, "active", "true or false")
    if not isinstance(value, bool):
        p.wrong(node, job, "active", "true or false", value)
    return value


def _parse_queue(p: _Parser, node: Node, job: str) -> str:
    value: str = p.string(node, job, "queue")
    # Lane lists on worker command lines are space separated, so a name cannot hold one.
    problem = queue_name_problem(value)
    if problem is not None:
        p.fail(node, job, f"'queue' {clip(value)!r}: {problem}")
    return value


def _parse_timeout(p: _Parser, node: Node, job: str) -> float | None:
    value = p.scalar(node, job, "timeout", "a duration")
    if value is None:
        return None
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        p.wrong(node, job, "timeout", "a duration like 90s, 5m or 1h30m", value)
    try:
        return parse_duration(value)
    except ValueError as exc:
        p.fail(node, job, f"invalid 'timeout': {exc}")


def _parse_max_log_files(p: _Parser, node: Node, job: str) -> int | None:
    if isinstance(node, ScalarNode) and p.scalar(node, job, "max_log_files", "") is None:
        return None
    return p.integer(node, job, "max_log_files", 1, MAX_LOG_FILES)


def _parse_cwd(p: _Parser, node: Node, job: str) -> str | None:
    value: str | None = p.string(node, job, "cwd", optional=True)
    problem = cwd_problem(value) if value is not None else None
    if problem is not None:
        p.fail(node, job, f"'cwd' {problem}")
    return value


def _parse_env(p: _Parser, node: Node, job: str) -> dict[str, str]:
    if not isinstance(node, MappingNode):
        p.fail(node, job, f"'env' must be a mapping of names to strings, got {_node_kind(node)}")
    env: dict[str, str] = {}
    for key_node, value_node in node.value:
        key = p.string(key_node, job, "env name")
        if not _ENV_NAME.fullmatch(key):
            p.fail(key_node, job, f"invalid environment variable name {clip(repr(key))}")
        problem = env_name_problem(key)
        if problem is not None:
            p.fail(key_node, job, f"environment variable {clip(repr(key))} {problem}")
        if key in env:
            p.fail(key_node, job, f"environment variable {clip(repr(key))} given twice")
        value = p.string(value_node, job, f"env {key}")
        if "\0" in value:
            p.fail(value_node, job, f"environment variable {clip(repr(key))} contains a NUL byte")
        env[key] = value
    return env


_FieldParser = Callable[[_Parser, Node, str], Any]
# The fields whose limits an edit's check adds to the file's own (lengths, sizes).
# (A queue's parser checks the same rule as an edit, ``queue_name_problem``.)
_EDIT_CHECKED = frozenset({"description", "timer", "timeout_s", "cwd", "env"})
_SURROGATE = re.compile("[\ud800-\udfff]")
_FIELD_PARSERS: dict[str, tuple[str, _FieldParser]] = {
    "description": ("description", _parse_description),
    "timer": ("timer", _parse_timer),
    "command": ("command", _parse_command),
    "active": ("active", _parse_active),
    "on_error": ("on_error", lambda p, n, j: p.choice(n, j, "on_error", OnError)),
    "box_type": ("box_type", lambda p, n, j: p.choice(n, j, "box_type", BoxType)),
    "queue": ("queue", _parse_queue),
    "priority": (
        "priority",
        lambda p, n, j: p.integer(n, j, "priority", -MAX_PRIORITY, MAX_PRIORITY),
    ),
    "timeout": ("timeout_s", _parse_timeout),
    "max_log_files": ("max_log_files", _parse_max_log_files),
    "retries": ("retries", lambda p, n, j: p.integer(n, j, "retries", 0, MAX_RETRIES)),
    "misfire": ("misfire", lambda p, n, j: p.choice(n, j, "misfire", Misfire)),
    "cwd": ("cwd", _parse_cwd),
    "env": ("env", _parse_env),
}
