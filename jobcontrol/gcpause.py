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

``GcWatch`` times each full collection (the collector's own callbacks, two clock reads a
collection) so that ``/metrics`` shows what they cost.
"""

from __future__ import annotations

import gc
import threading
import time
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
            "jobcontrol_gc_frozen_objects": (
                "Start-up objects kept out of full garbage collections.",
                gc.get_freeze_count(),
            ),
        }


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
