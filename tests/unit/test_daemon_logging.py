"""The daemon's log formats: text lines, or one JSON object per line."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcontrol.daemon import configure_logging
from jobcontrol.errors import JobControlError
from tests.tmpfs import tmpfs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, threading.excepthook
    # The jobcontrol loggers' own level (spec 11's setLogLevel) may have been left set by
    # an earlier test in this process; the daemon starts with it unset.
    ours = logging.getLogger("jobcontrol")
    ours_level = ours.level
    ours.setLevel(logging.NOTSET)
    srcfile, multiprocessing = logging._srcfile, logging.logMultiprocessing
    try:
        yield
    finally:
        logging._srcfile, logging.logMultiprocessing = srcfile, multiprocessing
        ours.setLevel(ours_level)
        root.handlers[:] = handlers
        root.setLevel(level)
        threading.excepthook = hook
        logging.captureWarnings(False)


def lines(stream: io.StringIO, logger: str | None = None) -> list[dict[str, object]]:
    """The JSON lines written; with ``logger``, only that logger's (threads left running by
    earlier tests in the same process may log through the root handler meanwhile)."""
    found = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [f for f in found if logger is None or f["logger"] == logger]


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_extras_and_tracebacks() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream, fmt="json")
    log = logging.getLogger("jobcontrol.test")
    log.debug("not at INFO")
    log.info("run %d of %s ended", 7, "tick", extra={"run_id": 7, "job": "tick"})
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("it failed")

    mine = lines(stream, "jobcontrol.test")
    assert len(mine) == 2, mine
    first, second = mine
    assert first["level"] == "INFO"
    assert first["logger"] == "jobcontrol.test"
    assert first["message"] == "run 7 of tick ended"
    assert (first["run_id"], first["job"]) == (7, "tick")
    assert str(first["time"]).endswith("+00:00")
    assert "exception" not in first
    assert second["level"] == "ERROR"
    assert "ValueError: boom\nsecond line" in str(second["exception"])


@pytest.mark.usefixtures("restore_logging")
def test_warnings_and_thread_deaths_go_through_the_log() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream, fmt="json")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old call", DeprecationWarning, stacklevel=1)

    def die() -> None:
        raise RuntimeError("thread died")

    thread = threading.Thread(target=die, name="jc-doomed")
    thread.start()
    thread.join()

    (warned,) = lines(stream, "py.warnings")
    (died,) = [f for f in lines(stream) if "jc-doomed" in str(f["message"])]
    assert warned["logger"] == "py.warnings"
    assert "old call" in str(warned["message"])
    assert died["level"] == "CRITICAL"
    assert died["message"] == "uncaught exception in thread jc-doomed"
    assert "RuntimeError: thread died" in str(died["exception"])


@pytest.mark.usefixtures("restore_logging")
def test_text_stays_the_default_and_an_unknown_format_is_refused() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    logging.getLogger("jobcontrol.test").warning("plain")
    (mine,) = [line for line in stream.getvalue().splitlines() if "jobcontrol.test" in line]
    assert mine.endswith(" WARNING jobcontrol.test: plain")
    with pytest.raises(JobControlError, match="--log-format 'xml' is not one of text, json"):
        configure_logging("INFO", stream, fmt="xml")


@pytest.mark.usefixtures("restore_logging")
def test_each_text_line_carries_its_own_time_to_the_millisecond() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    handler = logging.getLogger().handlers[0]
    logger = logging.getLogger("jobcontrol.test")
    # Records made at chosen instants: the same second twice, then the next one. The
    # time of day is formatted once per second; the milliseconds never are.
    instants = [(1_795_000_000, 123), (1_795_000_000, 987), (1_795_000_001, 4)]
    for second, ms in instants:
        record = logger.makeRecord("jobcontrol.test", logging.INFO, "f", 1, "at", (), None)
        record.created, record.msecs = second + ms / 1000, ms
        handler.handle(record)
    lines_ = stream.getvalue().splitlines()
    written = [line.split(" INFO ")[0] for line in lines_ if line.endswith("jobcontrol.test: at")]
    expected = [
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)) + f",{ms:03d}"
        for second, ms in instants
    ]
    assert written == expected


class CountingStream(io.StringIO):
    """A text stream that counts the writes reaching it (each one a system call on a file)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


@pytest.mark.usefixtures("restore_logging")
def test_lines_logged_inside_held_are_written_together_at_its_end() -> None:
    from jobcontrol import logbatch

    stream = CountingStream()
    configure_logging("INFO", stream)
    log = logging.getLogger("jobcontrol.test")
    other_wrote = threading.Event()

    def other_thread() -> None:
        log.info("from another thread")
        other_wrote.set()

    with logbatch.held():
        log.info("Running Task %s", "t1")
        with logbatch.held():  # nested: still one write, at the outer end
            log.info("Job %s completed exit status %s", "t1", 0)
        th = threading.Thread(target=other_thread)
        th.start()
        assert other_wrote.wait(10)
        th.join(10)
        # Not this thread's: written at once. This thread's: not yet.
        assert "from another thread" in stream.getvalue()
        assert "Running Task" not in stream.getvalue()
        writes = stream.writes
    assert stream.writes == writes + 1
    text = stream.getvalue().splitlines()
    mine = [line for line in text if "jobcontrol.test" in line]
    assert [m.split(": ", 1)[1] for m in mine] == [
        "from another thread",
        "Running Task t1",
        "Job t1 completed exit status 0",
    ]
    log.info("after the block")  # written at once again
    assert stream.writes == writes + 2


@pytest.mark.usefixtures("restore_logging")
def test_held_lines_are_written_when_the_block_raises_and_a_bad_line_is_reported() -> None:
    from jobcontrol import logbatch

    stream = CountingStream()
    configure_logging("INFO", stream)
    log = logging.getLogger("jobcontrol.test")

    def handle() -> None:
        with logbatch.held():
            log.info("before the failure")
            log.info("a bad line %d", "not a number")  # formatting fails: reported, not raised
            raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        handle()
    mine = [line for line in stream.getvalue().splitlines() if "jobcontrol.test" in line]
    assert [m.split(": ", 1)[1] for m in mine] == ["before the failure"]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted after the test."""
    with tmpfs(tmp_path / "tiny", "64k") as mount:
        yield mount


@pytest.mark.usefixtures("restore_logging")
def test_lines_a_full_disk_drops_are_counted_and_said_once_it_has_room(tiny_tmpfs: Path) -> None:
    from jobcontrol import logbatch

    with open(tiny_tmpfs / "daemon.log", "w", encoding="utf-8") as out:
        configure_logging("INFO", out)
        log = logging.getLogger("jobcontrol.test")
        log.info("before")
        assert logbatch.lost() == logbatch.Lost(0, 0, None, None)
        filler = tiny_tmpfs / "filler"
        with open(filler, "wb", buffering=0) as fill, contextlib.suppress(OSError):
            while True:
                fill.write(b"\0" * 4096)
        long = "x" * 5000  # past the page the file has: each line needs room
        for n in range(3):
            log.warning("lost %d %s", n, long)
        with logbatch.held():  # lines written together are counted one by one
            log.info("lost 3 %s", long)
            log.info("lost 4 %s", long)
        lost = logbatch.lost()
        assert lost is not None
        assert (lost.total, lost.pending) == (5, 5), lost
        assert lost.since is not None
        assert lost.error == "No space left on device", lost

        filler.unlink()
        log.info("after")
        lost = logbatch.lost()
        assert lost == logbatch.Lost(5, 0, None, None), lost
    written = (tiny_tmpfs / "daemon.log").read_text().splitlines()
    said = [line.split(": ", 1)[1] for line in written]
    assert said[0] == "before", said
    # The first lost line was cut short where the file's last page ended: the line
    # written next starts a line of its own all the same.
    assert said[1].startswith("lost 0 xxx"), said
    assert len(said[1]) < len("lost 0 ") + len(long), said
    notice = written[2]
    assert " WARNING jobcontrol.logbatch: 5 log lines could not be written, from " in notice
    assert notice.endswith("until now: No space left on device"), notice
    assert said[3:] == ["after"], said
