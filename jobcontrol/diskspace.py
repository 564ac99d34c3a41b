"""Free space where the daemon writes: the room a task log needs, and when space is low.

A task starts only when its log's filesystem has ``LOG_ROOM`` free (a task does not
run without its log); ``/healthz`` and ``/metrics`` report the state directory and
the log root as low below a threshold (``--disk-low``: a size or a percentage).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from jobcontrol.errors import OptionError

# What a task log's filesystem must have free for the task to start.
LOG_ROOM = 64 * 1024
DEFAULT_LOW = "5%"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(%|[KMGT]?)(?:i?B)?", re.IGNORECASE)


def available(st: os.statvfs_result) -> int:
    """Bytes the daemon's user may still write: root may use the blocks kept for it."""
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks * st.f_frsize)


def require_room(fd: int, need: int = LOG_ROOM) -> None:
    """``OSError`` ENOSPC unless the filesystem of the open file ``fd`` has ``need`` bytes free."""
    free = available(os.fstatvfs(fd))
    if free < need:
        message = f"{os.strerror(errno.ENOSPC)} ({free} bytes free, a task log needs {need})"
        raise OSError(errno.ENOSPC, message)


@dataclass(frozen=True)
class LowMark:
    """When free space counts as low: below ``size`` bytes, or below ``percent`` of the size."""

    text: str
    size: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> LowMark:
        match = _SIZE.fullmatch(text.strip())
        if match is None:
            raise OptionError(
                f"--disk-low {text!r}: not a size (e.g. 500M, 2G, 1048576) or a percentage (5%)"
            )
        number, unit = float(match.group(1)), match.group(2).upper()
        if unit == "%":
            if number > 100:
                raise OptionError(f"--disk-low {text!r}: a percentage is at most 100%")
            return cls(text.strip(), percent=number)
        return cls(text.strip(), size=int(number * _UNITS[unit]))

    def threshold(self, total: int) -> int:
        if self.percent is not None:
            return int(total * self.percent / 100)
        return self.size or 0


@dataclass(frozen=True)
class DiskSpace:
    """Free space of the filesystem holding ``path`` (``error`` when it cannot be read)."""

    what: str
    path: str
    free_bytes: int | None
    total_bytes: int | None
    low_below: int | None
    error: str | None = None

    @property
    def low(self) -> bool:
        """Below the mark, or unreadable (an unknown is not reported as fine)."""
        if self.free_bytes is None or self.low_below is None:
            return True
        return self.free_bytes < self.low_below

    def as_dict(self) -> dict[str, object]:
        return {
            "what": self.what,
            "path": self.path,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "low_below_bytes": self.low_below,
            "low": self.low,
            "error": self.error,
        }

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.what} {self.path}: cannot read its free space: {self.error}"
        return f"{self.what} {self.path}: {self.free_bytes} bytes free, below {self.low_below}"


def disk_space(
    what: str, path: Path, mark: LowMark, *, made_when_needed: bool = False
) -> DiskSpace:
    """The free space under ``path``; one that cannot be read counts as low, with the error.

    ``made_when_needed``: a ``path`` that does not exist (a log root removed, which the
    next run that needs it makes again) is measured where it would be made, its nearest
    existing parent, rather than counted as low."""
    where = path
    while True:
        try:
            st = os.statvfs(where)
            break
        except FileNotFoundError as exc:
            if not made_when_needed or where.parent == where:
                return DiskSpace(what, str(path), None, None, None, exc.strerror or str(exc))
            where = where.parent
        except OSError as exc:
            return DiskSpace(what, str(path), None, None, None, exc.strerror or str(exc))
    total = int(st.f_blocks * st.f_frsize)
    return DiskSpace(what, str(path), available(st), total, mark.threshold(total))
