"""Durations as definition files write them: ``90s``, ``5m``, ``1h30m``, ``2.5s``, ``1d``.

``parse_duration`` reads them (or a bare number of seconds); ``format_duration``
writes seconds back as text that reads back exactly.
"""

from __future__ import annotations

import math
import re

from jobcontrol.errors import clip

__all__ = ["format_duration", "parse_duration"]

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_DURATION_PART = re.compile(rf"\s*({_NUMBER})\s*([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: str | int | float) -> float:
    """Seconds in ``90s``, ``5m``, ``1h30m``, ``2.5s``, ``1d`` or a bare number.

    Raises ValueError for anything else, and for zero, negative or infinite durations.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration, not a boolean")
    if isinstance(value, str):
        text = value.strip()
        seconds = float(text) if re.fullmatch(_NUMBER, text) else _sum_duration_parts(text)
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("a duration must be a positive, finite number of seconds")
    return seconds


def _sum_duration_parts(text: str) -> float:
    total, pos, units_seen = 0.0, 0, ""
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ValueError(
                f"cannot read {clip(repr(text))} as a duration (like 90s, 5m, 1h30m, 2.5s or seconds)"
            )
        number, unit = match.groups()
        # Units largest first, each once: "30m1h" or "5m5m" is more likely a typo than meant.
        if units_seen and "dhms".index(unit) <= "dhms".index(units_seen[-1]):
            raise ValueError(f"units out of order or repeated in duration {clip(repr(text))}")
        units_seen += unit
        total += float(number) * _UNIT_SECONDS[unit]
        pos = match.end()
    return total


def format_duration(seconds: float) -> str:
    """Duration text that ``parse_duration`` reads back as exactly ``seconds``."""
    if seconds.is_integer() and 0 < seconds < 2**53:
        hours, rest = divmod(int(seconds), 3600)
        minutes, secs = divmod(rest, 60)
        parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
        return "".join(f"{count}{unit}" for count, unit in parts if count)
    # repr() is the shortest text that reads back as the same float.
    return f"{seconds!r}s"
