"""Whether the database answers, as one part of the process sees it.

A part that meets a transient database error calls ``failed``; the first one
is logged (once, not once per retry), and ``recovered`` logs the way back with
how long it lasted. ``/healthz``, ``/status`` and ``/metrics`` read the state;
``watch`` adds a callable called (on the failing or recovering thread, with no
lock held) each time an outage begins or ends: the daemon's event stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobcontrol.errors import one_line

log = logging.getLogger(__name__)

# The waits between tries at a database that does not answer: from RETRY_FIRST,
# doubling up to RETRY_MAX. Short at first (a lock held a moment, a server
# restarting), never long enough to leave a database that is back unused for long.
RETRY_FIRST, RETRY_MAX = 0.05, 2.0


class Backoff:
    """How long to wait before the next try: ``first``, doubling up to ``cap`` with
    each failed try, and ``first`` again once a try went through (``reset``)."""

    def __init__(self, first: float = RETRY_FIRST, cap: float = RETRY_MAX) -> None:
        self.first = first
        self.cap = cap
        self._delay = first

    def next(self) -> float:
        """The wait before the next try; the one after it is twice as long, up to the cap."""
        delay = self._delay
        self._delay = min(delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._delay = self.first


@dataclass(frozen=True)
class OutageState:
    down: bool
    since: float | None  # time.time() of the first failure of the current outage
    error: str | None
    outages: int  # how many outages began (a counter)
    failures: int  # how many operations failed on a transient error (a counter)


class Outage:
    def __init__(self, who: str) -> None:
        self.who = who
        self._lock = threading.Lock()
        self._since: float | None = None
        self._error: str | None = None
        self._outages = 0
        self._failures = 0
        self._watchers: list[Callable[[], None]] = []

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` each time an outage begins or ends."""
        self._watchers.append(changed)

    def failed(self, exc: BaseException) -> None:
        # One line, whoever raised it: a driver's own messages have several (a log record
        # each, and the reason health gives, in one form).
        error = one_line(str(exc))
        with self._lock:
            self._failures += 1
            self._error = error
            if self._since is not None:
                return
            self._since = time.time()
            self._outages += 1
        log.warning("%s: the database does not answer; retrying until it does: %s", self.who, error)
        self._changed()

    def recovered(self) -> None:
        with self._lock:
            if self._since is None:
                return
            lasted = time.time() - self._since
            self._since, self._error = None, None
        log.warning("%s: the database answers again after %.1fs", self.who, lasted)
        self._changed()

    def _changed(self) -> None:
        for changed in list(self._watchers):
            try:
                changed()
            except Exception:  # a watcher's fault must not stop the retry it reports
                log.exception("%s: a watcher of the database's state failed", self.who)

    @property
    def down(self) -> bool:
        with self._lock:
            return self._since is not None

    def state(self) -> OutageState:
        with self._lock:
            return OutageState(
                self._since is not None, self._since, self._error, self._outages, self._failures
            )
