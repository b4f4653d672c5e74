"""Admission as one pure step (docs/gateway.md, "Admission, one step at a time"): where a
request stands, what the gateway saw and the moment give the next stage and the one thing to do.
Every refusal the step gives is one row of ``REFUSALS``; the ways on are rows of ``WAYS``."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from gateway.admit.step import (
    HOLD_POLL_SECONDS,
    HOLD_REFRESH_SECONDS,
    Abandon,
    Admission,
    AskOnDemand,
    CountFlights,
    CountHeld,
    CountIn,
    Forward,
    GiveBack,
    Go,
    GoNow,
    Hold,
    Refuse,
    Seen,
    Stage,
    WaitTurn,
    step,
)
from gateway.rules.access import Booking, ChannelView, Refusal
from gateway.rules.callers import Caller, Limits
from gateway.rules.channel_index import ChannelIndex
from gateway.wire.counter_scripts import OverLimit
from tests.test_gateway_access import NOW, channel

CLOCK = 1000.0
ANA, BO = 1, 2


LIMITED = Limits(user_concurrent=2, user_per_minute=60, user_weekly_tokens=1000)
BO_FREE = Caller(user_id=BO, username="bo", key_id=20)
BO_LIMITED = dataclasses.replace(BO_FREE, limits=LIMITED)
ANA_CALLER = Caller(user_id=ANA, username="ana", key_id=10, limits=LIMITED)
SCOPED = dataclasses.replace(BO_FREE, models_allowed=frozenset({"llama"}))
SCOPED_TO_B = dataclasses.replace(BO_FREE, channels_allowed=frozenset({2}))

BOOKED = Booking(
    reservation_id=7, user_id=ANA, exclusive=False, end=NOW + timedelta(hours=1), target=(1, None)
)
LENT = dataclasses.replace(BOOKED, lends=True)
WHOLE = dataclasses.replace(BOOKED, exclusive=True, target=None)
SOON = dataclasses.replace(BOOKED, start=NOW + timedelta(seconds=30))


def asking(
    caller: Caller = BO_FREE, *, model: str | None = "qwen", pinned=None, wait=0.0, **more
) -> Admission:
    return Admission(caller, model, pinned, takes_place=True, deadline=CLOCK + wait, **more)


def seen(*channels: ChannelView, **more) -> Seen:
    return Seen(channels, CLOCK, ChannelIndex.of(channels), **more)


ROOM = {1: (CLOCK + 1, 3)}  # channel a's places had room for three more, for a second
LIMIT_ROOM = {(BO, 20): (CLOCK + 1, 2)}
PLACES = {"places": 4}
GO_A = Go(channel(**PLACES), LIMITED, at_once=False, queued=True)


REFUSALS = [
    # (situation, state, seen, the refusal's (status, code))
    (
        "no channel runs the model, and none may load it on demand",
        asking(model="llama", on_demand=Refusal(404, "model_not_loaded", "no channel can load it now")),
        seen(channel()),
        (404, "model_not_loaded"),
    ),
    ("the request names no model", asking(model=None), seen(channel()), (400, "invalid_request")),
    (
        "pinned to a channel that does not exist",
        asking(pinned="z"),
        seen(channel()),
        (404, "model_not_loaded"),
    ),
    ("someone else's slot", asking(), seen(channel(booking=BOOKED)), (403, "gpu_reserved")),
    (
        "the caller's whole-card slot",
        asking(ANA_CALLER),
        seen(channel(booking=WHOLE)),
        (503, "gpu_exclusive"),
    ),
    (
        "switching, the caller does not wait",
        asking(),
        seen(channel(switching=True)),
        (503, "model_switching"),
    ),
    ("loading, the caller does not wait", asking(), seen(channel(phase="loading")), (503, "model_loading")),
    (
        "its node's worker is not reporting",
        asking(),
        seen(channel(phase="stopped", node_ready=False, targets_model="qwen")),
        (503, "node_not_ready"),
    ),
    ("the key may not call the model", asking(SCOPED), seen(channel()), (403, "key_scope")),
    (
        "the key may not reach the channel chosen",
        asking(SCOPED_TO_B, pinned="a"),
        seen(channel()),
        (403, "key_scope"),
    ),
    (
        "the key may not call what the pinned channel serves",
        asking(dataclasses.replace(SCOPED, channels_allowed=frozenset({1})), model=None, pinned="a"),
        seen(channel()),
        (403, "key_scope"),
    ),
    (
        "a limit met as it was counted in",
        asking(BO_LIMITED, stage=Stage.COUNT, go=GO_A._replace(queued=False)),
        seen(channel(), entered=OverLimit("user_per_minute", 12)),
        (429, "rate_limit_exceeded"),
    ),
    (
        "its week's tokens used",
        asking(BO_LIMITED, stage=Stage.COUNT, go=GO_A._replace(queued=False)),
        seen(channel(), entered=OverLimit("weekly_tokens", 0)),
        (429, "insufficient_quota"),
    ),
    (
        "its key's week's tokens used",
        asking(BO_LIMITED, stage=Stage.COUNT, go=GO_A._replace(queued=False)),
        seen(channel(), entered=OverLimit("key_weekly_tokens", 0)),
        (429, "insufficient_quota"),
    ),
    (
        "the gate closed as it was counted in",
        asking(BO_LIMITED, stage=Stage.COUNT, go=GO_A._replace(queued=False)),
        seen(channel(), entered=None),
        (503, "model_switching"),
    ),
    (
        "the channel's queue is full",
        asking(BO_LIMITED, stage=Stage.TURN, go=GO_A),
        seen(channel(**PLACES), turn=Refusal(503, "channel_queue_full", "busy", 3)),
        (503, "channel_queue_full"),
    ),
    (
        "the caller has as many waiting as they may",
        asking(BO_LIMITED, stage=Stage.TURN, go=GO_A),
        seen(channel(**PLACES), turn=Refusal(429, "queue_full", "yours", 3)),
        (429, "queue_full"),
    ),
    (
        "its turn came after the channel was removed",
        asking(BO_LIMITED, stage=Stage.GIVE_BACK, go=GO_A, refusal=Refusal(404, "model_not_loaded", "gone")),
        seen(),
        (404, "model_not_loaded"),
    ),
    (
        "the caller holds as many requests as they may",
        asking(
            BO_LIMITED, wait=30, stage=Stage.HELD_COUNT, refusal=Refusal(503, "model_loading", "loading", 9)
        ),
        seen(channel(phase="loading"), held_ok=False),
        (429, "too_many_held"),
    ),
    (
        "the model still loads when the caller's wait is over",
        asking(wait=30),
        seen(channel(phase="loading"))._replace(clock=CLOCK + 30),
        (503, "model_loading"),
    ),
]


@pytest.mark.parametrize(
    ("situation", "state", "seeing", "expected"), REFUSALS, ids=[row[0] for row in REFUSALS]
)
def test_every_refusal_is_one_step(situation, state, seeing, expected):
    after, action = step(state, seeing, NOW)
    assert isinstance(action, Refuse), f"{situation}: {action}"
    assert (action.refusal.status, action.refusal.code) == expected, situation
    assert after == state, "a refusal ends the admission where it stood"


def test_the_refusals_table_names_every_code_admission_gives():
    """Each code the step can give has its row (a new rule adds one)."""
    codes = {row[3][1] for row in REFUSALS}
    assert codes >= {
        "model_not_loaded",
        "invalid_request",
        "gpu_reserved",
        "gpu_exclusive",
        "model_switching",
        "model_loading",
        "node_not_ready",
        "key_scope",
        "rate_limit_exceeded",
        "insufficient_quota",
        "queue_full",
        "channel_queue_full",
        "too_many_held",
    }


WAYS = [
    # (situation, state, seen, the action expected, the stage after; None: it ends)
    (
        "free, no limits: goes at once",
        asking(),
        seen(channel()),
        GoNow(Go(channel(), None, at_once=True), lends=False, borrowed=False),
        None,
    ),
    (
        "limits with room under them, places with room: goes at once",
        asking(BO_LIMITED),
        seen(channel(**PLACES), place_room=ROOM, limit_room=LIMIT_ROOM),
        GoNow(Go(channel(**PLACES), LIMITED, at_once=True, queued=True), lends=False, borrowed=False),
        None,
    ),
    (
        "limits with no room noted: counted in first",
        asking(BO_LIMITED),
        seen(channel()),
        CountIn(Go(channel(), LIMITED, at_once=False), None),
        Stage.COUNT,
    ),
    (
        "limits whose room has expired: counted in first",
        asking(BO_LIMITED),
        seen(channel(), limit_room={(BO, 20): (CLOCK - 0.1, 2)}),
        CountIn(Go(channel(), LIMITED, at_once=False), None),
        Stage.COUNT,
    ),
    (
        "places with no room noted: waits its turn",
        asking(BO_LIMITED),
        seen(channel(**PLACES), limit_room=LIMIT_ROOM),
        WaitTurn(Go(channel(**PLACES), LIMITED, at_once=False, queued=True)),
        Stage.TURN,
    ),
    (
        "the caller will wait: counted in first, even with room",
        asking(wait=5),
        seen(channel()),
        CountIn(Go(channel(), None, at_once=False), None),
        Stage.COUNT,
    ),
    (
        "the booker in their slot: never queued, never limited",
        asking(ANA_CALLER),
        seen(channel(booking=BOOKED, **PLACES)),
        GoNow(Go(channel(booking=BOOKED, **PLACES), None, at_once=True), lends=False, borrowed=False),
        None,
    ),
    (
        "a lent slot, ready: borrowed, the slot lends",
        asking(),
        seen(channel(booking=LENT, running=(1, None), places=4), place_room=ROOM),
        GoNow(
            Go(channel(booking=LENT, running=(1, None), places=4), None, at_once=True, queued=True),
            lends=True,
            borrowed=True,
        ),
        None,
    ),
    (
        "two channels ready: their requests in flight are counted first",
        asking(),
        seen(channel("a"), channel("b")),
        CountFlights((1, 2)),
        Stage.CHOOSE,
    ),
    (
        "two channels ready, counted: the one with fewer in flight",
        asking(),
        seen(channel("a"), channel("b"), in_flight={1: 3, 2: 1}),
        GoNow(Go(channel("b"), None, at_once=True), lends=False, borrowed=False),
        None,
    ),
    (
        "its turn came: counted in with its place",
        asking(BO_LIMITED, stage=Stage.TURN, go=GO_A),
        seen(channel(**PLACES), turn="r-1"),
        CountIn(GO_A, "r-1"),
        Stage.COUNT,
    ),
    (
        "its turn came as someone else's slot began: the place is given back first",
        asking(BO_LIMITED, stage=Stage.TURN, go=GO_A),
        seen(channel(booking=BOOKED, **PLACES), turn="r-1"),
        GiveBack(1, "r-1"),
        Stage.GIVE_BACK,
    ),
    (
        "counted in: goes upstream",
        asking(BO_LIMITED, stage=Stage.COUNT, go=GO_A, place="r-1"),
        seen(channel(**PLACES), entered="r-1"),
        Forward(GO_A, "r-1", lends=False, borrowed=False),
        None,
    ),
    (
        "loading and the caller waits: first counted among its held requests",
        asking(wait=30),
        seen(channel(phase="loading")),
        CountHeld(),
        Stage.HELD_COUNT,
    ),
    (
        "counted among its held requests: holds, then looks again",
        asking(wait=30, stage=Stage.HELD_COUNT, refusal=Refusal(503, "model_loading", "loading qwen", 9)),
        seen(channel(phase="loading"), held_ok=True),
        Hold("waiting for qwen: loading qwen", HOLD_POLL_SECONDS),
        Stage.CHOOSE,
    ),
    (
        "held, its count fresh: holds without asking again, no longer than its wait",
        asking(wait=0.125, held=True, refresh_at=CLOCK + 5),
        seen(channel(switching=True)),
        Hold("waiting for qwen: channel a is switching models", 0.125),
        Stage.CHOOSE,
    ),
    (
        "the client left: nothing goes upstream",
        asking(BO_LIMITED, stage=Stage.TURN, go=GO_A),
        seen(channel(**PLACES), left=True),
        Abandon(),
        None,
    ),
]


@pytest.mark.parametrize(
    ("situation", "state", "seeing", "expected", "stage"), WAYS, ids=[row[0] for row in WAYS]
)
def test_the_ways_on(situation, state, seeing, expected, stage):
    after, action = step(state, seeing, NOW)
    assert action == expected, situation
    if stage is None:  # the admission ends: the state is as it was
        assert after == state, situation
    else:
        assert after.stage == stage, situation


def test_a_held_request_is_counted_once_a_refresh_and_kept_counted():
    state, action = step(asking(wait=30), seen(channel(phase="loading")), NOW)
    assert isinstance(action, CountHeld)
    state, action = step(state, seen(channel(phase="loading"), held_ok=True), NOW)
    assert isinstance(action, Hold) and state.held
    assert state.refresh_at == CLOCK + HOLD_REFRESH_SECONDS
    # The next look, the model ready: it goes, still counted held (the loop uncounts it).
    state, action = step(state, seen(channel()), NOW)
    assert isinstance(action, GoNow) is False and isinstance(action, CountIn), "it waited: counted in first"
    assert state.held


def test_a_slot_that_begins_within_the_snapshot_counts_from_its_first_moment():
    """The snapshot says the slot begins in 30 s; at that moment someone else is refused."""
    soon = channel(upcoming=SOON)
    _, before = step(asking(), seen(soon), NOW)
    assert isinstance(before, GoNow)
    _, after = step(asking(), seen(soon), NOW + timedelta(seconds=30))
    assert isinstance(after, Refuse) and after.refusal.code == "gpu_reserved"


def test_the_step_is_the_same_for_the_same_inputs():
    """Pure: stepping twice from the same state and sight gives the same answer, and the
    room it saw is not taken (the gateway takes it when it acts)."""
    room = {1: (CLOCK + 1, 1)}
    looked = seen(channel(**PLACES), place_room=room)
    assert step(asking(), looked, NOW) == step(asking(), looked, NOW)
    assert room == {1: (CLOCK + 1, 1)}


LOADING_ON_DEMAND = Refusal(503, "model_loading", "loading on demand on channel a", 12, 1)


def test_a_model_no_channel_runs_is_asked_for_on_demand_once_a_request():
    """docs/scheduling.md, "Loaded on demand": the first look asks; what it came to is the
    answer until the channel's decision shows the load, and it is never asked again."""
    state, action = step(asking(model="llama"), seen(channel()), NOW)
    assert action == AskOnDemand("llama") and state.stage == Stage.ON_DEMAND
    _after, action = step(state, seen(channel(), on_demand=LOADING_ON_DEMAND), NOW)
    assert action == Refuse(LOADING_ON_DEMAND)  # the caller does not wait: told to come back
    # Waiting callers are held on it, and while the snapshot does not show the load yet they
    # stand on the same answer instead of asking again.
    state, action = step(asking(model="llama", wait=30), seen(channel()), NOW)
    state, action = step(state, seen(channel(), on_demand=LOADING_ON_DEMAND), NOW)
    assert isinstance(action, CountHeld)
    state, action = step(state, seen(channel(), held_ok=True), NOW)
    assert isinstance(action, Hold) and "loading on demand" in action.note
    state, action = step(state, seen(channel()), NOW)
    assert isinstance(action, Hold), "asked once: held on its answer, not asked again"
    # The decision reached the snapshot: the channel heads for the model, then runs it.
    heading = channel(phase="stopping", targets_model="llama")
    state, action = step(state, seen(heading), NOW)
    assert isinstance(action, Hold)
    state, action = step(state, seen(channel(model="llama")), NOW)
    assert isinstance(action, CountIn)


def test_no_model_of_that_name_keeps_the_requests_own_answer():
    state, _ = step(asking(model="nowhere"), seen(channel()), NOW)
    _, action = step(state, seen(channel(), on_demand=None), NOW)
    assert isinstance(action, Refuse) and action.refusal.code == "model_not_loaded"
    assert "is not loaded" in action.refusal.message


def test_a_pinned_request_never_loads_on_demand():
    _, action = step(asking(pinned="z"), seen(channel()), NOW)
    assert isinstance(action, Refuse) and action.refusal.code == "model_not_loaded"


def test_a_caller_whose_group_turned_loads_on_demand_off_is_told_so_without_asking():
    no_loads = dataclasses.replace(BO_FREE, loads_on_demand=False)
    _, action = step(asking(no_loads, model="llama"), seen(channel()), NOW)
    assert isinstance(action, Refuse) and action.refusal.code == "model_not_loaded"
    assert action.refusal.message.endswith("your group does not load models on request")
