"""The worker's ``--queues`` slot groups: the slot-group design's syntax, and its refusals."""

from __future__ import annotations

import pytest

from jobcontrol import slotgroups
from jobcontrol.errors import OptionError
from jobcontrol.slotgroups import SlotGroup


def test_the_designs_example_is_a_pinned_group_and_a_preference_group() -> None:
    fast, rest = slotgroups.parse("fast_lane:1 manual,*:4")
    assert fast == SlotGroup(("fast_lane",), 1)
    assert (fast.preference, fast.named) == (False, ("fast_lane",))
    assert rest == SlotGroup(("manual", "*"), 4)
    assert (rest.preference, rest.named) == (True, ("manual",))
    assert slotgroups.format_groups([fast, rest]) == "fast_lane:1 manual,*:4"


def test_manual_star_five_is_the_old_single_pool() -> None:
    (pool,) = slotgroups.parse("manual,*:5")
    assert (pool.slots, pool.preference, pool.named) == (5, True, ("manual",))
    assert slotgroups.every_queue(5) == [SlotGroup(("*",), 5)]
    assert slotgroups.parse("  a,b:2\t*:3 ") == [SlotGroup(("a", "b"), 2), SlotGroup(("*",), 3)]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "give at least one group"),
        ("fast_lane", "'fast_lane' has no slot count (write it as QUEUES:SLOTS)"),
        ("fast:0", "the slot count must be a whole number from 1 to 1024, not '0'"),
        ("fast:-1", "not '-1'"),
        ("fast:two", "not 'two'"),
        ("fast:99999", "not '99999'"),
        ("*,manual:2", "'*' must come last in its group"),
        ("a,,b:2", "has an empty queue name"),
        (":2", "has an empty queue name"),
        ("a,a:2", "names a queue twice"),
        ("a:1 a:2", "the group 'a' is given twice"),
        ("bad/name:1", "queue 'bad/name': a queue name has no spaces, control characters or '/'"),
        ("x" * 65 + ":1", "a queue name has at most 64 characters"),
        ("..:1", "a queue name cannot be '.' or '..'"),
        ("a:b:1", "queue 'a:b': --queues cannot name a queue holding ',', ':' or '*'"),
        ("gpu*:1", "queue 'gpu*': --queues cannot name a queue holding"),
    ],
)
def test_a_malformed_queues_string_is_refused_naming_the_part(text: str, says: str) -> None:
    with pytest.raises(OptionError) as refused:
        slotgroups.parse(text)
    assert str(refused.value).startswith("--queues")
    assert says in str(refused.value)


@pytest.mark.parametrize("name", ["gpu+x", "ü", "build@linux", "night(2)", "x" * 64])
def test_a_queue_a_lane_may_be_named_after_is_one_queues_can_name(name: str) -> None:
    # `lane add` and a job's queue take these: a worker must be able to serve them.
    assert slotgroups.parse(f"{name}:1 {name},*:2") == [
        SlotGroup((name,), 1),
        SlotGroup((name, "*"), 2),
    ]
