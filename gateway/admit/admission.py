"""May it go now: the channel a request goes to and whether it goes at once (``going``), its
count in (``Counters.enter``), known before it goes upstream or settled while it goes up
alongside, and the upstream's work cancelled unless it is counted in."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gateway.admit.places import Places
from gateway.admit.refusals import refusal_after_count_in
from gateway.admit.request import Asked, is_booker
from gateway.admit.snapshot import Snapshot
from gateway.rules.access import ChannelView, Refusal, admit, as_of
from gateway.rules.callers import Caller, Limits
from gateway.wire.counter_scripts import OverLimit
from gateway.wire.counters import Counters
from gateway.wire.upstream import Cancel
from slotserve_base.vocabulary import ErrorCode


@dataclass(frozen=True, slots=True)
class Go:
    """A request's way onto its channel."""

    channel: ChannelView
    limits: Limits | None  # the caller's limits; none for the channel's booker in their slot
    at_once: bool  # nothing to wait for and room under the limits: it goes up as it is counted in
    queued: bool = False  # it takes one of the channel's places, or waits its turn (gateway.admit.places)


def going(
    channel: ChannelView,
    caller: Caller,
    counters: Counters,
    places: Places,
    *,
    waiting: bool,
    takes_place: bool = True,
) -> Go:
    """How a request the channel admits goes on: at once (counted in as it goes upstream) when
    the caller will not wait, has no limits or room under them, and the channel's places are
    not counted or had room at the last look; else counted in first. The channel's booker in
    their slot is alone on it and never queued, and a request that ``takes_place`` not
    (``gateway.admit.places.takes_place``) never waits for one."""
    booker = is_booker(channel, caller)
    limits = None if booker else caller.limits
    queued = takes_place and channel.places is not None and not booker
    at_once = (
        not waiting
        and (not queued or places.may_take(channel.id))
        and (limits is None or counters.may_go_ahead(caller.user_id, caller.key_id))
    )
    return Go(channel, limits, at_once, queued)


def chosen_at_once(snapshot: Snapshot, asked: Asked, now: datetime) -> ChannelView | None:
    """The channel ``access.route`` would choose and admit, where it needs no count of requests
    in flight: the caller's own, or the one channel ready with the model. None leaves the
    choice, or the refusal, to ``route`` (``Gateway.choose``)."""
    if asked.pinned is not None:
        return None
    channel = snapshot.index.only_choice(asked.caller.user_id, asked.model)
    if channel is None:
        return None
    channel = as_of(channel, now)
    if channel.booking is not None and channel.booking.lends:
        return None  # a lent slot's requests are the application's: borrowed ones may be ended
    if admit(caller_id=asked.caller.user_id, channel=channel, now=now) is not None:
        return None
    return channel


def still_admitted(
    snapshot: Snapshot, channel: ChannelView, caller: Caller, now: datetime
) -> tuple[ChannelView, Refusal | None]:
    """Whether a request that waited its turn on ``channel`` may go there at ``now``, when its
    turn came: the access table holds at the moment a request goes upstream, and someone
    else's slot may have begun while it waited (docs/gateway.md). With the channel as of
    ``now``, which the request goes on with: a slot that began and lends makes it borrowed."""
    view = next((c for c in snapshot.channels if c.id == channel.id), None)
    if view is None:
        return channel, Refusal(404, ErrorCode.MODEL_NOT_LOADED, f"channel {channel.name} no longer exists")
    view = as_of(view, now)
    return view, admit(caller_id=caller.user_id, channel=view, now=now, zone=caller.zone)


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
                go.channel.id, go.limits, user_id=caller.user_id, key_id=caller.key_id
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
