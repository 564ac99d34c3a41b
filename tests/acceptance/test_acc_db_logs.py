"""Task logs kept in the database, as a user meets them: the real daemon with its worker
in database mode (``JOBCONTROL_TASK_LOGS=database``, what a remote worker does) and the
real ``jobcontrol logs`` / ``logs -f``."""

from __future__ import annotations

import os
import signal

import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

WAIT = 30.0


def test_logs_follow_a_database_log_while_the_task_runs(jc: JobControl) -> None:
    jc = jc.upgraded()
    jc.env["JOBCONTROL_TASK_LOGS"] = "database"
    jc.ok("daemon", "start")
    gate = jc.base / "gate.fifo"
    os.mkfifo(gate)
    tree = f"""\
jobs:
  - name: talker
    command: 'echo first; read line < "{gate}"; printf "\\377binary\\n" >&2; echo last'
"""
    jc.ok("load", str(write(jc.base / "tree.yaml", tree)))
    jc.ok("run", "talker")
    output = jc.base / "follow.out"
    child = jc.popen("logs", "talker", "-f", output=output, errors=jc.base / "follow.err")
    try:
        assert wait_until(lambda: output.read_bytes() == b"first\n", WAIT), output.read_bytes()
        assert child.poll() is None  # still following: the task waits on the gate
        # Ctrl-C ends a follower at once, with the shell's 130, what it printed kept.
        quitter_out = jc.base / "quitter.out"
        quitter = jc.popen(
            "logs", "talker", "-f", output=quitter_out, errors=output.with_suffix(".q")
        )
        assert wait_until(lambda: quitter_out.read_bytes() == b"first\n", WAIT)
        quitter.send_signal(signal.SIGINT)
        assert quitter.wait(timeout=WAIT) == 130, output.with_suffix(".q").read_text()
        assert quitter_out.read_bytes() == b"first\n"
        fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)
        try:
            os.write(fd, b"go\n")
            child.wait(timeout=WAIT)  # ends by itself once the run is final
        finally:
            os.close(fd)
    except BaseException:
        child.kill()
        child.wait()
        raise
    assert child.returncode == 0, (jc.base / "follow.err").read_text()
    assert output.read_bytes() == b"first\n\xffbinary\nlast\n"
    whole = jc.base / "whole.out"
    reader = jc.popen("logs", "talker", output=whole, errors=jc.base / "whole.err")
    assert reader.wait(timeout=WAIT) == 0, (jc.base / "whole.err").read_text()
    assert whole.read_bytes() == b"first\n\xffbinary\nlast\n"
    run = jc.history("talker")[0]
    assert run["log_path"] == "db:"
    # No file of it under the log root, no spool left behind.
    assert not list((jc.state_dir / "logs").glob("job-*/*.log"))
    assert not list((jc.state_dir / "spool").iterdir())
    assert (jc.state_dir / "spool").stat().st_mode & 0o777 == 0o700
    jc.ok("daemon", "stop")


def test_an_unknown_task_log_store_is_refused(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    env = dict(jc.env, JOBCONTROL_TASK_LOGS="nfs")
    refused = jc.run("daemon", "start", env=env)
    assert refused.returncode != 0, describe(refused)
    assert "$JOBCONTROL_TASK_LOGS='nfs': expected one of file, database" in refused.stderr
    assert jc.live_daemons() == []
    assert not (jc.state_dir / "spool").exists()
