"""Prewarm from the calendar (docs/node-workers.md): each tick the node may begin reading its
next booking's model file into the page cache, in a thread of the worker; a load that begins on
the node stops it at once. What it read is told in the channel's story."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from channels_app import story
from channels_app.models import ChannelRuntime, StoryKind
from channels_app.node_worker import page_cache
from channels_app.scheduling.prewarm import Upcoming, choose
from channels_app.scheduling.selectors import upcoming_bookings
from slotserve_base.vocabulary import Phase

log = logging.getLogger(__name__)

# Free RAM a prewarm leaves to everything else on the machine.
RESERVE_BYTES = 2**30
# Bookings whose file was read (or stopped for a reason that holds): remembered this long.
REMEMBERED = 1000


@dataclass
class Prewarm:
    booking: Upcoming
    stop: threading.Event
    thread: threading.Thread


_lock = threading.Lock()
_current: Prewarm | None = None
_done: dict[str, None] = {}  # insertion-ordered: the oldest are forgotten first


def tend(node_name: str, now: datetime) -> Prewarm | None:
    """Stop a prewarm a load now competes with, or begin the next one; the one begun, if any."""
    global _current
    if settings.SLOTSERVE_PREWARM_SECONDS <= 0:
        return None
    loading = ChannelRuntime.objects.filter(channel__node__name=node_name, phase=Phase.LOADING).exists()
    with _lock:
        if _current is not None and _current.thread.is_alive():
            if loading:
                _current.stop.set()
            return None
        chosen = choose(
            upcoming_bookings(
                node_name=node_name, now=now, horizon=timedelta(seconds=settings.SLOTSERVE_PREWARM_SECONDS)
            ),
            now=now,
            horizon=timedelta(seconds=settings.SLOTSERVE_PREWARM_SECONDS),
            loading=loading,
            available_bytes=page_cache.available_bytes(),
            reserve_bytes=RESERVE_BYTES,
            done=_done,
        )
        if chosen is None or not Path(chosen.path).is_file():
            return None
        stop = threading.Event()
        thread = threading.Thread(target=_read, args=(chosen, stop), name="prewarm", daemon=True)
        _current = Prewarm(chosen, stop, thread)
        thread.start()
        return _current


def yield_to_load() -> None:
    """A load begins on this node: the prewarm stops at once (a load reads at full speed)."""
    with _lock:
        if _current is not None:
            _current.stop.set()


def _remember(key: str) -> None:
    _done[key] = None
    while len(_done) > REMEMBERED:
        del _done[next(iter(_done))]


def _read(booking: Upcoming, stop: threading.Event) -> None:
    began = timezone.now()
    try:
        read = page_cache.read_into_cache(
            booking.path,
            mbps=settings.SLOTSERVE_PREWARM_MBPS,
            reserve_bytes=RESERVE_BYTES,
            stop=stop.is_set,
        )
    except OSError as exc:
        log.warning("prewarm of %s for booking %s failed: %s", booking.path, booking.booking_id, exc)
        _remember(booking.key)
        return
    _remember(booking.key)
    try:
        story.told(
            booking.channel_id,
            timezone.now(),
            StoryKind.PREWARMED,
            booking_id=booking.booking_id,
            model_id=booking.target.model_id,
            preset_id=booking.target.preset_id,
            began=began.isoformat(),
            bytes=read.bytes,
            seconds=round(read.seconds, 3),
            complete=read.complete,
            why=read.why,
        )
    except Exception:
        log.exception("prewarm: telling channel %s's story failed", booking.channel_id)
    finally:
        connection.close()  # the thread's own
