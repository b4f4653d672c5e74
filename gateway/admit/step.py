"""Admission as one pure step (docs/gateway.md, "Admission, one step at a time").

``step(state, seen, now)`` takes where a request stands (``Admission``), what the gateway saw
since the last step (``Seen``: the snapshot's channels, the room it noted, what the last action
came to) and ``now``, and returns where it stands next and the one thing to do (``Action``).
The application's loop (``gateway.serve.proxy.Gateway.proxy``) observes, steps and acts until
the request goes upstream, is refused or its client leaves; the fast lane
(``gateway.serve.fast_lane``) takes the first step only and carries the request when it says
``Go``, declining every other action. Every rule of admission is here, in the order a request
meets them: the key's scope, the access table (``gateway.rules.access.route``), how it goes on
(at once, its turn for a place, counted in first), and whether a refusal is given or waited out
(held, ``X-SlotServe-Wait``). Nothing here waits, reads a clock or does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from gateway.admit.refusals import over_limit_refusal, switching_refusal, too_many_held
from gateway.rules import key_scope
from gateway.rules.access import ChannelView, Refusal, admit, as_of, borrowed, is_booker, route
from gateway.rules.callers import Caller, Limits
from gateway.rules.channel_index import ChannelIndex
from gateway.wire.counter_scripts import HELD_TTL_SECONDS, OverLimit
from slotserve_base.vocabulary import ErrorCode, Phase

# Refusals a caller may ask to wait out (``X-SlotServe-Wait``): the model will be ready.
WAITABLE = frozenset({ErrorCode.MODEL_LOADING, ErrorCode.MODEL_SWITCHING})

# How often a held request looks again (seconds).
HOLD_POLL_SECONDS = 0.2

# How often a held request's entry in the caller's count of held requests is refreshed: a third
# of its life in Redis.
HOLD_REFRESH_SECONDS = HELD_TTL_SECONDS / 3


# No room noted for anything.
NO_ROOM: Mapping[Any, tuple[float, int]] = MappingProxyType({})


class Stage:
    """Where a request stands between two steps: what the last action was."""

    CHOOSE = "choose"  # which channel, and may it go there now
    TURN = "turn"  # it waited its turn for a place (``WaitTurn``)
    COUNT = "count"  # it was counted in (``CountIn``)
    GIVE_BACK = "give_back"  # it gave back a place it will not use, then is refused or held
    HELD_COUNT = "held_count"  # its place among the caller's held requests was asked for
    ON_DEMAND = "on_demand"  # a load on demand of the model no channel runs was asked for


# ``Go``, ``Admission`` and ``Seen`` are made for every request, on the fast lane's way too:
# named tuples, made in a quarter of a frozen dataclass's time, immutable all the same.


class Go(NamedTuple):
    """A request's way onto its channel."""

    channel: ChannelView
    limits: Limits | None  # the caller's limits; none for the channel's booker in their slot
    at_once: bool  # nothing to wait for and room under the limits: it goes up as it is counted in
    queued: bool = False  # it takes one of the channel's places, or waits its turn (gateway.admit.places)


class Admission(NamedTuple):
    """Where one request stands: what it asks (fixed), and how far it got."""

    caller: Caller
    model: str | None  # what it is routed by (an alias is routed as its model)
    pinned: str | None  # the channel named in the path, if any
    takes_place: bool  # it makes the process work (``gateway.admit.places.takes_place``)
    deadline: float  # until when (``Seen.clock``) the caller waits for a model; now if not
    stage: str = Stage.CHOOSE
    go: Go | None = None
    place: str | None = None  # the place it took, by its id
    held: bool = False  # counted among the caller's held requests
    refresh_at: float = 0.0  # when that count is refreshed next
    refusal: Refusal | None = None  # the refusal it stands on (``GIVE_BACK``, ``HELD_COUNT``)
    on_demand: Refusal | None = None  # asked once: what a load on demand of its model came to


class Seen(NamedTuple):
    """What the gateway saw for this step: the snapshot's channels (and their index), the
    monotonic ``clock``, the room it noted for requests that go at once, and what the last
    action came to."""

    channels: Sequence[ChannelView]
    clock: float
    channel_index: ChannelIndex | None = None
    in_flight: Mapping[int, int] | None = None  # requests in flight by channel; None: not counted
    # When a request may go at once (``Places.room``, ``Counters.room``): until when, how many.
    place_room: Mapping[int, tuple[float, int]] = NO_ROOM
    limit_room: Mapping[tuple[int, int], tuple[float, int]] = NO_ROOM
    turn: str | Refusal | None = None  # ``WaitTurn``: the place taken, or why none
    entered: str | OverLimit | None = None  # ``CountIn``: its id, the limit met, or None: gate shut
    held_ok: bool = False  # ``CountHeld``: room among the caller's held requests
    on_demand: Refusal | None = None  # ``AskOnDemand``: the load's answer; None: no such model
    left: bool = False  # the client went away


# The actions: what the gateway does next.


@dataclass(frozen=True, slots=True)
class CountFlights:
    """Count the requests in flight on these channels: ``route`` weighs them."""

    channel_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GoNow:
    """Go upstream at once, counted in alongside (the fast lane's only action)."""

    go: Go
    lends: bool  # the channel's slot lends: the booker's request ends borrowed ones
    borrowed: bool


@dataclass(frozen=True, slots=True)
class WaitTurn:
    """Take a place on the channel, or wait in its fair queue for one."""

    go: Go


@dataclass(frozen=True, slots=True)
class CountIn:
    """Count the request in (its limits checked in the same step), with the place it took."""

    go: Go
    place: str | None


@dataclass(frozen=True, slots=True)
class Forward:
    """Counted in: go upstream."""

    go: Go
    request_id: str
    lends: bool
    borrowed: bool


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Give back the place taken, unused."""

    channel_id: int
    place: str


@dataclass(frozen=True, slots=True)
class CountHeld:
    """Count the request among the caller's held requests (or refresh its count)."""


@dataclass(frozen=True, slots=True)
class AskOnDemand:
    """Load ``model`` on a free channel, as no channel runs it (docs/scheduling.md, "Loaded on
    demand"), or learn why not."""

    model: str


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait, as the caller asked, then look again: ``note`` for a held stream's comment."""

    note: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Refuse:
    refusal: Refusal


@dataclass(frozen=True, slots=True)
class Abandon:
    """The client left: nothing goes upstream."""


Action = (
    CountFlights
    | GoNow
    | WaitTurn
    | CountIn
    | Forward
    | GiveBack
    | CountHeld
    | AskOnDemand
    | Hold
    | Refuse
    | Abandon
)


def step(state: Admission, seen: Seen, now: datetime) -> tuple[Admission, Action]:
    """The next stage of ``state`` and what to do, from what was ``seen`` at ``now``. ``GoNow``,
    ``Forward``, ``Refuse`` and ``Abandon`` end the admission: the state comes back as it was."""
    if seen.left:
        return state, Abandon()
    stage = state.stage
    if stage == Stage.CHOOSE:
        return _choose(state, seen, now)
    if stage == Stage.TURN:
        go = state.go
        assert go is not None
        if not isinstance(seen.turn, str):
            assert seen.turn is not None
            return _refused(state, seen.turn, seen)
        place = seen.turn
        # Its turn: the access table holds at the moment a request goes upstream, and someone
        # else's slot may have begun while it waited.
        view, refusal = still_admitted(seen.channels, go.channel, state.caller, now)
        go = go._replace(channel=view)
        state = state._replace(go=go, place=place)
        if refusal is not None:
            return _refused(state, refusal, seen)
        return state._replace(stage=Stage.COUNT), CountIn(go, place)
    if stage == Stage.COUNT:
        go = state.go
        assert go is not None
        entered = seen.entered
        if isinstance(entered, str):
            channel = go.channel
            lends = channel.booking is not None and channel.booking.lends
            return state, Forward(go, entered, lends, borrowed(state.caller.user_id, channel))
        caller = state.caller
        if isinstance(entered, OverLimit):
            refusal = over_limit_refusal(entered, caller, now)
        else:
            refusal = switching_refusal(go.channel, caller, now)
        return _refused(state, dataclasses.replace(refusal, channel_id=go.channel.id), seen)
    if stage == Stage.GIVE_BACK:
        assert state.refusal is not None
        return _refused(state._replace(place=None), state.refusal, seen)
    if stage == Stage.ON_DEMAND:
        assert state.refusal is not None
        answer = seen.on_demand or state.refusal
        return _refused(state._replace(stage=Stage.CHOOSE, refusal=None, on_demand=answer), answer, seen)
    if stage == Stage.HELD_COUNT:
        if not seen.held_ok:
            return state, Refuse(too_many_held(state.caller))
        state = state._replace(held=True, refresh_at=seen.clock + HOLD_REFRESH_SECONDS)
        assert state.refusal is not None
        return _hold(state, state.refusal, seen)
    raise ValueError(f"no step from stage {stage!r}")


def _choose(state: Admission, seen: Seen, now: datetime) -> tuple[Admission, Action]:
    caller = state.caller
    chosen = _chosen(state, seen, now)
    if isinstance(chosen, CountFlights):
        return state, chosen
    if isinstance(chosen, Refusal):
        if chosen.code == ErrorCode.MODEL_NOT_LOADED and state.pinned is None and state.model:
            # No channel runs it or heads for it: a free channel may load it, asked once a request.
            if not caller.loads_on_demand:
                return _refused(state, _no_loads_for(chosen), seen)
            if state.on_demand is None:
                return state._replace(stage=Stage.ON_DEMAND, refusal=chosen), AskOnDemand(state.model)
            chosen = state.on_demand  # until the channel's decision shows the load
        return _refused(state, chosen, seen)
    channel = chosen
    if caller.scoped:
        # The scope is what the process serves, not what the body names: a pinned channel or
        # the caller's own booking may serve another model.
        outside = key_scope.outside(caller, channel.model, channel)
        if outside is not None:
            return _refused(state, outside, seen)
    go = going(state, channel, seen)
    if go.at_once:
        lends = channel.booking is not None and channel.booking.lends
        return state, GoNow(go, lends, borrowed(caller.user_id, channel))
    if go.queued:
        return state._replace(stage=Stage.TURN, go=go), WaitTurn(go)
    return state._replace(stage=Stage.COUNT, go=go), CountIn(go, None)


def _chosen(state: Admission, seen: Seen, now: datetime) -> ChannelView | Refusal | CountFlights:
    """The channel that may take the request now (as of ``now``), why none does, or the
    channels whose requests in flight ``route`` must weigh first."""
    caller, model, pinned = state.caller, state.model, state.pinned
    if caller.scoped:
        pinned_view = next((c for c in seen.channels if c.name == pinned), None) if pinned else None
        outside = key_scope.outside(caller, model, pinned_view)
        if outside is not None:
            return outside
        channels = key_scope.reachable(caller, seen.channels)
    else:
        channels = seen.channels
        if pinned is None and seen.channel_index is not None:
            # Most requests: the caller's own channel, or the one channel ready with the model.
            only = seen.channel_index.only_choice(caller.user_id, model)
            if only is not None:
                only = as_of(only, now)
                if admit(caller_id=caller.user_id, channel=only, now=now) is None:
                    return only
    in_flight = seen.in_flight
    if in_flight is None:
        candidates = tuple(c.id for c in channels if c.model == model and c.phase == Phase.READY)
        if len(candidates) > 1:
            return CountFlights(candidates)
        in_flight = {}
    chosen = route(
        caller_id=caller.user_id,
        model=model,
        pinned=pinned,
        channels=channels,
        in_flight=in_flight,
        now=now,
        zone=caller.zone,
    )
    if chosen.refusal is not None:
        return chosen.refusal
    if chosen.channel is None:
        return Refusal(404, ErrorCode.MODEL_NOT_LOADED, "no channel serves this")
    return chosen.channel


def _no_loads_for(refusal: Refusal) -> Refusal:
    return dataclasses.replace(
        refusal, message=refusal.message + "; your group does not load models on request"
    )


def going(state: Admission, channel: ChannelView, seen: Seen) -> Go:
    """How a request the channel admits goes on: at once (counted in as it goes upstream) when
    the caller will not wait, has no limits or room under them, and the channel's places are
    not counted or had room at the last look; else counted in first. The channel's booker in
    their slot is alone on it and never queued, and a request that takes no place
    (``gateway.admit.places.takes_place``) never waits for one."""
    caller = state.caller
    booker = is_booker(caller.user_id, channel)
    limits = None if booker else caller.limits
    queued = state.takes_place and channel.places is not None and not booker
    at_once = (
        seen.clock >= state.deadline
        and (not queued or has_room(seen.place_room.get(channel.id), seen.clock))
        and (limits is None or has_room(seen.limit_room.get((caller.user_id, caller.key_id)), seen.clock))
    )
    return Go(channel, limits, at_once, queued)


def has_room(room: tuple[float, int] | None, clock: float) -> bool:
    """Whether noted room (until when, for how many) lets one more request go at once."""
    return room is not None and room[1] >= 1 and clock < room[0]


def still_admitted(
    channels: Sequence[ChannelView], channel: ChannelView, caller: Caller, now: datetime
) -> tuple[ChannelView, Refusal | None]:
    """Whether a request that waited its turn on ``channel`` may go there at ``now``: with the
    channel as of ``now`` (a slot that began and lends makes it borrowed)."""
    view = next((c for c in channels if c.id == channel.id), None)
    if view is None:
        return channel, Refusal(404, ErrorCode.MODEL_NOT_LOADED, f"channel {channel.name} no longer exists")
    view = as_of(view, now)
    return view, admit(caller_id=caller.user_id, channel=view, now=now, zone=caller.zone)


def _refused(state: Admission, refusal: Refusal, seen: Seen) -> tuple[Admission, Action]:
    """A refusal: given back a place first, then given or, when the caller waits for a model
    that will be ready, waited out."""
    if state.place is not None:
        assert state.go is not None
        place = state.place
        return (
            state._replace(stage=Stage.GIVE_BACK, refusal=refusal),
            GiveBack(state.go.channel.id, place),
        )
    if refusal.status != 503 or refusal.code not in WAITABLE or seen.clock >= state.deadline:
        return state, Refuse(refusal)
    if seen.clock >= state.refresh_at:
        return state._replace(stage=Stage.HELD_COUNT, refusal=refusal), CountHeld()
    return _hold(state, refusal, seen)


def _hold(state: Admission, refusal: Refusal, seen: Seen) -> tuple[Admission, Action]:
    hold = Hold(
        f"waiting for {state.model}: {refusal.message}",
        min(HOLD_POLL_SECONDS, state.deadline - seen.clock),
    )
    return state._replace(stage=Stage.CHOOSE, go=None, refusal=None), hold
