"""Celery tasks: thin wrappers around the services and the node worker.

The scheduler's tasks run on the default queue (beat's worker); each node's
tasks run on that node's own queue, ``node.<name>``, consumed only by its
node worker.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from channels_app import services
from channels_app.lifecycle import ProcessState

log = logging.getLogger(__name__)

TICK_TASK = "channels_app.tasks.scheduler_tick"


def flush_gateway_usage() -> None:
    from channels_app.worker import redis_client
    from gateway.usage import flush_usage

    flush_usage(redis_client())


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def send_to_node(task: Any, args: tuple[Any, ...], node_name: str, countdown: float | None = None) -> None:
    """Enqueue ``task`` on the node's queue; a late one expires before the next tick."""
    expires = settings.SLOTSERVE_TICK_SECONDS + (countdown or 0)
    task.apply_async(args=args, queue=node_queue(node_name), countdown=countdown, expires=expires)


@shared_task(name=TICK_TASK, ignore_result=True)
def scheduler_tick() -> int:
    """Decide every channel, send due reminders, and have every node converge.

    Returns how many targets changed.
    """
    from channels_app.models import Node
    from reservations.reminders import send_starting_soon

    now = timezone.now()
    changed = len(services.decide_channels(now=now).changed)
    send_starting_soon(now=now)
    flush_gateway_usage()
    for name in Node.objects.filter(channels__isnull=False).distinct().values_list("name", flat=True):
        send_to_node(node_tick, (name,), name)
    return changed


@shared_task(name="channels_app.tasks.channel_redecide", ignore_result=True)
def channel_redecide(channel_id: int) -> bool:
    """Decide one channel now, after a reservation or override changed it,
    and have its node act on a new target at once."""
    from channels_app.models import Channel

    changed = bool(services.decide_channels(now=timezone.now(), channel_ids=[channel_id]).changed)
    if changed:
        node_name = Channel.objects.values_list("node__name", flat=True).get(pk=channel_id)
        send_to_node(channel_reconcile, (channel_id,), node_name)
    return changed


@shared_task(name="channels_app.tasks.node_tick", ignore_result=True)
def node_tick(node_name: str) -> int:
    """On the node: heartbeat with its GPUs, then reconcile each of its channels."""
    from channels_app import worker
    from channels_app.models import Channel

    now = timezone.now()
    try:
        worker.heartbeat(node_name=node_name, now=now)
    except Exception:  # the channels still need their reconcile; the next tick retries
        log.exception("node %s: the heartbeat failed", node_name)
    channel_ids = list(Channel.objects.filter(node__name=node_name).values_list("pk", flat=True))
    for channel_id in channel_ids:
        # One channel's error never stops the node's other channels.
        try:
            state = worker.reconcile(channel_id=channel_id, now=timezone.now())
        except Exception:
            log.exception(
                "node %s: reconciling channel %s failed; the other channels go on", node_name, channel_id
            )
            continue
        _follow_up(channel_id, state, node_name)
    return len(channel_ids)


# While a process loads, drains or stops, look again soon rather than at the
# next tick: after 50 ms at first, then less often the longer the phase lasts
# (a tenth of its age, at most a second), so a switch costs the backend's own
# time plus milliseconds, and a ten-minute load costs one probe a second.
TRANSIENT = {"loading", "stopping", "draining"}
FOLLOW_UP_MIN_SECONDS = 0.05
FOLLOW_UP_MAX_SECONDS = 1.0


def follow_up_delay(phase: str, age_seconds: float) -> float | None:
    if phase not in TRANSIENT:
        return None
    return min(max(age_seconds / 10, FOLLOW_UP_MIN_SECONDS), FOLLOW_UP_MAX_SECONDS)


@shared_task(name="channels_app.tasks.channel_reconcile", ignore_result=True)
def channel_reconcile(channel_id: int) -> str | None:
    """On the node: one lifecycle step of one channel; returns the phase after it."""
    from channels_app import worker
    from channels_app.models import Channel

    state = worker.reconcile(channel_id=channel_id, now=timezone.now())
    if state is None:
        return None
    node_name = Channel.objects.values_list("node__name", flat=True).get(pk=channel_id)
    _follow_up(channel_id, state, node_name)
    return state.phase.value


def _follow_up(channel_id: int, state: ProcessState | None, node_name: str) -> None:
    """Each step stays short; the next one is a new task (every phase ends by its timeout)."""
    if state is None:
        return
    age = (timezone.now() - state.since).total_seconds() if state.since else 0.0
    delay = follow_up_delay(state.phase.value, age)
    if delay is not None:
        send_to_node(channel_reconcile, (channel_id,), node_name, countdown=delay)
