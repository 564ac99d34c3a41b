"""The filter box's model: name, state and failed-only, keeping every match's ancestors visible."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSortFilterProxyModel

from jobcontrol_admin.model import JobTreeModel

STATES = ("idle", "running", "waiting")


class JobFilter(QSortFilterProxyModel):
    """Shows the jobs that match every criterion given, with their ancestors (Qt's recursive filter)."""

    def __init__(self, source: JobTreeModel) -> None:
        super().__init__()
        self.setSourceModel(source)
        self.setRecursiveFilteringEnabled(True)
        self.setDynamicSortFilter(True)
        self._jobs = source
        self._text = ""
        self._state: str | None = None
        self._failed = False

    @property
    def active(self) -> bool:
        return bool(self._text or self._state or self._failed)

    def set_criteria(self, text: str = "", state: str | None = None, failed: bool = False) -> None:
        """Name contains ``text`` (any case), state is ``state``, the last run failed."""
        if state is not None and state not in STATES:
            raise ValueError(f"unknown state {state!r}: expected one of {', '.join(STATES)}")
        criteria = (text.strip().casefold(), state, failed)
        if criteria == (self._text, self._state, self._failed):
            return
        if hasattr(self, "endFilterChange"):  # Qt 6.10 and later
            self.beginFilterChange()
            self._text, self._state, self._failed = criteria
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self._text, self._state, self._failed = criteria
            self.invalidateRowsFilter()

    def filterAcceptsRow(  # noqa: N802
        self, source_row: int, source_parent: QModelIndex | QPersistentModelIndex
    ) -> bool:
        if not self.active:
            return True
        index = self._jobs.index(source_row, 0, source_parent)
        view = self._jobs.node(index).view
        if self._text and self._text not in str(view.get("name", "")).casefold():
            return False
        if self._state and view.get("state") != self._state:
            return False
        return not (self._failed and not (view.get("exit_status") or 0))

    def lessThan(  # noqa: N802
        self,
        left: QModelIndex | QPersistentModelIndex,
        right: QModelIndex | QPersistentModelIndex,
    ) -> bool:
        return left.row() < right.row()  # the source's order is the daemon's: keep it
