"""A channel's places and its fair queue in Redis, shared by every gateway process: the Redis
scripts of ``gateway.admit.places``, each one atomic step. The order is ``gateway.rules.fair_queue``'s
(self-clocked fair queueing), kept in these keys of each channel:

``<prefix>:inflight:<channel>``       the requests in the process (``gateway.wire.counters``): a
                                      place is free while fewer than the channel's places
``<prefix>:queue:<channel>``          held requests (``<user>|<request id>``) by finish tag
``<prefix>:queue:alive:<channel>``    held requests by when they expire unless their gateway
                                      looks again (a gateway that dies frees its turns)
``<prefix>:queue:state:<channel>``    the virtual time (``vt``), each user's last tag
                                      (``t:<user>``) and requests held (``n:<user>``), each held
                                      request's arrival (``a:<member>``), and for /metrics the
                                      requests taken from the queue and the seconds they waited
``<prefix>:queue:served:<channel>``   when requests were taken in the last minute: the drain
                                      rate that ``Retry-After`` is told from (the last 10)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from slotserve_base.inflight import GATE_HOLDS, REDIS_NOW
from slotserve_base.vocabulary import RedisKey, redis_key

# How long a queue's state outlives its last use.
STATE_SECONDS = 86400

_FORGET = """
local function forget(m)
  redis.call('ZREM', KEYS[3], m)
  redis.call('ZREM', KEYS[4], m)
  redis.call('HDEL', KEYS[5], 'a:' .. m)
  local user = string.match(m, '^([^|]*)|')
  if redis.call('HINCRBY', KEYS[5], 'n:' .. user, -1) <= 0 then
    redis.call('HDEL', KEYS[5], 'n:' .. user)
  end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do forget(m) end
"""

# Take a place or wait a turn: KEYS inflight, gate, queue, alive, state, served; ARGV request id,
# user, cost (the tokens asked for, divided by the user's weight), places, in-flight entry
# lifetime, held entry lifetime, most held per user, most held per channel, the state's lifetime,
# ready_at (``GATE_HOLDS``). Answers {1, free places left, held} when the request takes a place
# (counted in flight under its id), {2, requests ahead, held} while it waits, {0} at a closed gate
# (the channel switches: it leaves the queue), {-1, retry after} when the user already holds as
# many as they may, {-2, retry after} when the channel's queue is full. Retry-After is the turns
# to wait (until the user's first held request is taken; for a full queue, one) at the drain of
# the last 10 taken (at least one a second): a burst after a quiet minute is judged by the burst.
TURN = (
    REDIS_NOW
    + GATE_HOLDS
    + _FORGET
    + """
local member = ARGV[2] .. '|' .. ARGV[1]
local tag = redis.call('ZSCORE', KEYS[3], member)
if gate_holds(KEYS[2], ARGV[10]) then
  if tag then forget(member) end
  return {0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - 60)
local function retry_after(ahead)
  local served = redis.call('ZCARD', KEYS[6])
  if served == 0 then return 60 end
  local n = math.min(served, 10)
  local since = tonumber(redis.call('ZRANGE', KEYS[6], -n, -n, 'WITHSCORES')[2])
  local seconds = (ahead + 1) * math.max(now - since, 1) / n
  return math.min(math.max(math.ceil(seconds), 1), 600)
end
local function first_of(user)
  local members = redis.call('ZRANGE', KEYS[3], 0, -1)
  for i, m in ipairs(members) do
    if string.sub(m, 1, #user + 1) == user .. '|' then return i - 1 end
  end
  return #members
end
local held = redis.call('ZCARD', KEYS[3])
if not tag then
  local mine = tonumber(redis.call('HGET', KEYS[5], 'n:' .. ARGV[2]) or '0')
  if mine >= tonumber(ARGV[7]) then return {-1, retry_after(first_of(ARGV[2]))} end
  if held >= tonumber(ARGV[8]) then return {-2, retry_after(0)} end
  local vt = tonumber(redis.call('HGET', KEYS[5], 'vt') or '0')
  local last = tonumber(redis.call('HGET', KEYS[5], 't:' .. ARGV[2]) or '0')
  tag = math.max(vt, last) + tonumber(ARGV[3])
  redis.call('HSET', KEYS[5], 't:' .. ARGV[2], tag, 'a:' .. member, now)
  redis.call('HINCRBY', KEYS[5], 'n:' .. ARGV[2], 1)
  redis.call('ZADD', KEYS[3], tag, member)
  held = held + 1
end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), member)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local free = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[1])
local ahead = redis.call('ZRANK', KEYS[3], member)
for i = 3, 6 do redis.call('EXPIRE', KEYS[i], ARGV[9]) end
if ahead >= free then return {2, ahead, held} end
local arrived = tonumber(redis.call('HGET', KEYS[5], 'a:' .. member) or now)
forget(member)
local vt = tonumber(redis.call('HGET', KEYS[5], 'vt') or '0')
redis.call('HSET', KEYS[5], 'vt', math.max(vt, tonumber(tag)))
redis.call('HINCRBY', KEYS[5], 'taken', 1)
redis.call('HINCRBYFLOAT', KEYS[5], 'waited', math.max(now - arrived, 0))
redis.call('ZADD', KEYS[6], now, member)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[1])
return {1, free - 1, held - 1}
"""
)

# A held request whose client left, or a place given back: KEYS inflight, queue, alive, state;
# ARGV request id, user. The request leaves the queue (and its place, if it had one).
LEAVE_QUEUE = (
    REDIS_NOW
    + """
local member = ARGV[2] .. '|' .. ARGV[1]
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('ZREM', KEYS[2], member) == 1 then
  redis.call('ZREM', KEYS[3], member)
  redis.call('HDEL', KEYS[4], 'a:' .. member)
  if redis.call('HINCRBY', KEYS[4], 'n:' .. ARGV[2], -1) <= 0 then
    redis.call('HDEL', KEYS[4], 'n:' .. ARGV[2])
  end
end
return 1
"""
)

# For /metrics: KEYS each channel's queue, alive and state, three by three. Answers per channel
# the requests held (those whose gateway still looks), the requests taken from the queue and the
# milliseconds they waited.
QUEUE_STATS = (
    REDIS_NOW
    + """
local stats = {}
for i = 1, #KEYS, 3 do
  local taken = tonumber(redis.call('HGET', KEYS[i + 2], 'taken') or '0')
  local waited = tonumber(redis.call('HGET', KEYS[i + 2], 'waited') or '0')
  table.insert(stats, redis.call('ZCOUNT', KEYS[i + 1], now, '+inf'))
  table.insert(stats, taken)
  table.insert(stats, math.floor(waited * 1000))
end
return stats
"""
)


def queue_stats(client: Any, channel_ids: Iterable[int]) -> dict[int, tuple[int, int, float]]:
    """Per channel: requests waiting, requests taken from the queue, and the seconds they waited
    (/metrics, the overview; a sync Redis client)."""
    ids = list(channel_ids)
    if not ids:
        return {}
    kinds = (RedisKey.QUEUE, RedisKey.QUEUE_ALIVE, RedisKey.QUEUE_STATE)
    keys = [redis_key(kind, i) for i in ids for kind in kinds]
    answer = client.register_script(QUEUE_STATS)(keys=keys)
    return {
        i: (int(answer[3 * n]), int(answer[3 * n + 1]), int(answer[3 * n + 2]) / 1000)
        for n, i in enumerate(ids)
    }
