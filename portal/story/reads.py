"""What a channel's story is told from (docs/scheduling.md, "A channel's story"): its kept rows,
the bookings on it, and the request log counted per minute (the queue and the requests served).
A few queries for any window; the request log is counted by the database."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.db.models.functions import TruncMinute

from channels_app.models import Channel, LLMModel, Preset, StoryEntry
from channels_app.scheduling.selectors import load_estimates
from gateway.models import RequestLog
from portal.story.telling import Booking, Entry, Names
from reservations.models import SCHEDULED_STATUSES, Reservation, ReservationStatus
from reservations.selectors import bookable_by
from slotserve_base.target import Target

# The process's last step before a window is part of its story (what ran when it began): rows
# this far before it are read too.
LOOK_BACK = timedelta(hours=6)


def channels_for(user: User) -> QuerySet[Channel]:
    """The channels whose story ``user`` may read: those they may book (staff: every one)."""
    return bookable_by(user)


def booking_of(row: Reservation) -> Booking:
    return Booking(
        id=row.pk,
        user=row.user.get_username(),
        start=row.start,
        end=row.end,
        model_id=row.model_id,
        preset_id=row.preset_id,
        exclusive=row.exclusive,
        ended_early=row.status == ReservationStatus.ENDED and row.released_idle_at is None,
        released_idle_at=row.released_idle_at,
        status=str(row.status),
    )


def entries(channel: Channel, start: datetime, end: datetime) -> list[Entry]:
    rows = StoryEntry.objects.filter(channel=channel, at__gte=start - LOOK_BACK, at__lt=end).order_by(
        "at", "pk"
    )
    return [Entry(at, kind, data) for at, kind, data in rows.values_list("at", "kind", "data")]


def bookings(channel: Channel, start: datetime, end: datetime) -> list[Booking]:
    rows = (
        Reservation.objects.filter(
            channel=channel, status__in=SCHEDULED_STATUSES, start__lt=end, end__gt=start
        )
        .select_related("user")
        .order_by("start")
    )
    return [booking_of(row) for row in rows]


def previous_booking(booking: Reservation) -> Booking | None:
    row = (
        Reservation.objects.filter(
            channel_id=booking.channel_id, status__in=SCHEDULED_STATUSES, end__lte=booking.start
        )
        .select_related("user")
        .order_by("-end")
        .first()
    )
    return booking_of(row) if row is not None else None


def names(found: list[Booking]) -> Names:
    return Names(
        models=dict(LLMModel.objects.values_list("pk", "name")),
        presets=dict(Preset.objects.values_list("pk", "name")),
        bookings={b.id: b for b in found},
    )


def estimate(channel: Channel, model_id: int | None, preset_id: int | None) -> float | None:
    if model_id is None:
        return None
    target = Target(model_id, preset_id)
    return load_estimates([(channel.node_id, target)]).get((channel.node_id, target))


def bucket_for(start: datetime, end: datetime) -> timedelta:
    """Minutes for a window of hours, longer buckets for days (a few hundred points at most)."""
    span = end - start
    if span <= timedelta(hours=6):
        return timedelta(minutes=1)
    if span <= timedelta(days=1):
        return timedelta(minutes=5)
    return timedelta(hours=1)


# A window's chart has at most this many buckets (a month of hours).
MOST_BUCKETS = 800


@dataclass
class Bucket:
    at: datetime
    requests: int = 0
    served: int = 0
    refused: int = 0
    waited: int = 0
    wait_ms_max: float = 0.0
    busy_ms: float = 0.0

    def json(self, width: timedelta) -> dict[str, Any]:
        return {
            "at": self.at,
            "requests": self.requests,
            "served": self.served,
            "refused": self.refused,
            "waited": self.waited,
            "wait_ms_max": round(self.wait_ms_max, 1),
            # Places in use on average: the requests' time spent in the bucket's time.
            "places_in_use": round(self.busy_ms / (width.total_seconds() * 1000), 2),
        }


def requests(channel: Channel, start: datetime, end: datetime, *, everyone: bool) -> dict[str, Any]:
    """The requests served and refused, the waits in the queue and the places in use, per bucket;
    with ``everyone`` (staff), who sent them too."""
    width = bucket_for(start, end)
    log = RequestLog.objects.filter(channel=channel, at__gte=start, at__lt=end)
    per_minute = (
        log.annotate(minute=TruncMinute("at", tzinfo=UTC))
        .values("minute")
        .annotate(
            requests=Count("pk"),
            refused=Count("pk", filter=Q(status__gte=400)),
            waited=Count("pk", filter=Q(queued_ms__gt=0)),
            wait_max=Max("queued_ms"),
            busy=Sum("duration_ms", filter=Q(status__lt=400)),
        )
        .order_by("minute")
    )
    buckets: dict[datetime, Bucket] = {}
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    for row in per_minute:
        minute = row["minute"]
        at = epoch + ((minute - epoch) // width) * width
        bucket = buckets.setdefault(at, Bucket(at))
        bucket.requests += row["requests"]
        bucket.refused += row["refused"]
        bucket.served += row["requests"] - row["refused"]
        bucket.waited += row["waited"]
        bucket.wait_ms_max = max(bucket.wait_ms_max, row["wait_max"] or 0.0)
        bucket.busy_ms += row["busy"] or 0.0
    # Every bucket of the window, the quiet ones too: the chart is a time axis.
    at = epoch + ((start - epoch) // width) * width
    while at < end and len(buckets) < MOST_BUCKETS:
        buckets.setdefault(at, Bucket(at))
        at += width
    shown: dict[str, Any] = {
        "bucket_seconds": int(width.total_seconds()),
        "buckets": [b.json(width) for b in sorted(buckets.values(), key=lambda b: b.at)],
    }
    if everyone:
        by_user: dict[str, int] = defaultdict(int)
        for username, count in log.values_list("user__username").annotate(n=Count("pk")).order_by("-n"):
            by_user[username] += count
        shown["by_user"] = dict(by_user)
    return shown
