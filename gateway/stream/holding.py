"""A request the application holds before it goes upstream: while its model loads (it asked to
wait, ``X-SlotServe-Wait``) or while it waits its turn for a place on a busy channel
(``gateway.admit.places``). Its client's leaving is watched, so that nothing goes upstream for a
client that is gone; a stream gets an SSE comment every ``COMMENT_SECONDS``, so that nothing
between the client and the gateway closes a quiet connection (its answer has begun then)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from django.utils import timezone
from redis.exceptions import RedisError

from gateway.admit.places import POLL_SECONDS, Places
from gateway.admit.refusals import queue_full, switching_refusal
from gateway.admit.request import Asked
from gateway.admit.step import Go
from gateway.rules.access import Refusal, borrowed
from gateway.rules.callers import Caller
from gateway.rules.fair_queue import cost_of
from gateway.stream.answer import Answer
from gateway.stream.lent import BORROWED_HEADER
from gateway.stream.relay import until_disconnect
from gateway.types import Receive, Send

COMMENT_SECONDS = 5.0

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Holding:
    def __init__(self, receive: Receive, send: Send, *, stream: bool) -> None:
        self.receive, self.send, self.stream = receive, send, stream
        self.begun = False  # the held stream's answer has begun (200, SSE comments)
        self.headers = SSE_HEADERS  # its answer's head, when it begins while held
        self.left: asyncio.Future[None] | None = None  # the client hanging up
        self.comment_at = asyncio.get_running_loop().time() + COMMENT_SECONDS

    async def comment(self, note: str) -> None:
        """Tell a held stream why it waits, when a comment is due."""
        loop = asyncio.get_running_loop()
        if not self.stream or loop.time() < self.comment_at:
            return
        if not self.begun:
            await self.send({"type": "http.response.start", "status": 200, "headers": self.headers})
            self.begun = True
        body = f": {note}\n\n".encode(errors="replace")
        await self.send({"type": "http.response.body", "body": body, "more_body": True})
        self.comment_at = loop.time() + COMMENT_SECONDS

    async def pause(self, seconds: float, wake: Awaitable[None] | None = None) -> bool:
        """Wait ``seconds`` (less if ``wake`` is done first); True when the client left meanwhile."""
        if self.left is None:
            self.left = asyncio.ensure_future(until_disconnect(self.receive))
        waits: set[asyncio.Future[None]] = {self.left}
        woken = None if wake is None else asyncio.ensure_future(wake)
        if woken is not None:
            waits.add(woken)
        try:
            await asyncio.wait(waits, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if woken is not None:
                woken.cancel()
        return self.left.done()

    def close(self) -> bool:
        """Stop watching; whether the client left (it may have, outside ``pause``)."""
        gone = self.left is not None and self.left.done() and not self.left.cancelled()
        if self.left is not None:
            self.left.cancel()
        return gone


async def wait_turn(
    places: Places, go: Go, caller: Caller, request: Asked, holding: Holding, answer: Answer
) -> tuple[str | None, Refusal | None]:
    """A place on the channel, waiting for it in the channel's fair queue (``gateway.admit.places``)
    and telling a held stream how many are before it: the id the request took it with; or why it
    may not wait (the queue is full, the channel switches); or neither when the client left (it
    is no longer held)."""
    channel = go.channel
    assert channel.places is not None
    if borrowed(caller.user_id, channel):
        # Someone else's lent slot: the head of a borrowed answer says so, sent while it waits too.
        holding.headers = [*SSE_HEADERS, BORROWED_HEADER]
    request_id = places.counters.new_id()
    cost = cost_of(request.body) / max(caller.weight, 1)
    loop = asyncio.get_running_loop()
    started, waited = loop.time(), False
    try:
        while True:
            turn = await places.turn(
                channel.id, channel.places, request_id, caller.user_id, cost, channel.ready_at
            )
            if turn.taken:
                if waited:  # the log keeps the time it waited its turn
                    answer.queued_seconds = loop.time() - started
                return request_id, None
            if turn.switching:
                return None, switching_refusal(channel, caller, timezone.now())
            if turn.full:
                return None, queue_full(turn.full, turn.retry_after, channel)
            waited = True
            await holding.comment(
                f"waiting for a place on {channel.name}: {turn.ahead} requests before this one"
            )
            if await holding.pause(POLL_SECONDS, places.until_freed(channel.id, POLL_SECONDS)):
                await places.leave(channel.id, request_id, caller.user_id)
                return None, None
    except BaseException:
        with contextlib.suppress(RedisError):  # its turn expires by itself anyway
            await asyncio.shield(places.leave(channel.id, request_id, caller.user_id))
        raise
