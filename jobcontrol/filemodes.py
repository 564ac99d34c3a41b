"""Modes of what Job Control writes: private to the daemon's user unless told otherwise.

The umask is no guide (022 would leave the database, its WAL and every task log
readable by all local users), and changing it would change the tasks' umask
too, so every file and directory is created with its mode given and made exact
with ``chmod`` (the umask can only take bits away). Task logs may be shared
with one group (``--log-group``); nothing else is.

What already exists keeps its mode, except the job log directories (``job-<id>``
under the log root), which are Job Control's alone: ``looser_than`` and
``group_cannot`` say what the daemon should warn about instead.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from jobcontrol import diskspace
from jobcontrol.errors import OptionError

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
GROUP_DIR, GROUP_FILE = 0o750, 0o640
# A directory the group passes through to the logs below it, but cannot list.
GROUP_PASS_DIR = 0o710

# O_NOFOLLOW: a log's name that is a symbolic link is refused, never written through.
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# An existing log whose mode and group are set (never through a link, never blocking).
_SET_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_dir(path: Path, mode: int = PRIVATE_DIR, gid: int | None = None) -> bool:
    """Create ``path`` with exactly ``mode`` (and group ``gid``); False if it already
    existed, which leaves it as it is. Missing parents are created as ``mkdir -p`` would,
    each with the same mode and group: no directory of ours gets the umask's."""
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return False
    except FileNotFoundError:
        make_dir(path.parent, mode, gid)
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            return False
    set_mode(path, mode, gid)
    return True


def set_mode(path: Path, mode: int, gid: int | None = None) -> None:
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)


def create_file(path: Path | str, mode: int = PRIVATE_FILE) -> bool:
    """Create an empty file with exactly ``mode``; False if it already existed (kept as is)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True


def open_private(path: Path | str, flags: int, mode: int = PRIVATE_FILE) -> int:
    """``os.open`` of a file that, if this creates it, has exactly ``mode``."""
    existed = os.path.exists(path)
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    if not existed:
        os.fchmod(fd, mode)
    return fd


def write_private(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``; a new file is created mode 0600."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def looser_than(path: Path, mode: int) -> str | None:
    """Why ``path`` lets in more than ``mode`` would, or None (also when it does not exist)."""
    try:
        actual = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return None
    extra = actual & ~mode
    if not extra:
        return None
    who = " and ".join(
        w for w, bits in (("its group", 0o070), ("all users", 0o007)) if extra & bits
    )
    return f"{path} is mode {actual:04o}, open to {who}: `chmod {mode:o} {path}` closes it"


def group_cannot(path: Path, gid: int, bits: int, what: str) -> str | None:
    """Why members of group ``gid`` lack group ``bits`` (0o050: list, 0o010: pass) on
    ``path``, or None; ``what`` says what they would need it for."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    mode = st.st_mode & 0o777
    if (st.st_gid == gid and mode & bits == bits) or mode & (bits >> 3) == bits >> 3:
        return None
    group = _group_name(st.st_gid)
    return (
        f"members of group {_group_name(gid)} cannot {what}: {path} is mode {mode:04o}, "
        f"group {group}"
    )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


@dataclass(frozen=True)
class LogAccess:
    """Who reads task logs: the daemon's user alone (default), or also one group."""

    group: str | None = None
    gid: int | None = None

    @classmethod
    def for_group(cls, group: str | None) -> LogAccess:
        """``--log-group``: a group name (or number) the daemon's user can give files to."""
        if group is None:
            return cls()
        try:
            entry = grp.getgrgid(int(group)) if group.isdigit() else grp.getgrnam(group)
        except KeyError:
            raise OptionError(f"--log-group {group!r}: no such group") from None
        gid = entry.gr_gid
        if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
            raise OptionError(
                f"--log-group {group!r}: the daemon's user ({_user_name()}) is not a "
                "member of that group, so it cannot give the logs to it"
            )
        return cls(entry.gr_name, gid)

    @property
    def dir_mode(self) -> int:
        return PRIVATE_DIR if self.gid is None else GROUP_DIR

    @property
    def file_mode(self) -> int:
        return PRIVATE_FILE if self.gid is None else GROUP_FILE

    def make_root(self, log_root: Path) -> list[str]:
        """Create the log root if missing, and give every job log directory in it this
        mode; what could not be taken (``make_job_dir``), one line each."""
        make_dir(log_root, self.dir_mode, self.gid)
        problems = []
        for entry in os.scandir(log_root):
            if not entry.name.startswith("job-"):
                continue
            if entry.is_symlink():  # its job's runs are refused (127): said at start too
                problems.append(f"{entry.path} is a symbolic link")
            elif not entry.is_dir(follow_symlinks=False):
                problems.append(f"{entry.path} is not a directory")
            else:
                try:
                    self.make_job_dir(Path(entry.path))
                except OSError as exc:
                    problems.append(f"{entry.path}: {exc.strerror or exc}")
        return problems

    def make_job_dir(self, path: Path) -> None:
        """A job's log directory, created or (once per worker) set to this mode.

        Its mode and group are set through a descriptor that refuses a symbolic link, and
        a directory another user owns is refused (``PermissionError``): where others can
        write to the log root, they must not choose where the daemon writes logs."""
        try:
            path.mkdir(mode=self.dir_mode)
        except FileExistsError:
            pass
        except FileNotFoundError:  # the log root is gone (removed, a volume remounted)
            make_dir(path, self.dir_mode, self.gid)
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                link = os.path.islink(path)
                why = "a symbolic link" if link else "not a directory"
                raise NotADirectoryError(exc.errno, f"{path} is {why}", str(path)) from None
            raise
        try:
            owner = os.fstat(fd).st_uid
            if owner != os.geteuid():
                raise PermissionError(
                    errno.EPERM,
                    f"{path} is owned by {_user_name(owner)}, not by the daemon's user "
                    f"({_user_name()})",
                    str(path),
                )
            if self.gid is not None:
                os.fchown(fd, -1, self.gid)
            os.fchmod(fd, self.dir_mode)
            self._set_logs(fd)
        finally:
            os.close(fd)

    def _set_logs(self, dir_fd: int) -> None:
        """The logs already in a job's directory (open by ``dir_fd``) given this mode and
        group, as new ones get: a change of ``--log-group`` reaches older logs too. Only
        the daemon's user's regular files, each through a descriptor that follows no
        link; one already right is only looked at."""
        me, gid, mode = os.geteuid(), self.gid, self.file_mode
        for entry in os.scandir(dir_fd):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # pruned meanwhile
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
                continue
            if stat.S_IMODE(st.st_mode) == mode and (gid is None or st.st_gid == gid):
                continue
            try:
                fd = os.open(entry.name, _SET_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            try:
                if gid is not None:
                    os.fchown(fd, -1, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def open_log(self, path: Path | str) -> BinaryIO:
        """A new task log, mode 0600 (0640 of the group) from the first byte.

        ``OSError`` (ENOSPC) when its filesystem has less than ``diskspace.LOG_ROOM`` free:
        a task does not run without its log.
        """
        fd = os.open(path, _LOG_FLAGS, self.file_mode)
        try:
            if self.gid is not None:
                os.fchown(fd, -1, self.gid)
            os.fchmod(fd, self.file_mode)
            diskspace.require_room(fd)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "wb")


def _user_name(uid: int | None = None) -> str:
    """The name of user ``uid``, by default the effective one (not $USER, which a changed
    user may still carry)."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
