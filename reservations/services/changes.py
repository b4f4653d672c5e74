"""Changing a booking: the owner extends, moves, shortens or retargets it; staff may for anyone
(docs/scheduling.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.models import LLMModel, Preset, validate_target
from reservations.announce import announce_booking
from reservations.models import BLOCKING_STATUSES, Reservation, ReservationStatus
from reservations.selectors import first_conflict
from reservations.services.common import (
    InvalidTransition,
    ReservationConflict,
    check_limits,
    hold_channel,
    is_overlap,
    lend_problem,
    needs_approval,
    retrying_deadlocks,
    slot_problems,
    tell_approvers,
    whole_booking,
)
from slotserve_base.audit import audited
from slotserve_base.errors import InvalidInput
from slotserve_base.vocabulary import WebhookEvent


def reservation_extend(*, reservation: Reservation, by: User, end: datetime, now: datetime) -> Reservation:
    """Move the end of an active or future reservation later, when that time is free.

    The added time is checked like a new booking of it (limits, quota, overlap).
    Where the channel's policy would make a booking of it wait for approval, an
    approved reservation keeps its approved part and gets a pending *extension*
    (a reservation of ``[end, new end)`` that ``extends`` it) and the approvers
    are told; otherwise, and for a pending reservation, the end itself moves.
    Returns the reservation that holds the new end.

    Races with a new booking of the same minutes are settled like bookings:
    one at a time per channel (the IMMEDIATE transaction on SQLite, the
    channel's row lock on PostgreSQL), with the database's rule behind.
    """
    if reservation.status not in BLOCKING_STATUSES or reservation.end <= now:
        raise InvalidTransition(f"cannot extend a reservation that is {reservation.status} or over")
    asking = reservation.extensions.filter(status=ReservationStatus.PENDING).order_by("-end").first()
    if asking is not None:
        # One request at a time: asking for more moves the end of the pending extension.
        return reservation_extend(reservation=asking, by=by, end=end, now=now)
    end = end.astimezone(UTC)
    if end <= reservation.end:
        raise InvalidInput("end", "the new end must be after the current end")
    as_request = reservation.status == ReservationStatus.APPROVED and needs_approval(
        channel=reservation.channel, exclusive=reservation.exclusive, user=reservation.user, by=by
    )

    booking = whole_booking(reservation)

    def grow() -> Reservation:
        hold_channel(reservation.channel_id)
        # The limits see the whole booking, the approved part and its extensions, as one.
        check_limits(
            user=reservation.user,
            channel=reservation.channel,
            start=booking[0].start,
            end=end,
            now=min(now, booking[0].start),
            exclude=[part.pk for part in booking],
        )
        conflict = first_conflict(reservation.channel, reservation.end, end, exclude=reservation.pk)
        if conflict is not None:
            raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                if as_request:
                    extension = Reservation.objects.create(
                        user=reservation.user,
                        channel=reservation.channel,
                        start=reservation.end,
                        end=end,
                        model=reservation.model,
                        preset=reservation.preset,
                        exclusive=reservation.exclusive,
                        status=ReservationStatus.PENDING,
                        note=reservation.note,
                        extends=reservation,
                        created=now,
                    )
                    tell_approvers(extension)
                    announce_booking(WebhookEvent.BOOKING_REQUESTED, extension, at=now)
                    return extension
                updated = Reservation.objects.filter(
                    pk=reservation.pk, status=reservation.status, end=reservation.end
                ).update(end=end)
                if updated:
                    audited(reservation, {"end": reservation.end}, {"end": end})
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise ReservationConflict(
                first_conflict(reservation.channel, reservation.end, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        reservation.refresh_from_db()
        announce_booking(WebhookEvent.BOOKING_CHANGED, reservation, at=now, said="extended")
        return reservation

    return retrying_deadlocks(grow)


def reservation_reschedule(
    *, reservation: Reservation, by: User, start: datetime, end: datetime, note: str, now: datetime
) -> Reservation:
    """Staff move a pending or approved reservation to ``[start, end)`` (the Django admin)."""
    return reservation_change(reservation=reservation, by=by, start=start, end=end, note=note, now=now)


_UNCHANGED: Any = object()


def reservation_change(
    *,
    reservation: Reservation,
    by: User,
    now: datetime,
    start: datetime | None = None,
    end: datetime | None = None,
    model: LLMModel | None = _UNCHANGED,
    preset: Preset | None = _UNCHANGED,
    note: str | None = None,
    lend: bool | None = None,
) -> Reservation:
    """Move, shorten or lengthen a pending or approved reservation, or change its model or preset
    (the owner, or staff for anyone), or whether it is lent while its booker is idle (the owner
    alone, at any time, without approval: docs/gateway.md, "Lending").

    Checked like a booking of the new slot and target (limits and quota without the reservation
    itself, overlap, the database's rule behind). A started reservation keeps its start; its end
    may move, not into the past. Where the channel's policy makes a booking like it wait for
    approval, an approved reservation that now asks for time or a target it was not approved for
    is pending again and the approvers are told; shortening never asks. The owner is told when
    staff changed it; the channel re-decides.
    """
    if reservation.status not in BLOCKING_STATUSES:
        raise InvalidTransition(f"cannot change a reservation that is {reservation.status}")
    if reservation.end <= now:
        raise InvalidTransition("cannot change a reservation that is over")
    if reservation.extensions.filter(status__in=BLOCKING_STATUSES).exists():
        raise InvalidTransition("this reservation has an extension; cancel the extension first")
    start = reservation.start if start is None else start.astimezone(UTC)
    end = reservation.end if end is None else end.astimezone(UTC)
    model = reservation.model if model is _UNCHANGED else model
    preset = reservation.preset if preset is _UNCHANGED else preset
    if reservation.exclusive:
        model, preset = None, None
    elif preset is not None and model is None:
        model = preset.model
    started = reservation.start <= now
    if started and start != reservation.start:
        raise InvalidInput("start", "the reservation has started: its start cannot move")
    if started and end <= now:
        raise InvalidInput("end", "the new end is in the past; end the reservation now instead")
    moved = (start, end) != (reservation.start, reservation.end)
    retargeted = (model, preset) != (reservation.model, reservation.preset)
    relent = lend is not None and lend != reservation.lend
    if relent and by != reservation.user:
        raise InvalidInput("lend", "only the booker chooses whether their slot is lent")
    if relent and lend:
        lend_problem(channel=reservation.channel, exclusive=reservation.exclusive)
    if not moved and not retargeted and note is None and not relent:
        return reservation
    if not reservation.exclusive:
        validate_target(model=model, preset=preset)
        if model is None:
            raise InvalidInput("model", "name a model (and preset)")
    if moved:
        problems = slot_problems(
            channel=reservation.channel,
            start=start,
            end=end,
            now=now if not started else start,
            exclusive=False,
        )
        if problems:
            raise InvalidInput(problems[0].field, problems[0].message)
    within = reservation.start <= start and end <= reservation.end
    asks_again = (
        reservation.status == ReservationStatus.APPROVED
        and ((moved and not within) or retargeted)
        and needs_approval(
            channel=reservation.channel, exclusive=reservation.exclusive, user=reservation.user, by=by
        )
    )
    changes: dict[str, Any] = {"start": start, "end": end, "model": model, "preset": preset}
    if note is not None:
        changes["note"] = note
    if relent:
        changes["lend"] = lend
    if asks_again:
        changes.update(status=ReservationStatus.PENDING, reviewed_at=None, reviewed_by=None)

    def change() -> Reservation:
        hold_channel(reservation.channel_id)
        if moved:
            check_limits(
                user=reservation.user,
                channel=reservation.channel,
                start=start,
                end=end,
                now=min(now, start),
                exclude=reservation.pk,
            )
            conflict = first_conflict(reservation.channel, start, end, exclude=reservation.pk)
            if conflict is not None:
                raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                updated = Reservation.objects.filter(
                    pk=reservation.pk, status=reservation.status, start=reservation.start, end=reservation.end
                ).update(**changes)
                if updated:
                    audited(reservation, {name: getattr(reservation, name) for name in changes}, changes)
                if updated and asks_again:
                    reservation.refresh_from_db()
                    tell_approvers(reservation)
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise ReservationConflict(
                first_conflict(reservation.channel, start, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        was = reservation.status
        reservation.refresh_from_db()
        if moved or retargeted:
            announce_booking(WebhookEvent.BOOKING_CHANGED, reservation, at=now, by=by, was=was)
        return reservation

    return retrying_deadlocks(change)
