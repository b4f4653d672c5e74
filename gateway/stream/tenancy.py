"""A slot's first second (docs/gateway.md): what becomes of the requests already in flight on a
channel when someone's slot begins there, or when a lent slot stops lending.

Each gateway process knows its own requests in flight (``Tenancy.flying``: the fast lane's and
the application's alike). While it has any on a channel that a slot concerns, it looks every
``LOOK_SECONDS`` and at the slot's first moment: ``access.staying`` says, for each, whether it
goes on, becomes borrowed (a lent slot running its booked model: marked, in the channel's lent
set, ended by the booker's requests as any borrowed request is) or ends now (``slot_began``, or
``preempted_by_booker`` for a borrowed one whose slot stopped lending), its caller told why and
what it was sent counted to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo

from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from gateway.admit.refusals import ended_at_slot, preempted
from gateway.admit.snapshot import Snapshot, SnapshotCache
from gateway.rules.access import ChannelView, Refusal, Stay, as_of, staying
from gateway.stream.answer import Answer
from gateway.wire.lending import Lending

log = logging.getLogger(__name__)

# How often a process with requests in flight on a channel that a slot concerns looks at them
# (and at once at a slot's first moment): a slot that stops lending ends its borrowed requests
# within this and the snapshot's age.
LOOK_SECONDS = 0.25


@dataclass(eq=False)
class Flight:
    """A request in flight in this gateway process, from its way upstream to its count out."""

    user_id: int
    zone: tzinfo
    answer: Answer  # ``answer.borrowed`` is whether it is borrowed now (its log record keeps it)
    end: Callable[[Refusal], None]  # ends it now: its process's work cancelled, its caller told why
    request_id: str | None = None  # known once it is counted in
    lent_here: bool = False  # made borrowed at a slot's start: its lent-set entry is ours to take back


class Tenancy:
    """This gateway process's requests in flight, by channel, and the watch over them."""

    def __init__(self, snapshots: SnapshotCache, lending: Lending) -> None:
        self.snapshots = snapshots
        self.lending = lending
        self.flying: dict[int, set[Flight]] = {}
        self._watcher: asyncio.Task[None] | None = None

    def took_off(self, channel_id: int, flight: Flight) -> None:
        self.flying.setdefault(channel_id, set()).add(flight)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

    def landed(self, channel_id: int, flight: Flight) -> None:
        """The request is counted out (or never was counted in)."""
        flights = self.flying.get(channel_id)
        if flights is not None:
            flights.discard(flight)
            if not flights:
                del self.flying[channel_id]
        if flight.lent_here and flight.request_id is not None:
            returning = asyncio.ensure_future(
                self.lending.returned(channel_id, flight.request_id, marked=True)
            )
            returning.add_done_callback(_quietly)

    async def look(self, snapshot: Snapshot, now: datetime) -> None:
        """One look at every request in flight on a channel that a slot concerns now."""
        views = {c.id: c for c in snapshot.channels}
        for channel_id, flights in list(self.flying.items()):
            view = views.get(channel_id)
            if view is None:
                continue
            view = as_of(view, now)
            if view.booking is None:
                continue
            borrowed = False
            for flight in list(flights):
                stay = staying(caller_id=flight.user_id, borrowed_now=flight.answer.borrowed, channel=view)
                if stay == Stay.ENDS:
                    flights.discard(flight)
                    # Borrowed from this very slot, which stopped lending; else a slot began.
                    taken_back = (
                        flight.answer.borrowed and flight.answer.reservation_id == view.booking.reservation_id
                    )
                    flight.end(ended_at_slot(view, borrowed_now=taken_back, zone=flight.zone))
                elif stay == Stay.BORROWED and flight.request_id is not None:
                    await self._borrowed(view, flight)
                    borrowed = True
            if borrowed and view.places is not None:
                # The booker's requests may be in already: the borrowed ones holding their places end.
                with contextlib.suppress(RedisError):
                    await self.lending.make_room(view.id, view.places)

    async def _borrowed(self, view: ChannelView, flight: Flight) -> None:
        assert flight.request_id is not None
        assert view.booking is not None
        flight.answer.borrowed = True  # its log record says so, and its use is not the booking's
        flight.answer.reservation_id = view.booking.reservation_id  # the slot it borrows
        flight.lent_here = True
        why = preempted(view)
        with contextlib.suppress(RedisError):
            await self.lending.lent(view.id, flight.request_id, lambda: flight.end(why))

    def _next_look(self, snapshot: Snapshot, now: datetime) -> float:
        """Seconds to the next look: ``LOOK_SECONDS``, or sooner where a slot begins sooner on a
        channel with requests in flight; None of them concerned: the next refresh's age."""
        wait = LOOK_SECONDS
        for view in snapshot.channels:
            if view.id in self.flying and view.upcoming is not None and view.upcoming.start is not None:
                wait = min(wait, max((view.upcoming.start - now).total_seconds(), 0.0))
        return wait

    async def _watch(self) -> None:
        while self.flying:
            try:
                snapshot = await self.snapshots.get()
            except DatabaseError:
                snapshot = self.snapshots.current  # the last one known still tells of slots
            now = timezone.now()
            try:
                await self.look(snapshot, now)
            except Exception:
                log.exception("gateway: could not look at the requests in flight at a slot's edge")
            await asyncio.sleep(self._next_look(snapshot, timezone.now()) + 0.001)


def _quietly(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None and not isinstance(done.exception(), RedisError):
        log.warning("gateway: could not take a borrowed request back", exc_info=done.exception())
