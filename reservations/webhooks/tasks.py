"""The webhooks' Celery tasks: thin wrappers around ``delivery`` (docs/webhooks.md)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from reservations.webhooks import delivery, edges
from reservations.webhooks.models import Event
from slotserve_base import dispatch


@shared_task(name=dispatch.WEBHOOK_DELIVER, ignore_result=True, soft_time_limit=600, time_limit=660)
def deliver_webhook(webhook_id: int) -> int:
    """Send a webhook's due deliveries, in order; returns how many were tried. A run that sent as
    many as one run may goes on in a new task at once (a burst of events), not at the next tick."""
    tried = delivery.deliver(webhook_id)
    if tried >= delivery.PER_RUN:
        dispatch.send_quietly(dispatch.WEBHOOK_DELIVER, args=(webhook_id,))
    return tried


@shared_task(name=dispatch.WEBHOOK_TEST_SEND, ignore_result=True, soft_time_limit=60, time_limit=90)
def send_test_event(delivery_id: int) -> bool:
    return delivery.send_test(delivery_id)


@shared_task(name=dispatch.WEBHOOKS_DUE, ignore_result=True, soft_time_limit=30, time_limit=60)
def webhooks_due() -> int:
    """Every tick: send the deliveries whose retry is due, one task per webhook, and drop events
    older than ``SLOTSERVE_WEBHOOK_LOG_DAYS`` with their deliveries."""
    now = timezone.now()
    due = delivery.due_webhooks(now)
    for webhook_id in due:
        dispatch.send_quietly(dispatch.WEBHOOK_DELIVER, args=(webhook_id,))
    Event.objects.filter(at__lt=now - timedelta(days=settings.SLOTSERVE_WEBHOOK_LOG_DAYS)).delete()
    return len(due)


@shared_task(name=dispatch.EDGES, ignore_result=True, soft_time_limit=30, time_limit=60)
def announce_edges() -> int:
    """Every tick: bookings that began or ended at their time, nodes lost and back."""
    now = timezone.now()
    return edges.announce_booking_edges(now=now) + edges.announce_node_changes(now=now)
