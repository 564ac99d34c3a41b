"""The session's worker threads hand every outcome to the GUI thread and keep nothing of the GUI's.

Python frees an object on the thread that lets go of it last, and a Qt object
Python owns (a panel made without a parent, say) destroyed on a worker thread
crashes the process. So whatever a callback belongs to must die on the GUI
thread, however the call ends and whenever the GUI lets go of it. The calls
here never ask the daemon: nothing listens at the session's URL.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QObject
from pytestqt.qtbot import QtBot

from jobcontrol.client import Client
from jobcontrol_admin.session import Session
from tests.gui.conftest import WAIT_MS

NOWHERE = "http://127.0.0.1:1"


class Owner(QObject):
    """What callbacks belong to, as a panel: Python owns it (no parent)."""

    def __init__(self, seen: list[object]) -> None:
        super().__init__()
        self.seen = seen

    def done(self, value: Any) -> None:
        self.seen.append(value)

    def failed(self, exc: Exception) -> None:
        self.seen.append(exc)


def death_thread(obj: object) -> list[str]:
    """Filled with the name of the thread ``obj`` is freed on, when it is."""
    died: list[str] = []
    weakref.finalize(obj, lambda: died.append(threading.current_thread().name))
    return died


@pytest.fixture
def session() -> Iterator[Session]:
    s = Session(NOWHERE, None)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counts free objects: one a cycle kept would stay."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def refuse(_client: Client) -> None:
    raise ValueError("refused")


@pytest.mark.usefixtures("no_collector")
def test_a_failed_call_leaves_no_cycle_holding_its_callbacks(
    qtbot: QtBot, session: Session
) -> None:
    seen: list[object] = []
    owner = Owner(seen)
    died = death_thread(owner)
    session.read("Refused", refuse, owner.done, owner.failed)
    del owner  # the GUI is done with it: the session keeps it until the outcome is delivered

    qtbot.waitUntil(lambda: bool(seen), timeout=WAIT_MS)
    assert [str(e) for e in seen] == ["refused"]
    assert died == [threading.main_thread().name]  # freed by the delivery, not by a collector


def test_callbacks_whose_owner_the_gui_dropped_mid_call_die_on_the_gui_thread(
    qtbot: QtBot, session: Session
) -> None:
    gate = threading.Event()
    seen: list[object] = []
    owner = Owner(seen)
    died = death_thread(owner)

    def slow(_client: Client) -> str:
        gate.wait(WAIT_MS / 1000)
        return "answer"

    session.read("Slow", slow, owner.done, owner.failed)
    del owner  # let go while the worker runs the call
    gate.set()

    qtbot.waitUntil(lambda: bool(died), timeout=WAIT_MS)
    assert seen == ["answer"]
    assert died == [threading.main_thread().name]


def test_closing_a_session_whose_daemon_does_not_answer_does_not_wait(qtbot: QtBot) -> None:
    """A daemon that takes connections and never answers (stopped, a hung host) held the
    window for a request's whole timeout at a close, a Cancel, a switch of daemon."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepted by the kernel, never read nor answered
    port = listener.getsockname()[1]
    session = Session(f"http://127.0.0.1:{port}", None)
    seen: list[object] = []
    owner = Owner(seen)
    try:
        session.read("status", lambda c: c.status(), owner.done, owner.failed)
        session.act("pause", lambda c: c.pause(), owner.done, owner.failed)
        listener.settimeout(10)
        held, _ = listener.accept()  # a call is on the wire: it will never be answered
        started = time.monotonic()
        session.close()
        held.close()
        assert time.monotonic() - started < 5.0, "the old close waited for the 15 s timeout"
        qtbot.wait(100)  # events the workers may still post are dropped
        assert seen == []
    finally:
        listener.close()
