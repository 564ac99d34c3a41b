"""The main window while the daemon's database is away: a real daemon on a PostgreSQL
server of this module's own, stopped (``pg_ctl stop -m fast``) and started again.

The operator sees the outage in the status bar, from the event stream, while the
window stays connected to the daemon (which stays up); it goes when the database
answers again. A window opened during the outage says so from the daemon's status,
and shows the jobs as the database last left them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcontrol.client import Client
from tests.acceptance.harness import JobControl, describe, write
from tests.gui.conftest import WAIT_MS, open_window
from tests.pgserver import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

TICKER = """\
jobs:
  - name: Ticker
    timer: every 1s
    active: true
    children:
      - {name: tick, active: true, command: "true"}
"""
OUTAGE_MS = 30_000  # the daemon meets the outage at its next tick (1 s), or a beat


@pytest.fixture
def daemon(own_server: PostgresServer, tmp_path: Path) -> Iterator[tuple[str, str, JobControl]]:
    """A daemon with a ticking tree on its own database: (API base URL, token, its CLI)."""
    own_server.create_database("gui_outage")
    jc = JobControl(own_server.url("gui_outage"), tmp_path / "user")
    try:
        jc.upgraded().load(write(tmp_path / "ticker.yaml", TICKER))
        jc.ok("daemon", "start")
        status = jc.ok("daemon", "status")
        match = re.search(r"admin API: (\S+)/api/v1", status.stdout)
        assert match, describe(status)
        yield match.group(1), jc.token_file.read_text().strip(), jc
    finally:
        if not own_server.running:
            own_server.resume()
        problems = jc.cleanup()
        own_server.drop_database("gui_outage")
    assert not problems, "\n".join(problems)


def test_the_status_bar_says_while_the_database_is_away(
    qtbot: Any, own_server: PostgresServer, daemon: tuple[str, str, JobControl]
) -> None:
    url, token, jc = daemon
    window = open_window(qtbot, url, token)
    assert window.database_label.text() == ""

    own_server.halt()
    try:
        try:
            qtbot.waitUntil(
                lambda: window.database_label.text().startswith("Database unavailable since "),
                timeout=OUTAGE_MS,
            )
        except qtbot.TimeoutError:
            with Client(url, token) as client:
                database = client.status()["database"]
            pytest.fail(
                f"the window shows {window.database_label.text()!r}, "
                f"the daemon's status says {database}; its log:\n{jc.daemon_log()}"
            )
        tip = window.database_label.toolTip()
        assert "The daemon retries until it answers" in tip, tip
        assert window.connection_state == "live", "the daemon itself stays up"
        # A window opened once the dispatcher itself waits for the database learns the
        # outage from the daemon's status, and still shows the jobs.
        with Client(url, token) as client:
            qtbot.waitUntil(
                lambda: not client.status()["database"]["parts"]["dispatcher"]["ok"],
                timeout=OUTAGE_MS,
            )
        late = open_window(qtbot, url, token)
        qtbot.waitUntil(
            lambda: late.database_label.text().startswith("Database unavailable since "),
            timeout=WAIT_MS,
        )
        assert late.model.find("Ticker") is not None, "the late window shows the jobs"
        assert late.model.find("tick") is not None
        late.close()
        # A job selected now: its runs live in the database. The history says they were
        # not read, and why, in place of a dialog at each job selected.
        history = window.history
        assert history is not None
        tick = window.model.find("tick")
        assert tick is not None
        window.select_ids([tick.id], tick.id)
        window.view.setCurrentIndex(window.view_index(tick.id))
        qtbot.waitUntil(
            lambda: history.count_label.text().startswith("runs not read: "), timeout=WAIT_MS
        )
        assert "database" in history.count_label.text(), history.count_label.text()
        assert [b.text() for b in window.errors if b.isVisible()] == []
    finally:
        own_server.resume()

    qtbot.waitUntil(lambda: window.database_label.text() == "", timeout=OUTAGE_MS)
    assert window.database_label.toolTip() == ""
    # The runs are read again once it answers.
    qtbot.waitUntil(lambda: history.count_label.text().endswith(" shown"), timeout=WAIT_MS)
    assert history.model.rowCount() > 0
    window.close()
