"""The tree snapshot and the live event stream, on a thread of its own, reconnecting by itself.

The feed takes ``GET /tree`` (the jobs and the event number they are consistent
with), then reads ``GET /events`` after that number. When the connection drops
it waits a little and reconnects with the last number it saw, so it gets what
it missed; when the daemon no longer keeps those events (``resync``) or is a
new daemon (its start time changed), it takes a fresh snapshot instead. What
it reads is queued and handed to the GUI thread in batches: one queued call
drains everything that arrived meanwhile, so a burst of events costs the GUI
one wake-up, not one each.

The thread works on a plain object of its own (``_Reader``), with a client made
on the GUI thread, and wakes the GUI through the feed's Qt child: it holds no
Qt object it could be the last to let go of (Python frees an object on the
thread that drops it, and a Qt object destroyed off the GUI thread crashes the
application), nor the session the client came from.

Signals (all delivered on the GUI thread):

* ``snapshot(seq, jobs)``: a whole tree; replace the model with it;
* ``events(list)``: ``jobcontrol.client.Event`` objects, in order;
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


class _Relay(QObject):
    """The feed's child on the GUI thread; the reader emits on it, so delivery is queued there."""

    wake = Signal()


class _Reader:
    """The thread's side of a feed: what it reads goes to ``queue``, then a wake-up."""

    def __init__(self, relay: _Relay, retry: tuple[float, ...]) -> None:
        self.relay = relay
        self.retry = retry
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.queue: deque[tuple[str, Any]] = deque()
        self.handle: StreamHandle | None = None
        self.seq: int | None = None  # the last event read
        self.daemon_started: str | None = None

    def post(self, kind: str, payload: Any) -> None:
        with self.lock:
            empty = not self.queue
            self.queue.append((kind, payload))
        if empty:
            self.relay.wake.emit()

    def run(self, client: Client) -> None:
        failures = 0
        try:
            while not self.stop.is_set():
                self.post("connection", ("connecting" if failures == 0 else "lost", ""))
                try:
                    live = self._follow(client)
                    failures = 0 if live else failures + 1
                except ApiError as exc:
                    if exc.status in (401, 403):
                        self.post("connection", ("refused", str(exc)))
                        break
                    failures += 1
                    self.post("connection", ("lost", str(exc)))
                except Exception as exc:  # the daemon went away, or refused us
                    if self.stop.is_set():
                        break
                    failures += 1
                    self.post("connection", ("lost", str(exc)))
                if self.stop.is_set():
                    break
                if failures:
                    delay = self.retry[min(failures, len(self.retry)) - 1]
                    if self.stop.wait(delay):
                        break
        finally:
            with self.lock:
                self.handle = None
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
            self.post("connection", ("live", ""))

        handle = StreamHandle(on_open=on_open)
        with self.lock:
            self.handle = handle
        if self.stop.is_set():
            return False
        for event in client.events(after=self.seq, handle=handle):
            if event.type == "resync":
                self._take_snapshot(client)
                return True  # reconnect after the fresh snapshot
            if event.seq is not None:
                self.seq = event.seq
            # Handed over at once; post coalesces the wake-ups while the GUI is busy.
            self.post("events", [event])
        # The stream ended: the daemon stopped it, or the connection dropped.
        return opened

    def _take_snapshot(self, client: Client) -> None:
        tree = client.tree()
        self.seq = int(tree["seq"])
        self.post("snapshot", (self.seq, tree["jobs"]))

    def abort(self) -> None:
        """Cut the current connection, if there is one."""
        with self.lock:
            handle = self.handle
        if handle is not None:
            handle.abort()


class EventFeed(QObject):
    snapshot = Signal(object, list)  # the number: a daemon numbers from its start's microseconds
    events = Signal(list)
    connection = Signal(str, str)

    def __init__(
        self,
        make_client: Callable[[], Client],
        parent: QObject | None = None,
        *,
        retry_delays: Sequence[float] = RETRY_DELAYS,
    ) -> None:
        super().__init__(parent)
        self._make_client = make_client
        relay = _Relay(self)
        relay.wake.connect(self._drain)
        self._reader = _Reader(relay, tuple(retry_delays))
        self._thread: threading.Thread | None = None

    @property
    def seq(self) -> int | None:
        """The last event read (written by the thread while it runs)."""
        return self._reader.seq

    @seq.setter
    def seq(self, value: int | None) -> None:
        self._reader.seq = value

    @property
    def daemon_started(self) -> str | None:
        return self._reader.daemon_started

    @daemon_started.setter
    def daemon_started(self, value: str | None) -> None:
        self._reader.daemon_started = value

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._reader.run, args=(self._make_client(),), name="jc-admin-feed", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the stream at once (its socket is shut down) and wait for the thread."""
        self._reader.stop.set()
        self._reader.abort()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the event feed did not stop within %.0f s", timeout)
            self._thread = None

    def drop_connection(self) -> None:
        """Cut the current connection as a network failure would (the feed reconnects)."""
        self._reader.abort()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ the GUI side

    @Slot()
    def _drain(self) -> None:
        reader = self._reader
        with reader.lock:
            items = list(reader.queue)
            reader.queue.clear()
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
