"""The interpreter's garbage collector in a long-running daemon: start-up kept out of its
full collections, and their pauses counted for ``/metrics``.

A full (generation 2) collection stops every thread of the process while it walks every
container object that has lived long. The daemon runs one about every few seconds when
it is busy: ``bench_many_trees`` logged 11-61 ms per collection, and timers due in
that time were late by as long.

Most of what such a collection walks was made before the daemon did anything: the
modules, classes and functions of the daemon and its libraries (about 78,000 objects).
They live as long as the process. ``freeze_startup`` moves them out of the collector's
reach once, before the daemon starts. A frozen object is still freed when its last
reference goes, and none of these goes before the process ends, so nothing leaks. The
job tree and the runs are made after the freeze. They are collected as before: frozen
nodes that an edit or a rebuild replaced would never be freed if they were in reference
cycles, and nodes are.

Building that tree is the other time the collector costs: loading 100,000 jobs makes
about 300,000 objects that all live on, and each time the young ones outnumber the old
by a quarter the collector walks them all again to find no garbage. ``held`` keeps it
out of such a build (8 full collections, 0.75-0.81 s of a 2.8 s start, bench/README.md,
thirty-seventh round); a build makes no garbage cycles worth collecting early.

``GcWatch`` times each full collection (the collector's own callbacks, two clock reads a
collection) so that ``/metrics`` shows what they cost.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FULL = 2  # the oldest generation: a full collection


class GcWatch:
    """Counts and times the full collections of this process, from ``install`` on."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0  # their pauses, summed
        self.longest = 0.0  # the longest pause
        self._began: float | None = None
        self._lock = threading.Lock()

    def install(self) -> GcWatch:
        if self._on_collect not in gc.callbacks:
            gc.callbacks.append(self._on_collect)
        return self

    def uninstall(self) -> None:
        if self._on_collect in gc.callbacks:
            gc.callbacks.remove(self._on_collect)

    def _on_collect(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the collector on the thread that collects, with the interpreter lock
        # held: no other thread runs Python meanwhile.
        if info["generation"] != FULL:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        began, self._began = self._began, None
        if began is None:  # installed between the two calls
            return
        pause = time.perf_counter() - began
        with self._lock:
            self.collections += 1
            self.seconds += pause
            self.longest = max(self.longest, pause)

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The series for ``/metrics`` (name -> (help, value))."""
        with self._lock:
            collections, seconds, longest = self.collections, self.seconds, self.longest
        return {
            "jobcontrol_gc_full_collections_total": (
                "Full collections of the Python garbage collector (every thread stops).",
                collections,
            ),
            "jobcontrol_gc_full_pause_seconds_total": (
                "Time spent in full garbage collections.",
                seconds,
            ),
            "jobcontrol_gc_full_pause_seconds_max": (
                "The longest full garbage collection since start.",
                longest,
            ),
            "jobcontrol_gc_collector_running": (
                "1 while the garbage collector runs (0 while a build holds it off).",
                1.0 if gc.isenabled() else 0.0,
            ),
            "jobcontrol_gc_frozen_objects": (
                "Start-up objects kept out of full garbage collections.",
                gc.get_freeze_count(),
            ),
        }


class _Hold:
    """Who holds the collector off now: it runs again when the last of them is done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_enabled = False


_HOLD = _Hold()


@contextmanager
def held() -> Iterator[None]:
    """No automatic collection while the block builds what lives on (the job tree at a
    start or a rebuild). Nested and concurrent holds are counted; the collector runs
    again, if it ran before the first, when the last ends, raised or not."""
    with _HOLD.lock:
        if _HOLD.holders == 0:
            _HOLD.was_enabled = gc.isenabled()
            gc.disable()
        _HOLD.holders += 1
    try:
        yield
    finally:
        with _HOLD.lock:
            _HOLD.holders -= 1
            if _HOLD.holders == 0 and _HOLD.was_enabled:
                gc.enable()


# The process's watch, once ``freeze_startup`` installed it (the daemon, a worker process).
WATCH: GcWatch | None = None


def freeze_startup() -> int:
    """Collect what start-up left as garbage, then keep everything alive now out of full
    collections. Called once a process has imported what it runs and made only what it
    keeps to its end. Returns how many objects were frozen."""
    global WATCH
    if WATCH is None:
        WATCH = GcWatch().install()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
