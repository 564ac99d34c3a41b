"""One daemon connection: API calls on worker threads, their results on the GUI thread.

Changes (``act``) go through one worker thread, so they reach the daemon in
the order the operator made them; reads (``read``) use two more, so a slow
history page never holds up a kill. Each call's result or error comes back
to the GUI thread (a queued signal says it is there) and is handed to its
callbacks there. An error nobody handles is emitted as ``error(title,
message)``; the window shows it.

A worker never holds the last reference to anything of the GUI's. Python
frees an object on whichever thread lets go of it last (or runs the garbage
collector), and a Qt object Python owns (a panel a callback belongs to, say)
destroyed on a worker thread crashes the application. So the call and its
callbacks stay in the session's table, on the GUI thread, until the outcome
is delivered; a worker lets go of the call before it hands the outcome over,
and hands that over under a lock the GUI thread takes too, so the GUI thread
is the last to hold it; no reference cycle is left for the collector. The
relay a worker emits on is the session's Qt child: its parent keeps it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
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
class _Pending:
    """A call on its way, as the GUI thread keeps it until its outcome is delivered."""

    title: str
    call: Call
    done: Done | None
    failed: Failed | None


class _Outcomes:
    """Finished calls, from the workers to the GUI thread: (key, ok, value or error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[tuple[int, bool, Any]] = deque()

    def put(self, key: int, ok: bool, value: list[Any]) -> None:
        """Take the value out of the worker's hands (``value`` is left empty)."""
        with self._lock:
            self._items.append((key, ok, value.pop()))

    def take(self) -> tuple[int, bool, Any] | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class _Relay(QObject):
    """The session's child on the GUI thread; workers emit on it, so delivery is queued there."""

    ready = Signal()  # one outcome more is waiting


def _work(relay: _Relay, outcomes: _Outcomes, client: Client, key: int, box: list[Call]) -> None:
    """On a worker: run the call, hand its outcome over, keep nothing of the GUI's."""
    call = box.pop()
    value: list[Any] = []
    try:
        value.append(call(client))
        ok = True
    except Exception as exc:  # every failure goes back to the GUI thread
        value.append(exc)
        ok = False
    del call  # the GUI thread still has it, until the outcome is delivered
    outcomes.put(key, ok, value)
    try:
        relay.ready.emit()
    except RuntimeError:  # the session closed and its relay is gone: nobody waits for it
        outcomes.clear()


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
        self._pending: dict[int, _Pending] = {}
        self._next_key = 0
        self._outcomes = _Outcomes()
        self._relay = _Relay(self)
        self._relay.ready.connect(self._deliver)
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
        self._next_key += 1
        key = self._next_key
        self._pending[key] = _Pending(title, call, done, failed)
        pool.submit(_work, self._relay, self._outcomes, self.client, key, [call])

    @Slot()
    def _deliver(self) -> None:
        item = self._outcomes.take()
        if item is None or self.closed:
            return
        key, ok, value = item
        pending = self._pending.pop(key)
        if ok:
            if pending.done is not None:
                pending.done(value)
        elif pending.failed is not None:
            pending.failed(value)
        else:
            self.error.emit(pending.title, str(value))

    # ------------------------------------------------------------ life cycle

    def close(self) -> None:
        """Drop queued calls and forget those running: the window never waits on the
        network (a daemon that does not answer held a close, a Cancel or a switch to
        another daemon for a request's whole timeout). The calls still running end on
        their own thread, which then closes the client; their outcomes are dropped."""
        if self.closed:
            return
        self.closed = True
        pools = (self._actions, self._reads)
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        client = self.client

        def finish() -> None:
            for pool in pools:
                pool.shutdown(wait=True)
            client.close()

        threading.Thread(target=finish, name="jc-admin-close", daemon=True).start()
        self._outcomes.clear()
        self._pending.clear()
