"""`daemon stop --kill` sends SIGUSR1 only to a daemon that catches it: a daemon of an
earlier version would die of it at once, leaving its tasks orphaned, where SIGTERM
stops it cleanly (killing every run, as --kill asks)."""

from __future__ import annotations

import signal
import subprocess
import sys

from jobcontrol.daemon import KILL_ALL_SIGNAL, _catches

CHILD = """
import signal, sys
if sys.argv[1] == "catch":
    signal.signal(signal.SIGUSR1, lambda *_: None)
print("ready", flush=True)
sys.stdin.read()
"""


def _child(mode: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"  # its handler is in place
    return child


def test_only_a_process_that_catches_the_kill_all_signal_is_sent_it() -> None:
    assert KILL_ALL_SIGNAL == signal.SIGUSR1
    catching, plain = _child("catch"), _child("plain")
    try:
        assert _catches(catching.pid, KILL_ALL_SIGNAL)
        assert not _catches(plain.pid, KILL_ALL_SIGNAL)
        assert not _catches(2**22 + 12345, KILL_ALL_SIGNAL)  # no such process
    finally:
        for child in (catching, plain):
            child.kill()
            child.wait(10)
