"""Count outs that could not reach Redis: kept in the gateway process and sent again once Redis
answers, so that an answer that ended while Redis was down still reaches the request log and
the usage (docs/faults.md, promise 3).

At most ``OWED_KEPT`` wait (past it the oldest go), tried again every ``OWED_RETRY_SECONDS``.
One sent again whose first reply was lost may have run already and pushes its record twice;
the record's request id makes it one row (``gateway.usage.request_log``)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

OWED_KEPT = 10_000
OWED_RETRY_SECONDS = 0.5

# What says Redis could not be reached (a script that Redis refused is not sent again).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)

Arguments = list[str | int | bytes]


class Owed:
    """The waiting count outs, oldest first: (channel or None, the script's keys, its arguments).
    ``send`` runs one; ``counted_out`` is told of each channel's one that went."""

    def __init__(
        self,
        send: Callable[[list[str], Arguments], Awaitable[Any]],
        counted_out: Callable[[int | None], None],
    ) -> None:
        self.waiting: collections.deque[tuple[int | None, list[str], Arguments]] = collections.deque(
            maxlen=OWED_KEPT
        )
        self._send, self._counted_out = send, counted_out
        self._sender: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, channel_id: int | None, keys: list[str], args: Arguments, error: Exception) -> None:
        """Keep a count out that could not reach Redis (``error`` says why)."""
        if not self.waiting:
            log.warning("gateway: Redis is unreachable (%r): count outs wait until it answers", error)
        elif len(self.waiting) == OWED_KEPT:
            log.warning("gateway: %d count outs wait for Redis: the oldest is dropped", OWED_KEPT)
        self.waiting.append((channel_id, keys, args))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_all())

    async def _send_all(self) -> None:
        """Send the waiting count outs, oldest first, until none waits (one Redis refuses is
        dropped, with a warning)."""
        sent = 0
        while self.waiting:
            await asyncio.sleep(OWED_RETRY_SECONDS)
            while self.waiting:
                channel_id, keys, args = self.waiting[0]
                try:
                    await self._send(keys, args)
                except UNREACHABLE:
                    break
                except RedisError as exc:
                    log.warning("gateway: Redis refused a count out sent again: %r", exc)
                else:
                    sent += 1
                    self._counted_out(channel_id)
                if self.waiting and self.waiting[0][1] is keys:
                    self.waiting.popleft()
        if sent:
            log.warning("gateway: Redis answers again: %d count outs that waited were sent", sent)
