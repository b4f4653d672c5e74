"""The Redis scripts that count a request in and out, each one atomic step in Redis, and what
they deal in: the keys of weekly token budgets, the buckets of times to first token, the
refusal of a limit. ``gateway.wire.counters`` runs them; the node worker reads what they write.
Redis' own clock is ``now`` in each (``slotserve_base.inflight.REDIS_NOW``), the one clock every
gateway and node worker shares."""

from __future__ import annotations

import functools
import hashlib
import time
from datetime import UTC, datetime, timedelta

from gateway.rules.callers import Limits
from slotserve_base.inflight import GATE_HOLDS, REDIS_NOW
from slotserve_base.vocabulary import RedisKey, redis_key

key = redis_key

# A held request's entry lives this long unless its gateway refreshes it (every third of it,
# ``gateway.admit.step``): a gateway that dies frees its callers' places within it.
HELD_TTL_SECONDS = 30.0

# Count a request in, unless its channel's gate holds it (``GATE_HOLDS``): one round trip, and
# atomic. ARGV: request id, entry lifetime in seconds, ready_at. (The set's own expiry is left to
# REFRESH, off the hot path; an entry that outlives its gateway is counted out by its score.)
ENTER = (
    REDIS_NOW
    + GATE_HOLDS
    + """
if gate_holds(KEYS[2], ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

# Keep live requests counted: KEYS the gateway's marker, then in-flight sets; ARGV lifetime,
# then one request id per set. While the marker stands, only entries still there are renewed
# (ZADD XX), so a request counted out meanwhile is not counted in again; a missing marker
# means Redis lost its data (a restart), and every live request is added back.
REFRESH = (
    REDIS_NOW
    + """
local ttl = tonumber(ARGV[1])
local lost = redis.call('EXISTS', KEYS[1]) == 0
for i = 2, #KEYS do
  if lost then
    redis.call('ZADD', KEYS[i], now + ttl, ARGV[i])
  else
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[i])
  end
  redis.call('EXPIRE', KEYS[i], math.ceil(ttl) + 1)
end
redis.call('SET', KEYS[1], '1', 'EX', math.ceil(ttl * 2))
return lost and 1 or 0
"""
)

# Count an answer: KEYS status hash, TTFT hash, the request log; when ARGV[1] is 1 also the
# in-flight set, then (when ARGV[11] is 1: the request was within limits) the user's tokens this
# week, the user's and the key's in-flight sets and the key's tokens this week, then the usage
# hashes (user, key, reservation). ARGV status, TTFT bucket, TTFT seconds, prompt and
# completion tokens ('' where not known), the request id, the request's log record ('' for
# none), how many records the log keeps at most while nobody flushes it, how long a week's token
# count is kept, and the flag.
LEAVE = """
if ARGV[2] ~= '' then redis.call('HINCRBY', KEYS[1], ARGV[2], 1) end
if ARGV[3] ~= '' then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  redis.call('HINCRBYFLOAT', KEYS[2], 'sum', ARGV[4])
end
if ARGV[8] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[8])
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[9]), -1)
end
if ARGV[1] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[7])
  local first = 5
  if ARGV[11] == '1' then
    local tokens = tonumber(ARGV[5]) + tonumber(ARGV[6])
    if tokens > 0 then
      for _, week in ipairs({KEYS[5], KEYS[8]}) do
        redis.call('INCRBY', week, tokens)
        redis.call('EXPIRE', week, ARGV[10])
      end
    end
    redis.call('ZREM', KEYS[6], ARGV[7])
    redis.call('ZREM', KEYS[7], ARGV[7])
    first = 9
  end
  for i = first, #KEYS do
    redis.call('HINCRBY', KEYS[i], 'requests', 1)
    if ARGV[5] ~= '0' then redis.call('HINCRBY', KEYS[i], 'prompt_tokens', ARGV[5]) end
    if ARGV[6] ~= '0' then redis.call('HINCRBY', KEYS[i], 'completion_tokens', ARGV[6]) end
  end
end
return 1
"""

# Count a request in within its caller's limits (fair sharing outside slots), or say which
# limit it meets: KEYS in-flight set, gate, the user's and the key's in-flight sets, the user's
# and the key's count this minute, the user's and the key's tokens this week; ARGV request id,
# entry lifetime, then the limits (0: none): user concurrent, key concurrent, user per minute,
# key per minute, user weekly tokens, key weekly tokens, ready_at (``GATE_HOLDS``). Answers
# {1, room} admitted (room: how many more requests the caller's concurrency and per-minute
# limits let in now, ROOMY when none of them is set), {0} gate closed, {-1, seconds} over a limit
# (the seconds until it lifts; 0 when unknown), with the limit's name.
ENTER_LIMITED = (
    REDIS_NOW
    + GATE_HOLDS
    + """
if gate_holds(KEYS[2], ARGV[9]) then return {0} end
local function live(set)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  return redis.call('ZCARD', set)
end
local budget = tonumber(ARGV[7])
if budget > 0 and tonumber(redis.call('GET', KEYS[7]) or '0') >= budget then
  return {-1, 0, 'weekly_tokens'}
end
local key_budget = tonumber(ARGV[8])
if key_budget > 0 and tonumber(redis.call('GET', KEYS[8]) or '0') >= key_budget then
  return {-1, 0, 'key_weekly_tokens'}
end
if tonumber(ARGV[3]) > 0 and live(KEYS[3]) >= tonumber(ARGV[3]) then return {-1, 1, 'user_concurrent'} end
if tonumber(ARGV[4]) > 0 and live(KEYS[4]) >= tonumber(ARGV[4]) then return {-1, 1, 'key_concurrent'} end
for i = 5, 6 do
  local limit = tonumber(ARGV[i])
  if limit > 0 and tonumber(redis.call('GET', KEYS[i]) or '0') >= limit then
    -- whole seconds, rounded up: never shorter than the real wait (TTL rounds to the nearest)
    local wait = math.ceil(redis.call('PTTL', KEYS[i]) / 1000)
    return {-1, wait, i == 5 and 'user_per_minute' or 'key_per_minute'}
  end
end
local until_ = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], until_, ARGV[1])
redis.call('ZADD', KEYS[3], until_, ARGV[1])
redis.call('ZADD', KEYS[4], until_, ARGV[1])
redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[2])) + 1)
redis.call('EXPIRE', KEYS[4], math.ceil(tonumber(ARGV[2])) + 1)
local room = ROOMY
for i = 3, 4 do
  if tonumber(ARGV[i]) > 0 then room = math.min(room, tonumber(ARGV[i]) - redis.call('ZCARD', KEYS[i])) end
end
for i = 5, 6 do
  if tonumber(ARGV[i]) > 0 then
    local count = redis.call('INCR', KEYS[i])
    if count == 1 then redis.call('EXPIRE', KEYS[i], 60) end
    room = math.min(room, tonumber(ARGV[i]) - count)
  end
end
return {1, room}
"""
)

# The room a caller has when only a weekly token budget (or nothing) limits it.
ROOMY = 1_000_000

ENTER_LIMITED = ENTER_LIMITED.replace("ROOMY", str(ROOMY))

# Hold a request for a model while it loads, within the caller's cap of held requests: KEYS the
# user's held set; ARGV the request's token, the entry's lifetime, the cap. 1 held (or its entry
# refreshed), 0 the caller already holds as many as they may.
HOLD = (
    REDIS_NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""
)


@functools.cache
def script_sha(script: str) -> str:
    """The SHA1 Redis knows a script by (EVALSHA sends it instead of the script's text)."""
    return hashlib.sha1(script.encode()).hexdigest()


# Time to first token, seconds: each request is counted into one of these buckets (/metrics).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def ttft_bucket(seconds: float) -> str:
    for bound in TTFT_BUCKETS:
        if seconds <= bound:
            return str(bound)
    return "+Inf"


class OverLimit(Exception):
    """A caller's limit refuses the request: which one, and in how many seconds it lifts."""

    def __init__(self, limit: str, retry_after: int) -> None:
        super().__init__(limit)
        self.limit = limit
        self.retry_after = retry_after


def week_start(moment: datetime) -> datetime:
    """Monday 00:00 UTC of ``moment``'s week: when weekly token budgets start again."""
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


_week: list[tuple[float, str]] = [(0.0, "")]  # (until when, the week's label)


def week_tokens_key(user_id: int) -> str:
    """``<prefix>:weektokens:<user>-<Monday>``; the week's label is worked out once a minute."""
    return key(RedisKey.WEEK_TOKENS, f"{user_id}-{_week_label()}")


def key_week_tokens_key(key_id: int) -> str:
    """``<prefix>:weektokens:key<key>-<Monday>``: a key's own week (``tell_budgets_used`` reads
    the users' only)."""
    return key(RedisKey.WEEK_TOKENS, f"key{key_id}-{_week_label()}")


def _week_label() -> str:
    until, label = _week[0]
    now = time.time()
    if now >= until:
        label = f"{week_start(datetime.now(UTC)):%Y%m%d}"
        _week[0] = (now + 60 - now % 60, label)
    return label


# A week's token count outlives its week by a day (budgets read only the current week's).
WEEK_TOKENS_KEEP_SECONDS = 8 * 24 * 3600

# Records the request log holds in Redis at most; past it the oldest go (a flush that stopped).
REQUEST_LOG_BACKLOG = 200_000


def cached_key(cache: dict[tuple[str, object], str], kind: str, ident: object) -> str:
    found = cache.get((kind, ident))
    if found is None:
        found = cache[(kind, ident)] = key(kind, ident)
    return found


def leave_arguments(
    cache: dict[tuple[str, object], str],
    status: int | None,
    ttft_seconds: float | None,
    keys: list[str],
    prompt: int,
    completion: int,
    request_id: str = "",
    record: bytes = b"",
    limited: bool = False,
) -> tuple[list[str], list[str | int | bytes]]:
    """LEAVE's keys and arguments for an answer (and the request's ``keys``, if counted in);
    ``cache``: the keys made once (``Counters``)."""
    return (
        [
            cached_key(cache, RedisKey.GATEWAY_STATUS, "all"),
            cached_key(cache, RedisKey.GATEWAY_TTFT, "all"),
            cached_key(cache, RedisKey.REQUEST_LOG, "all"),
            *keys,
        ],
        [
            "1" if keys else "0",
            "" if status is None else str(status),
            "" if ttft_seconds is None else ttft_bucket(ttft_seconds),
            "" if ttft_seconds is None else repr(ttft_seconds),
            prompt,
            completion,
            request_id,
            record,
            REQUEST_LOG_BACKLOG,
            WEEK_TOKENS_KEEP_SECONDS,
            "1" if limited else "0",
        ],
    )


def enter_arguments(
    cache: dict[tuple[str, object], str],
    ttl: str,
    channel_id: int,
    limits: Limits | None,
    user_id: int,
    key_id: int,
    request_id: str,
    ready_at: float = 0.0,
) -> tuple[str, list[str], list[str | int | bytes], tuple[str, ...]]:
    """A count in's script (``ENTER``, or ``ENTER_LIMITED`` with the caller's ``limits``), keys
    and arguments, and the sets it counts the request in; ``ttl``: the entry's lifetime."""
    inflight, gate = (
        cached_key(cache, RedisKey.INFLIGHT, channel_id),
        cached_key(cache, RedisKey.GATE, channel_id),
    )
    if limits is None:
        return ENTER, [inflight, gate], [request_id, ttl, repr(ready_at)], (inflight,)
    flights = (
        cached_key(cache, RedisKey.USER_FLIGHT, user_id),
        cached_key(cache, RedisKey.KEY_FLIGHT, key_id),
    )
    keys = [
        inflight,
        gate,
        *flights,
        cached_key(cache, RedisKey.RATE, f"user-{user_id}"),
        cached_key(cache, RedisKey.RATE, f"key-{key_id}"),
        week_tokens_key(user_id),
        key_week_tokens_key(key_id),
    ]
    args: list[str | int | bytes] = [
        request_id,
        ttl,
        limits.user_concurrent,
        limits.key_concurrent,
        limits.user_per_minute,
        limits.key_per_minute,
        limits.user_weekly_tokens,
        limits.key_weekly_tokens,
        repr(ready_at),
    ]
    return ENTER_LIMITED, keys, args, (inflight, *flights)


def leave_keys(
    cache: dict[tuple[str, object], str],
    channel_id: int,
    user_id: int,
    key_id: int | None,
    reservation_id: int | None,
    *,
    limited: bool,
) -> list[str]:
    """A count out's keys of the request: its channel's in-flight set (with ``limited``, the
    week's tokens and the user's and key's in-flight sets too), then the usage it adds to."""
    keys = [cached_key(cache, RedisKey.INFLIGHT, channel_id)]
    if limited:
        keys += (
            week_tokens_key(user_id),
            cached_key(cache, RedisKey.USER_FLIGHT, user_id),
            cached_key(cache, RedisKey.KEY_FLIGHT, key_id or 0),
            key_week_tokens_key(key_id or 0),
        )
    keys.append(cached_key(cache, RedisKey.USAGE_USER, user_id))
    if key_id is not None:
        keys.append(cached_key(cache, RedisKey.USAGE_KEY, key_id))
    if reservation_id:
        keys.append(cached_key(cache, RedisKey.USAGE_RESERVATION, reservation_id))
    return keys
