"""Checking command lines before they are saved (spec ``FunctionExpr``).

A task's command is run later with ``/bin/sh -c``; a command the shell cannot
even parse is refused when it is saved, with the shell's own words.
"""

from __future__ import annotations

import functools
import re
import subprocess

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
    problem = _shell_syntax_problem(text)
    if problem is not None:
        raise CommandError(f"sh: {problem}")


@functools.lru_cache(maxsize=1024)
def _shell_syntax_problem(text: str) -> str | None:
    """The shell's complaint about ``text``, or None when it parses.

    Cached because the same commands are checked on every load and edit; a
    failure to run the check raises instead, so it is never cached.
    """
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
