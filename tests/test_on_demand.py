"""docs/scheduling.md, "Loaded on demand": a request for a model no channel runs loads it on a
free channel (a real gateway, the scheduler's decision and a real llama-server), it is shared
while it runs, released when idle, and refused with a reason where no channel may load it."""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from channels_app.models import ChannelRuntime, ChannelTarget, OnDemandLoad, StoryEntry, StoryKind
from channels_app.node_worker.tasks import channel_reconcile
from channels_app.placement.on_demand_loads import on_demand_load
from channels_app.scheduling.on_demand import on_demand_release, release_idle_on_demand
from channels_app.scheduling.services import decide_channels
from gateway.api_keys import api_key_create
from gateway.serve.on_demand import _ask
from portal.story.telling import _on_demand
from reservations.models import GroupPolicy
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase, Reason, RedisKey, redis_key
from tests import factories
from tests.clock import eventually
from tests.conftest import snapshot_seen
from tests.test_gateway_http import call, error

pytestmark = pytest.mark.django_db(transaction=True)


def lab(tiny):
    """One node with one channel that runs the tiny model's small preset by default, and a
    second model (the same file, under another name) that no channel runs."""
    node = factories.node("n1", backends=["llama.cpp"])
    channel = factories.channel("cpu-0", on=node, default=tiny.small)
    asked = factories.llm("asked", size=tiny.model.size_bytes, path=tiny.model.path)
    return channel, asked


def step(channel) -> str | None:
    """The scheduler decides the channel, and its node worker acts on it until it is ready (a
    load longer than the worker's close watch is carried on by its follow-ups: stepped here)."""
    decide_channels(now=timezone.now(), channel_ids=[channel.pk])
    phase = channel_reconcile(channel.pk)
    if phase in (Phase.LOADING.value, Phase.STOPPING.value):
        eventually(lambda: channel_reconcile(channel.pk) == Phase.READY.value, timeout=30)
        phase = ChannelRuntime.objects.get(channel=channel).phase
    return phase


def test_a_model_no_channel_runs_loads_on_a_free_channel_is_shared_and_released_when_idle(
    gateway_url, node_env, tiny, ana, bo, settings
):
    channel, asked = lab(tiny)
    assert step(channel) == Phase.READY.value
    _, ana_key = api_key_create(user=ana, name="t")
    _, bo_key = api_key_create(user=bo, name="t")
    snapshot_seen(gateway_url)

    listed = httpx.get(f"{gateway_url}/v1/models", headers={"Authorization": f"Bearer {ana_key}"}).json()
    entries = {entry["id"]: entry for entry in listed["data"]}
    assert entries["asked"]["on_demand"] is True and entries["asked"]["channels"] == []
    assert entries["tiny"]["channels"] == ["cpu-0"] and "on_demand" not in entries["tiny"]

    first = call(gateway_url, ana_key, "asked")
    assert error(first) == (503, "model_loading"), first.text
    assert "loading on demand on channel cpu-0" in first.json()["error"]["message"]
    assert int(first.headers["Retry-After"]) >= 2
    load = OnDemandLoad.objects.get()
    assert (load.channel, load.model, load.requested_by, load.released_at) == (channel, asked, ana, None)

    # Bo's request joins the same load: nothing is loaded twice.
    snapshot_seen(gateway_url)
    second = call(gateway_url, bo_key, "asked")
    assert error(second) == (503, "model_loading"), second.text
    assert OnDemandLoad.objects.count() == 1

    # The decision (rule 5) names the model, and the node loads it in place of the default.
    assert step(channel) == Phase.READY.value
    target = ChannelTarget.objects.get(channel=channel)
    assert (target.model, target.reason) == (asked, Reason.ON_DEMAND)
    assert ChannelRuntime.objects.get(channel=channel).model == asked
    # The switch's gate stays closed a snapshot's life after it closed (held here, whatever this
    # machine's speed), but a snapshot that shows the new process ready since after it closed
    # is let through it.
    ready_since = ChannelRuntime.objects.get(channel=channel).since.timestamp()
    redis_client().set(redis_key(RedisKey.GATE, channel.pk), repr(ready_since - 0.2), ex=60)
    snapshot_seen(gateway_url)
    for key in (ana_key, bo_key):  # shared like a default: anyone the channel admits
        served = call(gateway_url, key, "asked", max_tokens=2)
        assert served.status_code == 200, served.text
    assert redis_client().get(redis_key(RedisKey.ON_DEMAND_USED, channel.pk)) is not None
    redis_client().delete(redis_key(RedisKey.GATE, channel.pk))

    # Not idle yet: it stays. Idle past the setting: released, and the default comes back.
    settings.SLOTSERVE_ON_DEMAND_IDLE_SECONDS = 60
    assert release_idle_on_demand(now=timezone.now()) == 0
    assert release_idle_on_demand(now=timezone.now() + timedelta(seconds=61)) == 1
    load.refresh_from_db()
    assert load.released_at is not None and load.released_why == "idle"
    assert step(channel) == Phase.READY.value
    assert ChannelRuntime.objects.get(channel=channel).preset == tiny.small
    assert ChannelTarget.objects.get(channel=channel).reason == Reason.DEFAULT

    told = list(StoryEntry.objects.filter(channel=channel, kind__startswith="on_demand").order_by("at", "pk"))
    assert [e.kind for e in told] == [StoryKind.ON_DEMAND, StoryKind.ON_DEMAND_RELEASED]
    assert _on_demand(told[0].kind, told[0].data, "asked", told[0].data["by"]).startswith(
        "Loaded asked on demand for ana"
    )
    assert _on_demand(told[1].kind, told[1].data, "asked", "").endswith("no request for 60 s.")


def test_a_waiting_caller_is_answered_once_the_load_on_demand_is_ready(gateway_url, node_env, tiny, ana):
    channel, _ = lab(tiny)
    assert step(channel) == Phase.READY.value
    _, key = api_key_create(user=ana, name="t")
    snapshot_seen(gateway_url)
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                gateway_url + "/v1/chat/completions",
                json={"model": "asked", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"Authorization": f"Bearer {key}", "X-SlotServe-Wait": "30"},
                timeout=40,
            )
        ),
        daemon=True,
    )
    waiting.start()
    assert eventually(lambda: OnDemandLoad.objects.exists(), timeout=20)
    assert step(channel) == Phase.READY.value
    waiting.join(timeout=35)
    assert answers and answers[0].status_code == 200, answers[0].text if answers else "no answer"


def test_each_refusal_names_what_keeps_the_model_from_loading(node_env, tiny, ana, settings):
    channel, asked = lab(tiny)
    now = timezone.now()
    assert on_demand_load(user=ana, model_name="nowhere", now=now) is None  # the request's own 404

    asked.loads_on_demand = False
    asked.save()
    refused = on_demand_load(user=ana, model_name="asked", now=now)
    assert refused is not None and (refused.status, refused.code) == (404, "model_not_loaded")
    assert "staff do not let it load on request" in refused.message
    asked.loads_on_demand = True
    asked.save()

    group = Group.objects.create(name="students")
    ana.groups.add(group)
    GroupPolicy.objects.create(group=group, loads_on_demand=False)
    by_group = _ask(ana.pk, "asked")  # the gateway's check, before the choice of channel
    assert by_group is not None and (by_group.status, by_group.code) == (404, "model_not_loaded")
    assert "your group does not load models on request" in by_group.message
    GroupPolicy.objects.filter(group=group).update(loads_on_demand=True)

    channel.serves_on_demand = False
    channel.save()
    refused = on_demand_load(user=ana, model_name="asked", now=now)
    assert refused is not None and refused.message.endswith("0/1 channels: 1 does not serve on demand")
    channel.serves_on_demand = True
    channel.save()

    # Bo's booking begins in ten minutes: its preload comes before the load's stay is over.
    factories.reservation(
        owner=factories.user("cy"),
        on=channel,
        start=now + timedelta(minutes=10),
        end=now + timedelta(minutes=40),
        target=tiny.big,
    )
    refused = on_demand_load(user=ana, model_name="asked", now=now)
    assert refused is not None and refused.message.endswith("0/1 channels: 1 is booked too soon")
    settings.SLOTSERVE_ON_DEMAND_MIN_STAY_SECONDS = 60
    made = on_demand_load(user=ana, model_name="asked", now=now)
    assert made is not None and made.load is not None and made.load.channel == channel


def test_one_person_loads_a_few_models_an_hour(node_env, tiny, ana, settings):
    channel, _asked = lab(tiny)
    settings.SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR = 2
    now = timezone.now()
    for minutes in (0, 10):
        channel.node.__class__.objects.update(last_heartbeat=now + timedelta(minutes=minutes))
        made = on_demand_load(user=ana, model_name="asked", now=now + timedelta(minutes=minutes))
        assert made is not None and made.load is not None
        assert on_demand_release(load=made.load, now=now + timedelta(minutes=minutes + 1), why="staff")
    refused = on_demand_load(user=ana, model_name="asked", now=now + timedelta(minutes=20))
    assert refused is not None and (refused.status, refused.code) == (429, "rate_limit_exceeded")
    assert refused.retry_after == 40 * 60 + 1  # until the first is an hour old
    channel.node.__class__.objects.update(last_heartbeat=now + timedelta(minutes=61))
    assert on_demand_load(user=ana, model_name="asked", now=now + timedelta(minutes=61)).load is not None


def test_a_booking_that_starts_ends_the_load_for_good(node_env, tiny, ana):
    channel, _asked = lab(tiny)
    now = timezone.now()
    made = on_demand_load(user=ana, model_name="asked", now=now)
    assert made is not None and made.load is not None
    factories.reservation(
        owner=ana, on=channel, start=now + timedelta(hours=1), end=now + timedelta(hours=2), target=tiny.big
    )
    assert release_idle_on_demand(now=now + timedelta(minutes=30)) == 0  # loading, and far from it
    assert release_idle_on_demand(now=now + timedelta(hours=1, minutes=1)) == 1
    made.load.refresh_from_db()
    assert made.load.released_why == "booking"


def test_the_database_keeps_one_load_a_channel_and_a_model(node_env, tiny, ana):
    from django.db import IntegrityError, transaction

    channel, asked = lab(tiny)
    OnDemandLoad.objects.create(channel=channel, model=asked, requested_by=ana)
    other = factories.llm("other")
    with pytest.raises(IntegrityError), transaction.atomic():
        OnDemandLoad.objects.create(channel=channel, model=other, requested_by=ana)
    with pytest.raises(IntegrityError), transaction.atomic():
        OnDemandLoad.objects.create(channel=factories.channel("cpu-1"), model=asked, requested_by=ana)


def test_the_api_lists_a_members_own_loads_and_lets_them_or_staff_release_one(
    node_env, tiny, ana, bo, ana_api, bo_api, staff_api
):
    channel, _asked = lab(tiny)
    made = on_demand_load(user=ana, model_name="asked", now=timezone.now())
    assert made is not None and made.load is not None
    mine = ana_api.get("/api/on-demand-loads/").json()
    assert [(r["model"], r["channel"], r["requested_by"], r["released_at"]) for r in mine] == [
        ("asked", "cpu-0", "ana", None)
    ]
    assert bo_api.get("/api/on-demand-loads/").json() == []
    assert bo_api.post(f"/api/on-demand-loads/{made.load.pk}/release").status_code == 404  # not even seen
    assert len(staff_api.get("/api/on-demand-loads/").json()) == 1
    released = ana_api.post(f"/api/on-demand-loads/{made.load.pk}/release")
    assert released.status_code == 200 and released.json()["released_why"] == "staff"
    assert released.json()["released_now"] is True
    again = staff_api.post(f"/api/on-demand-loads/{made.load.pk}/release").json()
    assert again["released_now"] is False  # released once: told so, nothing changes
    assert StoryEntry.objects.filter(channel=channel, kind=StoryKind.ON_DEMAND_RELEASED).count() == 1


def test_staff_choose_the_channels_and_models_that_load_on_demand(tiny, staff_api, ana_api, node_env):
    channel, asked = lab(tiny)
    assert (
        staff_api.patch(
            f"/api/channels/{channel.pk}/", {"serves_on_demand": False}, format="json"
        ).status_code
        == 200
    )
    assert (
        staff_api.patch(f"/api/models/{asked.pk}/", {"loads_on_demand": False}, format="json").status_code
        == 200
    )
    channel.refresh_from_db()
    asked.refresh_from_db()
    assert (channel.serves_on_demand, asked.loads_on_demand) == (False, False)
    assert (
        ana_api.patch(f"/api/models/{asked.pk}/", {"loads_on_demand": True}, format="json").status_code == 403
    )


def test_an_override_takes_the_channel_and_the_load_does_not_come_back_after_it(node_env, tiny, ana, staff):
    from channels_app.scheduling.services import override_set

    channel, _ = lab(tiny)
    now = timezone.now()
    made = on_demand_load(user=ana, model_name="asked", now=now)
    assert made is not None and made.load is not None
    override_set(channel=channel, until=now + timedelta(minutes=5), now=now, by=staff, model=tiny.model)
    assert release_idle_on_demand(now=now + timedelta(seconds=1)) == 1
    made.load.refresh_from_db()
    assert made.load.released_why == "staff"


def test_a_key_scoped_to_channels_loads_only_on_them(node_env, tiny, ana):
    node = factories.node("n2", gpus=2, backends=["llama.cpp"])
    first = factories.channel("cpu-0", on=node, gpu_indexes=[0], default=tiny.small)
    second = factories.channel("cpu-1", on=node, gpu_indexes=[1], default=tiny.small)
    factories.llm("asked", size=tiny.model.size_bytes, path=tiny.model.path)
    now = timezone.now()
    refused = on_demand_load(user=ana, model_name="asked", now=now, within=frozenset())
    assert refused is not None and refused.load is None
    assert refused.message.endswith("0/2 channels: 2 not yours to use")
    made = on_demand_load(user=ana, model_name="asked", now=now, within=frozenset({second.pk}))
    assert made is not None and made.load is not None and made.load.channel == second != first
