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


def test_a_hold_keeps_full_collections_out_and_the_collector_runs_after(
    watch: GcWatch,
) -> None:
    assert gc.isenabled()
    with gcpause.held():
        assert not gc.isenabled()
        assert watch.gauges()["jobcontrol_gc_collector_running"][1] == 0
        garbage = [[] for _ in range(100_000)]  # enough young objects for a full collection
        del garbage
        assert watch.collections == 0
    assert gc.isenabled()
    assert watch.gauges()["jobcontrol_gc_collector_running"][1] == 1


def test_nested_holds_let_the_collector_run_only_after_the_last() -> None:
    with gcpause.held():
        with gcpause.held():
            pass
        assert not gc.isenabled(), "the outer hold still holds"
    assert gc.isenabled()


def test_a_hold_that_raises_lets_the_collector_run_again() -> None:
    with pytest.raises(RuntimeError, match="build failed"):
        with gcpause.held():
            raise RuntimeError("build failed")
    assert gc.isenabled()


def test_a_hold_leaves_a_collector_someone_else_stopped_stopped() -> None:
    gc.disable()
    try:
        with gcpause.held():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


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
