"""A request's count in (``Counters.enter``), known before it goes upstream or settled while it
goes up alongside, and the upstream's work cancelled unless it is counted in. Whether and how it
may go is the admission step's (``gateway.admit.step``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from datetime import datetime

from gateway.admit.refusals import refusal_after_count_in
from gateway.admit.step import Go
from gateway.rules.access import Refusal
from gateway.rules.callers import Caller
from gateway.wire.counter_scripts import OverLimit
from gateway.wire.counters import Counters
from gateway.wire.upstream import Cancel
from slotserve_base.vocabulary import ErrorCode


class Entry:
    """A request's count in (``Counters.enter``): known before the request goes upstream, or
    ``pending`` (the future of its id, None if the gate was shut) while it goes up alongside."""

    def __init__(
        self,
        request_id: str | None = None,
        pending: Entering | None = None,
        why: Callable[[OverLimit | None], Refusal] | None = None,
    ) -> None:
        self.request_id = request_id
        self.pending = pending
        self.why = why  # the refusal if the pending count in finds the gate shut or a limit met
        self.over: OverLimit | None = None

    async def settled(self) -> bool:
        """Whether the request is counted in (waiting for Redis' answer if it is on its way)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                self.request_id = await pending
            except OverLimit as over:
                self.over = over
        return self.request_id is not None

    @classmethod
    def soon(cls, counters: Counters, go: Go, caller: Caller, now: datetime) -> Entry:
        """The count in of a request that goes upstream at once, on its way (``enter_soon``)."""
        return cls(
            pending=counters.enter_soon(
                go.channel.id,
                go.limits,
                user_id=caller.user_id,
                key_id=caller.key_id,
                ready_at=go.channel.ready_at,
            ),
            why=functools.partial(refusal_after_count_in, go.channel, caller, now),
        )

    def refused(self) -> Refusal:
        if self.why is not None:
            return self.why(self.over)
        return Refusal(503, ErrorCode.MODEL_SWITCHING, "the channel is switching", 1)


async def settled(entry: Entry, cancel: Cancel) -> bool:
    """``entry.settled()``; the upstream's work is cancelled unless the request is counted in."""
    try:
        counted = await entry.settled()
    except BaseException:
        cancel.fire()
        raise
    if not counted:
        cancel.fire()
    return counted


Entering = asyncio.Future[str | None]


def cancel_unless_counted(cancel: Cancel, entering: Entering) -> None:
    if entering.cancelled() or entering.exception() is not None or entering.result() is None:
        cancel.fire()
