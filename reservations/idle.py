"""Slots that are not wasted: the channel's idle rule applied to running model bookings.

Run by the tick's periodic job (``reservations.tasks.release_idle_bookings``): a booking that
no request has reached ``idle_warn_minutes`` after its start is warned; still unused
``idle_release_minutes`` after that, the rest of it is released (ended now: the channel
re-decides and those waiting for the time are told). The rule is ``rules.idle_step``.
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timedelta, tzinfo

from reservations.models import Reservation
from reservations.notifications import notify, slot_of
from reservations.rules import IdleFacts, idle_step
from reservations.services import InvalidTransition, reservation_end
from reservations.wording import moment_words
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import NotificationEvent, RedisKey, redis_key

log = logging.getLogger(__name__)


def _warning_words(channel: str, start: datetime, then: datetime | None, zone: tzinfo) -> str:
    words = (
        f"No request has reached your booking of {channel} since it started ({moment_words(start, zone)})."
    )
    if then is not None:
        words += (
            f" Unless one does by {moment_words(then, zone)}, the rest of the slot is released to others."
        )
    return words


def used_now(reservation: Reservation) -> bool:
    """Whether a request reached the booking: counted in the database, or still in Redis."""
    if reservation.requests > 0:
        return True
    name = redis_key(RedisKey.USAGE_RESERVATION, reservation.pk)
    client = redis_client()
    return any(int(client.hget(key, "requests") or 0) > 0 for key in (name, f"{name}:flushing"))


def apply_idle_rule(*, now: datetime) -> dict[str, int]:
    """Warn and release as the rule says; returns how many of each."""
    done = {"warned": 0, "released": 0}
    running = (
        Reservation.objects.active_at(now)
        .filter(exclusive=False, channel__idle_warn_minutes__isnull=False)
        .select_related("channel", "user")
    )
    for reservation in running:
        channel = reservation.channel
        facts = IdleFacts(
            start=reservation.start,
            end=reservation.end,
            exclusive=reservation.exclusive,
            used=False,  # read below, only when the rule would act
            warn_minutes=channel.idle_warn_minutes,
            release_minutes=channel.idle_release_minutes,
            warned_at=reservation.idle_warned_at,
        )
        step = idle_step(facts, now)
        if step is None or used_now(reservation):
            continue
        if step == "warn":
            if Reservation.objects.filter(pk=reservation.pk, idle_warned_at__isnull=True).update(
                idle_warned_at=now
            ):
                release = channel.idle_release_minutes
                then = now + timedelta(minutes=release) if release is not None else None
                notify(
                    user=reservation.user,
                    event=NotificationEvent.IDLE_WARNING,
                    text=functools.partial(_warning_words, str(channel), reservation.start, then),
                    link="/reservations/",
                    key=f"idle_warning:{reservation.pk}",
                    about=slot_of(reservation),
                )
                done["warned"] += 1
        elif step == "release":
            unused = int((now - reservation.start).total_seconds() // 60)
            try:
                reservation_end(reservation=reservation, by=reservation.user, now=now, unused_minutes=unused)
            except InvalidTransition:
                continue  # ended or changed meanwhile
            Reservation.objects.filter(pk=reservation.pk).update(released_idle_at=now)
            log.info("released reservation %s on %s: unused for %s minutes", reservation.pk, channel, unused)
            done["released"] += 1
    return done
