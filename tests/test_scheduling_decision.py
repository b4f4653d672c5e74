"""docs/scheduling.md as a table: one row per rule and per edge of a rule.

Loads used throughout (seconds): default A 100, B 300, C 30 (C is B's model
with another preset). Settings: minimum preload 180 s, switch buffer 60 s,
stop timeout 15 s. So B's preload window is max(300 + 60, 180) = 360 s, C's
is max(30 + 60, 180) = 180 s, a whole-card stop lead is 15 + 60 = 75 s, and
the short gap before B is 100 + 300 + 2 * 60 = 520 s.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from channels_app.scheduling.decision import (
    DecisionInput,
    OverrideFacts,
    SchedulingSettings,
    Slot,
    decide,
    decide_at,
    plan,
)
from slotserve_base.target import Target
from slotserve_base.vocabulary import Reason
from tests import clock

T0 = clock.T0 - timedelta(days=5) + timedelta(hours=4)  # Wednesday noon UTC
A = Target(1, 10)
B = Target(2, 20)
C = Target(2, 21)
LOADS = {A: 100.0, B: 300.0, C: 30.0}
HOUR = timedelta(hours=1)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def slot(id: int, start: datetime, end: datetime, target: Target | None, counts: bool = True) -> Slot:
    return Slot(id=id, start=start, end=end, target=target, counts=counts)


def inp(
    *,
    default: Target | None = A,
    slots: tuple[Slot, ...] = (),
    override: OverrideFacts | None = None,
    running: Target | None = A,
) -> DecisionInput:
    return DecisionInput(
        default=default,
        slots=slots,
        override=override,
        running=running,
        load_seconds=LOADS,
        settings=SchedulingSettings(
            min_preload_seconds=180, switch_buffer_seconds=60, stop_timeout_seconds=15
        ),
    )


CASES = [
    # (name, input, now, target, reason, valid_until, reservation)
    ("default, nothing booked", inp(), T0, A, Reason.DEFAULT, None, None),
    ("no default, nothing booked", inp(default=None, running=None), T0, None, Reason.IDLE, None, None),
    (
        "active model reservation",
        inp(slots=(slot(1, T0 - HOUR, T0 + HOUR, B),)),
        T0,
        B,
        Reason.ACTIVE_RESERVATION,
        T0 + HOUR,
        1,
    ),
    (
        "active reservation, exactly at its start",
        inp(slots=(slot(1, T0, T0 + HOUR, B),)),
        T0,
        B,
        Reason.ACTIVE_RESERVATION,
        T0 + HOUR,
        1,
    ),
    (
        "reservation exactly at its end is over",
        inp(slots=(slot(1, T0 - HOUR, T0, B),)),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
    (
        "active whole-card reservation stops the process",
        inp(slots=(slot(1, T0 - HOUR, T0 + HOUR, None),)),
        T0,
        None,
        Reason.ACTIVE_EXCLUSIVE,
        T0 + HOUR,
        1,
    ),
    (
        "preload: exactly at the window's start (load + 60 s = 360 s)",
        inp(slots=(slot(1, T0 + s(360), T0 + HOUR, B),)),
        T0,
        B,
        Reason.PRELOAD_NEXT,
        T0 + s(360),
        1,
    ),
    (
        "preload: one second before the window, default runs",
        inp(slots=(slot(1, T0 + s(361), T0 + HOUR, B),)),
        T0,
        A,
        Reason.DEFAULT,
        T0 + s(1),
        None,
    ),
    (
        "preload: minimum lead wins over a fast load (180 s > 30 + 60 s)",
        inp(slots=(slot(1, T0 + s(180), T0 + HOUR, C),)),
        T0,
        C,
        Reason.PRELOAD_NEXT,
        T0 + s(180),
        1,
    ),
    (
        "preload: one second before the minimum lead",
        inp(slots=(slot(1, T0 + s(181), T0 + HOUR, C),)),
        T0,
        A,
        Reason.DEFAULT,
        T0 + s(1),
        None,
    ),
    (
        "whole-card next: stop exactly 75 s before",
        inp(slots=(slot(1, T0 + s(75), T0 + HOUR, None),)),
        T0,
        None,
        Reason.STOP_FOR_EXCLUSIVE,
        T0 + s(75),
        1,
    ),
    (
        "whole-card next: 76 s before, default still runs",
        inp(slots=(slot(1, T0 + s(76), T0 + HOUR, None),)),
        T0,
        A,
        Reason.DEFAULT,
        T0 + s(1),
        None,
    ),
    (
        "short gap, default not running: skip it (500 s < 520 s)",
        inp(slots=(slot(1, T0 + s(500), T0 + HOUR, B),), running=None),
        T0,
        B,
        Reason.SKIP_DEFAULT_SHORT_GAP,
        T0 + s(500 - 360),
        1,
    ),
    (
        "short gap, default running: keep it until the preload window",
        inp(slots=(slot(1, T0 + s(500), T0 + HOUR, B),), running=A),
        T0,
        A,
        Reason.DEFAULT,
        T0 + s(140),
        None,
    ),
    (
        "short gap boundary: a gap of exactly 520 s is not short",
        inp(slots=(slot(1, T0 + s(520), T0 + HOUR, B),), running=None),
        T0,
        A,
        Reason.DEFAULT,
        T0,
        None,
    ),
    (
        "short gap before a whole-card reservation: stay stopped (200 s < 100 + 0 + 120)",
        inp(slots=(slot(1, T0 + s(200), T0 + HOUR, None),), running=None),
        T0,
        None,
        Reason.SKIP_DEFAULT_SHORT_GAP,
        T0 + s(200 - 75),
        1,
    ),
    (
        "no default: idle until the preload window",
        inp(default=None, running=None, slots=(slot(1, T0 + HOUR, T0 + 2 * HOUR, B),)),
        T0,
        None,
        Reason.IDLE,
        T0 + HOUR - s(360),
        None,
    ),
    (
        "override until a time",
        inp(override=OverrideFacts(C, until=T0 + HOUR, set_at=T0 - s(600)), running=C),
        T0,
        C,
        Reason.MANUAL_OVERRIDE,
        T0 + HOUR,
        None,
    ),
    (
        "override unload",
        inp(override=OverrideFacts(None, until=T0 + HOUR, set_at=T0 - s(600)), running=None),
        T0,
        None,
        Reason.MANUAL_UNLOAD,
        T0 + HOUR,
        None,
    ),
    (
        "override expired exactly at until",
        inp(override=OverrideFacts(C, until=T0, set_at=T0 - HOUR)),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
    (
        "override cut by the next reservation: ends where its short gap starts",
        inp(
            override=OverrideFacts(C, until=T0 + 3 * HOUR, set_at=T0 - s(60)),
            slots=(slot(1, T0 + 2 * HOUR, T0 + 3 * HOUR, B),),
            running=C,
        ),
        T0,
        C,
        Reason.MANUAL_OVERRIDE,
        T0 + 2 * HOUR - s(520),
        None,
    ),
    (
        "override ended by a reservation that started since it was set",
        inp(
            override=OverrideFacts(C, until=T0 + 5 * HOUR, set_at=T0 - 2 * HOUR),
            slots=(slot(1, T0 - HOUR, T0 - s(1800), B),),
        ),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
    (
        "override set during a reservation applies after it",
        inp(
            override=OverrideFacts(C, until=T0 + 5 * HOUR, set_at=T0 - s(1800)),
            slots=(slot(1, T0 - HOUR, T0 - s(60), B),),
            running=C,
        ),
        T0,
        C,
        Reason.MANUAL_OVERRIDE,
        T0 + 5 * HOUR,
        None,
    ),
    (
        "an active reservation beats an override",
        inp(
            override=OverrideFacts(C, until=T0 + 5 * HOUR, set_at=T0 - 2 * HOUR),
            slots=(slot(1, T0 - HOUR, T0 + HOUR, B),),
        ),
        T0,
        B,
        Reason.ACTIVE_RESERVATION,
        T0 + HOUR,
        1,
    ),
    (
        "preload beats an override",
        inp(
            override=OverrideFacts(C, until=T0 + 5 * HOUR, set_at=T0 - HOUR),
            slots=(slot(1, T0 + s(300), T0 + HOUR, B),),
            running=C,
        ),
        T0,
        B,
        Reason.PRELOAD_NEXT,
        T0 + s(300),
        1,
    ),
    (
        "pending reservation active now is ignored",
        inp(slots=(slot(1, T0 - HOUR, T0 + HOUR, B, counts=False),)),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
    (
        "pending reservation inside the preload window is ignored",
        inp(slots=(slot(1, T0 + s(60), T0 + HOUR, B, counts=False),)),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
    (
        "pending reservation does not cut an override",
        inp(
            override=OverrideFacts(C, until=T0 + HOUR, set_at=T0 - HOUR),
            slots=(slot(1, T0 - s(600), T0 + s(600), B, counts=False),),
            running=C,
        ),
        T0,
        C,
        Reason.MANUAL_OVERRIDE,
        T0 + HOUR,
        None,
    ),
    (
        "back to back, same model: the earlier holds to its end",
        inp(slots=(slot(1, T0 - HOUR, T0, B), slot(2, T0, T0 + HOUR, B))),
        T0 - s(1),
        B,
        Reason.ACTIVE_RESERVATION,
        T0,
        1,
    ),
    (
        "back to back, same model: the later takes over with the same target",
        inp(slots=(slot(1, T0 - HOUR, T0, B), slot(2, T0, T0 + HOUR, B))),
        T0,
        B,
        Reason.ACTIVE_RESERVATION,
        T0 + HOUR,
        2,
    ),
    (
        "back to back, different model: no preload before the earlier ends",
        inp(slots=(slot(1, T0 - HOUR, T0, B), slot(2, T0, T0 + HOUR, C))),
        T0 - s(1),
        B,
        Reason.ACTIVE_RESERVATION,
        T0,
        1,
    ),
    (
        "back to back, different model: the later loads at its start",
        inp(slots=(slot(1, T0 - HOUR, T0, B), slot(2, T0, T0 + HOUR, C))),
        T0,
        C,
        Reason.ACTIVE_RESERVATION,
        T0 + HOUR,
        2,
    ),
    (
        "a reservation ended early no longer holds the channel",
        inp(slots=(slot(1, T0 - HOUR, T0 - s(60), B),)),
        T0,
        A,
        Reason.DEFAULT,
        None,
        None,
    ),
]


@pytest.mark.parametrize(
    ("decision_input", "now", "target", "reason", "valid_until", "reservation"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decision(decision_input, now, target, reason, valid_until, reservation):
    decision = decide(decision_input, now)
    assert decision.target == target
    assert decision.reason == reason
    assert decision.valid_until == valid_until
    assert decision.reservation_id == reservation


def test_decision_holds_until_valid_until():
    """Just before ``valid_until`` the answer is the same; at it, it changes."""
    decision_input = inp(slots=(slot(1, T0 + 2 * HOUR, T0 + 3 * HOUR, B),))
    first = decide(decision_input, T0)
    assert first.valid_until == T0 + 2 * HOUR - s(360)
    assert decide(decision_input, first.valid_until - s(1)).target == first.target
    assert decide(decision_input, first.valid_until).target == B


def test_missing_load_estimate_is_named():
    decision_input = DecisionInput(
        default=A, slots=(slot(1, T0 + HOUR, T0 + 2 * HOUR, B),), load_seconds={A: 1}
    )
    with pytest.raises(KeyError, match="no load estimate"):
        decide(decision_input, T0)


def test_plan_of_a_day_with_a_short_gap():
    """Default, preload B, B, a short gap skipped straight to C, C, back to the default."""
    day = inp(
        slots=(
            slot(1, T0 + HOUR, T0 + 2 * HOUR, B),
            slot(2, T0 + 2 * HOUR + s(300), T0 + 3 * HOUR, C),
        )
    )
    segments = plan(day, T0, T0 + 4 * HOUR)
    assert [(x.start, x.end, x.target, x.reason) for x in segments] == [
        (T0, T0 + HOUR - s(360), A, Reason.DEFAULT),
        (T0 + HOUR - s(360), T0 + HOUR, B, Reason.PRELOAD_NEXT),
        (T0 + HOUR, T0 + 2 * HOUR, B, Reason.ACTIVE_RESERVATION),
        # The 300 s gap to C is not short (100 + 30 + 120 = 250 s), so the
        # default loads, and runs until C's preload window (180 s) opens.
        (T0 + 2 * HOUR, T0 + 2 * HOUR + s(120), A, Reason.DEFAULT),
        (T0 + 2 * HOUR + s(120), T0 + 2 * HOUR + s(300), C, Reason.PRELOAD_NEXT),
        (T0 + 2 * HOUR + s(300), T0 + 3 * HOUR, C, Reason.ACTIVE_RESERVATION),
        (T0 + 3 * HOUR, T0 + 4 * HOUR, A, Reason.DEFAULT),
    ]


def test_plan_skips_the_default_when_the_gap_is_short():
    day = inp(
        slots=(
            slot(1, T0, T0 + HOUR, C),
            slot(2, T0 + HOUR + s(400), T0 + 2 * HOUR, B),
        ),
        running=C,
    )
    segments = plan(day, T0, T0 + 2 * HOUR)
    assert [(x.target, x.reason) for x in segments] == [
        (C, Reason.ACTIVE_RESERVATION),
        (B, Reason.SKIP_DEFAULT_SHORT_GAP),
        (B, Reason.PRELOAD_NEXT),
        (B, Reason.ACTIVE_RESERVATION),
    ]
    assert segments[1].start == T0 + HOUR
    assert segments[2].start == T0 + HOUR + s(400) - s(360)


def test_decide_at_a_future_moment_uses_what_the_plan_runs():
    """At T0 the channel runs nothing; by T0 + 1 h the plan has the default running,
    so the short-gap rule no longer applies then."""
    decision_input = inp(slots=(slot(1, T0 + HOUR + s(500), T0 + 2 * HOUR, B),), running=None)
    later = decide_at(decision_input, T0, T0 + HOUR)
    assert later.target == A
    assert later.reason == Reason.DEFAULT
    assert later.valid_until == T0 + HOUR + s(500) - s(360)
