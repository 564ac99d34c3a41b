"""Connecting: the local daemon and its token found by themselves, refusals shown in the dialog,
and the live tree as Qt's model tester sees it; keyboard use of the tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from jobcontrol.client import Client
from jobcontrol_admin.connection import ConnectionDialog, find
from jobcontrol_admin.window import MainWindow
from tests.acceptance.harness import write
from tests.gui.conftest import WAIT_MS, AdminDaemon

pytestmark = pytest.mark.timeout(120)


def test_the_local_daemon_and_its_token_are_found_by_themselves(
    admin_daemon: AdminDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOBCONTROL_URL", raising=False)
    monkeypatch.delenv("JOBCONTROL_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(admin_daemon.jc.base / "home" / ".config"))
    # The database as a user names it: a plain path (the daemon's files go by its URL).
    path = admin_daemon.jc.url.removeprefix("sqlite:///")
    assert path != admin_daemon.jc.url
    found = find(db=path, state_dir=admin_daemon.jc.state_dir)
    assert found.url is not None
    assert found.url.startswith(admin_daemon.url)
    assert "URL file" in found.url_source
    assert found.token == admin_daemon.token
    assert "token file" in found.token_source


def test_nothing_found_says_what_to_enter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBCONTROL_URL", raising=False)
    monkeypatch.delenv("JOBCONTROL_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    found = find(db=str(tmp_path / "none.db"), state_dir=tmp_path / "state")
    assert found.url is None
    assert "enter its URL" in found.url_source
    assert found.token is None


def test_the_dialog_connects_and_shows_a_refusal_without_closing(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    found = find(url=admin_daemon.url, token="jc_wrong")
    dialog = ConnectionDialog(found)
    qtbot.addWidget(dialog)
    dialog.show()
    assert dialog.url.text() == admin_daemon.url
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: "Cannot connect" in dialog.message.text(), timeout=WAIT_MS)
    assert "unknown or revoked token" in dialog.message.text()
    assert dialog.isVisible()
    assert dialog.session is None

    dialog.url.setText("http://127.0.0.1:1")  # nothing listens there
    dialog.token.setText(admin_daemon.token)
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: "cannot reach" in dialog.message.text(), timeout=WAIT_MS)
    assert dialog.isVisible()

    # host:port as typed, without the scheme: http is meant.
    bare = admin_daemon.url.removeprefix("http://")
    assert bare != admin_daemon.url
    dialog.url.setText(bare)
    with qtbot.waitSignal(dialog.accepted, timeout=WAIT_MS):
        dialog.connect_button.click()
    assert dialog.url.text() == admin_daemon.url
    assert dialog.session is not None
    assert dialog.daemon_status["tree_state"] == "idle"
    dialog.session.close()


def test_the_live_tree_passes_the_model_tester_and_is_usable_from_the_keyboard(
    qtbot: Any, qtmodeltester: Any, admin_daemon: AdminDaemon
) -> None:
    admin_daemon.load(Path(__file__).resolve().parents[2] / "testsetup" / "inq-testsetup.yaml")
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    from jobcontrol_admin.session import Session

    window.connect_to(Session(admin_daemon.url, admin_daemon.token))
    qtbot.waitUntil(lambda: len(window.model.nodes) > 5, timeout=WAIT_MS)
    qtmodeltester.check(window.model, force_py=True)

    # Down arrow moves the current row; F2 opens the name for editing in place.
    view = window.view
    view.setFocus()
    view.setCurrentIndex(window.view.model().index(0, 0))
    first = window.current_id()
    qtbot.keyClick(view, Qt.Key.Key_Down)
    assert window.current_id() not in (None, first)
    qtbot.keyClick(view, Qt.Key.Key_F2)
    assert view.state() == view.State.EditingState
    qtbot.keyClick(view.focusWidget(), Qt.Key.Key_Escape)
    assert view.state() != view.State.EditingState

    # Changes made elsewhere stream in while the tester watches every signal.
    with Client(admin_daemon.url, admin_daemon.token) as client:
        names = [j["name"] for j in client.tree()["jobs"]]
        client.create_job("extra", "task", command="true")
        client.activate(names)
        client.delete([names[0]])
    qtbot.waitUntil(lambda: window.model.find(names[0]) is None, timeout=WAIT_MS)
    assert window.model.find("extra") is not None
    window.close()


def test_a_loaded_definition_file_appears_without_a_reload(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    from jobcontrol_admin.session import Session

    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    window.connect_to(Session(admin_daemon.url, admin_daemon.token))
    qtbot.waitUntil(lambda: window.connection_state == "live", timeout=WAIT_MS)
    text = "jobs:\n  - name: Box\n    children:\n      - name: inner\n        command: 'true'\n"
    admin_daemon.load(write(admin_daemon.jc.base / "defs.yaml", text))
    qtbot.waitUntil(lambda: window.model.find("inner") is not None, timeout=WAIT_MS)
    inner = window.model.find("inner")
    assert inner is not None
    assert inner.parent is not None
    assert inner.parent.name == "Box"
    window.close()
