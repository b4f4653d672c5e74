"""Pushes to the open pages from synchronous code (a decider, a node worker's step) go out over
connections the process keeps: one push does not pay for a new event loop and a new connection
to Redis (docs/architecture.md, "Pushed to the pages")."""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid

import pytest
import redis
from channels.layers import channel_layers, get_channel_layer

from slotserve_base import overview


@pytest.fixture
def own_layer(settings):
    """A layer on the real Redis with a prefix of its own: other tests' pushes are not heard."""
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layers["default"]["CONFIG"]["prefix"] = f"test-{uuid.uuid4().hex}:layer"
    settings.CHANNEL_LAYERS = layers
    channel_layers.backends.clear()
    yield get_channel_layer()
    channel_layers.backends.clear()


def _connections_received(url: str) -> int:
    return int(redis.Redis.from_url(url).info("stats")["total_connections_received"])


def test_pushes_from_synchronous_code_reach_a_listener_over_the_connections_kept(own_layer, settings):
    heard: list[dict[str, object]] = []
    listening = threading.Event()

    async def listen() -> None:
        channel = await own_layer.new_channel()
        await own_layer.group_add(overview.OVERVIEW_GROUP, channel)
        listening.set()
        while len(heard) < 6:
            heard.append(await asyncio.wait_for(own_layer.receive(channel), timeout=10))

    listener = threading.Thread(target=asyncio.run, args=(listen(),))
    listener.start()
    assert listening.wait(10)
    overview.refresh([1], "target")  # the first push opens what the process keeps
    before = _connections_received(settings.REDIS_URL)
    for channel_id in range(2, 7):
        overview.refresh([channel_id], "phase")
    pushes_connected = _connections_received(settings.REDIS_URL) - before - 1  # less this count's own
    listener.join(15)
    assert [m["channels"] for m in heard] == [[1], [2], [3], [4], [5], [6]]
    assert {m["what"] for m in heard[1:]} == {"phase"}
    # Other tests' processes may connect to the same Redis meanwhile, but not one for each push.
    assert pushes_connected < 5, pushes_connected


def test_a_push_that_redis_does_not_answer_never_fails_its_caller(settings, caplog):
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"] = [{"address": "redis://127.0.0.1:1/0"}]  # nothing listens
    settings.CHANNEL_LAYERS = layers
    channel_layers.backends.clear()
    try:
        overview.refresh([1], "target")  # logged, not raised
    finally:
        channel_layers.backends.clear()
    assert "could not refresh the overview" in caplog.text
