"""The daemon's log says when the database hangs, and when it answers again.

A database that fails a statement is an outage, and the part that meets it logs it
(``outage.Outage``). A database that hangs fails nothing: a PostgreSQL server stopped
by a signal, a host swapping to death, a storage that no longer answers. Every
statement then waits for as long as the server does, and the part that waits logs
nothing. ``/healthz`` and ``/status`` say so after a couple of seconds (their reads are
bounded: ``api.bounded``), but an operator reading the log saw the daemon go quiet.

``HangWatch`` looks every ``CHECK_S`` seconds, without touching the database, at how
long the process's oldest write under way has waited and how long the dispatcher has
been on one event. Once either reaches ``HANG_S`` it logs one warning that names who
waits and since when; once they are back under it, one line that says how long it
lasted. A failure already said as an outage is not said twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

HANG_S = 10.0  # a write or a dispatcher event that waits this long is said in the log
CHECK_S = 5.0  # how often it looks: no database call, a few reads of the process's memory


class HangWatch:
    """``oldest_write()``: (the thread's name, seconds) of the write under way the longest,
    or None; ``handler_s()``: how long the dispatcher has been on one event (0 between
    events); ``outage_down()``: whether an outage is already said."""

    def __init__(
        self,
        oldest_write: Callable[[], tuple[str, float] | None],
        handler_s: Callable[[], float],
        outage_down: Callable[[], bool],
        *,
        hang_s: float = HANG_S,
        check_s: float = CHECK_S,
    ) -> None:
        self._oldest_write = oldest_write
        self._handler_s = handler_s
        self._outage_down = outage_down
        self.hang_s = hang_s
        self.check_s = check_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since: float | None = None  # time.monotonic() the hang said began
        self._ended_at: float | None = None  # when a look first found it over

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="jc-hang-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.look()
            except Exception:  # a fault of the watch itself: said, and it looks again
                log.exception("the database hang watch failed; it looks again in %gs", self.check_s)

    def look(self) -> None:
        """One look: a hang that began is said once, one that ended once."""
        now = time.monotonic()
        waiting = self._waiting()
        if waiting is not None and self._since is None:
            what, seconds = waiting
            if self._outage_down():
                return  # a database that fails is said by the outage's own line
            self._since = now - seconds
            log.warning(
                "the database has not answered for %.0fs (%s): it hangs (a stopped or "
                "overloaded server, a storage that does not answer, a lock another process "
                "holds); nothing is scheduled or recorded until it answers, and this "
                "process waits for it",
                seconds,
                what,
            )
        elif waiting is not None:
            self._ended_at = None
        elif self._since is not None:
            if self._ended_at is None:
                # Judged at the next look: a write that failed is said as an outage by its
                # part just after it stops waiting.
                self._ended_at = now
                return
            lasted, self._since, self._ended_at = self._ended_at - self._since, None, None
            if self._outage_down():
                # It ended in a failure (a busy timeout, a connection given up): the
                # outage's own line says when it answers again.
                log.warning(
                    "the database hang ended after %.0fs in a failure: it does not answer",
                    lasted,
                )
            else:
                log.warning("the database answers again, after %.0fs", lasted)

    def _waiting(self) -> tuple[str, float] | None:
        """What has waited for the database ``hang_s`` or more, and for how long."""
        found: list[tuple[str, float]] = []
        oldest = self._oldest_write()
        if oldest is not None and oldest[1] >= self.hang_s:
            found.append((f"a write of thread {oldest[0]} waits for it", oldest[1]))
        handler_s = self._handler_s()
        if handler_s >= self.hang_s:
            found.append(("the dispatcher waits on one event", handler_s))
        if not found:
            return None
        return "; ".join(what for what, _ in found), max(seconds for _, seconds in found)
