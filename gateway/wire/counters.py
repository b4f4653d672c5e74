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
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from redis.exceptions import NoScriptError, RedisError

from gateway.rules.callers import Limits
from gateway.wire.counter_scripts import (
    HELD_TTL_SECONDS,
    HOLD,
    LEAVE,
    REFRESH,
    OverLimit,
    enter_arguments,
    leave_arguments,
    leave_keys,
    script_sha,
)
from gateway.wire.owed import UNREACHABLE, Owed
from gateway.wire.redis_protocol import RespPipe, chain
from slotserve_base.inflight import COUNT
from slotserve_base.vocabulary import RedisKey, redis_key

key = redis_key


INFLIGHT, GATE = RedisKey.INFLIGHT, RedisKey.GATE
USAGE_RESERVATION, USAGE_USER = RedisKey.USAGE_RESERVATION, RedisKey.USAGE_USER


# An in-flight entry lives this long unless its gateway refreshes it (every third of it).
INFLIGHT_TTL_SECONDS = 15.0

log = logging.getLogger(__name__)


# What a caller's room, as its last count in found it, is good for: this long, and half of it
# (other gateway processes take from the same room meanwhile).
ROOM_SECONDS = 1.0


# A count out may wait this long for the next request's count in, to reach Redis in one write.
LEAVE_DEFER_SECONDS = 0.002


class Counters:
    """The gateway's side: each request runs two scripts, one in (``enter``), one out (``leave``).

    The scripts go through one pipelined connection (``gateway.wire.redis_protocol``): those of every request
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
        # Told of each request counted out, by channel (``gateway.admit.places``: a place freed).
        self.on_leave: Callable[[int], None] | None = None
        # Count outs that could not reach Redis, sent again once it answers.
        self.owed = Owed(lambda keys, args: self._run(LEAVE, keys, args), self._counted_out)

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

    def new_id(self) -> str:
        """A request id no other request of any gateway process has."""
        return next(self._ids)

    async def enter(
        self,
        channel_id: int,
        limits: Limits | None = None,
        *,
        user_id: int = 0,
        key_id: int = 0,
        request_id: str | None = None,
        ready_at: float = 0.0,
    ) -> str | None:
        """Count a request in: its id, or None (not counted) if the channel is switching;
        ``OverLimit`` when the caller's ``limits`` (fair sharing) refuse it.

        The checks and the count are one atomic step in Redis, so a node worker
        that closes the gate and then reads the count sees every request admitted,
        and two requests racing for a user's last slot cannot both get it. A request that took a
        place on the channel (``gateway.admit.places``) is counted in under the id it took it with.
        """
        request_id = request_id or next(self._ids)
        script, keys, args, sets = enter_arguments(
            self._keys(), self._ttl, channel_id, limits, user_id, key_id, request_id, ready_at
        )
        return self._entered(await self._run(script, keys, args), request_id, sets, limits, user_id, key_id)

    def enter_soon(
        self,
        channel_id: int,
        limits: Limits | None = None,
        *,
        user_id: int = 0,
        key_id: int = 0,
        ready_at: float = 0.0,
    ) -> asyncio.Future[str | None]:
        """``enter`` as a future, its script queued before the caller goes on: the gateway
        sends the request upstream while Redis counts it in, with no task of its own (with
        ``limits``: only while ``may_go_ahead`` says so). Falls back to ``enter`` (a task) while
        the connection is not open or when Redis no longer knows the script."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        script, keys, args, sets = enter_arguments(
            self._keys(), self._ttl, channel_id, limits, user_id, key_id, request_id, ready_at
        )
        reply = self.pipe.send_now("EVALSHA", script_sha(script), len(keys), *keys, *args)
        if reply is None:
            return asyncio.ensure_future(
                self.enter(channel_id, limits, user_id=user_id, key_id=key_id, ready_at=ready_at)
            )
        entered: asyncio.Future[str | None] = loop.create_future()

        def settle(reply: asyncio.Future[Any]) -> None:
            if entered.done():
                return
            if reply.cancelled():
                entered.cancel()
                return
            error = reply.exception()
            if isinstance(error, NoScriptError):  # Redis restarted: load the script, count again
                retried = asyncio.ensure_future(
                    self.enter(channel_id, limits, user_id=user_id, key_id=key_id, ready_at=ready_at)
                )
                retried.add_done_callback(functools.partial(chain, entered))
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
        await self._leave(channel_id, *self._leaving(channel_id, request_id, **counted))

    async def _leave(self, channel_id: int | None, keys: list[str], args: list[str | int | bytes]) -> None:
        try:
            await self._run(LEAVE, keys, args, defer=LEAVE_DEFER_SECONDS)
        except UNREACHABLE as exc:  # Redis is away: sent again once it answers
            self.owed.add(channel_id, keys, args, exc)
        else:
            self._counted_out(channel_id)

    def leave_soon(self, channel_id: int, request_id: str, **counted: Any) -> None:
        """``leave`` with nobody waiting for it: queued now (Redis away: it waits in ``owed``)."""
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
        """Redis' answer to a count out nobody waits for: Redis that has forgotten the script (a
        restart) loads it and counts again; Redis away: the count out waits (``gateway.wire.owed``)."""
        error = None if reply.cancelled() else reply.exception()
        if error is None:
            self._counted_out(channel_id)
        if isinstance(error, NoScriptError):
            again = asyncio.ensure_future(self._run(LEAVE, keys, args))
            again.add_done_callback(functools.partial(self._left, request_id, channel_id, keys, args))
        elif isinstance(error, UNREACHABLE):
            self.owed.add(channel_id, keys, args, error)
        elif error is not None:
            # Redis refused the script itself: the answer went out; the request's in-flight
            # entry expires by itself.
            log.warning(
                "gateway: could not count request %s out of channel %s: %r", request_id, channel_id, error
            )

    def _counted_out(self, channel_id: int | None) -> None:
        if channel_id is not None and self.on_leave is not None:
            self.on_leave(channel_id)

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
        keys = leave_keys(cache, channel_id, user_id, key_id, reservation_id, limited=limited)
        return leave_arguments(
            cache, status, ttft_seconds, keys, prompt, completion, request_id, record, limited
        )

    async def answered(self, status: int, ttft_seconds: float | None = None, record: bytes = b"") -> None:
        """Count an answer that reached no channel by status code (for /metrics), and log it."""
        await self._leave(None, *leave_arguments(self._keys(), status, ttft_seconds, [], 0, 0, record=record))

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

    def note_on_demand_use(self, channel_id: int) -> None:
        """Note that a request went to the channel's model loaded on demand, now (its idle
        time starts again: docs/scheduling.md); sent without waiting, as a best effort."""
        note = self.pipe.call(
            "SET", key(RedisKey.ON_DEMAND_USED, channel_id), repr(time.time()), "EX", "86400"
        )
        task = asyncio.ensure_future(note)
        _NOTES.add(task)  # kept until done: the loop holds only a weak reference
        task.add_done_callback(_ignore_failure)

    async def unhold(self, user_id: int, token: str) -> None:
        await self.pipe.call("ZREM", key(RedisKey.HELD, user_id), token)

    async def switching(self, channel_ids: Iterable[int]) -> set[int]:
        ids = list(channel_ids)
        if not ids:
            return set()
        values = await self.pipe.call("MGET", *(key(GATE, i) for i in ids))
        return {i for i, v in zip(ids, values, strict=True) if v}


_NOTES: set[asyncio.Future[Any]] = set()


def _ignore_failure(task: asyncio.Future[Any]) -> None:
    _NOTES.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: Redis away loses one note, the load stays a little longer
