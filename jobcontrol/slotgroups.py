"""A worker's slot groups: ``--queues "fast_lane:1 manual,*:4"`` (the slot-group design).

A worker's slots are split into groups, separated by spaces. Each group is a
comma-separated list of queue (lane) names and, after a colon, its number of
slots. A group claims on its own, with its own capacity and back-off:

* without ``*`` it is in **filter** mode: it claims only runs of the queues named;
* with ``*`` (last in its list) it is in **preference** mode: it claims runs of any
  queue, those of the queues named first, in the order named, then the rest.

Within one preference position, runs go by priority (higher first), then age.
``"manual,*:5"`` alone is the old single pool of five slots that serves every
queue. A run stays with the group that claimed it for its whole life.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobcontrol.errors import OptionError
from jobcontrol.model import queue_name_problem

WILDCARD = "*"
MAX_SLOTS = 1024
# What --queues uses itself, and so a queue name there cannot hold: between groups
# (whitespace, which no queue name holds anyway), between names, before the slots, and
# the wildcard.
SPEC_SYNTAX = ",:*"


@dataclass(frozen=True)
class SlotGroup:
    """One group: the queues it claims from, in order of preference, and its slots."""

    queues: tuple[str, ...]
    slots: int

    @property
    def preference(self) -> bool:
        """Whether the group takes any queue (``*``), the named ones first."""
        return self.queues[-1] == WILDCARD

    @property
    def named(self) -> tuple[str, ...]:
        """The queues named, in order, without the wildcard."""
        return self.queues[:-1] if self.preference else self.queues

    @property
    def key(self) -> str:
        """The group as written, e.g. ``manual,*``: its name in the registry and in logs."""
        return ",".join(self.queues)

    def __str__(self) -> str:
        return f"{self.key}:{self.slots}"


def check_queue_name(name: str, what: str = "queue") -> str:
    """A lane or queue name as the worker's ``--queues`` can name it, or OptionError:
    any name a lane may have (``lane add`` and a job's ``queue`` take the same), but for
    the characters the spec itself uses."""
    problem = queue_name_problem(name)
    if problem is None and any(ch in SPEC_SYNTAX for ch in name):
        problem = "--queues cannot name a queue holding ',', ':' or '*'"
    if problem is not None:
        raise OptionError(f"{what} {name!r}: {problem}")
    return name


def parse(text: str, option: str = "--queues") -> list[SlotGroup]:
    """The slot groups ``text`` describes; OptionError naming the part that is wrong."""
    groups: list[SlotGroup] = []
    parts = text.split()
    if not parts:
        raise OptionError(f"{option}: give at least one group, e.g. 'manual,*:4'")
    seen: set[tuple[str, ...]] = set()
    for part in parts:
        group = _group(part, option)
        if group.queues in seen:
            raise OptionError(f"{option}: the group {group.key!r} is given twice")
        seen.add(group.queues)
        groups.append(group)
    return groups


def format_groups(groups: list[SlotGroup]) -> str:
    """The ``--queues`` text of ``groups`` (what ``parse`` reads back)."""
    return " ".join(str(g) for g in groups)


def every_queue(slots: int) -> list[SlotGroup]:
    """One group of ``slots`` that serves every queue: a worker without ``--queues``."""
    return [SlotGroup((WILDCARD,), slots)]


def _group(part: str, option: str) -> SlotGroup:
    names, colon, count = part.rpartition(":")
    if not colon:
        raise OptionError(f"{option}: {part!r} has no slot count (write it as QUEUES:SLOTS)")
    if not count.isdigit() or not 1 <= int(count) <= MAX_SLOTS:
        raise OptionError(
            f"{option}: {part!r}: the slot count must be a whole number from 1 to {MAX_SLOTS},"
            f" not {count!r}"
        )
    queues = tuple(names.split(","))
    for i, name in enumerate(queues):
        if name == WILDCARD:
            if i != len(queues) - 1:
                raise OptionError(f"{option}: {part!r}: '*' must come last in its group")
            continue
        if not name:
            raise OptionError(f"{option}: {part!r} has an empty queue name")
        try:
            check_queue_name(name)
        except OptionError as exc:
            raise OptionError(f"{option}: {part!r}: {exc}") from None
    if len(set(queues)) != len(queues):
        raise OptionError(f"{option}: {part!r} names a queue twice")
    return SlotGroup(queues, int(count))
