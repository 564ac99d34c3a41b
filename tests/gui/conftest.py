"""Fixtures of the GUI tier: a real daemon per test, and a check that nothing is left behind.

``admin_daemon`` starts the real ``jobcontrol daemon`` (a subprocess, its API on
a free port) on a fresh SQLite database and gives its URL and the admin token
it wrote on first start. ``no_leaks`` (autouse) fails a test that leaves a
thread running, a window open or undeleted, or a timer running on the
application after the test's own teardown (a window's timers go with it), or
a Qt object Python owns that only a reference cycle keeps: the cyclic garbage
collector runs on whichever thread happens to allocate, and a Qt object it
destroys on a worker thread (a later test's, say) crashes the process. The
check collects such garbage itself, here on the GUI thread. ``isolated_settings``
(autouse) keeps what the window remembers in the test's own directory.
"""

from __future__ import annotations

import gc
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import QCoreApplication, QEvent, QObject, QSettings, QTimer
from PySide6.QtWidgets import QApplication

from jobcontrol_admin.session import Session
from jobcontrol_admin.window import MainWindow
from tests.acceptance.harness import JobControl, describe

WAIT_MS = 20_000  # the bound on every wait for the daemon to answer or a run to end


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path: Path) -> Path:
    """The window's QSettings (geometry, column widths) live in this test's own directory,
    never in the user's ~/.config."""
    where = tmp_path / "qsettings"
    where.mkdir()
    formats = (QSettings.Format.NativeFormat, QSettings.Format.IniFormat)
    for fmt in formats:
        QSettings.setPath(fmt, QSettings.Scope.UserScope, str(where))
    return where


@dataclass
class AdminDaemon:
    jc: JobControl
    url: str
    token: str

    def load(self, path: Path) -> None:
        self.jc.ok("load", str(path))


@pytest.fixture
def admin_daemon(sqlite_url: str, tmp_path: Path) -> Iterator[AdminDaemon]:
    jc = JobControl(sqlite_url, tmp_path / "user")
    try:
        jc.upgraded()
        jc.ok("daemon", "start")
        status = jc.ok("daemon", "status")
        match = re.search(r"admin API: (\S+)/api/v1", status.stdout)
        assert match, describe(status)
        token = jc.token_file.read_text().strip()
        yield AdminDaemon(jc, match.group(1), token)
    finally:
        problems = jc.cleanup()
    assert not problems, "\n".join(problems)


def open_window(qtbot: Any, url: str, token: str) -> MainWindow:
    """A shown main window, connected and live."""
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    window.connect_to(Session(url, token))
    qtbot.waitUntil(lambda: window.connection_state == "live", timeout=WAIT_MS)
    return window


def _settle(app: QApplication) -> None:
    for _ in range(3):
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        app.processEvents()


def _qt_objects_in_cycles() -> list[str]:
    """Collect cyclic garbage on the GUI thread; name the live Python-owned Qt objects in it."""
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = [
            type(o).__qualname__
            for o in gc.garbage
            if isinstance(o, QObject) and shiboken6.isValid(o) and shiboken6.ownedByPython(o)
        ]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    gc.collect()  # what was saved for the look above is freed now, still on this thread
    return found


@pytest.fixture(autouse=True)
def no_leaks(qapp: QApplication) -> Iterator[None]:
    """Set up before (so torn down after) qtbot: then every window the test made is closed."""
    threads_before = set(threading.enumerate())
    _settle(qapp)
    widgets_before = set(map(id, QApplication.topLevelWidgets()))
    timers_before = {id(t) for t in qapp.findChildren(QTimer) if t.isActive()}
    yield
    _settle(qapp)
    deadline = time.monotonic() + 10
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(max(0.0, deadline - time.monotonic()))
    extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert not extra, f"threads left running: {[t.name for t in extra]}"
    left = [
        w
        for w in QApplication.topLevelWidgets()
        if id(w) not in widgets_before and (w.isVisible() or w.objectName().startswith("jc-"))
    ]
    timers = [t for t in qapp.findChildren(QTimer) if t.isActive() and id(t) not in timers_before]
    assert not timers, f"timers left running: {[t.objectName() for t in timers]}"
    assert not left, f"windows left behind: {[(type(w).__name__, w.objectName()) for w in left]}"
    cycles = _qt_objects_in_cycles()
    assert not cycles, f"Qt objects only reference cycles kept (freed on any thread): {cycles}"
