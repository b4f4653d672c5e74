"""The "starts in 15 minutes" notification, sent once per reservation by the tick."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo

from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Concat

from reservations.announce import announce_booking
from reservations.models import Notification, Reservation, ReservationStatus
from reservations.notifications import notify, slot_of
from reservations.wording import slot_words
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

STARTING_SOON = timedelta(minutes=15)


def send_starting_soon(*, now: datetime) -> int:
    """Notify bookers whose approved reservation starts within 15 minutes; returns how many."""
    already = Notification.objects.filter(
        user=OuterRef("user"), key=Concat(Value("starting_soon:"), OuterRef("pk"))
    )
    due = (
        Reservation.objects.filter(
            status=ReservationStatus.APPROVED, start__gt=now, start__lte=now + STARTING_SOON
        )
        .exclude(Exists(already))
        .select_related("user", "channel")
    )
    sent = 0
    for reservation in due:
        minutes = max(1, round((reservation.start - now).total_seconds() / 60))

        def text(zone: tzinfo, booking: Reservation = reservation, soon: int = minutes) -> str:
            slot = slot_words(booking.start, booking.end, zone)
            return f"Your reservation of {booking.channel} starts in {soon} minutes: {slot}."

        if notify(
            user=reservation.user,
            event=NotificationEvent.STARTING_SOON,
            text=text,
            link="/reservations/",
            key=f"starting_soon:{reservation.pk}",
            about=slot_of(reservation),
        ):
            sent += 1
            announce_booking(WebhookEvent.BOOKING_STARTING_SOON, reservation, at=now, once=True)
    return sent
