"""Lending in Redis (docs/gateway.md, "Lending"): which borrowed requests are in flight on a
channel, and which of them its booker's requests ended.

A borrowed request is kept in the channel's ``lent`` set (scored by when it started) while it is
in flight. A booker's request, once counted in, counts the channel's requests in flight against
its places; when borrowed requests hold the places it needs, the most recently started are taken
out of the set and marked ``preempted``. Each borrowed request looks for its mark every
``LOOK_SECONDS`` and, marked, ends: its process's work is cancelled, its caller told
``preempted_by_booker``. Every gateway process sees the same marks.
"""

from __future__ import annotations

import time

from gateway.wire.counter_scripts import cached_key, script_sha
from gateway.wire.counters import Counters
from slotserve_base.inflight import REDIS_NOW
from slotserve_base.vocabulary import RedisKey

# A borrowed request looks for its mark this often: the booker waits this long at most, plus
# the time its process takes to free the place.
LOOK_SECONDS = 0.02
# A mark outlives any look for it.
MARK_SECONDS = 60

# KEYS: inflight, lent. ARGV: places, the mark's key prefix, the mark's life (s).
# Returns the ids of the borrowed requests that must end, most recently started first.
PREEMPT = (
    REDIS_NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if over <= 0 then return {} end
local ended = redis.call('ZREVRANGE', KEYS[2], 0, over - 1)
for _, id in ipairs(ended) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('SET', ARGV[2] .. id, '1', 'EX', tonumber(ARGV[3]))
end
return ended
"""
)


class Lending:
    """The gateway's side of lending (one per gateway process)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters

    def _key(self, kind: str, ident: object) -> str:
        return cached_key(self.counters._keys(), kind, ident)

    async def lent(self, channel_id: int, request_id: str) -> None:
        """A borrowed request is in flight on the channel."""
        await self.counters.pipe.call(
            "ZADD", self._key(RedisKey.LENT, channel_id), repr(time.time()), request_id
        )

    async def returned(self, channel_id: int, request_id: str) -> None:
        """A borrowed request has ended (its mark, if any, goes with it)."""
        await self.counters.pipe.call("ZREM", self._key(RedisKey.LENT, channel_id), request_id)
        await self.counters.pipe.call("DEL", self._key(RedisKey.PREEMPTED, request_id))

    async def make_room(self, channel_id: int, places: int) -> list[str]:
        """The booker's request is counted in: end the borrowed requests that hold the places
        it needs, the most recently started first. Returns their ids."""
        keys = [self._key(RedisKey.INFLIGHT, channel_id), self._key(RedisKey.LENT, channel_id)]
        mark = self._key(RedisKey.PREEMPTED, "")
        ended = await self.counters.pipe.evalsha(
            PREEMPT, script_sha(PREEMPT), keys, [places, mark, MARK_SECONDS]
        )
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ended or []]

    async def preempted(self, request_id: str) -> bool:
        """Whether the booker's requests ended this borrowed request."""
        return bool(await self.counters.pipe.call("EXISTS", self._key(RedisKey.PREEMPTED, request_id)))
