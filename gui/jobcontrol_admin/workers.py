"""The Workers & Lanes panel: who runs tasks, in which lanes, and what waits (issue 10).

Three tables side by side, all read from the admin API (``/workers``, ``/lanes``,
``/queue``) in one read on a worker thread:

* **Workers**: one row per worker, its groups, a slot bar (used / total), the runs it
  holds and since when, its last heartbeat. A worker that stopped is hidden unless
  "Show stopped" is ticked; one the daemon says is late (not heard of within its
  lease, or twice the beat it said it would make: an idle worker's, a minute) is shown
  greyed and marked *STALE*, one whose process on the daemon's host is not running
  *GONE* (from a daemon that does not say, the panel judges by the default lane's
  stale timeout).
* **Lanes**: the rules (max slots, poll, stale), running, queue depth, oldest wait, and
  the state: open, draining (runs still finishing) / drained, or STOPPED with its reason.
  Drain / resume (operator), edit / add / remove (admin).
* **Queue**: the queued task runs of every lane in claim order; reprioritize one
  (operator).

It refreshes when the event stream says something it shows may have changed (a run
queued or finished, a lane changed: ``lane.changed``), a moment later so a burst costs
one read, and every ``REFRESH_MS`` besides: claims and heartbeats have no event. What
the token's role may not do is disabled with a tooltip saying why (``GET /whoami``);
the daemon still checks every request and its refusal is shown as it words it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QSettings, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from jobcontrol.client import Client, Event
from jobcontrol_admin.formats import format_time, parse_time
from jobcontrol_admin.session import Session

REFRESH_MS = 5000  # heartbeat ages and claims, which have no event
SOON_MS = 250  # after an event: a burst of them costs one read
REFRESH_EVENTS = frozenset({"run.started", "run.finished", "lane.changed"})
MANAGE = "workers:manage"  # drain, resume, reprioritize
CONFIGURE = "lanes:configure"  # edit, add, remove lanes
WHO_MAY = {MANAGE: "operators and admins", CONFIGURE: "admins"}
DEFAULT_STALE_S = 600.0  # until the default lane's own stale timeout is known

WORKER_COLUMNS = ("Worker", "Host", "Groups", "Slots", "Runs held", "Heartbeat")
LANE_COLUMNS = (
    "Lane",
    "State",
    "Max slots",
    "Running",
    "Queued",
    "Oldest wait",
    "Poll",
    "Stale",
)
QUEUE_COLUMNS = ("Lane", "#", "Run", "Job", "Priority", "Waiting", "By")
SlotsRole = Qt.ItemDataRole.UserRole + 1
KeyRole = Qt.ItemDataRole.UserRole + 2

_SLOTS = re.compile(r"\s*(\d+|none)?\s*", re.IGNORECASE)


# ---------------------------------------------------------------- text


def seconds_text(seconds: object) -> str:
    """A wait or an age: ``12s``, ``4m 05s``, ``2h 03m``, ``3d 04h``; blank for none."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return ""
    if not math.isfinite(seconds) or seconds < 0:
        return ""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def duration_text(seconds: object) -> str:
    """A lane's poll or stale setting as the daemon reads it back: ``2s``, ``30m``, ``1h30m``."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        return ""
    if not float(seconds).is_integer():
        return f"{float(seconds)!r}s"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


def lane_state_text(lane: Mapping[str, Any]) -> str:
    """``Open``, ``Draining`` (runs still finishing), ``Drained``, or ``STOPPED: reason``."""
    state = lane.get("state")
    if state == "stopped":
        reason = lane.get("stopped_reason")
        return f"STOPPED: {reason}" if reason else "STOPPED"
    if state == "draining":
        return "Draining" if lane.get("running") else "Drained"
    return "Open" if state == "open" else str(state or "")


def groups_text(worker: Mapping[str, Any]) -> str:
    """The worker's slot groups (``fast_lane:1 manual,*:4``), else its queues."""
    groups = worker.get("groups")
    if isinstance(groups, list) and groups:
        parts = []
        for g in groups:
            if isinstance(g, Mapping):
                queues = g.get("queues")
                names = ",".join(queues) if isinstance(queues, list) else str(queues or "*")
                parts.append(f"{names}:{g.get('slots', '?')}")
            else:
                parts.append(str(g))
        return "  ".join(parts)
    queues = worker.get("queues")
    if queues is None:
        return "* (every lane)"
    if isinstance(queues, list):
        return ", ".join(map(str, queues))
    return str(queues)


def worker_is_stale(worker: Mapping[str, Any], stale_after_s: float) -> bool:
    """As the daemon judges it (``state``: late, or gone: its process on the daemon's
    host is not running); from a daemon that does not say, not heard of for longer than
    the stale timeout, or than twice the beat it said it would make (an idle worker beats
    once a minute: ``beat_s``)."""
    state = worker.get("state")
    if isinstance(state, str):
        return state in ("late", "gone")
    age = worker.get("heartbeat_age_s")
    every = worker.get("beat_s")
    if isinstance(every, int | float):
        stale_after_s = max(stale_after_s, 2 * every)
    return worker.get("stopped") is None and isinstance(age, int | float) and age > stale_after_s


_STALE_WORD = {"late": "STALE", "gone": "GONE"}


# ---------------------------------------------------------------- the slot bar


class SlotBarDelegate(QStyledItemDelegate):
    """Paints a cell's ``SlotsRole`` (used, total) as a bar with ``used / total`` on it."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        value = index.data(SlotsRole)
        if not isinstance(value, tuple) or len(value) != 2:
            super().paint(painter, option, index)
            return
        used, total = int(value[0]), int(value[1])
        rect: QRect = option.rect.adjusted(4, 4, -4, -4)
        palette: QPalette = option.palette
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        if option.state & QStyle.StateFlag.State_Selected:
            painter.fillRect(option.rect, palette.highlight())
        painter.setPen(QColor("#9aa5b1"))
        painter.setBrush(QColor("#eef1f4"))
        painter.drawRoundedRect(rect, 3, 3)
        if total > 0 and used > 0:
            done = QRect(rect)
            done.setWidth(max(4, rect.width() * min(used, total) // total))
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor("#c0392b") if used >= total else QColor("#3a7bd5"))
            painter.drawRoundedRect(done.adjusted(1, 1, 0, 0), 2, 2)
        text = f"{used} / {total}"
        painter.setPen(QColor("#1b2631"))
        font = QFont(option.font)
        font.setBold(True)
        painter.setFont(font)
        # The text on a light plate, readable over the bar and beside it alike.
        metrics = painter.fontMetrics()
        plate = metrics.boundingRect(text).adjusted(-4, -1, 4, 1)
        plate.moveCenter(rect.center())
        painter.setBrush(QColor(255, 255, 255, 200))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawRoundedRect(plate, 2, 2)
        painter.setPen(QColor("#1b2631"))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)
        painter.restore()


# ---------------------------------------------------------------- the lane dialog


class LaneDialog(QDialog):
    """Edit a lane's settings (or, with no lane, add one). Only what changed is sent; a
    refusal is shown in the dialog as the daemon words it, and the dialog stays open."""

    def __init__(
        self, session: Session, lane: Mapping[str, Any] | None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("jc-lane-dialog")
        self.session = session
        self.lane = dict(lane) if lane is not None else None
        self.result_lane: dict[str, Any] | None = None
        adding = lane is None
        self.setWindowTitle("Add lane" if adding else f"Edit lane {lane['name'] if lane else ''}")
        self.name = QLineEdit("" if lane is None else str(lane["name"]))
        self.name.setObjectName("name")
        self.name.setReadOnly(not adding)
        self.name.setPlaceholderText("the queue name it serves, e.g. gpu")
        current = lane or {}
        slots = current.get("max_slots")
        self.max_slots = QLineEdit(
            "" if lane is None else ("none" if slots is None else str(slots))
        )
        self.max_slots.setObjectName("max_slots")
        self.max_slots.setPlaceholderText("a whole number, or none for no cap")
        self.poll = QLineEdit(duration_text(current.get("poll_interval_s")))
        self.poll.setObjectName("poll")
        self.poll.setPlaceholderText("e.g. 2s (default lane's if blank)")
        self.stale = QLineEdit(duration_text(current.get("stale_timeout_s")))
        self.stale.setObjectName("stale")
        self.stale.setPlaceholderText("e.g. 30m")
        self.enabled = QCheckBox("Claims allowed (untick to drain)")
        self.enabled.setObjectName("enabled")
        self.enabled.setChecked(bool(current.get("enabled", True)))
        self._initial = self._texts()
        self.message = QLabel()
        self.message.setObjectName("message")
        self.message.setWordWrap(True)
        self.message.setStyleSheet("color: #b03a2e")
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Max slots (cluster-wide)", self.max_slots)
        form.addRow("Poll interval", self.poll)
        form.addRow("Stale timeout", self.stale)
        form.addRow("", self.enabled)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("&Add" if adding else "&Save")
        self.buttons.accepted.connect(self.submit)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(self.buttons)
        self.resize(440, 0)

    def _texts(self) -> dict[str, Any]:
        return {
            "max_slots": self.max_slots.text().strip(),
            "poll_interval_s": self.poll.text().strip(),
            "stale_timeout_s": self.stale.text().strip(),
            "enabled": self.enabled.isChecked(),
        }

    def changes(self) -> dict[str, Any]:
        """The settings to send; raises ValueError naming the field when one cannot be read."""
        now, out = self._texts(), {}
        for key, value in now.items():
            if value == self._initial[key]:
                continue
            if key == "max_slots":
                match = _SLOTS.fullmatch(str(value))
                if match is None:
                    raise ValueError(
                        f"Max slots: {value!r} is not a whole number or 'none' (none: no cap)"
                    )
                text = match.group(1)
                out[key] = None if text is None or text.lower() == "none" else int(text)
            elif key == "enabled":
                out[key] = value
            elif value == "":
                label = "Poll interval" if key == "poll_interval_s" else "Stale timeout"
                raise ValueError(f"{label}: give a duration, e.g. 2s or 30m")
            else:
                out[key] = value
        return out

    def submit(self) -> None:
        adding = self.lane is None
        name = self.name.text().strip()
        if adding and not name:
            self.message.setText("Name: give the lane a name (the queue it serves).")
            return
        try:
            fields = self.changes()
        except ValueError as exc:
            self.message.setText(str(exc))
            return
        if not fields and not adding:
            self.message.setText("Nothing changed.")
            return
        self.message.setText("Saving…")
        self.ok_button.setEnabled(False)
        if adding:
            call: Callable[[Client], Any] = lambda c: c.add_lane(name, **fields)  # noqa: E731
        else:
            call = lambda c: c.set_lane(name, **fields)  # noqa: E731
        self.session.act("Lane", call, self._saved, self._refused)

    def _saved(self, lane: dict[str, Any]) -> None:
        self.result_lane = lane
        self.ok_button.setEnabled(True)
        self.accept()

    def _refused(self, exc: Exception) -> None:
        self.ok_button.setEnabled(True)
        self.message.setText(f"Refused: {exc}")


# ---------------------------------------------------------------- the panel


def _item(text: object, key: object = None, *, right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem("" if text is None else str(text))
    item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
    if key is not None:
        item.setData(KeyRole, key)
    if right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _table(name: str, columns: Sequence[str]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setObjectName(name)
    table.setHorizontalHeaderLabels(list(columns))
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setAlternatingRowColors(True)
    table.setShowGrid(False)
    table.setWordWrap(False)
    table.verticalHeader().setVisible(False)
    table.verticalHeader().setDefaultSectionSize(22)
    header = table.horizontalHeader()
    header.setHighlightSections(False)
    header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    header.setStretchLastSection(True)
    header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
    return table


def _titled(title: str, table: QTableWidget, buttons: Iterable[QWidget]) -> QWidget:
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(2, 2, 2, 2)
    layout.setSpacing(3)
    bar = QHBoxLayout()
    label = QLabel(title)
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    bar.addWidget(label)
    bar.addStretch(1)
    for b in buttons:
        bar.addWidget(b)
    layout.addLayout(bar)
    layout.addWidget(table, 1)
    return box


def _button(text: str, name: str, slot: Callable[[], None]) -> QPushButton:
    button = QPushButton(text)
    button.setObjectName(name)
    button.setAutoDefault(False)
    button.clicked.connect(lambda _checked=False: slot())
    return button


class WorkersPanel(QWidget):
    """The Workers & Lanes panel of one daemon connection."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("workers-panel")
        self.session = session
        self.closed = False
        self.online = False
        self.role: str | None = None
        self.permissions: set[str] | None = None  # None: not known (yet); the daemon decides
        self.workers: list[dict[str, Any]] = []
        self.lanes: dict[str, dict[str, Any]] = {}
        self.queue: list[dict[str, Any]] = []
        self.refreshed: datetime | None = None
        self.refreshes = 0
        self.lane_dialog: LaneDialog | None = None
        self._loading = False
        self._again = False

        self.show_stopped = QCheckBox("Show stopped")
        self.show_stopped.setObjectName("show-stopped")
        self.show_stopped.setToolTip("Also list workers that have stopped")
        self.show_stopped.toggled.connect(lambda _on: self._fill_workers())
        self.worker_table = _table("workers", WORKER_COLUMNS)
        self.worker_table.setItemDelegateForColumn(
            WORKER_COLUMNS.index("Slots"), SlotBarDelegate(self.worker_table)
        )
        self.lane_table = _table("lanes", LANE_COLUMNS)
        self.queue_table = _table("queue", QUEUE_COLUMNS)
        for table, widths in (
            (self.worker_table, (170, 90, 120, 100, 200)),
            (self.lane_table, (110, 190, 80, 70, 70, 90, 60)),
            (self.queue_table, (70, 30, 50, 130, 60, 70)),
        ):
            for column, width in enumerate(widths):
                table.setColumnWidth(column, width)

        self.drain_button = _button("Drain", "drain", self.drain_selected)
        self.resume_button = _button("Resume", "resume", self.resume_selected)
        self.edit_button = _button("Edit…", "edit-lane", self.edit_selected)
        self.add_button = _button("Add…", "add-lane", self.add_lane)
        self.remove_button = _button("Remove", "remove-lane", self.remove_selected)
        self.reprioritize_button = _button(
            "Reprioritize…", "reprioritize", self.reprioritize_selected
        )
        self.refresh_button = _button("Refresh", "refresh", self.refresh)
        self.status = QLabel("")
        self.status.setObjectName("workers-status")
        self.status.setStyleSheet("color: gray")

        # Workers over lanes at the left, the queue at the right.
        self.left = QSplitter(Qt.Orientation.Vertical)
        self.left.setObjectName("workers-left")
        self.left.setChildrenCollapsible(False)
        self.left.addWidget(_titled("Workers", self.worker_table, [self.show_stopped]))
        self.left.addWidget(
            _titled(
                "Lanes",
                self.lane_table,
                [
                    self.drain_button,
                    self.resume_button,
                    self.edit_button,
                    self.add_button,
                    self.remove_button,
                ],
            )
        )
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("workers-splitter")
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.left)
        self.splitter.addWidget(_titled("Queue", self.queue_table, [self.reprioritize_button]))
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setSizes([860, 520])
        self.left.setSizes([120, 200])
        bottom = QHBoxLayout()
        bottom.addWidget(self.status, 1)
        bottom.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.splitter, 1)
        layout.addLayout(bottom)

        self.lane_table.itemSelectionChanged.connect(self.update_actions)
        self.queue_table.itemSelectionChanged.connect(self.update_actions)
        self.lane_table.doubleClicked.connect(lambda _i: self.edit_selected())
        self._periodic = QTimer(self)
        self._periodic.setObjectName("workers-refresh")
        self._periodic.setInterval(REFRESH_MS)
        self._periodic.timeout.connect(self.refresh)
        self._soon = QTimer(self)
        self._soon.setObjectName("workers-soon")
        self._soon.setSingleShot(True)
        self._soon.setInterval(SOON_MS)
        self._soon.timeout.connect(self.refresh)
        self.update_actions()

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Read everything, then keep it fresh (the window tells it its role)."""
        self.refresh()
        self._periodic.start()

    def shutdown(self) -> None:
        self.closed = True
        self._periodic.stop()
        self._soon.stop()
        if self.lane_dialog is not None:
            self.lane_dialog.close()
            self.lane_dialog = None

    def set_online(self, online: bool) -> None:
        self.online = online
        if online:
            self.refresh()
        self.update_actions()

    def set_role(self, me: dict[str, Any]) -> None:
        """The token's ``GET /whoami``, read by the window for all its panels."""
        self.role = str(me.get("role"))
        self.permissions = set(me.get("permissions") or ())
        self.update_actions()

    def role_unknown(self, exc: Exception) -> None:
        # An older daemon without /whoami: every action stays offered, the daemon decides.
        self.status.setText(f"Role not known ({exc}); the daemon checks each action")

    # ------------------------------------------------------------ reading

    def on_events(self, events: Iterable[Event]) -> None:
        if any(e.type in REFRESH_EVENTS for e in events) and not self._soon.isActive():
            self._soon.start()

    def refresh(self) -> None:
        """Read workers, lanes and queue (one read; a refresh asked meanwhile follows it)."""
        if self.closed:
            return
        if self._loading:
            self._again = True
            return
        self._loading = True
        self.session.read("Workers and lanes", _fetch, self._show, self._failed)

    @property
    def reading(self) -> bool:
        """A read is under way, or asked for behind the one under way."""
        return self._loading or self._again

    def _done_loading(self) -> None:
        self._loading = False
        if self._again and not self.closed:
            self._again = False
            self.refresh()

    def _failed(self, exc: Exception) -> None:
        self.status.setText(f"Could not read workers and lanes: {exc}")
        self._done_loading()

    def _show(self, got: tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]) -> None:
        workers, lanes, queue = got
        self.workers = workers
        self.lanes = {lane["name"]: lane for lane in lanes}
        self.queue = [run for lane in queue for run in lane.get("runs", ())]
        self.refreshed = datetime.now()
        self.refreshes += 1
        self._fill_workers()
        self._fill_lanes()
        self._fill_queue()
        live = [w for w in workers if w.get("stopped") is None]
        used = sum(int(w.get("used") or 0) for w in live)
        slots = sum(int(w.get("slots") or 0) for w in live)
        self.status.setText(
            f"{_count(len(live), 'worker')}, {used} / {slots} slots in use, "
            f"{len(self.queue)} queued"
            f" — updated {self.refreshed.strftime('%H:%M:%S')}"
        )
        self.update_actions()
        self._done_loading()

    def stale_after_s(self) -> float:
        default = self.lanes.get("default", {}).get("stale_timeout_s")
        return float(default) if isinstance(default, int | float) else DEFAULT_STALE_S

    def shown_workers(self) -> list[dict[str, Any]]:
        show_stopped = self.show_stopped.isChecked()
        return [w for w in self.workers if show_stopped or w.get("stopped") is None]

    def _fill_workers(self) -> None:
        table = self.worker_table
        stale_after = self.stale_after_s()
        rows = self.shown_workers()
        table.setRowCount(len(rows))
        grey = QBrush(self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
        for r, w in enumerate(rows):
            stale = worker_is_stale(w, stale_after)
            stopped = w.get("stopped") is not None
            held = w.get("runs") or []
            runs = ", ".join(
                f"{x.get('job')} #{x.get('run_id')} {_since(x.get('since'))}".rstrip() for x in held
            )
            age = seconds_text(w.get("heartbeat_age_s"))
            heartbeat = (
                f"stopped {format_time(parse_time(w.get('stopped')))}"
                if stopped
                else (
                    f"{_STALE_WORD.get(str(w.get('state')), 'STALE')} — {age} ago"
                    if stale
                    else f"{age} ago"
                )
            )
            items = [
                _item(w.get("name"), w.get("name")),
                _item(w.get("host")),
                _item(groups_text(w)),
                _item(""),
                _item(runs or "—"),
                _item(heartbeat),
            ]
            slots_item = items[WORKER_COLUMNS.index("Slots")]
            slots_item.setData(SlotsRole, (int(w.get("used") or 0), int(w.get("slots") or 0)))
            tip = (
                f"{w.get('name')} on {w.get('host')} (pid {w.get('pid')}), version "
                f"{w.get('version')}, started {format_time(parse_time(w.get('started')))}; "
                f"last heartbeat {format_time(parse_time(w.get('heartbeat')))}"
            )
            if stale and w.get("state") == "gone":
                tip += (
                    "\nIts process on the daemon's host is not running, and it never said it"
                    " stopped (killed): its runs are settled by the dispatcher."
                )
            elif stale:
                tip += (
                    f"\nNo heartbeat for longer than the stale timeout ({seconds_text(stale_after)}):"
                    " its leases have run out and its runs are settled by the dispatcher."
                )
            for item in items:
                item.setToolTip(tip)
                if stale or stopped:
                    item.setForeground(grey)
                    font = QFont(item.font())
                    font.setItalic(True)
                    item.setFont(font)
            items[4].setToolTip("\n".join(_held_line(x) for x in held) or "no runs held")
            for c, item in enumerate(items):
                table.setItem(r, c, item)

    def _fill_lanes(self) -> None:
        table = self.lane_table
        selected = self.selected_lane_name()
        table.setRowCount(len(self.lanes))
        for r, lane in enumerate(self.lanes.values()):
            state = lane_state_text(lane)
            cap = lane.get("max_slots")
            items = [
                _item(lane["name"], lane["name"]),
                _item(state),
                _item("no cap" if cap is None else cap, right=True),
                _item(lane.get("running", 0), right=True),
                _item(lane.get("queued", 0), right=True),
                _item(seconds_text(lane.get("oldest_wait_s")) or "—", right=True),
                _item(duration_text(lane.get("poll_interval_s")), right=True),
                _item(duration_text(lane.get("stale_timeout_s"))),  # the last: it stretches
            ]
            tip = f"queues: {', '.join(lane.get('queues') or [lane['name']])}"
            if lane.get("updated_by"):
                tip += f"\nlast changed by {lane['updated_by']}"
                tip += f" at {format_time(parse_time(lane.get('updated_at')))}"
            if lane.get("state") == "stopped":
                tip += f"\nSTOPPED at {format_time(parse_time(lane.get('stopped_at')))}: "
                tip += f"{lane.get('stopped_reason') or ''}\nResume it to allow claims again."
            state_item = items[1]
            if lane.get("state") == "stopped":
                state_item.setForeground(QBrush(QColor("#b03a2e")))
                bold = QFont(state_item.font())
                bold.setBold(True)
                state_item.setFont(bold)
            elif lane.get("state") == "draining":
                state_item.setForeground(QBrush(QColor("#b9770e")))
            for c, item in enumerate(items):
                item.setToolTip(tip)
                table.setItem(r, c, item)
        if selected is not None:
            self._select(table, selected)

    def _fill_queue(self) -> None:
        table = self.queue_table
        selected = self.selected_queued_run()
        key = selected.get("run_id") if selected else None
        table.setRowCount(len(self.queue))
        for r, run in enumerate(self.queue):
            lane = self._lane_of(run)
            items = [
                _item(lane, run.get("run_id")),
                _item(run.get("position"), right=True),
                _item(run.get("run_id"), right=True),
                _item(run.get("job")),
                _item(run.get("priority"), right=True),
                _item(seconds_text(run.get("wait_s")), right=True),
                _item(run.get("requested_by") or "timer"),
            ]
            for c, item in enumerate(items):
                item.setToolTip(
                    f"run {run.get('run_id')} of {run.get('job')}, queue {run.get('queue')}, "
                    f"queued {format_time(parse_time(run.get('queued_at')))}"
                )
                table.setItem(r, c, item)
        if key is not None:
            self._select(table, key)

    def _lane_of(self, run: Mapping[str, Any]) -> str:
        queue = str(run.get("queue") or "")
        for name, lane in self.lanes.items():
            if queue in (lane.get("queues") or ()):
                return name
        return queue if queue in self.lanes else "default"

    @staticmethod
    def _select(table: QTableWidget, key: object) -> None:
        for row in range(table.rowCount()):
            item = table.item(row, 0)
            if item is not None and item.data(KeyRole) == key:
                table.selectRow(row)
                return

    # ------------------------------------------------------------ selection and rights

    def selected_lane_name(self) -> str | None:
        rows = self.lane_table.selectionModel().selectedRows(0)
        if not rows:
            return None
        value = rows[0].data(KeyRole)
        return str(value) if value is not None else None

    def selected_lane(self) -> dict[str, Any] | None:
        name = self.selected_lane_name()
        return self.lanes.get(name) if name is not None else None

    def selected_queued_run(self) -> dict[str, Any] | None:
        rows = self.queue_table.selectionModel().selectedRows(0)
        if not rows:
            return None
        run_id = rows[0].data(KeyRole)
        return next((r for r in self.queue if r.get("run_id") == run_id), None)

    def select_lane(self, name: str) -> None:
        self._select(self.lane_table, name)

    def select_queued_run(self, run_id: int) -> None:
        self._select(self.queue_table, run_id)

    def why_not(self, permission: str, what: str) -> str | None:
        """Why this role may not ``what``, or None when it may (or the role is not known)."""
        if self.permissions is None or permission in self.permissions:
            return None
        return (
            f"Your role ({self.role}) may not {what}: that needs {permission}, "
            f"which {WHO_MAY[permission]} have"
        )

    def update_actions(self) -> None:
        lane = self.selected_lane()
        run = self.selected_queued_run()

        def offer(
            button: QPushButton, permission: str, what: str, ok: bool, tip: str, why: str
        ) -> None:
            refused = self.why_not(permission, what)
            if not self.online:
                button.setEnabled(False)
                button.setToolTip("Not connected to the daemon")
            elif refused is not None:
                button.setEnabled(False)
                button.setToolTip(refused)
            else:
                button.setEnabled(ok)
                button.setToolTip(tip if ok else why)

        name = lane["name"] if lane else ""
        state = lane.get("state") if lane else None
        pick = "Select a lane first"
        offer(
            self.drain_button,
            MANAGE,
            "drain lanes",
            state == "open",
            f"Drain {name}: no new claims; its running runs finish",
            pick if lane is None else f"{name} is not open ({lane_state_text(lane)})",
        )
        offer(
            self.resume_button,
            MANAGE,
            "resume lanes",
            lane is not None and state != "open",
            f"Resume {name}: claims again (also ends STOPPED)",
            pick if lane is None else f"{name} is open already",
        )
        offer(
            self.edit_button,
            CONFIGURE,
            "change lane settings",
            lane is not None,
            f"Edit {name}'s max slots, poll, stale timeout",
            pick,
        )
        offer(self.add_button, CONFIGURE, "add lanes", True, "Add a lane", "")
        busy = lane is not None and bool(lane.get("running") or lane.get("queued"))
        offer(
            self.remove_button,
            CONFIGURE,
            "remove lanes",
            lane is not None and name != "default" and not busy,
            f"Remove {name}: its queue then runs in default's rules",
            pick
            if lane is None
            else (
                "The default lane cannot be removed: every queue without a lane runs in it"
                if name == "default"
                else f"{name} has queued or running runs: drain it and let them end first"
            ),
        )
        offer(
            self.reprioritize_button,
            MANAGE,
            "reprioritize runs",
            run is not None,
            f"Change the priority of run {run.get('run_id')} of {run.get('job')}" if run else "",
            "Select a queued run first",
        )
        self.refresh_button.setEnabled(self.online)

    # ------------------------------------------------------------ asking

    def confirm(self, text: str) -> bool:
        """A yes/no question (the tests answer it by replacing this method)."""
        answer = QMessageBox.question(self, "Job Control", text)
        return answer == QMessageBox.StandardButton.Yes

    def ask_priority(self, run: Mapping[str, Any]) -> int | None:
        """The new priority of a queued run, or None (the tests replace this method)."""
        value, ok = QInputDialog.getInt(
            self,
            "Reprioritize",
            f"Priority of run {run.get('run_id')} of {run.get('job')} (higher runs first):",
            int(run.get("priority") or 0),
            -1_000_000,
            1_000_000,
        )
        return int(value) if ok else None

    # ------------------------------------------------------------ acting

    def _act(self, title: str, call: Callable[[Client], Any], said: str) -> None:
        def done(_result: Any) -> None:
            self.status.setText(said)
            self.refresh()

        self.session.act(title, call, done)  # a refusal goes to the window's error dialog

    def drain_selected(self) -> None:
        lane = self.selected_lane()
        if lane is None:
            return
        name = lane["name"]
        self._act(f"Drain {name}", lambda c: c.drain_lane(name), f"Drained {name}")

    def resume_selected(self) -> None:
        lane = self.selected_lane()
        if lane is None:
            return
        name = lane["name"]
        self._act(f"Resume {name}", lambda c: c.resume_lane(name), f"Resumed {name}")

    def remove_selected(self) -> None:
        lane = self.selected_lane()
        if lane is None:
            return
        name = lane["name"]
        if not self.confirm(f"Remove lane {name}? Its queue then runs in default's rules."):
            return
        self._act(f"Remove {name}", lambda c: c.remove_lane(name), f"Removed {name}")

    def reprioritize_selected(self) -> None:
        run = self.selected_queued_run()
        if run is None:
            return
        priority = self.ask_priority(run)
        if priority is None:
            return
        run_id = int(run["run_id"])
        self._act(
            "Reprioritize",
            lambda c: c.reprioritize(run_id, priority),
            f"Run {run_id} now has priority {priority}",
        )

    def edit_selected(self) -> None:
        lane = self.selected_lane()
        if lane is not None and self.edit_button.isEnabled():
            self._open_dialog(lane)

    def add_lane(self) -> None:
        self._open_dialog(None)

    def _open_dialog(self, lane: Mapping[str, Any] | None) -> None:
        if self.lane_dialog is not None:
            self.lane_dialog.close()
        dialog = LaneDialog(self.session, lane, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.lane_dialog = dialog

        def finished(result: int) -> None:
            if self.lane_dialog is dialog:
                self.lane_dialog = None
            if result == QDialog.DialogCode.Accepted and dialog.result_lane is not None:
                self.status.setText(f"Saved lane {dialog.result_lane.get('name')}")
                self.refresh()

        dialog.finished.connect(finished)
        dialog.open()

    # ------------------------------------------------------------ the layout

    def save_state(self, settings: QSettings) -> None:
        settings.setValue("workers/splitter", self.splitter.saveState())
        settings.setValue("workers/left", self.left.saveState())
        for key, table in self._tables().items():
            settings.setValue(f"workers/{key}", table.horizontalHeader().saveState())

    def _tables(self) -> dict[str, QTableWidget]:
        return {
            "workers-header": self.worker_table,
            "lanes-header": self.lane_table,
            "queue-header": self.queue_table,
        }

    def state_widgets(self) -> dict[str, Any]:
        """What the window restores from its settings: key -> widget with ``restoreState``."""
        out: dict[str, Any] = {"workers/splitter": self.splitter, "workers/left": self.left}
        for key, table in self._tables().items():
            out[f"workers/{key}"] = table.horizontalHeader()
        return out


def _fetch(client: Client) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    return client.workers(), client.lanes(), client.queue()


def _since(value: object) -> str:
    when = parse_time(value)
    return f"since {when.astimezone().strftime('%H:%M:%S')}" if when is not None else ""


def _held_line(run: Mapping[str, Any]) -> str:
    when = format_time(parse_time(run.get("since")))
    return f"run {run.get('run_id')} of {run.get('job')}, pid {run.get('pid')}, since {when}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
