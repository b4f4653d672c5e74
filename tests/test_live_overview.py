"""The live overview: a change of a channel reaches an open WebSocket within a second."""

from __future__ import annotations

import pytest
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from channels_app.scheduling.services import decide_channels
from portal.live import OverviewConsumer
from tests import factories


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_new_target_is_pushed_to_the_overview(memory_layer):
    from asgiref.sync import sync_to_async

    user = await sync_to_async(factories.user)("watcher")
    channel = await sync_to_async(factories.channel)(
        "live-0", default=await sync_to_async(lambda: factories.preset(factories.llm("m"), "p"))()
    )
    socket = WebsocketCommunicator(OverviewConsumer.as_asgi(), "/ws/overview")
    socket.scope["user"] = user
    connected, _ = await socket.connect()
    assert connected
    await sync_to_async(decide_channels)(now=timezone.now())
    message = await socket.receive_json_from(timeout=1)
    assert message == {"channels": [channel.pk], "what": "target"}
    await socket.disconnect()


@pytest.mark.anyio
async def test_anonymous_visitors_are_turned_away(memory_layer):
    socket = WebsocketCommunicator(OverviewConsumer.as_asgi(), "/ws/overview")
    socket.scope["user"] = AnonymousUser()
    connected, code = await socket.connect()
    assert not connected and code == 4401
