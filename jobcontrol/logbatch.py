"""Log lines written together: a thread's lines held until the end of a block.

The dispatcher writes a few INFO lines per tree run once its transaction has
committed (``Tx.log``). A stream handler writes and flushes each line on its own:
one ``write`` system call per line, each letting go of the interpreter lock and
waiting to take it back behind the other threads. With 500 trees every second
that was an eighth of the dispatcher thread's time (bench/README.md). Inside
``held()`` the lines a thread logs through a ``HoldingStreamHandler`` are
formatted at once, as usual, and written with one call when the block ends, in
the order they were logged. Other threads' lines are not held.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TextIO


class HoldingStreamHandler(logging.StreamHandler[TextIO]):
    """A ``StreamHandler`` that holds the lines of a thread inside ``held()``."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        lines: list[str] | None = getattr(self._local, "lines", None)
        if lines is None:
            super().emit(record)
            return
        try:
            lines.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)

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
        try:
            with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
                self.stream.write(text)
                self.flush()
        except Exception:
            # What logging does with a line it cannot write: report on stderr, go on.
            self.handleError(logging.makeLogRecord({"msg": text.rstrip("\n")}))


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
