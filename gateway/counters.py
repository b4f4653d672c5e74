"""Facts the gateway and the node workers share through Redis, exact at every request.

``<prefix>:inflight:<channel>``  requests admitted and not yet finished: a sorted set of
                                 request ids, each scored with the moment it expires
``<prefix>:gate:<channel>``      set by the node worker when the channel's target changed:
                                 new requests get ``503 model_switching``
``<prefix>:usage:*``             requests and tokens per reservation and per user

Admission reads the gate and adds the request in one atomic script, and the
node worker closes the gate *before* it reads the count: a request is either
counted before the gate closed, or refused, so no request is admitted to a
process being stopped.

The count heals itself. A counter that is incremented and decremented stays
wrong forever once one step is lost (a Redis restart mid-stream, a gateway
killed with requests in flight). Instead each request is one entry that
expires ``INFLIGHT_TTL_SECONDS`` after it was last refreshed; the gateway
refreshes the entries of its live requests every third of that, re-adding any
that Redis lost, and the count is the entries not yet expired (by Redis' own
clock, which every gateway and node worker share).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from redis.exceptions import NoScriptError, RedisError

from gateway.redis_protocol import RespPipe
from gateway.snapshot import Limits
from slotserve_base.inflight import COUNT, REDIS_NOW
from slotserve_base.vocabulary import RedisKey, redis_key

key = redis_key


@functools.cache
def script_sha(script: str) -> str:
    """The SHA1 Redis knows a script by (EVALSHA sends it instead of the script's text)."""
    return hashlib.sha1(script.encode()).hexdigest()


INFLIGHT, GATE = RedisKey.INFLIGHT, RedisKey.GATE
USAGE_RESERVATION, USAGE_USER = RedisKey.USAGE_RESERVATION, RedisKey.USAGE_USER
# Time to first token, seconds: each request is counted into one of these buckets (/metrics).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def ttft_bucket(seconds: float) -> str:
    for bound in TTFT_BUCKETS:
        if seconds <= bound:
            return str(bound)
    return "+Inf"


# An in-flight entry lives this long unless its gateway refreshes it (every third of it).
INFLIGHT_TTL_SECONDS = 15.0

log = logging.getLogger(__name__)


# Count a request in, unless its channel's gate is closed: one round trip, and atomic.
# ARGV: request id, entry lifetime in seconds. (The set's own expiry is left to REFRESH, off
# the hot path; an entry that outlives its gateway is counted out by its score.)
ENTER = (
    REDIS_NOW
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
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
# week and the user's and the key's in-flight sets, then the usage hashes (user, key,
# reservation). ARGV status, TTFT bucket, TTFT seconds, prompt and completion tokens ('' where
# not known), the request id, the request's log record ('' for none), how many records the log
# keeps at most while nobody flushes it, how long a week's token count is kept, and the flag.
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
      redis.call('INCRBY', KEYS[5], tokens)
      redis.call('EXPIRE', KEYS[5], ARGV[10])
    end
    redis.call('ZREM', KEYS[6], ARGV[7])
    redis.call('ZREM', KEYS[7], ARGV[7])
    first = 8
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
# and the key's count this minute, the user's tokens this week; ARGV request id, entry lifetime,
# then the limits (0: none): user concurrent, key concurrent, user per minute, key per minute,
# user weekly tokens. Answers {1, room} admitted (room: how many more requests the caller's
# concurrency and per-minute limits let in now, ROOMY when none of them is set), {0} gate
# closed, {-1, seconds} over a limit (the seconds until it lifts; 0 when unknown), with the
# limit's name.
ENTER_LIMITED = (
    REDIS_NOW
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then return {0} end
local function live(set)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  return redis.call('ZCARD', set)
end
local budget = tonumber(ARGV[7])
if budget > 0 and tonumber(redis.call('GET', KEYS[7]) or '0') >= budget then
  return {-1, 0, 'weekly_tokens'}
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

# What a caller's room, as its last count in found it, is good for: this long, and half of it
# (other gateway processes take from the same room meanwhile).
ROOM_SECONDS = 1.0

# A week's token count outlives its week by a day (budgets read only the current week's).
WEEK_TOKENS_KEEP_SECONDS = 8 * 24 * 3600


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
# A held request's entry lives this long unless its gateway refreshes it (every third of it):
# a gateway that dies frees its callers' places within it.
HELD_TTL_SECONDS = 30.0


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


def _cached(cache: dict[tuple[str, object], str], kind: str, ident: object) -> str:
    found = cache.get((kind, ident))
    if found is None:
        found = cache[(kind, ident)] = key(kind, ident)
    return found


def _chain(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """``source``'s outcome becomes ``target``'s."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())


def week_tokens_key(user_id: int) -> str:
    """``<prefix>:weektokens:<user>-<Monday>``; the week's label is worked out once a minute."""
    until, label = _week[0]
    now = time.time()
    if now >= until:
        label = f"{week_start(datetime.now(UTC)):%Y%m%d}"
        _week[0] = (now + 60 - now % 60, label)
    return key(RedisKey.WEEK_TOKENS, f"{user_id}-{label}")


# A count out may wait this long for the next request's count in, to reach Redis in one write.
LEAVE_DEFER_SECONDS = 0.002

# Records the request log holds in Redis at most; past it the oldest go (a flush that stopped).
REQUEST_LOG_BACKLOG = 200_000


class Counters:
    """The gateway's side: each request runs two scripts, one in (``enter``), one out (``leave``).

    The scripts go through one pipelined connection (``gateway.redis_protocol``): those of every request
    that the same turn of the event loop handles leave together, in one write. Each request
    still waits for its own script's answer, so a count is in Redis before the request goes on.
    """

    def __init__(self, url: str, ttl_seconds: float | None = None) -> None:
        self.pipe = RespPipe(url, timeout=5, connect_timeout=2)
        self.ttl = INFLIGHT_TTL_SECONDS if ttl_seconds is None else ttl_seconds
        self._ttl = repr(self.ttl)
        # This gateway's requests in flight: request id → the sets that count it (the channel's,
        # and the user's and key's where limits apply), refreshed in Redis while live.
        self.live: dict[str, tuple[str, ...]] = {}
        gateway_id = uuid.uuid4().hex[:8]
        self._ids = (f"{gateway_id}-{n}" for n in itertools.count())
        self._marker = key(RedisKey.GATEWAY_MARKER, gateway_id)
        self._refresher: asyncio.Task[None] | None = None
        self._last_enter = 0.0
        self._prefix = ""
        self._key_cache: dict[tuple[str, object], str] = {}
        # (user, key) → (until when, requests that may still go ahead of their count in).
        self.room: dict[tuple[int, int], tuple[float, int]] = {}

    def _keys(self) -> dict[tuple[str, object], str]:
        """Keys made once (the prefix is read once per request): a request names up to ten."""
        prefix = settings.SLOTSERVE_REDIS_PREFIX
        if prefix != self._prefix or len(self._key_cache) > 4096:
            self._prefix, self._key_cache = prefix, {}
        return self._key_cache

    async def _run(
        self, script: str, keys: list[str], args: list[str | int | bytes], defer: float = 0.0
    ) -> Any:
        return await self.pipe.evalsha(script, script_sha(script), keys, args, defer=defer)

    def close(self) -> None:
        self.pipe.close()

    async def enter(
        self, channel_id: int, limits: Limits | None = None, *, user_id: int = 0, key_id: int = 0
    ) -> str | None:
        """Count a request in: its id, or None (not counted) if the channel is switching;
        ``OverLimit`` when the caller's ``limits`` (fair sharing) refuse it.

        The checks and the count are one atomic step in Redis, so a node worker
        that closes the gate and then reads the count sees every request admitted,
        and two requests racing for a user's last slot cannot both get it.
        """
        request_id = next(self._ids)
        script, keys, args, sets = self._entering(channel_id, limits, user_id, key_id, request_id)
        return self._entered(await self._run(script, keys, args), request_id, sets, limits, user_id, key_id)

    def enter_soon(
        self, channel_id: int, limits: Limits | None = None, *, user_id: int = 0, key_id: int = 0
    ) -> asyncio.Future[str | None]:
        """``enter`` as a future, its script queued before the caller goes on: the gateway
        sends the request upstream while Redis counts it in, with no task of its own (with
        ``limits``: only while ``may_go_ahead`` says so). Falls back to ``enter`` (a task) while
        the connection is not open or when Redis no longer knows the script."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        script, keys, args, sets = self._entering(channel_id, limits, user_id, key_id, request_id)
        reply = self.pipe.send_now("EVALSHA", script_sha(script), len(keys), *keys, *args)
        if reply is None:
            return asyncio.ensure_future(self.enter(channel_id, limits, user_id=user_id, key_id=key_id))
        entered: asyncio.Future[str | None] = loop.create_future()

        def settle(reply: asyncio.Future[Any]) -> None:
            if entered.done():
                return
            if reply.cancelled():
                entered.cancel()
                return
            error = reply.exception()
            if isinstance(error, NoScriptError):  # Redis restarted: load the script, count again
                again = asyncio.ensure_future(self.enter(channel_id, limits, user_id=user_id, key_id=key_id))
                again.add_done_callback(functools.partial(_chain, entered))
                return
            if error is not None:
                entered.set_exception(error)
                return
            try:
                entered.set_result(self._entered(reply.result(), request_id, sets, limits, user_id, key_id))
            except OverLimit as over:
                entered.set_exception(over)

        reply.add_done_callback(settle)
        return entered

    def may_go_ahead(self, user_id: int, key_id: int) -> bool:
        """Whether a caller with limits may have its request go upstream while its count in
        runs (``enter_soon``): its last count in, less than ``ROOM_SECONDS`` ago, left room for
        at least twice the requests that went ahead since, and this one. Takes a place if so.
        A request that went ahead and meets a limit after all (other gateway processes took the
        room meanwhile) is refused and its upstream work cancelled."""
        found = self.room.get((user_id, key_id))
        if found is None:
            return False
        until, places = found
        if places < 1 or time.monotonic() >= until:
            return False
        self.room[(user_id, key_id)] = (until, places - 1)
        return True

    def _entering(
        self, channel_id: int, limits: Limits | None, user_id: int, key_id: int, request_id: str
    ) -> tuple[str, list[str], list[str | int | bytes], tuple[str, ...]]:
        """The count in's script, keys and arguments, and the sets it counts the request in."""
        cache = self._keys()
        inflight, gate = _cached(cache, INFLIGHT, channel_id), _cached(cache, GATE, channel_id)
        if limits is None:
            return ENTER, [inflight, gate], [request_id, self._ttl], (inflight,)
        flights = (_cached(cache, RedisKey.USER_FLIGHT, user_id), _cached(cache, RedisKey.KEY_FLIGHT, key_id))
        keys = [
            inflight,
            gate,
            *flights,
            _cached(cache, RedisKey.RATE, f"user-{user_id}"),
            _cached(cache, RedisKey.RATE, f"key-{key_id}"),
            week_tokens_key(user_id),
        ]
        args: list[str | int | bytes] = [
            request_id,
            self._ttl,
            limits.user_concurrent,
            limits.key_concurrent,
            limits.user_per_minute,
            limits.key_per_minute,
            limits.user_weekly_tokens,
        ]
        return ENTER_LIMITED, keys, args, (inflight, *flights)

    def _entered(
        self,
        answer: Any,
        request_id: str,
        sets: tuple[str, ...],
        limits: Limits | None,
        user_id: int,
        key_id: int,
    ) -> str | None:
        """Redis' answer to a count in: the request's id, None at a closed gate, or ``OverLimit``;
        with limits, the caller's room is noted (``may_go_ahead``)."""
        if limits is None:
            if not answer:
                return None
        else:
            if int(answer[0]) <= 0:
                self.room.pop((user_id, key_id), None)
                if int(answer[0]) == 0:
                    return None
                name = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
                raise OverLimit(name, int(answer[1]))
            if len(self.room) > 4096:  # callers seen long ago
                self.room.clear()
            self.room[(user_id, key_id)] = (time.monotonic() + ROOM_SECONDS, int(answer[1]) // 2)
        self._counted(request_id, sets)
        return request_id

    def _counted(self, request_id: str, sets: tuple[str, ...]) -> None:
        self.live[request_id] = sets
        self._last_enter = time.monotonic()
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.ensure_future(self._keep_counted())

    # The refresher outlives a quiet moment, so steady traffic does not start one per request.
    REFRESHER_IDLE_STOP = 60.0

    async def _keep_counted(self) -> None:
        """While this gateway has requests in flight, refresh their entries (and re-add lost ones)."""
        while self.live or time.monotonic() - self._last_enter < self.REFRESHER_IDLE_STOP:
            await asyncio.sleep(self.ttl / 3)
            live = [(request, counted) for request, sets in list(self.live.items()) for counted in sets]
            if not live:
                continue
            try:
                keys = [self._marker, *(counted for _, counted in live)]
                lost = await self._run(REFRESH, keys, [repr(self.ttl), *(request for request, _ in live)])
                if lost:
                    log.info("counted %d in-flight requests in Redis again", len(live))
            except (RedisError, OSError):  # Redis is away: the next round re-adds them
                log.warning("could not refresh %d in-flight requests in Redis", len(live), exc_info=True)

    async def leave(self, channel_id: int, request_id: str, **counted: Any) -> None:
        """Count the request out, with its usage, its log record and (for /metrics) its answer,
        in one round trip (``counted``: as ``_leaving`` takes it)."""
        keys, args = self._leaving(channel_id, request_id, **counted)
        await self._run(LEAVE, keys, args, defer=LEAVE_DEFER_SECONDS)

    def leave_soon(self, channel_id: int, request_id: str, **counted: Any) -> None:
        """``leave`` with nobody waiting for it: queued now (a failure is logged; the request's
        in-flight entry then expires by itself)."""
        keys, args = self._leaving(channel_id, request_id, **counted)
        reply = self.pipe.send_now(
            "EVALSHA", script_sha(LEAVE), len(keys), *keys, *args, defer=LEAVE_DEFER_SECONDS
        )
        if reply is None:  # no connection open: a task opens one
            reply = asyncio.ensure_future(self._run(LEAVE, keys, args))
        reply.add_done_callback(functools.partial(self._left, request_id, channel_id, keys, args))

    def _left(
        self,
        request_id: str,
        channel_id: int,
        keys: list[str],
        args: list[str | int | bytes],
        reply: asyncio.Future[Any],
    ) -> None:
        """Redis' answer to a count out nobody waits for: a failure is logged; Redis that has
        forgotten the script (a restart) loads it and counts again."""
        error = None if reply.cancelled() else reply.exception()
        if isinstance(error, NoScriptError):
            again = asyncio.ensure_future(self._run(LEAVE, keys, args))
            again.add_done_callback(functools.partial(self._left, request_id, channel_id, keys, args))
        elif error is not None:
            # The answer went out; the request's in-flight entry expires by itself.
            log.warning(
                "gateway: could not count request %s out of channel %s: %r", request_id, channel_id, error
            )

    def _leaving(
        self,
        channel_id: int,
        request_id: str,
        *,
        user_id: int,
        reservation_id: int | None,
        prompt: int,
        completion: int,
        status: int | None = None,
        ttft_seconds: float | None = None,
        key_id: int | None = None,
        record: bytes = b"",
    ) -> tuple[list[str], list[str | int | bytes]]:
        """The count out's keys and arguments."""
        limited = len(self.live.pop(request_id, ())) > 1  # counted in the user's and key's sets too
        cache = self._keys()
        names = [_cached(cache, USAGE_USER, user_id)]
        if key_id is not None:
            names.append(_cached(cache, RedisKey.USAGE_KEY, key_id))
        if reservation_id:
            names.append(_cached(cache, USAGE_RESERVATION, reservation_id))
        keys = [_cached(cache, INFLIGHT, channel_id)]
        if limited:
            keys += (
                week_tokens_key(user_id),
                _cached(cache, RedisKey.USER_FLIGHT, user_id),
                _cached(cache, RedisKey.KEY_FLIGHT, key_id or 0),
            )
        keys += names
        return self._counting(
            status, ttft_seconds, keys, prompt, completion, request_id, record, limited, cache
        )

    async def answered(self, status: int, ttft_seconds: float | None = None, record: bytes = b"") -> None:
        """Count an answer that reached no channel by status code (for /metrics), and log it."""
        keys, args = self._counting(status, ttft_seconds, [], 0, 0, record=record)
        await self._run(LEAVE, keys, args, defer=LEAVE_DEFER_SECONDS)

    def _counting(
        self,
        status: int | None,
        ttft_seconds: float | None,
        keys: list[str],
        prompt: int,
        completion: int,
        request_id: str = "",
        record: bytes = b"",
        limited: bool = False,
        cache: dict[tuple[str, object], str] | None = None,
    ) -> tuple[list[str], list[str | int | bytes]]:
        """LEAVE's keys and arguments for an answer (and the request's ``keys``, if counted in)."""
        cache = self._keys() if cache is None else cache
        return (
            [
                _cached(cache, RedisKey.GATEWAY_STATUS, "all"),
                _cached(cache, RedisKey.GATEWAY_TTFT, "all"),
                _cached(cache, RedisKey.REQUEST_LOG, "all"),
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

    async def in_flight(self, channel_ids: Iterable[int]) -> dict[int, int]:
        ids = list(channel_ids)
        if not ids:
            return {}
        counts = await self._run(COUNT, [key(INFLIGHT, i) for i in ids], [])
        return {i: int(c) for i, c in zip(ids, counts, strict=True)}

    async def hold(self, user_id: int, token: str, cap: int) -> bool:
        """Count ``token`` (a held request of ``user_id``) among the user's held requests, or
        refresh it; False when the user already holds ``cap`` (all gateway processes together)."""
        held = key(RedisKey.HELD, user_id)
        answer = await self._run(HOLD, [held], [token, repr(HELD_TTL_SECONDS), cap])
        return bool(int(answer))

    async def unhold(self, user_id: int, token: str) -> None:
        await self.pipe.call("ZREM", key(RedisKey.HELD, user_id), token)

    async def switching(self, channel_ids: Iterable[int]) -> set[int]:
        ids = list(channel_ids)
        if not ids:
            return set()
        values = await self.pipe.call("MGET", *(key(GATE, i) for i in ids))
        return {i for i, v in zip(ids, values, strict=True) if v}
