"""The access table (docs/gateway.md) as tables: who may call a channel, and which channel
serves a request."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gateway.rules.access import Booking, ChannelView, admit, models_for, route

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
ANA, BO = 1, 2


def channel(name: str = "a", **changes) -> ChannelView:
    base = ChannelView(
        id=1 if name == "a" else 2,
        name=name,
        phase="ready",
        model="qwen",
        upstream="http://127.0.0.1:9",
        since=NOW - timedelta(seconds=10),
        load_seconds=40,
        next_load_seconds=60,
        drain_seconds=30,
        switching=False,
        stop_seconds=15,
        node="n1",
    )
    return dataclasses.replace(base, **changes)


BOOKED = Booking(reservation_id=7, user_id=ANA, exclusive=False, end=NOW + timedelta(hours=1))
WHOLE = dataclasses.replace(BOOKED, exclusive=True)

ACCESS = [
    # (situation, channel, caller, expected (status, code, retry_after) or None for allowed)
    ("not reserved: the booker", channel(), ANA, None),
    ("not reserved: anyone else", channel(), BO, None),
    ("active reservation, ready: the booker", channel(booking=BOOKED), ANA, None),
    ("active reservation, ready: anyone else", channel(booking=BOOKED), BO, (403, "gpu_reserved", None)),
    (
        "active, still loading: the booker",
        channel(booking=BOOKED, phase="loading"),
        ANA,
        (503, "model_loading", 35),  # 30 s left of a 40 s estimate, + 4 s + 1 s
    ),
    (
        "active, still loading: anyone else",
        channel(booking=BOOKED, phase="loading"),
        BO,
        (403, "gpu_reserved", None),
    ),
    (
        "active whole-card: the booker",
        channel(booking=WHOLE, phase="stopped"),
        ANA,
        (503, "gpu_exclusive", 3600),
    ),
    (
        "active whole-card: anyone else",
        channel(booking=WHOLE, phase="stopped"),
        BO,
        (403, "gpu_reserved", None),
    ),
    # Retry-After is never shorter than the real wait: the remaining drain, the stop grace (15 s)
    # and the next load (60 s), with a margin of a tenth of the load and a second.
    ("switching (gate closed): the booker", channel(switching=True), ANA, (503, "model_switching", 112)),
    ("switching (gate closed): anyone else", channel(switching=True), BO, (503, "model_switching", 112)),
    ("draining for 10 s of 30: anyone", channel(phase="draining"), BO, (503, "model_switching", 102)),
    ("stopping: anyone", channel(phase="stopping"), BO, (503, "model_switching", 82)),
    (
        # The seed's answer for a booked model that failed: until the next try, plus its load.
        "the booked model failed, next try in 5 min: the booker",
        channel(
            booking=BOOKED,
            phase="failed",
            model=None,
            upstream=None,
            targets_model="qwen",
            retry_at=NOW + timedelta(minutes=5),
        ),
        ANA,
        (503, "model_loading", 300 + 60 + 7),
    ),
    (
        # The decision names a model the process does not run yet (a new channel or default, a
        # whole-card booking just over, the node worker not yet acting): it is loading.
        "the decision names qwen, nothing runs yet: anyone",
        channel(phase="stopped", model=None, upstream=None, targets_model="qwen"),
        BO,
        (503, "model_loading", 60 + 7),
    ),
    (
        "the booked model is about to load: the booker",
        channel(booking=BOOKED, phase="stopped", model=None, upstream=None, targets_model="qwen"),
        ANA,
        (503, "model_loading", 60 + 7),
    ),
    (
        # A back-to-back boundary: ana's slot began, the channel still runs the last booking's
        # model until the node worker acts; she is told it switches (drain, stop, her load).
        "the booker's slot began, another target still runs: the booker",
        channel(booking=dataclasses.replace(BOOKED, target=(1, 5)), running=(2, None)),
        ANA,
        (503, "model_switching", 112),
    ),
    (
        "the booker's own target runs: the booker",
        channel(booking=dataclasses.replace(BOOKED, target=(1, 5)), running=(1, 5)),
        ANA,
        None,
    ),
    (
        "the booked model failed, the default serves the booking meanwhile: the booker",
        channel(booking=dataclasses.replace(BOOKED, target=(1, 5)), running=(2, None), fallback=True),
        ANA,
        None,
    ),
    (
        "nothing runs",
        channel(phase="stopped", model=None, upstream=None),
        BO,
        (404, "model_not_loaded", None),
    ),
    (
        # A node whose worker never reported (or stopped reporting) loads nothing a caller can
        # wait for: not "about to load".
        "the decision names qwen, its node is not ready: anyone",
        channel(phase="stopped", model=None, upstream=None, targets_model="qwen", node_ready=False),
        BO,
        (503, "node_not_ready", None),
    ),
    (
        "loading when its node stopped reporting: the booker",
        channel(booking=BOOKED, phase="loading", node_ready=False),
        ANA,
        (503, "node_not_ready", None),
    ),
    (
        "ready, its node's heartbeat late: the process still serves",
        channel(node_ready=False),
        BO,
        None,
    ),
]


@pytest.mark.parametrize(("view", "caller", "expected"), [c[1:] for c in ACCESS], ids=[c[0] for c in ACCESS])
def test_access_table(view, caller, expected):
    refusal = admit(caller_id=caller, channel=view, now=NOW)
    got = None if refusal is None else (refusal.status, refusal.code, refusal.retry_after)
    assert got == expected


def test_routing_prefers_the_callers_reservation():
    mine = channel("b", model="llama", booking=BOOKED)
    chosen = route(
        caller_id=ANA, model="qwen", pinned=None, channels=[channel("a"), mine], in_flight={}, now=NOW
    )
    assert chosen.channel is mine and chosen.refusal is None


def test_routing_by_model_fewest_in_flight_then_name():
    a, b = channel("a"), channel("b")
    assert (
        route(
            caller_id=BO, model="qwen", pinned=None, channels=[a, b], in_flight={1: 3, 2: 1}, now=NOW
        ).channel
        is b
    )
    assert route(caller_id=BO, model="qwen", pinned=None, channels=[b, a], in_flight={}, now=NOW).channel is a


def test_routing_skips_channels_reserved_by_others():
    reserved, free = channel("a", booking=BOOKED), channel("b")
    assert (
        route(
            caller_id=BO, model="qwen", pinned=None, channels=[reserved, free], in_flight={}, now=NOW
        ).channel
        is free
    )
    alone = route(caller_id=BO, model="qwen", pinned=None, channels=[reserved], in_flight={}, now=NOW)
    assert alone.refusal is not None and alone.refusal.code == "gpu_reserved"


def test_pinned_channel():
    a, b = channel("a"), channel("b", model="llama")
    assert (
        route(caller_id=BO, model="whatever", pinned="b", channels=[a, b], in_flight={}, now=NOW).channel is b
    )
    missing = route(caller_id=BO, model="qwen", pinned="zz", channels=[a, b], in_flight={}, now=NOW)
    assert (
        missing.refusal is not None
        and missing.refusal.status == 404
        and "no channel named 'zz'" in (missing.refusal.message)
    )


def test_nothing_matches_lists_what_is_loaded_where():
    chosen = route(
        caller_id=BO,
        model="mistral",
        pinned=None,
        channels=[channel("a"), channel("b", model="llama")],
        in_flight={},
        now=NOW,
    )
    assert chosen.refusal is not None
    assert (chosen.refusal.status, chosen.refusal.code) == (404, "model_not_loaded")
    assert chosen.refusal.message == "model 'mistral' is not loaded; loaded now: qwen on a, llama on b"


def test_nothing_matches_lists_only_what_the_caller_may_use():
    """A channel someone else booked (not lent) is not the caller's to use: its model is not
    offered to them as loaded."""
    views = [channel("a", booking=BOOKED), channel("b", model="llama")]
    chosen = route(caller_id=BO, model="mistral", pinned=None, channels=views, in_flight={}, now=NOW)
    assert chosen.refusal is not None
    assert chosen.refusal.message == "model 'mistral' is not loaded; loaded now: llama on b"
    pinned = route(caller_id=BO, model="mistral", pinned="c", channels=views, in_flight={}, now=NOW)
    assert pinned.refusal is not None and pinned.refusal.message.endswith("loaded now: llama on b")


def test_a_model_still_loading_answers_503_with_retry_after():
    loading = channel("a", phase="loading", since=NOW - timedelta(seconds=15))
    chosen = route(caller_id=BO, model="qwen", pinned=None, channels=[loading], in_flight={}, now=NOW)
    assert chosen.refusal is not None
    assert (chosen.refusal.code, chosen.refusal.retry_after) == ("model_loading", 30)  # 25 + 4 + 1


def test_models_lists_what_the_caller_can_use():
    views = [channel("a", booking=BOOKED), channel("b", model="llama"), channel("c", phase="loading")]
    assert models_for(caller_id=ANA, channels=views, now=NOW) == [("llama", "b"), ("qwen", "a")]
    assert models_for(caller_id=BO, channels=views, now=NOW) == [("llama", "b")]


def test_a_model_loaded_only_where_someone_else_booked_is_403_naming_the_channel_and_until():
    """Not '404 not loaded; loaded now: qwen on a'; and where another channel is about to load
    it for everyone, that is the more useful answer (the caller may wait for it)."""
    reserved = channel("a", booking=BOOKED)
    later = dataclasses.replace(BOOKED, end=NOW + timedelta(hours=3))
    also = dataclasses.replace(channel("c", booking=later), id=3)
    chosen = route(caller_id=BO, model="qwen", pinned=None, channels=[also, reserved], in_flight={}, now=NOW)
    assert chosen.refusal is not None
    assert (chosen.refusal.status, chosen.refusal.code) == (403, "gpu_reserved")
    assert chosen.refusal.message == (
        "channel a is reserved by someone else until Mon 7 Dec 09:00 UTC (2026-12-07T09:00:00Z)"
    )
    # In the caller's own zone (their profile's), the instant beside it.
    berlin = route(
        caller_id=BO,
        model="qwen",
        pinned=None,
        channels=[also, reserved],
        in_flight={},
        now=NOW,
        zone=ZoneInfo("Europe/Berlin"),
    )
    assert berlin.refusal is not None
    assert berlin.refusal.message == (
        "channel a is reserved by someone else until Mon 7 Dec 10:00 CET (2026-12-07T09:00:00Z)"
    )
    idle = channel("b", phase="stopped", model=None, upstream=None, targets_model="qwen")
    chosen = route(
        caller_id=BO, model="qwen", pinned=None, channels=[also, idle, reserved], in_flight={}, now=NOW
    )
    assert chosen.refusal is not None
    assert (chosen.refusal.status, chosen.refusal.code) == (503, "model_loading")
    assert chosen.refusal.message == "channel b is about to load qwen"


def test_the_channel_index_chooses_as_route_does_without_looking_through_every_channel():
    """``ChannelIndex.only_choice`` (the fast lane's look-up, made once per snapshot) names a
    channel only where ``route`` over all channels would choose that very channel; it leaves
    the rest (no ready channel, a choice among several) to ``route``."""
    import random

    from gateway.rules.channel_index import ChannelIndex

    rng = random.Random(7)
    cy = 3
    bookings = [None, BOOKED, WHOLE, dataclasses.replace(BOOKED, user_id=BO)]
    checked = chosen = 0
    for _ in range(3000):
        channels = tuple(
            channel(
                name=f"c{n}",
                id=n,
                phase=rng.choice(["ready", "ready", "loading", "draining", "stopped", "failed"]),
                model=rng.choice(["qwen", "llama", None]),
                booking=rng.choice(bookings),
                switching=rng.random() < 0.1,
            )
            for n in range(rng.randint(1, 5))
        )
        index = ChannelIndex.of(channels)
        for caller in (ANA, BO, cy):
            for model in ("qwen", "llama", "mistral", None):
                full = route(
                    caller_id=caller, model=model, pinned=None, channels=channels, in_flight={}, now=NOW
                )
                choice = index.only_choice(caller, model)
                checked += 1
                if choice is None:
                    continue
                refusal = admit(caller_id=caller, channel=choice, now=NOW)
                assert (refusal is None) == (full.refusal is None), (caller, model, channels)
                if refusal is None:  # what the lane takes
                    chosen += 1
                    assert full.channel is choice, (caller, model, channels)

    assert chosen > 1000, f"the worlds give the lane something to take ({chosen} of {checked})"

    ready = channel(name="a", id=1)
    other = channel(name="b", id=2)
    mine = channel(name="c", id=3, model="llama", booking=BOOKED)
    assert ChannelIndex.of((ready,)).only_choice(BO, "qwen") is ready
    assert ChannelIndex.of((ready, other)).only_choice(BO, "qwen") is None, "two ready: by requests in flight"
    assert ChannelIndex.of((ready, mine)).only_choice(ANA, "qwen") is mine, "the booker's own channel first"
    assert ChannelIndex.of((ready, mine)).only_choice(BO, "qwen") is ready
    assert ChannelIndex.of((ready,)).only_choice(BO, "llama") is None
    assert ChannelIndex.of((channel(phase="loading"),)).only_choice(BO, "qwen") is None


def test_a_channel_on_a_node_that_never_reported_does_not_hide_the_403_naming_the_slot():
    """A second channel was added on a node whose worker never started, with the default model
    qwen; during ana's slot on a, bo asked for qwen. The answer is the 403 naming ana's slot,
    not 503 "about to load" on a channel nothing will load."""
    never = channel("b", phase="stopped", model=None, upstream=None, targets_model="qwen", node_ready=False)
    chosen = route(
        caller_id=BO,
        model="qwen",
        pinned=None,
        channels=[channel("a", booking=BOOKED), never],
        in_flight={},
        now=NOW,
    )
    assert chosen.refusal is not None
    assert (chosen.refusal.status, chosen.refusal.code) == (403, "gpu_reserved")
    # Alone, the never-ready channel says what is wrong and where.
    alone = route(caller_id=BO, model="qwen", pinned=None, channels=[never], in_flight={}, now=NOW)
    assert alone.refusal is not None
    assert (alone.refusal.status, alone.refusal.code) == (503, "node_not_ready")
    assert alone.refusal.message == (
        "channel b cannot load qwen: its node n1 is not ready (its node worker is not reporting)"
    )


def test_a_process_that_died_while_serving_is_not_said_to_have_failed_to_load():
    """kill -9 of a ready process: callers read that it stopped and starts again, not that it
    failed to load (it loaded; it crashed while serving)."""
    died = channel(
        phase="failed",
        model=None,
        upstream=None,
        targets_model="qwen",
        retry_at=NOW + timedelta(seconds=30),
        crashed=True,
    )
    refusal = admit(caller_id=BO, channel=died, now=NOW)
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.retry_after) == (503, "model_loading", 30 + 60 + 7)
    assert refusal.message == "channel a stopped unexpectedly while serving qwen and starts it again in 30 s"
    never_loaded = admit(caller_id=BO, channel=dataclasses.replace(died, crashed=False), now=NOW)
    assert never_loaded is not None
    assert never_loaded.message == "channel a failed to load qwen and tries again in 30 s"


def test_a_slot_that_begins_between_two_snapshots_is_kept_from_its_first_moment():
    """A snapshot lives up to a second: the booking that starts within its life is in it, and
    from the slot's first moment only the booker is let in (a lab's week under faults saw
    others answered 0.04-0.45 s into a slot)."""
    ahead = dataclasses.replace(BOOKED, start=NOW + timedelta(seconds=0.5))
    soon = channel(upcoming=ahead)
    before, after = NOW + timedelta(seconds=0.4), NOW + timedelta(seconds=0.6)
    assert admit(caller_id=BO, channel=soon, now=before) is None
    refused = admit(caller_id=BO, channel=soon, now=after)
    assert refused is not None and refused.code == "gpu_reserved"
    routed = route(caller_id=BO, model="qwen", pinned=None, channels=[soon], in_flight={}, now=after)
    assert routed.refusal is not None and routed.refusal.code == "gpu_reserved"
    mine = route(caller_id=ANA, model="llama", pinned=None, channels=[soon], in_flight={}, now=after)
    assert mine.channel is not None and mine.channel.booking == ahead, "her own channel, as booked"
    # The fast lane's index leaves such a channel to route, which looks at the time.
    from gateway.rules.channel_index import ChannelIndex

    index = ChannelIndex.of([soon])
    assert index.only_choice(BO, "qwen") is None and index.only_choice(ANA, "qwen") is None
    # A slot that ended between two snapshots frees the channel at once.
    ended = channel(booking=dataclasses.replace(BOOKED, end=NOW + timedelta(seconds=0.5)))
    assert admit(caller_id=BO, channel=ended, now=after) is None
    assert models_for(caller_id=BO, channels=[soon], now=after) == []
