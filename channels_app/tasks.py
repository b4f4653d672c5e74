"""Celery tasks of the scheduler: thin wrappers around ``channels_app.services``."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from channels_app import services

TICK_TASK = "channels_app.tasks.scheduler_tick"


@shared_task(name=TICK_TASK, ignore_result=True)
def scheduler_tick() -> int:
    """Decide every channel now and send due reminders; returns how many targets changed."""
    from reservations.reminders import send_starting_soon

    now = timezone.now()
    changed = len(services.decide_channels(now=now).changed)
    send_starting_soon(now=now)
    return changed


@shared_task(name="channels_app.tasks.channel_redecide", ignore_result=True)
def channel_redecide(channel_id: int) -> bool:
    """Decide one channel now, after a reservation or override changed it."""
    return bool(services.decide_channels(now=timezone.now(), channel_ids=[channel_id]).changed)
