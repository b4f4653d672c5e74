"""``notify``: the one way SlotServe tells a user something, in-app and by email."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from reservations.models import Notification
from reservations.profiles import profile_for
from reservations.wording import slot_words, zone_of
from slotserve_base import dispatch, overview
from slotserve_base.public_url import public_url
from slotserve_base.vocabulary import NotificationEvent

log = logging.getLogger(__name__)


# A notification's words: fixed, or written for the recipient's time zone.
Text = str | Callable[[tzinfo], str]

# What a notification is about, for its email's subject: a channel and a slot, or a thing
# named in words (an API key).
About = tuple[str, datetime, datetime] | str


def slot_of(reservation: Any) -> About:
    """What a notification of ``reservation`` is about: its channel and slot."""
    return (str(reservation.channel), reservation.start, reservation.end)


# Where a notification of a booking's own events leads, when its sender names no page.
EVENT_LINKS: dict[str, str] = {
    event.value: "/reservations/"
    for event in (
        NotificationEvent.APPROVED,
        NotificationEvent.REJECTED,
        NotificationEvent.CANCELLED,
        NotificationEvent.ENDED_EARLY,
        NotificationEvent.CHANGED,
    )
}


def notify(
    *,
    user: User,
    event: str,
    text: Text,
    link: str = "",
    key: str | None = None,
    about: About | None = None,
) -> Notification | None:
    """Store a notification for ``user`` and email it after commit, if they want it. A ``text``
    that is a function gets the recipient's time zone (``reservations.wording``).

    ``about`` (a channel and a slot) goes in the email's subject, so that three approvals read as
    three different mails. With a ``key`` the event is sent at most once per user: a second call with
    the same key (a re-run tick, a retried task) returns None and sends nothing.
    """
    zone = zone_of(user)
    if callable(text):
        text = text(zone)
    link = link or EVENT_LINKS.get(event, "")
    try:
        with transaction.atomic():
            notification = Notification.objects.create(user=user, event=event, text=text, link=link, key=key)
    except IntegrityError:
        if key is not None and Notification.objects.filter(user=user, key=key).exists():
            return None
        raise
    # Their open pages' badges count it (the portal's live connection).
    transaction.on_commit(lambda: overview.counts_changed([user.pk]))
    if user.email and profile_for(user).wants_email(event):
        subject, body = email_of(event, text, link, about=about, zone=zone)
        # Sent by a task with retries after the commit: a slow or absent mail server never
        # stalls whoever made the change (a web request, the node worker's reconcile).
        transaction.on_commit(
            lambda: dispatch.send(dispatch.NOTIFICATION_EMAIL, args=(user.email, subject, body))
        )
    return notification


def email_of(
    event: str, text: str, link: str, *, about: About | None = None, zone: tzinfo | None = None
) -> tuple[str, str]:
    """The subject and body of a notification's email: the event, with the channel and the slot
    it is about in the reader's zone (``[SlotServe] approved: a100-0, Tue 8 Dec 10:00–12:00 CET``);
    its text, and its link made whole with the portal's public address (``SLOTSERVE_PUBLIC_URL``;
    ``./slotserve start`` sets it to the address it serves)."""
    subject = f"[SlotServe] {event.replace('_', ' ')}"
    if isinstance(about, str):
        subject += f": {about}"
    elif about is not None:
        channel, start, end = about
        subject += f": {channel}, {slot_words(start, end, zone)}"
    whole = public_url(link) if link else None
    return subject, f"{text}\n\n{whole}" if whole else text
