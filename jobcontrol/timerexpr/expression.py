"""Timer expressions: parse a job's ``timer`` text and work out when it fires.

The language (keywords and units are case-insensitive, whitespace is free)::

    every 10s | every 5m | every 1h30m | every 2d     elapsed time, units s m h d
    cron M H DoM Mon DoW                             five fields, evaluated with croniter
    daily HH:MM | daily HH:MM:SS                     a wall-clock time every day (24h)
    at YYYY-MM-DDTHH:MM[:SS]                         once, at a local date and time

Any of them may end with ``tz=Area/City``; without it the wall-clock kinds use
the default zone passed in at evaluation (the daemon's local zone).

Cron fields accept ``*``, numbers, names (``jan``, ``mon``), ranges, ``/step``
and lists; ``?`` and ``L`` in day-of-month, ``?``, ``n#k`` and ``Ln`` in
day-of-week. As in Vixie cron, a restricted day-of-month and day-of-week are
OR-ed. Backward ranges, steps wider than the field and day-of-month values that
never occur in the chosen months are refused rather than silently reinterpreted.

Daylight-saving time. Wall-clock times are resolved to instants here, never by
croniter (it is only asked for naive wall-clock matches):

* A fixed time of day (``daily``, ``at``, and a cron whose hour field is a
  number, list or range) that falls in a spring-forward gap fires at the first
  instant after the gap (``daily 01:30`` on 2026-03-29 in Europe/London fires
  at 02:00 BST = 01:00 UTC). One that falls in the repeated fall-back hour fires
  once, at its first occurrence (fold=0); the next run is the following day.
* A cron whose hour field starts with ``*`` (``*``, ``*/2``) is treated as
  elapsed-time work, as Vixie cron treats wildcard jobs: it fires at every real
  instant whose local wall-clock reading matches. Wall times in a gap never
  occur and are skipped; in the repeated hour both instants fire. So
  ``cron 0 * * * *`` fires every real hour through both transitions, and
  ``cron 30 * * * *`` gets no extra run at 02:00 BST when 01:30 is skipped.
* ``every`` is pure elapsed time and ignores zones altogether.

All datetimes passed in must be timezone-aware; results are aware UTC.
"""

from __future__ import annotations

import calendar
import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter  # type: ignore[import-untyped, unused-ignore]

from jobcontrol.errors import ScheduleError
from jobcontrol.timerexpr.cron import Token, parse_cron, parse_ranged

__all__ = ["Schedule", "parse_timer", "validate_timer"]

_KINDS = ("every", "cron", "daily", "at")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Keeps every datetime sum far from datetime.max; nobody needs a longer period.
_MAX_INTERVAL_DAYS = 36500
_TICK = timedelta(microseconds=1)

_TOKEN = re.compile(r"\S+")
_WORD = re.compile(r"[A-Za-z]+")
_ZONE = re.compile(r"(?<!\S)tz\s*=", re.IGNORECASE)
_ZONE_NAME = re.compile(r"\s*(\S*)")
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
_OFFSET = re.compile(r"[zZ]$|[+-][0-9]")
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Schedule:
    """A parsed timer; evaluate it with :meth:`next_fire`, :meth:`next_after`
    and :meth:`skip_missed`. Build one with :func:`parse_timer`."""

    text: str
    kind: str  # "every" | "cron" | "daily" | "at"
    tz: ZoneInfo | None  # None = the default zone given at evaluation
    _interval: timedelta | None = None
    _cron: str | None = None
    _cron_by_instant: bool = False
    _time_of_day: time | None = None
    _at: datetime | None = None  # naive local wall time

    def next_after(self, anchor: datetime, *, default_tz: tzinfo) -> datetime | None:
        """The first occurrence strictly after ``anchor``; None if there is none
        (or it lies outside the range of ``datetime``)."""
        start = _as_utc(anchor, "anchor")
        try:
            return self._next_after_utc(start, self._zone(default_tz))
        except OverflowError:
            # The next occurrence would lie beyond datetime.max.
            return None

    def next_fire(
        self,
        *,
        now: datetime,
        last_ran: datetime | None,
        last_end: datetime | None,
        default_tz: tzinfo,
    ) -> datetime | None:
        """When the job should next run; a time before ``now`` is a missed run.

        ``every`` counts from the end of the last run (else from ``now``);
        ``cron`` and ``daily`` from the last start (else from ``now``); ``at``
        is due until it has run at or after its time.
        """
        now_utc = _as_utc(now, "now")
        ran = None if last_ran is None else _as_utc(last_ran, "last_ran")
        ended = None if last_end is None else _as_utc(last_end, "last_end")
        if self._interval is not None:
            base = ended if ended is not None else now_utc
            return self.next_after(base, default_tz=default_tz)
        if self._at is not None:
            at = _resolve_fixed(self._at, self._zone(default_tz))
            return at if ran is None or ran < at else None
        return self.next_after(ran if ran is not None else now_utc, default_tz=default_tz)

    def skip_missed(self, due: datetime, *, now: datetime, default_tz: tzinfo) -> datetime | None:
        """The next occurrence strictly after ``now`` for a run that was due at ``due``.

        A ``due`` after ``now`` was not missed and is returned unchanged; a
        missed ``at`` never comes back (None).
        """
        due_utc = _as_utc(due, "due")
        now_utc = _as_utc(now, "now")
        if due_utc > now_utc:
            return due_utc
        if self._interval is not None:
            # Stay on due's grid: due + k * interval with the smallest k past now.
            steps = (now_utc - due_utc) // self._interval + 1
            try:
                return due_utc + steps * self._interval
            except OverflowError:
                return None
        if self._at is not None:
            return None
        return self.next_after(now_utc, default_tz=default_tz)

    def _zone(self, default_tz: tzinfo) -> tzinfo:
        return self.tz if self.tz is not None else default_tz

    def _next_after_utc(self, anchor: datetime, zone: tzinfo) -> datetime | None:
        if self._interval is not None:
            return anchor + self._interval
        if self._time_of_day is not None:
            return _next_daily(anchor, self._time_of_day, zone)
        if self._cron is not None:
            return _next_cron(anchor, self._cron, self._cron_by_instant, zone)
        assert self._at is not None
        at = _resolve_fixed(self._at, zone)
        return at if at > anchor else None


def validate_timer(text: str | None) -> None:
    """Raise ScheduleError unless ``text`` is None or a valid timer."""
    if text is not None:
        parse_timer(text)


@functools.lru_cache(maxsize=1024)
def parse_timer(text: str) -> Schedule:
    """Parse a timer expression; raise ScheduleError pointing at the first bad token."""
    zone_at = _ZONE.search(text)
    body_end = zone_at.start() if zone_at is not None else len(text)
    tokens = [(m.start(), m.group()) for m in _TOKEN.finditer(text, 0, body_end)]
    if not tokens:
        where = len(text) - len(text.lstrip())
        what = "the schedule is empty" if not text.strip() else "a schedule kind must come first"
        raise ScheduleError(text, where, f"{what}; expected every, cron, daily or at")
    kind_pos, kind_word = tokens[0]
    kind = kind_word.lower()
    if kind not in _KINDS:
        raise ScheduleError(
            text,
            kind_pos,
            f"unknown schedule kind '{kind_word}'; expected every, cron, daily or at",
        )
    args = tokens[1:]
    end = tokens[-1][0] + len(tokens[-1][1])
    interval = cron = time_of_day = at = None
    by_instant = False
    if kind == "every":
        interval = _parse_every(text, kind_pos + len(kind_word), body_end)
    elif kind == "cron":
        cron, by_instant = parse_cron(text, args, end)
    elif kind == "daily":
        time_of_day = _parse_daily(text, args, end)
    else:
        at = _parse_at(text, args, end)
    zone = None if zone_at is None else _parse_zone(text, zone_at.end())
    return Schedule(
        text=text,
        kind=kind,
        tz=zone,
        _interval=interval,
        _cron=cron,
        _cron_by_instant=by_instant,
        _time_of_day=time_of_day,
        _at=at,
    )


# ---------------------------------------------------------------- parsing


def _parse_zone(text: str, start: int) -> ZoneInfo:
    name_match = _ZONE_NAME.match(text, start)
    assert name_match is not None  # \s*(\S*) always matches
    name, name_pos = name_match.group(1), name_match.start(1)
    if not name:
        raise ScheduleError(text, name_pos, "expected a time zone like Europe/London after 'tz='")
    extra = _TOKEN.search(text, name_match.end())
    if extra is not None:
        raise ScheduleError(
            text,
            extra.start(),
            f"unexpected '{extra.group()}' after the time zone; tz=Area/City must come last",
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    matches = [z for z in _zone_names() if z.lower() == name.lower()]
    hint = f"did you mean '{matches[0]}'?" if matches else "expected a name like Europe/London"
    raise ScheduleError(text, name_pos, f"unknown time zone '{name}'; {hint}")


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def _parse_every(text: str, start: int, end: int) -> timedelta:
    pos = _skip_space(text, start, end)
    if pos == end:
        raise ScheduleError(
            text, pos, "expected an interval like 10s, 5m, 1h30m or 2d after 'every'"
        )
    first, total = pos, 0
    seen: set[str] = set()
    while pos < end:
        number = _DIGITS.match(text, pos, end)
        if number is None:
            word = _word_at(text, pos, end)
            if seen:
                reason = f"unexpected '{word}' after the interval; only tz=Area/City may follow"
            else:
                reason = f"expected a number like 10 in 'every 10m', got '{word}'"
            raise ScheduleError(text, pos, reason)
        pos = _skip_space(text, number.end(), end)
        unit = _WORD.match(text, pos, end)
        if unit is None:
            if pos < end and text[pos] in ".,":
                reason = "use whole numbers, e.g. 90m rather than 1.5h"
            else:
                reason = f"expected a unit s, m, h or d after {number.group()}"
            raise ScheduleError(text, pos, reason)
        name = unit.group().lower()
        if name not in _UNITS:
            reason = f"expected a unit s, m, h or d after {number.group()}, got '{unit.group()}'"
            raise ScheduleError(text, pos, reason)
        if name in seen:
            raise ScheduleError(text, pos, f"unit '{name}' is given twice")
        seen.add(name)
        total += int(number.group()) * _UNITS[name]
        pos = _skip_space(text, unit.end(), end)
    if total == 0:
        raise ScheduleError(text, first, "the interval must be greater than zero")
    if total > _MAX_INTERVAL_DAYS * 86400:
        raise ScheduleError(text, first, f"the interval must be at most {_MAX_INTERVAL_DAYS}d")
    return timedelta(seconds=total)


def _skip_space(text: str, pos: int, end: int) -> int:
    while pos < end and text[pos].isspace():
        pos += 1
    return pos


def _word_at(text: str, pos: int, end: int) -> str:
    match = _TOKEN.match(text, pos, end)
    return match.group() if match is not None else ""


def _parse_daily(text: str, args: list[Token], end: int) -> time:
    if not args:
        raise ScheduleError(text, end, "expected a time of day like 22:56 after 'daily'")
    pos, word = args[0]
    clock = _parse_clock(text, pos, word)
    _reject_extra(text, args[1:], "the time")
    return clock


def _parse_clock(text: str, pos: int, word: str) -> time:
    match = _CLOCK.fullmatch(word)
    if match is None:
        offset = _OFFSET.search(word)
        if _CLOCK.match(word) and offset is not None:
            reason = "give the zone as tz=Area/City, not as an offset or Z"
            raise ScheduleError(text, pos + offset.start(), reason)
        raise ScheduleError(text, pos, f"expected a time of day HH:MM or HH:MM:SS, got '{word}'")
    hour = parse_ranged(text, pos + match.start(1), match.group(1), "hour", 0, 23)
    minute = parse_ranged(text, pos + match.start(2), match.group(2), "minute", 0, 59)
    second = 0
    if match.group(3) is not None:
        second = parse_ranged(text, pos + match.start(3), match.group(3), "second", 0, 59)
    return time(hour, minute, second)


def _parse_at(text: str, args: list[Token], end: int) -> datetime:
    if not args:
        raise ScheduleError(text, end, "expected a date and time like 2026-05-01T09:00 after 'at'")
    pos, word = args[0]
    match = _DATE.match(word)
    if match is None:
        raise ScheduleError(
            text, pos, f"expected a date and time like 2026-05-01T09:00, got '{word}'"
        )
    year = parse_ranged(text, pos, match.group(1), "year", 1970, 9998)
    month = parse_ranged(text, pos + 5, match.group(2), "month", 1, 12)
    last_day = calendar.monthrange(year, month)[1]
    day = parse_ranged(text, pos + 8, match.group(3), f"day of {year}-{month:02}", 1, last_day)
    rest = word[match.end() :]
    if rest[:1] in ("T", "t") and len(rest) > 1:
        clock_pos, clock, extra = pos + match.end() + 1, rest[1:], args[1:]
    elif not rest and len(args) > 1:
        (clock_pos, clock), extra = args[1], args[2:]
    else:
        reason = f"expected 'T' and a time after the date, like {match.group()}T09:00"
        raise ScheduleError(text, pos + match.end(), reason)
    moment = datetime.combine(date(year, month, day), _parse_clock(text, clock_pos, clock))
    _reject_extra(text, extra, "the date and time")
    return moment


def _reject_extra(text: str, rest: list[Token], what: str) -> None:
    if rest:
        pos, word = rest[0]
        reason = f"unexpected '{word}' after {what}; only tz=Area/City may follow"
        raise ScheduleError(text, pos, reason)


# ---------------------------------------------------------------- evaluation


def _as_utc(value: datetime, name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {value!r}")
    # Arithmetic on a zone-aware datetime is wall-clock arithmetic; UTC is elapsed time.
    return value.astimezone(UTC)


def _offset(instant: datetime, zone: tzinfo) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    if offset is None:
        raise ValueError(f"time zone {zone!r} gives no UTC offset")
    return offset


def _fold_instants(wall: datetime, zone: tzinfo) -> tuple[datetime, datetime]:
    """The UTC instants of a naive wall time read with fold=0 and fold=1.

    Equal for an ordinary time, first < second in a repeated hour, and
    first > second in a gap (PEP 495 reads a gap time with the offset before
    the transition for fold=0 and after it for fold=1).
    """
    early = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    late = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return early, late


def _resolve_fixed(wall: datetime, zone: tzinfo) -> datetime:
    """A fixed wall time's instant: the first occurrence, or the end of a gap."""
    early, late = _fold_instants(wall, zone)
    if early <= late:
        return early
    return _gap_end(late, early, zone)


def _real_instants(wall: datetime, zone: tzinfo) -> tuple[datetime, ...]:
    """Every instant whose wall-clock reading is ``wall``: none, one or two."""
    early, late = _fold_instants(wall, zone)
    if early == late:
        return (early,)
    return (early, late) if early < late else ()


def _gap_end(before: datetime, after: datetime, zone: tzinfo) -> datetime:
    # The transition lies in (before, after]; bisect for its first instant.
    target = _offset(after, zone)
    while after - before > _TICK:
        middle = before + (after - before) // 2
        if _offset(middle, zone) == target:
            after = middle
        else:
            before = middle
    return after


def _next_daily(anchor: datetime, at: time, zone: tzinfo) -> datetime:
    # Earlier local dates resolve to instants <= anchor (resolution is monotone).
    day = anchor.astimezone(zone).date()
    while True:
        instant = _resolve_fixed(datetime.combine(day, at), zone)
        if instant > anchor:
            return instant
        day += timedelta(days=1)


def _next_cron(anchor: datetime, expr: str, by_instant: bool, zone: tzinfo) -> datetime | None:
    # Start from the smaller nearby offset so that wall times repeated after
    # the anchor (the second pass through a fall-back hour) are seen too.
    offset = min(_offset(anchor, zone), _offset(anchor + timedelta(days=1), zone))
    walls = croniter(expr, anchor.replace(tzinfo=None) + offset - timedelta(minutes=1))
    best: datetime | None = None
    while True:
        try:
            wall: datetime = walls.get_next(datetime)
        except ValueError:
            # CroniterBadDateError (no match within its horizon) or a year past 9999.
            return best
        first = _resolve_fixed(wall, zone)
        if not by_instant:
            if first > anchor:
                return first
            continue
        # Instants come out of order only inside a repeated hour; every later
        # wall time resolves at or after `first`, so the best cannot improve.
        if best is not None and first >= best:
            return best
        for instant in _real_instants(wall, zone):
            if instant > anchor and (best is None or instant < best):
                best = instant
