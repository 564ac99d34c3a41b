"""How times and durations are shown (spec 10.2): local time, ``dd MMM yyyy HH:mm:ss``."""

from __future__ import annotations

from datetime import datetime


def parse_time(value: object) -> datetime | None:
    """An ISO time from the API (None, or unparseable text, gives None)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def format_time(when: datetime | None) -> str:
    """``22 Nov 2026 14:05:09`` in the local zone; blank for none."""
    if when is None:
        return ""
    if when.tzinfo is not None:
        when = when.astimezone()
    return when.strftime("%d %b %Y %H:%M:%S")


def format_duration(ms: object) -> str:
    """``HH:mm:ss.SSS``, with ``1 day, `` or ``N days, `` in front from 24 h; blank for none or 0."""
    if not isinstance(ms, int | float) or ms <= 0:
        return ""
    total = int(ms)
    days, rest = divmod(total, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}"
    if days:
        text = f"{days} day{'s' if days > 1 else ''}, {text}"
    return text
