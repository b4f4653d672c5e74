"""The waitlist's one write by users: "tell me when this slot frees" (``reservations.waitlist``
tells them)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.models import Channel
from reservations.models import Reservation, WaitlistEntry
from reservations.services.common import group_problems
from slotserve_base.errors import InvalidInput


def waitlist_join(
    *, user: User, channel: Channel, start: datetime, end: datetime, now: datetime
) -> WaitlistEntry:
    """Wait for ``[start, end)`` on ``channel``; a slot that is free now is to be booked instead."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end <= start:
        raise InvalidInput("end", "end must be after start")
    if end <= now:
        raise InvalidInput("end", "the slot is over")
    closed = group_problems(user=user, channel=channel, start=start, end=end)
    if closed and closed[0].field == "channel":  # a channel of other groups: nothing to wait for
        raise InvalidInput("channel", closed[0].message)
    if not Reservation.objects.blocking().filter(channel=channel).overlapping(max(start, now), end).exists():
        raise InvalidInput("start", "this slot is free now: book it instead of waiting for it")
    try:
        with transaction.atomic():
            return WaitlistEntry.objects.create(user=user, channel=channel, start=start, end=end, created=now)
    except IntegrityError:
        return WaitlistEntry.objects.get(
            user=user, channel=channel, start=start, end=end, notified_at__isnull=True
        )
