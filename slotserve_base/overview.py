"""Refreshing the open live overviews when channels change (``portal.live`` listens). Not to be
confused with announcing a happening to webhooks (``slotserve_base.happenings``)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import BaseChannelLayer, InMemoryChannelLayer, channel_layers, get_channel_layer

log = logging.getLogger(__name__)

# How long a push may hold its caller (a decision, a node worker's step): Redis answers in a
# millisecond; one that does not answer is not waited for (the pages catch up at their next read).
SEND_TIMEOUT_SECONDS = 2.0


class _SendingLoop:
    """One event loop per process, in a thread of its own, that sends the pushes of synchronous
    code (the deciders, the node workers' steps, the views).

    ``async_to_sync`` outside a running loop makes a new loop for each call, and the Redis layer a
    new connection for each loop: 8 ms a push on a quiet machine, paid by every step of a switch.
    Here the loop, and a layer of its own with its connections, last as long as the process (a
    child of a fork makes its own; a new layer once the settings name another)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._layer: tuple[BaseChannelLayer, BaseChannelLayer] | None = None  # (the process's, ours)

    def send(self, layer: BaseChannelLayer, group: str, message: dict[str, object]) -> None:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop, self._pid, self._layer = asyncio.new_event_loop(), os.getpid(), None
                threading.Thread(target=self._loop.run_forever, name="layer-sends", daemon=True).start()
            if self._layer is None or self._layer[0] is not layer:
                # Ours, not the process's: whoever closes the process's pools on its loop never
                # meets connections of this loop.
                self._layer = (layer, channel_layers.make_backend(DEFAULT_CHANNEL_LAYER))
            loop, own = self._loop, self._layer[1]
        future = asyncio.run_coroutine_threadsafe(own.group_send(group, message), loop)
        try:
            future.result(timeout=SEND_TIMEOUT_SECONDS)
        except TimeoutError:
            future.cancel()
            raise


_sending = _SendingLoop()


def _group_send(layer: BaseChannelLayer, group: str, message: dict[str, object]) -> None:
    """Send on the process's own loop; an in-process layer (the tests') on the caller's, where
    its listeners are."""
    if isinstance(layer, InMemoryChannelLayer):
        async_to_sync(layer.group_send)(group, message)
    else:
        _sending.send(layer, group, message)


# The channel-layer group every open overview page listens to (portal.live).
OVERVIEW_GROUP = "overview"


def refresh(channel_ids: list[int], what: str) -> None:
    """Tell the open overviews that channels changed, in one message. Never fails the caller."""
    layer = get_channel_layer()
    if layer is None or not channel_ids:
        return
    try:
        _group_send(layer, OVERVIEW_GROUP, {"type": "channel.changed", "channels": channel_ids, "what": what})
    except Exception:
        log.warning("could not refresh the overview for channels %s", channel_ids, exc_info=True)


# Every open page of a signed-in person listens to their own group (portal.live): their counts
# (unread notifications, requests awaiting their approval) and their webhooks' deliveries.
APPROVERS_GROUP = "approvers"


def person_group(user_id: int) -> str:
    return f"person.{user_id}"


def _send(group: str, message: dict[str, object]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        _group_send(layer, group, message)
    except Exception:
        log.warning("could not tell the open pages of %s", group, exc_info=True)


def counts_changed(user_ids: list[int] | None = None, *, approvers: bool = False) -> None:
    """Tell these people's open pages (and, with ``approvers``, every approver's) that their
    counts changed: each page's connection reads its own. Never fails the caller."""
    for user_id in sorted(set(user_ids or ())):
        _send(person_group(user_id), {"type": "counts.changed"})
    if approvers:
        _send(APPROVERS_GROUP, {"type": "counts.changed"})


def deliveries_changed(owner_id: int, webhook_id: int) -> None:
    """Tell a webhook owner's open pages that its deliveries' log changed (a try, a redelivery)."""
    _send(person_group(owner_id), {"type": "deliveries.changed", "webhook": webhook_id})
