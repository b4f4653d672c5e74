"""The gateway hears news of a change (docs/gateway.md, "News of a change"): while its snapshot
is kept fresh, one connection per gateway process listens on the installation's ``news`` Redis
channel and has the snapshot read anew at once for each message (``slotserve_base.news``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio
from django.conf import settings

from slotserve_base.news import news_channel

log = logging.getLogger(__name__)

# A listening connection that failed is opened again after this long; meanwhile the snapshot's
# age limit alone keeps it fresh.
RELISTEN_SECONDS = 1.0


async def listen(heard: Callable[[float], Awaitable[None]]) -> None:
    """Until cancelled: for each message, ``heard(the moment it arrived)`` (``time.monotonic``).
    Messages that arrive while ``heard`` runs are taken together after it."""
    while True:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL, client_name=news_channel())
        try:
            async with client.pubsub() as channel:
                await channel.subscribe(news_channel())
                while True:
                    message = await channel.get_message(ignore_subscribe_messages=True, timeout=None)
                    if message is not None and message["type"] == "message":
                        await heard(time.monotonic())
        except asyncio.CancelledError:
            raise
        except Exception as problem:  # noqa: BLE001 — the age limit holds while it cannot listen
            log.warning("gateway: not hearing news of changes (%s); retrying", problem)
            await asyncio.sleep(RELISTEN_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()
