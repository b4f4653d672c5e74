"""The scheduler's Celery tasks: thin wrappers around its services (STYLE.md habit 4)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from channels_app import dispatch
from channels_app.models import Channel, Node
from channels_app.scheduling import services

log = logging.getLogger(__name__)


def fan_out_node_ticks() -> int:
    """Have every node with channels converge: one ``node_tick`` on each node's queue."""
    names = list(Node.objects.filter(channels__isnull=False).distinct().values_list("name", flat=True))
    for name in names:
        dispatch.send_to_node(dispatch.NODE_TICK, (name,), name)
    return len(names)


@shared_task(name=dispatch.SCHEDULER_TICK, ignore_result=True, soft_time_limit=30, time_limit=60)
def scheduler_tick() -> int:
    """Decide every channel, then have every node converge; returns how many targets changed.

    The tick's other periodic jobs are tasks of their own, each with its beat entry
    (``channels_app.scheduling.beat``): starting-soon reminders, the gateway's usage flush.
    """
    changed = len(services.decide_channels(now=timezone.now()).changed)
    fan_out_node_ticks()
    return changed


@shared_task(name=dispatch.CHANNEL_REDECIDE, ignore_result=True, soft_time_limit=20, time_limit=40)
def channel_redecide(channel_id: int) -> bool:
    """Decide one channel now, after a reservation or override changed it,
    and have its node act on a new target at once."""
    changed = bool(services.decide_channels(now=timezone.now(), channel_ids=[channel_id]).changed)
    if changed:
        node_name = Channel.objects.values_list("node__name", flat=True).get(pk=channel_id)
        dispatch.send_to_node(dispatch.CHANNEL_RECONCILE, (channel_id,), node_name)
    return changed
