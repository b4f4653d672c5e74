"""Sending a request on a lent slot (docs/gateway.md, "Lending"): a borrowed request is marked
as such and may be ended by the booker's; the booker's request ends the borrowed ones that hold
the places it needs. Every other request goes to ``relay.forward`` as it is.

The fast lane carries no request of a lent slot (``admission.chosen_at_once``): they all come
here, where a borrowed request is watched for its end while it runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import RedisError

from gateway.admit.admission import Entry
from gateway.admit.places import Places
from gateway.admit.refusals import preempted
from gateway.rules.access import ChannelView
from gateway.stream.answer import Answer
from gateway.stream.events import Usage
from gateway.stream.outgoing import Outgoing
from gateway.stream.relay import Preemption, adding_headers
from gateway.stream.relay import forward as relay_forward
from gateway.types import Receive, Send
from gateway.wire.upstream import UpstreamTransport

BORROWED_HEADER = (b"x-slotserve-borrowed", b"true")


class Sender(Protocol):
    places: Places

    def upstream_for(self, upstream: str) -> UpstreamTransport: ...


async def forward(
    gateway: Sender,
    receive: Receive,
    send: Send,
    channel: ChannelView,
    outgoing: Outgoing,
    usage: Usage,
    entry: Entry,
    on_disconnect: Callable[[Callable[[], None] | None], None] | None,
    answer: Answer,
) -> None:
    booking = channel.booking
    if booking is None or not booking.lends or channel.places is None:
        await relay_forward(gateway, receive, send, channel, outgoing, usage, entry, on_disconnect)
        return
    lending = gateway.places.lending
    if not answer.borrowed:  # (``answer.goes_to`` knew)
        # The booker first: counted in, the borrowed requests that hold its place end.
        if await entry.settled():
            with contextlib.suppress(RedisError):
                await lending.make_room(channel.id, channel.places)
        await relay_forward(gateway, receive, send, channel, outgoing, usage, entry, on_disconnect)
        return
    send = adding_headers(send, [BORROWED_HEADER])
    if not await entry.settled() or entry.request_id is None:
        await relay_forward(gateway, receive, send, channel, outgoing, usage, entry, on_disconnect)
        return
    request_id = entry.request_id
    preemption = Preemption(channel)
    await lending.lent(channel.id, request_id, preemption.end)
    try:
        await relay_forward(
            gateway, receive, send, channel, outgoing, usage, entry, on_disconnect, preemption=preemption
        )
    finally:
        with contextlib.suppress(RedisError):
            await lending.returned(channel.id, request_id, marked=preemption.ended)
        if preemption.ended:
            usage.asked = 0  # counted what it was sent, not what it asked for
            answer.refused(preempted(channel))  # the log keeps why it ended
