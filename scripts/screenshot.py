"""Take the screenshot of the admin window on a live daemon (run by scripts/screenshot.sh).

Opens ``MainWindow``, connects it to the daemon at ``--url`` with the token in
``--token-file``, and waits (by polling the window's model from a QTimer in
the Qt event loop, bounded by ``--timeout``) until the tree is loaded and a job
is running. It then selects that job (a task if one runs, the longest-running
one preferred), expands the whole tree, waits (bounded) until the history dock
shows the job's runs and the log of the running run, and saves
``window.grab()`` to ``--out`` as PNG (when the job ended meanwhile, it waits
for the next run). Exit status 0 on success, 1 when a wait ran out (nothing is
saved then).

Needs a display: scripts/screenshot.sh runs it under ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from jobcontrol_admin.history import is_live
from jobcontrol_admin.model import JobNode
from jobcontrol_admin.session import Session
from jobcontrol_admin.window import MainWindow

POLL_MS = 100
PREFERRED = ("foo",)  # testsetup/demo.yaml: `ls -l && sleep 6`, every 20 s: runs the longest


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> bool:
    """Run the Qt event loop until ``condition()`` holds (checked every POLL_MS) or timeout."""
    if condition():
        return True
    loop = QEventLoop()
    deadline = time.monotonic() + timeout
    outcome = {"ok": False}

    def check() -> None:
        if condition():
            outcome["ok"] = True
            loop.quit()
        elif time.monotonic() >= deadline:
            loop.quit()

    timer = QTimer()
    timer.setInterval(POLL_MS)
    timer.timeout.connect(check)
    timer.start()
    loop.exec()
    timer.stop()
    if not outcome["ok"]:
        print(f"screenshot: gave up waiting for {what} after {timeout:g} s", file=sys.stderr)
    return outcome["ok"]


def running_job(window: MainWindow) -> JobNode | None:
    """The running job to show: a preferred one when the tree has it, else a task, else any."""
    nodes = window.model.nodes.values()
    preferred = [n for n in nodes if n.name in PREFERRED]
    busy = [n for n in (preferred or nodes) if n.view.get("state") == "running"]
    tasks = [n for n in busy if not n.is_box]
    return (tasks or busy or [None])[0]


def is_running(window: MainWindow, job_id: int) -> bool:
    node = window.model.nodes.get(job_id)
    return node is not None and node.view.get("state") == "running"


def show_running(window: MainWindow, deadline: float) -> JobNode | None:
    """Select a running job with its live run and log shown; None when the time ran out."""
    history = window.history
    assert history is not None
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not wait_for(
            "a running job", lambda: running_job(window) is not None, left
        ):
            return None
        node = running_job(window)
        assert node is not None
        window.view.expandAll()
        window.select_ids([node.id], node.id)
        window.view.scrollTo(window.view_index(node.id))
        # Its runs, the newest being the live one, then that run's log.
        if wait_for(
            "the job's live run",
            lambda: history.model.rowCount() > 0 and is_live(history.model.run(0)),
            5,
        ):
            history.select_run(int(history.model.run(0)["id"]))
            wait_for("the run's log", lambda: bool(history.log_view.toPlainText().strip()), 3)
        if is_running(window, node.id):
            return node
        print(f"screenshot: {node.name} ended before the picture; waiting for another run")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--url", required=True, help="the daemon's URL (without /api/v1)")
    p.add_argument("--token-file", type=Path, required=True, help="the file holding the token")
    p.add_argument("--out", type=Path, default=Path("docs/admin-window.png"))
    p.add_argument("--jobs", type=int, default=7, help="jobs the tree must hold (demo.yaml: 7)")
    p.add_argument("--timeout", type=float, default=90.0, help="bound on waiting for a run (s)")
    p.add_argument("--width", type=int, default=None, help="default: the window's own")
    p.add_argument("--height", type=int, default=None, help="default: the window's own")
    args = p.parse_args(argv)

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Job Control")
    window = MainWindow()
    if args.width or args.height:
        window.resize(args.width or window.width(), args.height or window.height())
    window.move(0, 0)
    window.show()
    try:
        token = args.token_file.read_text().strip()
        window.connect_to(Session(args.url, token))
        if not wait_for(
            f"the tree ({args.jobs} jobs, live)",
            lambda: window.connection_state == "live" and len(window.model.nodes) >= args.jobs,
            30,
        ):
            return 1
        node = show_running(window, time.monotonic() + args.timeout)
        if node is None:
            return 1
        still = window.model.nodes.get(node.id)
        state = still.view.get("state") if still is not None else None
        for _ in range(3):
            app.processEvents()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(args.out), "PNG", 0):  # 0: smallest file
            print(f"screenshot: could not write {args.out}", file=sys.stderr)
            return 1
        running = sorted(
            n.name for n in window.model.nodes.values() if n.view.get("state") != "idle"
        )
        print(
            f"screenshot: {args.out} ({args.out.stat().st_size // 1024} KB); selected "
            f"{node.name} ({state}); not idle: {', '.join(running) or 'none'}"
        )
        return 0
    finally:
        window.close()
        window.deleteLater()
        for _ in range(3):
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            app.processEvents()


if __name__ == "__main__":
    sys.exit(main())
