"""Requests in flight per channel, as the gateway records them in Redis (``gateway.wire.counters``).

The node worker reads the count to drain before a switch; /metrics shows it. Each request
is an entry that expires unless its gateway refreshes it, so the count is the entries not
yet expired, by Redis' own clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from slotserve_base.vocabulary import RedisKey, redis_key

# Redis' own clock, which every gateway and node worker share.
REDIS_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# The live entries of each in-flight set in KEYS (expired ones are dropped on the way).
COUNT = (
    REDIS_NOW
    + """
local counts = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  counts[i] = redis.call('ZCARD', KEYS[i])
end
return counts
"""
)


def in_flight_counts(client: Any, channel_ids: Iterable[int]) -> dict[int, int]:
    """Requests in flight per channel, for the node workers and /metrics (a sync Redis client)."""
    ids = list(channel_ids)
    if not ids:
        return {}
    # A registered script: EVALSHA, loaded again by redis-py when Redis forgot it.
    counts = client.register_script(COUNT)(keys=[redis_key(RedisKey.INFLIGHT, i) for i in ids])
    return {i: int(c) for i, c in zip(ids, counts, strict=True)}
