"""Log lines written together: a thread's lines held until the end of a block.

The dispatcher writes a few INFO lines per tree run once its transaction has
committed (``Tx.log``). A stream handler writes and flushes each line on its own:
one ``write`` system call per line, each letting go of the interpreter lock and
waiting to take it back behind the other threads. With 500 trees every second
that was an eighth of the dispatcher thread's time (bench/README.md). Inside
``held()`` the lines a thread logs through a ``HoldingStreamHandler`` are
formatted at once, as usual, and written with one call when the block ends, in
the order they were logged. Other threads' lines are not held.

A line that cannot be written (the log's disk is full, its file system gone
read-only) is not reported on stderr, which is the same file under ``daemon
start``: it is counted. ``lost()`` says how many, since when and why, for
``/healthz`` and ``/metrics``; the first line written once the log takes lines
again is a WARNING that says how many were lost, between which times, and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO


@dataclass(frozen=True)
class Lost:
    """Log lines a handler could not write: ``total`` since the process started; while
    lines are being lost (``pending`` > 0), since when (``since``, epoch seconds) and
    the last error."""

    total: int
    pending: int
    since: float | None
    error: str | None


class HoldingStreamHandler(logging.StreamHandler[TextIO]):
    """A ``StreamHandler`` that holds the lines of a thread inside ``held()``."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._local = threading.local()
        self.lost_total = 0
        self._pending = 0  # lines lost since the last line written
        self._since: float | None = None
        self._error: str | None = None
        self._broken_line = False  # the last write stopped within a line

    def emit(self, record: logging.LogRecord) -> None:
        lines: list[str] | None = getattr(self._local, "lines", None)
        try:
            text = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)  # a record that cannot be formatted: logging's way
            return
        if lines is None:
            self._write(text)
        else:
            lines.append(text)

    def lost(self) -> Lost:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            return Lost(self.lost_total, self._pending, self._since, self._error)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        if getattr(self._local, "lines", None) is not None:
            yield  # held already, by an outer block
            return
        self._local.lines = []
        try:
            yield
        finally:
            lines, self._local.lines = self._local.lines, None
            if lines:
                self._write("".join(lines))

    def _write(self, text: str) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            data = self._catching_up() + text
            try:
                unwritten = self._out(data)
            except RecursionError:
                raise
            except Exception as exc:  # a stream that cannot even be asked
                unwritten = data.encode(errors="backslashreplace")
                self._error = str(exc) or type(exc).__name__
            if not unwritten:
                self._pending, self._since, self._error = 0, None, None
                self._broken_line = False
                return
            # Not reported on stderr, which is the log itself under `daemon start`:
            # counted, and said once the log takes lines again.
            # The catching-up line, written first, is not one of the lines lost.
            lines = max(1, min(unwritten.count(b"\n"), text.count("\n")))
            self.lost_total += lines
            self._pending += lines
            self._since = self._since or time.time()

    def _out(self, text: str) -> bytes:
        """Write ``text`` whole; what could not be written (empty: all was).

        To the stream's file descriptor, past the stream's buffer: a line the disk has no
        room for is then dropped now, not kept in the buffer to come out later, after
        the line that says it was lost. A stream with no descriptor is written to as is.
        """
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.stream.write(text)
            self.flush()
            return b""
        self.stream.flush()  # what others wrote through the stream goes first
        encoded = text.encode(getattr(self.stream, "encoding", None) or "utf-8", "backslashreplace")
        view = memoryview(encoded)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except OSError as exc:
                # A line cut short by the full disk is ended by the next line written.
                if len(view) < len(encoded):
                    self._broken_line = True
                self._error = exc.strerror or str(exc)
                return bytes(view)
        return b""

    def _catching_up(self) -> str:
        """The WARNING line that says what was lost, before the next line written."""
        if not self._pending or self._since is None:
            return ""
        began = datetime.fromtimestamp(self._since, UTC).astimezone().isoformat(timespec="seconds")
        record = logging.makeLogRecord(
            {
                "name": __name__,
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": "%d log lines could not be written, from %s until now: %s",
                "args": (self._pending, began, self._error),
            }
        )
        return ("\n" if self._broken_line else "") + self.format(record) + self.terminator


def lost() -> Lost | None:
    """What the root logger's holding handler (the daemon's log) could not write; None
    when there is no such handler (not a daemon's process)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, HoldingStreamHandler):
            return handler.lost()
    return None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold this thread's lines on the root logger's holding handlers until the end."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, HoldingStreamHandler)]
    if not handlers:
        yield
        return
    with contextlib.ExitStack() as stack:
        for handler in handlers:
            stack.enter_context(handler.holding())
        yield
