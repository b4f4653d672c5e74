"""Changing a booking's times: the owner extends it, staff move it (SPEC §5)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.dispatch import enqueue_redecide
from channels_app.errors import InvalidInput
from channels_app.vocabulary import NotificationEvent
from reservations.models import BLOCKING_STATUSES, Reservation, ReservationStatus
from reservations.notifications import notify
from reservations.selectors import first_conflict
from reservations.services.common import (
    START_GRACE,
    InvalidTransition,
    ReservationConflict,
    _check_limits,
    _hold_channel,
    _is_overlap,
    _iso,
    _retrying_deadlocks,
    _tell_approvers,
    _whole_booking,
    needs_approval,
)
from reservations.wording import slot_words


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

    booking = _whole_booking(reservation)

    def grow() -> Reservation:
        _hold_channel(reservation.channel_id)
        # The limits see the whole booking, the approved part and its extensions, as one.
        _check_limits(
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
                    _tell_approvers(extension)
                    return extension
                updated = Reservation.objects.filter(
                    pk=reservation.pk, status=reservation.status, end=reservation.end
                ).update(end=end)
        except IntegrityError as exc:
            if not _is_overlap(exc):
                raise
            raise ReservationConflict(
                first_conflict(reservation.channel, reservation.end, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        reservation.refresh_from_db()
        if reservation.status == ReservationStatus.APPROVED:
            enqueue_redecide(reservation.channel_id)
        return reservation

    return _retrying_deadlocks(grow)


def reservation_reschedule(
    *, reservation: Reservation, by: User, start: datetime, end: datetime, note: str, now: datetime
) -> Reservation:
    """Staff move a pending or approved reservation to ``[start, end)`` (the Django admin).

    Checked like a booking of the new slot (limits, overlap, the database's rule
    behind); the owner is told, and the channel re-decides.
    """
    if reservation.status not in BLOCKING_STATUSES:
        raise InvalidTransition(f"cannot change a reservation that is {reservation.status}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    moved = (start, end) != (reservation.start, reservation.end)
    if moved:
        if end <= start:
            raise InvalidInput("end", "end must be after start")
        if reservation.end <= now:
            raise InvalidTransition("cannot move a reservation that is over")
        if start != reservation.start and start < now - START_GRACE:
            raise InvalidInput("start", "start is in the past; reservations are for the future")

    def change() -> Reservation:
        _hold_channel(reservation.channel_id)
        if moved:
            _check_limits(
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
                ).update(start=start, end=end, note=note)
        except IntegrityError as exc:
            if not _is_overlap(exc):
                raise
            raise ReservationConflict(
                first_conflict(reservation.channel, start, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        reservation.refresh_from_db()
        if moved:
            if by != reservation.user:
                notify(
                    user=reservation.user,
                    event=NotificationEvent.CHANGED,
                    text=lambda zone: (
                        f"Your reservation of {reservation.channel} was moved by {by} to "
                        f"{slot_words(start, end, zone)}."
                    ),
                    key=f"changed:{reservation.pk}:{_iso(start)}:{_iso(end)}",
                )
            if reservation.status == ReservationStatus.APPROVED:
                enqueue_redecide(reservation.channel_id)
        return reservation

    return _retrying_deadlocks(change)
