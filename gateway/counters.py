"""Facts the gateway and the node workers share through Redis, exact at every request.

``<prefix>:inflight:<channel>``  requests admitted and not yet finished
``<prefix>:gate:<channel>``      set by the node worker when the channel's target changed:
                                 new requests get ``503 model_switching``
``<prefix>:usage:*``             requests and tokens per reservation and per user

Admission increments the in-flight count *before* it reads the gate, and the
node worker closes the gate *before* it reads the count: whichever comes
second sees the other, so no request is admitted to a process being stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio as aioredis


def key(kind: str, ident: object) -> str:
    """A Redis key of this installation (``SLOTSERVE_REDIS_PREFIX``), e.g. ``slotserve:inflight:3``."""
    from django.conf import settings

    return f"{settings.SLOTSERVE_REDIS_PREFIX}:{kind}:{ident}"


INFLIGHT, GATE = "inflight", "gate"
USAGE_RESERVATION, USAGE_USER = "usage:reservation", "usage:user"


class Counters:
    def __init__(self, url: str) -> None:
        self.redis = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    async def enter(self, channel_id: int) -> bool:
        """Count a request in; False (and counted out again) if the channel is switching."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.incr(key(INFLIGHT, channel_id))
            pipe.exists(key(GATE, channel_id))
            _, gate = await pipe.execute()
        if gate:
            await self.redis.decr(key(INFLIGHT, channel_id))
            return False
        return True

    async def leave(
        self,
        channel_id: int,
        *,
        user_id: int,
        reservation_id: int | None,
        prompt: int,
        completion: int,
        status: int | None = None,
        ttft_seconds: float | None = None,
    ) -> None:
        """Count the request out, with its usage and (for /metrics) its answer, in one round trip."""
        from slotserve_site.metrics import GATEWAY_STATUS, GATEWAY_TTFT, ttft_bucket

        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.decr(key(INFLIGHT, channel_id))
            if status is not None:
                pipe.hincrby(key(GATEWAY_STATUS, "all"), str(status), 1)
            if ttft_seconds is not None:
                pipe.hincrby(key(GATEWAY_TTFT, "all"), ttft_bucket(ttft_seconds), 1)
                pipe.hincrbyfloat(key(GATEWAY_TTFT, "all"), "sum", ttft_seconds)
            names = [key(USAGE_USER, user_id)]
            if reservation_id:
                names.append(key(USAGE_RESERVATION, reservation_id))
            for name in names:
                pipe.hincrby(name, "requests", 1)
                if prompt:
                    pipe.hincrby(name, "prompt_tokens", prompt)
                if completion:
                    pipe.hincrby(name, "completion_tokens", completion)
            await pipe.execute()

    async def answered(self, status: int, ttft_seconds: float | None = None) -> None:
        """Count an answer by status code, and its time to first token, for /metrics."""
        from slotserve_site.metrics import GATEWAY_STATUS, GATEWAY_TTFT, ttft_bucket

        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(key(GATEWAY_STATUS, "all"), str(status), 1)
            if ttft_seconds is not None:
                pipe.hincrby(key(GATEWAY_TTFT, "all"), ttft_bucket(ttft_seconds), 1)
                pipe.hincrbyfloat(key(GATEWAY_TTFT, "all"), "sum", ttft_seconds)
            await pipe.execute()

    async def in_flight(self, channel_ids: Iterable[int]) -> dict[int, int]:
        ids = list(channel_ids)
        if not ids:
            return {}
        values = await self.redis.mget([key(INFLIGHT, i) for i in ids])
        return {i: int(v or 0) for i, v in zip(ids, values, strict=True)}

    async def switching(self, channel_ids: Iterable[int]) -> set[int]:
        ids = list(channel_ids)
        if not ids:
            return set()
        values = await self.redis.mget([key(GATE, i) for i in ids])
        return {i for i, v in zip(ids, values, strict=True) if v}
