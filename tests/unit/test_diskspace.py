"""``--disk-low``: a size or a percentage, refused with a clear message otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcontrol.diskspace import LowMark, disk_space
from jobcontrol.errors import OptionError


@pytest.mark.parametrize(
    ("text", "total", "threshold"),
    [
        ("5%", 1000, 50),
        ("0.5%", 1000, 5),
        ("256K", 10, 262144),
        ("500M", 10, 500 << 20),
        ("2GiB", 10, 2 << 30),
        ("1g", 10, 1 << 30),
        ("4096", 10, 4096),
        ("0", 10, 0),
    ],
)
def test_a_mark_is_a_size_or_a_percentage_of_the_filesystem(
    text: str, total: int, threshold: int
) -> None:
    assert LowMark.parse(text).threshold(total) == threshold


@pytest.mark.parametrize("text", ["", "lots", "5 percent", "-1G", "1X", "150%"])
def test_anything_else_is_refused_naming_the_option_and_the_value(text: str) -> None:
    with pytest.raises(OptionError, match=r"--disk-low '.*'"):
        LowMark.parse(text)


def test_a_directory_that_cannot_be_read_counts_as_low_with_the_reason(tmp_path: Path) -> None:
    space = disk_space("state directory", tmp_path / "missing", LowMark.parse("1K"))
    assert space.low
    assert space.describe() == (
        f"state directory {tmp_path / 'missing'}: cannot read its free space: "
        "No such file or directory"
    )
    fine = disk_space("state directory", tmp_path, LowMark.parse("0"))
    assert not fine.low
    assert fine.free_bytes is not None
    assert fine.total_bytes is not None


def test_a_log_root_that_is_made_when_needed_is_measured_where_it_would_be(
    tmp_path: Path,
) -> None:
    """A removed log root is made again by the next run: health said "low disk space"."""
    missing = tmp_path / "logs" / "deeper"
    space = disk_space("log root", missing, LowMark.parse("0"), made_when_needed=True)
    assert not space.low
    assert space.error is None
    assert space.path == str(missing)
    assert space.free_bytes is not None
