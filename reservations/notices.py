"""Which happenings people are told of (docs/architecture.md, "What happened, told once"): this
listener keeps the ones below as notifications (``reservations.notifications.notify``), each to
the people it concerns, in their own words and time zone.

A booking's news goes to its booker: approved or rejected by someone, cancelled, ended early or
changed by someone else, released unused. A channel's news: the booker hears of their
reservation's model (ready, failed, fallen back to the default, recovered); the admins hear of
failures, fallbacks and recoveries, a booking's or not. A failure episode's news goes out once:
its key names the episode (docs/scheduling.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.dispatch import receiver

from reservations.models import Reservation, WaitlistEntry
from reservations.notifications import About, notify, slot_of
from reservations.services.waitlist import freed_words
from reservations.wording import moment_words, slot_words
from slotserve_base.happenings import Happening, happened
from slotserve_base.iso import iso_moment, parse_moment
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent


class Notice(NamedTuple):
    """What a happening becomes: the notification's kind, its words, whether the admins hear."""

    event: NotificationEvent
    text: str
    for_admins: bool


CHANNEL_NOTICES = {
    WebhookEvent.CHANNEL_FAILED: Notice(NotificationEvent.LOAD_FAILED, "", True),
    WebhookEvent.CHANNEL_FALLBACK: Notice(
        NotificationEvent.FALLBACK, "the default model serves the reservation until the next retry", True
    ),
    WebhookEvent.CHANNEL_RECOVERED: Notice(
        NotificationEvent.RECOVERED, "the booked model loaded after a retry and serves again", True
    ),
    WebhookEvent.CHANNEL_READY: Notice(
        NotificationEvent.MODEL_READY, "the model of the reservation is ready", False
    ),
}


# A booking's words for its booker: (the reservation, who did it, the happening's data, zone).
BookingWords = Callable[[Reservation, str, dict[str, Any], tzinfo], str]


class BookingNotice(NamedTuple):
    """What a booking's happening becomes for its booker. ``by_others``: only when someone else
    did it (their own cancel is no news to them); ``by_someone``: only when a person did it (a
    booking approved at once is no approval to be told of); ``key``: names it once."""

    event: NotificationEvent
    words: BookingWords
    key: Callable[[Reservation], str]
    by_others: bool = False
    by_someone: bool = False


def _your(reservation: Reservation, zone: tzinfo) -> str:
    return (
        f"Your reservation of {reservation.channel}, {slot_words(reservation.start, reservation.end, zone)},"
    )


def _because(data: dict[str, Any]) -> str:
    """The reason someone gave, where one did (a blackout's)."""
    return f": {data['reason']}" if data.get("reason") else ""


BOOKING_NOTICES = {
    WebhookEvent.BOOKING_APPROVED: BookingNotice(
        NotificationEvent.APPROVED,
        lambda r, by, data, zone: f"{_your(r, zone)} is approved.",
        lambda r: f"approved:{r.pk}",
        by_someone=True,
    ),
    WebhookEvent.BOOKING_REJECTED: BookingNotice(
        NotificationEvent.REJECTED,
        lambda r, by, data, zone: f"{_your(r, zone)} was rejected: {r.reject_reason}",
        lambda r: f"rejected:{r.pk}",
    ),
    WebhookEvent.BOOKING_CANCELLED: BookingNotice(
        NotificationEvent.CANCELLED,
        lambda r, by, data, zone: f"{_your(r, zone)} was cancelled by {by}{_because(data)}.",
        lambda r: f"cancelled:{r.pk}",
        by_others=True,
    ),
    WebhookEvent.BOOKING_ENDED_EARLY: BookingNotice(
        NotificationEvent.ENDED_EARLY,
        lambda r, by, data, zone: f"Your reservation of {r.channel} was ended early by {by}{_because(data)}.",
        lambda r: f"ended:{r.pk}",
        by_others=True,
    ),
    WebhookEvent.BOOKING_CHANGED: BookingNotice(
        NotificationEvent.CHANGED,
        lambda r, by, data, zone: (
            f"Your reservation of {r.channel} was changed by {by}: now "
            f"{slot_words(r.start, r.end, zone)}, {r.what}."
        ),
        lambda r: f"changed:{r.pk}:{iso_moment(r.start)}:{iso_moment(r.end)}:{r.target}",
        by_others=True,
    ),
    WebhookEvent.BOOKING_RELEASED_IDLE: BookingNotice(
        NotificationEvent.IDLE_RELEASED,
        lambda r, by, data, zone: _released_words(str(r.channel), r.end, data["unused_minutes"], zone),
        lambda r: f"idle_released:{r.pk}",
    ),
}


def _released_words(channel: str, at: datetime, unused: int, zone: tzinfo) -> str:
    return (
        f"Your booking of {channel} was released at {moment_words(at, zone)}: no request reached it in "
        f"its first {unused} minutes (the channel's rule for unused slots)."
    )


@receiver(happened, sender=Happening, dispatch_uid="reservations.notices.on_happening")
def on_happening(sender: type[Happening], happening: Happening, **_: Any) -> None:
    kind = happening.type
    if kind in CHANNEL_NOTICES:
        _channel_news(happening, CHANNEL_NOTICES[WebhookEvent(kind)])
    elif kind in BOOKING_NOTICES:
        _booking_news(happening, BOOKING_NOTICES[WebhookEvent(kind)])
    elif kind == WebhookEvent.WAITLIST_SLOT_FREED:
        _slot_freed(happening)


def _slot_freed(happening: Happening) -> None:
    """The one waiting hears that their slot (what is left of it) is free."""
    entry = (
        WaitlistEntry.objects.select_related("user", "channel")
        .filter(pk=happening.data["waitlist"]["id"])
        .first()
    )
    if entry is None:
        return
    start, end = parse_moment(happening.data["start"]), entry.end
    notify(
        user=entry.user,
        event=NotificationEvent.SLOT_FREED,
        text=functools.partial(freed_words, entry.channel.name, start, end),
        link=happening.link,
        key=f"slot_freed:{entry.pk}",
        about=(entry.channel.name, start, end),
    )


def _booking_news(happening: Happening, notice: BookingNotice) -> None:
    data = dict(happening.data)
    by = data.get("by")
    if notice.by_someone and by is None:
        return
    reservation = (
        Reservation.objects.select_related("user", "channel").filter(pk=data["booking"]["id"]).first()
    )
    if reservation is None or (notice.by_others and (by is None or by["id"] == reservation.user_id)):
        return
    who = by["username"] if by is not None else ""
    notify(
        user=reservation.user,
        event=notice.event,
        text=functools.partial(notice.words, reservation, who, data),
        link="/reservations/",
        key=notice.key(reservation),
        about=slot_of(reservation),
    )


def _channel_news(happening: Happening, notice: Notice) -> None:
    data = happening.data
    if happening.type == WebhookEvent.CHANNEL_READY and not data.get("booked"):
        return  # only the booked model's readiness is news to its booker
    booking = data.get("booking")
    reservation = (
        Reservation.objects.select_related("user", "channel").filter(pk=booking["id"]).first()
        if booking
        else None
    )
    if reservation is None and not notice.for_admins:
        return
    channel = (data.get("channel") or {}).get("name")
    said = notice.text or data.get("error") or "failed"
    about = f"channel:{(data.get('channel') or {}).get('id')}" if reservation is None else str(reservation.pk)
    episode = f":{data['episode']}" if data.get("episode") else ""
    key = f"{notice.event}:{about}{episode}"

    def text(zone: tzinfo) -> str:
        told = f"{channel}: {said}."
        return told if reservation is None else f"{told} {reservation_summary(reservation, zone)}"

    admins = get_user_model().objects.filter(is_staff=True, is_active=True) if notice.for_admins else None
    # The mail's subject names the booking's channel and slot, or the channel alone.
    subject: About | None = slot_of(reservation) if reservation is not None else channel
    if reservation is not None:
        notify(user=reservation.user, event=notice.event, text=text, link="/", key=key, about=subject)
        admins = admins.exclude(pk=reservation.user_id) if admins is not None else None
    for admin in admins if admins is not None else ():
        notify(user=admin, event=notice.event, text=text, link="/", key=key, about=subject)


def reservation_summary(reservation: Reservation, zone: tzinfo | None = None) -> str:
    slot = slot_words(reservation.start, reservation.end, zone)
    return f"({reservation.user}'s booking of {reservation.channel}, {slot})"
