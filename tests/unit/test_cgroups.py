"""jobcontrol.cgroups against the real cgroup file systems of this machine (root, as in CI).

Tests that need a writable cgroup v2 hierarchy are skipped, with the reason, where there
is none; the fallback tests run everywhere. Every wait is bounded and polls a condition.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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
def test_the_usage_of_a_cgroup_another_process_collected_is_none_and_no_warning(
    containment: Containment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stopped past its lease finds its run's cgroup removed by the dispatcher
    that settled the run: it has no figures to give, and that is not a fault to warn of."""
    cg = containment.create(3)
    assert cg is not None
    proc = spawn_in(cg, "true", tmp_path / "log")
    assert proc.wait(WAIT) == 0
    containment.release(cg)  # as the collection of a settled run does
    assert not cg.path.exists()
    with caplog.at_level(logging.INFO, logger="jobcontrol.cgroups"):
        assert cg.usage() == cgroups.RunUsage()
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.INFO, f"cgroup {cg.path} is gone (its run was collected meanwhile): no usage")
    ]


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


# A process that stands in for the daemon under a unit with Delegate=yes: it moves
# itself alone into the cgroup ``own`` (the service's), as systemd starts it, then asks
# for ``controller`` to be passed down to the runs' cgroups.
_AS_THE_DAEMON = """
import json, os, sys
from pathlib import Path
from jobcontrol import cgroups
own, controller = Path(sys.argv[1]), sys.argv[2]
(own / "cgroup.procs").write_text(str(os.getpid()))
base = own / "jobcontrol-test"
base.mkdir()
reason = cgroups.enable_for_runs(own, base, controller)
mine = Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
print(json.dumps({"reason": reason, "cgroup": mine}))
"""


def _as_the_daemon(own: Path, controller: str) -> dict[str, str]:
    """Run _AS_THE_DAEMON: the reason ``enable_for_runs`` gave and the cgroup it ended in."""
    done = subprocess.run(
        [sys.executable, "-c", _AS_THE_DAEMON, str(own), controller],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
        check=True,
    )
    answer: dict[str, str] = json.loads(done.stdout)
    return answer


def _own_v2_cgroup() -> Path:
    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if line.startswith("0::")
    )
    return cgroup2_mount_point() / own.lstrip("/")


@pytest.fixture
def service_cgroup() -> Iterator[tuple[Path, str]]:
    """A cgroup like a delegated service's: under this process's own, with one of the
    controllers this hierarchy has (memory on a pure cgroup v2 host; hybrid layouts
    keep memory on v1 but may have another, e.g. hugetlb) offered to it."""
    parent = _own_v2_cgroup()
    offered = (parent / "cgroup.controllers").read_text().split()
    if not offered:
        pytest.skip(f"the cgroup2 hierarchy offers no controller at {parent}")
    controller = "memory" if "memory" in offered else offered[0]
    control = parent / "cgroup.subtree_control"
    enabled_here = controller not in control.read_text().split()
    if enabled_here:
        try:
            control.write_text(f"+{controller}")
        except OSError as exc:
            pytest.skip(f"cannot offer {controller} below {parent}: {exc.strerror}")
    own = parent / f"jc-service-{uuid.uuid4().hex[:8]}"
    own.mkdir()
    yield own, controller
    for cg in sorted(own.rglob("*"), key=lambda p: -len(p.parts)):
        if cg.is_dir():
            for pid in (cg / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
    for cg in sorted([own, *own.rglob("*")], key=lambda p: -len(p.parts)):
        if cg.is_dir():
            assert wait_until(lambda cg=cg: not (cg / "cgroup.procs").read_text().split())
            cg.rmdir()
    if enabled_here:
        control.write_text(f"-{controller}")


@needs_cgroups
def test_a_daemon_alone_in_its_cgroup_moves_into_a_leaf_so_the_runs_get_the_controller(
    service_cgroup: tuple[Path, str],
) -> None:
    """Under a unit with Delegate=yes the daemon starts alone in the service's cgroup,
    which may then pass no controller down (memory, for peak memory, on pure cgroup v2):
    it moves itself into ``supervisor`` and enables it for the runs."""
    own, controller = service_cgroup
    answer = _as_the_daemon(own, controller)
    assert answer["reason"] == "", answer
    assert answer["cgroup"].endswith(f"/{own.name}/supervisor"), answer
    assert controller in (own / "cgroup.subtree_control").read_text().split()
    base = own / "jobcontrol-test"
    assert controller in (base / "cgroup.subtree_control").read_text().split()
    (base / "run-1").mkdir()  # a run's cgroup now has the controller's files
    assert controller in (base / "run-1" / "cgroup.controllers").read_text().split()


@needs_cgroups
def test_a_daemon_sharing_its_cgroup_stays_and_says_why(
    service_cgroup: tuple[Path, str], stray: list[int]
) -> None:
    own, controller = service_cgroup
    neighbour = subprocess.Popen(["sleep", "300"])
    stray.append(neighbour.pid)
    (own / "cgroup.procs").write_text(str(neighbour.pid))
    answer = _as_the_daemon(own, controller)
    assert answer["reason"] == (
        f"cannot enable {controller} in {own}: Device or resource busy "
        f"(the daemon shares {own} with 1 other process(es))"
    ), answer
    assert answer["cgroup"].endswith(f"/{own.name}"), answer  # not moved
    assert not (own / "supervisor").exists()


def test_a_cgroup2_mount_without_favordynmods_gets_the_advice_where_the_kernel_has_it() -> None:
    point = Path("/sys/fs/cgroup")
    features = "nsdelegate\nfavordynmods\nmemory_localevents\n"
    advice = cgroups.join_advice(point, ["rw", "nsdelegate"], features)
    assert "without favordynmods" in advice
    assert "mount -o remount,favordynmods /sys/fs/cgroup" in advice
    # Mounted with it, or a kernel that does not know it (before 6.0): nothing to say.
    assert cgroups.join_advice(point, ["rw", "favordynmods"], features) == ""
    assert cgroups.join_advice(point, ["rw"], "nsdelegate\nmemory_localevents\n") == ""


@needs_cgroups
def test_the_advice_follows_this_machines_own_mount_and_kernel() -> None:
    containment = Containment.setup(f"unit-advice-{uuid.uuid4().hex[:8]}")
    try:
        point = cgroups._cgroup2_mount()[0]
        options = cgroups._mount_options(point)
        assert options, f"no super options read for {point}"
        features = Path("/sys/kernel/cgroup/features").read_text().split()
        expected = "favordynmods" in features and "favordynmods" not in options
        assert bool(containment.advice) is expected, (options, containment.advice)
    finally:
        containment.close()


# ---------------------------------------------------------------- joins kept warm


def _v2_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line.split(":", 2)[2]
    raise AssertionError(f"pid {pid} is in no cgroup v2")


@pytest.fixture
def warmer(containment: Containment) -> Iterator[cgroups.JoinWarmer]:
    assert containment.base is not None
    made = cgroups.JoinWarmer(containment.base, lead=0.05, tail=0.05, retry_every=0.0)
    containment.warmer = made.start()
    yield made
    made.close()


@needs_cgroups
def test_the_helper_waits_in_its_own_cgroup_and_moves_only_from_just_before_a_due_instant(
    containment: Containment, warmer: cgroups.JoinWarmer
) -> None:
    pid = warmer.helper_pid
    assert pid is not None
    assert procs.pid_alive(pid)
    assert containment.base is not None
    assert _v2_cgroup_of(pid).endswith(f"/{containment.base.name}/warm-{os.getpid()}-a")
    assert warmer.moves == 0, "nothing is due: the helper stays put"
    assert warmer.describe() == "cgroup joins kept warm around timers"
    assert containment.describe().endswith("; cgroup joins kept warm around timers")

    when = datetime.fromtimestamp(time.time() + 0.3, UTC)
    due = when.timestamp()
    warmer.timer_changed(("tree", 1), when)
    assert warmer.upcoming() == (due - warmer.lead, due + warmer.tail)
    assert wait_until(lambda: warmer.moves >= 3, WAIT), warmer.moves
    assert min(warmer.recent_moves) >= due - warmer.lead, "no move before the window opens"
    assert wait_until(lambda: warmer.upcoming() is None, WAIT), "the window closes after the tail"
    assert _v2_cgroup_of(pid).split("/")[-1] in {f"warm-{os.getpid()}-a", f"warm-{os.getpid()}-b"}


@needs_cgroups
def test_a_cancelled_timer_opens_no_window(warmer: cgroups.JoinWarmer) -> None:
    now = time.time()
    warmer.timer_changed(("tree", 1), datetime.fromtimestamp(now + 0.2, UTC))
    warmer.timer_changed(("tree", 1), None)  # cancelled
    fence_at = datetime.fromtimestamp(now + 0.6, UTC)
    fence = fence_at.timestamp()
    warmer.timer_changed(("tree", 2), fence_at)
    assert warmer.upcoming() == (fence - warmer.lead, fence + warmer.tail)
    assert wait_until(lambda: warmer.moves >= 1, WAIT)
    assert min(warmer.recent_moves) >= fence - warmer.lead, "moved for the cancelled timer"


@needs_cgroups
def test_told_that_timers_elsewhere_are_due_it_moves_at_once_for_that_long(
    warmer: cgroups.JoinWarmer,
) -> None:
    before = time.time()
    warmer.keep_warm_for(0.2)  # a worker process hears this from the daemon's relay
    window = warmer.upcoming()
    assert window is not None
    assert before <= window[0] <= time.time()
    assert window[1] - window[0] == pytest.approx(0.2)
    assert wait_until(lambda: warmer.moves >= 3, WAIT), warmer.moves
    assert min(warmer.recent_moves) >= window[0]
    assert wait_until(lambda: warmer.upcoming() is None, WAIT)


def test_the_daemon_tells_worker_processes_once_per_window_how_long_to_keep_warm() -> None:
    told: list[tuple[float, float]] = []  # (when, seconds)
    announcer = cgroups.JoinWarmer(None, announce=lambda s: told.append((time.time(), s)))
    announcer.start()
    try:
        first = datetime.fromtimestamp(time.time() + 0.2, UTC)
        announcer.timer_changed(("tree", 1), first)
        # Due 20 ms later: inside what the first announcement covers, so not told again.
        announcer.timer_changed(("tree", 2), first + timedelta(milliseconds=20))
        assert wait_until(lambda: announcer.upcoming() is None, WAIT)
        assert announcer.helper_pid is None, "no helper where it only announces"
        assert announcer.moves == 0
        assert len(told) == 1, told
        when, seconds = told[0]
        assert when >= first.timestamp() - announcer.lead
        end = first.timestamp() + announcer.tail
        assert when + seconds == pytest.approx(end + announcer.HORIZON, abs=0.01)
        assert announcer.announced == 1
    finally:
        announcer.close()


def test_an_announcement_that_fails_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(seconds: float) -> None:
        raise ConnectionError("relay gone")

    announcer = cgroups.JoinWarmer(None, announce=broken).start()
    try:
        announcer.timer_changed(("tree", 1), datetime.fromtimestamp(time.time() + 0.05, UTC))
        assert wait_until(lambda: announcer.failures == 1, WAIT)
        assert announcer.announced == 0
        assert "cannot tell worker processes that timers are due" in caplog.text
    finally:
        announcer.close()


@needs_cgroups
def test_a_killed_helper_is_counted_and_reported_until_it_is_retried(
    containment: Containment, caplog: pytest.LogCaptureFixture
) -> None:
    assert containment.base is not None
    # No retry within the test, so the problem it reports cannot clear under it.
    warmer = cgroups.JoinWarmer(containment.base, lead=0.05, tail=0.05, retry_every=3600.0)
    containment.warmer = warmer.start()
    first = warmer.helper_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(first), WAIT)
    warmer.timer_changed(("tree", 1), datetime.fromtimestamp(time.time() + 0.1, UTC))
    assert wait_until(lambda: warmer.failures == 1, WAIT), warmer.describe()
    problem = f"the helper (pid {first}) ended: -9"
    assert warmer.problem == problem
    assert warmer.describe() == f"cgroup joins not kept warm ({problem})"
    assert problem in caplog.text
    assert warmer.helper_pid is None
    # Later windows wait for the retry: no second failure, no second warning.
    warmer.timer_changed(("tree", 2), datetime.fromtimestamp(time.time() + 0.1, UTC))
    assert wait_until(lambda: warmer.upcoming() is None, WAIT)
    assert warmer.failures == 1
    assert warmer.problem == problem
    assert caplog.text.count(problem) == 1


@needs_cgroups
def test_a_killed_helper_is_replaced_at_the_next_move_once_the_retry_is_due(
    warmer: cgroups.JoinWarmer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobcontrol.cgroups")
    first = warmer.helper_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(first), WAIT)
    moves = warmer.moves
    # The fixture retries at once: the failure and the new helper come in one window.
    warmer.timer_changed(("tree", 1), datetime.fromtimestamp(time.time() + 0.1, UTC))
    assert wait_until(
        lambda: warmer.failures == 1 and warmer.problem == "" and warmer.moves > moves, WAIT
    ), warmer.describe()
    assert f"the helper (pid {first}) ended: -9" in caplog.text
    assert "cgroup joins are kept warm again around timers" in caplog.text
    second = warmer.helper_pid
    assert second is not None
    assert second != first
    assert procs.pid_alive(second)
    assert warmer.failures == 1


@needs_cgroups
def test_close_ends_the_helper_and_removes_its_cgroups(containment: Containment) -> None:
    assert containment.base is not None
    warmer = cgroups.JoinWarmer(containment.base).start()
    containment.warmer = warmer
    pid = warmer.helper_pid
    assert pid is not None
    names = sorted(p.name for p in containment.base.glob("warm-*"))
    assert names == [f"warm-{os.getpid()}-a", f"warm-{os.getpid()}-b"]
    containment.close()  # closes the warmer first, so the base can go too
    assert not procs.pid_alive(pid)
    assert not containment.base.exists()


@needs_cgroups
def test_the_helper_of_a_killed_daemon_ends_and_the_next_start_removes_its_cgroups() -> None:
    name = f"unit-warm-{uuid.uuid4().hex[:8]}"
    script = (
        "import signal\n"
        "from jobcontrol.cgroups import Containment, JoinWarmer\n"
        f"c = Containment.setup({name!r})\n"
        "w = JoinWarmer(c.base).start()\n"
        "print(w.helper_pid, c.base, flush=True)\n"
        "signal.pause()\n"
    )
    daemon = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert daemon.stdout is not None
        helper_text, base_text = daemon.stdout.readline().split()
        helper, base = int(helper_text), Path(base_text)
        assert procs.pid_alive(helper)
        daemon.kill()
        daemon.wait(WAIT)
        assert wait_until(lambda: not procs.pid_alive(helper), WAIT), "the helper outlived it"
        assert sorted(p.name for p in base.glob("warm-*")) == [
            f"warm-{daemon.pid}-a",
            f"warm-{daemon.pid}-b",
        ]
        again = Containment.setup(name)
        assert list(base.glob("warm-*")) == []
        again.close()
        assert not base.exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()


@needs_cgroups
def test_a_lease_collection_kills_what_left_the_marker_in_a_worker_processes_cgroup(
    tmp_path: Path, stray: list[int]
) -> None:
    """A run settled on an expired lease, of a ``jobcontrol worker`` process on this host
    (its own cgroup subtree, named after the database's instance and its name): what
    dropped the run's marker (``env -i setsid``) is killed by its cgroup. Another run's
    cgroup, and another database's whose instance begins the same, are left alone."""
    from jobcontrol.worker import recovery

    instance = f"unit{uuid.uuid4().hex[:8]}"
    theirs = Containment.setup(f"{instance}:w2")
    other_db = Containment.setup(f"{instance}0:w2")
    procs_: list[subprocess.Popen[bytes]] = []
    try:
        run, other_run, same_id = theirs.create(539), theirs.create(540), other_db.create(539)
        assert run is not None
        assert other_run is not None
        assert same_id is not None
        escape = "env -i setsid sleep 300 & echo $! > {}; wait"
        for cg, name in ((run, "lost"), (other_run, "kept"), (same_id, "other-db")):
            procs_.append(spawn_in(cg, escape.format(tmp_path / f"{name}.pid"), tmp_path / name))
            stray.append(read_pid(tmp_path / f"{name}.pid"))
        lost, kept, other = stray

        killed = recovery.collect(instance, [539], kill_grace=1.0)

        assert killed >= 1
        assert wait_until(lambda: not procs.pid_alive(lost)), "the escapee of the lost run lives"
        assert procs.pid_alive(kept), "another run's cgroup was killed"
        assert procs.pid_alive(other), "another database's cgroup was killed"
    finally:
        for proc in procs_:
            proc.kill()
        for made in (theirs, other_db):
            made.kill_leftovers(None)
            made.close()
