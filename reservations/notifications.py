"""``notify``: the one way SlotServe tells a user something, in-app and by email."""

from __future__ import annotations

import logging
from typing import Any

from django.core.mail import send_mail
from django.db import IntegrityError, transaction

from reservations.models import Notification
from reservations.profiles import profile_for

log = logging.getLogger(__name__)


def notify(
    *, user: Any, event: str, text: str, link: str = "", key: str | None = None
) -> Notification | None:
    """Store a notification for ``user`` and email it after commit, if they want it.

    With a ``key`` the event is sent at most once per user: a second call with
    the same key (a re-run tick, a retried task) returns None and sends nothing.
    """
    try:
        with transaction.atomic():
            notification = Notification.objects.create(user=user, event=event, text=text, link=link, key=key)
    except IntegrityError:
        if key is not None and Notification.objects.filter(user=user, key=key).exists():
            return None
        raise
    if user.email and profile_for(user).wants_email(event):
        transaction.on_commit(lambda: _send_email(user.email, event, text, link))
    return notification


def _send_email(address: str, event: str, text: str, link: str) -> None:
    subject = f"[SlotServe] {event.replace('_', ' ')}"
    body = f"{text}\n\n{link}" if link else text
    try:
        send_mail(subject, body, None, [address])
    except OSError:
        # The in-app notification is stored; a mail server that is down must
        # not undo the change that caused it. Say so in the log, loudly.
        log.exception("could not email %s about %s", address, event)
