"""Blackouts and bulletins: staff close channels for a time, with a reason every refusal
quotes, and say something on everyone's overview (docs/portal.md, "Blackouts and
bulletins").

A blackout is made one booking of its channels at a time: it takes the rows the bookings take
(``hold_channel``), so a booking committed meanwhile is among its conflicts and a booking
made after it sees it. Bookings it overlaps are refused unless staff choose to cancel them
with it; their bookers are told the reason.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from channels_app.models import Channel
from reservations.models import (
    BLACKOUT_REASON_MOST,
    BULLETIN_MOST,
    Blackout,
    Bulletin,
    Reservation,
    ReservationStatus,
)
from reservations.services.common import hold_channel, retrying_deadlocks
from reservations.services.transitions import reservation_cancel, reservation_end
from reservations.wording import moment_words, slot_words
from slotserve_base.errors import InvalidInput

# How many overlapping bookings a refusal names (it counts them all).
NAMED = 5


def _staff(by: User) -> None:
    if not by.is_staff:
        raise PermissionDenied("only staff close channels or post bulletins")


def blackout_conflicts(
    *, channel_ids: Collection[int], start: datetime, end: datetime
) -> QuerySet[Reservation]:
    """The bookings (pending or approved) a blackout of ``channel_ids`` (none: every channel)
    over ``[start, end)`` overlaps, in time order."""
    found = Reservation.objects.blocking().overlapping(start, end)
    if channel_ids:
        found = found.filter(channel_id__in=channel_ids)
    return found.select_related("user", "channel").order_by("start", "pk")


def _booking_words(reservation: Reservation) -> str:
    return f"{reservation.user}'s of {reservation.channel}, {slot_words(reservation.start, reservation.end)}"


def blackout_create(
    *,
    by: User,
    channels: Collection[Channel],
    start: datetime,
    end: datetime,
    reason: str,
    now: datetime,
    cancel_bookings: bool = False,
) -> tuple[Blackout, list[Reservation]]:
    """Close ``channels`` (none: every channel) over ``[start, end)``. Returns the blackout and
    the bookings it cancelled or ended (only with ``cancel_bookings``; otherwise any booking it
    overlaps refuses it, named)."""
    _staff(by)
    reason = reason.strip()
    if not reason:
        raise InvalidInput(
            "reason", "say why the channels are closed: every refusal and the calendar quote it"
        )
    if len(reason) > BLACKOUT_REASON_MOST:
        raise InvalidInput("reason", f"the reason is at most {BLACKOUT_REASON_MOST} characters")
    if end <= start:
        raise InvalidInput("end", "end must be after start")
    if end <= now:
        raise InvalidInput("end", "this time is over; a blackout closes time to come")
    start = max(start, now)  # a blackout "from now" closes no time that has passed
    channel_ids = sorted({c.pk for c in channels})

    def close() -> tuple[Blackout, list[Reservation]]:
        for channel_id in channel_ids or Channel.objects.order_by("pk").values_list("pk", flat=True):
            hold_channel(channel_id)
        conflicts = list(blackout_conflicts(channel_ids=channel_ids, start=start, end=end))
        under_way = [r for r in conflicts if r.status == ReservationStatus.APPROVED and r.start <= now]
        if under_way and start > now:
            first = under_way[0]
            raise InvalidInput(
                "start",
                f"{_booking_words(first)} is under way and runs into the blackout: end it first, "
                f"or begin the blackout at {moment_words(first.end)}",
            )
        if conflicts and not cancel_bookings:
            named = "; ".join(_booking_words(r) for r in conflicts[:NAMED])
            more = f" and {len(conflicts) - NAMED} more" if len(conflicts) > NAMED else ""
            raise InvalidInput(
                "cancel_bookings",
                f"{len(conflicts)} booking(s) overlap it ({named}{more}): cancel them with the blackout "
                "(their bookers are told the reason) or choose another time",
            )
        blackout = Blackout.objects.create(start=start, end=end, reason=reason, created_by=by, created=now)
        blackout.channels.set(channel_ids)
        told = f"the channel is closed {slot_words(start, end)}: {reason}"
        for reservation in conflicts:
            if reservation in under_way:
                reservation_end(reservation=reservation, by=by, now=now, reason=told)
            else:
                reservation_cancel(reservation=reservation, by=by, now=now, reason=told)
        return blackout, conflicts

    return retrying_deadlocks(close)


def blackout_delete(*, blackout: Blackout, by: User) -> None:
    """Open the channels again (the audit trail keeps that it was)."""
    _staff(by)
    blackout.delete()


def bulletin_create(
    *, by: User, text: str, shown_from: datetime | None, shown_until: datetime | None, now: datetime
) -> Bulletin:
    """A line on everyone's overview from ``shown_from`` (none: now) until ``shown_until``
    (none: until it is taken down)."""
    _staff(by)
    text = text.strip()
    if not text:
        raise InvalidInput("text", "a bulletin says something")
    if len(text) > BULLETIN_MOST:
        raise InvalidInput("text", f"a bulletin is at most {BULLETIN_MOST} characters")
    shown_from = shown_from or now
    if shown_until is not None and shown_until <= shown_from:
        raise InvalidInput("shown_until", "it must end after it begins")
    if shown_until is not None and shown_until <= now:
        raise InvalidInput("shown_until", "this time is over; nobody would see it")
    return Bulletin.objects.create(
        text=text, shown_from=shown_from, shown_until=shown_until, created_by=by, created=now
    )


def bulletin_delete(*, bulletin: Bulletin, by: User) -> None:
    _staff(by)
    bulletin.delete()
