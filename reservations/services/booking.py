"""Booking a slot: on a named channel, or on the best channel that fits (docs/scheduling.md, "Placement")."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.db import IntegrityError, transaction

from channels_app.models import Channel
from reservations.models import Reservation
from reservations.selectors import blackouts_over, first_conflict
from reservations.services.asked import NewBooking
from reservations.services.common import (
    ReservationConflict,
    check_limits,
    hold_channel,
    is_overlap,
    needs_approval,
    new_reservation,
    retrying_deadlocks,
    tell_approvers,
    validate_slot,
)
from slotserve_base.errors import InvalidInput


def reservation_create(booking: NewBooking, *, now: datetime) -> Reservation:
    """Book what ``booking`` asks for; raises ``ReservationConflict`` on overlap.

    The overlap check and the insert run one booking of the channel at a time:
    in one ``BEGIN IMMEDIATE`` transaction on SQLite, under the channel's row
    lock on PostgreSQL (``hold_channel``). The exclusion constraint stands
    behind the check; should an insert still break it, the slot that won is
    reported.
    """
    booking = booking.in_utc()
    validate_slot(booking, now=now)
    channel, user, start, end = booking.where, booking.user, booking.start, booking.end
    pending = needs_approval(channel=channel, exclusive=booking.exclusive, user=user, by=booking.by)

    def book() -> Reservation:
        # Inside the transaction: on SQLite it holds the write lock, so two
        # bookings of one user cannot both fit the same remaining quota.
        hold_channel(channel.pk)
        check_limits(user=user, channel=channel, start=start, end=end, now=now)
        conflict = first_conflict(channel, start, end)
        if conflict is not None:
            raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                reservation = new_reservation(booking, pending=pending, now=now)
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise ReservationConflict(first_conflict(channel, start, end)) from None
        if pending:
            tell_approvers(reservation)
        return reservation

    return retrying_deadlocks(book)


def reservation_create_anywhere(booking: NewBooking, *, now: datetime) -> Reservation:
    """Book the best channel that fits (docs/scheduling.md), whatever ``booking.channel`` says:
    placement ranks them, and each is tried in turn with the same overlap guarantee as any
    booking, so two people asking at once end up on different channels or get a clear 409."""
    from channels_app.placement.selectors import placement_for

    model = booking.model
    if booking.exclusive or model is None:
        raise InvalidInput(
            "channel", '"auto" needs a model to place; name a channel for a whole-card booking'
        )
    ranked = placement_for(model=model, preset=booking.preset, start=booking.start, end=booking.end)
    closed: list[str] = []  # channels that fit but are for groups the user is not in
    blacked_out: list[str] = []  # channels that fit but are closed then
    for scored in ranked.ranked:
        chosen = Channel.objects.get(pk=scored.candidate.id)
        if blackouts_over(chosen.pk, booking.start, booking.end).exists():
            blacked_out.append(chosen.name)
            continue
        try:
            there = dataclasses.replace(booking.on(chosen), lend=booking.lend and chosen.lend_while_idle)
            return reservation_create(there, now=now)
        except ReservationConflict:
            continue  # taken meanwhile: the next best
        except InvalidInput as refused:
            if refused.field != "channel":
                raise
            closed.append(chosen.name)  # limited to other groups: the next best
    if closed and len(closed) == len(ranked.ranked):
        raise NoChannelFits(f"the channels that fit ({', '.join(closed)}) are for groups you are not in")
    if blacked_out and len(closed) + len(blacked_out) == len(ranked.ranked):
        why = f"{', '.join(blacked_out)} closed then (the calendar says why)"
        if closed:
            why += f"; {', '.join(closed)} for groups you are not in"
        raise NoChannelFits(f"every channel that fits is out of reach: {why}")
    raise NoChannelFits(ranked.message or "every channel that fits was booked meanwhile")


class NoChannelFits(ReservationConflict):
    """No channel can take the booking; the message says why for each."""

    def __init__(self, why: str) -> None:
        super().__init__(None)
        self.message = f"no channel can take this booking: {why}"
