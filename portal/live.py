"""The portal's live connection: what changed, pushed to every open page over a WebSocket.

The node worker and the scheduler refresh the overview by sending a change of a channel to the
``overview`` group of the channel layer (Redis in production); each open page is told which
channel changed (the overview refreshes its cards). Each page also listens to its person's own
group (``slotserve_base.overview``): their counts (unread notifications, requests awaiting their
approval; the navigation's badges) and their webhooks' deliveries.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.context_processors import counts_of
from slotserve_base.overview import APPROVERS_GROUP, OVERVIEW_GROUP, person_group

GROUP = OVERVIEW_GROUP


class OverviewConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = [GROUP, person_group(user.pk)]
        if await database_sync_to_async(_approves)(user):
            self.groups_joined.append(APPROVERS_GROUP)
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def counts_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"counts": await database_sync_to_async(counts_of)(self.scope["user"])})

    async def deliveries_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"deliveries": event["webhook"]})

    async def channel_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"channels": event["channels"], "what": event["what"]})


def _approves(user: Any) -> bool:
    return bool(user.is_staff or user.approves_for.exists())
