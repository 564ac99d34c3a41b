"""The screenshot of the Workers & Lanes panel (run by ``scripts/screenshot.sh OUT workers``).

On the throw-away daemon of ``screenshot.sh`` (the demo trees loaded), it adds
lanes (``gpu`` capped at 2, ``etl`` drained, ``nightly``), tasks in them and
runs them, so the panel has a worker holding runs, a full lane, a queue and a
drained lane to show. It opens ``MainWindow`` on the daemon with the panel's
tab in front, waits (bounded) until the panel shows that, selects the ``gpu``
lane and a queued run, and saves ``window.grab()`` to ``--out``. Exit status 0
on success, 1 when a wait ran out (nothing is saved then).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, Qt
from PySide6.QtWidgets import QApplication
from screenshot import wait_for  # scripts/, the directory this runs from

from jobcontrol.client import Client
from jobcontrol_admin.session import Session
from jobcontrol_admin.window import MainWindow

TASKS = (
    # name, queue, priority, command
    ("train-resnet", "gpu", 5, "sleep 600"),
    ("train-bert", "gpu", 5, "sleep 600"),
    ("train-vit", "gpu", 10, "sleep 600"),
    ("train-small", "gpu", 0, "sleep 600"),
    ("export-orders", "etl", 0, "sleep 600"),
    ("export-stock", "etl", 0, "sleep 600"),
    ("reindex", "nightly", 0, "sleep 600"),
)


def stage(client: Client) -> None:
    client.add_lane("gpu", max_slots=2, poll_interval_s="1s", stale_timeout_s="2m")
    client.add_lane("etl", poll_interval_s="5s", stale_timeout_s="30m")
    client.add_lane("nightly", max_slots=4, stale_timeout_s="1h")
    client.drain_lane("etl")
    for name, queue, priority, command in TASKS:
        client.create_job(
            name, "task", active=True, command=command, queue=queue, priority=priority
        )
    for name, *_ in TASKS:
        client.run_now(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--url", required=True, help="the daemon's URL (without /api/v1)")
    p.add_argument("--token-file", type=Path, required=True, help="the file holding the token")
    p.add_argument("--out", type=Path, default=Path("docs/workers-panel.png"))
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=800)
    args = p.parse_args(argv)

    token = args.token_file.read_text().strip()
    with Client(args.url, token) as client:
        stage(client)
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Job Control")
    window = MainWindow()
    window.resize(args.width, args.height)
    window.move(0, 0)
    window.show()
    try:
        window.connect_to(Session(args.url, token))
        panel = window.workers
        assert panel is not None
        window.workers_dock.raise_()
        window.resizeDocks([window.workers_dock], [args.height * 2 // 5], Qt.Orientation.Vertical)
        if not wait_for(
            "the panel: 2 runs in gpu, its queue, the drained etl",
            lambda: panel.lanes.get("gpu", {}).get("running") == 2
            and len(panel.queue) >= 3
            and panel.lanes.get("etl", {}).get("state") == "draining",
            60,
        ):
            return 1
        window.view.expandAll()
        panel.select_lane("gpu")
        first = next((r for r in panel.queue if r.get("job") == "train-vit"), None)
        if first is not None:
            panel.select_queued_run(int(first["run_id"]))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # let the last refresh paint
            app.processEvents()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not window.grab().save(str(args.out), "PNG", 0):
            print(f"screenshot: could not write {args.out}", file=sys.stderr)
            return 1
        print(f"screenshot: {args.out} ({args.out.stat().st_size // 1024} KB)")
        return 0
    finally:
        window.close()
        window.deleteLater()
        for _ in range(3):
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            app.processEvents()


if __name__ == "__main__":
    sys.exit(main())
