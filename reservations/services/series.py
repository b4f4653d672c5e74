"""Recurring bookings: every occurrence checked, then all of them booked or none, or (when the
booker asks) those that can be, skipping the rest (docs/scheduling.md)."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.models import Channel, LLMModel, Preset
from reservations.models import Reservation, ReservationSeries, ReservationStatus
from reservations.recurrence import RecurrenceError, occurrences
from reservations.selectors import first_conflict
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
    *, user: User, channel: Channel, slots: list[tuple[datetime, datetime]], now: datetime, exclusive: bool
) -> list[tuple[datetime, datetime, str]]:
    """Why each occurrence that cannot be booked cannot: the slot's own rules, the channel's limits
    (the weekly quota counting the series' earlier occurrences), and overlaps."""
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
    *, start: datetime, end: datetime, repeat: str, time_zone: str, until: date | None, count: int | None
) -> list[tuple[datetime, datetime]]:
    """The occurrences of a series, in UTC; ``InvalidInput`` naming the field that is wrong."""
    try:
        zone = zoneinfo.ZoneInfo(time_zone)
        slots = occurrences(start=start, end=end, zone=zone, repeat=repeat, until=until, count=count)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        if isinstance(exc, RecurrenceError):
            raise InvalidInput(exc.field, exc.message) from None
        raise InvalidInput("time_zone", f"{time_zone!r} is not a time zone") from None
    return [(s.astimezone(UTC), e.astimezone(UTC)) for s, e in slots]


def series_preview(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    repeat: str,
    time_zone: str,
    until: date | None = None,
    count: int | None = None,
    exclusive: bool = False,
) -> list[tuple[datetime, datetime, str]]:
    """Each occurrence of a series as it would be booked now, with why it cannot be ("" when it
    can): what the booking dialog shows before anything is booked."""
    slots = series_slots(start=start, end=end, repeat=repeat, time_zone=time_zone, until=until, count=count)
    problems = {
        (s, e): why
        for s, e, why in series_problems(
            user=user, channel=channel, slots=slots, now=now, exclusive=exclusive
        )
    }
    return [(s, e, problems.get((s, e), "")) for s, e in slots]


def reservation_series_create(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    repeat: str,
    time_zone: str,
    until: date | None = None,
    count: int | None = None,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
    skip_conflicts: bool = False,
    lend: bool = False,
) -> tuple[ReservationSeries, list[Reservation], list[tuple[datetime, datetime, str]]]:
    """Book ``[start, end)`` and its repetitions, keeping the local times of ``time_zone``: the
    series, its reservations, and the occurrences skipped (with why).

    Every occurrence is checked first; if any cannot be booked, ``SeriesConflict`` lists each
    and nothing is saved, unless ``skip_conflicts``: then the others are booked (and with none
    left, ``SeriesConflict``). They are inserted in one transaction, one booking of the channel
    at a time (as ``reservation_create``), with the database's rule behind.
    """
    slots = series_slots(start=start, end=end, repeat=repeat, time_zone=time_zone, until=until, count=count)
    validate_slot(
        channel=channel,
        start=slots[0][0],
        end=slots[0][1],
        now=now,
        model=model,
        preset=preset,
        exclusive=exclusive,
        lend=lend,
    )
    pending = needs_approval(channel=channel, exclusive=exclusive, user=user)

    def book() -> tuple[ReservationSeries, list[Reservation], list[tuple[datetime, datetime, str]]]:
        hold_channel(channel.pk)
        problems = series_problems(user=user, channel=channel, slots=slots, now=now, exclusive=exclusive)
        if problems and (not skip_conflicts or len(problems) == len(slots)):
            raise SeriesConflict(problems, len(slots))
        cannot = {(s, e) for s, e, _ in problems}
        wanted = [(s, e) for s, e in slots if (s, e) not in cannot]
        try:
            with transaction.atomic():
                series = ReservationSeries.objects.create(
                    user=user,
                    channel=channel,
                    repeat=repeat,
                    until=until,
                    count=count,
                    time_zone=time_zone,
                    created=now,
                )
                made = [
                    new_reservation(
                        user=user,
                        channel=channel,
                        start=s,
                        end=e,
                        model=model,
                        preset=preset,
                        exclusive=exclusive,
                        note=note,
                        pending=pending,
                        now=now,
                        series=series,
                        lend=lend,
                    )
                    for s, e in wanted
                ]
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise SeriesConflict(
                series_problems(user=user, channel=channel, slots=slots, now=now, exclusive=exclusive),
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
