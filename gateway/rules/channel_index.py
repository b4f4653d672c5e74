"""The channels by what ``gateway.rules.access.route`` looks for first, made once per snapshot
(``gateway.admit.snapshot``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.rules.access import ChannelView
from slotserve_base.vocabulary import Phase


@dataclass(frozen=True)
class ChannelIndex:
    """The channels by what ``route`` looks for first: each caller's own booked channel, and the
    channels ready to serve each model. Made once per snapshot, so that most requests find
    their channel without looking through every channel."""

    booked: Mapping[int, ChannelView]  # user → the channel of their active reservation
    ready: Mapping[str, tuple[ChannelView, ...]]  # model → the channels ready to serve it
    # Whom and what a slot that begins within the snapshot's life concerns: ``route`` decides
    # those, at the request's moment.
    unsure_users: frozenset[int] = frozenset()
    unsure_models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, channels: Sequence[ChannelView]) -> ChannelIndex:
        booked: dict[int, ChannelView] = {}
        ready: dict[str, list[ChannelView]] = {}
        users: set[int] = set()
        models: set[str] = set()
        for c in channels:
            if c.upcoming is not None:
                users |= {c.upcoming.user_id} | ({c.booking.user_id} if c.booking else set())
                models |= {m for m in (c.model, c.targets_model) if m is not None}
            if c.booking is not None:
                booked.setdefault(c.booking.user_id, c)  # route takes the first
            if c.phase == Phase.READY and c.model is not None:
                ready.setdefault(c.model, []).append(c)
        ready_by_model = {model: tuple(found) for model, found in ready.items()}
        return cls(booked, ready_by_model, frozenset(users), frozenset(models))

    def only_choice(self, caller_id: int, model: str | None) -> ChannelView | None:
        """The channel ``route`` chooses for this caller and model when it has no choice to
        make: the caller's own, or the one channel ready with the model. None leaves it to
        ``route`` (it says why nothing serves, or weighs requests in flight among several).
        ``admit`` still says whether the caller may use it."""
        if caller_id in self.unsure_users or model in self.unsure_models:
            return None
        mine = self.booked.get(caller_id)
        if mine is not None:
            return mine
        found = self.ready.get(model, ()) if model else ()
        return found[0] if len(found) == 1 else None
