"""Nodes on their own feet: queues named per installation, a node worker that beats and
reconciles without the scheduler, ticks sent only to live nodes, and channels whose GPUs exist
on their node and belong to no other channel."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import Channel, Node
from channels_app.node_worker import heartbeat
from channels_app.node_worker import tasks as node_tasks
from channels_app.scheduling.tasks import fan_out_node_ticks
from slotserve_base import dispatch
from tests import factories
from tests.clock import eventually


def test_queues_carry_the_installations_prefix(settings):
    settings.SLOTSERVE_REDIS_PREFIX = "lab-a"
    assert dispatch.node_queue("gpu1") == "lab-a.node.gpu1"
    settings.SLOTSERVE_REDIS_PREFIX = "lab-b"
    assert dispatch.node_queue("gpu1") == "lab-b.node.gpu1"
    assert django_settings.CELERY_TASK_DEFAULT_QUEUE.endswith(".scheduler")
    from slotserve_site.celery import app

    assert app.conf.task_default_queue == django_settings.CELERY_TASK_DEFAULT_QUEUE


@pytest.mark.django_db
def test_ticks_go_only_to_nodes_whose_worker_is_alive(node_queue_sends, settings):
    live, gone = factories.node("live"), factories.node("gone")
    factories.channel("on-live", on=live)
    factories.channel("on-gone", on=gone)
    Node.objects.filter(pk=gone.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=4 * settings.SLOTSERVE_TICK_SECONDS)
    )
    assert fan_out_node_ticks() == 1
    assert [node for _, _, node in node_queue_sends] == ["live"]


@pytest.mark.django_db(transaction=True)
def test_a_node_worker_beats_and_reconciles_without_the_scheduler(settings, tmp_path, monkeypatch):
    settings.DATA_DIR = tmp_path
    settings.SLOTSERVE_FAKE_GPUS = "2x24GiB"
    node = factories.node("solo", gpus=0)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=None)
    factories.channel("solo-0", on=node, gpu_indexes=[0])
    # One failing round (the database away, say) must not stop the next ones.
    real_run = node_tasks.node_tick.run
    calls = {"n": 0}

    def flaky(name: str) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("the database went away")
        return real_run(name)

    monkeypatch.setattr(node_tasks.node_tick, "run", flaky)
    stop = threading.Event()
    beating = threading.Thread(target=heartbeat.keep_beating, args=("solo", stop, 0.1), daemon=True)
    beating.start()

    def reported() -> bool:
        node.refresh_from_db()
        return node.last_heartbeat is not None and node.gpus.count() == 2 and calls["n"] >= 2

    assert eventually(reported, timeout=10, every=0.05)
    stop.set()
    beating.join(timeout=5)
    assert calls["n"] >= 2, "the loop went on after a failed round"
    assert node.is_ready(timezone.now()) and node.gpus.count() == 2
    assert Channel.objects.get(name="solo-0").runtime.phase == "stopped"  # reconciled: nothing to run


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("gpus", "problem"),
    [
        ([2], "node n1 has no GPU 2 (it has [0, 1])"),
        ([1], "GPU 1 of node n1 belongs to channel first"),
        ([0, 0], "names a GPU twice"),
        ([], "non-empty list"),
    ],
)
def test_a_channels_gpus_exist_and_are_its_own(staff, gpus, problem):
    node = factories.node("n1", gpus=2)
    factories.channel("first", on=node, gpu_indexes=[1])
    api = APIClient()
    api.force_authenticate(staff)
    answer = api.post("/api/channels/", {"name": "second", "node": "n1", "gpu_indexes": gpus}, format="json")
    assert answer.status_code == 400 and problem in answer.data["message"], answer.data
    assert not Channel.objects.filter(name="second").exists()
    ok = api.post("/api/channels/", {"name": "second", "node": "n1", "gpu_indexes": [0]}, format="json")
    assert ok.status_code == 201
    # Editing a channel keeps its own GPUs; taking another's is refused the same way.
    first = Channel.objects.get(name="first")
    assert api.patch(f"/api/channels/{first.pk}/", {"gpu_indexes": [1]}, format="json").status_code == 200
    taken = api.patch(f"/api/channels/{first.pk}/", {"gpu_indexes": [0, 1]}, format="json")
    assert taken.status_code == 400 and "belongs to channel second" in taken.data["message"]


@pytest.mark.django_db
def test_the_admin_form_shares_the_gpu_rule(staff):
    staff.is_superuser = True
    staff.save()
    node = factories.node("n1", gpus=1)
    factories.channel("first", on=node, gpu_indexes=[0])
    admin = Client()
    admin.force_login(staff)
    answer = admin.post(
        "/admin/channels_app/channel/add/",
        {
            "name": "second",
            "node": node.pk,
            "gpu_indexes": "[0]",
            "approval_policy": "none",
            "labels": "{}",
            "allow_whole_card": "on",
            "min_booking_minutes": "15",
        },
    )
    assert answer.status_code == 200 and "belongs to channel first" in answer.content.decode()
    assert not Channel.objects.filter(name="second").exists()


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_gpu_claimed_twice_even_past_the_checks():
    """Two admins saving at the same moment both pass the check; the database keeps one GPU
    to one channel of a node (a claim row per GPU, unique per node), and nothing is half-saved."""
    from django.db import IntegrityError

    node = factories.node("n1", gpus=2)
    first = factories.channel("first", on=node, gpu_indexes=[0, 1])
    assert sorted(first.gpu_claims.values_list("index", flat=True)) == [0, 1]
    with pytest.raises(IntegrityError):
        Channel.objects.create(name="second", node=node, gpu_indexes=[1])
    assert not Channel.objects.filter(name="second").exists()
    # Giving a GPU up frees it for another channel; another node's GPU 0 is another GPU.
    first.gpu_indexes = [0]
    first.save()
    factories.channel("second", on=node, gpu_indexes=[1])
    factories.channel("elsewhere", on=factories.node("n2", gpus=1), gpu_indexes=[0])
    first.delete()
    factories.channel("third", on=node, gpu_indexes=[0])


@pytest.mark.django_db
def test_a_race_past_the_check_is_a_400_not_a_500(staff, monkeypatch):
    node = factories.node("n1", gpus=1)
    factories.channel("first", on=node, gpu_indexes=[0])
    # The other admin's save lands between this request's check and its write.
    monkeypatch.setattr("channels_app.inventory.services.channel_gpus_problem", lambda **kw: "")
    monkeypatch.setattr("channels_app.api.serializers.channel_gpus_problem", lambda **kw: "")
    api = APIClient()
    api.force_authenticate(staff)
    answer = api.post("/api/channels/", {"name": "second", "node": "n1", "gpu_indexes": [0]}, format="json")
    assert answer.status_code == 400 and "another channel" in answer.data["message"], answer.data
    assert not Channel.objects.filter(name="second").exists()


@pytest.mark.django_db
def test_editing_a_channels_default_re_decides_it_at_once(staff, monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr("channels_app.inventory.services.enqueue_redecide", sent.append)
    node = factories.node("n1", gpus=1)
    channel = factories.channel("first", on=node, gpu_indexes=[0])
    preset = factories.preset(factories.llm("m"))
    api = APIClient()
    api.force_authenticate(staff)
    answer = api.patch(
        f"/api/channels/{channel.pk}/",
        {"default_model": preset.model.pk, "default_preset": preset.pk},
        format="json",
    )
    assert answer.status_code == 200, answer.data
    assert sent == [channel.pk]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_does_not_wait_for_a_stuck_reconcile(settings, monkeypatch):
    """A reconcile that hangs on Redis (a link just back, a socket timing out) must not make a
    healthy node look dead: the heartbeat keeps its own time."""
    settings.SLOTSERVE_FAKE_GPUS = "1x24GiB"
    node = Node.objects.create(name="stuck")
    release = threading.Event()

    def stuck(name: str) -> int:
        release.wait(10)
        return 0

    monkeypatch.setattr(node_tasks.node_tick, "run", stuck)
    stop = threading.Event()
    beating = threading.Thread(target=heartbeat.keep_beating, args=("stuck", stop, 0.1), daemon=True)
    beating.start()
    try:
        seen: list[datetime] = []

        def beats_on() -> bool:
            node.refresh_from_db()
            if node.last_heartbeat is not None:  # its first beat may be a moment away
                seen.append(node.last_heartbeat)
            return len(set(seen)) >= 4

        assert eventually(beats_on, timeout=5, every=0.15), (
            "the heartbeat stood still during a stuck reconcile"
        )
        assert timezone.now() - seen[-1] < timedelta(seconds=0.5)
    finally:
        release.set()
        stop.set()
        beating.join(timeout=5)
