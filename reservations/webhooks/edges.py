"""Events no service makes: a booking's slot beginning and ending at its time, a node's worker
going quiet and coming back. A periodic job looks each tick (``tasks.announce_edges``); each edge
is announced once, its key kept with the event (``Event.key``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Concat

from channels_app.models import Node
from reservations.announce import announce_booking
from reservations.models import Reservation, ReservationStatus
from reservations.webhooks.models import Event
from slotserve_base.happenings import Happening, named, tell
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import WebhookEvent

# Edges older than this are not announced late (a scheduler that was down for a day).
LATE = timedelta(hours=1)


def announce_booking_edges(*, now: datetime) -> int:
    """Announce approved bookings that began or ended at their time since ``now - LATE``."""
    told = 0
    for event, field in ((WebhookEvent.BOOKING_STARTED, "start"), (WebhookEvent.BOOKING_ENDED, "end")):
        known = Event.objects.filter(key=Concat(Value(f"{event}:"), OuterRef("pk")))
        edges = (
            Reservation.objects.filter(
                status=ReservationStatus.APPROVED, **{f"{field}__gt": now - LATE, f"{field}__lte": now}
            )
            .exclude(Exists(known))
            .select_related("user", "channel", "model", "preset")
            .order_by(field, "pk")
        )
        for reservation in edges:
            announce_booking(event, reservation, at=getattr(reservation, field), once=True)
            told += 1
    return told


def announce_node_changes(*, now: datetime) -> int:
    """Announce nodes whose readiness changed since it was last announced (a node never
    announced counts as ready: its going quiet is news, its first start is not)."""
    told = 0
    for node in Node.objects.exclude(last_heartbeat=None):
        ready = node.is_ready(now)
        last = (
            Event.objects.filter(
                subject=f"node:{node.pk}", type__in=[WebhookEvent.NODE_READY, WebhookEvent.NODE_NOT_READY]
            )
            .order_by("-at", "-pk")
            .values_list("type", flat=True)
            .first()
        )
        was_ready = last != WebhookEvent.NODE_NOT_READY
        if ready == was_ready:
            continue
        event = WebhookEvent.NODE_READY if ready else WebhookEvent.NODE_NOT_READY
        heartbeat = node.last_heartbeat
        assert heartbeat is not None
        said = "reports again" if ready else f"has not reported since {heartbeat:%Y-%m-%d %H:%M:%S} UTC"
        tell(
            Happening(
                type=event,
                at=now,
                data={
                    "node": named(node),
                    "last_heartbeat": iso_moment(heartbeat),
                    "channels": [named(c) for c in node.channels.all()],
                },
                subject=f"node:{node.pk}",
                words=f"Node {node.name}: its worker {said}.",
                channels=frozenset(node.channels.values_list("pk", flat=True)),
                link="/",
            )
        )
        told += 1
    return told
