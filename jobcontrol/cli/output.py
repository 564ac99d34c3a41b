"""The CLI's tables and formats, shared by its offline and online commands."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any


def when(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return str(value.astimezone().strftime("%d %b %Y %H:%M:%S"))  # Inq's JobTime format


def duration(ms: Any) -> str:
    if ms is None:
        return ""
    return f"{ms / 1000:.1f}s" if ms < 60_000 else f"{ms // 60_000}m{(ms % 60_000) // 1000:02d}s"


def cpu_time(us: Any) -> str:
    """A run's CPU time (microseconds) briefly: ``0.004s``, ``12.3s``, ``4m05s``."""
    if us is None:
        return ""
    if us < 1_000_000:
        return f"{us / 1_000_000:.3f}s"
    return duration(us // 1000)


def size(n: Any) -> str:
    """Bytes briefly, in powers of 1024: ``512B``, ``4.0K``, ``12.3M``, ``1.5G``."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{int(value)}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}G"  # pragma: no cover - the loop returns at G


def count(n: int, noun: str) -> str:
    """``1 job``, ``3 jobs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def names(jobs: Sequence[str], shown: int = 3) -> str:
    more = f" (+{len(jobs) - shown} more)" if len(jobs) > shown else ""
    return ", ".join(str(job) for job in jobs[:shown]) + more


def shown(text: str) -> str:
    """``text`` as one line of a terminal: a control character (a line break, an
    escape sequence) is written as its escape, so no value can forge a row of a
    table or drive the reader's terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes: wide characters two, combining none."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def table(headers: list[str], rows: list[list[str]]) -> str:
    rows = [[shown(c) for c in r] for r in rows]
    widths = [
        max(_columns(h), *(_columns(r[i]) for r in rows)) if rows else _columns(h)
        for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        padded = (c + " " * (w - _columns(c)) for c, w in zip(cells, widths, strict=True))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in rows])


def table_audit(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            str(e["id"]),
            when(e["at"]),
            e["user"],
            e["operation"],
            e["result"],
            names(e["jobs"]),
            e["detail"],
        ]
        for e in entries
    ]
    headers = ["ID", "AT", "USER", "OPERATION", "RESULT", "JOBS", "DETAIL"]
    return table(headers, rows) if rows else "no audit entries"


def table_jobs(jobs: Sequence[Mapping[str, Any]]) -> str:
    headers = [
        "NAME",
        "KIND",
        "ACTIVE",
        "STATE",
        "LAST RAN",
        "DURATION",
        "EXIT",
        "NEXT RUNS",
        "TIMER",
    ]
    rows = [
        [
            "  " * j["depth"] + j["name"],
            j["kind"] if j["kind"] == "task" else f"box/{j['box_type']}",
            "yes" if j["active"] else "no",
            j["state"],
            when(j["last_ran"]),
            duration(j["last_duration_ms"]),
            str(j["exit_status"]) if j["last_ran"] else "",
            when(j["next_runs"]),
            j["timer"] or "",
        ]
        for j in jobs
    ]
    return table(headers, rows) if rows else "no jobs"


def table_runs(runs: Sequence[Mapping[str, Any]]) -> str:
    """Runs as ``run_json`` (or the API) gives them."""
    headers = ["RUN", "TRIGGER", "STATE", "EXIT", "STARTED", "DURATION", "CPU", "MEM PEAK"]
    headers += ["BY", "REASON"]
    rows = [
        [
            str(r["id"]),
            str(r["trigger"]),
            str(r["state"]),
            "" if r["exit_status"] is None else str(r["exit_status"]),
            when(r["started"]) if r["started"] else f"queued {when(r['created'])}",
            duration(r["duration_ms"]),
            cpu_time(r.get("cpu_us")),
            size(r.get("mem_peak_bytes")),
            r["requested_by"] or "",
            _reason(r),
        ]
        for r in runs
    ]
    return table(headers, rows) if rows else "no runs"


def _reason(run: Mapping[str, Any]) -> str:
    """A run's reason; a retry says which attempt it is (``retries``)."""
    reason = str(run["reason"] or "")
    attempt = run.get("attempt") or 1
    if attempt > 1:
        return f"attempt {attempt}" + (f": {reason}" if reason else "")
    return reason


def age(seconds: Any) -> str:
    """How long ago, briefly: ``3s ago``, ``4m ago``, ``2h05m ago``, ``3d ago``."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        text = f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m"
    elif s < 86400:
        text = f"{s // 3600}h{(s % 3600) // 60:02d}m"
    else:
        text = f"{s // 86400}d"
    return f"{text} ago"


def clock_time(value: Any) -> str:
    """The local time of day of an ISO time (or datetime), ``HH:MM:SS``."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return str(value.astimezone().strftime("%H:%M:%S"))


def table_workers(workers: Sequence[Mapping[str, Any]]) -> str:
    """Workers as ``GET /api/v1/workers`` (or ``jsonable`` of ``list_workers``) gives them."""
    headers = ["NAME", "HOST", "PID", "SLOTS", "GROUPS", "HEARTBEAT", "RUNS"]
    rows = [
        [
            w["name"],
            w["host"],
            str(w["pid"]),
            f"{w['used']}/{w['slots']}",
            _groups(w),
            _heartbeat(w),
            _held(w["runs"]),
        ]
        for w in workers
    ]
    return table(headers, rows) if rows else "no workers"


_LATE = {"late": " (late)", "gone": " (process gone)"}


def _heartbeat(w: Mapping[str, Any]) -> str:
    """How long ago it beat; ``(late)`` when not heard of within its lease (SIGSTOP, cut
    off, a host down), ``(process gone)`` when its process on the daemon's host is not
    running though it never said it stopped."""
    if w["stopped"]:
        return f"stopped {when(w['stopped'])}"
    return age(w["heartbeat_age_s"]) + _LATE.get(w.get("state", ""), "")


def _groups(w: Mapping[str, Any]) -> str:
    """The worker's slot groups as ``--queues`` writes them, with their use:
    ``fast_lane:0/1 manual,*:3/4`` (a worker from before slot groups: its queues)."""
    groups = w.get("groups")
    if not groups:
        return "*" if w["queues"] is None else ",".join(w["queues"]) or "-"
    return " ".join(f"{','.join(g['queues'])}:{g['used']}/{g['slots']}" for g in groups)


def _held(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return "-"
    return names(
        [
            f"{r['run_id']}:{r['job']}"
            + (f"(since {clock_time(r['since'])})" if r["since"] else "")
            for r in runs
        ]
    )


def fields(values: Mapping[str, Any], order: Sequence[str] = ()) -> str:
    """``key: value`` lines, aligned; ``order`` first, then the rest as given. A control
    character in a value (a line break of a multi-line command, a terminal escape) is
    written as its escape (``shown``): no value can forge a line nor drive the terminal;
    ``--json`` and ``export`` give values as they are."""
    keys = [k for k in order if k in values] + [k for k in values if k not in order]
    # A time in ms is shown as a duration ("1.5s"): its label drops the unit.
    labels = {k: k.removesuffix("_ms") for k in keys}
    width = max((len(label) for label in labels.values()), default=0)
    return "\n".join(
        f"{labels[k] + ':':<{width + 1}} {shown(_show(k, values[k]))}".rstrip() for k in keys
    )


def _show(key: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_ms"):
        return duration(value)
    if isinstance(value, str) and key in ("started", "last_ran", "next_runs", "last_updated"):
        return when(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
