"""``jobcontrol demo``: the sample trees running in the foreground on a scratch SQLite database."""

from __future__ import annotations

import getpass
import logging
import queue
import sys
import tempfile
import threading
import time
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from jobcontrol import events, filemodes
from jobcontrol.daemon import Daemon, DaemonOptions, StopSignals, configure_logging
from jobcontrol.model import JobState
from jobcontrol.service.engine import Engine
from jobcontrol.service.loader import load_definitions


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


class _Printer:
    """Signal receivers only enqueue; one thread prints, so output lines never interleave."""

    def __init__(self) -> None:
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._print, name="jc-demo-printer", daemon=True)
        self.closed = False  # once it has stopped, warnings go to stderr (``_WarningLines``)

    def _print(self) -> None:
        while (line := self.lines.get()) is not None:
            print(line, flush=True)

    def say(self, text: str) -> None:
        self.lines.put(f"{_stamp()}  {text}")

    def close(self) -> None:
        self.closed = True
        self.lines.put(None)
        self.thread.join(5)

    def on_run_started(self, _sender: Any, run: dict[str, Any]) -> None:
        self.say(f"start   {run['kind']:4} {run['job_name']!r} (run {run['id']}, {run['trigger']})")

    def on_run_finished(self, _sender: Any, run: dict[str, Any]) -> None:
        self.say(
            f"end     {run['kind']:4} {run['job_name']!r} (run {run['id']}): {run['state']}, "
            f"exit status {run['exit_status']}, {run.get('duration_ms', 0) / 1000:.1f}s"
        )

    def on_state(self, _sender: Any, name: str, state: JobState, **_: Any) -> None:
        if state is JobState.WAITING:
            self.say(f"WAITING box  {name!r} waits for its next timed child")

    def on_schedule(self, _sender: Any, name: str, next_runs: datetime | None, **_: Any) -> None:
        when = next_runs.astimezone().strftime("%H:%M:%S") if next_runs else "not scheduled"
        self.say(f"timer   tree {name!r} next runs at {when}")


class _WarningLines(logging.Handler):
    """The demo's warnings as lines of its own, stamped and in order with the runs (the
    daemon's log format is for a log file); on stderr once the printer has stopped."""

    def __init__(self, printer: _Printer) -> None:
        super().__init__(logging.WARNING)
        self.printer = printer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname.lower():7} {record.getMessage()}"
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
        except Exception:  # a record that cannot be formatted: logging's own report
            self.handleError(record)
            return
        if self.printer.closed:
            print(f"{_stamp()}  {text}", file=sys.stderr, flush=True)
        else:
            self.printer.say(text)


def run_demo(directory: Path | None, *, duration: float | None, slots: int, verbose: bool) -> int:
    tmp = None
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="jobcontrol-demo-")
        directory = Path(tmp.name)
    filemodes.make_dir(directory)  # private, like a state directory (a given one stays as it is)
    configure_logging("DEBUG" if verbose else "WARNING")
    printer = _Printer()
    if not verbose:  # -v keeps the daemon's log format: it is a debugging aid
        root = logging.getLogger()
        root.handlers.clear()
        root.addHandler(_WarningLines(printer))
    opts = DaemonOptions(
        db_url=f"sqlite:///{directory / 'demo.db'}", state_dir=directory, slots=slots, api=False
    )
    daemon = Daemon(opts)
    receivers: list[tuple[Any, Any]] = [
        (events.run_started, printer.on_run_started),
        (events.run_finished, printer.on_run_finished),
        (events.state_changed, printer.on_state),
        (events.schedule_changed, printer.on_schedule),
    ]
    for sig, fn in receivers:
        sig.connect(fn)
    stop = threading.Event()
    StopSignals(lambda _signum: stop.set()).install()  # whichever thread gets them
    printer.thread.start()
    print(
        f"Job Control demo: database {directory / 'demo.db'}, task logs in {opts.task_logs}",
        flush=True,
    )
    print(
        "Periodic fires 10 s after each run; Box aborts at 'gcc error'; Absolute waits between foo and bar."
    )
    print("Ctrl-C stops it.\n", flush=True)
    try:
        daemon.store.upgrade()
        sample = files("jobcontrol.testsetup").joinpath("demo.yaml").read_text()
        load_definitions(
            Engine(daemon.store),
            sample,
            "testsetup/demo.yaml",
            user=f"local:{getpass.getuser()}",
            replace=True,
        )
        daemon.start()
        deadline = time.monotonic() + duration if duration else None
        while not stop.wait(0.5 if deadline else 3600):
            if deadline and time.monotonic() >= deadline:
                break
        printer.say("stopping: killing what runs, waiting for it to end")
    finally:
        daemon.stop()
        for sig, fn in receivers:
            sig.disconnect(fn)
        printer.say("stopped cleanly")
        printer.close()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo(None, duration=None, slots=8, verbose=False))
