"""Where work is sent: the Celery task names and queues the stages share.

The scheduler, the node worker and the reservation services hand work to each
other through Celery by *name*, so no stage imports another's tasks: the
scheduler never imports the node worker, and the services never import a
task module (no import cycles; ``./slotserve check`` enforces it).

The decisions (the tick, a channel's re-decision) run on a queue of their
own, ``decisions``, taken one at a time by a worker that does nothing else:
a booking's re-decision never waits behind a long job. The scheduler's other
tasks run on the default queue (beat's worker); each node's tasks run on
that node's own queue, ``node.<name>``, consumed only by its node worker.
Webhook deliveries run on a queue and worker of their own, ``webhooks``: a
receiver that answers slowly, or never, holds none of the
workers that decide, hear of nodes or keep a slot's time (docs/webhooks.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

SCHEDULER_TICK = "channels_app.scheduling.tasks.scheduler_tick"
CHANNEL_REDECIDE = "channels_app.scheduling.tasks.channel_redecide"
NODE_TICK = "channels_app.node_worker.tasks.node_tick"
CHANNEL_RECONCILE = "channels_app.node_worker.tasks.channel_reconcile"
NOTIFICATION_EMAIL = "reservations.tasks.send_notification_email"
STARTING_SOON = "reservations.tasks.send_starting_soon_reminders"
FLUSH_USAGE = "gateway.tasks.flush_gateway_usage"
CATCH_UP_USAGE = "gateway.tasks.catch_up_usage"
IDLE_RULE = "reservations.tasks.release_idle_bookings"
KEYS_EXPIRING = "gateway.tasks.tell_keys_expiring"
AUDIT_FORGET = "slotserve_site.tasks.forget_old_audit"
WEBHOOK_DELIVER = "reservations.webhooks.tasks.deliver_webhook"
WEBHOOK_TEST_SEND = "reservations.webhooks.tasks.send_test_event"
WEBHOOKS_DUE = "reservations.webhooks.tasks.webhooks_due"
EDGES = "reservations.webhooks.tasks.announce_edges"
# The tasks that talk to receivers outside: the webhooks' queue only.
WEBHOOK_TASKS = frozenset({WEBHOOK_DELIVER, WEBHOOK_TEST_SEND})
# The decisions: the tick and a channel's re-decision, on a queue of their own.
DECISION_TASKS = frozenset({SCHEDULER_TICK, CHANNEL_REDECIDE})


def route(name: str, *_: Any, **__: Any) -> dict[str, str] | None:
    """Celery's router (``CELERY_TASK_ROUTES``): the queue of a task sent without one, by beat
    or by ``send``; every other task goes to the scheduler's queue, the default."""
    if name in DECISION_TASKS:
        return {"queue": decisions_queue()}
    if name in WEBHOOK_TASKS:
        return {"queue": webhook_queue()}
    return None


def send(task_name: str, **options: Any) -> None:
    """Send by name; through the registered task where this process has it, so that eager
    mode (tests, ``SLOTSERVE_CELERY_EAGER``) runs it in place. The queue is the router's."""
    task = current_app.tasks.get(task_name)
    if task is not None:
        task.apply_async(**options)
    else:
        current_app.send_task(task_name, **options)


def send_quietly(task_name: str, **options: Any) -> None:
    """Send, and only log when the broker cannot take it: for work a periodic job picks up
    anyway (a webhook's deliveries: ``WEBHOOKS_DUE``)."""
    try:
        send(task_name, **options)
    except Exception:
        log.exception("could not send %s; its periodic job will pick the work up", task_name)


def node_queue(node_name: str) -> str:
    """The node's own queue, named with the installation's prefix (``SLOTSERVE_REDIS_PREFIX``)."""
    return f"{settings.SLOTSERVE_REDIS_PREFIX}.node.{node_name}"


def webhook_queue() -> str:
    """The webhooks' queue, ``<prefix>.webhooks``, consumed by the webhooks' worker alone."""
    return f"{settings.SLOTSERVE_REDIS_PREFIX}.webhooks"


def decisions_queue() -> str:
    """The decisions' queue, ``<prefix>.decisions``: the tick and each channel's re-decision,
    consumed by the decisions' worker alone, one task at a time."""
    return f"{settings.SLOTSERVE_REDIS_PREFIX}.decisions"


def send_to_node(
    task_name: str, args: tuple[Any, ...], node_name: str, countdown: float | None = None
) -> None:
    """Enqueue a node task on the node's queue; a late one expires before the next tick."""
    expires = settings.SLOTSERVE_TICK_SECONDS + (countdown or 0)
    send(task_name, args=(*args,), queue=node_queue(node_name), countdown=countdown, expires=expires)


@dataclass(frozen=True)
class Redecide:
    """Re-decide one channel: a callback equal to another of the same channel."""

    channel_id: int

    def __call__(self) -> None:
        try:
            send(
                CHANNEL_REDECIDE,
                args=(self.channel_id,),
                retry=True,
                retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
            )
        except Exception:
            # The change is committed; the next tick (SLOTSERVE_TICK_SECONDS)
            # re-decides the channel anyway. Say loudly that it was late.
            log.exception(
                "could not enqueue the re-decision of channel %s; the next tick will", self.channel_id
            )


def enqueue_redecide(channel_id: int) -> None:
    """Re-decide one channel right after the current transaction commits (docs/scheduling.md);
    once, however often the transaction asks (a series of bookings approved at once)."""
    job = Redecide(channel_id)
    connection = transaction.get_connection()
    # Django keeps the transaction's callbacks as (savepoints open when asked, callback, robust);
    # an ask whose savepoints are all still open is this transaction's and still to run (one
    # rolled back went with its savepoint; one from a block already closed is not counted on).
    if connection.in_atomic_block:
        open_now = set(connection.savepoint_ids)
        if any(waiting == job and asked <= open_now for asked, waiting, _ in connection.run_on_commit):
            return
    transaction.on_commit(job)
