"""The decision and plan endpoints agree with docs/scheduling.md on data created through the API."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from channels_app.models import Channel, ChannelTarget, Gpu, LLMModel, Node, Preset
from channels_app.scheduling.tasks import scheduler_tick
from tests.clock import T0
from tests.factories import iso
from tests.world import World

HOUR = timedelta(hours=1)
GiB = 2**30


@pytest.fixture
def setup(frozen, staff_api, ana_api):
    """A one-GPU node, a channel with default model A, and model B.

    Load estimates from file sizes at 200 MB/s + 15 s: A (4 GB) 35 s,
    B (10 GB) 65 s. B's preload window: max(65 + 60, 180) = 180 s.
    """
    node = staff_api.post("/api/nodes/", {"name": "gpu-a", "labels": {"gpu": "a100"}}, format="json")
    assert node.status_code == 201, node.data
    Gpu.objects.create(node=Node.objects.get(name="gpu-a"), index=0, name="A100", memory_bytes=80 * GiB)
    model_a = staff_api.post(
        "/api/models/", {"name": "A", "backend": "llama.cpp", "path": "/m/a.gguf", "size_bytes": 4 * 10**9}
    ).data
    model_b = staff_api.post(
        "/api/models/", {"name": "B", "backend": "llama.cpp", "path": "/m/b.gguf", "size_bytes": 10 * 10**9}
    ).data
    preset_a = staff_api.post("/api/presets/", {"model": "A", "name": "chat", "args": "-c 4096"}).data
    preset_b = staff_api.post(
        "/api/presets/", {"model": "B", "name": "long", "args": "-c 32768 --port 1 -ngl 99"}
    ).data
    assert preset_b["args_effective"] == ["-c", "32768", "-ngl", "99"]
    channel = staff_api.post(
        "/api/channels/",
        {
            "name": "a100-0",
            "node": "gpu-a",
            "gpu_indexes": [0],
            "approval_policy": "none",
            "default_model": model_a["id"],
            "default_preset": preset_a["id"],
        },
        format="json",
    )
    assert channel.status_code == 201, channel.data
    assert channel.data["vram_bytes"] == 80 * GiB
    return World(
        channel=Channel.objects.get(pk=channel.data["id"]),
        model=LLMModel.objects.get(pk=model_a["id"]),
        preset=Preset.objects.get(pk=preset_a["id"]),
        other_model=LLMModel.objects.get(pk=model_b["id"]),
        other_preset=Preset.objects.get(pk=preset_b["id"]),
    )


def book(client, setup, start, end, *, exclusive=False):
    body = {"channel": setup.channel.pk, "start": iso(start), "end": iso(end)}
    if exclusive:
        body["exclusive"] = True
    else:
        body.update(model=setup.other_model.pk, preset=setup.other_preset.pk)
    answer = client.post("/api/reservations/", body, format="json")
    assert answer.status_code == 201, answer.data
    return answer.data


def decision(client, setup, at):
    answer = client.get(f"/api/channels/{setup.channel.pk}/decision", {"at": iso(at)})
    assert answer.status_code == 200, answer.data
    return answer.data


def test_decisions_at_several_moments(setup, ana_api):
    booked = book(ana_api, setup, T0 + 2 * HOUR, T0 + 3 * HOUR)
    assert booked["status"] == "approved"
    whole = book(ana_api, setup, T0 + 3 * HOUR, T0 + 4 * HOUR, exclusive=True)
    a, b = setup.model.pk, setup.other_model.pk
    pa, pb = setup.preset.pk, setup.other_preset.pk
    preload_from = T0 + 2 * HOUR - timedelta(seconds=180)

    expected = [
        (T0 + HOUR, (a, pa), "default", preload_from, None),
        (preload_from - timedelta(seconds=1), (a, pa), "default", preload_from, None),
        (preload_from, (b, pb), "preload_next", T0 + 2 * HOUR, booked["id"]),
        (
            T0 + 2 * HOUR + 30 * timedelta(minutes=1),
            (b, pb),
            "active_reservation",
            T0 + 3 * HOUR,
            booked["id"],
        ),
        (T0 + 3 * HOUR, None, "active_exclusive", T0 + 4 * HOUR, whole["id"]),
        (T0 + 4 * HOUR, (a, pa), "default", None, None),
    ]
    for at, target, reason, valid_until, reservation in expected:
        got = decision(ana_api, setup, at)
        got_target = None if got["target"] is None else (got["target"]["model"], got["target"]["preset"])
        assert (got_target, got["reason"], got["valid_until"], got["reservation"]) == (
            target,
            reason,
            iso(valid_until) if valid_until else None,
            reservation,
        ), at


def test_plan_matches_the_decisions(setup, ana_api):
    book(ana_api, setup, T0 + 2 * HOUR, T0 + 3 * HOUR)
    answer = ana_api.get(
        f"/api/channels/{setup.channel.pk}/plan", {"from": iso(T0), "to": iso(T0 + 4 * HOUR)}
    )
    assert answer.status_code == 200, answer.data
    assert [(s["from"], s["to"], s["reason"]) for s in answer.data] == [
        (iso(T0), iso(T0 + 2 * HOUR - timedelta(seconds=180)), "default"),
        (iso(T0 + 2 * HOUR - timedelta(seconds=180)), iso(T0 + 2 * HOUR), "preload_next"),
        (iso(T0 + 2 * HOUR), iso(T0 + 3 * HOUR), "active_reservation"),
        (iso(T0 + 3 * HOUR), iso(T0 + 4 * HOUR), "default"),
    ]
    for segment in answer.data:
        assert (
            segment["target"] == decision(ana_api, setup, datetime.fromisoformat(segment["from"]))["target"]
        )


def test_pending_reservation_changes_nothing(setup, staff_api, ana_api):
    staff_api.patch(f"/api/channels/{setup.channel.pk}/", {"approval_policy": "all"}, format="json")
    pending = book(ana_api, setup, T0 + HOUR, T0 + 2 * HOUR)
    assert pending["status"] == "pending"
    assert decision(ana_api, setup, T0 + 90 * timedelta(minutes=1))["reason"] == "default"


def test_recorded_loads_move_the_preload_window(setup, ana_api):
    """After successful loads, the mean of the last five replaces the size guess (docs/scheduling.md)."""
    from tests.factories import load

    channel = setup.channel
    preset_b = setup.other_preset
    assert setup.other_model.size_bytes == 10 * 10**9
    for seconds in (400, 500, 600):
        load(preset_b, channel, started=T0 - 5 * HOUR, seconds=seconds)
    book(ana_api, setup, T0 + 2 * HOUR, T0 + 3 * HOUR)
    # Mean 500 s; window max(500 + 60, 180) = 560 s.
    assert decision(ana_api, setup, T0 + 2 * HOUR - timedelta(seconds=560))["reason"] == "preload_next"
    assert decision(ana_api, setup, T0 + 2 * HOUR - timedelta(seconds=561))["reason"] == "default"


def test_tick_stores_what_the_decision_endpoint_says(setup, ana_api, frozen):
    book(ana_api, setup, T0 + 2 * HOUR, T0 + 3 * HOUR)
    for moment in (T0 + HOUR, T0 + 2 * HOUR - timedelta(seconds=100), T0 + 2 * HOUR + timedelta(seconds=5)):
        frozen.move_to(moment)
        scheduler_tick()
        stored = ChannelTarget.objects.get(channel_id=setup.channel.pk)
        now = decision(ana_api, setup, moment)
        assert stored.reason == now["reason"]
        assert stored.model_id == now["target"]["model"]
        assert stored.valid_until is not None
        assert stored.valid_until.isoformat().replace("+00:00", "Z") == now["valid_until"]
        state = ana_api.get(f"/api/channels/{setup.channel.pk}/").data["state"]
        assert state["target"]["reason"] == now["reason"]


def test_bad_time_and_range_are_named(setup, ana_api):
    url = f"/api/channels/{setup.channel.pk}"
    bad = ana_api.get(f"{url}/decision", {"at": "next tuesday"})
    assert bad.status_code == 400
    assert "at" in bad.data and "ISO 8601" in bad.data["message"], bad.data
    backwards = ana_api.get(f"{url}/plan", {"from": iso(T0), "to": iso(T0 - HOUR)})
    assert backwards.status_code == 400
    assert "to" in backwards.data
