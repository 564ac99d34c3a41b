"""``StopSignals``: SIGTERM/SIGINT acted on in a thread of their own (daemon.py).

Each test runs in a child Python process: installing the handlers changes the
process's signal dispositions, which pytest's own process must keep.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, os, queue, signal, sys, threading
    from jobcontrol.daemon import StopSignals

    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
    acted = queue.SimpleQueue()

    def act(signum):
        acted.put((signum, threading.current_thread().name))
        if signum == signal.SIGTERM:
            raise RuntimeError("this act failed")

    StopSignals(act).install()
    # Thread-directed at a thread that is not the main one, as the kernel may do.
    other = threading.Thread(target=threading.Event().wait, args=(60,), daemon=True)
    other.start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.pthread_kill(other.ident, signum)
    for _ in range(2):
        signum, thread = acted.get(timeout=30)
        # One write of a whole line to stderr: the log goes to stdout from
        # jc-signals, and print() writes words and the newline separately.
        sys.stderr.write(f"acted {signal.Signals(signum).name} in {thread}\\n")
    """
)


def test_each_signal_is_acted_on_in_its_thread_and_a_failed_act_is_reported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    acted = done.stderr.splitlines()
    assert "acted SIGINT in jc-signals" in acted, done.stderr
    assert "acted SIGTERM in jc-signals" in acted, done.stderr
    lines = done.stdout.splitlines()
    # The act that raised is reported with its reason, and the next signal still acted on.
    assert "ERROR acting on signal SIGTERM failed" in lines, done.stdout
    assert "RuntimeError: this act failed" in done.stdout, done.stdout
