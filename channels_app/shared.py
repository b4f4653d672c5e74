"""What every SlotServe process shares: one long-lived Redis client, and the announcement of
channel changes to the live overview. Low in the layers: any stage may use it."""

from __future__ import annotations

import functools
import logging

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)

# The channel-layer group every open overview page listens to (portal.live).
OVERVIEW_GROUP = "overview"


def redis_client() -> redis.Redis:
    """This process's client of SlotServe's Redis: one connection pool, kept for the process."""
    return _client_for(settings.REDIS_URL)


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def announce(channel_ids: list[int], what: str) -> None:
    """Tell the open overviews that channels changed, in one message. Never fails the caller."""
    layer = get_channel_layer()
    if layer is None or not channel_ids:
        return
    try:
        async_to_sync(layer.group_send)(
            OVERVIEW_GROUP, {"type": "channel.changed", "channels": channel_ids, "what": what}
        )
    except Exception:
        log.warning("could not announce a change of channels %s to the overview", channel_ids, exc_info=True)
