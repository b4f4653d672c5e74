"""The scheduler's Celery tasks: thin wrappers around its services (docs/architecture.md)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from channels_app.models import HEARTBEAT_TICKS, Channel, Node
from channels_app.scheduling import on_demand, services
from slotserve_base import dispatch

log = logging.getLogger(__name__)

# A boundary closer than this many ticks is decided at its moment (``redecide_at_boundaries``);
# two, so that a tick that runs late does not let a boundary slip between two windows.
BOUNDARY_TICKS = 2


def fan_out_node_ticks() -> int:
    """Have every live node with channels converge now: one ``node_tick`` on its queue.

    Only nodes whose own heartbeat is recent: a node without a running worker gets nothing
    (its tasks would only pile up), and each node worker ticks itself anyway
    (``channels_app.node_worker.heartbeat``), so nodes keep converging while the scheduler is down.
    """
    since = timezone.now() - timedelta(seconds=HEARTBEAT_TICKS * settings.SLOTSERVE_TICK_SECONDS)
    live = Node.objects.filter(channels__isnull=False, last_heartbeat__gte=since).distinct()
    names = list(live.values_list("name", flat=True))
    for name in names:
        dispatch.send_to_node(dispatch.NODE_TICK, (name,), name)
    return len(names)


@shared_task(name=dispatch.SCHEDULER_TICK, ignore_result=True, soft_time_limit=30, time_limit=60)
def scheduler_tick() -> int:
    """Decide every channel, then have every node converge; returns how many targets changed.

    The tick's other periodic jobs are tasks of their own, each with its beat entry
    (``channels_app.scheduling.beat``): starting-soon reminders, the gateway's usage flush.
    """
    now = timezone.now()
    on_demand.release_idle_on_demand(now=now)  # released first: decided in this same tick
    result = services.decide_channels(now=now)
    fan_out_node_ticks()
    redecide_at_boundaries(result.valid_until, now=now)
    return len(result.changed)


def redecide_at_boundaries(valid_until: dict[int, datetime | None], *, now: datetime) -> int:
    """Re-decide each channel whose decision ends before the tick after next at that very
    moment (a Celery ``eta``): a booking's end, a preload's start, an override's expiry then
    act on time rather than up to a tick late. Deciding twice is harmless (nothing changes)."""
    horizon = now + timedelta(seconds=BOUNDARY_TICKS * settings.SLOTSERVE_TICK_SECONDS)
    due = [
        (pk, moment) for pk, moment in valid_until.items() if moment is not None and now < moment <= horizon
    ]
    for channel_id, moment in due:
        dispatch.send(dispatch.CHANNEL_REDECIDE, args=(channel_id,), eta=moment)
    return len(due)


@shared_task(name=dispatch.CHANNEL_REDECIDE, ignore_result=True, soft_time_limit=20, time_limit=40)
def channel_redecide(channel_id: int) -> bool:
    """Decide one channel now, after a reservation or override changed it,
    and have its node act on a new target at once."""
    changed = bool(services.decide_channels(now=timezone.now(), channel_ids=[channel_id]).changed)
    if changed:
        node_name = Channel.objects.values_list("node__name", flat=True).get(pk=channel_id)
        dispatch.send_to_node(dispatch.CHANNEL_RECONCILE, (channel_id,), node_name)
    return changed
