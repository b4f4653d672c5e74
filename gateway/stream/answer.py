"""Counting what was answered: what goes to the client, when its first bytes left, and the
request's log record."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

from gateway.rules.access import ChannelView, Refusal, borrowed
from gateway.rules.body import dumps
from gateway.rules.callers import Caller
from gateway.stream.events import Usage
from gateway.types import Message, Send

# Set by ``gateway.stream.traces.turn_on`` when traces are on (docs/metrics.md, "Traces"): told
# each request as its record is made. None: nothing more is done.
TRACE: Callable[[Answer, Usage | None, str], None] | None = None


class Answer:
    """Watches what is sent to the client: the status, and when the first body bytes went out."""

    def __init__(self, send: Send | None = None) -> None:
        self._send = send  # None: the gateway's server is written to directly (``gateway.serve.fast_lane``)
        self.started = self.decided = time.perf_counter()
        self.arrived = time.time()
        self.status: int | None = None
        self.first_byte: float | None = None
        self.counted = False
        # For the request log: who asked, for what, and where it went.
        self.caller: Caller | None = None
        self.method = ""
        self.path = ""
        self.model = ""  # as the client named it
        self.served = ""  # the model that served it: the channel's
        self.channel_id: int | None = None
        self.reservation_id: int | None = None
        self.queued_seconds: float | None = None  # how long it waited its turn (gateway.admit.places)
        self.connected: float | None = None  # when the request went to the process (for traces)
        self.code = self.reason = ""  # a refusal's, as the caller got them
        self.borrowed = False

    def refused(self, refusal: Refusal, channel_id: int | None = None) -> None:
        """The gateway refuses the request: its log record keeps the code, the reason and the
        channel it was for (when one was), as the caller got them."""
        self.code, self.reason = refusal.code, refusal.message[:300]
        self.channel_id = self.channel_id or refusal.channel_id or channel_id

    def goes_to(self, channel: ChannelView) -> None:
        """The request goes to ``channel``: its log record names the channel, the model that
        serves it and the booking it is served in."""
        self.channel_id, self.served = channel.id, channel.model or ""
        # A borrowed request: someone else's slot, lent (docs/gateway.md).
        self.borrowed = self.caller is not None and borrowed(self.caller.user_id, channel)
        self.connected = time.perf_counter()  # the fast lane says when its connection is in hand
        self.reservation_id = channel.booking.reservation_id if channel.booking else None

    def decide(self) -> datetime:
        """The moment the gateway decides where the request goes and whether it may (after a
        wait for its snapshot, for a loading model or for its turn): the log keeps it."""
        self.decided = time.perf_counter()
        return timezone.now()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif self.first_byte is None and message.get("body"):
            self.first_byte = time.perf_counter()
        assert self._send is not None
        await self._send(message)

    @property
    def used_booking(self) -> int | None:
        """The reservation whose use the request is counted as: none for a borrowed one (its
        booker did not use it; docs/gateway.md, "Lending")."""
        return None if self.borrowed else self.reservation_id

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.started

    def record(self, request_id: str, usage: Usage | None = None) -> bytes:
        """The request's log record (``gateway.usage.request_log``), or b"" for a caller without
        a key; ``request_id`` (unique among every gateway process's) makes it one row however
        often it reaches Redis."""
        if TRACE is not None and self.status is not None:
            TRACE(self, usage, request_id)
        if self.caller is None or self.status is None:
            return b""
        ttft = None if self.code else self.ttft_seconds  # a refusal's body is no first token
        return dumps(
            [
                round(self.arrived, 6),  # the decision is arrival + decided_ms: to the microsecond
                self.caller.user_id,
                self.caller.key_id,
                self.channel_id,
                self.used_booking,  # a borrowed request is not its booking's use
                self.model[:200],
                self.method,
                self.path[:300],
                self.status,
                None if ttft is None else round(ttft * 1000, 2),
                round((time.perf_counter() - self.started) * 1000, 2),
                usage.prompt if usage else 0,
                usage.completion if usage else 0,
                self.served,
                None if self.queued_seconds is None else round(self.queued_seconds * 1000, 2),
                request_id,
                round((self.decided - self.started) * 1000, 2),
                self.code,
                self.reason,
                self.borrowed,
            ]
        )
