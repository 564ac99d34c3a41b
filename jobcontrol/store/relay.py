"""The run-queue wake-ups between processes, over PostgreSQL's LISTEN/NOTIFY.

Within one process the run-queue signals of ``events`` (``runs_queued``,
``kill_requested``, ``task_finished``, ``lanes_changed``, sent with the ``Store``
as sender) reach the dispatcher and the embedded worker directly. A remote worker
is another process, usually on another host: the ``Relay`` of each process sends
every such signal of its own (and ``timers_due``: the daemon's timers are about to
queue runs) to the database's ``jobcontrol`` channel, and sends
every one it hears from another process to its own receivers, as if it had been
sent locally (with ``relayed=True``).

The database sends one kind itself: every write to the lane table, whoever made
it, is announced by a trigger (``lane_rows``, delivered as ``lane_rows_written``),
so a worker whose relay listens follows the table without polling it.

They stay hints. A notification is sent after the change committed (so whoever
hears it finds the change), but one can be lost: a listener's connection that
breaks misses what was sent meanwhile. Both sides keep their back-up polls, the
relay reports a broken connection in its ``outage`` until it is back, and when it
listens again it wakes every receiver once (``listening`` says whether it does).

Who needs them: the dispatcher runs in the daemon, so what a worker process does is
always sent (``role="worker"``). What the daemon does (its embedded worker's task ends,
the runs it queues, kills, timers due) matters only to worker processes, so the
daemon's relay (``role="daemon"``) sends it only while one is known: a worker's relay
says ``hello`` once it listens, again when a daemon's relay asks (it asks when it
starts listening, so that workers running before it are known), and ``bye`` when it
stops. Any other notification from another process makes it known too. On a daemon
with no worker process, a task's end so costs no NOTIFY, no wake-up of the relay's
two threads and of its own listener, no work for the server: about a tenth of a
sequence's time per task on PostgreSQL (bench/README.md, nineteenth round). A worker
that dies without ``bye`` stays known until the daemon restarts: the daemon sends to
nobody, as it did before, rather than risk a live worker not hearing of its work.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import select
import threading
import time
from typing import TYPE_CHECKING, Any

from jobcontrol import events
from jobcontrol.outage import Backoff, Outage

if TYPE_CHECKING:
    import psycopg

    from jobcontrol.store import Store

log = logging.getLogger(__name__)

CHANNEL = "jobcontrol"
# NOTIFY's payload must stay under 8000 bytes: run ids past this many are left out
# (the receiver claims by priority instead; the ids are only a fast path).
MAX_IDS = 200
# Capped as the dispatcher's and the workers' own retries (``outage.Backoff``): a
# listener that waited 5 s between tries after an outage left a remote worker deaf to
# runs queued for up to 5 s after the database came back (the back-off poll found them,
# seconds later still). It starts a little later: each try is a new connection, a new
# server process.
RETRY_FIRST = 0.1

_SIGNALS = {
    "runs_queued": events.runs_queued,
    "kill_requested": events.kill_requested,
    "task_finished": events.task_finished,
    "lanes_changed": events.lanes_changed,
    "timers_due": events.timers_due,
}
# Sent by the database itself, never by a relay: the lane table's trigger (migration
# 0009) announces every write to it, whoever made it.
_FROM_DATABASE = {"lane_rows": events.lane_rows_written}
# Between relays, never delivered to receivers: a worker process's relay makes itself
# known to the daemon's (``hello``; ``ask``: a daemon's relay asking who is there) and
# takes its leave (``bye``).
_HELLO, _BYE = "hello", "bye"
ROLES = ("worker", "daemon")


class Relay:
    """Sends this process's run-queue signals to the database; delivers the others'."""

    def __init__(self, store: Store, *, name: str = "relay", role: str = "worker") -> None:
        if store.dialect != "postgresql":
            raise ValueError("the relay needs PostgreSQL (LISTEN/NOTIFY)")
        if role not in ROLES:
            raise ValueError(f"relay role {role!r}: must be one of {', '.join(ROLES)}")
        self.store = store
        self.name = name
        self.role = role
        self.origin = secrets.token_hex(8)  # this process: its own notifications are skipped
        self.outage = Outage(f"notifications ({name})")
        self.sent = self.heard = self.dropped = 0
        self.skipped = 0  # a daemon's signals not sent: no worker process to hear them
        # A daemon's: the worker processes' relays known (origin -> their name).
        self._peers: dict[str, str] = {}
        self._hello_sent = threading.Event()
        # (payload, whether it is a signal: counted in ``sent``), or None: stop sending.
        self._outbox: queue.SimpleQueue[tuple[str, bool] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sender: threading.Thread | None = None  # of ``_threads``: the one sending
        self._receivers: list[tuple[Any, Any]] = []
        self._listening = threading.Event()
        self._wakeup: tuple[int, int] | None = None  # a pipe that ends the listener's wait

    # ------------------------------------------------------------------ control

    def start(self, *, wait: float = 10.0) -> None:
        """Listen and send from two threads; returns once listening (or after ``wait``:
        the listener keeps trying, and the back-up polls cover the gap) and, a worker's,
        once its ``hello`` is sent: the daemon hears of it before the worker claims."""
        for key, signal in _SIGNALS.items():
            receiver = self._forwarder(key)
            signal.connect(receiver, sender=self.store, weak=False)
            self._receivers.append((signal, receiver))
        self._wakeup = os.pipe2(os.O_CLOEXEC)
        for target, name in ((self._listen_loop, "listen"), (self._send_loop, "notify")):
            thread = threading.Thread(target=target, name=f"jc-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
            if target == self._send_loop:
                self._sender = thread
        deadline = time.monotonic() + wait
        self._listening.wait(wait)
        if self.role == "worker":
            self._hello_sent.wait(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver, sender=self.store)
        self._receivers.clear()
        if self.role == "worker" and self._sender is not None and not self.outage.down:
            self._say(_BYE)  # sent before the sender stops (not tried in an outage)
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout)  # its last hints and the bye
        self._stop.set()
        if self._wakeup is not None:
            os.write(self._wakeup[1], b"x")
        for thread in self._threads:
            thread.join(timeout)
        if self._wakeup is not None and not any(t.is_alive() for t in self._threads):
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def health(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "listening": self.listening,
            "sent": self.sent,
            "heard": self.heard,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "peers": self.peers,
            "down": self.outage.down,
        }

    @property
    def peers(self) -> list[str]:
        """A daemon's: the names of the worker processes' relays it knows."""
        return sorted(dict(self._peers).values())  # a copy: the listener adds to it

    # ------------------------------------------------------------------ sending

    def _forwarder(self, key: str) -> Any:
        def forward(_sender: object, *, relayed: bool = False, **kwargs: Any) -> None:
            if relayed:
                return  # heard from another process: not ours to send again
            if self.role == "daemon" and not self._peers:
                self.skipped += 1  # no worker process: nobody else needs it
                return
            if "run_ids" in kwargs:
                kwargs["run_ids"] = list(kwargs["run_ids"])[:MAX_IDS]
            self._outbox.put((json.dumps({"o": self.origin, "s": key, "k": kwargs}), True))

        return forward

    def _say(self, kind: str, **kwargs: Any) -> None:
        """A word to the other relays (``_HELLO``, ``_BYE``), not a signal."""
        kwargs.update(role=self.role, name=self.name)
        self._outbox.put((json.dumps({"o": self.origin, "s": kind, "k": kwargs}), False))

    def _send_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        backoff = Backoff(RETRY_FIRST)
        while True:
            item = self._outbox.get()
            if item is None:
                break
            payload, signal = item
            while not self._stop.is_set():
                fresh = conn is None or conn.closed
                try:
                    if conn is None or fresh:
                        conn = self._connect()
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                    if signal:
                        self.sent += 1
                    else:
                        self._hello_sent.set()
                    backoff.reset()
                    if self._listening.is_set():
                        # Both ways work again (the listener may have come back first
                        # and found this side still failing).
                        self.outage.recovered()
                    break
                except Exception as exc:  # psycopg.Error, OSError: the database is away
                    _close(conn)
                    conn = None
                    if not fresh:
                        # A connection opened before a server restart: the server ended
                        # it. Whether the database is away, a new one says, at once.
                        log.info("the notification connection was closed (%s); reopening", exc)
                        continue
                    self.outage.failed(exc)
                    # A hint that cannot be sent now is stale by the time it could be:
                    # drop it (counted, in health) and let the back-up polls find the work.
                    self.dropped += 1
                    self._stop.wait(backoff.next())
                    break
        _close(conn)

    # ------------------------------------------------------------------ listening

    def _listen_loop(self) -> None:
        assert self._wakeup is not None
        wakeup = self._wakeup[0]
        backoff = Backoff(RETRY_FIRST)
        missed = False  # whether notifications may have been sent while not listening
        while not self._stop.is_set():
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {CHANNEL}")
                self._listening.set()
                # Known to the daemon (a worker), or knowing who is there (the daemon),
                # again after each gap: a relay may have come or gone meanwhile.
                self._say(_HELLO, ask=self.role == "daemon")
                if missed:
                    # Whatever was sent while it was away is lost: wake every receiver once.
                    self._deliver_all_wake()
                    missed = False
                self.outage.recovered()
                backoff.reset()
                # Asleep until the server sends something or ``stop``: psycopg's own
                # ``notifies(timeout=)`` wakes every 0.1 s to look for a Ctrl-C, ten
                # wake-ups a second of an otherwise idle daemon. ``poll``, not ``select``:
                # a daemon holding over a thousand connections has descriptors past
                # select's limit.
                waiting = select.poll()
                waiting.register(conn.fileno(), select.POLLIN)
                waiting.register(wakeup, select.POLLIN)
                while not self._stop.is_set():
                    # First what the connection already read (a notification that came
                    # in with the LISTEN's answer waits in psycopg, not on the socket).
                    for note in conn.notifies(timeout=0):
                        self._deliver(note.payload)
                    if wakeup in {fd for fd, _ in waiting.poll()}:
                        break
            except Exception as exc:  # psycopg.Error, OSError: the database is away
                self._listening.clear()
                missed = True
                if self._stop.is_set():
                    break
                # Said once, by the outage (and once more when it is over); each retry
                # only at DEBUG: an outage of an hour is not seven hundred warnings.
                self.outage.failed(exc)
                log.debug("listening for run-queue notifications failed: %s; retrying", exc)
                self._stop.wait(backoff.next())
            finally:
                _close(conn)
        self._listening.clear()

    def _deliver(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            kind = note["s"]
            kwargs = dict(note["k"])
            between = kind in (_HELLO, _BYE)  # a word between relays, not a signal
            signal = None if between else _SIGNALS.get(kind) or _FROM_DATABASE[kind]
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed run-queue notification: %.200r", payload)
            return
        if note.get("o") == self.origin:
            return  # our own: its receivers here heard it when it was sent
        if self._heard_of(note):
            return
        self.heard += 1
        assert signal is not None
        try:
            signal.send(self.store, relayed=True, **kwargs)
        except Exception:
            log.exception("a receiver of a relayed %s failed", note["s"])

    def _heard_of(self, note: dict[str, Any]) -> bool:
        """What another process's notification says of it; True for a word between
        relays (not a signal: nothing to deliver)."""
        kind, origin, said = note["s"], note.get("o"), note["k"]
        if kind not in (_HELLO, _BYE):
            if self.role == "daemon" and origin is not None and origin not in self._peers:
                self._peers[origin] = "a worker process"  # one that never said hello
                log.info("notifications: a worker process is heard of; sending to it")
            return False
        if said.get("role") == "daemon":
            if self.role == "worker" and said.get("ask"):
                self._say(_HELLO)
                # A daemon (re)started: what it queued before it heard of us was not sent.
                self._deliver_all_wake()
            return True
        if self.role != "daemon" or not isinstance(origin, str):
            return True
        name = str(said.get("name", "a worker process"))
        if kind == _HELLO and origin not in self._peers:
            self._peers[origin] = name
            log.info("notifications: %s listens; the daemon's are sent to it", name)
        elif kind == _BYE and self._peers.pop(origin, None) is not None:
            if not self._peers:
                log.info("notifications: %s left; no worker process listens now", name)
        return True

    def _deliver_all_wake(self) -> None:
        """After a gap in listening: work may have been announced meanwhile."""
        events.runs_queued.send(self.store, run_ids=[], relayed=True)
        events.lanes_changed.send(self.store, names=[], relayed=True)
        events.lane_rows_written.send(self.store, relayed=True)

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(self.store.libpq_url(), autocommit=True)


def _close(conn: psycopg.Connection[Any] | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception as exc:  # closing a broken connection: nothing left to do
            log.debug("closing a notification connection: %s", exc)
