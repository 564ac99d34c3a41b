"""The tree model on its own: Qt's model tester, the daemon's order, events applied in place."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt

from jobcontrol.client import Event
from jobcontrol_admin.model import COL, JobIdRole, JobTreeModel


def view(job_id: int, name: str, parent: int | None = None, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": job_id,
        "name": name,
        "parent": parent,
        "depth": 0,
        "kind": "box" if fields.pop("box", False) else "task",
        "active": False,
        "state": "idle",
        "started": None,
        "last_ran": None,
        "last_duration_ms": None,
        "exit_status": 0,
        "next_runs": None,
        "timer": None,
        "command": "true",
        "on_error": "continue",
        "box_type": None,
        "job_order": 0,
        "version": 1,
    }
    if base["kind"] == "box":
        base.update(command=None, box_type="sequence")
    base.update(fields)
    return base


def names(model: JobTreeModel, parent: QModelIndex | None = None) -> list[str]:
    parent = parent or QModelIndex()
    return [model.index(r, 0, parent).data() for r in range(model.rowCount(parent))]


@pytest.fixture
def model(qtmodeltester: Any) -> JobTreeModel:
    m = JobTreeModel()
    m.load(
        5,
        [
            view(1, "Nightly", box=True, next_runs="2026-11-23T02:00:00+00:00"),
            view(2, "extract", 1, job_order=0),
            view(3, "load", 1, job_order=1),
            view(4, "Hourly", box=True, next_runs="2026-11-22T15:00:00+00:00"),
            view(5, "ping", 4),
            view(6, "adhoc", job_order=0),
        ],
    )
    qtmodeltester.check(m, force_py=True)
    return m


def test_each_level_is_ordered_by_next_runs_then_job_order(model: JobTreeModel) -> None:
    # Hourly fires first, Nightly next; adhoc has no next run, so it comes last.
    assert names(model) == ["Hourly", "Nightly", "adhoc"]
    nightly = model.index(1, 0)
    assert names(model, nightly) == ["extract", "load"]


def test_events_change_rows_in_place_and_move_them_when_their_place_changes(
    model: JobTreeModel,
) -> None:
    # The model tester of the fixture stays connected: it checks every change below.
    extract = QPersistentModelIndex(model.index_of(2))
    model.apply(
        [
            Event(
                6,
                "state.changed",
                {
                    "id": 2,
                    "name": "extract",
                    "state": "running",
                    "started": "2026-11-22T14:00:00+00:00",
                    "run_id": 9,
                },
            ),
            # Nightly now fires before Hourly: it moves up, its children with it.
            Event(
                7,
                "schedule.changed",
                {
                    "id": 1,
                    "name": "Nightly",
                    "next_runs": "2026-11-22T14:30:00+00:00",
                    "jobs": [view(1, "Nightly", box=True, next_runs="2026-11-22T14:30:00+00:00")],
                },
            ),
            Event(8, "job.modified", {"jobs": [view(3, "load", 1, job_order=-1, version=2)]}),
        ]
    )
    assert names(model) == ["Nightly", "Hourly", "adhoc"]
    assert names(model, model.index(0, 0)) == ["load", "extract"]
    assert extract.isValid()
    assert extract.data(JobIdRole) == 2
    state = model.index(extract.row(), COL["state"], extract.parent())
    assert state.data() == "Running"
    assert model.seq == 8


def test_created_moved_and_deleted_jobs(model: JobTreeModel) -> None:
    model.apply(
        [
            Event(6, "job.created", {"jobs": [view(7, "Weekly", box=True), view(8, "report", 7)]}),
            Event(7, "job.modified", {"jobs": [view(6, "adhoc", 4, job_order=5)]}),
            Event(8, "job.deleted", {"ids": [1]}),
        ]
    )
    assert names(model) == ["Hourly", "Weekly"]
    assert names(model, model.index(0, 0)) == ["ping", "adhoc"]
    assert names(model, model.index(1, 0)) == ["report"]
    assert set(model.nodes) == {4, 5, 6, 7, 8}


def test_active_rows_are_bold_and_boxes_show_their_on_error_icon(model: JobTreeModel) -> None:
    model.apply([Event(6, "job.modified", {"jobs": [view(6, "adhoc", active=True, version=2)]})])
    adhoc = model.index_of(6)
    assert adhoc.data(Qt.ItemDataRole.FontRole).bold()
    assert not model.index_of(5).data(Qt.ItemDataRole.FontRole).bold()
    assert model.index_of(1, COL["on_error"]).data(Qt.ItemDataRole.DecorationRole) is not None
    assert model.index_of(5, COL["on_error"]).data(Qt.ItemDataRole.DecorationRole) is None


def test_an_edit_in_place_asks_for_a_rename_and_changes_nothing_itself(
    model: JobTreeModel, qtbot: Any
) -> None:
    with qtbot.waitSignal(model.rename_requested, timeout=1000) as asked:
        assert not model.setData(model.index_of(5), "pong")
    assert asked.args == [5, "pong"]
    assert model.index_of(5).data() == "ping"
