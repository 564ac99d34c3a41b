"""Checking command lines before they are saved (spec ``FunctionExpr``).

A task's command is run later with ``/bin/sh -c``; a command the shell cannot
even parse is refused when it is saved, with the shell's own words.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Iterable

from jobcontrol.errors import CommandError
from jobcontrol.model import MAX_COMMAND_BYTES

SHELL = "/bin/sh"
CHECK_TIMEOUT_S = 5.0

# dash says "/bin/sh: 3: Syntax error: ...", bash says "sh: -c: line 3: syntax error ...".
_SHELL_PREFIX = re.compile(r"^\S*sh: (?:-c: )?(?:line )?(?:(?P<line>\d+): )?")


def check_command(text: str) -> None:
    """Refuse (raise :class:`CommandError`) a command that cannot be run.

    Refused are an empty or blank command, one containing a NUL byte (it could
    not be passed to ``exec``) and one that ``/bin/sh -n`` rejects; the message
    then quotes the shell.
    """
    if not text.strip():
        raise CommandError("empty command")
    if "\0" in text:
        raise CommandError("command contains a NUL byte")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise CommandError(
            f"command is {size} bytes; at most {MAX_COMMAND_BYTES} can be run"
            " (the kernel takes 128 KiB in one argument): put it in a script"
        )
    key = _key(text)
    with _lock:
        if key in _passed:
            _passed.move_to_end(key)
            return
    problem = _shell_syntax_problem(text)
    if problem is not None:
        raise CommandError(f"sh: {problem}")
    known_good([text])


def known_good(texts: Iterable[str]) -> None:
    """Remember commands the shell parses, so they are not checked again: each checked
    here, and those a database already holds (each was checked when it was saved), which
    a reload of the same definitions then does not send through ``/bin/sh -n`` one by one
    (about a millisecond each)."""
    keys = [_key(text) for text in texts]
    with _lock:
        for key in keys:
            _passed[key] = None
            _passed.move_to_end(key)
        while len(_passed) > _PASSED_MAX:
            _passed.popitem(last=False)


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# Commands known to parse, by digest (16 bytes each), the least recently used dropped
# past the bound: every command of 100,000 jobs fits in a few MB.
_PASSED_MAX = 200_000
_passed: OrderedDict[bytes, None] = OrderedDict()
_lock = threading.Lock()


def _shell_syntax_problem(text: str) -> str | None:
    """The shell's complaint about ``text``, or None when it parses. A failure to run
    the check raises instead."""
    try:
        result = subprocess.run(
            # "--" so a command starting with "-" is not taken for an option.
            [SHELL, "-n", "-c", "--", text],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"{SHELL} -n did not finish in {CHECK_TIMEOUT_S:g}s") from exc
    except UnicodeEncodeError as exc:
        raise CommandError("command is not encodable text") from exc
    except OSError as exc:
        raise CommandError(f"cannot check command with {SHELL}: {exc}") from exc
    if result.returncode == 0:
        return None
    message = _tidy_shell_message(result.stderr.decode(errors="replace"), multiline="\n" in text)
    return message or f"{SHELL} -n exited with status {result.returncode}"


def _tidy_shell_message(stderr: str, *, multiline: bool) -> str:
    """Drop the shell's name and, for one-line commands, the pointless "line 1"."""
    lines = []
    for raw in stderr.strip().splitlines():
        match = _SHELL_PREFIX.match(raw)
        if match is None:
            lines.append(raw.strip())
            continue
        rest = raw[match.end() :].strip()
        line_no = match.group("line")
        if multiline and line_no is not None:
            rest = f"line {line_no}: {rest}"
        lines.append(rest)
    # bash repeats the offending line as a second message; the first says it all.
    return lines[0] if lines else ""
