"""Approving, rejecting, cancelling and ending reservations: conditional transitions, each told
once (``reservations.announce``); the booker's notice, the channel's re-decision and the news
for those waiting follow from what is told (``reservations.notices``, ``reservations.consequences``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from reservations.announce import announce_booking
from reservations.models import Reservation, ReservationStatus
from reservations.services.common import InvalidTransition
from reservations.wording import slot_words
from slotserve_base import overview
from slotserve_base.audit import audited
from slotserve_base.errors import InvalidInput
from slotserve_base.vocabulary import WebhookEvent


def _transition(
    reservation: Reservation, allowed_from: tuple[str, ...], verb: str, **changes: Any
) -> Reservation:
    before = {name: getattr(reservation, name) for name in changes}
    updated = Reservation.objects.filter(pk=reservation.pk, status__in=allowed_from).update(**changes)
    reservation.refresh_from_db()
    if not updated:
        raise InvalidTransition(f"cannot {verb} a reservation that is {reservation.status}")
    audited(reservation, before, {name: getattr(reservation, name) for name in changes})
    if ReservationStatus.PENDING in allowed_from:  # a request may have left the approvers' list
        transaction.on_commit(lambda: overview.counts_changed(approvers=True))
    return reservation


def reservation_approve(*, reservation: Reservation, by: User, now: datetime) -> Reservation:
    if reservation.end <= now:
        raise InvalidTransition("cannot approve a reservation whose slot is over")
    with transaction.atomic():
        _transition(
            reservation,
            (ReservationStatus.PENDING,),
            "approve",
            status=ReservationStatus.APPROVED,
            reviewed_by=by,
            reviewed_at=now,
        )
        announce_booking(WebhookEvent.BOOKING_APPROVED, reservation, at=now, said=f"approved by {by}", by=by)
    return reservation


def reservation_reject(*, reservation: Reservation, by: User, reason: str, now: datetime) -> Reservation:
    if not reason.strip():
        raise InvalidInput("reason", "say why the reservation is rejected")
    with transaction.atomic():
        _transition(
            reservation,
            (ReservationStatus.PENDING,),
            "reject",
            status=ReservationStatus.REJECTED,
            reject_reason=reason.strip(),
            reviewed_by=by,
            reviewed_at=now,
        )
        announce_booking(
            WebhookEvent.BOOKING_REJECTED,
            reservation,
            at=now,
            said=f"rejected by {by}: {reservation.reject_reason}",
            more={"reason": reservation.reject_reason},
            by=by,
        )
    return reservation


def reservation_cancel(*, reservation: Reservation, by: User, now: datetime, reason: str = "") -> Reservation:
    """Cancel a pending reservation, or an approved one that has not started. ``reason``: why,
    where someone else cancels it (a blackout's); the booker is told it."""
    if reservation.status == ReservationStatus.APPROVED and reservation.start <= now:
        raise InvalidTransition(
            "cannot cancel a reservation that has started; end it early instead"
            if reservation.end > now
            else "cannot cancel a reservation that is over"
        )
    with transaction.atomic():
        was = reservation.status
        _transition(
            reservation,
            (ReservationStatus.PENDING, ReservationStatus.APPROVED),
            "cancel",
            status=ReservationStatus.CANCELLED,
        )
        announce_booking(
            WebhookEvent.BOOKING_CANCELLED,
            reservation,
            at=now,
            said=f"cancelled by {by}" + (f": {reason}" if reason else ""),
            more={"reason": reason} if reason else None,
            by=by,
            was=was,
        )
    return reservation


def reservation_end(
    *,
    reservation: Reservation,
    by: User,
    now: datetime,
    unused_minutes: int | None = None,
    reason: str = "",
) -> Reservation:
    """End an active reservation now; the channel re-decides at once (docs/scheduling.md).
    ``unused_minutes``: the idle rule releases it, unused that long (``reservations.idle``);
    ``reason``: why someone else ends it (a blackout's), told to the booker."""
    if not reservation.is_active(now):
        raise InvalidTransition(
            f"cannot end a reservation that is not active (it is {reservation.status}, "
            f"{slot_words(reservation.start, reservation.end)})"
        )
    with transaction.atomic():
        # ``end`` must stay after ``start``: ending in the very first instant is a cancel.
        if now > reservation.start:
            # The slot began: told by the periodic job within a tick, or here, first, if the
            # job has not run since (the scheduler down or behind); once either way.
            announce_booking(WebhookEvent.BOOKING_STARTED, reservation, at=reservation.start, once=True)
            changes: dict[str, Any] = {"status": ReservationStatus.ENDED, "end": now}
        else:
            changes = {"status": ReservationStatus.CANCELLED}
        _transition(reservation, (ReservationStatus.APPROVED,), "end", **changes)
        if unused_minutes is not None:  # by nobody: the channel's rule released it
            announce_booking(
                WebhookEvent.BOOKING_RELEASED_IDLE,
                reservation,
                at=now,
                said=f"released, no request reached it in {unused_minutes} minutes",
                more={"unused_minutes": unused_minutes},
                was=ReservationStatus.APPROVED,
            )
        else:
            ended = reservation.status == ReservationStatus.ENDED
            event = WebhookEvent.BOOKING_ENDED_EARLY if ended else WebhookEvent.BOOKING_CANCELLED
            said = (f"ended early by {by}" if ended else f"cancelled by {by}") + (
                f": {reason}" if reason else ""
            )
            announce_booking(
                event,
                reservation,
                at=now,
                said=said,
                more={"reason": reason} if reason else None,
                by=by,
                was=ReservationStatus.APPROVED,
            )
    return reservation
