"""Word from the kernel that a SQLite database's files were written, by any process.

An idle worker on SQLite used to re-read the lane table (or compare ``PRAGMA
data_version``) every lane poll interval, 2 s by default, only to notice a lane that
another process changed behind the daemon's back. On this project's machines a
wake-up after a quiet spell costs milliseconds of CPU however little it does, and
those reads were four wake-ups in five of an idle daemon (bench/README.md, thirteenth
round). A ``ChangeWatch`` (inotify on the database's files and its directory) lets the
worker sleep until a file of the database is written instead: whoever writes it, a
commit appends to the WAL (or, without one, rewrites the database file), and the kernel
says so. The worker then compares ``data_version`` as before, at most once a poll
interval.

The watch only ever says "look": it never says what changed, so losing none of its
events is not needed for correctness, only for timeliness, and a queue overflow counts
as a change. Where inotify cannot be had (a limit reached, no inotify) the constructor
raises ``OSError`` and the worker polls as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

# From <sys/inotify.h>.
IN_MODIFY = 0x002
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
# A file of the database: written, or gone (SQLite removes its WAL when the last
# connection closes). Its directory: only a file of the database (re)created in it,
# since other files there (the daemon's log) are written all the time.
_FILE_MASK = IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF
_DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ = 64 * 1024

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the C library this interpreter uses
    return _libc


class ChangeWatch:
    """Readable (``fileno``) once a file of the database at ``db_file`` was written."""

    def __init__(self, db_file: str | os.PathLike[str]) -> None:
        path = Path(db_file).resolve()
        self.directory = path.parent
        # The database and its companions: -wal, -journal (-shm is written through a
        # mapping, which inotify does not see, and only says who reads).
        self._names = (path.name, f"{path.name}-wal", f"{path.name}-journal")
        self._files: set[int] = set()  # the files' watch descriptors
        self._fd = -1
        self.lost = False  # the directory's watch is gone: the worker polls instead
        try:
            libc = _c()
            self._add = libc.inotify_add_watch
            init = libc.inotify_init1
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"no inotify here: {exc}") from None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise _os_error(ctypes.get_errno(), "inotify_init1")
        self._fd = fd
        try:
            self._dir = self._watch(self.directory, _DIR_MASK)
            for name in self._names:
                self._watch_file(name)
        except OSError:
            self.close()
            raise

    def fileno(self) -> int:
        return self._fd

    def changed(self) -> bool:
        """Read what the kernel queued (never blocks): whether a file of the database
        was written since the last call (a lost watch or an overflow counts as one)."""
        seen = False
        while self._fd >= 0:
            try:
                data = os.read(self._fd, _READ)
            except BlockingIOError:
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = os.fsdecode(data[start : start + size].rstrip(b"\0"))
                offset = start + size
                if mask & IN_Q_OVERFLOW:
                    seen = True
                elif wd == self._dir:
                    if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                        self.lost = seen = True
                    elif name in self._names:
                        seen = True  # (re)created: written next, watched from now
                        self._watch_file(name)
                elif wd in self._files:
                    seen = True
                    if mask & IN_IGNORED:  # removed: watched again if it comes back
                        self._files.discard(wd)
        return seen

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _watch(self, path: Path, mask: int) -> int:
        wd = int(self._add(self._fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise _os_error(code, f"inotify_add_watch {path}")
        return wd

    def _watch_file(self, name: str) -> None:
        try:
            self._files.add(self._watch(self.directory / name, _FILE_MASK))
        except FileNotFoundError:
            pass  # not there (yet): the directory's watch says when it is


def _os_error(code: int, what: str) -> OSError:
    if code == errno.ENOENT:
        return FileNotFoundError(code, f"{what}: {os.strerror(code)}")
    return OSError(code, f"{what}: {os.strerror(code)}")
