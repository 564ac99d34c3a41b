"""Cron expressions of the timer language: parse and validate the five fields.

``parse_cron`` checks every field (numbers, names, ranges, steps, lists, ``?``,
``L``, ``n#k`` and ``Ln``) and refuses with the position of the bad token;
``parse_ranged`` is the bounded-number check the other timer kinds share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from croniter import croniter  # type: ignore[import-untyped, unused-ignore]

from jobcontrol.errors import ScheduleError

__all__ = ["Token", "parse_cron", "parse_ranged"]

_DIGITS = re.compile(r"[0-9]+")

Token = tuple[int, str]  # (position in the timer text, the token)


@dataclass(frozen=True)
class _CronField:
    name: str
    lo: int
    hi: int
    names: tuple[str, ...] = ()  # names[i] stands for lo + i


_CRON_FIELDS = (
    _CronField("minute", 0, 59),
    _CronField("hour", 0, 23),
    _CronField("day-of-month", 1, 31),
    _CronField(
        "month",
        1,
        12,
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    ),
    _CronField("day-of-week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse_cron(text: str, fields: list[Token], end: int) -> tuple[str, bool]:
    """The expression for croniter and whether its hour field starts with ``*``.

    Raises ScheduleError pointing at the first bad field.
    """
    if len(fields) > 5:
        pos, extra = fields[5]
        raise ScheduleError(
            text,
            pos,
            f"unexpected 6th cron field '{extra}': cron takes 5 fields "
            "(minute hour day-of-month month day-of-week), without seconds or years",
        )
    if len(fields) < 5:
        if fields and fields[0][1].startswith("@"):
            pos, macro = fields[0]
            reason = f"cron macros like '{macro}' are not supported; write the 5 fields"
            raise ScheduleError(text, pos, reason)
        raise ScheduleError(
            text,
            end,
            f"cron needs 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}",
        )
    values = [_cron_field(text, index, pos, word) for index, (pos, word) in enumerate(fields)]
    _check_cron_days(text, fields, values)
    expr = " ".join(word.lower() for _, word in fields)
    try:
        croniter(expr)
    except ValueError as exc:  # a safety net: the checks above should refuse it first
        raise ScheduleError(text, fields[0][0], f"croniter refuses '{expr}': {exc}") from exc
    return expr, fields[1][1].startswith("*")


def _cron_field(text: str, index: int, pos: int, word: str) -> set[int]:
    if "?" in word and word != "?":
        reason = f"{_label(index)}: '?' must stand alone"
        raise ScheduleError(text, pos + word.index("?"), reason)
    items = word.split(",")
    special = [index == 4 and ("#" in item or item.lower().startswith("l")) for item in items]
    if any(special) and not all(special):
        # croniter cannot combine them, so refuse here with a position.
        reason = f"{_label(index)}: n#k and Ln cannot be mixed with plain days"
        raise ScheduleError(text, pos, reason)
    values: set[int] = set()
    offset = 0
    for item in items:
        item_pos = pos + offset
        offset += len(item) + 1
        if not item:
            raise ScheduleError(text, item_pos, f"{_label(index)}: empty entry in the list")
        values |= _cron_item(text, index, item_pos, item)
    return values


def _label(index: int) -> str:
    return f"cron field {index + 1} ({_CRON_FIELDS[index].name})"


def _cron_item(text: str, index: int, pos: int, item: str) -> set[int]:
    spec = _CRON_FIELDS[index]
    lowered = item.lower()
    if index == 2 and lowered == "l":
        return {28}  # the last day exists in every month
    if index == 4 and ("#" in lowered or lowered.startswith("l")):
        _cron_weekday_special(text, pos, item)
        return set()
    base, slash, step_text = item.partition("/")
    if base == "*" or (base == "?" and index in (2, 4)):
        lo, hi = spec.lo, spec.hi
    elif base == "?":
        raise ScheduleError(text, pos, f"{_label(index)}: '?' only fits the day fields")
    elif "-" in base:
        first, _, last = base.partition("-")
        lo = _cron_value(text, index, pos, first)
        hi = _cron_value(text, index, pos + len(first) + 1, last)
        if hi < lo:
            wrapped = f"{lo}-{spec.hi},{spec.lo}-{hi}"
            reason = f"{_label(index)} range '{base}' runs backwards; write {wrapped}"
            raise ScheduleError(text, pos, reason)
    else:
        lo = _cron_value(text, index, pos, base)
        hi = spec.hi if slash else lo
    if not slash:
        return set(range(lo, hi + 1))
    step_pos = pos + len(base) + 1
    if not _DIGITS.fullmatch(step_text):
        raise ScheduleError(text, step_pos, f"{_label(index)}: expected a step number after '/'")
    step = int(step_text)
    if not 1 <= step <= spec.hi - spec.lo:
        # A step wider than the field matches once; '*/90' would not mean every 90 minutes.
        reason = f"{_label(index)} step '{step_text}' must be 1-{spec.hi - spec.lo}"
        if index < 2:
            reason += "; for a longer interval use 'every'"
        raise ScheduleError(text, step_pos, reason)
    return set(range(lo, hi + 1, step))


def _cron_value(text: str, index: int, pos: int, word: str) -> int:
    spec = _CRON_FIELDS[index]
    if word.lower() in spec.names:
        return spec.lo + spec.names.index(word.lower())
    if not _DIGITS.fullmatch(word):
        kind = "a number or a name like " + spec.names[0] if spec.names else "a number"
        what = f"'{word}' is not {kind}" if word else f"expected {kind}"
        raise ScheduleError(text, pos, f"{_label(index)} {what}")
    return parse_ranged(text, pos, word, _label(index), spec.lo, spec.hi)


def _cron_weekday_special(text: str, pos: int, item: str) -> None:
    if item[:1] in "lL":  # Ln: the last weekday n of the month
        parse_ranged(text, pos + 1, item[1:], f"{_label(4)} last weekday", 0, 7)
        return
    day, _, nth = item.partition("#")  # n#k: the k-th weekday n of the month
    _cron_value(text, 4, pos, day)
    parse_ranged(text, pos + len(day) + 1, nth, f"{_label(4)} occurrence", 1, 5)


def _check_cron_days(text: str, fields: list[Token], values: list[set[int]]) -> None:
    if fields[2][1] in ("*", "?") or fields[4][1] not in ("*", "?"):
        return  # with a day-of-week restriction the OR keeps the job alive
    first_day = min(values[2])
    longest = max(_MONTH_DAYS[month - 1] for month in values[3])
    if first_day > longest:
        months = ",".join(str(month) for month in sorted(values[3]))
        reason = f"{_label(2)}: day {first_day} never occurs in month {months}, so it never runs"
        raise ScheduleError(text, fields[2][0], reason)


def parse_ranged(text: str, pos: int, digits: str, name: str, lo: int, hi: int) -> int:
    """``digits`` as a number from ``lo`` to ``hi``; else ScheduleError at ``pos``."""
    if not _DIGITS.fullmatch(digits):
        raise ScheduleError(text, pos, f"{name} '{digits}' is not a number")
    value = int(digits)
    if not lo <= value <= hi:
        raise ScheduleError(text, pos, f"{name} '{digits}' is out of range {lo}-{hi}")
    return value
