"""The tree-table (spec 10.2): the magnifier of the Timer and Func columns, drag and drop.

The Timer Expr and Func Expr cells draw a magnifier at their right edge (bold
while the mouse is over the cell); a click on it asks for the expression
editor, as does F4 on the current row (``expression_requested(job id,
field)``). There is no magnifier in a box's Func Expr cell: boxes have no
command.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, QRect, Qt, Signal
from PySide6.QtGui import QKeyEvent, QMouseEvent, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTreeView,
    QWidget,
)

from jobcontrol_admin import icons
from jobcontrol_admin.model import COL, COLUMNS, JobIdRole, ViewRole

MAGNIFIER = 18  # the clickable width at the cell's right edge
EXPRESSION_COLUMNS = {COL["timer"]: "timer", COL["command"]: "command"}
# The order the columns are shown in (the model keeps spec 10.2's): what an operator
# watches first, so that it fits a default-sized window without scrolling; the rest
# after it. Columns can be dragged elsewhere; the window remembers where.
SHOWN_ORDER = (
    "name",
    "on_error",
    "state",
    "next_runs",
    "timer",
    "last_ran",
    "exit_status",
    "last_duration_ms",
    "started",
    "job_order",
    "command",
)

AnyIndex = QModelIndex | QPersistentModelIndex


def has_magnifier(index: AnyIndex) -> bool:
    field = EXPRESSION_COLUMNS.get(index.column())
    if field is None:
        return False
    view = index.data(ViewRole) or {}
    return field == "timer" or view.get("kind") != "box"


class ExpressionDelegate(QStyledItemDelegate):
    """Paints the cell as usual, then the magnifier; a click on it opens the editor."""

    clicked = Signal(int, str)  # job id, "timer" | "command"

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: AnyIndex) -> None:
        if not has_magnifier(index):
            super().paint(painter, option, index)
            return
        narrowed = QStyleOptionViewItem(option)
        narrowed.rect = option.rect.adjusted(0, 0, -MAGNIFIER, 0)
        super().paint(painter, narrowed, index)
        hover = bool(option.state & QStyle.StateFlag.State_MouseOver)
        rect: QRect = option.rect
        target = QRect(rect.right() - MAGNIFIER + 1, rect.top(), MAGNIFIER, rect.height())
        icons.magnifier(bold=hover).paint(painter, target.adjusted(1, 1, -1, -1))

    def editorEvent(  # noqa: N802
        self, event: QEvent, model: object, option: QStyleOptionViewItem, index: AnyIndex
    ) -> bool:
        if (
            event.type() == QEvent.Type.MouseButtonRelease
            and isinstance(event, QMouseEvent)
            and event.button() == Qt.MouseButton.LeftButton
            and has_magnifier(index)
        ):
            rect: QRect = option.rect
            if event.position().x() >= rect.right() - MAGNIFIER:
                self.clicked.emit(int(index.data(JobIdRole)), EXPRESSION_COLUMNS[index.column()])
                return True
        return super().editorEvent(event, model, option, index)  # type: ignore[arg-type]


class JobTreeView(QTreeView):
    """The jobs: several rows selectable, the name edited in place, rows dragged to move."""

    expression_requested = Signal(int, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("jobs")
        self.setUniformRowHeights(True)  # 10,000 rows stay quick to lay out
        self.setAlternatingRowColors(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.SelectedClicked
        )
        self.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.setDragEnabled(True)
        self.setAcceptDrops(True)
        self.setDropIndicatorShown(True)
        self.setMouseTracking(True)  # the magnifier turns bold under the mouse
        self.setAllColumnsShowFocus(True)
        self.delegate = ExpressionDelegate(self)
        for column in EXPRESSION_COLUMNS:
            self.setItemDelegateForColumn(column, self.delegate)
        self.delegate.clicked.connect(self.expression_requested)

    def set_column_widths(self) -> None:
        """Wide enough for what each column shows, in the view's font; in ``SHOWN_ORDER``."""
        metrics = self.fontMetrics()
        samples = {
            "started": "00 May 0000 00:00:00",
            "last_ran": "00 May 0000 00:00:00",
            "next_runs": "00 May 0000 00:00:00",
            "last_duration_ms": "00:00:00.000",
            "exit_status": "Exit",
            "state": "Job State",
            "job_order": "JobOrder",
        }
        fixed = {"name": 200, "on_error": 24, "timer": 130, "command": 240}
        for i, (_, key) in enumerate(COLUMNS):
            if key in samples:
                width = metrics.horizontalAdvance(samples[key]) + 24
            else:
                width = fixed.get(key, 80)
            self.setColumnWidth(i, width)
        header = self.header()
        for place, key in enumerate(SHOWN_ORDER):
            header.moveSection(header.visualIndex(COL[key]), place)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        if event.key() == Qt.Key.Key_F4 and self.currentIndex().isValid():
            index = self.currentIndex()
            column = index.column() if index.column() in EXPRESSION_COLUMNS else COL["timer"]
            target = index.siblingAtColumn(column)
            if has_magnifier(target):
                self.expression_requested.emit(
                    int(target.data(JobIdRole)), EXPRESSION_COLUMNS[column]
                )
                return
        super().keyPressEvent(event)
