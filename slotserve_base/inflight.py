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

# A channel's gate (``<prefix>:gate:<channel>``, the moment the node worker closed it for a
# switch) holds a request unless the gateway's snapshot shows the channel's process ready since
# after that moment (``ready_at``, a Unix time; 0 unless ready): then it is the switch's new
# process, and the gate, kept a snapshot's life for snapshots read before the switch, does not
# concern it (docs/gateway.md, "Draining"). A gate that keeps no moment holds every request.
GATE_HOLDS = """
local function gate_holds(gate, ready_at)
  local closed = redis.call('GET', gate)
  if not closed then return false end
  local moment = tonumber(closed)
  return not (moment and moment < (tonumber(ready_at) or 0))
end
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
