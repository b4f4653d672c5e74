"""The waitlist: "tell me when this slot frees" (docs/scheduling.md, the portal's booking dialog).

``waitlist_join`` records a wish for a slot that is taken now; ``tell_waiting`` runs after every
happening that may leave time on a channel (a cancellation, an early end, a rejection, a change:
``reservations.consequences``) and tells, once, of each wished-for slot that is now wholly free
(``waitlist.slot_freed``; its waiter's notice follows, ``reservations.notices``).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, tzinfo

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.models import Channel
from reservations.models import Reservation, WaitlistEntry
from reservations.services.common import group_problems
from reservations.wording import slot_words
from slotserve_base.errors import InvalidInput
from slotserve_base.happenings import Happening, named, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import WebhookEvent


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


def waitlist_leave(*, entry: WaitlistEntry, by: User) -> None:
    """``by`` no longer waits for the slot (their own wish; staff may remove anyone's)."""
    if entry.user_id != by.pk and not by.is_staff:
        raise InvalidInput("waitlist", "this is someone else's wish")
    entry.delete()


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
        _announce_freed(entry, start, now)  # the waiter's notice follows (``reservations.notices``)
        told += 1
    return told


def _announce_freed(entry: WaitlistEntry, start: datetime, now: datetime) -> None:
    link = f"/book/?channel={entry.channel_id}&start={iso_moment(start)}&end={iso_moment(entry.end)}"
    tell(
        Happening(
            type=WebhookEvent.WAITLIST_SLOT_FREED,
            at=now,
            data={
                "waitlist": {"id": entry.pk, "user": user_ref(entry.user)},
                "channel": named(entry.channel),
                "start": iso_moment(start),
                "end": iso_moment(entry.end),
            },
            subject=f"waitlist:{entry.pk}",
            words=functools.partial(freed_words, entry.channel.name, start, entry.end),
            users=frozenset({entry.user_id}),
            channels=frozenset({entry.channel_id}),
            link=link,
        )
    )


def freed_words(channel: str, start: datetime, end: datetime, zone: tzinfo) -> str:
    slot = slot_words(start, end, zone)
    return f"{channel} is free {slot}, the time you waited for: book it before someone else does."
