"""Sending a request the application carries: a borrowed request (docs/gateway.md, "Lending")
is marked as such and may be ended by the booker's; the booker's request ends the borrowed ones
that hold the places it needs; and every request is watched for a slot's edge while it runs
(``gateway.stream.tenancy``).

The fast lane carries no request of a lent slot (``gateway.admit.step``: ``GoNow.lends``): they all come
here, where a borrowed request is watched for its end while it runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import RedisError

from gateway.admit.admission import Entering, Entry
from gateway.admit.places import Places
from gateway.rules.access import ChannelView
from gateway.rules.callers import Caller
from gateway.stream.answer import Answer
from gateway.stream.assembled import may_assemble
from gateway.stream.events import Usage
from gateway.stream.outgoing import Outgoing
from gateway.stream.relay import Preemption, adding_headers, forward
from gateway.stream.tenancy import Flight, Tenancy
from gateway.types import Receive, Send
from gateway.wire.upstream import UpstreamTransport

BORROWED_HEADER = (b"x-slotserve-borrowed", b"true")


class Sender(Protocol):
    places: Places
    tenancy: Tenancy

    def upstream_for(self, upstream: str) -> UpstreamTransport: ...


async def carry(
    gateway: Sender,
    receive: Receive,
    send: Send,
    channel: ChannelView,
    outgoing: Outgoing,
    usage: Usage,
    entry: Entry,
    on_disconnect: Callable[[Callable[[], None] | None], None] | None,
    answer: Answer,
    caller: Caller,
) -> None:
    booking = channel.booking
    lending = gateway.places.lending
    lent = booking is not None and booking.lends and channel.places is not None
    if lent and not answer.borrowed and await entry.settled():  # (``answer.goes_to`` knew)
        # The booker first: counted in, the borrowed requests that hold its place end.
        with contextlib.suppress(RedisError):
            await lending.make_room(channel.id, channel.places or 0)
    if answer.borrowed:
        send = adding_headers(send, [BORROWED_HEADER])
    # Every request in flight is watched for a slot's edge (``gateway.stream.tenancy``).
    preemption = Preemption(channel)
    flight = Flight(caller.user_id, caller.zone, answer, preemption.end, entry.request_id)
    if entry.pending is not None:
        entry.pending.add_done_callback(functools.partial(_counted_in, flight))
    tenancy = gateway.tenancy
    tenancy.took_off(channel.id, flight)
    watched = answer.borrowed and await entry.settled() and entry.request_id is not None
    assemble = False
    if watched:
        assert entry.request_id is not None
        await lending.lent(channel.id, entry.request_id, preemption.end)
        # A whole answer asked for goes up as a stream, so that its end frees its place at once.
        assemble = may_assemble(outgoing.path, outgoing.body)
        if assemble:
            assert outgoing.body is not None
            outgoing.body["stream"] = True
    try:
        await forward(
            gateway,
            receive,
            send,
            channel,
            outgoing,
            usage,
            entry,
            on_disconnect,
            preemption=preemption,
            assemble=assemble,
        )
    finally:
        tenancy.landed(channel.id, flight)
        if watched:
            assert entry.request_id is not None
            with contextlib.suppress(RedisError):
                await lending.returned(channel.id, entry.request_id, marked=preemption.ended)
        if preemption.why is not None:
            usage.asked = 0  # counted what it was sent, not what it asked for
            answer.refused(preemption.why)  # the log keeps why it ended


def _counted_in(flight: Flight, entering: Entering) -> None:
    if not entering.cancelled() and entering.exception() is None:
        flight.request_id = entering.result()
