"""The main window as it opens, on a real daemon: what fits, what it remembers, what stands out.

At the default size the columns an operator watches (Name, Job State, Next
Runs, Timer Expr, Last Ran, Exit) are in the tree's viewport without scrolling,
and the Runs list shows several rows; a running job stands out in the Name
column; and the window's geometry, its docks and the columns' widths come back
when the window is opened again (from the QSettings the ``isolated_settings``
fixture points at a temporary directory).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import QSettings, QSize, Qt
from PySide6.QtWidgets import QApplication

from jobcontrol.client import Client
from jobcontrol_admin.model import COL
from jobcontrol_admin.window import MainWindow
from tests.gui.conftest import AdminDaemon
from tests.gui.test_window import open_window, wait_shown

pytestmark = pytest.mark.timeout(120)

WATCHED = ("name", "state", "next_runs", "timer", "last_ran", "exit_status")
MIN_RUN_ROWS = 6


@pytest.fixture
def client(admin_daemon: AdminDaemon) -> Iterator[Client]:
    with Client(admin_daemon.url, admin_daemon.token) as c:
        yield c


def settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def test_the_watched_columns_and_several_runs_fit_the_default_window(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    window = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    qtbot.waitExposed(window)
    settle()
    assert window.size() == QSize(1200, 700)  # the default: nothing saved yet
    header = window.view.header()
    viewport = window.view.viewport().width()
    for key in WATCHED:
        left = header.sectionViewportPosition(COL[key])
        right = left + header.sectionSize(COL[key])
        assert left >= 0, key
        assert right <= viewport, (key, left, right, viewport)
    assert window.view.horizontalScrollBar().value() == 0

    history = window.history
    assert history is not None
    table = history.table
    rows = table.viewport().height() // table.verticalHeader().defaultSectionSize()
    assert rows >= MIN_RUN_ROWS, (rows, table.viewport().height())
    window.close()


def test_a_running_job_stands_out_in_the_name_column(
    qtbot: Any, admin_daemon: AdminDaemon, client: Client
) -> None:
    window = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    client.create_job("sleeper", "task", active=True, command="sleep 60")
    client.create_job("resting", "task", active=True, command="true")
    wait_shown(qtbot, window, "resting")
    node = window.model.find("sleeper")
    assert node is not None
    name = window.model.index_of(node.id, COL["name"])
    idle_icon = name.data(Qt.ItemDataRole.DecorationRole).pixmap(16, 16).toImage()
    assert name.data(Qt.ItemDataRole.BackgroundRole) is None

    client.run_now("sleeper")
    wait_shown(qtbot, window, "sleeper", state="running")
    running = window.model.index_of(node.id, COL["name"])
    background = running.data(Qt.ItemDataRole.BackgroundRole)
    assert background is not None
    assert background.color().isValid()
    resting = window.model.find("resting")
    assert resting is not None
    other = window.model.index_of(resting.id, COL["name"])
    assert other.data(Qt.ItemDataRole.BackgroundRole) is None  # only the running row
    # The icon changes too (a badge), so the row stands out when selected as well.
    running_icon = running.data(Qt.ItemDataRole.DecorationRole).pixmap(16, 16).toImage()
    assert running_icon != idle_icon
    assert "running" in running.data(Qt.ItemDataRole.ToolTipRole)

    client.kill("sleeper")
    wait_shown(qtbot, window, "sleeper", state="idle")
    back = window.model.index_of(node.id, COL["name"])
    assert back.data(Qt.ItemDataRole.BackgroundRole) is None
    window.close()


def test_geometry_docks_and_column_widths_come_back(qtbot: Any, admin_daemon: AdminDaemon) -> None:
    first = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    qtbot.waitExposed(first)
    first.resize(780, 560)  # within the offscreen screen (800x600): restoring clamps to it
    first.view.setColumnWidth(COL["name"], 321)
    first.view.setColumnWidth(COL["timer"], 123)
    assert first.history is not None
    first.history.table.setColumnWidth(2, 111)  # Who
    settle()
    geometry = first.geometry()
    dock_width = first.properties_dock.width()
    first.close()
    settle()

    saved = QSettings(MainWindow.SETTINGS_ORG, MainWindow.SETTINGS_APP)
    assert saved.contains("window/geometry"), saved.fileName()
    del saved

    again = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    qtbot.waitExposed(again)
    settle()
    assert again.geometry().size() == geometry.size()
    assert again.properties_dock.width() == dock_width
    assert again.view.columnWidth(COL["name"]) == 321
    assert again.view.columnWidth(COL["timer"]) == 123
    assert again.history is not None
    assert again.history.table.columnWidth(2) == 111
    again.close()


def test_a_saved_layout_that_does_not_fit_is_ignored_with_a_warning(
    qtbot: Any, admin_daemon: AdminDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    saved = QSettings(MainWindow.SETTINGS_ORG, MainWindow.SETTINGS_APP)
    saved.setValue("tree/header", b"not a header state")
    saved.sync()
    del saved
    window = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    # The default widths stand, and the log says why the saved ones were not used.
    assert window.view.columnWidth(COL["name"]) > 0
    assert any("tree/header" in r.getMessage() for r in caplog.records), caplog.text
    window.close()
