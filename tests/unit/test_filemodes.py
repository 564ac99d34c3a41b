"""Directories Job Control creates get their mode explicitly, missing parents included
(README "Security": a worker's ``spool`` and ``worker-logs`` were once 0755)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcontrol import filemodes


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_missing_parents_get_the_private_mode_not_the_umasks(
    tmp_path: Path, open_umask: None
) -> None:
    leaf = tmp_path / "state" / "spool" / "w3"
    assert filemodes.make_dir(leaf)
    for path in (leaf, leaf.parent, leaf.parent.parent):
        assert path.stat().st_mode & 0o777 == filemodes.PRIVATE_DIR, path
    assert not filemodes.make_dir(leaf), "made once: then it exists"


def test_an_existing_parent_is_left_as_it_is(tmp_path: Path, open_umask: None) -> None:
    tmp_path.chmod(0o755)
    assert filemodes.make_dir(tmp_path / "new")
    assert tmp_path.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "new").stat().st_mode & 0o777 == filemodes.PRIVATE_DIR
