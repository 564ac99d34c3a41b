"""jobcontrol.cgroups against the real cgroup file systems of this machine (root, as in CI).

Tests that need a writable cgroup v2 hierarchy are skipped, with the reason, where there
is none; the fallback tests run everywhere. Every wait is bounded and polls a condition.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcontrol import cgroups, procs
from jobcontrol.cgroups import Containment, RunCgroup
from jobcontrol.errors import OptionError
from tests.unit.test_procs import read_pid, wait_until

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


def _why_not() -> str:
    probe = Containment.setup(f"unit-probe-{uuid.uuid4().hex[:8]}")
    probe.close()
    return "" if probe.enabled else probe.describe()


WHY_NOT = _why_not()
needs_cgroups = pytest.mark.skipif(bool(WHY_NOT), reason=f"no cgroups here: {WHY_NOT}")


@pytest.fixture
def containment() -> Iterator[Containment]:
    made = Containment.setup(f"unit-{uuid.uuid4().hex[:12]}")
    assert made.enabled, made.describe()
    yield made
    if made.base is not None:
        made.kill_leftovers(None)
    made.close()
    assert made.base is None or not made.base.exists(), "close removes the empty base"


@pytest.fixture
def stray() -> Iterator[list[int]]:
    """Pids a test started outside any run's control; killed afterwards if still alive."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if procs.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def cgroup2_mount_point() -> Path:
    """Read independently of the module: the mount point of the cgroup2 line."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split()[0] == "cgroup2":
            return Path(before.split()[4])
    raise AssertionError("no cgroup2 mount")


def spawn_in(cg: RunCgroup, command: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return procs.spawn(
            command,
            stdout=out,
            cwd=None,
            env={"PATH": os.environ["PATH"]},
            prelude=cg.join_script(),
        )


@needs_cgroups
def test_runs_are_placed_under_the_daemons_own_cgroup_on_the_cgroup2_mount(
    containment: Containment,
) -> None:
    assert containment.base is not None
    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if line.startswith("0::")
    )
    mount = cgroup2_mount_point()
    assert containment.base.parent == mount / own.lstrip("/") or (
        own == "/" and containment.base.parent == mount
    )
    assert containment.describe().startswith(f"cgroup {containment.base} (cgroup.kill; ")


@needs_cgroups
def test_a_setsid_child_without_the_marker_is_in_the_runs_cgroup_and_cgroup_kill_ends_it(
    containment: Containment, tmp_path: Path, stray: list[int]
) -> None:
    cg = containment.create(1)
    assert cg is not None
    pid_file = tmp_path / "escaped.pid"
    proc = spawn_in(
        cg, f"(env -i setsid sh -c 'echo $$ >{pid_file}; exec sleep 305' &); exit 0", tmp_path / "l"
    )
    assert proc.wait(WAIT) == 0
    escaped = read_pid(pid_file)
    stray.append(escaped)
    assert os.getsid(escaped) == escaped
    assert wait_until(lambda: cg.pids() == [escaped]), cg.pids()
    assert not cg.remove(), "a cgroup with a process in it stays"

    assert cg.kill()
    assert wait_until(lambda: not procs.pid_alive(escaped))
    assert cg.remove()
    assert not cg.path.exists()


@needs_cgroups
def test_cpu_time_and_peak_memory_are_read_from_the_cgroup(
    containment: Containment, tmp_path: Path
) -> None:
    cg = containment.create(2)
    assert cg is not None
    burn = (
        f"{sys.executable} -c \"import time; x = b'x' * (48 << 20); t = time.process_time(); "
        "exec('while time.process_time() - t < 0.2: pass')\""
    )
    proc = spawn_in(cg, burn, tmp_path / "log")
    assert proc.wait(WAIT * 3) == 0, (tmp_path / "log").read_text()
    usage = cg.usage()
    assert usage.cpu_us is not None
    assert usage.cpu_us >= 200_000, usage
    assert usage.mem_peak_bytes is not None
    assert usage.mem_peak_bytes >= 48 << 20, usage
    containment.release(cg)
    assert not cg.path.exists()


@needs_cgroups
def test_a_shell_that_cannot_join_its_cgroup_stops_before_the_command(tmp_path: Path) -> None:
    cg = RunCgroup(tmp_path / "no-such-cgroup" / "run-3")
    ran = tmp_path / "ran"
    log = tmp_path / "log"
    proc = spawn_in(cg, f"touch {ran}", log)
    assert proc.wait(WAIT) == cgroups.JOIN_FAILED_STATUS
    assert not ran.exists(), "the command must not run uncontained"
    reason = cgroups.join_failure(log)
    assert reason is not None
    assert reason.startswith("not started: cannot join its cgroup: ")
    assert "no-such-cgroup" in reason, reason
    assert cgroups.join_failure(None) is None


@needs_cgroups
def test_a_cgroup_left_populated_by_a_background_process_is_removed_once_it_ends(
    containment: Containment, tmp_path: Path, stray: list[int]
) -> None:
    cg = containment.create(4)
    assert cg is not None
    pid_file = tmp_path / "bg.pid"
    proc = spawn_in(cg, f"sh -c 'echo $$ >{pid_file}; exec sleep 300' & exit 0", tmp_path / "l")
    assert proc.wait(WAIT) == 0
    background = read_pid(pid_file)
    stray.append(background)
    containment.release(cg)
    assert cg.path.exists(), "left while its background process runs (it is not killed)"
    assert procs.pid_alive(background)
    os.kill(background, signal.SIGKILL)
    assert wait_until(lambda: not cg.populated())
    containment.sweep()
    assert not cg.path.exists()


@needs_cgroups
def test_leftovers_of_an_earlier_daemon_are_killed_by_run_id(
    containment: Containment, tmp_path: Path, stray: list[int]
) -> None:
    cg = containment.create(5)
    assert cg is not None
    pid_file = tmp_path / "left.pid"
    proc = spawn_in(
        cg, f"(env -i setsid sh -c 'echo $$ >{pid_file}; exec sleep 305' &); exit 0", tmp_path / "l"
    )
    assert proc.wait(WAIT) == 0
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"))
    left = int(pid_file.read_text())
    stray.append(left)
    assert containment.kill_leftovers([5, 6]) == [left]
    assert wait_until(lambda: not procs.pid_alive(left))
    assert not cg.path.exists()


def test_off_is_the_fallback_and_says_so() -> None:
    off = Containment.setup("whatever", "off")
    assert not off.enabled
    assert off.create(1) is None
    assert off.describe() == (
        "process group + environment marker (cgroups turned off by $JOBCONTROL_CGROUPS=off)"
    )


def test_the_setting_is_read_from_the_environment_and_a_bad_one_is_refused() -> None:
    assert cgroups.resolve_mode({}) == "auto"
    assert cgroups.resolve_mode({"JOBCONTROL_CGROUPS": "OFF"}) == "off"
    with pytest.raises(OptionError, match=r"\$JOBCONTROL_CGROUPS='maybe': expected one of auto"):
        cgroups.resolve_mode({"JOBCONTROL_CGROUPS": "maybe"})


@needs_cgroups
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_a_tree_the_daemon_may_not_write_falls_back_cleanly(tmp_path: Path) -> None:
    """As an unprivileged user (nobody) the daemon's cgroup is not writable: the fallback,
    with the reason, and nothing created."""
    name = f"unit-nobody-{uuid.uuid4().hex[:8]}"
    script = (
        "from jobcontrol.cgroups import Containment\n"
        f"c = Containment.setup({name!r})\n"
        "print(c.enabled)\n"
        "print(c.describe())\n"
    )
    src = Path(cgroups.__file__).resolve().parents[1]
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        + [sys.executable, "-c", script],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(src)},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    enabled, described = result.stdout.splitlines()
    assert enabled == "False"
    assert described.startswith("process group + environment marker (cannot create cgroup /")
    assert described.endswith(f"/jobcontrol-{name}: Permission denied)"), described
    mount = cgroup2_mount_point()
    assert not list(mount.glob(f"**/jobcontrol-{name}")), "nothing was created"
