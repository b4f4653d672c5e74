"""The node worker's Celery tasks, consumed on each node's own queue (``node.<name>``)."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.utils import timezone

from channels_app.models import Channel
from channels_app.node_worker import prewarm, registration, settle, strays, worker
from channels_app.node_worker.lifecycle import ProcessState
from slotserve_base import dispatch
from slotserve_base.vocabulary import Phase

log = logging.getLogger(__name__)


@shared_task(name=dispatch.NODE_TICK, ignore_result=True, soft_time_limit=60, time_limit=90)
def node_tick(node_name: str) -> int:
    """On the node: heartbeat with its GPUs, then reconcile each of its channels."""
    now = timezone.now()
    try:
        registration.heartbeat(node_name=node_name, now=now)
    except Exception:  # the channels still need their reconcile; the next tick retries
        log.exception("node %s: the heartbeat failed", node_name)
    channel_ids = list(Channel.objects.filter(node__name=node_name).values_list("pk", flat=True))
    for channel_id in channel_ids:
        # One channel's error never stops the node's other channels.
        try:
            # No close watch here: the tick steps each channel once and moves on (a switch's
            # channel_reconcile watches it).
            state = worker.reconcile(channel_id=channel_id, now=timezone.now())
        except Exception:
            log.exception(
                "node %s: reconciling channel %s failed; the other channels go on", node_name, channel_id
            )
            continue
        _follow_up(channel_id, state, node_name)
    try:
        prewarm.tend(node_name, timezone.now())  # the next booking's file, into the page cache
    except Exception:
        log.exception("node %s: the prewarm failed", node_name)
    try:
        strays.stop_strays(node_name)  # runs an earlier worker started and never recorded
    except Exception:
        log.exception("node %s: looking for processes no channel owns failed", node_name)
    return len(channel_ids)


# While a process loads, drains or stops, look again soon rather than at the
# next tick: after 50 ms at first, then less often the longer the phase lasts
# (a tenth of its age, at most a second), so a switch costs the backend's own
# time plus milliseconds, and a ten-minute load costs one probe a second.
TRANSIENT = {Phase.LOADING, Phase.STOPPING, Phase.DRAINING}
FOLLOW_UP_MIN_SECONDS = 0.05
FOLLOW_UP_MAX_SECONDS = 1.0


def follow_up_delay(phase: str, age_seconds: float) -> float | None:
    if phase not in TRANSIENT:
        return None
    return min(max(age_seconds / 10, FOLLOW_UP_MIN_SECONDS), FOLLOW_UP_MAX_SECONDS)


@shared_task(name=dispatch.CHANNEL_RECONCILE, ignore_result=True, soft_time_limit=30, time_limit=45)
def channel_reconcile(channel_id: int) -> str | None:
    """On the node: one lifecycle step of one channel (and the steps that follow at once while
    its phase settles quickly); returns the phase after them."""
    state = _step(channel_id)
    if state is None:
        return None
    node_name = Channel.objects.values_list("node__name", flat=True).get(pk=channel_id)
    _follow_up(channel_id, state, node_name)
    return state.phase.value


def _step(channel_id: int) -> ProcessState | None:
    """Step the channel; while it stops, loads or drains, watch it closely for up to
    ``settle.SETTLE_SECONDS`` and step again the moment what it waits for happens."""
    until = time.monotonic() + settle.SETTLE_SECONDS
    state = worker.reconcile(channel_id=channel_id, now=timezone.now())
    while (
        state is not None
        and state.phase in TRANSIENT
        and time.monotonic() < until
        and settle.settled(channel_id, state, until=until)
    ):
        before = state.phase
        state = worker.reconcile(channel_id=channel_id, now=timezone.now())
        if state is not None and state.phase == before:
            break  # it waits for something the watch does not see (the GPUs' memory): follow-ups
    return state


def _follow_up(channel_id: int, state: ProcessState | None, node_name: str) -> None:
    """Each step stays short; the next one is a new task (every phase ends by its timeout)."""
    if state is None:
        return
    age = (timezone.now() - state.since).total_seconds() if state.since else 0.0
    delay = follow_up_delay(state.phase.value, age)
    if delay is not None:
        dispatch.send_to_node(dispatch.CHANNEL_RECONCILE, (channel_id,), node_name, countdown=delay)
