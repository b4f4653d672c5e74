"""Registers the scheduler tick with django-celery-beat."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from slotserve_base.dispatch import (
    AUDIT_FORGET,
    EDGES,
    FLUSH_USAGE,
    IDLE_RULE,
    KEYS_EXPIRING,
    STARTING_SOON,
    WEBHOOKS_DUE,
)
from slotserve_base.dispatch import SCHEDULER_TICK as TICK_TASK

TICK_TASK_NAME = "SlotServe scheduler tick"
# The tick's other periodic jobs, each its own task: (beat entry name, task name).
PERIODIC_JOBS = (
    ("SlotServe starting-soon reminders", STARTING_SOON),
    ("SlotServe gateway usage flush", FLUSH_USAGE),
    ("SlotServe unused bookings", IDLE_RULE),
    ("SlotServe API keys near expiry", KEYS_EXPIRING),
    ("SlotServe booking starts and ends, nodes lost and back", EDGES),
    ("SlotServe webhook deliveries", WEBHOOKS_DUE),
    ("SlotServe audit trail retention", AUDIT_FORGET),
)


def register_tick(**_: Any) -> None:
    """Run the tick every ``SLOTSERVE_TICK_SECONDS``; a late run expires before the next.

    Called after every ``migrate``, so a changed setting takes effect on the
    next deployment without editing the periodic task by hand.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = int(settings.SLOTSERVE_TICK_SECONDS)
    schedule, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
    for name, task in ((TICK_TASK_NAME, TICK_TASK), *PERIODIC_JOBS):
        PeriodicTask.objects.update_or_create(
            name=name,
            defaults={"task": task, "interval": schedule, "expire_seconds": every, "enabled": True},
        )
