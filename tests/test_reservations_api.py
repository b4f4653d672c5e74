"""Booking through the REST API: validation, conflicts, approvals and transitions (docs/scheduling.md)."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.utils import timezone

from channels_app.models import ChannelTarget
from reservations.models import Notification, Reservation
from reservations.profiles import profile_for
from slotserve_base.dispatch import CHANNEL_REDECIDE, decisions_queue
from tests import factories
from tests.clock import T0
from tests.factories import iso
from tests.world import World

HOUR = timedelta(hours=1)


@pytest.fixture
def world(db, frozen):
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat", "-c 8192")
    llama = factories.llm("llama")
    fast = factories.preset(llama, "fast")
    channel = factories.channel("ch-a", default=fast)
    return World(channel=channel, model=qwen, preset=chat, other_model=llama, other_preset=fast)


def body(world, start, end, **extra):
    data = {
        "channel": world.channel.pk,
        "start": iso(start),
        "end": iso(end),
        "model": world.model.pk,
        "preset": world.preset.pk,
    }
    data.update(extra)
    return data


def test_booking_is_approved_and_redecides_the_channel(
    world, ana_api, django_capture_on_commit_callbacks, queued
):
    with django_capture_on_commit_callbacks(execute=True):
        answer = ana_api.post("/api/reservations/", body(world, T0 + 60 * timedelta(seconds=1), T0 + HOUR))
    # The commit queued the channel's re-decision; the decisions' worker takes it.
    assert queued.queues() == {decisions_queue(): [CHANNEL_REDECIDE]}
    assert not ChannelTarget.objects.filter(channel=world.channel).exists()
    queued.run()
    assert answer.status_code == 201, answer.data
    assert answer.data["status"] == "approved"
    assert answer.data["user"] == "ana"
    # Starting in a minute: inside the preload window, so the channel preloads now.
    target = ChannelTarget.objects.get(channel=world.channel)
    assert (target.model_id, target.preset_id, target.reason) == (
        world.model.pk,
        world.preset.pk,
        "preload_next",
    )


def test_channel_and_model_by_name(world, ana_api):
    answer = ana_api.post(
        "/api/reservations/",
        body(world, T0 + HOUR, T0 + 2 * HOUR, channel="ch-a", model="qwen"),
        format="json",
    )
    assert answer.status_code == 201, answer.data
    assert answer.data["channel"] == world.channel.pk


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"end": iso(T0)}, "end"),
        ({"start": iso(T0 + 2 * HOUR), "end": iso(T0 + HOUR)}, "end"),
        ({"start": "tomorrow at nine"}, "start"),
        ({"start": iso(T0 - HOUR), "end": iso(T0 + HOUR)}, "start"),
        ({"model": 9999}, "model"),
        ({"model": "no-such-model"}, "model"),
        ({"channel": "no-such-channel"}, "channel"),
        ({"preset": "fast-of-llama"}, "preset"),
        ({"model": None, "preset": None}, "model"),
        ({"exclusive": True}, "exclusive"),
    ],
    ids=[
        "end equals start",
        "end before start",
        "unparseable start",
        "start in the past",
        "unknown model id",
        "unknown model name",
        "unknown channel",
        "preset of another model",
        "neither model nor whole-card",
        "whole-card with a model",
    ],
)
def test_bad_input_names_the_field_and_saves_nothing(world, ana_api, change, field):
    data = body(world, T0 + HOUR, T0 + 2 * HOUR)
    if change.get("preset") == "fast-of-llama":
        change = {"preset": world.other_preset.pk}
    data.update(change)
    answer = ana_api.post("/api/reservations/", data, format="json")
    assert answer.status_code == 400, answer.data
    assert field in answer.data, answer.data
    assert answer.data["message"].startswith(field), answer.data
    assert Reservation.objects.count() == 0


def test_overlap_gets_409_naming_the_slot(world, ana_api, bo_api):
    first = ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR))
    assert first.status_code == 201
    clash = bo_api.post("/api/reservations/", body(world, T0 + 90 * timedelta(minutes=1), T0 + 3 * HOUR))
    assert clash.status_code == 409, clash.data
    assert clash.data["conflict"] == {
        "id": first.data["id"],
        "start": iso(T0 + HOUR),
        "end": iso(T0 + 2 * HOUR),
        "status": "approved",
    }
    assert str(first.data["id"]) in clash.data["message"]
    assert Reservation.objects.count() == 1


def test_back_to_back_is_not_an_overlap(world, ana_api, bo_api):
    assert ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).status_code == 201
    assert bo_api.post("/api/reservations/", body(world, T0 + 2 * HOUR, T0 + 3 * HOUR)).status_code == 201
    assert bo_api.post("/api/reservations/", body(world, T0, T0 + HOUR)).status_code == 201


def test_pending_holds_the_slot_cancelled_frees_it(world, ana_api, bo_api):
    world.channel.approval_policy = "all"
    world.channel.save()
    pending = ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).data
    assert pending["status"] == "pending"
    assert bo_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).status_code == 409
    assert ana_api.post(f"/api/reservations/{pending['id']}/cancel").data["status"] == "cancelled"
    assert bo_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).status_code == 201


@pytest.mark.parametrize(
    ("policy", "exclusive", "status"),
    [
        ("none", False, "approved"),
        ("none", True, "approved"),
        ("exclusive_only", False, "approved"),
        ("exclusive_only", True, "pending"),
        ("all", False, "pending"),
    ],
)
def test_approval_policy(world, ana_api, policy, exclusive, status):
    world.channel.approval_policy = policy
    world.channel.save()
    data = body(world, T0 + HOUR, T0 + 2 * HOUR)
    if exclusive:
        data = {"channel": world.channel.pk, "start": data["start"], "end": data["end"], "exclusive": True}
    answer = ana_api.post("/api/reservations/", data, format="json")
    assert answer.status_code == 201, answer.data
    assert answer.data["status"] == status


def test_staff_bookings_are_approved_at_once(world, staff_api):
    world.channel.approval_policy = "all"
    world.channel.save()
    assert (
        staff_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).data["status"]
        == "approved"
    )


def test_approve_and_reject(world, staff, staff_api, ana_api, django_capture_on_commit_callbacks, queued):
    world.channel.approval_policy = "all"
    world.channel.save()
    first = ana_api.post("/api/reservations/", body(world, T0 + 60 * timedelta(seconds=1), T0 + HOUR)).data
    second = ana_api.post("/api/reservations/", body(world, T0 + 2 * HOUR, T0 + 3 * HOUR)).data
    assert Notification.objects.filter(user=staff, event="submitted").count() == 2

    assert ana_api.post(f"/api/reservations/{first['id']}/approve").status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        approved = staff_api.post(f"/api/reservations/{first['id']}/approve")
    queued.run()
    assert approved.data["status"] == "approved"
    assert ChannelTarget.objects.get(channel=world.channel).reason == "preload_next"

    no_reason = staff_api.post(f"/api/reservations/{second['id']}/reject", {"reason": ""})
    assert no_reason.status_code == 400 and "reason" in no_reason.data
    rejected = staff_api.post(f"/api/reservations/{second['id']}/reject", {"reason": "maintenance that day"})
    assert rejected.data["status"] == "rejected"
    assert rejected.data["reject_reason"] == "maintenance that day"
    again = staff_api.post(f"/api/reservations/{second['id']}/approve")
    assert again.status_code == 409
    assert "rejected" in again.data["message"]
    ana_events = set(Notification.objects.filter(user__username="ana").values_list("event", flat=True))
    assert ana_events == {"approved", "rejected"}


def test_cancel_and_end(world, ana_api, frozen, django_capture_on_commit_callbacks, queued):
    active = ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).data
    future = ana_api.post("/api/reservations/", body(world, T0 + 3 * HOUR, T0 + 4 * HOUR)).data

    early = ana_api.post(f"/api/reservations/{active['id']}/end")
    assert early.status_code == 409 and "not active" in early.data["message"]

    frozen.move_to(T0 + 90 * timedelta(minutes=1))
    assert ana_api.post(f"/api/reservations/{active['id']}/cancel").status_code == 409
    with django_capture_on_commit_callbacks(execute=True):
        ended = ana_api.post(f"/api/reservations/{active['id']}/end")
    queued.run()
    assert ended.data["status"] == "ended"
    assert ended.data["end"] == iso(T0 + 90 * timedelta(minutes=1))
    # The channel re-decided at once: back to its default.
    assert ChannelTarget.objects.get(channel=world.channel).reason == "default"

    assert ana_api.post(f"/api/reservations/{future['id']}/cancel").data["status"] == "cancelled"
    assert ana_api.post(f"/api/reservations/{future['id']}/cancel").status_code == 409


def test_other_users_reservations_are_invisible(world, ana_api, bo_api, staff_api):
    mine = ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR)).data
    assert bo_api.get(f"/api/reservations/{mine['id']}/").status_code == 404
    assert bo_api.post(f"/api/reservations/{mine['id']}/cancel").status_code == 404
    assert bo_api.get("/api/reservations/").data == []
    assert [r["id"] for r in ana_api.get("/api/reservations/").data] == [mine["id"]]
    assert [r["id"] for r in staff_api.get("/api/reservations/").data] == [mine["id"]]
    assert Reservation.objects.get(pk=mine["id"]).status == "approved"


def test_hints_warn_about_a_model_switch_and_vram(world, ana_api, bo_api):
    ana_api.post("/api/reservations/", body(world, T0 + HOUR, T0 + 2 * HOUR))
    world.other_model.size_bytes = 30 * 2**30  # larger than the channel's 24 GiB
    world.other_model.save()
    answer = bo_api.get(
        "/api/reservations/hints",
        {
            "channel": world.channel.pk,
            "start": iso(T0 + 2 * HOUR),
            "end": iso(T0 + 3 * HOUR),
            "model": world.other_model.pk,
            "preset": world.other_preset.pk,
        },
    )
    assert answer.status_code == 200, answer.data
    codes = {w["code"]: w for w in answer.data["warnings"]}
    assert set(codes) == {"adjacent_model_switch", "exceeds_vram"}
    # 30 GiB at 200 MB/s + 15 s = 176 s: the first 3 minutes go to loading.
    assert codes["adjacent_model_switch"]["minutes_lost"] == 3


def test_inventory_is_staff_only_to_change(db, ana_api, staff_api):
    assert ana_api.post("/api/nodes/", {"name": "n1"}).status_code == 403
    assert staff_api.post("/api/nodes/", {"name": "n1"}).status_code == 201
    listed = ana_api.get("/api/nodes/").data
    assert [(n["name"], n["status"]) for n in listed] == [("n1", "not_ready")]


def test_channel_validation(db, staff_api):
    qwen = factories.llm("qwen")
    other = factories.preset(factories.llm("other"), "x")
    node = factories.node("n")
    base = {"name": "c", "node": node.pk, "gpu_indexes": [0], "approval_policy": "none"}
    bad_gpus = staff_api.post("/api/channels/", {**base, "gpu_indexes": [0, 0]}, format="json")
    assert bad_gpus.status_code == 400 and "gpu_indexes" in bad_gpus.data
    bad_preset = staff_api.post(
        "/api/channels/", {**base, "default_model": qwen.pk, "default_preset": other.pk}, format="json"
    )
    assert bad_preset.status_code == 400 and "default_preset" in bad_preset.data
    bad_policy = staff_api.post("/api/channels/", {**base, "approval_policy": "sometimes"}, format="json")
    assert bad_policy.status_code == 400 and "approval_policy" in bad_policy.data


def test_override_endpoint(world, staff_api, ana_api, django_capture_on_commit_callbacks, queued):
    url = f"/api/channels/{world.channel.pk}/override"
    assert ana_api.post(url, {"unload": True, "until": iso(T0 + HOUR)}).status_code == 403
    past = staff_api.post(url, {"unload": True, "until": iso(T0 - HOUR)})
    assert past.status_code == 400 and "until" in past.data
    both = staff_api.post(url, {"unload": True, "model": world.model.pk, "until": iso(T0 + HOUR)})
    assert both.status_code == 400
    with django_capture_on_commit_callbacks(execute=True):
        made = staff_api.post(
            url, {"model": world.model.pk, "preset": world.preset.pk, "until": iso(T0 + HOUR)}
        )
    queued.run()
    assert made.status_code == 201, made.data
    assert ChannelTarget.objects.get(channel=world.channel).reason == "manual_override"
    with django_capture_on_commit_callbacks(execute=True):
        assert staff_api.delete(url).status_code == 204
    queued.run()
    assert ChannelTarget.objects.get(channel=world.channel).reason == "default"


def test_reload_endpoint(world, staff_api, ana_api, node_queue_sends, django_capture_on_commit_callbacks):
    url = f"/api/channels/{world.channel.pk}/reload"
    assert ana_api.post(url).status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        assert staff_api.post(url).data["reload_generation"] == 1
    # It reaches the node at once, not at its next tick.
    node = world.channel.node.name
    assert (
        "channels_app.node_worker.tasks.channel_reconcile",
        (world.channel.pk,),
        node,
    ) in node_queue_sends
    assert staff_api.post(url).data["reload_generation"] == 2
    # A reload is its own fact: the scheduler's target is not written by a web request.
    from channels_app.models import ReloadRequest

    asked = ReloadRequest.objects.get(channel=world.channel)
    assert asked.generation == 2 and asked.requested_by is not None
    assert not ChannelTarget.objects.filter(channel=world.channel).exists()


def test_lists_filter_with_named_errors_and_paginate_when_asked(world, ana_api, staff_api):
    listed = ana_api.get("/api/reservations/", {"status": "approved"})
    assert listed.status_code == 200 and isinstance(listed.data, list)
    bad = ana_api.get("/api/reservations/", {"status": "maybe"})
    assert bad.status_code == 400 and "status" in bad.data["message"]
    by_name = staff_api.get("/api/reservations/", {"channel": world.channel.name}).data
    by_id = staff_api.get("/api/reservations/", {"channel": world.channel.pk}).data
    assert by_name == by_id
    page = staff_api.get("/api/reservations/", {"limit": 1})
    assert set(page.data) == {"count", "next", "previous", "results"} and len(page.data["results"]) <= 1


@pytest.mark.django_db(transaction=True)
def test_every_api_moment_is_written_in_utc_whoever_asks_and_wherever_it_is_made():
    """One format (docs/api.md): a webhook body made in a Berlin user's request and one made by a
    task, and the REST API read in a Berlin session, all write ``…Z``."""
    import zoneinfo

    from rest_framework.test import APIClient

    from slotserve_base.iso import iso_moment

    moment = timezone.now().replace(microsecond=0)
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    with timezone.override(berlin):
        assert iso_moment(moment) == moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    ana = factories.user("ana")
    profile = profile_for(ana)
    profile.time_zone, profile.time_zone_chosen = "Europe/Berlin", True
    profile.save()
    booking = factories.reservation(
        owner=ana, on=factories.channel("a100-0"), start=moment, end=moment + timedelta(hours=1)
    )
    client = APIClient()
    client.force_login(ana)
    (row,) = client.get("/api/reservations/").json()
    assert row["start"] == iso_moment(booking.start) and row["start"].endswith("Z"), row
    assert row["created"].endswith("Z"), row
