"""A job's log directory that changed under a running worker: replaced by a file, removed,
a symbolic link or a directory another user made in a log root others may write to.

Found from outside: a directory replaced by a file killed the slot's thread and left
its run ``running`` for good; a removed one failed every later run of its job until a
restart; a link or another user's directory made the daemon (root) write and chmod
files it was pointed at."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from jobcontrol.filemodes import LogAccess
from jobcontrol.model import RunRecord, RunState
from tests.conftest import MakeJC
from tests.integration.helpers import JC, task

pytestmark = pytest.mark.timeout(60)


def _job_dir(jc_log_root: Path, jc: JC, name: str) -> Path:
    return jc_log_root / f"job-{jc.job(name).id}"


def _ran(jc: JC, name: str) -> RunRecord:
    """Run the top-level task ``name`` now; its run once its end is recorded."""
    mark = jc.rec.mark()
    run_id = jc.run_now(name)
    jc.rec.run_finished(name, since=mark)
    return jc.run(run_id)


def test_a_log_directory_replaced_by_a_file_fails_the_run_and_keeps_the_slot(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    jc = make_jc(sqlite_url, slots=1)
    jc.create(task("echoer", "echo hi", active=True))
    jc.create(task("other", "echo other", active=True))
    assert _ran(jc, "echoer").state == RunState.SUCCEEDED
    job_dir = _job_dir(jc.log_root, jc, "echoer")
    shutil.rmtree(job_dir)
    job_dir.write_text("not a directory\n")

    refused = _ran(jc, "echoer")
    assert (refused.state, refused.exit_status) == (RunState.FAILED, 127)
    assert f"{job_dir} is not a directory" in (refused.reason or "")
    # The one slot still runs what comes next.
    assert _ran(jc, "other").state == RunState.SUCCEEDED
    assert job_dir.read_text() == "not a directory\n"
    job_dir.unlink()
    again = _ran(jc, "echoer")
    assert again.state == RunState.SUCCEEDED
    assert again.log_path is not None
    assert Path(again.log_path).read_text() == "hi\n"


def test_a_removed_log_directory_is_made_again(sqlite_url: str, make_jc: MakeJC) -> None:
    jc = make_jc(sqlite_url)
    jc.create(task("echoer", "echo hi", active=True))
    assert _ran(jc, "echoer").state == RunState.SUCCEEDED
    shutil.rmtree(jc.log_root)  # the whole log root: a volume remounted

    again = _ran(jc, "echoer")
    assert again.state == RunState.SUCCEEDED, again.reason
    assert again.log_path is not None
    assert Path(again.log_path).read_text() == "hi\n"
    assert os.stat(_job_dir(jc.log_root, jc, "echoer")).st_mode & 0o777 == 0o700


def _shared_root(sqlite_url: str, make_jc: MakeJC) -> JC:
    """A daemon whose log root others may write to (mode 1777, as /tmp): warned about at
    start, and where another user can put a link or a directory of its own."""
    jc = make_jc(sqlite_url, start=False)
    jc.log_root.mkdir(mode=0o755)
    os.chmod(jc.log_root, 0o1777)
    return jc.start()


def test_a_log_directory_that_is_a_link_is_refused_and_its_target_untouched(
    sqlite_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    jc = _shared_root(sqlite_url, make_jc)
    jc.create(task("echoer", "echo secret", active=True))
    assert _ran(jc, "echoer").state == RunState.SUCCEEDED
    job_dir = _job_dir(jc.log_root, jc, "echoer")
    shutil.rmtree(job_dir)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    job_dir.symlink_to(target)

    refused = _ran(jc, "echoer")
    assert (refused.state, refused.exit_status) == (RunState.FAILED, 127)
    assert f"{job_dir} is a symbolic link" in (refused.reason or "")
    assert list(target.iterdir()) == []
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_start_names_a_job_log_entry_that_is_a_link_or_no_directory(tmp_path: Path) -> None:
    """Its job's runs are refused (127) when they come; a start says so beforehand, as it
    does for a directory another user owns."""
    root = tmp_path / "logs"
    root.mkdir(mode=0o1777)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (root / "job-1").symlink_to(target)
    (root / "job-2").write_text("")
    (root / "job-3").mkdir()
    problems = LogAccess().make_root(root)
    assert sorted(problems) == [
        f"{root / 'job-1'} is a symbolic link",
        f"{root / 'job-2'} is not a directory",
    ]
    assert target.stat().st_mode & 0o777 == 0o755  # never followed
    assert (root / "job-3").stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directory")
def test_a_log_directory_another_user_owns_is_refused(sqlite_url: str, make_jc: MakeJC) -> None:
    jc = _shared_root(sqlite_url, make_jc)
    jc.create(task("echoer", "echo secret", active=True))
    assert _ran(jc, "echoer").state == RunState.SUCCEEDED
    job_dir = _job_dir(jc.log_root, jc, "echoer")
    shutil.rmtree(job_dir)
    job_dir.mkdir()
    os.chmod(job_dir, 0o777)
    os.chown(job_dir, 65534, 65534)  # nobody's: it could have put links in it
    victim = job_dir.parent.parent / "victim.txt"
    victim.write_text("precious\n")

    refused = _ran(jc, "echoer")
    assert (refused.state, refused.exit_status) == (RunState.FAILED, 127)
    assert "is owned by" in (refused.reason or "")
    assert job_dir.stat().st_uid == 65534
    assert job_dir.stat().st_mode & 0o777 == 0o777
    assert victim.read_text() == "precious\n"
