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


def format_cpu(us: object) -> str:
    """A run's CPU time (microseconds from its cgroup) in seconds, ``0.004 s``; blank for none."""
    if not isinstance(us, int | float) or us < 0:
        return ""
    return f"{us / 1_000_000:.3f} s"


def format_bytes(n: object) -> str:
    """A size in powers of 1024: ``512 B``, ``4.0 KiB``, ``12.3 MiB``; blank for none."""
    if not isinstance(n, int | float) or n < 0:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""  # not reached: the loop returns at GiB


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
