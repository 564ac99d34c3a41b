"""Database reads the API answers without, when the database hangs.

A PostgreSQL server that is frozen (stopped by a signal, a host swapping to death, a
storage that no longer answers) fails no statement: its kernel keeps the connection
open and every read waits, for as long as the server does. ``/healthz`` and ``/status``
must answer all the same (a monitor that gets no answer cannot tell a hung database
from a dead daemon), and so must the token check in front of ``/status``.

``BoundedReads.call`` runs a read on a thread of its own and waits for it at most
``patience`` seconds; past that it raises ``DatabaseNotAnswering`` (a
``StoreUnavailable``: what an outage raises), and the read goes on alone until the
database answers. Once ``max_waiting`` reads have outlived their patience, no read is
started until one of them ends, so a monitor polling a hung database piles up no
threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from jobcontrol.errors import StoreUnavailable

__all__ = ["BoundedReads", "DatabaseNotAnswering"]

T = TypeVar("T")

PATIENCE_S = 2.0  # a health or status read waits this long for the database
MAX_WAITING = 4


class DatabaseNotAnswering(StoreUnavailable):
    """A read the database has not answered within the API's patience (it hangs)."""


class BoundedReads:
    def __init__(self, patience: float = PATIENCE_S, max_waiting: int = MAX_WAITING) -> None:
        self.patience = patience
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[str, float]] = {}  # reads past their patience
        self._calls = 0

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` (a read of ``what``), or ``DatabaseNotAnswering`` after the patience.

        The read runs on a daemon thread of its own: one the database never answers
        must not hold up the daemon's exit either."""
        with self._lock:
            if len(self._waiting) >= self.max_waiting:
                raise DatabaseNotAnswering(self._stuck_text())
            self._calls += 1
            key = self._calls
        done = threading.Event()
        result: list[T] = []
        error: list[BaseException] = []

        def read() -> None:
            try:
                result.append(fn())
            except BaseException as exc:  # handed to the caller, raised there
                error.append(exc)
            finally:
                with self._lock:  # with the set: a caller's check under the lock is exact
                    self._waiting.pop(key, None)
                    done.set()

        threading.Thread(target=read, name=f"jc-api-read-{key}", daemon=True).start()
        if not done.wait(self.patience):
            with self._lock:
                late = not done.is_set()
                if late:
                    self._waiting[key] = (what, time.monotonic() - self.patience)
            if late:
                raise DatabaseNotAnswering(
                    f"the database has not answered a read ({what}) for {self.patience:g}s: "
                    "it hangs (a stopped or overloaded server, a storage that does not answer)"
                )
        if error:
            raise error[0]
        return result[0]

    def _stuck_text(self) -> str:
        now = time.monotonic()
        what, since = min(self._waiting.values(), key=lambda w: w[1])
        return (
            f"the database has not answered a read ({what}) for {now - since:.0f}s, and "
            f"{len(self._waiting)} reads wait for it: it hangs"
        )
