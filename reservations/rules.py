"""Booking limits and the weekly quota, as pure functions (docs/scheduling.md, admin-set limits)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

HOUR = Decimal(3600)


@dataclass(frozen=True)
class BookingLimits:
    """A channel's limits; None means no limit."""

    min_minutes: int = 0
    max_minutes: int | None = None
    max_days_ahead: int | None = None
    weekly_quota_hours: Decimal | None = None


@dataclass(frozen=True)
class LimitBroken:
    """Which field broke which rule, in words a person can act on."""

    field: str
    message: str


def _minutes(value: float) -> str:
    minutes = round(value)
    if minutes % 60 == 0:
        hours = minutes // 60
        return f"{hours} hour" + ("s" if hours != 1 else "")
    return f"{minutes} minutes"


def check_length_and_horizon(
    *, start: datetime, end: datetime, now: datetime, limits: BookingLimits
) -> LimitBroken | None:
    # In UTC: two times of one zone subtract as wall-clock times, wrong across DST.
    length = (end.astimezone(UTC) - start.astimezone(UTC)).total_seconds() / 60
    if length < limits.min_minutes:
        return LimitBroken("end", f"a booking on this channel lasts at least {_minutes(limits.min_minutes)}")
    if limits.max_minutes is not None and length > limits.max_minutes:
        return LimitBroken("end", f"a booking on this channel lasts at most {_minutes(limits.max_minutes)}")
    if limits.max_days_ahead is not None and start > now + timedelta(days=limits.max_days_ahead):
        return LimitBroken(
            "start", f"bookings on this channel start at most {limits.max_days_ahead} days ahead"
        )
    return None


@dataclass(frozen=True)
class IdleFacts:
    """A running model booking as the idle rule sees it."""

    start: datetime
    end: datetime
    exclusive: bool
    used: bool  # a request reached it
    warn_minutes: int | None  # the channel's rule; None: off
    release_minutes: int | None  # None: warn only
    warned_at: datetime | None


def idle_step(facts: IdleFacts, now: datetime) -> str | None:
    """What the idle rule does now: ``"warn"`` the booker, ``"release"`` the rest of the slot,
    or nothing. The booker always has the full ``release_minutes`` after the warning, even when
    the warning went out late."""
    if facts.exclusive or facts.used or facts.warn_minutes is None:
        return None
    if not facts.start <= now < facts.end:
        return None
    warn_at = facts.start + timedelta(minutes=facts.warn_minutes)
    if now < warn_at:
        return None
    if facts.warned_at is None:
        return "warn"
    if facts.release_minutes is None:
        return None
    release_at = max(warn_at, facts.warned_at) + timedelta(minutes=facts.release_minutes)
    return "release" if now >= release_at else None


def week_of(moment: datetime) -> datetime:
    """The start of the quota week holding ``moment``: Monday 00:00 UTC."""
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def hours_by_week(slots: Iterable[tuple[datetime, datetime]]) -> dict[datetime, Decimal]:
    """Booked hours per quota week; a slot across Monday counts in both weeks."""
    used: dict[datetime, Decimal] = defaultdict(Decimal)
    for start, end in slots:
        week = week_of(start)
        while week < end:
            next_week = week + timedelta(days=7)
            overlap = (min(end, next_week) - max(start, week)).total_seconds()
            if overlap > 0:
                used[week] += Decimal(overlap) / HOUR
            week = next_week
    return dict(used)


def check_quota(
    *,
    start: datetime,
    end: datetime,
    held: Iterable[tuple[datetime, datetime]],
    quota_hours: Decimal | None,
    whose: str = "your",
) -> LimitBroken | None:
    """``held`` are the user's (or the group's) other pending or approved slots on the channel."""
    if quota_hours is None:
        return None
    used = hours_by_week(held)
    for week, wanted in hours_by_week([(start, end)]).items():
        left = quota_hours - used.get(week, Decimal(0))
        if wanted > left:
            return LimitBroken(
                "end",
                f"over {whose} weekly quota on this channel: {quota_hours.normalize():f} hours a week, "
                f"{max(left, Decimal(0)):.2f} left in the week of {week:%Y-%m-%d}",
            )
    return None


def quota_left(*, at: datetime, held: Iterable[tuple[datetime, datetime]], quota_hours: Decimal) -> Decimal:
    """Hours left in the quota week holding ``at``."""
    return quota_hours - hours_by_week(held).get(week_of(at), Decimal(0))


@dataclass(frozen=True)
class Closure:
    """A blackout as the booking rules see it (``reservations.models.Blackout``)."""

    start: datetime
    end: datetime
    reason: str


def closure_over(*, start: datetime, end: datetime, closures: Iterable[Closure]) -> Closure | None:
    """The first blackout the slot ``[start, end)`` overlaps, if any: a slot that overlaps one is
    refused, whoever books it (back to back is fine)."""
    overlapping = sorted((c for c in closures if c.start < end and c.end > start), key=lambda c: c.start)
    return overlapping[0] if overlapping else None
