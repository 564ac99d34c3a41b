"""The tree snapshot and the live event stream, on a thread of its own, reconnecting by itself.

The feed takes ``GET /tree`` (the jobs and the event number they are consistent
with), then reads ``GET /events`` after that number. When the connection drops
it waits a little and reconnects with the last number it saw, so it gets what
it missed; when the daemon no longer keeps those events (``resync``) or is a
new daemon (its start time changed), it takes a fresh snapshot instead. What
it reads is queued and handed to the GUI thread in batches: one queued call
drains everything that arrived meanwhile, so a burst of events costs the GUI
one wake-up, not one each.

Signals (all delivered on the GUI thread):

* ``snapshot(seq, jobs)``: a whole tree; replace the model with it;
* ``events(list)``: ``jobcontrol.client.api.Event`` objects, in order;
* ``connection(state, message)``: ``"connecting"``, ``"live"``, ``"lost"`` (it retries), or
  ``"refused"`` (the token is not accepted: it stops, as retrying cannot help).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from jobcontrol.client import ApiError, Client, Event, StreamHandle

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


class EventFeed(QObject):
    snapshot = Signal(int, list)
    events = Signal(list)
    connection = Signal(str, str)
    _wake = Signal()

    def __init__(
        self,
        make_client: Callable[[], Client],
        parent: QObject | None = None,
        *,
        retry_delays: Sequence[float] = RETRY_DELAYS,
    ) -> None:
        super().__init__(parent)
        self._make_client = make_client
        self._retry = tuple(retry_delays)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, Any]] = deque()
        self._handle: StreamHandle | None = None
        self._thread: threading.Thread | None = None
        self._wake.connect(self._drain)
        self.seq: int | None = None  # the last event read (thread side)
        self.daemon_started: str | None = None

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="jc-admin-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the stream at once (its socket is shut down) and wait for the thread."""
        self._stop.set()
        with self._lock:
            handle = self._handle
        if handle is not None:
            handle.abort()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the event feed did not stop within %.0f s", timeout)
            self._thread = None

    def drop_connection(self) -> None:
        """Cut the current connection as a network failure would (the feed reconnects)."""
        with self._lock:
            handle = self._handle
        if handle is not None:
            handle.abort()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ the thread

    def _post(self, kind: str, payload: Any) -> None:
        with self._lock:
            empty = not self._queue
            self._queue.append((kind, payload))
        if empty:
            self._wake.emit()

    def _run(self) -> None:
        client = self._make_client()
        failures = 0
        try:
            while not self._stop.is_set():
                self._post("connection", ("connecting" if failures == 0 else "lost", ""))
                try:
                    live = self._follow(client)
                    failures = 0 if live else failures + 1
                except ApiError as exc:
                    if exc.status in (401, 403):
                        self._post("connection", ("refused", str(exc)))
                        break
                    failures += 1
                    self._post("connection", ("lost", str(exc)))
                except Exception as exc:  # the daemon went away, or refused us
                    if self._stop.is_set():
                        break
                    failures += 1
                    self._post("connection", ("lost", str(exc)))
                if self._stop.is_set():
                    break
                if failures:
                    delay = self._retry[min(failures, len(self._retry)) - 1]
                    if self._stop.wait(delay):
                        break
        finally:
            client.close()

    def _follow(self, client: Client) -> bool:
        """One connection: catch up (or re-snapshot), then read until it ends."""
        started = client.status()["started"]
        if self.seq is None or started != self.daemon_started:
            self._take_snapshot(client)
            self.daemon_started = started
        opened = False

        def on_open() -> None:
            nonlocal opened
            opened = True
            self._post("connection", ("live", ""))

        handle = StreamHandle(on_open=on_open)
        with self._lock:
            self._handle = handle
        if self._stop.is_set():
            return False
        for event in client.events(after=self.seq, handle=handle):
            if event.type == "resync":
                self._take_snapshot(client)
                return True  # reconnect after the fresh snapshot
            if event.seq is not None:
                self.seq = event.seq
            # Handed over at once; _post coalesces the wake-ups while the GUI is busy.
            self._post("events", [event])
        # The stream ended: the daemon stopped it, or the connection dropped.
        return opened

    def _take_snapshot(self, client: Client) -> None:
        tree = client.tree()
        self.seq = int(tree["seq"])
        self._post("snapshot", (self.seq, tree["jobs"]))

    # ------------------------------------------------------------ the GUI side

    @Slot()
    def _drain(self) -> None:
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
        pending: list[Event] = []
        for kind, payload in items:
            if kind == "events":
                pending.extend(payload)
                continue
            if pending:
                self.events.emit(pending)
                pending = []
            if kind == "snapshot":
                self.snapshot.emit(*payload)
            elif kind == "connection":
                self.connection.emit(*payload)
        if pending:
            self.events.emit(pending)
