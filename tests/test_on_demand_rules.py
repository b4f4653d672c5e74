"""docs/scheduling.md, "Loaded on demand": the decision's rule 5 and the choice of a channel, as
the pure functions they are."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from channels_app.placement.chains import Candidate, Need
from channels_app.placement.on_demand import OnDemandChannel, on_demand_placement
from channels_app.scheduling.decision import (
    DecisionInput,
    OnDemandFacts,
    OverrideFacts,
    Slot,
    decide,
)
from slotserve_base.target import Target
from slotserve_base.vocabulary import Reason

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
DEFAULT = Target(1, None)
ASKED = Target(2, None)
BOOKED = Target(3, None)
GiB = 2**30
LOADS = {DEFAULT: 20.0, ASKED: 30.0, BOOKED: 40.0}


def inputs(**changes) -> DecisionInput:
    base = DecisionInput(default=DEFAULT, running=DEFAULT, load_seconds=LOADS)
    return dataclasses.replace(base, **changes)


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def test_a_load_on_demand_is_the_target_until_the_next_booking_claims_the_channel() -> None:
    slot = Slot(7, at(60), at(120), BOOKED)
    inp = inputs(on_demand=OnDemandFacts(ASKED, NOW), running=ASKED, slots=(slot,))
    decision = decide(inp, NOW)
    assert (decision.target, decision.reason) == (ASKED, Reason.ON_DEMAND)
    # It holds until rule 2 or 3 claims the channel for the booking: the preload comes on time.
    assert decision.valid_until is not None and decision.valid_until < slot.start
    at_takeover = decide(inp, decision.valid_until)
    assert at_takeover.target == BOOKED and at_takeover.reason in (
        Reason.PRELOAD_NEXT,
        Reason.SKIP_DEFAULT_SHORT_GAP,
    )


def test_a_booking_that_started_since_ends_the_load_for_good() -> None:
    slot = Slot(7, at(10), at(20), BOOKED)
    inp = inputs(on_demand=OnDemandFacts(ASKED, NOW), slots=(slot,))
    assert decide(inp, at(15)).reason == Reason.ACTIVE_RESERVATION
    after = decide(dataclasses.replace(inp, running=BOOKED), at(25))
    assert (after.target, after.reason) == (DEFAULT, Reason.DEFAULT)


def test_an_override_and_a_booking_come_before_a_load_on_demand() -> None:
    override = OverrideFacts(BOOKED, at(30), NOW - timedelta(minutes=1))
    inp = inputs(on_demand=OnDemandFacts(ASKED, NOW), override=override)
    assert decide(inp, NOW).reason == Reason.MANUAL_OVERRIDE
    active = inputs(
        on_demand=OnDemandFacts(ASKED, NOW - timedelta(minutes=5)), slots=(Slot(7, NOW, at(9), BOOKED),)
    )
    assert decide(active, NOW).reason == Reason.ACTIVE_RESERVATION


def candidate(name: str, channel_id: int, **changes) -> Candidate:
    base = Candidate(
        id=channel_id,
        name=name,
        node="n1",
        node_ready=True,
        labels={},
        backends=frozenset({"llama.cpp"}),
        file_present=True,
        vram_bytes=24 * GiB,
        free_at_time=True,
    )
    return dataclasses.replace(base, **changes)


WANT = Need(model="asked", backend="llama.cpp", target=ASKED, labels={}, need_bytes=8 * GiB)


def channel(name: str, channel_id: int, *, inp: DecisionInput | None = None, **changes) -> OnDemandChannel:
    facts = {"serves_on_demand": True, "admits_caller": True, "load_seconds": 30.0, "default_in_flight": 0}
    candidate_changes = {k: v for k, v in changes.items() if k not in facts}
    facts.update({k: v for k, v in changes.items() if k in facts})
    return OnDemandChannel(
        candidate=candidate(name, channel_id, **candidate_changes),
        decision_input=inp or inputs(),
        **facts,
    )


@pytest.mark.parametrize(
    ("made", "rule", "why"),
    [
        (channel("a", 1, serves_on_demand=False), "opted_out", "does not serve on demand"),
        (channel("a", 1, admits_caller=False), "caller", "not yours to use"),
        (channel("a", 1, inp=inputs(slots=(Slot(7, NOW, at(30), BOOKED),))), "held", "booked now"),
        (
            channel("a", 1, inp=inputs(slots=(Slot(7, at(2), at(30), BOOKED),))),
            "held",
            "preloading the next booking",
        ),
        (
            channel("a", 1, inp=inputs(override=OverrideFacts(BOOKED, at(30), NOW))),
            "held",
            "held by an admin's override",
        ),
        (
            channel("a", 1, inp=inputs(on_demand=OnDemandFacts(BOOKED, NOW))),
            "held",
            "runs another model loaded on demand",
        ),
        # Free of preloads now, but the next booking's preload would begin within the load + stay.
        (channel("a", 1, inp=inputs(slots=(Slot(7, at(12), at(30), BOOKED),))), "soon", "booked from"),
        (channel("a", 1, default_in_flight=2), "busy", "its default serves 2 request(s) now"),
        (channel("a", 1, vram_bytes=4 * GiB), "memory", "too little GPU memory"),
    ],
)
def test_each_rule_keeps_a_load_off_a_channel_and_says_why(
    made: OnDemandChannel, rule: str, why: str
) -> None:
    placed = on_demand_placement([made], WANT, now=NOW, min_stay_seconds=600)
    assert placed.ranked == []
    assert list(placed.removed) == [rule]
    assert placed.removed[rule][0][1].startswith(why)
    assert placed.message.startswith("0/1 channels: 1 ")


def test_a_channel_free_long_enough_is_chosen_and_the_message_counts_the_others() -> None:
    soon = inputs(slots=(Slot(7, at(12), at(30), BOOKED),))
    later = inputs(slots=(Slot(8, at(60), at(90), BOOKED),))
    channels = [
        channel("a", 1, inp=soon),
        channel("b", 2, inp=later),
        channel("c", 3, serves_on_demand=False),
    ]
    placed = on_demand_placement(channels, WANT, now=NOW, min_stay_seconds=600)
    assert [s.candidate.name for s in placed.ranked] == ["b"]
    assert set(placed.removed) == {"soon", "opted_out"}
    nothing = on_demand_placement(channels[:1] + channels[2:], WANT, now=NOW, min_stay_seconds=600)
    assert nothing.message == "0/2 channels: 1 does not serve on demand, 1 is booked too soon"


def test_the_minimum_stay_decides_how_soon_a_booking_may_follow() -> None:
    # The next booking's takeover lies 20 minutes away: a 30 s load and 10 minutes' stay fit,
    # 30 minutes' stay does not.
    far = inputs(slots=(Slot(7, at(26), at(40), BOOKED),))
    assert on_demand_placement([channel("a", 1, inp=far)], WANT, now=NOW, min_stay_seconds=600).ranked
    assert not on_demand_placement([channel("a", 1, inp=far)], WANT, now=NOW, min_stay_seconds=1800).ranked
