"""``gcpause``: full collections counted and timed, start-up frozen, on the real collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from jobcontrol import gcpause
from jobcontrol.gcpause import GcWatch


@pytest.fixture
def watch() -> Iterator[GcWatch]:
    w = GcWatch().install()
    try:
        yield w
    finally:
        w.uninstall()


def test_a_full_collection_is_counted_and_timed(watch: GcWatch) -> None:
    gc.collect()
    gc.collect()
    assert watch.collections == 2
    assert 0 < watch.longest <= watch.seconds
    series = watch.gauges()
    assert series["jobcontrol_gc_full_collections_total"][1] == 2
    assert series["jobcontrol_gc_full_pause_seconds_max"][1] == watch.longest


def test_young_collections_are_not_counted(watch: GcWatch) -> None:
    gc.collect(0)
    gc.collect(1)
    assert (watch.collections, watch.seconds) == (0, 0.0)


def test_an_uninstalled_watch_counts_nothing_more(watch: GcWatch) -> None:
    gc.collect()
    watch.uninstall()
    gc.collect()
    assert watch.collections == 1
    assert gc.callbacks.count(watch._on_collect) == 0


def test_installing_twice_counts_each_collection_once(watch: GcWatch) -> None:
    watch.install()
    gc.collect()
    assert watch.collections == 1


def test_freeze_startup_keeps_what_is_alive_out_of_full_collections() -> None:
    assert gcpause.WATCH is None
    alive = [[] for _ in range(1000)]  # containers the collector tracks
    try:
        frozen = gcpause.freeze_startup()
        assert frozen == gc.get_freeze_count() > len(alive)
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in alive), "frozen objects are not walked"
        watch = gcpause.WATCH
        assert watch is not None
        assert watch.collections == 1, "the collection before the freeze is timed"
        assert watch.gauges()["jobcontrol_gc_frozen_objects"][1] == frozen
        assert gcpause.freeze_startup() >= frozen
        assert gcpause.WATCH is watch, "one watch per process"
    finally:
        gc.unfreeze()
        if gcpause.WATCH is not None:
            gcpause.WATCH.uninstall()
            gcpause.WATCH = None
