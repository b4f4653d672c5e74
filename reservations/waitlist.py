"""The waitlist: "tell me when this slot frees" (docs/scheduling.md, the portal's booking dialog).

``reservations.services.waitlist_join`` records a wish for a slot that is taken now;
``tell_waiting`` runs wherever time on a channel is freed (a cancellation, an early end, a
rejection, a change) and notifies each user whose whole wished-for slot is now free, once.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, tzinfo

from reservations.models import Reservation, WaitlistEntry
from reservations.notifications import notify
from reservations.wording import slot_words
from slotserve_base.vocabulary import NotificationEvent


def tell_waiting(*, channel_id: int, now: datetime) -> int:
    """Notify those waiting on the channel whose slot (what is left of it) is wholly free now;
    returns how many were told."""
    told = 0
    waiting = WaitlistEntry.objects.filter(channel_id=channel_id, notified_at__isnull=True, end__gt=now)
    for entry in waiting.select_related("user", "channel"):
        start = max(entry.start, now)
        if (
            Reservation.objects.blocking()
            .filter(channel_id=channel_id)
            .overlapping(start, entry.end)
            .exists()
        ):
            continue
        if not WaitlistEntry.objects.filter(pk=entry.pk, notified_at__isnull=True).update(notified_at=now):
            continue  # told by someone else meanwhile
        notify(
            user=entry.user,
            event=NotificationEvent.SLOT_FREED,
            text=functools.partial(_freed_words, entry.channel.name, start, entry.end),
            link=f"/book/?channel={entry.channel_id}&start={_iso(start)}&end={_iso(entry.end)}",
            key=f"slot_freed:{entry.pk}",
        )
        told += 1
    return told


def _freed_words(channel: str, start: datetime, end: datetime, zone: tzinfo) -> str:
    slot = slot_words(start, end, zone)
    return f"{channel} is free {slot}, the time you waited for: book it before someone else does."


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
