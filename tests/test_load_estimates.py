"""docs/scheduling.md: the load-time estimate."""

import pytest

from channels_app.scheduling.load_estimates import estimate_load_seconds


@pytest.mark.parametrize(
    ("recent", "size_bytes", "mbps", "expected"),
    [
        ((), 0, 200, 15.0),
        ((), 2_000_000_000, 200, 2_000_000_000 / 200_000_000 + 15),
        ((), 4_000_000_000, 100, 55.0),
        ((12.0,), 4_000_000_000, 100, 12.0),
        ((10.0, 20.0), 4_000_000_000, 100, 15.0),
        # Only the last five successful loads count (newest first).
        ((1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 100.0), 0, 200, 3.0),
    ],
    ids=["empty file", "2 GB at 200 MB/s", "4 GB at 100 MB/s", "one load", "two loads", "last five only"],
)
def test_estimate(recent, size_bytes, mbps, expected):
    assert estimate_load_seconds(recent_load_seconds=recent, size_bytes=size_bytes, disk_read_mbps=mbps) == (
        pytest.approx(expected)
    )


@pytest.mark.django_db
def test_the_estimate_shown_is_the_one_the_scheduler_uses_per_preset_and_node(staff_api):
    """Seed 000: loads with a preset count (not '65 s' after loads of 400, 500 and 600 s), and a
    preset that never loaded on a node is estimated by the model's recent loads there."""
    from datetime import UTC, datetime, timedelta

    from channels_app.scheduling.selectors import load_estimates
    from slotserve_base.target import Target
    from tests import factories

    model = factories.llm("big", size=10 * 10**9)  # 50 s of reading at 200 MB/s + 15 s
    tuned, fresh = factories.preset(model, "tuned", "-c 4096"), factories.preset(model, "fresh", "-c 8192")
    here, there = factories.node("here"), factories.node("there")
    channel = factories.channel("ch", on=here)
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    for i, seconds in enumerate((400, 500, 600)):
        factories.load(tuned, channel, started=t0 + timedelta(hours=i), seconds=seconds)

    scheduler = load_estimates(
        [
            (here.pk, Target(model.pk, tuned.pk)),
            (here.pk, Target(model.pk, fresh.pk)),
            (there.pk, Target(model.pk, fresh.pk)),
        ]
    )
    assert scheduler[(here.pk, Target(model.pk, tuned.pk))] == 500
    assert scheduler[(here.pk, Target(model.pk, fresh.pk))] == 500  # the model's loads on that node
    assert scheduler[(there.pk, Target(model.pk, fresh.pk))] == 65  # never loaded there: size + 15 s

    shown = staff_api.get(f"/api/models/{model.pk}/").data
    assert shown["estimated_load_seconds"] == 500  # the slowest, no longer blind to presets
    table = {(e["preset"], e["node"]): e["seconds"] for e in shown["load_estimates"]}
    assert table[(tuned.pk, "here")] == 500 and table[(fresh.pk, "here")] == 500
    assert table[(tuned.pk, "there")] == 65 and table[(None, "here")] == 500
