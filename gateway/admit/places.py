"""May it go now, when the channel is busy: a channel's places and its fair queue (docs/gateway.md,
"Fair sharing under contention").

A channel whose process's places are known (``ChannelView.places``) takes at most that many
requests at once, counted by every gateway process together in Redis (``gateway.wire.queue_scripts``).
A request past them waits its turn in the channel's fair queue (``gateway.rules.fair_queue``): each
place that frees goes to the held request with the smallest finish tag. The waiting request
looks again when a request of this gateway leaves the channel, and every ``POLL_SECONDS``
(a place freed by another gateway process); the waiting itself, which holds the client, is
``gateway.stream.holding.wait_turn``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from django.conf import settings

from gateway.wire.counter_scripts import cached_key, script_sha
from gateway.wire.counters import INFLIGHT_TTL_SECONDS, Counters
from gateway.wire.lending import Lending
from gateway.wire.queue_scripts import LEAVE_QUEUE, STATE_SECONDS, TURN
from slotserve_base.vocabulary import RedisKey

# A waiting request looks again this often at the latest.
POLL_SECONDS = 0.1
# A held request's entry lives this long unless its gateway looks again (every POLL_SECONDS).
HELD_SECONDS = 10.0
# What the last place taken told of the channel is good for this long: while it left free
# places and nobody waiting, half of them go to new requests at once, with no turn asked.
ROOM_SECONDS = 1.0


# llama-server answers these at once, outside its slots: they never wait for a place.
SLOTLESS_PATHS = frozenset({"/tokenize", "/detokenize", "/apply-template"})


def takes_place(method: str, path: str) -> bool:
    """Whether a request takes one of its channel's places: a ``POST`` that makes the process
    work (a completion, an embedding …); not a look at its state (``GET /props``, ``/health``)."""
    return method == "POST" and path not in SLOTLESS_PATHS


@dataclass(frozen=True)
class Turn:
    """Redis' answer to a request that asks for a place."""

    taken: bool  # the place is the request's: counted in flight under its id
    ahead: int = 0  # while it waits: the requests before it
    held: int = 0  # requests waiting on the channel
    switching: bool = False  # the gate closed: the channel switches
    full: str = ""  # "user" or "channel": the queue may take no more
    retry_after: int = 0  # with ``full``: when a try may succeed, from the queue's drain rate


class Places:
    """The gateway's side of every channel's places and queue (one per gateway process)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        # A lent slot's borrowed requests (docs/gateway.md).
        self.lending = Lending(counters, settings.REDIS_URL)
        # channel → the futures of this gateway's requests waiting for a place there.
        self.waiting: dict[int, set[asyncio.Future[None]]] = {}
        # channel → (until when, requests that may still take a place without asking).
        self.room: dict[int, tuple[float, int]] = {}
        counters.on_leave = self.freed

    def _keys(self, channel_id: int) -> list[str]:
        cache = self.counters._keys()
        return [
            cached_key(cache, RedisKey.INFLIGHT, channel_id),
            cached_key(cache, RedisKey.GATE, channel_id),
            cached_key(cache, RedisKey.QUEUE, channel_id),
            cached_key(cache, RedisKey.QUEUE_ALIVE, channel_id),
            cached_key(cache, RedisKey.QUEUE_STATE, channel_id),
            cached_key(cache, RedisKey.QUEUE_SERVED, channel_id),
        ]

    async def turn(
        self, channel_id: int, places: int, request_id: str, user_id: int, cost: float, ready_at: float = 0.0
    ) -> Turn:
        """Take a place on the channel for ``request_id``, or wait in its queue (the first
        call holds the request; each later one looks again and keeps it held)."""
        args: list[str | int | bytes] = [
            request_id,
            user_id,
            repr(float(cost)),
            places,
            repr(INFLIGHT_TTL_SECONDS),
            repr(HELD_SECONDS),
            settings.SLOTSERVE_QUEUE_PER_USER,
            settings.SLOTSERVE_QUEUE_PER_CHANNEL,
            STATE_SECONDS,
            repr(ready_at),
        ]
        answer = await self.counters.pipe.evalsha(TURN, script_sha(TURN), self._keys(channel_id), args)
        code = int(answer[0])
        if code == 1:
            left, held = int(answer[1]), int(answer[2])
            if held == 0 and left >= 2:
                self.room[channel_id] = (time.monotonic() + ROOM_SECONDS, left // 2)
            else:
                self.room.pop(channel_id, None)
            return Turn(taken=True, held=held)
        self.room.pop(channel_id, None)
        if code == 2:
            return Turn(taken=False, ahead=int(answer[1]), held=int(answer[2]))
        if code == 0:
            return Turn(taken=False, switching=True)
        return Turn(taken=False, full="user" if code == -1 else "channel", retry_after=int(answer[1]))

    async def leave(self, channel_id: int, request_id: str, user_id: int) -> None:
        """The request leaves the queue, or gives back the place it took and did not use."""
        keys = self._keys(channel_id)
        await self.counters.pipe.evalsha(
            LEAVE_QUEUE, script_sha(LEAVE_QUEUE), [keys[0], *keys[2:5]], [request_id, user_id]
        )
        self.freed(channel_id)

    def may_take(self, channel_id: int) -> bool:
        """Whether a new request may take a place at once, counted in as it goes upstream: the
        last place taken here, less than ``ROOM_SECONDS`` ago, left free places for at least
        twice the requests that took one since, and nobody waiting. A few too many may reach the
        process meanwhile (other gateway processes take places too); its own queue holds them."""
        found = self.room.get(channel_id)
        if found is None:
            return False
        until, count = found
        if count < 1 or time.monotonic() >= until:
            return False
        self.room[channel_id] = (until, count - 1)
        return True

    def freed(self, channel_id: int) -> None:
        """A request of this gateway left the channel: its waiting requests look again."""
        for waiter in self.waiting.get(channel_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def until_freed(self, channel_id: int, timeout: float) -> None:
        """Wait until a request of this gateway leaves the channel, ``timeout`` at most."""
        waiter = asyncio.get_running_loop().create_future()
        waiters = self.waiting.setdefault(channel_id, set())
        waiters.add(waiter)
        try:
            await asyncio.wait([waiter], timeout=timeout)
        finally:
            waiters.discard(waiter)
            if not waiters:
                self.waiting.pop(channel_id, None)
