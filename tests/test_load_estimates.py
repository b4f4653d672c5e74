"""docs/scheduling.md: the load-time estimate."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from channels_app.models import StoryEntry
from channels_app.scheduling.load_estimates import Basis, LoadHistory, estimate_load, read_speed_mbps
from channels_app.scheduling.selectors import load_estimate_details, load_estimates
from channels_app.scheduling.services import decide_channels
from slotserve_base.target import Target
from tests import factories

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("history", "mbps", "expected", "basis"),
    [
        (LoadHistory(), 200, 15.0, Basis.DISK_SETTING),
        (LoadHistory(size_bytes=2_000_000_000), 200, 2_000_000_000 / 200_000_000 + 15, Basis.DISK_SETTING),
        (LoadHistory(size_bytes=4_000_000_000), 100, 55.0, Basis.DISK_SETTING),
        (LoadHistory(size_bytes=4_000_000_000, preset_here=(12.0,)), 100, 12.0, Basis.PRESET_HERE),
        (LoadHistory(size_bytes=4_000_000_000, preset_here=(10.0, 20.0)), 100, 15.0, Basis.PRESET_HERE),
        # Only the last five successful loads count (newest first).
        (LoadHistory(preset_here=(1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 100.0)), 200, 3.0, Basis.PRESET_HERE),
        # A preset never loaded here: the slowest of what comes nearest, not its mean.
        (LoadHistory(model_here=(10.0, 14.0, 12.0), preset_elsewhere=(50.0,)), 200, 14.0, Basis.MODEL_HERE),
        (
            LoadHistory(preset_elsewhere=(20.0, 30.0), model_elsewhere=(99.0,)),
            200,
            30.0,
            Basis.PRESET_ELSEWHERE,
        ),
        (LoadHistory(size_bytes=10**9, model_elsewhere=(40.0, 35.0)), 200, 40.0, Basis.MODEL_ELSEWHERE),
        # The node's own read speed before the setting.
        (LoadHistory(size_bytes=4_000_000_000, node_read_mbps=400.0), 100, 25.0, Basis.NODE_READ_SPEED),
    ],
    ids=[
        "empty file",
        "2 GB at 200 MB/s",
        "4 GB at 100 MB/s",
        "one load",
        "two loads",
        "last five only",
        "the model's slowest load here",
        "the preset's slowest load elsewhere",
        "the model's slowest load elsewhere",
        "the node's measured speed",
    ],
)
def test_estimate(history, mbps, expected, basis):
    estimate = estimate_load(history, disk_read_mbps=mbps)
    assert (estimate.seconds, estimate.basis, estimate.margin_seconds) == (
        pytest.approx(expected),
        basis,
        0.0,
    )


def test_the_margin_is_the_largest_miss_of_the_nodes_last_twenty_loads():
    # Loads that took less than planned teach nothing; the largest shortfall is the margin.
    history = LoadHistory(preset_here=(30.0,), node_shortfalls=(-3.0, 1.5, 4.0, -10.0, 2.0))
    estimate = estimate_load(history, disk_read_mbps=200)
    assert (estimate.seconds, estimate.margin_seconds, estimate.unmargined_seconds) == (34.0, 4.0, 30.0)
    # A miss older than the node's last twenty loads is forgotten.
    old_miss = LoadHistory(preset_here=(30.0,), node_shortfalls=(0.5,) * 20 + (60.0,))
    assert estimate_load(old_miss, disk_read_mbps=200).margin_seconds == 0.5


def test_a_nodes_read_speed_is_the_fastest_of_its_loads_of_large_files():
    assert read_speed_mbps([]) is None
    assert read_speed_mbps([(5_000_000, 0.5)]) is None  # a small file's load is mostly start-up
    assert read_speed_mbps([(2_000_000_000, 10.0), (4_000_000_000, 10.0), (10**9, 20.0)]) == 400.0


@pytest.mark.django_db
def test_the_estimate_shown_is_the_one_the_scheduler_uses_per_preset_and_node(staff_api):
    """Seed 000: loads with a preset count (not '65 s' after loads of 400, 500 and 600 s); a preset
    that never loaded on a node is estimated by the slowest of the model's recent loads there, and
    a node that never loaded the model by the slowest of its loads elsewhere."""
    model = factories.llm("big", size=10 * 10**9)  # 50 s of reading at 200 MB/s + 15 s
    tuned, fresh = factories.preset(model, "tuned", "-c 4096"), factories.preset(model, "fresh", "-c 8192")
    here, there = factories.node("here"), factories.node("there")
    factories.node("empty")
    channel = factories.channel("ch", on=here)
    for i, seconds in enumerate((400, 500, 600)):
        factories.load(tuned, channel, started=T0 + timedelta(hours=i), seconds=seconds)
    other = factories.llm("other", size=10**9)  # never loaded anywhere: its file's size at the setting

    scheduler = load_estimate_details(
        [
            (here.pk, Target(model.pk, tuned.pk)),
            (here.pk, Target(model.pk, fresh.pk)),
            (there.pk, Target(model.pk, fresh.pk)),
            (there.pk, Target(model.pk, tuned.pk)),
        ]
    )
    said = {(node, target.preset_id): (e.seconds, e.basis) for (node, target), e in scheduler.items()}
    assert said[(here.pk, tuned.pk)] == (500, Basis.PRESET_HERE)
    assert said[(here.pk, fresh.pk)] == (600, Basis.MODEL_HERE)
    assert said[(there.pk, fresh.pk)] == (600, Basis.MODEL_ELSEWHERE)
    assert said[(there.pk, tuned.pk)] == (600, Basis.PRESET_ELSEWHERE)

    shown = staff_api.get(f"/api/models/{model.pk}/").data
    assert shown["estimated_load_seconds"] == 600  # the slowest, no longer blind to presets
    table = {(e["preset"], e["node"]): e["seconds"] for e in shown["load_estimates"]}
    bases = {(e["preset"], e["node"]): (e["basis"], e["margin_seconds"]) for e in shown["load_estimates"]}
    assert bases[(tuned.pk, "here")] == ("preset_here", 0.0)
    assert bases[(fresh.pk, "there")] == ("model_elsewhere", 0.0)
    assert table[(tuned.pk, "here")] == 500 and table[(fresh.pk, "here")] == 600
    assert table[(tuned.pk, "there")] == 600 and table[(None, "empty")] == 600
    # "here" read the 10 GB file in 400 s at best: 25 MB/s, its measured speed; others use the setting.
    others = staff_api.get(f"/api/models/{other.pk}/").data["load_estimates"]
    expected = {"here": 10**9 / 25e6 + 15, "there": 20.0, "empty": 20.0}
    assert {e["node"]: e["seconds"] for e in others} == expected


@pytest.mark.django_db
def test_a_node_that_loads_slower_than_planned_learns_a_margin_and_its_story_says_so(staff_api):
    """A preset never loaded on a node took longer than planned (the chaos week's misses, 1.3–5.1 s):
    the node's next estimates carry that shortfall, and the scheduler's story names the basis."""
    model = factories.llm("m", size=10**9)
    usual, odd = factories.preset(model, "usual", "-c 512"), factories.preset(model, "odd", "-c 4096")
    channel = factories.channel("ch", on=factories.node("n"))
    factories.load(usual, channel, started=T0, seconds=10.0, estimated=12.0)  # quicker than planned
    planned = (channel.node_id, Target(model.pk, odd.pk))
    before = load_estimates([planned])[planned]
    assert before == 10.0  # the model's only load here
    factories.load(odd, channel, started=T0 + timedelta(minutes=5), seconds=14.5, estimated=before)

    [estimate] = load_estimate_details([(channel.node_id, Target(model.pk, usual.pk))]).values()
    assert (estimate.seconds, estimate.basis, estimate.margin_seconds) == (14.5, Basis.PRESET_HERE, 4.5)

    start = timezone.now() + timedelta(seconds=60)
    booking = factories.reservation(
        owner=factories.user("ana"), on=channel, start=start, end=start + timedelta(hours=1), target=usual
    )
    decide_channels(now=timezone.now())
    decided = StoryEntry.objects.get(channel=channel, kind="decided", data__booking_id=booking.pk)
    assert (decided.data["load_basis"], decided.data["load_margin"]) == ("preset_here", 4.5)
    told = staff_api.get(f"/api/channels/{channel.pk}/story?booking={booking.pk}").data
    said = " ".join(line["words"] for line in told["lines"])
    assert "loads in about 14 s here (from its last loads on this node, with 4 s of margin learnt" in said
    assert "(from its last loads on this node, with 4 s of margin" in told["booking"]["verdict"]
