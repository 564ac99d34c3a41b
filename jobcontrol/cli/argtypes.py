"""Values of the command line's numeric options, refused by argparse before anything is
read: a count from 1, and an id (a row's, as the database holds it)."""

from __future__ import annotations

import argparse

from jobcontrol.errors import clip
from jobcontrol.model import MAX_ID, MAX_PORT


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} is not a whole number") from None


def count(text: str) -> int:
    """A ``--limit``: a whole number from 1. One past any id the database can hold asks
    for every row, so a larger one is taken as that."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return min(value, MAX_ID)


def row_id(text: str) -> int:
    """A run's or an entry's id: a whole number from 1 to the largest id a database
    column holds."""
    value = _whole(text)
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ID}, not {clip(str(value))}")
    return value


def seconds(text: str) -> float:
    """A wait in seconds: a number from 0 to a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{clip(repr(text))} is not a number") from None
    if not 0 <= value <= 86400:  # NaN too
        raise argparse.ArgumentTypeError(f"must be from 0 to 86400 seconds, not {clip(text)}")
    return value


def port(text: str) -> int:
    """A TCP port, or 0 for any free one."""
    value = _whole(text)
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(
            f"must be from 0 (any free port) to {MAX_PORT}, not {clip(str(value))}"
        )
    return value
