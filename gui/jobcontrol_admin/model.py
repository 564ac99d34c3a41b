"""The jobs as a Qt tree model, kept equal to the daemon by its events (spec 10.2).

Each level is ordered as the daemon orders it: next runs ascending with the
jobs that have none last, then job order (then id, so the order is total).
The model never changes a job on its own: an edit in place or a drop asks the
window to send it (``rename_requested``, ``move_requested``), and the row
changes when the daemon's event comes back. Events change rows in place
(``dataChanged``) and insert or remove them; a job that changes box is moved
(``beginMoveRows``). Rows whose place among their siblings changed (a new next
run) are put in order once per batch of events, in one layout change for all
the levels concerned: a view lays out its rows again after any change of
order, and once per batch keeps a tree of 10,000 jobs responsive while
hundreds of runs a second finish. Selections and expanded rows survive all of it.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QMimeData,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor, QFont

from jobcontrol.client import Event
from jobcontrol_admin import icons
from jobcontrol_admin.formats import format_duration, format_time, parse_time

log = logging.getLogger(__name__)

MIME_TYPE = "application/x-jobcontrol-jobs"

# (header, view key); the order of spec 10.2, with the exit status added.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("Name", "name"),
    ("", "on_error"),
    ("Started", "started"),
    ("Last Ran", "last_ran"),
    ("Duration", "last_duration_ms"),
    ("Exit", "exit_status"),
    ("Next Runs", "next_runs"),
    ("Job State", "state"),
    ("JobOrder", "job_order"),
    ("Timer Expr", "timer"),
    ("Func Expr", "command"),
)
COL = {key: i for i, (_, key) in enumerate(COLUMNS)}
LAST_COL = len(COLUMNS) - 1

JobIdRole = Qt.ItemDataRole.UserRole + 1
ViewRole = Qt.ItemDataRole.UserRole + 2
PendingRole = Qt.ItemDataRole.UserRole + 3

AnyIndex = QModelIndex | QPersistentModelIndex

_FAR = datetime.max

# Computed once: flags() is asked for every row at every layout of the view.
_ROW = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
_NAME = _ROW | Qt.ItemFlag.ItemIsEditable | Qt.ItemFlag.ItemIsDragEnabled
_BOX_NAME = _NAME | Qt.ItemFlag.ItemIsDropEnabled
_ROOT = Qt.ItemFlag.ItemIsDropEnabled


class JobNode:
    """One job: its latest view (the API's dict), its place, and its sort key."""

    __slots__ = ("children", "display", "id", "is_box", "key", "next_runs", "parent", "row", "view")

    def __init__(self, job_id: int, view: dict[str, Any] | None = None) -> None:
        self.id = job_id
        self.view: dict[str, Any] = view or {}
        self.parent: JobNode | None = None
        self.children: list[JobNode] = []
        self.row = 0
        self.display: list[Any] | None = None  # each column's text, made when first painted
        self.is_box = False
        self.next_runs: datetime | None = None
        self.key: tuple[bool, datetime, int, int] = (True, _FAR, 0, job_id)
        if view is not None:
            self.set_view(view)

    def set_view(self, view: dict[str, Any]) -> None:
        self.view = view
        self.display = None
        self.is_box = view.get("kind") == "box"
        self.next_runs = parse_time(view.get("next_runs"))
        nr = self.next_runs
        naive = nr.astimezone().replace(tzinfo=None) if nr is not None else _FAR
        self.key = (nr is None, naive, int(view.get("job_order") or 0), self.id)

    @property
    def name(self) -> str:
        return str(self.view.get("name", ""))

    def walk(self) -> Iterator[JobNode]:
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def _renumber(children: list[JobNode], start: int = 0) -> None:
    for i in range(start, len(children)):
        children[i].row = i


class JobTreeModel(QAbstractItemModel):
    """Every job of one daemon, in the daemon's order, live."""

    rename_requested = Signal(int, str)  # job id, new name
    move_requested = Signal(list, object, int)  # job ids, new parent id (None: top level), row
    changed = Signal()  # after a snapshot or a batch of events

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.root = JobNode(0)
        self.nodes: dict[int, JobNode] = {}
        self.expanded: set[int] = set()
        self.pending: set[int] = set()  # jobs with changes not applied yet (shown in italics)
        self.seq: int | None = None
        self.read_only = False  # the token's role may not modify jobs: no rename, no move
        self._unordered: dict[int, JobNode] = {}  # parents whose children may be out of order

    # ------------------------------------------------------------ reading

    def node(self, index: AnyIndex) -> JobNode:
        if not index.isValid():
            return self.root
        return self.nodes.get(index.internalId()) or self.root

    def index_of(self, job_id: int, column: int = 0) -> QModelIndex:
        node = self.nodes.get(job_id)
        if node is None:
            return QModelIndex()
        return self.createIndex(node.row, column, node.id)

    def find(self, name: str) -> JobNode | None:
        for node in self.nodes.values():
            if node.name == name:
                return node
        return None

    def view(self, job_id: int) -> dict[str, Any] | None:
        node = self.nodes.get(job_id)
        return node.view if node is not None else None

    # ------------------------------------------------------------ the Qt model

    def index(self, row: int, column: int, parent: AnyIndex = QModelIndex()) -> QModelIndex:  # noqa: B008
        # Called for every row at every layout of a view: kept to the bone.
        if parent.isValid():
            if parent.column() != 0:
                return QModelIndex()
            p = self.nodes.get(parent.internalId(), self.root)
        else:
            p = self.root
        if row < 0 or column < 0 or column > LAST_COL or row >= len(p.children):
            return QModelIndex()
        return self.createIndex(row, column, p.children[row].id)

    def parent(self, index: AnyIndex = QModelIndex()) -> QModelIndex:  # type: ignore[override]  # noqa: B008
        if not index.isValid():
            return QModelIndex()
        node = self.nodes.get(index.internalId())
        if node is None or node.parent is None or node.parent is self.root:
            return QModelIndex()
        p = node.parent
        return self.createIndex(p.row, 0, p.id)

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008, N802
        if not parent.isValid():
            return len(self.root.children)
        if parent.column() != 0:
            return 0
        node = self.nodes.get(parent.internalId())
        return len(node.children) if node is not None else 0

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008, N802
        return len(COLUMNS)

    def hasChildren(self, parent: AnyIndex = QModelIndex()) -> bool:  # noqa: B008, N802
        return self.rowCount(parent) > 0

    def headerData(  # noqa: N802
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section <= LAST_COL:
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section][0]
            if role == Qt.ItemDataRole.ToolTipRole and section == COL["on_error"]:
                return "On error: continue or abort (boxes)"
        return None

    def flags(self, index: AnyIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return _ROOT
        if index.column() != 0 or self.read_only:
            return _ROW
        node = self.nodes.get(index.internalId())
        return _BOX_NAME if node is not None and node.is_box else _NAME

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        # A view asks for about ten roles of every cell it paints: the others end here.
        if role not in _ROLES or not index.isValid():
            return None
        node = self.nodes.get(index.internalId())
        if node is None:
            return None
        view, col = node.view, index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if node.display is None:
                node.display = [_display(view, key) for _, key in COLUMNS]
            return node.display[col]
        key = COLUMNS[col][1]
        if role == Qt.ItemDataRole.EditRole:
            return node.name if col == 0 else _display(view, key)
        if role == Qt.ItemDataRole.DecorationRole:
            return self._decoration(node, key)
        if role == Qt.ItemDataRole.FontRole:
            return _font(bool(view.get("active")), node.id in self.pending)
        if role == Qt.ItemDataRole.ToolTipRole:
            return _tooltip(node, key)
        if role == Qt.ItemDataRole.BackgroundRole:
            # A job in a run stands out in the Name column (the icon carries a badge too).
            return _BUSY_BACKGROUND.get(str(view.get("state"))) if col == 0 else None
        if role == Qt.ItemDataRole.ForegroundRole:
            if key in ("exit_status", "name") and (view.get("exit_status") or 0) != 0:
                return _brush("#b00020")
            if key == "state" and view.get("state") != "idle":
                return _brush("#00639b")
            return None
        if role == JobIdRole:
            return node.id
        if role == ViewRole:
            return view
        if role == PendingRole:
            return node.id in self.pending
        return None

    def _decoration(self, node: JobNode, key: str) -> Any:
        view = node.view
        if key == "name":
            error = (view.get("exit_status") or 0) != 0
            busy = str(view.get("state") or "idle")
            if not node.is_box:
                return icons.task(error=error, busy=busy)
            return icons.box(
                timed=view.get("box_type") == "timed",
                expanded=node.id in self.expanded,
                error=error,
                busy=busy,
            )
        if key == "on_error" and node.is_box:
            return icons.on_error(view.get("on_error") == "continue")
        if key == "timer" and view.get("timer"):
            return icons.script()
        if key == "command" and view.get("command"):
            return icons.script()
        return None

    def setData(self, index: AnyIndex, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        """An edit of the name in place: asks for the rename; the row changes when it is done."""
        if role != Qt.ItemDataRole.EditRole or not index.isValid() or index.column() != 0:
            return False
        node = self.node(index)
        name = str(value).strip()
        if node is self.root or not name or name == node.name:
            return False
        self.rename_requested.emit(node.id, name)
        return False

    # ------------------------------------------------------------ drag and drop

    def supportedDropActions(self) -> Qt.DropAction:  # noqa: N802
        return Qt.DropAction.MoveAction

    def supportedDragActions(self) -> Qt.DropAction:  # noqa: N802
        return Qt.DropAction.MoveAction

    def mimeTypes(self) -> list[str]:  # noqa: N802
        return [MIME_TYPE]

    def mimeData(self, indexes: Sequence[QModelIndex]) -> QMimeData:  # noqa: N802
        ids: list[int] = []
        for index in indexes:
            node = self.node(index)
            if node is not self.root and node.id not in ids:
                ids.append(node.id)
        data = QMimeData()
        data.setData(MIME_TYPE, json.dumps(ids).encode())
        return data

    def canDropMimeData(  # noqa: N802
        self, data: QMimeData, action: Qt.DropAction, row: int, column: int, parent: AnyIndex
    ) -> bool:
        if not data.hasFormat(MIME_TYPE) or action != Qt.DropAction.MoveAction:
            return False
        target = self.node(parent)
        if target is not self.root and not target.is_box:
            return False
        ids = _ids(data)
        # Not into itself or one of its own descendants.
        ancestors = {target.id}
        walker = target.parent
        while walker is not None:
            ancestors.add(walker.id)
            walker = walker.parent
        return bool(ids) and not ancestors.intersection(ids)

    def dropMimeData(  # noqa: N802
        self, data: QMimeData, action: Qt.DropAction, row: int, column: int, parent: AnyIndex
    ) -> bool:
        """Asks for the move; returns False so the view removes nothing itself."""
        if not self.canDropMimeData(data, action, row, column, parent):
            return False
        target = self.node(parent)
        self.move_requested.emit(_ids(data), None if target is self.root else target.id, row)
        return False

    # ------------------------------------------------------------ changing

    def set_expanded(self, job_id: int, expanded: bool) -> None:
        if expanded:
            self.expanded.add(job_id)
        else:
            self.expanded.discard(job_id)
        index = self.index_of(job_id)
        if index.isValid():
            self.dataChanged.emit(index, index, [Qt.ItemDataRole.DecorationRole])

    def set_pending(self, job_ids: Iterable[int]) -> None:
        """Which jobs have changes not applied yet (their rows are shown in italics)."""
        new = set(job_ids)
        touched = new.symmetric_difference(self.pending)
        self.pending = new
        for job_id in touched:
            self._row_changed(job_id)

    def load(self, seq: int, views: Sequence[Mapping[str, Any]]) -> None:
        """Replace everything with a snapshot (views in tree order, parents first)."""
        self.beginResetModel()
        self.seq = seq
        self.root = JobNode(0)
        self.nodes = {}
        for raw in views:
            view = dict(raw)
            node = JobNode(int(view["id"]), view)
            self.nodes[node.id] = node
        for node in self.nodes.values():
            parent = self.nodes.get(node.view.get("parent") or 0, self.root)
            node.parent = parent
            parent.children.append(node)
        for node in self.root.walk():
            node.children.sort(key=lambda n: n.key)
            _renumber(node.children)
        self.expanded &= self.nodes.keys()
        self.pending &= self.nodes.keys()
        self._unordered.clear()
        self.endResetModel()
        self.changed.emit()

    def apply(self, events: Iterable[Event], *, order: bool = True) -> None:
        """Apply events in order (the client side of ``jobcontrol.service.eventlog``'s contract).

        With ``order=False`` rows whose place changed stay where they are until
        ``put_in_order`` (the window paces it: each re-order lays the view out again).
        """
        for event in events:
            data = event.data if isinstance(event.data, dict) else {}
            kind = event.type
            if kind in ("job.created", "job.modified", "schedule.changed"):
                views = sorted(data.get("jobs", ()), key=lambda v: v.get("depth", 0))
                for view in views:
                    self.upsert(view)
            elif kind in ("run.started", "run.finished"):
                if data.get("job"):
                    self.upsert(data["job"])
            elif kind == "state.changed":
                self._set_state(data)
            elif kind == "job.deleted":
                for job_id in data.get("ids", ()):
                    self.remove(int(job_id))
            if event.seq is not None:
                self.seq = event.seq
        if order:
            self.put_in_order()
        self.changed.emit()

    def _set_state(self, data: Mapping[str, Any]) -> None:
        node = self.nodes.get(data.get("id") or 0)
        if node is None:
            return
        view = dict(node.view)
        view.update(state=data.get("state"), started=data.get("started"))
        node.view = view  # neither changes the order
        node.display = None
        self._row_changed(node.id)

    def upsert(self, raw: Mapping[str, Any]) -> None:
        """A job's new view: insert it, or change it in place (its order is put right later)."""
        view = dict(raw)
        job_id = int(view["id"])
        node = self.nodes.get(job_id)
        parent = self.nodes.get(view.get("parent") or 0, self.root)
        if node is None:
            node = JobNode(job_id, view)
            pos = self._place(parent, node)
            self.beginInsertRows(self._index(parent), pos, pos)
            node.parent = parent
            parent.children.insert(pos, node)
            _renumber(parent.children, pos)
            self.nodes[job_id] = node
            self.endInsertRows()
            return
        if view == node.view:
            return
        old_key = node.key
        node.set_view(view)
        old_parent = node.parent or self.root
        if old_parent is parent:
            if node.key != old_key and not _in_place(parent.children, node.row, node.key):
                self._unordered[parent.id] = parent
            self._row_changed(job_id)
            return
        # Another box: moved now, at its place there (rare: a drop, an edit).
        pos = self._place(parent, node)
        src_row = node.row
        if not self.beginMoveRows(
            self._index(old_parent), src_row, src_row, self._index(parent), pos
        ):
            log.error("model move of job %s refused by Qt; reloading", job_id)
            self._rebuild()
            return
        old_parent.children.pop(src_row)
        _renumber(old_parent.children, src_row)
        parent.children.insert(pos, node)
        node.parent = parent
        _renumber(parent.children, pos)
        self.endMoveRows()
        self._row_changed(job_id)

    def _place(self, parent: JobNode, node: JobNode) -> int:
        """Where ``node`` goes among ``parent``'s children (ordered, or about to be put in order)."""
        if parent.id in self._unordered:
            return len(parent.children)
        return bisect.bisect_left([c.key for c in parent.children], node.key)

    @property
    def unordered(self) -> bool:
        """Whether some level waits for ``put_in_order``."""
        return bool(self._unordered)

    def put_in_order(self) -> None:
        """Sort the levels whose order an event changed: one layout change for all of them."""
        moved: list[tuple[JobNode, list[JobNode]]] = []
        for parent in self._unordered.values():
            if parent is not self.root and parent.id not in self.nodes:
                continue  # deleted meanwhile
            ordered = sorted(parent.children, key=lambda n: n.key)
            if any(a is not b for a, b in zip(ordered, parent.children, strict=True)):
                moved.append((parent, ordered))
        self._unordered.clear()
        if not moved:
            return
        # (PySide emits the layout signals only without their optional parents and hint.)
        self.layoutAboutToBeChanged.emit()
        before = self.persistentIndexList()
        for parent, ordered in moved:
            parent.children = ordered
            _renumber(ordered)
        after = []
        for index in before:
            node = self.nodes.get(index.internalId())
            after.append(
                self.createIndex(node.row, index.column(), node.id) if node else QModelIndex()
            )
        self.changePersistentIndexList(before, after)
        self.layoutChanged.emit()

    def remove(self, job_id: int) -> None:
        node = self.nodes.get(job_id)
        if node is None:
            return
        parent = node.parent or self.root
        row = node.row
        self.beginRemoveRows(self._index(parent), row, row)
        parent.children.pop(row)
        _renumber(parent.children, row)
        for gone in node.walk():
            self.nodes.pop(gone.id, None)
            self.expanded.discard(gone.id)
            self.pending.discard(gone.id)
        node.parent = None
        self.endRemoveRows()

    # ------------------------------------------------------------ helpers

    def _index(self, node: JobNode) -> QModelIndex:
        if node is self.root:
            return QModelIndex()
        return self.createIndex(node.row, 0, node.id)

    def _row_changed(self, job_id: int) -> None:
        node = self.nodes.get(job_id)
        if node is None:
            return
        self.dataChanged.emit(
            self.createIndex(node.row, 0, node.id), self.createIndex(node.row, LAST_COL, node.id)
        )

    def _rebuild(self) -> None:
        views = [n.view for n in self.root.walk() if n is not self.root]
        self.load(self.seq or 0, views)


_ROLES = frozenset(
    {
        Qt.ItemDataRole.DisplayRole,
        Qt.ItemDataRole.EditRole,
        Qt.ItemDataRole.DecorationRole,
        Qt.ItemDataRole.FontRole,
        Qt.ItemDataRole.ToolTipRole,
        Qt.ItemDataRole.ForegroundRole,
        Qt.ItemDataRole.BackgroundRole,
        JobIdRole,
        ViewRole,
        PendingRole,
    }
)


@functools.cache
def _font(bold: bool, italic: bool) -> QFont:
    font = QFont()
    font.setBold(bold)
    font.setItalic(italic)
    return font


@functools.cache
def _brush(color: str) -> QBrush:
    return QBrush(QColor(color))


# The Name cell's background while the job is in a run: green running, amber waiting.
_BUSY_BACKGROUND = {"running": _brush("#c8ecd0"), "waiting": _brush("#ffe7b3")}


def _in_place(siblings: list[JobNode], row: int, key: tuple[Any, ...]) -> bool:
    if row > 0 and siblings[row - 1].key > key:
        return False
    return not (row + 1 < len(siblings) and siblings[row + 1].key < key)


def _ids(data: QMimeData) -> list[int]:
    try:
        value = json.loads(bytes(data.data(MIME_TYPE).data()).decode())
    except ValueError:
        return []
    return [int(v) for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _display(view: Mapping[str, Any], key: str) -> Any:
    value = view.get(key)
    if key in ("started", "last_ran", "next_runs"):
        return format_time(parse_time(value))
    if key == "last_duration_ms":
        return format_duration(value)
    if key == "state":
        return str(value or "").capitalize()
    if key == "on_error":
        return None  # an icon only
    if key in ("timer", "command"):
        return (value or "").splitlines()[0] if value else ""
    if key == "exit_status":
        return "" if value is None or view.get("last_ran") is None else str(value)
    if key == "job_order":
        return str(value) if value is not None else ""
    return "" if value is None else str(value)


def _tooltip(node: JobNode, key: str) -> str | None:
    view = node.view
    if key == "name":
        kind = f"{view.get('box_type') or ''} box".strip() if node.is_box else "task"
        active = "active" if view.get("active") else "inactive"
        return f"{node.name}: {kind}, {active}, {view.get('state')}"
    if key == "on_error" and node.is_box:
        return "continues on error" if view.get("on_error") == "continue" else "aborts on error"
    if key in ("timer", "command") and view.get(key):
        return f"{view[key]}\n(click the magnifier or press F4 to edit)"
    return None
