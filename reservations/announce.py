"""A booking's happenings (``slotserve_base.happenings``): the booking's ids and names, who did
it, whom it concerns, the portal page it leads to."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any

from reservations.models import Reservation
from reservations.wording import slot_words
from slotserve_base.happenings import Happening, Words, named, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import WebhookEvent


def booking_data(reservation: Reservation) -> dict[str, Any]:
    return {
        "id": reservation.pk,
        "user": user_ref(reservation.user),
        "channel": named(reservation.channel),
        "model": named(reservation.model),
        "preset": named(reservation.preset),
        "exclusive": reservation.exclusive,
        "start": iso_moment(reservation.start),
        "end": iso_moment(reservation.end),
        "status": reservation.status,
        "series": reservation.series_id,
    }


# What happened to a booking, in a word or two (``booking_words``).
SAID = {
    WebhookEvent.BOOKING_REQUESTED: "requested",
    WebhookEvent.BOOKING_APPROVED: "approved",
    WebhookEvent.BOOKING_REJECTED: "rejected",
    WebhookEvent.BOOKING_CHANGED: "changed",
    WebhookEvent.BOOKING_CANCELLED: "cancelled",
    WebhookEvent.BOOKING_STARTING_SOON: "starts in 15 minutes",
    WebhookEvent.BOOKING_STARTED: "started",
    WebhookEvent.BOOKING_ENDED: "ended",
    WebhookEvent.BOOKING_ENDED_EARLY: "ended early",
    WebhookEvent.BOOKING_RELEASED_IDLE: "released unused",
}


def booking_words(event: WebhookEvent, reservation: Reservation, said: str = "") -> Words:
    """``<user>'s booking of <channel>, <slot>: <what happened>`` in the reader's zone."""

    def words(zone: tzinfo) -> str:
        slot = slot_words(reservation.start, reservation.end, zone)
        what = said or SAID.get(event, event.label)
        return f"{reservation.user}'s booking of {reservation.channel}, {slot}: {what}."

    return words


def announce_booking(
    event: WebhookEvent,
    reservation: Reservation,
    *,
    at: datetime,
    said: str = "",
    more: dict[str, Any] | None = None,
    once: bool = False,
    by: Any = None,
    was: str | None = None,
) -> None:
    """Tell what happened to ``reservation`` (docs/architecture.md, "What happened, told once"):
    its booker's webhooks and staff's hear of it, the booker is notified where it is news to
    them (``reservations.notices``), and what follows from it follows (``reservations.consequences``:
    the channel re-decides, those waiting hear of a slot left). ``by``: the person who did it, when
    one did; ``was``: the booking's status before, when it changed. ``once``: at most once per
    booking and event (a job that runs again finds it told)."""
    by_whom: dict[str, Any] = {"by": user_ref(by)} if by is not None else {}
    if was is not None:
        by_whom["was"] = was
    tell(
        Happening(
            type=event,
            at=at,
            data={"booking": booking_data(reservation), **by_whom, **(more or {})},
            subject=f"reservation:{reservation.pk}",
            words=booking_words(event, reservation, said),
            users=frozenset({reservation.user_id}),
            channels=frozenset({reservation.channel_id}),
            link="/reservations/",
            key=f"{event}:{reservation.pk}" if once else None,
        )
    )
