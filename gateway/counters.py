"""Facts the gateway and the node workers share through Redis, exact at every request.

``slotserve:inflight:<channel>``  requests admitted and not yet finished
``slotserve:gate:<channel>``      set by the node worker when the channel's target changed:
                                  new requests get ``503 model_switching``
``slotserve:usage:*``             requests and tokens per reservation and per user

Admission increments the in-flight count *before* it reads the gate, and the
node worker closes the gate *before* it reads the count: whichever comes
second sees the other, so no request is admitted to a process being stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio as aioredis

INFLIGHT = "slotserve:inflight:{}"
GATE = "slotserve:gate:{}"
USAGE_RESERVATION = "slotserve:usage:reservation:{}"
USAGE_USER = "slotserve:usage:user:{}"


class Counters:
    def __init__(self, url: str) -> None:
        self.redis = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    async def enter(self, channel_id: int) -> bool:
        """Count a request in; False (and counted out again) if the channel is switching."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(INFLIGHT.format(channel_id))
            pipe.exists(GATE.format(channel_id))
            _, gate = await pipe.execute()
        if gate:
            await self.redis.decr(INFLIGHT.format(channel_id))
            return False
        return True

    async def leave(
        self, channel_id: int, *, user_id: int, reservation_id: int | None, prompt: int, completion: int
    ) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.decr(INFLIGHT.format(channel_id))
            for key in [USAGE_USER.format(user_id)] + (
                [USAGE_RESERVATION.format(reservation_id)] if reservation_id else []
            ):
                pipe.hincrby(key, "requests", 1)
                if prompt:
                    pipe.hincrby(key, "prompt_tokens", prompt)
                if completion:
                    pipe.hincrby(key, "completion_tokens", completion)
            await pipe.execute()

    async def in_flight(self, channel_ids: Iterable[int]) -> dict[int, int]:
        ids = list(channel_ids)
        if not ids:
            return {}
        values = await self.redis.mget([INFLIGHT.format(i) for i in ids])
        return {i: int(v or 0) for i, v in zip(ids, values, strict=True)}

    async def switching(self, channel_ids: Iterable[int]) -> set[int]:
        ids = list(channel_ids)
        if not ids:
            return set()
        values = await self.redis.mget([GATE.format(i) for i in ids])
        return {i for i, v in zip(ids, values, strict=True) if v}
