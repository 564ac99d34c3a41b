"""The main window "Job Control": the tree-table, its actions, the panels (spec 10).

Everything the operator does goes to the daemon through the session (one
batch for a multi-row action, spec 10.4) and the tree changes when the
daemon's events come back, so what the window shows is what the daemon holds.
Errors from the daemon are shown as dialogs with its message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QByteArray,
    QItemSelection,
    QModelIndex,
    QSettings,
    Qt,
    QTimer,
    Slot,
)
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from jobcontrol.client import ApiError, Client, Event
from jobcontrol_admin.connection import ConnectionDialog, Found, find
from jobcontrol_admin.expression import ExpressionEditor
from jobcontrol_admin.feed import EventFeed
from jobcontrol_admin.filtering import STATES, JobFilter
from jobcontrol_admin.formats import format_time, parse_time
from jobcontrol_admin.history import HistoryPanel
from jobcontrol_admin.model import JobIdRole, JobNode, JobTreeModel
from jobcontrol_admin.properties import PropertiesPanel
from jobcontrol_admin.session import Session
from jobcontrol_admin.treeview import JobTreeView
from jobcontrol_admin.workers import WorkersPanel

log = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EVENT_INTERVAL_MS = 50
# Rows that changed place are put in order at most this often: each re-order makes the
# view lay out and paint every visible row again (50-100 ms on this machine).
ORDER_INTERVAL_MS = 1000
EXPAND_ALL_UP_TO = 500  # a first snapshot this big or smaller opens fully expanded
DATABASE_DOWN_STYLE = "color: #b00020; font-weight: bold;"
# Spec 10.5: new jobs are inactive and continue on error. Its boxes are TIMED, but
# DESIGN decision 9 makes SEQUENCE the box type everywhere, the GUI's new box too.
TEMPLATES = {
    "box": {"active": False, "on_error": "continue", "box_type": "sequence"},
    "task": {"active": False, "on_error": "continue", "command": "true"},
}


# What a permission of ``GET /whoami`` lets a role do, and which roles have it (users.py).
NEEDS_WHAT = {
    "create": ("create jobs", "admins"),
    "delete": ("delete jobs", "admins"),
    "modify": ("change jobs or the daemon", "admins"),
    "activate": ("activate or deactivate jobs", "operators and admins"),
    "restart": ("restart jobs", "operators and admins"),
    "run": ("run jobs", "operators and admins"),
    "kill": ("kill runs", "operators and admins"),
    "pause": ("pause or resume the timers", "operators and admins"),
}


class MainWindow(QMainWindow):
    """``settings``: where the window's geometry, docks and column widths are remembered
    (default: the user's ``jobcontrol/jobcontrol-admin`` settings)."""

    SETTINGS_ORG = "jobcontrol"
    SETTINGS_APP = "jobcontrol-admin"

    def __init__(self, parent: QWidget | None = None, settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("jc-main")
        self.setWindowTitle("Job Control")
        self.resize(1200, 700)
        self.settings = settings or QSettings(self.SETTINGS_ORG, self.SETTINGS_APP, self)
        self.session: Session | None = None
        # Where the daemon's address was found, read again while the connection is lost
        # (None: it was given, --url or the dialog: it stays as given).
        self.rediscover: Callable[[], str | None] | None = None
        self.feed: EventFeed | None = None
        self.properties: PropertiesPanel | None = None
        self.history: HistoryPanel | None = None
        self.workers: WorkersPanel | None = None
        self.editors: list[ExpressionEditor] = []
        self.errors: list[QMessageBox] = []
        self.connection_state = "disconnected"
        self.paused = False
        self.role: str | None = None
        self.permissions: set[str] | None = None  # None: not known (yet); the daemon decides
        self._lost_since_live = False

        self.model = JobTreeModel(self)
        # The filter model sits between the tree and the view only while a filter is set:
        # it re-maps rows on every change, which a 10,000-job live tree cannot afford.
        self.filter: JobFilter | None = None
        self._expanded_before_filter: set[int] = set()
        self.view = JobTreeView()
        self.view.setModel(self.model)
        self.view.set_column_widths()
        # Events are applied at once, then at most every EVENT_INTERVAL_MS while they pour in.
        self._queued_events: list[Event] = []
        # ``database.changed`` events shown so far, and pauses and resumes asked for: a
        # status read sent before the last of them may answer after it, and must not put
        # the older state back.
        self._database_events = 0
        self._pauses_asked = 0
        self._event_timer = QTimer(self)
        self._event_timer.setObjectName("event-pacer")
        self._event_timer.setSingleShot(True)
        self._event_timer.setInterval(EVENT_INTERVAL_MS)
        self._event_timer.timeout.connect(self._apply_queued_events)
        self._order_timer = QTimer(self)
        self._order_timer.setObjectName("order-pacer")
        self._order_timer.setSingleShot(True)
        self._order_timer.setInterval(ORDER_INTERVAL_MS)
        self._order_timer.timeout.connect(self._put_in_order)
        self.model.rename_requested.connect(self.rename)
        self.model.move_requested.connect(self.move_jobs)
        self.model.changed.connect(self.update_actions)
        self.model.changed.connect(self._update_counts)
        self.model.changed.connect(self._tell_editors)
        self.view.expression_requested.connect(self.edit_expression)
        self.view.expanded.connect(lambda i: self._expanded(i, True))
        self.view.collapsed.connect(lambda i: self._expanded(i, False))
        self.view.selectionModel().selectionChanged.connect(self._selection_changed)

        self._build_filter_bar()
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._build_status_bar()
        self.properties_dock = QDockWidget("Properties", self)
        self.properties_dock.setObjectName("properties-dock")
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.properties_dock)
        self.history_dock = QDockWidget("Runs and log", self)
        self.history_dock.setObjectName("history-dock")
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.history_dock)
        # Workers & Lanes shares the bottom with the runs, as a tab behind them.
        self.workers_dock = QDockWidget("Workers && Lanes", self)  # && : a plain "&" in tabs
        self.workers_dock.setObjectName("workers-dock")
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.workers_dock)
        self.tabifyDockWidget(self.history_dock, self.workers_dock)
        self.history_dock.raise_()
        self.view_menu.addAction(self.properties_dock.toggleViewAction())
        self.view_menu.addAction(self.history_dock.toggleViewAction())
        self.act_workers = self.workers_dock.toggleViewAction()
        self.act_workers.setText("&Workers && Lanes")
        self.act_workers.setShortcut(QKeySequence("Ctrl+Shift+W"))
        self.view_menu.addAction(self.act_workers)
        self._docks_restored = self._restore_layout()
        self.update_actions()

    # ------------------------------------------------------------ building

    def _build_filter_bar(self) -> None:
        self.filter_text = QLineEdit()
        self.filter_text.setObjectName("filter-text")
        self.filter_text.setPlaceholderText("Filter by name (Ctrl+F)")
        self.filter_text.setClearButtonEnabled(True)
        self.filter_state = QComboBox()
        self.filter_state.setObjectName("filter-state")
        self.filter_state.addItem("Any state", None)
        for state in STATES:
            self.filter_state.addItem(state.capitalize(), state)
        self.filter_failed = QCheckBox("Failed only")
        self.filter_failed.setObjectName("filter-failed")
        for signal in (
            self.filter_text.textChanged,
            self.filter_state.currentIndexChanged,
            self.filter_failed.toggled,
        ):
            signal.connect(self.apply_filter)
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.filter_text, 1)
        bar.addWidget(self.filter_state)
        bar.addWidget(self.filter_failed)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 0)
        layout.addLayout(bar)
        layout.addWidget(self.view, 1)
        self.setCentralWidget(central)

    def _action(
        self,
        text: str,
        slot: Callable[[], None],
        shortcut: str | QKeySequence.StandardKey | None = None,
        tip: str | None = None,
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(tip)
        action.triggered.connect(lambda _checked=False: slot())
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        a = self._action
        self.act_new_box = a("&Box", lambda: self.new_job("box", under_selection=True), "Ctrl+B")
        self.act_new_task = a("&Task", lambda: self.new_job("task", under_selection=True), "Ctrl+T")
        self.act_new_top_box = a("T/L B&ox", lambda: self.new_job("box"), "Ctrl+X")
        self.act_new_top_task = a("T/L T&ask", lambda: self.new_job("task"), "Ctrl+L")
        self.act_delete = a("&Delete", self.delete_selected, "Ctrl+D")
        self.act_active = a(
            "&Active", lambda: self.set_active(True), None, "Activate the selected jobs"
        )
        self.act_inactive = a(
            "&Inactive", lambda: self.set_active(False), None, "Deactivate the selected jobs"
        )
        self.act_continue = a("&Continue on Error", lambda: self.set_on_error("continue"))
        self.act_abort = a("A&bort on Error", lambda: self.set_on_error("abort"))
        self.act_timed = a("Ti&med", lambda: self.set_box_type("timed"))
        self.act_consecutive = a("C&onsecutive", lambda: self.set_box_type("sequence"))
        self.act_restart = a("&Restart", self.restart_selected, "Ctrl+R")
        self.act_run = a("Run &Now", self.run_selected, "Ctrl+N")
        self.act_kill = a("&Kill", self.kill_selected, "Ctrl+K", "Kill")
        self.act_edit_timer = a("Edit &Timer…", lambda: self._edit_current("timer"), "F4")
        self.act_edit_command = a(
            "Edit Co&mmand…", lambda: self._edit_current("command"), "Shift+F4"
        )
        self.act_rename = a("Re&name", self._rename_current, "F2")
        self.act_close = a("&Close", lambda: None if self.close() else None, "Alt+F4")
        self.act_connect = a("C&onnect…", self.open_connection_dialog)
        self.act_find = a("&Find", self.filter_text.setFocus, QKeySequence.StandardKey.Find)
        self.act_expand = a("&Expand All", self.view.expandAll, "Ctrl+E")
        self.act_collapse = a("Co&llapse All", self.view.collapseAll, "Ctrl+Shift+E")
        self.act_pause = a("&Pause Timers", self.pause_timers)
        self.act_resume = a("&Resume Timers", self.resume_timers)
        self.act_shutdown = a("&Shut Down Daemon…", self.shut_down)
        self.act_refresh = a("Re&load", self.reload, QKeySequence.StandardKey.Refresh)
        self.level_group = QActionGroup(self)
        self.level_actions: dict[str, QAction] = {}
        for level in LOG_LEVELS:
            action = QAction(level.capitalize(), self, checkable=True)
            action.triggered.connect(lambda _c=False, lv=level: self.set_log_level(lv))
            self.level_group.addAction(action)
            self.level_actions[level] = action
        self.level_actions["INFO"].setChecked(True)  # spec 10.3: INFO until the daemon says

    def _build_menus(self) -> None:
        bar = self.menuBar()
        job = bar.addMenu("&Job")
        new = job.addMenu("&New")
        new.addActions(
            [self.act_new_box, self.act_new_task, self.act_new_top_box, self.act_new_top_task]
        )
        job.addAction(self.act_delete)
        job.addSeparator()
        job.addActions([self.act_active, self.act_inactive])
        job.addSeparator()
        job.addActions([self.act_continue, self.act_abort, self.act_timed, self.act_consecutive])
        job.addSeparator()
        job.addActions([self.act_restart, self.act_run, self.act_kill])
        job.addSeparator()
        job.addActions([self.act_rename, self.act_edit_timer, self.act_edit_command])
        job.addSeparator()
        job.addAction(self.act_close)
        self.view_menu = bar.addMenu("&View")
        self.view_menu.addActions(
            [self.act_find, self.act_expand, self.act_collapse, self.act_refresh]
        )
        self.view_menu.addSeparator()
        system = bar.addMenu("&System")
        system.addAction(self.act_connect)
        system.addSeparator()
        system.addActions([self.act_pause, self.act_resume])
        levels = system.addMenu("&Log")
        levels.addActions(list(self.level_actions.values()))
        system.addSeparator()
        system.addAction(self.act_shutdown)

    def _build_toolbar(self) -> None:
        bar = self.addToolBar("Job Control")
        bar.setObjectName("toolbar")
        bar.addActions([self.act_active, self.act_inactive])
        bar.addSeparator()
        bar.addActions([self.act_continue, self.act_abort])
        bar.addSeparator()
        bar.addActions([self.act_timed, self.act_consecutive])
        bar.addSeparator()
        bar.addActions([self.act_restart, self.act_run, self.act_kill])

    def _build_status_bar(self) -> None:
        self.connection_label = QLabel("Not connected")
        self.connection_label.setObjectName("connection")
        self.counts_label = QLabel("")
        self.counts_label.setObjectName("counts")
        self.paused_label = QLabel("")
        self.paused_label.setObjectName("paused")
        # The daemon's database outage (status, then ``database.changed`` events).
        self.database_label = QLabel("")
        self.database_label.setObjectName("database")
        self.database_label.setStyleSheet(DATABASE_DOWN_STYLE)
        status = self.statusBar()
        status.addWidget(self.connection_label, 1)
        status.addPermanentWidget(self.database_label)
        status.addPermanentWidget(self.paused_label)
        status.addPermanentWidget(self.counts_label)

    # ------------------------------------------------------------ connecting

    def connect_to(self, session: Session, daemon_status: dict[str, Any] | None = None) -> None:
        """Show this daemon (dropping the one shown before)."""
        self.disconnect_daemon()
        self.session = session
        session.error.connect(self.show_error)
        self.setWindowTitle(f"Job Control — {session.url}")
        self.properties = PropertiesPanel(session, self.model)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.properties)  # the form fits a small screen too
        self.properties_dock.setWidget(scroll)
        self.history = HistoryPanel(session)
        self._restore_state(self.history.table.horizontalHeader(), "runs/header")
        self._restore_state(self.history.splitter, "runs/splitter")
        self.history_dock.setWidget(self.history)
        self.workers = WorkersPanel(session)
        for key, widget in self.workers.state_widgets().items():
            self._restore_state(widget, key)
        self.workers_dock.setWidget(self.workers)
        if not self._docks_restored:
            # The tree keeps most of the window and its watched columns fit; the runs
            # and the log share the bottom, side by side.
            self.resizeDocks(
                [self.properties_dock],
                [max(320, self.width() * 3 // 10)],
                Qt.Orientation.Horizontal,
            )
            self.resizeDocks(
                [self.history_dock], [max(220, self.height() // 3)], Qt.Orientation.Vertical
            )
        self.feed = EventFeed(session.new_client, self)
        self.feed.snapshot.connect(self._snapshot)
        self.feed.events.connect(self._events)
        self.feed.connection.connect(self._connection)
        self.feed.start()
        self.workers.start()
        if daemon_status is not None:
            self._show_status(daemon_status)
        else:
            self._read_status(failed=None)
        session.read("Log level", lambda c: c.log_level(), self._show_level, lambda _exc: None)
        session.read("Who am I", lambda c: c.whoami(), self._set_role, self._role_unknown)
        self.update_actions()

    def _set_role(self, me: dict[str, Any]) -> None:
        """What the token's role may do (``GET /whoami``): what it may not is disabled,
        with the reason, in the window and its panels. The daemon still checks each."""
        self.role = str(me.get("role"))
        self.permissions = set(me.get("permissions") or ())
        if self.workers is not None:
            self.workers.set_role(me)
        self.model.read_only = "modify" not in self.permissions
        if self.properties is not None:
            self.properties.set_refused(self.why_not("modify"))
        self.update_actions()

    def _role_unknown(self, exc: Exception) -> None:
        # A daemon without /whoami: every action stays offered, the daemon decides.
        if self.workers is not None:
            self.workers.role_unknown(exc)

    def why_not(self, permission: str) -> str | None:
        """Why the token's role may not do what ``permission`` allows; None if it may (or
        while its role is not known)."""
        if self.permissions is None or permission in self.permissions:
            return None
        what, who = NEEDS_WHAT[permission]
        return f"Your role ({self.role}) may not {what}: {who} may"

    def disconnect_daemon(self) -> None:
        self._event_timer.stop()
        self._order_timer.stop()
        self._queued_events.clear()
        if self.feed is not None:
            self.feed.stop()
            self.feed.deleteLater()
            self.feed = None
        for editor in list(self.editors):
            editor.close()
        for panel in (self.properties, self.history, self.workers):
            if panel is not None:
                panel.shutdown()
                panel.deleteLater()
        self.properties = self.history = None
        self.workers = None
        self.role = self.permissions = None
        self.model.read_only = False
        if self.session is not None:
            self.session.close()
            self.session.deleteLater()
            self.session = None
        self.connection_state = "disconnected"

    def open_connection_dialog(self, found: Found | None = None) -> None:
        dialog = ConnectionDialog(found or find(), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)

        def accepted() -> None:
            if dialog.session is not None:
                self.connect_to(dialog.session, dialog.daemon_status)

        dialog.accepted.connect(accepted)
        dialog.open()

    # ------------------------------------------------------------ remembering the layout

    def _restore_layout(self) -> bool:
        """The geometry, docks and tree columns as the window was last closed; whether
        the docks' sizes came back (else ``connect_to`` gives them their defaults)."""
        self._restore_state(self, "window/geometry", geometry=True)
        self._restore_state(self.view.header(), "tree/header")
        return self._restore_state(self, "window/state")

    def _restore_state(self, widget: Any, key: str, *, geometry: bool = False) -> bool:
        """``widget.restoreState`` (or ``restoreGeometry``) from the setting ``key``, if
        saved; one that does not fit (another version's, damaged) is left, and logged."""
        value = self.settings.value(key)
        if value is None:
            return False
        restore = widget.restoreGeometry if geometry else widget.restoreState
        if isinstance(value, QByteArray | bytes) and restore(QByteArray(value)):
            return True
        log.warning(
            "ignoring the saved %s in %s: it does not fit this window (the defaults apply)",
            key,
            self.settings.fileName(),
        )
        return False

    def save_layout(self) -> None:
        """Remember the geometry, the docks and the columns' widths (on close)."""
        s = self.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        s.setValue("tree/header", self.view.header().saveState())
        if self.history is not None:
            s.setValue("runs/header", self.history.table.horizontalHeader().saveState())
            s.setValue("runs/splitter", self.history.splitter.saveState())
        if self.workers is not None:
            self.workers.save_state(s)
        s.sync()
        if s.status() is not QSettings.Status.NoError:
            log.warning("could not save the window's layout to %s: %s", s.fileName(), s.status())

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.save_layout()
        self.disconnect_daemon()
        for box in list(self.errors):
            box.close()
        super().closeEvent(event)

    # ------------------------------------------------------------ the feed

    @Slot(int, list)
    def _snapshot(self, seq: int, jobs: list[dict[str, Any]]) -> None:
        # The queued events are older than the snapshot, which does not say what the
        # database did: that is still the last ``database.changed`` among them.
        self._show_database_events(self._queued_events)
        self._queued_events.clear()
        selected = self.selected_ids()
        current = self.current_id()
        first = self.model.seq is None
        self.model.load(seq, jobs)
        if first and len(jobs) <= EXPAND_ALL_UP_TO:
            self.view.expandAll()
        else:
            self._restore_expanded(self.model.expanded)
        self.select_ids(selected, current)
        self._selection_changed()

    @Slot(list)
    def _events(self, events: list[Event]) -> None:
        self._queued_events.extend(events)
        if not self._event_timer.isActive():
            self._apply_queued_events()

    def _apply_queued_events(self) -> None:
        events, self._queued_events = self._queued_events, []
        if not events:
            return
        self.model.apply(events, order=False)
        self._show_database_events(events)
        if self.history is not None:
            self.history.on_events(events)
        if self.workers is not None:
            self.workers.on_events(events)
        self._event_timer.start()  # what comes meanwhile waits for the next round
        if self.model.unordered and not self._order_timer.isActive():
            self._put_in_order()

    def _put_in_order(self) -> None:
        if self.model.unordered:
            self.model.put_in_order()
            self._order_timer.start()

    @Slot(str, str)
    def _connection(self, state: str, message: str) -> None:
        url = self.session.url if self.session else ""
        previous, self.connection_state = self.connection_state, state
        if self.workers is not None:
            self.workers.set_online(state == "live")
        if state == "live":
            caught = " — reconnected and caught up" if self._lost_since_live else ""
            self._lost_since_live = False
            self.connection_label.setText(f"Live: {url}{caught}")
            if previous != "live" and self.session is not None:
                self._read_status(failed=lambda _e: None)
                if self.history is not None:
                    self.history.retry_unread()
        elif state == "lost":
            self._lost_since_live = True
            detail = f": {message}" if message else ""
            self.connection_label.setText(f"Connection to {url} lost{detail} — reconnecting…")
            if self._follow_url_file():
                return
        elif state == "refused":
            self.connection_label.setText(f"Refused by {url}: {message}")
            self.show_error("Connection refused", message)
        else:
            self.connection_label.setText(f"Connecting to {url}…")
        self.update_actions()

    def _follow_url_file(self) -> bool:
        """A daemon found through its URL file may come back on another port (one
        started without --port takes a free one when 8640 is taken): while the
        connection is lost, the file is read again, and a new address is connected to.
        True when it switched."""
        if self.rediscover is None or self.session is None:
            return False
        try:
            found = self.rediscover()
        except Exception as exc:  # an unreadable file: the reconnection goes on as it was
            log.warning("the daemon's URL file was not read again: %s", exc)
            return False
        if not found or found == self.session.url:
            return False
        log.info("the daemon is at %s now (its URL file): connecting there", found)
        lost, token = self.session, self.session.token

        def switch() -> None:  # after the feed's signal: it goes with the old session
            if self.session is lost and self.connection_state == "lost":
                self.connect_to(Session(found, token))

        QTimer.singleShot(0, switch)
        return True

    def _read_status(self, *, failed: Callable[[Exception], None] | None) -> None:
        """Ask the daemon's status; show it when it answers."""
        if self.session is None:
            return
        sent = (self._database_events, self._pauses_asked)
        self.session.read(
            "Status", lambda c: c.status(), lambda s: self._show_status(s, sent=sent), failed
        )

    def _show_status(self, status: dict[str, Any], *, sent: tuple[int, int] | None = None) -> None:
        """A status the daemon answered. ``sent``: the ``database.changed`` events shown and
        the pauses and resumes asked for when it was asked for (None: it is current). Its
        database state is older than an event shown since (the event stream says every
        change), and its pause older than a pause or resume asked for since: each is shown
        only when none came meanwhile."""
        events_shown, pauses_asked = sent if sent is not None else (None, None)
        if "paused" in status and pauses_asked in (None, self._pauses_asked):
            self._show_paused(bool(status["paused"]))
        database = status.get("database")
        if isinstance(database, dict) and events_shown in (None, self._database_events):
            self._show_database(database)
        self.update_actions()

    def _show_paused(self, paused: bool) -> None:
        self.paused = paused
        self.paused_label.setText("Timers paused" if paused else "")

    def _show_database_events(self, events: list[Event]) -> None:
        """Show the last ``database.changed`` of these events, if any."""
        for event in reversed(events):
            if event.type == "database.changed" and isinstance(event.data, dict):
                self._database_events += 1
                self._show_database(event.data)
                return

    def _show_database(self, database: dict[str, Any]) -> None:
        """The daemon's database: nothing while it answers; while it does not, since when
        and why (runs, timers and edits wait for it, nothing is lost)."""
        if database.get("ok", True):
            self.database_label.setText("")
            self.database_label.setToolTip("")
            return
        since = format_time(parse_time(database.get("since")))
        self.database_label.setText(
            f"Database unavailable since {since}" if since else "Database unavailable"
        )
        self.database_label.setToolTip(
            f"{database.get('error') or 'the database does not answer'}\n"
            "The daemon retries until it answers: timers that come due, runs that end and "
            "edits wait for it, and nothing is lost."
        )

    def _show_level(self, level: str) -> None:
        action = self.level_actions.get(level.upper())
        if action is not None:
            action.setChecked(True)

    def _update_counts(self) -> None:
        running = sum(1 for n in self.model.nodes.values() if n.view.get("state") != "idle")
        self.counts_label.setText(f"{len(self.model.nodes)} jobs, {running} running")

    def reload(self) -> None:
        if self.feed is not None:
            self.feed.drop_connection()

    # ------------------------------------------------------------ selection

    def selected_nodes(self) -> list[JobNode]:
        out: list[JobNode] = []
        for index in self.view.selectionModel().selectedRows(0):
            node = self.model.nodes.get(job_id_of(index) or 0)
            if node is not None:
                out.append(node)
        return out

    def selected_ids(self) -> list[int]:
        return [n.id for n in self.selected_nodes()]

    def current_id(self) -> int | None:
        return job_id_of(self.view.currentIndex())

    def view_index(self, job_id: int) -> QModelIndex:
        """The job's row in the view (through the filter while one is set)."""
        index = self.model.index_of(job_id)
        return self.filter.mapFromSource(index) if self.filter is not None else index

    def select_ids(self, ids: Sequence[int], current: int | None = None) -> None:
        selection = QItemSelection()
        for job_id in ids:
            index = self.view_index(job_id)
            if index.isValid():
                selection.select(index, index.siblingAtColumn(self.model.columnCount() - 1))
        flags = self.view.selectionModel().SelectionFlag
        if current is not None and self.view_index(current).isValid():
            self.view.selectionModel().setCurrentIndex(self.view_index(current), flags.NoUpdate)
        self.view.selectionModel().select(selection, flags.ClearAndSelect)

    def _selection_changed(self, *_args: object) -> None:
        self.update_actions()
        current = self.current_id()
        nodes = self.selected_nodes()
        shown = current if current in {n.id for n in nodes} else (nodes[0].id if nodes else None)
        if self.properties is not None:
            self.properties.show_job(shown)
        if self.history is not None:
            node = self.model.nodes.get(shown or 0)
            self.history.show_job(shown, node.name if node else "")

    def _expanded(self, index: QModelIndex, expanded: bool) -> None:
        job_id = job_id_of(index)
        if job_id is not None:
            self.model.set_expanded(job_id, expanded)

    def _restore_expanded(self, ids: set[int]) -> None:
        for job_id in list(ids):
            index = self.view_index(job_id)
            if index.isValid():
                self.view.setExpanded(index, True)

    def update_actions(self) -> None:
        """Spec 10.3's enabling rules, for the selection and the jobs' state now."""
        nodes = self.selected_nodes()
        online = self.session is not None and self.connection_state == "live"
        single = nodes[0] if len(nodes) == 1 else None
        any_box = any(n.is_box for n in nodes)
        self.act_new_box.setEnabled(online and single is not None and single.is_box)
        self.act_new_task.setEnabled(online and single is not None and single.is_box)
        self.act_new_top_box.setEnabled(online)
        self.act_new_top_task.setEnabled(online)
        self.act_delete.setEnabled(online and bool(nodes))
        self.act_active.setEnabled(online and any(not n.view.get("active") for n in nodes))
        self.act_inactive.setEnabled(online and any(n.view.get("active") for n in nodes))
        for action in (self.act_continue, self.act_abort, self.act_timed, self.act_consecutive):
            action.setEnabled(online and any_box)
        top = single is not None and single.view.get("parent") is None
        self.act_restart.setEnabled(online and top)
        self.act_run.setEnabled(online and single is not None)
        self.act_kill.setEnabled(online and any(n.view.get("state") != "idle" for n in nodes))
        self.act_edit_timer.setEnabled(online and single is not None)
        self.act_edit_command.setEnabled(online and single is not None and not single.is_box)
        self.act_rename.setEnabled(online and single is not None)
        self.act_pause.setEnabled(online and not self.paused)
        self.act_resume.setEnabled(online and self.paused)
        self.act_shutdown.setEnabled(online)
        for level in self.level_actions.values():
            level.setEnabled(online)
        if single is not None:
            self.act_restart.setToolTip(f"Restart {single.name}")
            self.act_run.setToolTip(f"Run {single.name}")
        else:
            self.act_restart.setToolTip("Restart")
            self.act_run.setToolTip("Run Now")
        for action, permission in self._needs():
            refused = self.why_not(permission)
            if refused is not None:
                action.setEnabled(False)
                action.setToolTip(refused)
                action.setStatusTip(refused)

    def _needs(self) -> list[tuple[QAction, str]]:
        """Each action that changes something, with the permission it needs."""
        return [
            (self.act_new_box, "create"),
            (self.act_new_task, "create"),
            (self.act_new_top_box, "create"),
            (self.act_new_top_task, "create"),
            (self.act_delete, "delete"),
            (self.act_active, "activate"),
            (self.act_inactive, "activate"),
            (self.act_continue, "modify"),
            (self.act_abort, "modify"),
            (self.act_timed, "modify"),
            (self.act_consecutive, "modify"),
            (self.act_restart, "restart"),
            (self.act_run, "run"),
            (self.act_kill, "kill"),
            (self.act_edit_timer, "modify"),
            (self.act_edit_command, "modify"),
            (self.act_rename, "modify"),
            (self.act_pause, "pause"),
            (self.act_resume, "pause"),
            (self.act_shutdown, "modify"),
            *((level, "modify") for level in self.level_actions.values()),
        ]

    # ------------------------------------------------------------ asking and telling

    def confirm(self, text: str) -> bool:
        """A yes/no question (the tests answer it by replacing this method)."""
        answer = QMessageBox.question(self, "Job Control", text)
        return answer == QMessageBox.StandardButton.Yes

    @Slot(str, str)
    def show_error(self, title: str, message: str) -> None:
        """A warning dialog with the daemon's message (spec 10.3 ``generalError``), not modal."""
        for box in self.errors:
            if box.windowTitle() == title and box.text() == message:
                box.raise_()
                return
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self
        )
        box.setObjectName("jc-error")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.errors.append(box)
        box.finished.connect(lambda _r: self.errors.remove(box) if box in self.errors else None)
        box.open()

    def say(self, text: str) -> None:
        self.statusBar().showMessage(text, 8000)

    def _act(
        self, title: str, call: Callable[[Client], Any], done: Callable[[Any], None] | None = None
    ) -> None:
        if self.session is None:
            self.show_error(title, "not connected to a daemon")
            return
        self.session.act(title, call, done)

    def _edit_jobs(self, title: str, ids: Sequence[int], call: Callable[[Client], Any]) -> None:
        """One of the window's own edits of ``ids`` (outside the properties panel's batch):
        once applied, the panel's pending changes of those jobs count from it instead of
        being refused as changed by someone else."""
        seen = {i: (self.model.view(i) or {}).get("version") for i in ids}

        def done(result: Any) -> None:
            if self.properties is not None and isinstance(result, dict):
                now = {int(v["id"]): v.get("version") for v in result.get("jobs") or ()}
                self.properties.own_change_applied(seen, now)

        self._act(title, call, done)

    # ------------------------------------------------------------ job actions

    def new_job(self, kind: str, *, under_selection: bool = False) -> None:
        """Spec 10.5's templates; the name is made unique, then edited in place."""
        parent: int | None = None
        if under_selection:
            nodes = self.selected_nodes()
            if len(nodes) != 1 or not nodes[0].is_box:
                return
            parent = nodes[0].id
        base = "New Box" if kind == "box" else "New Task"
        taken = {n.name for n in self.model.nodes.values()}
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base} {n}"
        fields = dict(TEMPLATES[kind], parent=parent)

        def created(job: dict[str, Any]) -> None:
            self.say(f"Created {job['name']}")
            self._reveal_when_shown(int(job["id"]), edit=True)

        self._act(f"New {kind}", lambda c: c.create_job(name, kind, **fields), created)

    def _reveal_when_shown(self, job_id: int, *, edit: bool = False) -> None:
        """Select (and start renaming) a job once its event has put it in the tree."""

        def reveal() -> bool:
            index = self.view_index(job_id)
            if not index.isValid():
                return False
            self.view.scrollTo(index)
            self.view.setCurrentIndex(index)
            self.select_ids([job_id], job_id)
            if edit:
                self.view.edit(index)
            return True

        if reveal():
            return

        def on_change() -> None:
            if reveal():
                self.model.changed.disconnect(on_change)

        self.model.changed.connect(on_change)

    def _top_most(self, nodes: list[JobNode]) -> list[JobNode]:
        chosen = {n.id for n in nodes}
        out = []
        for node in nodes:
            walker = node.parent
            while walker is not None and walker.id not in chosen:
                walker = walker.parent
            if walker is None:
                out.append(node)
        return out

    def delete_selected(self) -> None:
        nodes = self._top_most(self.selected_nodes())
        if not nodes:
            return
        # Remembered by id: others may change the tree while the question is open.
        ids, names = [n.id for n in nodes], [n.name for n in nodes]
        text = f"Delete {names[0]}" if len(nodes) == 1 else "Delete Selected Jobs"
        if not self.confirm(text + "?"):
            return
        self._act(
            "Delete",
            lambda c: c.delete(ids),
            lambda gone: self.say(_deleted(gone)),
        )

    def set_active(self, active: bool) -> None:
        nodes = self.selected_nodes()
        ids = [n.id for n in nodes if bool(n.view.get("active")) != active]
        if not ids:
            return
        if not active:
            text = f"Deactivate {nodes[0].name}" if len(nodes) == 1 else "Deactivate Selected Jobs"
            if not self.confirm(text + "?"):
                return
        word = "Activate" if active else "Deactivate"
        self._edit_jobs(word, ids, lambda c: c.activate(ids, active))

    def set_on_error(self, value: str) -> None:
        ids = [n.id for n in self.selected_nodes() if n.is_box]
        if ids:
            self._edit_jobs("On error", ids, lambda c: c.set_on_error(ids, value))

    def set_box_type(self, value: str) -> None:
        ids = [n.id for n in self.selected_nodes() if n.is_box]
        if ids:
            self._edit_jobs("Box type", ids, lambda c: c.set_box_type(ids, value))

    def restart_selected(self) -> None:
        nodes = self.selected_nodes()
        if len(nodes) != 1 or nodes[0].view.get("parent") is not None:
            return
        node = nodes[0]

        def restarted(reply: dict[str, Any]) -> None:
            when = reply.get("next_runs")
            if not when:  # inactive, or no time left: nothing armed, and why
                self.say(f"{node.name} not armed: {reply.get('reason') or 'no next run'}")
                return
            paused = " (timers are paused: it fires once they are resumed)"
            shown = format_time(parse_time(when)) or when  # as the tree shows times
            self.say(
                f"Restarted {node.name}; next runs {shown}" + (paused if reply.get("held") else "")
            )

        self._act("Restart", lambda c: c.rearm(node.id), restarted)

    def run_selected(self) -> None:
        nodes = self.selected_nodes()
        if len(nodes) != 1:
            return
        node = nodes[0]
        self._act(
            "Run Now",
            lambda c: c.run_now(node.id),
            lambda run: self.say(f"Started run {run} of {node.name}"),
        )

    def kill_selected(self) -> None:
        busy = [n for n in self._top_most(self.selected_nodes()) if n.view.get("state") != "idle"]
        for node in busy:
            self._kill(node)

    def _kill(self, node: JobNode) -> None:
        self._act(
            "Kill",
            lambda c: c.kill_run(node.id),
            # A request its worker carries out: the tree shows the run end when it has.
            # Whose run: the nearest sub-tree root's that runs (spec 8.1), not the job's.
            lambda r: self.say(f"Asked to kill run {r['run_id']} of {r.get('job') or node.name}"),
        )

    @Slot(int, str)
    def rename(self, job_id: int, name: str) -> None:
        view = self.model.view(job_id)
        if view is None:
            return
        change = {"job": job_id, "version": view.get("version"), "fields": {"name": name}}
        self._edit_jobs("Rename", [job_id], lambda c: c.modify([change]))

    def _rename_current(self) -> None:
        index = self.view.currentIndex()
        if index.isValid():
            self.view.edit(index.siblingAtColumn(0))

    @Slot(list, object, int)
    def move_jobs(self, ids: list[int], parent_id: int | None, row: int) -> None:
        """A drop: the jobs go under ``parent_id`` at ``row``; siblings renumbered, one batch."""
        parent = (
            self.model.nodes.get(parent_id or 0, self.model.root) if parent_id else self.model.root
        )
        moving = [self.model.nodes[i] for i in ids if i in self.model.nodes]
        if not moving:
            return
        siblings = list(parent.children)
        if row < 0 or row > len(siblings):
            row = len(siblings)
        before = sum(1 for n in siblings[:row] if n.id in ids)
        rest = [n for n in siblings if n.id not in ids]
        at = row - before
        order = rest[:at] + moving + rest[at:]
        changes = []
        moved: list[int] = []
        for position, node in enumerate(order):
            fields: dict[str, Any] = {}
            if node in moving and node.view.get("parent") != parent_id:
                fields["parent"] = parent_id
            # The top level is ordered by next run (the dispatcher's): a drop there
            # renumbers nothing, so a tree running beside it never refuses the move.
            if parent_id is not None and node.view.get("job_order") != position:
                fields["job_order"] = position
            if fields:
                changes.append(
                    {"job": node.id, "version": node.view.get("version"), "fields": fields}
                )
                moved.append(node.id)
        if changes:
            self._edit_jobs("Move", moved, lambda c: c.modify(changes))

    # ------------------------------------------------------------ expressions

    def _edit_current(self, field: str) -> None:
        job_id = self.current_id()
        if job_id is not None:
            self.edit_expression(job_id, field)

    def _tell_editors(self) -> None:
        """Each open expression editor hears of its job as the daemon has it now."""
        for editor in self.editors:
            editor.job_changed(self.model.view(editor.job_id))

    @Slot(int, str)
    def edit_expression(self, job_id: int, field: str) -> None:
        view = self.model.view(job_id)
        if view is None or self.session is None:
            return
        if field == "command" and view.get("kind") == "box":
            return
        for editor in self.editors:
            if editor.job_id == job_id and editor.field == field:
                editor.raise_()
                editor.activateWindow()
                return
        editor = ExpressionEditor(self.session, view, field, self, refused=self.why_not("modify"))
        editor.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.editors.append(editor)
        editor.finished.connect(
            lambda _r: self.editors.remove(editor) if editor in self.editors else None
        )
        editor.show()

    # ------------------------------------------------------------ the dispatcher

    def pause_timers(self) -> None:
        self._pauses_asked += 1  # a status asked for before cannot say what this did
        self._act("Pause timers", lambda c: c.pause(), self._paused_reply)

    def resume_timers(self) -> None:
        self._pauses_asked += 1
        self._act("Resume timers", lambda c: c.resume(), self._paused_reply)

    def _paused_reply(self, reply: dict[str, Any]) -> None:
        """What a pause or resume did (changes run in order: the last one asked is last)."""
        self._show_paused(bool(reply.get("paused")))
        self.update_actions()

    def set_log_level(self, level: str) -> None:
        self._act("Log level", lambda c: c.set_log_level(level), self._show_level)

    def shut_down(self) -> None:
        if not self.confirm("Shut the daemon down?"):
            return
        if self.session is None:
            return

        def refused(exc: Exception) -> None:
            if isinstance(exc, ApiError) and exc.status == 409:
                if self.confirm(f"{exc}\n\nKill them and shut down?"):
                    self._act(
                        "Shut down",
                        lambda c: c.shutdown(force=True),
                        lambda _r: self.say("Daemon stopping"),
                    )
                return
            self.show_error("Shut down", str(exc))

        self.session.act(
            "Shut down", lambda c: c.shutdown(), lambda _r: self.say("Daemon stopping"), refused
        )

    # ------------------------------------------------------------ filtering

    def apply_filter(self) -> None:
        """Show the matches and their ancestors, all expanded; no filter: the tree as it was."""
        text, state, failed = (
            self.filter_text.text(),
            self.filter_state.currentData(),
            self.filter_failed.isChecked(),
        )
        wanted = bool(text.strip() or state or failed)
        selected, current = self.selected_ids(), self.current_id()
        if wanted:
            if self.filter is None:
                self._expanded_before_filter = set(self.model.expanded)
                self.filter = JobFilter(self.model)
                self.filter.setParent(self)
                self.filter.set_criteria(text, state, failed)
                self._show_model(self.filter)
            else:
                self.filter.set_criteria(text, state, failed)
            self.view.expandAll()
        elif self.filter is not None:
            old, self.filter = self.filter, None
            self._show_model(self.model)
            old.deleteLater()
            self.model.expanded = set()
            self._restore_expanded(self._expanded_before_filter)
        self.select_ids(selected, current)
        self.update_actions()

    def _show_model(self, model: QAbstractItemModel) -> None:
        header = self.view.header().saveState()
        old_selection = self.view.selectionModel()
        self.view.setModel(model)
        old_selection.deleteLater()
        self.view.header().restoreState(header)
        self.view.selectionModel().selectionChanged.connect(self._selection_changed)


def _deleted(reply: dict[str, Any]) -> str:
    """What a deletion says: every job that went, not the sub-trees named."""
    n = reply.get("deleted_jobs", len(reply["deleted"]))  # a daemon from before it
    return f"Deleted {n} job{'' if n == 1 else 's'}"


def job_id_of(index: QModelIndex) -> int | None:
    """The job of a row of the view, whichever model the view shows."""
    if not index.isValid():
        return None
    value = index.siblingAtColumn(0).data(JobIdRole)
    return int(value) if value is not None else None
