"""The run history of one job, and the log of the run selected, followed live while it runs.

``HistoryPanel`` shows a job's runs newest first, a page at a time ("Older
runs" reads the next page), and keeps them current from the live events the
window hands to ``on_events``: a run that starts is inserted at the top, one
that ends is changed in place. Selecting a run shows its log below the table:
the log as it is (read on the session's read pool), then, while the run is
live, the rest as it is written, read by a thread of its own on a client of
its own. That thread hands its chunks to the GUI thread through a queued
signal, as ``feed.EventFeed`` does; it is stopped (its stream aborted, the
thread joined) when another run is selected, another job shown, or the panel
shut down. The thread holds no Qt object but the relay it emits on, the
panel's child (see ``session`` for why that matters).
"""

from __future__ import annotations

import bisect
import codecs
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QItemSelection,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QCloseEvent, QFontDatabase, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from jobcontrol.client import ApiError, Client, DaemonUnreachableError, Event, StreamHandle
from jobcontrol_admin.formats import (
    format_bytes,
    format_cpu,
    format_duration,
    format_time,
    parse_time,
)
from jobcontrol_admin.session import Session

log = logging.getLogger(__name__)

AnyIndex = QModelIndex | QPersistentModelIndex
RunIdRole = Qt.ItemDataRole.UserRole + 1

# CPU and Mem peak come from the run's cgroup (blank when the daemon has no cgroups).
COLUMNS = ("Run", "Trigger", "Who", "Started", "Duration", "CPU", "Mem peak", "Status")
_RIGHT = tuple(COLUMNS.index(c) for c in ("Run", "Duration", "CPU", "Mem peak"))
PAGE_SIZE = 50
JOIN_TIMEOUT = 5.0
NO_OUTPUT = "(no output)"

# How far along a run is: an answer read earlier never takes a run back.
_ACTIVE_RANK = {"queued": 0, "running": 1, "waiting": 1}
_FINAL_RANK = 2


def _rank(run: Mapping[str, Any]) -> int:
    return _ACTIVE_RANK.get(str(run.get("state")), _FINAL_RANK)


def is_live(run: Mapping[str, Any]) -> bool:
    """Whether the run may still write to its log."""
    return _rank(run) < _FINAL_RANK


def status_text(run: Mapping[str, Any]) -> str:
    """``failed (exit 2)``: the state, with the exit status once there is one."""
    state = str(run.get("state") or "")
    exit_status = run.get("exit_status")
    return state if exit_status is None else f"{state} (exit {exit_status})"


def ended_text(run: Mapping[str, Any]) -> str:
    """``Run 7: ended (failed, exit 2)``."""
    parts = [str(run.get("state") or "")]
    if run.get("exit_status") is not None:
        parts.append(f"exit {run['exit_status']}")
    return f"Run {run['id']}: ended ({', '.join(parts)})"


def _problem_text(run_id: int, problem: object) -> str:
    """``Run 7 has no log: …``: the daemon's message, about the run."""
    text = str(problem)
    if text.startswith(f"run {run_id} "):
        return "R" + text[1:]
    return f"Run {run_id}: {text}"


# ---------------------------------------------------------------- the table


class RunTableModel(QAbstractTableModel):
    """Runs of one job, newest (highest id) first; rows change in place."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runs: list[dict[str, Any]] = []

    def clear(self) -> None:
        self.beginResetModel()
        self._runs = []
        self.endResetModel()

    def add(self, runs: Iterable[Mapping[str, Any]]) -> None:
        for run in runs:
            self.upsert(run)

    def upsert(self, run: Mapping[str, Any]) -> None:
        """Merge into the run's row, or insert it in id order; never take a run back a state."""
        run_id = int(run["id"])
        row = self.row_of(run_id)
        if row is not None:
            current = self._runs[row]
            if _rank(run) < _rank(current):
                return
            current.update(run)
            last = len(COLUMNS) - 1
            self.dataChanged.emit(self.index(row, 0), self.index(row, last))
            return
        row = bisect.bisect_left([-int(r["id"]) for r in self._runs], -run_id)
        self.beginInsertRows(QModelIndex(), row, row)
        self._runs.insert(row, dict(run))
        self.endInsertRows()

    def row_of(self, run_id: int) -> int | None:
        for row, run in enumerate(self._runs):
            if run["id"] == run_id:
                return row
        return None

    def run(self, row: int) -> dict[str, Any]:
        return self._runs[row]

    def oldest_id(self) -> int | None:
        return int(self._runs[-1]["id"]) if self._runs else None

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._runs)

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(  # noqa: N802
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if (
            orientation == Qt.Orientation.Horizontal
            and role == Qt.ItemDataRole.DisplayRole
            and 0 <= section < len(COLUMNS)
        ):
            return COLUMNS[section]
        return None

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._runs):
            return None
        run = self._runs[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(run, index.column())
        if role == RunIdRole:
            return run["id"]
        if role == Qt.ItemDataRole.ToolTipRole and index.column() == COLUMNS.index("Status"):
            return run.get("reason") or None
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() in _RIGHT:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    @staticmethod
    def _text(run: Mapping[str, Any], column: int) -> str:
        name = COLUMNS[column]
        if name == "Run":
            return str(run["id"])
        if name == "Trigger":
            return str(run.get("trigger") or "")
        if name == "Who":  # the user who ran or restarted it, "timer" for a timer's run
            return str(run.get("requested_by") or "")
        if name == "Started":
            return format_time(parse_time(run.get("started")))
        if name == "Duration":
            return format_duration(run.get("duration_ms"))
        if name == "CPU":
            return format_cpu(run.get("cpu_us"))
        if name == "Mem peak":
            return format_bytes(run.get("mem_peak_bytes"))
        return status_text(run)


# ---------------------------------------------------------------- the log


class LogView(QPlainTextEdit):
    """A run's log: read-only, monospace, kept scrolled to the end while it is there."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))

    def append_text(self, text: str) -> None:
        """Add ``text`` at the end (not as a new paragraph, unlike ``appendPlainText``)."""
        if not text:
            return
        bar = self.verticalScrollBar()
        at_end = bar.value() >= bar.maximum()
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        if at_end:
            bar.setValue(bar.maximum())


@dataclass
class _LogStart:
    run: dict[str, Any]
    data: bytes  # the log as it was: following goes on from its length


@dataclass
class _End:
    run: dict[str, Any] | None  # the run as it ended, or None on an error
    error: str


def _read_log(client: Client, run_id: int) -> _LogStart:
    """The run and its log as they are now (on a read worker)."""
    run: dict[str, Any] = client.get_run(run_id)["run"]
    chunks: list[bytes] = []
    offset = 0
    try:
        while True:
            data, size = client.log(run_id, offset=offset)
            chunks.append(data)
            offset += len(data)
            if not data or offset >= size:
                break
    except ApiError as exc:
        # A live run may have no log file yet: it is followed from the start.
        if exc.status != 404 or not is_live(run):
            raise
    return _LogStart(run, b"".join(chunks))


class _LogRelay(QObject):
    """The panel's child on the GUI thread; a follower's thread emits on it, so delivery is
    queued there. Being a child, it is kept (and destroyed) by the panel, never by that thread."""

    wake = Signal(object)  # the _Follower with something to take


class _Follower:
    """One followed log: its thread, the stream's handle, and what the GUI has not taken yet."""

    def __init__(self, run_id: int, client: Client, offset: int, relay: _LogRelay) -> None:
        self.run_id = run_id
        self.handle = StreamHandle()
        self._relay = relay
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._end: _End | None = None
        self._woken = False
        self._thread = threading.Thread(
            target=self._run, args=(client, offset), name=f"jc-admin-log-{run_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the stream at once and wait for the thread (bounded)."""
        self.handle.abort()
        self._thread.join(JOIN_TIMEOUT)
        if self._thread.is_alive():
            log.error(
                "following the log of run %s did not stop in %.0f s", self.run_id, JOIN_TIMEOUT
            )

    def take(self) -> tuple[bytes, _End | None]:
        """(the bytes read since the last take, the end once it came)."""
        with self._lock:
            data = b"".join(self._pending)
            self._pending.clear()
            self._woken = False
            return data, self._end

    def _post(self, chunk: bytes | None, end: _End | None) -> None:
        with self._lock:
            if chunk:
                self._pending.append(chunk)
            if end is not None:
                self._end = end
            wake = not self._woken
            self._woken = True
        if wake:
            self._relay.wake.emit(self)

    def _run(self, client: Client, offset: int) -> None:
        try:
            end = self._follow(client, offset)
        finally:
            client.close()
        if end is not None:
            self._post(None, end)

    def _follow(self, client: Client, offset: int) -> _End | None:
        """Read until the run ends; None when aborted (nobody wants the end then)."""
        try:
            for chunk in client.follow_log(self.run_id, offset=offset, handle=self.handle):
                self._post(chunk, None)
            if self.handle.aborted:
                return None
            return _End(client.get_run(self.run_id)["run"], "")
        except Exception as exc:  # the daemon went away, or refused the stream
            return None if self.handle.aborted else _End(None, str(exc))


# ---------------------------------------------------------------- the panel


class HistoryPanel(QWidget):
    """A job's runs (paged, kept live) over the log of the run selected."""

    def __init__(
        self, session: Session, parent: QWidget | None = None, *, page_size: int = PAGE_SIZE
    ) -> None:
        super().__init__(parent)
        self.setObjectName("jc-history")
        self.session = session
        self.page_size = page_size
        self.job_id: int | None = None
        self.job_name = ""
        self._token = 0  # bumped by show_job: answers for an older token are stale
        self._next: int | None = None
        self._loading = False
        self._unread: str | None = None  # why the last read failed on an outage
        self._log_token = 0  # bumped by each run selected
        self._log_run: int | None = None
        self._follower: _Follower | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._closed = False
        self._relay = _LogRelay(self)
        self._relay.wake.connect(self._take_log, Qt.ConnectionType.QueuedConnection)

        self.model = RunTableModel(self)
        self.model.rowsInserted.connect(self._update_count)
        self.model.modelReset.connect(self._update_count)
        self.title = QLabel()
        self.count_label = QLabel()
        self.older_button = QPushButton("Older runs")
        self.older_button.setEnabled(False)
        self.older_button.clicked.connect(self.load_older)

        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)  # the window keeps them
        header.setStretchLastSection(True)
        metrics = self.table.fontMetrics()
        samples = {
            "Run": "000000",
            "Trigger": "restart",
            "Who": "operator",
            "Started": "00 May 0000 00:00:00",
            "Duration": "00:00:00.000",
            "CPU": "0.000 s",
            "Mem peak": "000.0 MiB",
        }
        for i, name in enumerate(COLUMNS):
            if name in samples:
                header.resizeSection(i, metrics.horizontalAdvance(samples[name]) + 16)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)

        self.log_label = QLabel()
        self.log_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.log_view = LogView()

        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        bar.addWidget(self.title)
        bar.addStretch(1)
        bar.addWidget(self.count_label)
        bar.addWidget(self.older_button)
        top_layout.addLayout(bar)
        top_layout.addWidget(self.table)
        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addWidget(self.log_label)
        bottom_layout.addWidget(self.log_view)
        # Side by side: the dock is wide and low, and the runs get its whole height.
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("runs-and-log")
        self.splitter.addWidget(top)
        self.splitter.addWidget(bottom)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        self.splitter.setSizes([600, 400])  # scaled to the width it gets: every column shows
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)

    # ------------------------------------------------------------ the runs

    def show_job(self, job_id: int | None, name: str = "") -> None:
        """Show this job's runs (None: none), reading the newest page."""
        if self._closed:
            return
        self._token += 1
        self.job_id, self.job_name = job_id, name
        self._unread = None
        self._next = None
        self._loading = False
        self.model.clear()
        self._show_log(None)
        self.title.setText(f"Runs of {name}" if job_id is not None and name else "")
        if job_id is None:
            self._update_count()
            return
        self._read_page(job_id, None)

    def load_older(self) -> None:
        """Read the next page of older runs and add it below."""
        if self.job_id is None or self._next is None or self._loading or self._closed:
            return
        self._read_page(self.job_id, self._next)

    def select_run(self, run_id: int) -> bool:
        """Select a shown run (its log opens); False when it is not shown."""
        row = self.model.row_of(run_id)
        if row is None:
            return False
        self.table.selectRow(row)
        return True

    def retry_unread(self) -> None:
        """The connection is live again: the runs a lost daemon kept from us are read."""
        if self._unread is not None and self.job_id is not None and not self._closed:
            self.show_job(self.job_id, self.job_name)

    def on_events(self, events: list[Event]) -> None:
        """Change or insert the rows of the shown job's runs that started or ended."""
        if self.job_id is None or self._closed:
            return
        for event in events:
            if not isinstance(event.data, dict):
                continue
            if event.type == "database.changed" and event.data.get("ok") and self._unread:
                self.show_job(self.job_id, self.job_name)  # the database answers again
                return
            if event.type not in ("run.started", "run.finished"):
                continue
            run = event.data.get("run")
            if isinstance(run, dict) and run.get("job_id") == self.job_id:
                self._apply_run_event(run)

    def _read_page(self, job_id: int, before: int | None) -> None:
        token, limit = self._token, self.page_size
        self._loading = True
        self._update_count()

        def call(client: Client) -> dict[str, Any]:
            return client.runs(job_id, limit=limit, before=before)

        def done(page: dict[str, Any]) -> None:
            if token != self._token:
                return
            self._loading = False
            self._next = page.get("next")
            self.model.add(page.get("runs") or [])
            self._update_count()  # the button, when the page was empty

        def failed(exc: Exception) -> None:
            if token != self._token:
                return
            self._loading = False
            self._update_count()
            if isinstance(exc, ApiError) and exc.status == 404:
                # Deleted while the page was on its way: the tree drops it next.
                self.count_label.setText(f"{self.job_name or job_id} no longer exists")
                return
            if (isinstance(exc, ApiError) and exc.status == 503) or isinstance(
                exc, DaemonUnreachableError
            ):
                # The daemon's database, or the daemon, does not answer (the status bar
                # says so): said here, not in a dialog at each job selected, and read
                # again once it does (``on_events``, ``retry_unread``).
                self._unread = f"runs not read: {exc}"
                self._update_count()
                return
            self.session.error.emit(f"History of {self.job_name or job_id}", str(exc))

        self.session.read(f"History of {self.job_name or job_id}", call, done, failed)

    def _apply_run_event(self, run: dict[str, Any]) -> None:
        run_id = int(run["id"])
        known = self.model.row_of(run_id) is not None
        oldest = self.model.oldest_id()
        if not known and self._next is not None and oldest is not None and run_id < oldest:
            return  # it belongs to a page not read yet
        self.model.upsert(run)
        row = self.model.row_of(run_id)
        if row is not None and not self.model.run(row).get("started"):
            self._refresh_run(run_id)  # an event carries no times: read the run once

    def _refresh_run(self, run_id: int) -> None:
        token = self._token

        def done(answer: dict[str, Any]) -> None:
            if token == self._token and self.model.row_of(run_id) is not None:
                self.model.upsert(answer["run"])

        def failed(exc: Exception) -> None:
            log.warning("could not read run %s: %s", run_id, exc)

        self.session.read(f"Run {run_id}", lambda c: c.get_run(run_id), done, failed)

    @Slot()
    def _update_count(self) -> None:
        n = self.model.rowCount()
        if self.job_id is None:
            text = ""
        elif self._unread is not None and n == 0:
            text = self._unread
        elif self._loading and n == 0:
            text = "loading…"
        elif n == 0:
            text = "no runs yet"
        else:
            text = f"{n} run{'' if n == 1 else 's'} shown"
        self.count_label.setText(text)
        self.count_label.setToolTip(
            "Read again when the daemon and its database answer."
            if self._unread is not None
            else ""
        )
        self.older_button.setEnabled(self._next is not None and not self._loading)

    # ------------------------------------------------------------ the log

    @Slot(QItemSelection, QItemSelection)
    def _selection_changed(self, _selected: QItemSelection, _deselected: QItemSelection) -> None:
        if self._closed:
            return
        rows = self.table.selectionModel().selectedRows()
        run_id = int(self.model.run(rows[0].row())["id"]) if rows else None
        if run_id != self._log_run:
            self._show_log(run_id)

    def _show_log(self, run_id: int | None) -> None:
        """Stop following, then read (and follow) the log of ``run_id``."""
        self._stop_follow()
        self._log_token += 1
        self._log_run = run_id
        self._decoder.reset()
        self.log_view.clear()
        self.log_view.setPlaceholderText("")
        if run_id is None:
            self.log_label.setText("")
            return
        self.log_label.setText(f"Run {run_id}: reading the log…")
        token = self._log_token

        def done(start: _LogStart) -> None:
            if token == self._log_token and not self._closed:
                self._log_read(start)

        def failed(exc: Exception) -> None:
            if token == self._log_token:
                self.log_label.setText(_problem_text(run_id, exc))

        self.session.read(f"Log of run {run_id}", lambda c: _read_log(c, run_id), done, failed)

    def _log_read(self, start: _LogStart) -> None:
        run = start.run
        self.log_view.append_text(self._decoder.decode(start.data))
        self._note_run(run)
        if not is_live(run):
            self._log_ended(run)
            return
        self.log_label.setText(f"Run {run['id']}: following…")
        self.log_view.setPlaceholderText(NO_OUTPUT)
        follower = _Follower(run["id"], self.session.new_client(), len(start.data), self._relay)
        self._follower = follower
        follower.start()

    @Slot(object)
    def _take_log(self, follower: _Follower) -> None:
        if follower is not self._follower:
            return  # stopped meanwhile: what it read is no longer wanted
        data, end = follower.take()
        self.log_view.append_text(self._decoder.decode(data))
        if end is None:
            return
        self._stop_follow()
        if end.run is None:
            self.log_label.setText(_problem_text(follower.run_id, end.error))
            return
        self._note_run(end.run)
        self._log_ended(end.run)

    def _log_ended(self, run: Mapping[str, Any]) -> None:
        self.log_view.append_text(self._decoder.decode(b"", final=True))
        self.log_view.setPlaceholderText(NO_OUTPUT)
        self.log_label.setText(ended_text(run))

    def _note_run(self, run: Mapping[str, Any]) -> None:
        """A fresher copy of a shown run, read with its log."""
        if self.model.row_of(int(run["id"])) is not None:
            self.model.upsert(run)

    def _stop_follow(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()

    @property
    def following(self) -> bool:
        return self._follower is not None

    # ------------------------------------------------------------ life cycle

    def shutdown(self) -> None:
        """Stop following (the thread is joined); the panel then ignores answers and events."""
        if self._closed:
            return
        self._closed = True
        self._token += 1
        self._log_token += 1
        self._stop_follow()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(event)
