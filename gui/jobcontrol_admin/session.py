"""One daemon connection: API calls on worker threads, their results on the GUI thread.

Changes (``act``) go through one worker thread, so they reach the daemon in
the order the operator made them; reads (``read``) use two more, so a slow
history page never holds up a kill. Each call's result or error comes back
as a queued signal and is handed to its callbacks on the GUI thread. An error
nobody handles is emitted as ``error(title, message)``; the window shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from jobcontrol.client import Client

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 15.0

Call = Callable[[Client], Any]
Done = Callable[[Any], None]
Failed = Callable[[Exception], None]


@dataclass
class _Outcome:
    title: str
    ok: bool
    value: Any
    done: Done | None
    failed: Failed | None


class _Relay(QObject):
    """Lives on the GUI thread; workers emit on it, so delivery is queued to that thread."""

    outcome = Signal(object)


class Session(QObject):
    """The admin API of one daemon, for the GUI."""

    error = Signal(str, str)  # title, message: a failure no callback took

    def __init__(
        self,
        url: str,
        token: str | None,
        parent: QObject | None = None,
        *,
        client: Client | None = None,
    ) -> None:
        super().__init__(parent)
        self.url = url
        self.token = token
        self.client = client or Client(url, token, timeout=REQUEST_TIMEOUT)
        self._actions = ThreadPoolExecutor(1, thread_name_prefix="jc-admin-act")
        self._reads = ThreadPoolExecutor(2, thread_name_prefix="jc-admin-read")
        self._relay = _Relay()
        self._relay.outcome.connect(self._deliver)
        self.closed = False

    def new_client(self) -> Client:
        """Another client of the same daemon (for a stream that holds its connection)."""
        return Client(self.url, self.token, timeout=REQUEST_TIMEOUT)

    # ------------------------------------------------------------ calls

    def act(
        self, title: str, call: Call, done: Done | None = None, failed: Failed | None = None
    ) -> None:
        """A change: run in order with the other changes."""
        self._submit(self._actions, title, call, done, failed)

    def read(
        self, title: str, call: Call, done: Done | None = None, failed: Failed | None = None
    ) -> None:
        """A read: run beside the changes."""
        self._submit(self._reads, title, call, done, failed)

    def _submit(
        self,
        pool: ThreadPoolExecutor,
        title: str,
        call: Call,
        done: Done | None,
        failed: Failed | None,
    ) -> None:
        if self.closed:
            return
        relay, client = self._relay, self.client

        def work() -> None:
            try:
                outcome = _Outcome(title, True, call(client), done, failed)
            except Exception as exc:  # every failure goes back to the GUI thread
                outcome = _Outcome(title, False, exc, done, failed)
            relay.outcome.emit(outcome)

        pool.submit(work)

    @Slot(object)
    def _deliver(self, outcome: _Outcome) -> None:
        if self.closed:
            return
        if outcome.ok:
            if outcome.done is not None:
                outcome.done(outcome.value)
        elif outcome.failed is not None:
            outcome.failed(outcome.value)
        else:
            self.error.emit(outcome.title, str(outcome.value))

    # ------------------------------------------------------------ life cycle

    def close(self) -> None:
        """Drop queued calls, wait for those running (each bounded by its timeout)."""
        if self.closed:
            return
        self.closed = True
        for pool in (self._actions, self._reads):
            pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
        self._relay.outcome.disconnect(self._deliver)
