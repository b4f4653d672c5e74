"""Refreshing the open live overviews when channels change (``portal.live`` listens). Not to be
confused with announcing a happening to webhooks (``slotserve_base.happenings``)."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

# The channel-layer group every open overview page listens to (portal.live).
OVERVIEW_GROUP = "overview"


def refresh(channel_ids: list[int], what: str) -> None:
    """Tell the open overviews that channels changed, in one message. Never fails the caller."""
    layer = get_channel_layer()
    if layer is None or not channel_ids:
        return
    try:
        async_to_sync(layer.group_send)(
            OVERVIEW_GROUP, {"type": "channel.changed", "channels": channel_ids, "what": what}
        )
    except Exception:
        log.warning("could not refresh the overview for channels %s", channel_ids, exc_info=True)
