"""The node worker's own pulse: every tick it registers the node and reconciles its channels,
whether or not the scheduler, Redis or the database answer.

Two loops in two threads: the heartbeat (the database only, cheap) and the reconcile rounds
(which may wait on Redis or a slow process for seconds). A reconcile stuck on a Redis that has
just come back must not make a healthy node look dead, so the heartbeat never waits for it.

The scheduler's fan-out (``scheduling.tasks.fan_out_node_ticks``) only makes a node act
sooner; without it a node still heartbeats and keeps its processes converging. A round that
fails (the database or Redis away) is logged and the next round tries again: the inference
processes run on meanwhile, nobody stops them.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from channels_app.node_worker import registration
from channels_app.node_worker.tasks import node_tick

log = logging.getLogger(__name__)


def one_round(node_name: str) -> bool:
    """Heartbeat and reconcile once; False when the round failed (it is tried again next tick)."""
    try:
        node_tick.run(node_name)
        return True
    except Exception:
        log.warning("node %s: this round failed; the next tick tries again", node_name, exc_info=True)
        return False
    finally:
        close_old_connections()  # a connection the database dropped is opened afresh next round


def beat_once(node_name: str) -> bool:
    """Register the node and its GPUs now (the database only); False when that failed."""
    try:
        registration.heartbeat(node_name=node_name, now=timezone.now())
        return True
    except Exception:
        log.warning("node %s: the heartbeat failed; the next tick tries again", node_name, exc_info=True)
        return False
    finally:
        close_old_connections()


def keep_beating(node_name: str, stop: threading.Event, seconds: float | None = None) -> None:
    """Until ``stop`` is set: heartbeat every ``seconds`` (``SLOTSERVE_TICK_SECONDS``) here, and
    run ``one_round`` (heartbeat and reconcile) as often in a thread of its own."""
    period = float(seconds if seconds is not None else settings.SLOTSERVE_TICK_SECONDS)
    rounds = threading.Thread(
        target=_keep_reconciling, args=(node_name, stop, period), name="reconcile", daemon=True
    )
    rounds.start()
    while not stop.wait(period):
        beat_once(node_name)
    rounds.join(timeout=period + 5)


def _keep_reconciling(node_name: str, stop: threading.Event, period: float) -> None:
    while not stop.wait(period):
        one_round(node_name)


def start(node_name: str) -> threading.Event:
    """Beat in a thread of this process (the node worker); set the returned event to stop."""
    stop = threading.Event()
    threading.Thread(target=keep_beating, args=(node_name, stop), name="heartbeat", daemon=True).start()
    return stop
