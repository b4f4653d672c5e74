"""Recurring bookings: the occurrences of a series, as a pure function.

Occurrences keep the first one's local wall-clock times in the booker's zone: a weekly 10:00
booking in Berlin stays at 10:00 Berlin across the change to summer time (09:00 → 08:00 UTC).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator
from datetime import date, datetime, timedelta, tzinfo

REPEATS = ("daily", "weekdays", "weekly", "monthly", "monthly_weekday")
# A series holds at most this many occurrences (a year of weekly slots, two months of daily ones).
MAX_OCCURRENCES = 60
# "Every N" days, weeks or months: at most a year of weeks.
MAX_EVERY = 52
DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class RecurrenceError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _month_day(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:  # no 31st in April
        return None


def _weekday_of_month(year: int, month: int, weekday: int, nth: int) -> date | None:
    """The ``nth`` (0-based; 4: the last) ``weekday`` of the month."""
    if nth == 4:
        following = date(year + month // 12, month % 12 + 1, 1)
        last = following - timedelta(days=1)
        return last - timedelta(days=(last.weekday() - weekday) % 7)
    first = date(year, month, 1)
    return _month_day(year, month, 1 + (weekday - first.weekday()) % 7 + 7 * nth)


def _days(first: date, repeat: str, every: int, on_days: frozenset[int]) -> Iterator[date]:
    """The series' days from ``first`` on (``first`` among them), ever on."""
    if repeat in ("monthly", "monthly_weekday"):
        nth = min((first.day - 1) // 7, 4)
        for k in itertools.count():
            months = first.month - 1 + k * every
            year, month = first.year + months // 12, months % 12 + 1
            if year > 9998:
                return
            if repeat == "monthly":
                day = _month_day(year, month, first.day)
            else:
                day = _weekday_of_month(year, month, first.weekday(), nth)
            if day is not None:
                yield day
        return
    if repeat == "daily":
        for k in itertools.count():
            yield first + timedelta(days=k * every)
    allowed = frozenset(range(5)) if repeat == "weekdays" else on_days | {first.weekday()}
    week_one = first - timedelta(days=first.weekday())
    day = first
    while True:
        if (day - week_one).days // 7 % every == 0 and day.weekday() in allowed:
            yield day
        day += timedelta(days=1)


def occurrences(
    *,
    start: datetime,
    end: datetime,
    zone: tzinfo,
    repeat: str,
    until: date | None = None,
    count: int | None = None,
    every: int = 1,
    on_days: Collection[int] = (),
) -> list[tuple[datetime, datetime]]:
    """The series' slots, the first included: ``repeat`` daily, on weekdays, weekly (on the first
    slot's weekday and ``on_days``, 0 Monday … 6 Sunday), monthly on the same date (a month
    without it is skipped) or monthly on the same weekday of the month (the 2nd Tuesday; a 5th
    is the last), every ``every`` days, weeks or months, up to ``until`` (a local date,
    inclusive) or ``count`` occurrences, whichever comes first."""
    if repeat not in REPEATS:
        raise RecurrenceError("repeat", f"repeat {repeat!r}: use one of {', '.join(REPEATS)}")
    if not 1 <= every <= MAX_EVERY:
        raise RecurrenceError("every", f"every: between 1 and {MAX_EVERY}")
    if on_days and repeat != "weekly":
        raise RecurrenceError("on_days", "days of the week are chosen for a weekly series only")
    if any(not 0 <= d <= 6 for d in on_days):
        raise RecurrenceError("on_days", "days of the week are 0 (Monday) to 6 (Sunday)")
    if until is None and count is None:
        raise RecurrenceError("until", "say until when the series repeats (until or count)")
    if count is not None and not 1 <= count <= MAX_OCCURRENCES:
        raise RecurrenceError("count", f"count: between 1 and {MAX_OCCURRENCES} occurrences")
    first, last = start.astimezone(zone), end.astimezone(zone)
    if until is not None and until < first.date():
        raise RecurrenceError("until", "until is before the first occurrence")
    span_days = (last.date() - first.date()).days
    slots: list[tuple[datetime, datetime]] = []
    for day in _days(first.date(), repeat, every, frozenset(on_days)):
        if until is not None and day > until:
            break
        if count is not None and len(slots) >= count:
            break
        if len(slots) >= MAX_OCCURRENCES:
            raise RecurrenceError(
                "until", f"a series holds at most {MAX_OCCURRENCES} occurrences: choose an earlier until"
            )
        local_start = datetime.combine(day, first.timetz().replace(tzinfo=None)).replace(tzinfo=zone)
        local_end = datetime.combine(day + timedelta(days=span_days), last.timetz().replace(tzinfo=None))
        slots.append((local_start, local_end.replace(tzinfo=zone)))
    return slots
