"""``jobcontrol demo``: the sample trees of testsetup/demo.yaml on the real clock.

demo.yaml's timings, counted from when the demo loads it (t0): Periodic fires at
t0+10 s and 10 s after each run ends; Absolute (a TIMED box) fires with foo at
t0+20 s, foo runs ``sleep 6`` so Absolute shows WAITING at ~t0+26 s, and bar's
timer (t0+30 s) ends the wait. ``--duration`` counts from just after t0, so 31 s
gives the WAITING line a 5 s margin.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from jobcontrol.definitions.parse import iter_defs, parse_definitions
from tests.acceptance.harness import DEMO_YAML, JobControl, wait_until

DURATION = 31
STAMP = r"(?P<at>\d\d:\d\d:\d\d\.\d{3})  "


def stamped(lines: list[str], pattern: str) -> list[tuple[datetime, re.Match[str]]]:
    """Lines matching ``STAMP + pattern``, with their time of day."""
    found = []
    for line in lines:
        match = re.fullmatch(STAMP + pattern, line)
        if match:
            found.append((datetime.strptime(match["at"], "%H:%M:%S.%f"), match))
    return found


def seconds_between(earlier: datetime, later: datetime) -> float:
    delta = later - earlier
    if delta < timedelta(0):  # the demo ran over midnight
        delta += timedelta(days=1)
    return delta.total_seconds()


@pytest.mark.timeout(120)
def test_demo_runs_the_sample_trees_and_stops_cleanly(
    tmp_path: Path, make_jc: Callable[[str], JobControl]
) -> None:
    demo = {d.name: d for d, _ in iter_defs(parse_definitions(DEMO_YAML.read_text()))}
    timings = [(name, demo[name].fields.get("timer")) for name in ("Periodic", "foo", "bar")]
    assert timings == [
        ("Periodic", "every 10s"),
        ("foo", "every 20s"),
        ("bar", "every 30s"),
    ], "demo.yaml changed: DURATION and this test's expectations rest on these timings"
    assert demo["foo"].fields["command"].endswith("sleep 6")

    # Two demos side by side: one runs for DURATION seconds, one is stopped with Ctrl-C
    # (SIGINT) while foo runs. make_jc checks afterwards that no task process is left.
    full_dir, ctrl_c_dir = tmp_path / "demo-full", tmp_path / "demo-ctrl-c"
    full = make_jc(f"sqlite:///{full_dir}/demo.db")
    ctrl_c = make_jc(f"sqlite:///{ctrl_c_dir}/demo.db")
    full_out, ctrl_c_out = full.base / "demo.out", ctrl_c.base / "demo.out"
    full_demo = full.popen(
        "demo",
        "--duration",
        str(DURATION),
        "--dir",
        str(full_dir),
        output=full_out,
        errors=full.base / "demo.err",
    )
    ctrl_c_demo = ctrl_c.popen(
        "demo", "--dir", str(ctrl_c_dir), output=ctrl_c_out, errors=ctrl_c.base / "demo.err"
    )

    assert wait_until(
        lambda: "start   task 'foo'" in ctrl_c_out.read_text(), DURATION + 30
    ), ctrl_c_out.read_text()
    ctrl_c_demo.send_signal(signal.SIGINT)
    assert ctrl_c_demo.wait(timeout=60) == 0, ctrl_c_out.read_text()
    lines = ctrl_c_out.read_text().splitlines()
    assert stamped(lines, r"end     task 'foo' \(run \d+\): killed, exit status 255, .*"), lines
    assert stamped(lines, r"stopping: .*"), lines
    assert re.fullmatch(STAMP + "stopped cleanly", lines[-1]), lines

    assert full_demo.wait(timeout=DURATION + 60) == 0, full_out.read_text()
    text = full_out.read_text()
    lines = text.splitlines()
    assert (
        lines[0]
        == f"Job Control demo: database {full_dir / 'demo.db'}, task logs in {full_dir / 'logs'}"
    )
    assert "Traceback" not in (full.base / "demo.err").read_text()

    starts = stamped(lines, r"start   box  'Periodic' \(run \d+, timer\)")
    ends = stamped(
        lines, r"end     box  'Periodic' \(run \d+\): (?P<state>\w+), exit status (?P<rc>\d+), .*"
    )
    assert len(starts) >= 2, text
    assert ends, text
    # Periodic fires again 10 s after each run ends.
    for (ended, _), (restarted, _) in zip(ends, starts[1:], strict=False):
        assert 9.5 <= seconds_between(ended, restarted) <= 11.5, text

    # The ABORT box stops at its failing child: gcc error fails, no-op ok never starts.
    gcc = stamped(
        lines, r"end     task 'gcc error' \(run \d+\): failed, exit status (?P<rc>\d+), .*"
    )
    assert gcc, text
    assert all(int(m["rc"]) != 0 for _, m in gcc), text
    assert "'no-op ok'" not in text
    assert ends[0][1]["state"] == "failed", text
    assert int(ends[0][1]["rc"]) != 0, text

    # The TIMED box waits between foo and bar.
    assert stamped(lines, r"WAITING box  'Absolute' waits for its next timed child"), text

    assert stamped(lines, r"stopping: .*"), text
    assert re.fullmatch(STAMP + "stopped cleanly", lines[-1]), text


def test_a_demo_directory_it_makes_is_private_and_warns_of_nothing(
    tmp_path: Path, make_jc: Callable[[str], JobControl]
) -> None:
    where = tmp_path / "new" / "demo"
    jc = make_jc(f"sqlite:///{tmp_path / 'unused.db'}")
    result = jc.run("demo", "--duration", "1", "--dir", str(where))
    assert result.returncode == 0, result.stderr
    assert where.stat().st_mode & 0o777 == 0o700
    assert "open to its group" not in result.stderr, result.stderr


def test_a_demo_warning_is_a_stamped_line_among_the_runs_not_a_log_record(
    tmp_path: Path, make_jc: Callable[[str], JobControl]
) -> None:
    where = tmp_path / "open"
    where.mkdir()
    where.chmod(0o755)  # given as it is: the demo warns, and leaves it so
    jc = make_jc(f"sqlite:///{tmp_path / 'unused.db'}")
    result = jc.run("demo", "--duration", "1", "--dir", str(where))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    warned = stamped(lines, r"warning (?P<text>.*)")
    assert [m["text"] for _, m in warned if "open to its group" in m["text"]] == [
        f"{where} is mode 0755, open to its group and all users: `chmod 700 {where}` closes it"
    ], result.stdout
    # Nothing in the daemon's log format (date, level, logger name) on either stream.
    assert " WARNING " not in result.stdout + result.stderr, result.stdout + result.stderr
    assert re.fullmatch(STAMP + "stopped cleanly", lines[-1]), result.stdout
