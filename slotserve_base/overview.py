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
        async_to_sync(layer.group_send)(group, message)
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
