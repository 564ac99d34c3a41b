"""What outside trials found the CLI telling a user wrongly, each as the user meets it:
refusals in one line that change nothing, names resolved alike by every command,
and labels that say what they show."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, describe, write

pytestmark = pytest.mark.timeout(180)

TREE = """\
jobs:
  - name: flaky
    command: "true"
"""


def _files(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*"))


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_export_to_a_file_that_cannot_be_written_is_refused_in_one_line(
    jc_sqlite: JobControl, online: bool
) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TREE))
    if online:
        jc.ok("daemon", "start")
    target = jc.base / "out"
    target.mkdir()
    before = _files(target)
    for output, reason in (
        (target / "missing" / "x.yaml", "No such file or directory"),
        (target, "Is a directory"),
    ):
        result = jc.fails("export", "-o", str(output))
        assert result.stderr == f"jobcontrol: cannot write {output}: {reason}\n", describe(result)
    assert _files(target) == before
    written = target / "ok.yaml"
    jc.ok("export", "-o", str(written))
    assert "name: flaky" in written.read_text()
