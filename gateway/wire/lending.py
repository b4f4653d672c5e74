"""Lending in Redis (docs/gateway.md, "Lending"): which borrowed requests are in flight on a
channel, and which of them its booker's requests ended.

A borrowed request is kept in the channel's ``lent`` set (scored by when it started) while it is
in flight. A booker's request, once counted in, counts the channel's requests in flight against
its places; when borrowed requests hold the places it needs, the most recently started are taken
out of the set, marked ``preempted`` and named on the installation's ``preemptions`` Redis
channel, in the same script. Each gateway process with borrowed requests in flight listens there
(one connection, ``Lending._listen``) and ends those of its own that are named: its process's
work is cancelled, its caller told ``preempted_by_booker``. A message missed while a gateway's
listening connection was down is made good by the marks: the gateway looks for its requests'
marks every ``BACKSTOP_SECONDS`` while it listens, every ``LOOK_SECONDS`` while it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio
from redis.exceptions import RedisError

from gateway.wire.counter_scripts import cached_key, script_sha
from gateway.wire.counters import Counters
from slotserve_base.inflight import REDIS_NOW
from slotserve_base.vocabulary import RedisKey

log = logging.getLogger(__name__)

# While a gateway cannot listen for preemptions, it looks for its borrowed requests' marks this
# often: the booker waits this long at most, plus the time its process takes to free the place.
LOOK_SECONDS = 0.02
# While it listens, it looks anyway this often (a message lost in a reconnect).
BACKSTOP_SECONDS = 1.0
# A mark outlives any look for it.
MARK_SECONDS = 60
# A gateway listens on this long after its last borrowed request has ended: a lent slot's next
# borrowed request finds it listening.
LINGER_SECONDS = 30.0
# A listening connection that failed is opened again after this long.
RELISTEN_SECONDS = 1.0

# KEYS: inflight, lent. ARGV: places, the mark's key prefix, the mark's life (s), the channel
# preemptions are published on. Returns the ids of the borrowed requests that must end, most
# recently started first.
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
if #ended > 0 then redis.call('PUBLISH', ARGV[4], table.concat(ended, ' ')) end
return ended
"""
)


@dataclass(frozen=True)
class Borrowed:
    """A borrowed request in flight in this gateway process."""

    channel_id: int
    started: float  # time.time(): its score in the channel's lent set
    end: Callable[[], None]  # ends it, when the booker's requests need its place


class Lending:
    """The gateway's side of lending (one per gateway process)."""

    def __init__(self, counters: Counters, url: str) -> None:
        self.counters = counters
        self.url = url
        # This process's borrowed requests in flight, by request id.
        self.watched: dict[str, Borrowed] = {}
        self.listening = False  # subscribed: messages reach ``watched``
        self._listener: asyncio.Task[None] | None = None

    def _key(self, kind: str, ident: object) -> str:
        return cached_key(self.counters._keys(), kind, ident)

    async def lent(self, channel_id: int, request_id: str, end: Callable[[], None]) -> None:
        """A borrowed request is in flight on the channel: ``end`` is called if the booker's
        requests end it, until it is ``returned``. Kept in Redis again whenever this process
        listens anew (Redis restarted: the lent set was lost with it)."""
        borrowed = self.watched[request_id] = Borrowed(channel_id, time.time(), end)
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())
        with contextlib.suppress(RedisError):
            await self._keep(request_id, borrowed)

    async def _keep(self, request_id: str, borrowed: Borrowed) -> None:
        key = self._key(RedisKey.LENT, borrowed.channel_id)
        await self.counters.pipe.call("ZADD", key, repr(borrowed.started), request_id)

    async def returned(self, channel_id: int, request_id: str, *, marked: bool) -> None:
        """A borrowed request has ended; its mark goes with it when it was ``marked``."""
        self.watched.pop(request_id, None)
        done = [self.counters.pipe.call("ZREM", self._key(RedisKey.LENT, channel_id), request_id)]
        if marked:
            done.append(self.counters.pipe.call("DEL", self._key(RedisKey.PREEMPTED, request_id)))
        await asyncio.gather(*done)  # in one write

    async def make_room(self, channel_id: int, places: int) -> list[str]:
        """The booker's request is counted in: end the borrowed requests that hold the places
        it needs, the most recently started first. Returns their ids."""
        keys = [self._key(RedisKey.INFLIGHT, channel_id), self._key(RedisKey.LENT, channel_id)]
        mark = self._key(RedisKey.PREEMPTED, "")
        ended = await self.counters.pipe.evalsha(
            PREEMPT, script_sha(PREEMPT), keys, [places, mark, MARK_SECONDS, self._published()]
        )
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ended or []]

    async def preempted(self, request_id: str) -> bool:
        """Whether the booker's requests ended this borrowed request."""
        return bool(await self.counters.pipe.call("EXISTS", self._key(RedisKey.PREEMPTED, request_id)))

    def _published(self) -> str:
        return self._key(RedisKey.PREEMPTIONS, "ended")

    def _end(self, request_id: str) -> None:
        borrowed = self.watched.pop(request_id, None)
        if borrowed is not None:
            borrowed.end()

    async def _look(self) -> None:
        """End the watched requests whose marks are set (the commands leave together)."""
        ids = list(self.watched)
        with contextlib.suppress(RedisError):
            marked = await asyncio.gather(*(self.preempted(i) for i in ids))
            for request_id, ended in zip(ids, marked, strict=True):
                if ended:
                    self._end(request_id)

    async def _listen(self) -> None:
        """While this process has borrowed requests in flight (and ``LINGER_SECONDS`` after):
        hear the preemptions every gateway publishes and end those of its own that are named, and
        look for their marks now and then (``BACKSTOP_SECONDS``); while it cannot listen, look
        every ``LOOK_SECONDS``."""
        loop = asyncio.get_running_loop()
        while self.watched:
            client = redis.asyncio.Redis.from_url(self.url, client_name=self._published())
            try:
                async with client.pubsub() as channel:
                    await channel.subscribe(self._published())
                    self.listening = True
                    with contextlib.suppress(RedisError):  # a Redis restarted lost them
                        await asyncio.gather(*(self._keep(i, b) for i, b in list(self.watched.items())))
                    look_at = loop.time()  # marks set before it listened, first
                    busy_until = loop.time() + LINGER_SECONDS
                    while self.watched or loop.time() < busy_until:
                        if self.watched:
                            busy_until = loop.time() + LINGER_SECONDS
                        if loop.time() >= look_at:
                            await self._look()
                            look_at = loop.time() + BACKSTOP_SECONDS
                        message = await channel.get_message(
                            ignore_subscribe_messages=True, timeout=max(look_at - loop.time(), 0.001)
                        )
                        if message is not None and message["type"] == "message":
                            for request_id in message["data"].decode().split():
                                self._end(request_id)
            except Exception as problem:  # noqa: BLE001 — a listener gone would leave its requests unwatched
                self.listening = False
                log.warning("gateway: not listening for preemptions (%s): looking for marks", problem)
                until = loop.time() + RELISTEN_SECONDS
                while self.watched and loop.time() < until:
                    await self._look()
                    await asyncio.sleep(LOOK_SECONDS)
            finally:
                self.listening = False
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
