"""Recurring bookings: the occurrences of a series, as a pure function.

Occurrences keep the first one's local wall-clock times in the booker's zone: a weekly 10:00
booking in Berlin stays at 10:00 Berlin across the change to summer time (09:00 → 08:00 UTC).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timedelta, tzinfo

REPEATS = ("daily", "weekdays", "weekly")
# A series holds at most this many occurrences (a year of weekly slots, two months of daily ones).
MAX_OCCURRENCES = 60


class RecurrenceError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _days(first: date, repeat: str) -> Iterator[date]:
    day = first
    while True:
        if repeat != "weekdays" or day.weekday() < 5:
            yield day
        day += timedelta(days=7 if repeat == "weekly" else 1)


def occurrences(
    *,
    start: datetime,
    end: datetime,
    zone: tzinfo,
    repeat: str,
    until: date | None = None,
    count: int | None = None,
) -> list[tuple[datetime, datetime]]:
    """The series' slots, the first included: ``repeat`` daily, on weekdays or weekly, up to
    ``until`` (a local date, inclusive) or ``count`` occurrences, whichever comes first."""
    if repeat not in REPEATS:
        raise RecurrenceError("repeat", f"repeat {repeat!r}: use one of {', '.join(REPEATS)}")
    if until is None and count is None:
        raise RecurrenceError("until", "say until when the series repeats (until or count)")
    if count is not None and not 1 <= count <= MAX_OCCURRENCES:
        raise RecurrenceError("count", f"count: between 1 and {MAX_OCCURRENCES} occurrences")
    first, last = start.astimezone(zone), end.astimezone(zone)
    if until is not None and until < first.date():
        raise RecurrenceError("until", "until is before the first occurrence")
    span_days = (last.date() - first.date()).days
    slots: list[tuple[datetime, datetime]] = []
    for day in _days(first.date(), repeat):
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
