"""Recurring bookings: every occurrence checked, then all of them booked or none, or (when the
booker asks) those that can be, skipping the rest (docs/scheduling.md)."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from reservations.models import Reservation, ReservationSeries, ReservationStatus
from reservations.recurrence import RecurrenceError, occurrences
from reservations.selectors import first_conflict
from reservations.services.asked import NewBooking
from reservations.services.common import (
    InvalidTransition,
    hold_channel,
    is_overlap,
    limit_problems,
    needs_approval,
    new_reservation,
    retrying_deadlocks,
    slot_problems,
    tell_approvers,
    validate_slot,
)
from reservations.services.transitions import reservation_cancel
from reservations.wording import slot_words
from slotserve_base.errors import InvalidInput


class SeriesConflict(Exception):
    """Some occurrences cannot be booked; nothing was. ``problems``: (start, end, why) each."""

    def __init__(self, problems: list[tuple[datetime, datetime, str]], total: int) -> None:
        self.problems = problems
        self.booked = total - len(problems)  # the occurrences that could have been
        listed = "; ".join(f"{slot_words(s, e)}: {why}" for s, e, why in problems[:10])
        more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
        self.message = f"{len(problems)} of {total} occurrences cannot be booked, so none was: {listed}{more}"
        super().__init__(self.message)


def series_problems(
    booking: NewBooking, *, slots: list[tuple[datetime, datetime]], now: datetime
) -> list[tuple[datetime, datetime, str]]:
    """Why each occurrence of ``booking`` that cannot be booked cannot: the slot's own rules, the
    channel's limits (the weekly quota counting the series' earlier occurrences), and overlaps."""
    user, channel, exclusive = booking.user, booking.where, booking.exclusive
    problems: list[tuple[datetime, datetime, str]] = []
    accepted: list[tuple[datetime, datetime]] = []
    for start, end in slots:
        broken = slot_problems(channel=channel, start=start, end=end, now=now, exclusive=exclusive)
        broken += limit_problems(
            user=user, channel=channel, start=start, end=end, now=now, also_held=accepted
        )
        why = [p.message for p in broken]
        conflict = first_conflict(channel, start, end)
        if conflict is not None:
            why.append(f"overlaps {conflict.user}'s booking, {slot_words(conflict.start, conflict.end)}")
        if why:
            problems.append((start, end, "; ".join(why)))
        else:
            accepted.append((start, end))
    return problems


def series_slots(
    *,
    start: datetime,
    end: datetime,
    repeat: str,
    time_zone: str,
    until: date | None,
    count: int | None,
    every: int = 1,
    on_days: tuple[int, ...] = (),
) -> list[tuple[datetime, datetime]]:
    """The occurrences of a series, in UTC; ``InvalidInput`` naming the field that is wrong."""
    try:
        zone = zoneinfo.ZoneInfo(time_zone)
        slots = occurrences(
            start=start,
            end=end,
            zone=zone,
            repeat=repeat,
            until=until,
            count=count,
            every=every,
            on_days=on_days,
        )
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        if isinstance(exc, RecurrenceError):
            raise InvalidInput(exc.field, exc.message) from None
        raise InvalidInput("time_zone", f"{time_zone!r} is not a time zone") from None
    return [(s.astimezone(UTC), e.astimezone(UTC)) for s, e in slots]


@dataclass(frozen=True)
class Repeat:
    """How a series repeats (``reservations.recurrence.occurrences``): ``repeat`` (daily,
    weekdays, weekly, monthly, monthly_weekday) every ``every`` days, weeks or months (weekly:
    also on ``on_days``), until a date or for a count, keeping the local times of ``time_zone``."""

    repeat: str
    time_zone: str
    until: date | None = None
    count: int | None = None
    every: int = 1
    on_days: tuple[int, ...] = ()

    def slots(self, booking: NewBooking) -> list[tuple[datetime, datetime]]:
        return series_slots(
            start=booking.start,
            end=booking.end,
            repeat=self.repeat,
            time_zone=self.time_zone,
            until=self.until,
            count=self.count,
            every=self.every,
            on_days=self.on_days,
        )


def series_preview(
    booking: NewBooking, repeat: Repeat, *, now: datetime
) -> list[tuple[datetime, datetime, str]]:
    """Each occurrence of a series as it would be booked now, with why it cannot be ("" when it
    can): what the booking dialog shows before anything is booked."""
    slots = repeat.slots(booking)
    problems = {(s, e): why for s, e, why in series_problems(booking, slots=slots, now=now)}
    return [(s, e, problems.get((s, e), "")) for s, e in slots]


def reservation_series_create(
    booking: NewBooking, repeat: Repeat, *, now: datetime, skip_conflicts: bool = False
) -> tuple[ReservationSeries, list[Reservation], list[tuple[datetime, datetime, str]]]:
    """Book ``booking`` and its repetitions: the series, its reservations, and the occurrences
    skipped (with why).

    Every occurrence is checked first; if any cannot be booked, ``SeriesConflict`` lists each
    and nothing is saved, unless ``skip_conflicts``: then the others are booked (and with none
    left, ``SeriesConflict``). They are inserted in one transaction, one booking of the channel
    at a time (as ``reservation_create``), with the database's rule behind.
    """
    slots = repeat.slots(booking)
    validate_slot(booking.at(*slots[0]), now=now)
    user, channel = booking.user, booking.where
    pending = needs_approval(channel=channel, exclusive=booking.exclusive, user=user)

    def book() -> tuple[ReservationSeries, list[Reservation], list[tuple[datetime, datetime, str]]]:
        hold_channel(channel.pk)
        problems = series_problems(booking, slots=slots, now=now)
        if problems and (not skip_conflicts or len(problems) == len(slots)):
            raise SeriesConflict(problems, len(slots))
        cannot = {(s, e) for s, e, _ in problems}
        wanted = [(s, e) for s, e in slots if (s, e) not in cannot]
        try:
            with transaction.atomic():
                series = ReservationSeries.objects.create(
                    user=user,
                    channel=channel,
                    repeat=repeat.repeat,
                    until=repeat.until,
                    count=repeat.count,
                    every=repeat.every,
                    on_days=sorted(repeat.on_days),
                    time_zone=repeat.time_zone,
                    created=now,
                )
                made = [
                    new_reservation(booking.at(s, e), pending=pending, now=now, series=series)
                    for s, e in wanted
                ]
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise SeriesConflict(
                series_problems(booking, slots=slots, now=now),
                len(slots),
            ) from None
        if pending:
            tell_approvers(made[0], also=len(made) - 1)
        return series, made, problems

    return retrying_deadlocks(book)


def reservation_series_cancel(*, series: ReservationSeries, by: User, now: datetime) -> list[Reservation]:
    """Cancel every occurrence that has not started; those running or over stay as they are."""
    cancelled = []
    for reservation in series.reservations.filter(
        start__gt=now, status__in=[ReservationStatus.PENDING, ReservationStatus.APPROVED]
    ):
        try:
            cancelled.append(reservation_cancel(reservation=reservation, by=by, now=now))
        except InvalidTransition:
            continue  # changed meanwhile (cancelled, approved and started): left as it is
    return cancelled
