"""Run metrics for ``/metrics``: counters fed by the dispatcher's signals, Prometheus text.

``RunMetrics`` listens to ``run_started`` / ``run_finished`` of one dispatcher
and keeps counts and a duration histogram under a lock (receivers run on the
dispatcher thread; readers are web handlers). ``render`` writes the text
exposition format 0.0.4 by hand: no client library needed for a few series.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jobcontrol import events
from jobcontrol.dispatch.dispatcher import Dispatcher

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip


class RunMetrics:
    """Counts of runs started and finished (by final state) and a duration histogram."""

    def __init__(self, dispatcher: Dispatcher, buckets: Iterable[float] = DURATION_BUCKETS) -> None:
        self.dispatcher = dispatcher
        self.buckets = tuple(sorted(buckets))
        self._lock = threading.Lock()
        self._started = 0
        self._finished: dict[str, int] = {}
        self._bucket_counts = [0] * len(self.buckets)
        self._duration_sum = 0.0
        self._duration_count = 0
        self._receivers: list[tuple[Any, Callable[..., None]]] = []

    def start(self) -> None:
        if self._receivers:
            return
        for signal, receiver in (
            (events.run_started, self._on_started),
            (events.run_finished, self._on_finished),
        ):
            signal.connect(receiver, sender=self.dispatcher, weak=False)
            self._receivers.append((signal, receiver))

    def stop(self) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()

    def _on_started(self, sender: object, **_: Any) -> None:
        with self._lock:
            self._started += 1

    def _on_finished(self, sender: object, run: Mapping[str, Any], **_: Any) -> None:
        seconds = (run.get("duration_ms") or 0) / 1000.0
        with self._lock:
            state = str(run.get("state"))
            self._finished[state] = self._finished.get(state, 0) + 1
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    self._bucket_counts[i] += 1
            self._duration_sum += seconds
            self._duration_count += 1

    @property
    def started(self) -> int:
        with self._lock:
            return self._started

    def finished(self) -> dict[str, int]:
        with self._lock:
            return dict(self._finished)

    def render(self, gauges: Mapping[str, tuple[str, float]]) -> str:
        """The exposition text: these counters, then ``gauges`` (name -> (help, value))."""
        with self._lock:
            started, finished = self._started, dict(self._finished)
            counts, total, n = list(self._bucket_counts), self._duration_sum, self._duration_count
        lines = _header(
            "jobcontrol_runs_started_total", "counter", "Runs started (boxes and tasks)."
        )
        lines.append(f"jobcontrol_runs_started_total {started}")
        lines += _header(
            "jobcontrol_runs_finished_total", "counter", "Runs finished, by final state."
        )
        lines += [
            f'jobcontrol_runs_finished_total{{state="{_label(state)}"}} {count}'
            for state, count in sorted(finished.items())
        ]
        name = "jobcontrol_run_duration_seconds"
        lines += _header(name, "histogram", "Duration of finished runs, queueing included.")
        lines += [
            f'{name}_bucket{{le="{_number(bound)}"}} {count}'
            for bound, count in zip(self.buckets, counts, strict=True)
        ]
        lines += [f'{name}_bucket{{le="+Inf"}} {n}', f"{name}_sum {_number(total)}"]
        lines.append(f"{name}_count {n}")
        for gauge, (help_, value) in gauges.items():
            kind = "counter" if gauge.endswith("_total") else "gauge"
            lines += _header(gauge, kind, help_)
            lines.append(f"{gauge} {_number(value)}")
        return "\n".join(lines) + "\n"


def _header(name: str, kind: str, help_: str) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))
