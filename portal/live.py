"""Live overview: phase and target changes pushed to browsers over a WebSocket.

The node worker and the scheduler refresh the overview by sending a change of a channel to the
``overview`` group of the channel layer (Redis in production); each open
overview page is told which channel changed and refreshes its cards.
"""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from slotserve_base.overview import OVERVIEW_GROUP

GROUP = OVERVIEW_GROUP


class OverviewConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def channel_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({"channels": event["channels"], "what": event["what"]})
