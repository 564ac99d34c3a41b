"""Timer expressions: parse errors, evaluation per kind, DST on real transition dates."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter  # type: ignore[import-untyped, unused-ignore]
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jobcontrol.errors import ScheduleError
from jobcontrol.timerexpr.expression import Schedule, parse_timer, validate_timer

LONDON = ZoneInfo("Europe/London")
NEW_YORK = ZoneInfo("America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def next_after(text: str, anchor: datetime, zone: tzinfo = UTC) -> datetime | None:
    return parse_timer(text).next_after(anchor, default_tz=zone)


def chain(text: str, anchor: datetime, count: int, zone: tzinfo = UTC) -> list[datetime]:
    schedule = parse_timer(text)
    fires: list[datetime] = []
    for _ in range(count):
        found = schedule.next_after(anchor, default_tz=zone)
        assert found is not None
        fires.append(found)
        anchor = found
    return fires


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "kind", "interval"),
    [
        ("every 10s", "every", timedelta(seconds=10)),
        ("every 5m", "every", timedelta(minutes=5)),
        ("every 1h", "every", timedelta(hours=1)),
        ("every 2d", "every", timedelta(days=2)),
        ("every 1h30m", "every", timedelta(minutes=90)),
        ("  EVERY   1H 30M  ", "every", timedelta(minutes=90)),
        ("every 1 h", "every", timedelta(hours=1)),
        ("Every 10S tz=Europe/London", "every", timedelta(seconds=10)),
    ],
)
def test_every_parses_to_its_interval(text: str, kind: str, interval: timedelta) -> None:
    schedule = parse_timer(text)
    assert schedule.kind == kind
    assert next_after(text, utc(2026, 5, 1)) == utc(2026, 5, 1) + interval


def test_kind_and_zone_are_exposed_and_keywords_are_case_insensitive() -> None:
    schedule = parse_timer("Daily 22:56 TZ=Europe/London")
    assert (schedule.kind, schedule.tz, schedule.text) == ("daily", LONDON, schedule.text)
    assert parse_timer("CRON 0 9 * JAN-MAR Mon-Fri").kind == "cron"
    assert parse_timer("AT 2026-05-01t09:00").kind == "at"
    assert parse_timer("daily 10:00").tz is None
    assert parse_timer("every 5m tz = UTC").tz == ZoneInfo("UTC")


def test_parse_is_cached_and_schedules_are_hashable() -> None:
    assert parse_timer("every 10s") is parse_timer("every 10s")
    assert {parse_timer("cron 0 * * * *"), parse_timer("cron 0 * * * *")} == {
        parse_timer("cron 0 * * * *")
    }


@pytest.mark.parametrize(
    ("text", "position", "reason"),
    [
        ("", 0, "the schedule is empty; expected every, cron, daily or at"),
        ("   ", 3, "the schedule is empty; expected every, cron, daily or at"),
        ("evry 10s", 0, "unknown schedule kind 'evry'; expected every, cron, daily or at"),
        ("tz=UTC", 0, "a schedule kind must come first; expected every, cron, daily or at"),
        ("every", 5, "expected an interval like 10s, 5m, 1h30m or 2d after 'every'"),
        ("every 10", 8, "expected a unit s, m, h or d after 10"),
        ("every 10x", 8, "expected a unit s, m, h or d after 10, got 'x'"),
        ("every 10min", 8, "expected a unit s, m, h or d after 10, got 'min'"),
        ("  every   10 q", 13, "expected a unit s, m, h or d after 10, got 'q'"),
        ("every 1.5h", 7, "use whole numbers, e.g. 90m rather than 1.5h"),
        ("every -5m", 6, "expected a number like 10 in 'every 10m', got '-5m'"),
        ("every 0s", 6, "the interval must be greater than zero"),
        ("every 0h0m", 6, "the interval must be greater than zero"),
        ("every 1h2h", 9, "unit 'h' is given twice"),
        ("every 36501d", 6, "the interval must be at most 36500d"),
        ("every 10s now", 10, "unexpected 'now' after the interval; only tz=Area/City may follow"),
        ("cron 0 25 * * *", 7, "cron field 2 (hour) '25' is out of range 0-23"),
        ("cron 60 * * * *", 5, "cron field 1 (minute) '60' is out of range 0-59"),
        ("cron 0 0 0 * *", 9, "cron field 3 (day-of-month) '0' is out of range 1-31"),
        ("cron 0 0 * 13 *", 11, "cron field 4 (month) '13' is out of range 1-12"),
        ("cron 0 0 * * 8", 13, "cron field 5 (day-of-week) '8' is out of range 0-7"),
        ("cron 1,2,99 * * * *", 9, "cron field 1 (minute) '99' is out of range 0-59"),
        ("cron 0-70 * * * *", 7, "cron field 1 (minute) '70' is out of range 0-59"),
        ("cron 10-5 * * * *", 5, "cron field 1 (minute) range '10-5' runs backwards"),
        ("cron */0 * * * *", 7, "cron field 1 (minute) step '0' must be 1-59"),
        ("cron */90 * * * *", 7, "step '90' must be 1-59; for a longer interval use 'every'"),
        ("cron 0 */x * * *", 9, "cron field 2 (hour): expected a step number after '/'"),
        ("cron 0,,5 * * * *", 7, "cron field 1 (minute): empty entry in the list"),
        ("cron 0 0 * foo *", 11, "cron field 4 (month) 'foo' is not a number or a name like jan"),
        ("cron 0 ? * * *", 7, "cron field 2 (hour): '?' only fits the day fields"),
        ("cron 0 0 1,? * *", 11, "cron field 3 (day-of-month): '?' must stand alone"),
        ("cron 0 0 * * 1#2,3", 13, "n#k and Ln cannot be mixed with plain days"),
        ("cron 0 0 * * 5#6", 15, "cron field 5 (day-of-week) occurrence '6' is out of range 1-5"),
        ("cron 0 0 * * Lfri", 14, "cron field 5 (day-of-week) last weekday 'fri' is not a number"),
        ("cron 0 0 31 2,4 *", 9, "day 31 never occurs in month 2,4, so it never runs"),
        ("cron 0 0 * * * 0", 15, "unexpected 6th cron field '0'"),
        ("cron 0 0 * *", 12, "cron needs 5 fields"),
        ("cron", 4, "got 0"),
        ("cron @hourly", 5, "cron macros like '@hourly' are not supported"),
        ("daily", 5, "expected a time of day like 22:56 after 'daily'"),
        ("daily 10", 6, "expected a time of day HH:MM or HH:MM:SS, got '10'"),
        ("daily 2pm", 6, "expected a time of day HH:MM or HH:MM:SS, got '2pm'"),
        ("daily 24:00", 6, "hour '24' is out of range 0-23"),
        ("daily 10:60", 9, "minute '60' is out of range 0-59"),
        ("daily 10:00:60", 12, "second '60' is out of range 0-59"),
        ("daily 10:00 11:00", 12, "unexpected '11:00' after the time"),
        ("daily 22:00+01:00", 11, "give the zone as tz=Area/City, not as an offset or Z"),
        ("at", 2, "expected a date and time like 2026-05-01T09:00 after 'at'"),
        ("at tomorrow", 3, "expected a date and time like 2026-05-01T09:00, got 'tomorrow'"),
        ("at 1969-12-31T10:00", 3, "year '1969' is out of range 1970-9998"),
        ("at 2026-13-01T10:00", 8, "month '13' is out of range 1-12"),
        ("at 2026-02-29T10:00", 11, "day of 2026-02 '29' is out of range 1-28"),
        ("at 2026-01-01", 13, "expected 'T' and a time after the date"),
        ("at 2026-01-01T25:00", 14, "hour '25' is out of range 0-23"),
        ("at 2026-01-01T10:00Z", 19, "give the zone as tz=Area/City"),
        ("at 2026-01-01 10:00 now", 20, "unexpected 'now' after the date and time"),
        ("daily 10:00 tz=Mars/Olympus", 15, "unknown time zone 'Mars/Olympus'"),
        ("daily 10:00 tz=europe/london", 15, "did you mean 'Europe/London'?"),
        ("every 5m tz=../etc/passwd", 12, "unknown time zone '../etc/passwd'"),
        ("daily 10:00 tz=Europe", 15, "unknown time zone 'Europe'"),
        ("daily 10:00 tz=", 15, "expected a time zone like Europe/London after 'tz='"),
        ("daily 10:00 tz=UTC daily", 19, "tz=Area/City must come last"),
        # The first bad token wins: the hour comes before the zone.
        ("daily 25:00 tz=Nowhere/Zone", 6, "hour '25'"),
    ],
)
def test_parse_error_points_at_the_bad_token(text: str, position: int, reason: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_timer(text)
    assert caught.value.position == position
    assert reason in caught.value.reason
    assert caught.value.text == text


@given(st.text(alphabet=st.sampled_from(list("everycrondailat tz=:-/*,#?L0123456789smhdTZ"))))
def test_parse_either_succeeds_or_raises_schedule_error_with_a_position(text: str) -> None:
    try:
        parse_timer(text)
    except ScheduleError as exc:
        position = exc.position
    else:
        return
    assert 0 <= position <= len(text)


def test_validate_timer_accepts_none_and_valid_text_and_refuses_bad_text() -> None:
    validate_timer(None)
    validate_timer("cron */5 * * * *")
    with pytest.raises(ScheduleError):
        validate_timer("every")


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.next_after(datetime(2026, 1, 1), default_tz=UTC),
        lambda s: s.next_fire(
            now=datetime(2026, 1, 1), last_ran=None, last_end=None, default_tz=UTC
        ),
        lambda s: s.next_fire(
            now=utc(2026, 1, 1), last_ran=datetime(2026, 1, 1), last_end=None, default_tz=UTC
        ),
        lambda s: s.next_fire(
            now=utc(2026, 1, 1), last_ran=None, last_end=datetime(2026, 1, 1), default_tz=UTC
        ),
        lambda s: s.skip_missed(datetime(2026, 1, 1), now=utc(2026, 1, 2), default_tz=UTC),
        lambda s: s.skip_missed(utc(2026, 1, 1), now=datetime(2026, 1, 2), default_tz=UTC),
    ],
)
@pytest.mark.parametrize(
    "text", ["every 10s", "cron 0 * * * *", "daily 10:00", "at 2026-05-01T09:00"]
)
def test_naive_datetimes_are_refused(text: str, call: Callable[[Schedule], object]) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        call(parse_timer(text))


# ---------------------------------------------------------------- every


def test_every_fires_interval_after_the_end_of_the_last_run() -> None:
    schedule = parse_timer("every 10s")
    now = utc(2026, 5, 1, 12)
    assert schedule.next_fire(
        now=now,
        last_ran=utc(2026, 5, 1, 11, 59),
        last_end=utc(2026, 5, 1, 11, 59, 55),
        default_tz=UTC,
    ) == utc(2026, 5, 1, 12, 0, 5)
    # Long ago: the answer is in the past and the caller sees a missed run.
    assert schedule.next_fire(
        now=now, last_ran=None, last_end=utc(2026, 5, 1), default_tz=UTC
    ) == utc(2026, 5, 1, 0, 0, 10)
    assert schedule.next_fire(now=now, last_ran=None, last_end=None, default_tz=UTC) == utc(
        2026, 5, 1, 12, 0, 10
    )
    # Still running (no end yet): counted from now.
    assert schedule.next_fire(
        now=now, last_ran=utc(2026, 5, 1, 11), last_end=None, default_tz=UTC
    ) == utc(2026, 5, 1, 12, 0, 10)


def test_every_skip_missed_stays_on_the_grid_strictly_after_now() -> None:
    schedule = parse_timer("every 10m")
    due = utc(2026, 5, 1, 12)
    assert schedule.skip_missed(due, now=utc(2026, 5, 1, 12, 35), default_tz=UTC) == utc(
        2026, 5, 1, 12, 40
    )
    assert schedule.skip_missed(due, now=utc(2026, 5, 1, 12, 40), default_tz=UTC) == utc(
        2026, 5, 1, 12, 50
    )
    assert schedule.skip_missed(due, now=due, default_tz=UTC) == utc(2026, 5, 1, 12, 10)
    # Not missed at all: unchanged.
    assert schedule.skip_missed(due, now=utc(2026, 5, 1, 11), default_tz=UTC) == due


def test_every_is_elapsed_time_even_for_anchors_given_in_a_dst_zone() -> None:
    # 01:30 BST on the fall-back day; a wall-clock "+1h" would land at 02:30 GMT.
    anchor = datetime(2026, 10, 25, 1, 30, tzinfo=LONDON)
    found = next_after("every 1h", anchor, LONDON)
    assert found == utc(2026, 10, 25, 1, 30)
    assert found is not None
    assert found.tzinfo is UTC
    assert next_after("every 1h tz=Europe/London", utc(2026, 3, 29, 0, 30)) == utc(
        2026, 3, 29, 1, 30
    )


# ---------------------------------------------------------------- cron and daily


def test_daily_fires_at_the_wall_time_in_its_zone_or_the_default_zone() -> None:
    start = utc(2026, 1, 10, 12)
    assert next_after("daily 09:00", start, LONDON) == utc(2026, 1, 11, 9)
    assert next_after("daily 09:00", start, NEW_YORK) == utc(2026, 1, 10, 14)
    assert next_after("daily 09:00 tz=America/New_York", start, LONDON) == utc(2026, 1, 10, 14)
    assert next_after("daily 22:56:30 tz=Europe/London", utc(2026, 7, 1)) == utc(
        2026, 7, 1, 21, 56, 30
    )
    # Strictly after: the anchor itself is not the next occurrence.
    assert next_after("daily 09:00", utc(2026, 1, 10, 9), LONDON) == utc(2026, 1, 11, 9)


@pytest.mark.parametrize(
    ("text", "start", "expected"),
    [
        ("cron */15 * * * *", utc(2026, 5, 1, 12, 7), [(12, 15), (12, 30), (12, 45), (13, 0)]),
        ("cron 0 9 * * *", utc(2026, 5, 1, 12), [(9, 0)] * 4),
        ("cron 5,35 10-11 * * *", utc(2026, 5, 1), [(10, 5), (10, 35), (11, 5), (11, 35)]),
    ],
)
def test_cron_follows_its_fields(
    text: str, start: datetime, expected: list[tuple[int, int]]
) -> None:
    assert [(f.hour, f.minute) for f in chain(text, start, 4)] == expected


def test_cron_names_or_semantics_and_last_day() -> None:
    # 2027-01-01 is a Friday: the first weekday of jan-mar after March 2026.
    assert next_after("cron 0 9 * jan-mar mon-fri", utc(2026, 3, 31, 12)) == utc(2027, 1, 1, 9)
    # Day-of-month and day-of-week restricted together are OR-ed (Vixie cron).
    days = [f.day for f in chain("cron 0 0 13 * fri", utc(2026, 1, 1), 4)]
    assert days == [2, 9, 13, 16]
    assert next_after("cron 0 0 L * *", utc(2026, 2, 1)) == utc(2026, 2, 28)
    assert next_after("cron 0 0 * * fri#2", utc(2026, 1, 1)) == utc(2026, 1, 9)
    assert next_after("cron 0 0 29 2 *", utc(2026, 1, 1)) == utc(2028, 2, 29)


@pytest.mark.parametrize("text", ["cron 30 9 * * *", "daily 09:30"])
def test_cron_and_daily_next_fire_and_skip_missed(text: str) -> None:
    schedule = parse_timer(text)
    now = utc(2026, 5, 3, 12)
    # After the last start, even when that gives a time in the past (a missed run).
    assert schedule.next_fire(
        now=now, last_ran=utc(2026, 5, 1, 9, 30), last_end=utc(2026, 5, 1, 9, 31), default_tz=UTC
    ) == utc(2026, 5, 2, 9, 30)
    assert schedule.next_fire(now=now, last_ran=None, last_end=None, default_tz=UTC) == utc(
        2026, 5, 4, 9, 30
    )
    missed = utc(2026, 5, 2, 9, 30)
    assert schedule.skip_missed(missed, now=now, default_tz=UTC) == utc(2026, 5, 4, 9, 30)
    assert schedule.skip_missed(missed, now=utc(2026, 5, 4, 9, 30), default_tz=UTC) == utc(
        2026, 5, 5, 9, 30
    )


# ---------------------------------------------------------------- at


def test_at_fires_once_and_not_again() -> None:
    schedule = parse_timer("at 2026-05-01T09:00 tz=Europe/London")
    at = utc(2026, 5, 1, 8)
    assert schedule.next_after(utc(2026, 4, 1), default_tz=UTC) == at
    assert schedule.next_after(at, default_tz=UTC) is None
    later = utc(2026, 6, 1)
    # Never ran and the time has passed: due in the past, the caller decides.
    assert schedule.next_fire(now=later, last_ran=None, last_end=None, default_tz=UTC) == at
    assert (
        schedule.next_fire(now=later, last_ran=utc(2026, 4, 1), last_end=None, default_tz=UTC) == at
    )
    assert schedule.next_fire(now=later, last_ran=at, last_end=at, default_tz=UTC) is None
    assert schedule.skip_missed(at, now=later, default_tz=UTC) is None


def test_at_uses_the_default_zone_and_accepts_a_space_and_seconds() -> None:
    schedule = parse_timer("at 2026-05-01 09:00:30")
    assert schedule.next_after(utc(2026, 1, 1), default_tz=NEW_YORK) == utc(2026, 5, 1, 13, 0, 30)


def test_at_in_a_gap_or_a_repeated_hour() -> None:
    assert next_after("at 2026-03-29T01:30 tz=Europe/London", utc(2026, 1, 1)) == utc(
        2026, 3, 29, 1
    )
    assert next_after("at 2026-10-25T01:30 tz=Europe/London", utc(2026, 1, 1)) == utc(
        2026, 10, 25, 0, 30
    )
    assert next_after("at 2026-03-08T02:15", utc(2026, 1, 1), NEW_YORK) == utc(2026, 3, 8, 7)


# ---------------------------------------------------------------- DST

# Europe/London 2026: 01:00 GMT -> 02:00 BST on 03-29 (01:00 UTC), 02:00 BST -> 01:00 GMT on
# 10-25 (01:00 UTC). America/New_York 2026: 02:00 EST -> 03:00 EDT on 03-08 (07:00 UTC),
# 02:00 EDT -> 01:00 EST on 11-01 (06:00 UTC).


@pytest.mark.parametrize("kind", ["daily 01:30", "cron 30 1 * * *"])
def test_fixed_time_in_the_london_gap_fires_right_after_it(kind: str) -> None:
    fires = chain(f"{kind} tz=Europe/London", utc(2026, 3, 27, 12), 3)
    assert fires == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]


@pytest.mark.parametrize("kind", ["daily 01:30", "cron 30 1 * * *"])
def test_fixed_time_in_the_london_repeated_hour_fires_once(kind: str) -> None:
    fires = chain(f"{kind} tz=Europe/London", utc(2026, 10, 24, 12), 2)
    assert fires == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    # From between the two 01:30s the next is tomorrow, not the second 01:30.
    assert next_after(f"{kind} tz=Europe/London", utc(2026, 10, 25, 0, 45)) == utc(
        2026, 10, 26, 1, 30
    )


@pytest.mark.parametrize("kind", ["daily 02:30", "cron 30 2 * * *"])
def test_fixed_time_in_the_new_york_gap_fires_right_after_it(kind: str) -> None:
    fires = chain(kind, utc(2026, 3, 7, 12), 2, NEW_YORK)
    assert fires == [utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)]


@pytest.mark.parametrize("kind", ["daily 01:30", "cron 30 1 * * *"])
def test_fixed_time_in_the_new_york_repeated_hour_fires_once(kind: str) -> None:
    fires = chain(f"{kind} tz=America/New_York", utc(2026, 10, 31, 12), 2)
    assert fires == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]


@pytest.mark.parametrize(
    ("zone", "start", "expected_hours"),
    [
        (LONDON, utc(2026, 10, 24, 23, 30), [0, 1, 2, 3]),  # both 01:00s
        (LONDON, utc(2026, 3, 28, 23, 30), [0, 1, 2, 3]),  # 01:00 GMT never exists
        (NEW_YORK, utc(2026, 11, 1, 4, 30), [5, 6, 7, 8]),
        (NEW_YORK, utc(2026, 3, 8, 5, 30), [6, 7, 8, 9]),
    ],
)
def test_hourly_cron_fires_every_real_hour_across_transitions(
    zone: ZoneInfo, start: datetime, expected_hours: list[int]
) -> None:
    fires = chain("cron 0 * * * *", start, 4, zone)
    assert [f.hour for f in fires] == expected_hours
    assert all(f.minute == 0 for f in fires)


def test_wildcard_hour_cron_neither_gains_nor_loses_runs() -> None:
    # A skipped 01:30 is not moved to 02:00 BST: that would be a run 30 minutes early.
    fires = chain("cron 30 * * * *", utc(2026, 3, 28, 23, 45), 3, LONDON)
    assert fires == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 2, 30)]
    quarter = chain("cron */15 * * * *", utc(2026, 10, 24, 23, 59), 9, LONDON)
    assert quarter == [utc(2026, 10, 25, 0, 0) + timedelta(minutes=15 * i) for i in range(9)]


def test_fixed_hour_cron_runs_each_wall_time_once() -> None:
    autumn = chain("cron */30 1 * * *", utc(2026, 10, 24, 12), 3, LONDON)
    assert autumn == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1)]
    # 01:00 and 01:30 both fall in the gap: one run right after it.
    spring = chain("cron */30 1 * * *", utc(2026, 3, 28, 12), 2, LONDON)
    assert spring == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0)]
    # Spelling the hours out makes them fixed times: the repeated 01:00 runs once.
    listed = chain("cron 0 0-23 * * *", utc(2026, 10, 24, 23, 30), 3, LONDON)
    assert listed == [utc(2026, 10, 25, 0), utc(2026, 10, 25, 2), utc(2026, 10, 25, 3)]


def test_skip_missed_over_a_transition_uses_the_dst_rules() -> None:
    schedule = parse_timer("daily 01:30 tz=Europe/London")
    assert schedule.skip_missed(
        utc(2026, 3, 28, 1, 30), now=utc(2026, 3, 28, 12), default_tz=UTC
    ) == utc(2026, 3, 29, 1)


# ---------------------------------------------------------------- properties

ZONES = [
    "Europe/London",
    "America/New_York",
    "Australia/Lord_Howe",  # half-hour DST shifts
    "Pacific/Apia",  # skipped 2011-12-30 entirely
    "America/Sao_Paulo",  # DST changed at midnight until 2019
    "Asia/Kolkata",
    "UTC",
]
# Real transitions (UTC instants) to draw anchors around, paired with their zone.
TRANSITIONS = [
    ("Europe/London", utc(2026, 3, 29, 1)),
    ("Europe/London", utc(2026, 10, 25, 1)),
    ("America/New_York", utc(2026, 3, 8, 7)),
    ("America/New_York", utc(2026, 11, 1, 6)),
    ("Australia/Lord_Howe", utc(2026, 4, 4, 15)),
    ("Australia/Lord_Howe", utc(2026, 10, 3, 15, 30)),
    ("Pacific/Apia", utc(2011, 12, 30, 10)),
    ("America/Sao_Paulo", utc(2018, 11, 4, 3)),
    ("America/Sao_Paulo", utc(2019, 2, 17, 2)),
]

zones = st.sampled_from(ZONES).map(ZoneInfo)
deltas = st.one_of(
    st.timedeltas(min_value=timedelta(hours=-2), max_value=timedelta(hours=2)),
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2)),
)
near_transition = st.sampled_from(TRANSITIONS).flatmap(
    lambda pair: st.tuples(st.just(ZoneInfo(pair[0])), deltas.map(lambda delta: pair[1] + delta))
)
anywhere = st.tuples(
    zones,
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2040, 1, 1)).map(
        lambda d: d.replace(tzinfo=UTC)
    ),
)
cases = st.one_of(near_transition, anywhere)
cron_texts = st.builds(
    lambda *fields: "cron " + " ".join(fields),
    st.sampled_from(["0", "30", "*/15", "*", "5,35", "0-10/5", "59"]),
    st.sampled_from(["*", "1", "2", "0-3", "*/2", "1,2,3", "23", "0"]),
    st.sampled_from(["*", "1", "15", "L", "29", "31"]),
    st.sampled_from(["*", "3", "10,11", "*/2", "1-12"]),
    st.sampled_from(["*", "0", "1-5", "sun", "fri#2"]),
)
# Mostly no suffix, so that the drawn zone (paired with its transitions) applies.
zone_suffix = st.one_of(
    st.just(""), st.just(""), st.just(""), st.sampled_from(ZONES).map(lambda z: f" tz={z}")
)
grid_texts = st.builds(
    lambda body, suffix: body + suffix,
    st.one_of(
        cron_texts,
        st.times().map(lambda t: f"daily {t:%H:%M:%S}"),
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1)).map(
            lambda d: f"at {d:%Y-%m-%dT%H:%M:%S}"
        ),
    ),
    zone_suffix,
)
schedule_texts = st.one_of(
    grid_texts, st.integers(1, 10**7).map(lambda n: f"every {n}s"), st.just("every 1h30m")
)
steps = st.one_of(
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=3)),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
)


def _parse_valid(text: str) -> Schedule:
    try:
        return parse_timer(text)
    except ScheduleError:
        # Day-of-month values that no chosen month has are refused; draw again.
        assume(False)
        raise


@settings(deadline=None, max_examples=300)
@given(text=schedule_texts, case=cases, step=steps)
def test_next_after_is_strictly_later_and_monotone(
    text: str, case: tuple[ZoneInfo, datetime], step: timedelta
) -> None:
    zone, start = case
    schedule = _parse_valid(text)
    first = schedule.next_after(start, default_tz=zone)
    second = schedule.next_after(start + step, default_tz=zone)
    if first is not None:
        assert first > start
        assert first.tzinfo is UTC
    if second is not None:
        assert second > start + step
    if first is None:
        assert second is None  # None means "never", which sorts last
    elif second is not None:
        assert first <= second


@settings(deadline=None, max_examples=300)
@given(text=grid_texts, case=cases, fraction=st.floats(0, 1, exclude_max=True))
def test_next_after_skips_no_occurrence(
    text: str, case: tuple[ZoneInfo, datetime], fraction: float
) -> None:
    zone, start = case
    schedule = _parse_valid(text)
    found = schedule.next_after(start, default_tz=zone)
    if found is None:
        return
    between = min(start + (found - start) * fraction, found - timedelta(microseconds=1))
    # No occurrence lies in (start, found), so from anywhere in [start, found) it is next.
    assert schedule.next_after(max(between, start), default_tz=zone) == found


def _first_matching_instant(expr: str, after: datetime, zone: ZoneInfo) -> datetime:
    instant = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while not croniter.match(expr, instant.astimezone(zone).replace(tzinfo=None)):
        instant += timedelta(minutes=1)
    return instant


@settings(deadline=None, max_examples=200)
@given(
    minute=st.sampled_from(["0", "30", "*/15", "*/7", "5,35", "45", "*"]),
    hour=st.sampled_from(["*", "*/2", "*/3"]),
    case=near_transition,
)
def test_wildcard_hour_cron_matches_the_wall_clock_of_every_real_minute(
    minute: str, hour: str, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, start = case
    expr = f"{minute} {hour} * * *"
    expected = _first_matching_instant(expr, start, zone)
    assert next_after(f"cron {expr}", start, zone) == expected


@settings(deadline=None, max_examples=200)
@given(hour=st.integers(0, 23), minute=st.integers(0, 59), case=cases)
def test_fixed_cron_agrees_with_daily(
    hour: int, minute: int, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, start = case
    assert next_after(f"cron {minute} {hour} * * *", start, zone) == next_after(
        f"daily {hour:02}:{minute:02}", start, zone
    )
