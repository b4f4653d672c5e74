"""The node worker end to end: real processes — a real ``llama-server`` with a tiny
GGUF model, and the stand-in for vLLM/SGLang and for failures — driven one
reconcile at a time with ``now`` injected, so retries and timeouts need no waiting."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import ChannelRuntime, ChannelTarget, LoadRecord
from channels_app.node_worker import ports, processes, registration, worker
from channels_app.scheduling.services import decide_channels
from devtools import standin
from gateway.wire.counters import INFLIGHT, key
from reservations.models import Notification
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import eventually, throughout

STANDIN = f"{sys.executable} -m devtools.standin"


def converge(
    channel, *, until: set[Phase], now: datetime | None = None, timeout: float = 30
) -> ChannelRuntime:
    """Reconcile the channel until its phase is one of ``until`` (real seconds pass for the process)."""

    def arrived() -> bool:
        state = worker.reconcile(channel_id=channel.pk, now=now or timezone.now())
        return state is not None and state.phase in until

    if not eventually(arrived, timeout=timeout, every=0.05):
        runtime = ChannelRuntime.objects.get(channel=channel)
        log = Path(runtime.log_path).read_text() if runtime.log_path else ""
        raise AssertionError(f"channel stuck in {runtime.phase}: {runtime.error}\n{log[-2000:]}")
    return ChannelRuntime.objects.get(channel=channel)


def out_of_memory(tiny, name: str = "big-vllm", args: str = "--standin-oom --max-model-len 131072"):
    """A vLLM model, run by the stand-in (it checks only that the path exists), and its preset
    ``greedy`` that runs out of memory while it loads."""
    model = factories.llm(name, backend="vllm")
    model.path = str(tiny.model.path)
    model.save()
    return factories.preset(model, "greedy", args)


def phase_after(channel, now: datetime) -> Phase:
    """One reconcile at ``now``; the phase it leaves the channel in."""
    state = worker.reconcile(channel_id=channel.pk, now=now)
    assert state is not None, "another reconcile held the channel"
    return state.phase


@pytest.mark.django_db(transaction=True)
def test_reservation_is_preloaded_with_a_real_llama_server(node_env, tiny, ana):
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    booking = factories.reservation(
        owner=ana,
        on=channel,
        start=now + timedelta(seconds=120),
        end=now + timedelta(hours=1),
        target=tiny.big,
    )
    decide_channels(now=now)
    assert ChannelTarget.objects.get(channel=channel).reason == "preload_next"
    runtime = converge(channel, until={Phase.READY})
    assert timezone.now() < booking.start  # ready before the slot starts
    assert (runtime.model_id, runtime.preset_id) == (tiny.model.pk, tiny.big.pk)
    load = LoadRecord.objects.get(channel=channel)
    assert load.succeeded and load.duration_seconds is not None and load.duration_seconds < 30
    # Its first load here was planned from the file's size (a few MB) plus 15 s of start-up; the
    # node's later misses are measured against that.
    assert load.estimated_seconds == pytest.approx(15.0, abs=0.5)
    log = Path(runtime.log_path).read_text()
    assert "--alias tiny -c 512" in log and "--port 1 " not in log  # owned arguments replaced
    assert Notification.objects.filter(user=ana, event="model_ready").count() == 1
    answer = httpx.post(
        f"http://127.0.0.1:{runtime.port}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {runtime.api_secret}"},  # only the gateway knows it
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.django_db(transaction=True)
def test_switching_presets_drains_then_restarts(node_env, tiny, settings):
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    decide_channels(now=now)
    first = converge(channel, until={Phase.READY})
    first_pid = first.pid
    # An admin switches the channel to the other preset while a request is in flight.
    from channels_app.scheduling.services import override_set

    override_set(
        channel=channel,
        model=tiny.model,
        preset=tiny.big,
        until=now + timedelta(hours=1),
        now=now,
        by=None,
    )
    decide_channels(now=now)
    redis = redis_client()
    redis.zadd(key(INFLIGHT, channel.pk), {"a-request": time.time() + 3600})
    try:
        assert converge(channel, until={Phase.DRAINING}).pid == first_pid
        # Still draining while the request runs, within SLOTSERVE_DRAIN_SECONDS.
        assert phase_after(channel, now + timedelta(seconds=10)) == Phase.DRAINING
        # The drain limit passes: SIGTERM, then the new preset loads.
        later = now + timedelta(seconds=settings.SLOTSERVE_DRAIN_SECONDS + 1)
        assert phase_after(channel, later) == Phase.STOPPING
    finally:
        redis.delete(key(INFLIGHT, channel.pk))
    second = converge(channel, until={Phase.READY})
    assert second.preset_id == tiny.big.pk and second.pid != first_pid
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)


@pytest.mark.django_db(transaction=True)
def test_kill_9_fails_retries_after_30_s_and_recovers(node_env, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    os.kill(runtime.pid, signal.SIGKILL)
    now = timezone.now()
    failed = converge(channel, until={Phase.FAILED}, now=now)
    assert failed.error.startswith("The process was killed by signal 9.")
    assert failed.retry_at == now + timedelta(seconds=30)
    # Before the retry time nothing starts; after it, the model loads again.
    assert phase_after(channel, now + timedelta(seconds=29)) == Phase.FAILED
    assert phase_after(channel, now + timedelta(seconds=30)) == Phase.LOADING
    recovered = converge(channel, until={Phase.READY}, now=now + timedelta(seconds=31))
    assert recovered.error == "" and recovered.retry_at is None


@pytest.mark.django_db(transaction=True)
def test_out_of_memory_falls_back_to_the_default_and_switches_back(node_env, tiny, ana, staff):
    greedy = out_of_memory(tiny)
    vllm_model = greedy.model
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    factories.reservation(
        owner=ana, on=channel, start=now - timedelta(minutes=1), end=now + timedelta(hours=1), target=greedy
    )
    decide_channels(now=now)
    failed = converge(channel, until={Phase.FAILED, Phase.READY})
    assert failed.phase == Phase.FAILED
    assert "ran out of memory" in failed.error and "--gpu-memory-utilization" in failed.error  # vLLM's advice
    assert "-ngl" not in failed.error
    assert LoadRecord.objects.get(channel=channel, model=vllm_model).succeeded is False
    # While the booked model waits for its retry, the default serves the booking.
    fallback = converge(channel, until={Phase.READY})
    assert fallback.model_id == tiny.model.pk and fallback.fallback

    api = APIClient()
    api.force_authenticate(ana)
    shown = api.get(f"/api/channels/{channel.pk}/").data["state"]
    assert (shown["reason"], shown["fallback"]) == ("fallback_default", True)  # the seed's reason
    assert shown["target"]["reason"] == "active_reservation"  # what the scheduler wants stays visible
    page_events = set(Notification.objects.filter(user=ana).values_list("event", flat=True))
    assert page_events == {"load_failed", "fallback"}
    assert set(Notification.objects.filter(user=staff).values_list("event", flat=True)) == {
        "load_failed",
        "fallback",
    }
    # Repeated reconciles send nothing twice.
    worker.reconcile(channel_id=channel.pk, now=timezone.now())
    assert Notification.objects.filter(user=ana).count() == 2
    # An admin fixes the preset; at the retry the booked model loads and the channel switches back.
    greedy.args = "--max-model-len 8192"
    greedy.save()
    retry = failed.retry_at
    assert retry is not None
    assert phase_after(channel, retry) == Phase.STOPPING  # nothing in flight: no drain
    back = converge(channel, until={Phase.READY}, now=retry + timedelta(seconds=1))
    assert back.model_id == vllm_model.pk and not back.fallback
    assert api.get(f"/api/channels/{channel.pk}/").data["state"]["reason"] == "active_reservation"
    assert Notification.objects.filter(user=ana, event="recovered").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_failure_episode_belongs_to_its_booking(node_env, tiny, ana, bo, staff):
    """docs/scheduling.md "Retries": the retry schedule, the fallback, the error and the news
    of a failure end with the booking; a later booking of the same target starts afresh."""

    greedy = out_of_memory(tiny, "never", "--standin-oom")
    never = greedy.model
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    first = factories.reservation(
        owner=ana,
        on=channel,
        start=now - timedelta(minutes=1),
        end=now + timedelta(minutes=10),
        target=greedy,
    )
    decide_channels(now=now)
    assert converge(channel, until={Phase.FAILED}, now=now).retry_at == now + timedelta(seconds=30)
    assert converge(channel, until={Phase.READY}, now=now).fallback

    # Ana's slot ends: the default that served as the fallback now serves as itself.
    after = first.end + timedelta(seconds=1)
    decide_channels(now=after)
    clean = converge(channel, until={Phase.READY}, now=after)
    assert clean.model_id == tiny.model.pk and clean.pid is not None
    assert (clean.fallback, clean.retry_at, clean.error, clean.attempts) == (False, None, "", 0)
    api = APIClient()
    api.force_authenticate(staff)
    shown = api.get(f"/api/channels/{channel.pk}/").data["state"]
    assert (shown["fallback"], shown["retry_at"], shown["error"]) == (False, None, "")

    # Days later bo books the same model and preset; its first failure retries after 30 s.
    later = now + timedelta(days=3)
    factories.reservation(
        owner=bo,
        on=channel,
        start=later - timedelta(minutes=1),
        end=later + timedelta(hours=1),
        target=greedy,
    )
    decide_channels(now=later)
    failed = converge(channel, until={Phase.FAILED}, now=later)
    assert failed.retry_at == later + timedelta(seconds=30) and failed.attempts == 1
    assert Notification.objects.filter(user=bo, event="load_failed").count() == 1

    # An admin mends the preset: at the retry bo's model loads, and bo hears it recovered.
    greedy.args = ""
    greedy.save()
    retry = later + timedelta(seconds=30)
    back = converge(channel, until={Phase.READY}, now=retry)
    assert back.model_id == never.pk and not back.fallback
    assert Notification.objects.filter(user=bo, event="recovered").count() == 1

    # It breaks again in the same booking: a new episode, and bo and the admins hear of it.
    greedy.args = "--standin-oom"
    greedy.save()
    again = converge(channel, until={Phase.FAILED}, now=retry + timedelta(minutes=5))
    assert again.retry_at == retry + timedelta(minutes=5, seconds=30)
    assert Notification.objects.filter(user=bo, event="load_failed").count() == 2
    assert Notification.objects.filter(user=ana, event="load_failed").count() == 1
    assert Notification.objects.filter(user=staff, event="load_failed").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_load_that_never_becomes_healthy_fails_at_the_load_timeout(node_env, tiny, settings):
    stuck = factories.llm("stuck", backend="sglang")
    stuck.path = str(tiny.model.path)
    stuck.save()
    channel = factories.channel("cpu-0", default=factories.preset(stuck, "hang", "--standin-hang"))
    now = timezone.now()
    decide_channels(now=now)
    loading = converge(channel, until={Phase.LOADING}, now=now)
    pid = loading.pid
    # The hanging process never gets ready by itself: loading, up to the load timeout, for three
    # times as long as a stand-in that loads takes to be ready.
    hung = 3 * standin.LOAD_SECONDS
    assert throughout(lambda: phase_after(channel, now + timedelta(seconds=599)) == Phase.LOADING, hung)
    timeout = now + timedelta(seconds=settings.SLOTSERVE_LOAD_TIMEOUT_SECONDS)
    assert phase_after(channel, timeout) == Phase.STOPPING
    failed = converge(channel, until={Phase.FAILED}, now=timeout)
    assert failed.error == "The model was not ready within 600 s (SLOTSERVE_LOAD_TIMEOUT_SECONDS)."
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.django_db(transaction=True)
def test_sigkill_after_the_stop_timeout(node_env, tiny, settings):
    stubborn = factories.llm("stubborn", backend="vllm")
    stubborn.path = str(tiny.model.path)
    stubborn.save()
    channel = factories.channel(
        "cpu-0", default=factories.preset(stubborn, "deaf", "--standin-ignore-sigterm")
    )
    now = timezone.now()
    decide_channels(now=now)
    ready = converge(channel, until={Phase.READY})
    channel.default_model, channel.default_preset = None, None
    channel.save()
    decide_channels(now=now)
    assert converge(channel, until={Phase.STOPPING}).pid == ready.pid
    # Not killed before its stop timeout: stopping, for three times as long as a stand-in takes
    # to load (one that heeds SIGTERM is gone well within it).
    hung = 3 * standin.LOAD_SECONDS
    assert throughout(lambda: phase_after(channel, now + timedelta(seconds=5)) == Phase.STOPPING, hung)
    later = now + timedelta(seconds=settings.SLOTSERVE_STOP_TIMEOUT_SECONDS + 1)
    worker.reconcile(channel_id=channel.pk, now=later)  # SIGKILL
    assert converge(channel, until={Phase.STOPPED}, now=later).pid is None


@pytest.mark.django_db(transaction=True)
def test_a_restarted_worker_adopts_its_processes_and_ignores_strangers(node_env, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    processes._children.clear()  # a new worker process knows nothing of the old one's children
    again = converge(channel, until={Phase.READY})
    assert again.pid == runtime.pid  # adopted: same process, no restart
    assert LoadRecord.objects.filter(channel=channel).count() == 1
    # A recycled pid that is not our run is not adopted.
    ChannelRuntime.objects.filter(pk=channel.pk).update(run_id="someoneelse")
    assert phase_after(channel, timezone.now()) in {Phase.FAILED, Phase.STOPPED}
    assert runtime.pid is not None
    processes.send(runtime.pid, signal.SIGKILL)


@pytest.mark.django_db(transaction=True)
def test_heartbeat_registers_fake_gpus(node_env):
    node = registration.heartbeat(node_name="laptop", now=timezone.now())
    assert [(g.index, g.memory_bytes) for g in node.gpus.all()] == [(0, 24 * 2**30)]
    assert "vllm" in node.backends and "llama.cpp" in node.backends


@pytest.mark.django_db(transaction=True)
def test_tick_reaches_the_node_worker_through_redis(node_env, tiny, real_node_queues):
    """The full path with the real Redis: tick → node queue → process started → ready."""
    import uuid

    from celery.contrib.testing.worker import start_worker

    from channels_app.scheduling.tasks import scheduler_tick
    from slotserve_base.dispatch import node_queue
    from slotserve_site.celery import app

    suffix = uuid.uuid4().hex[:8]
    node = factories.node(f"node-{suffix}")
    channel = factories.channel(f"cpu-{suffix}", on=node, default=tiny.small)
    scheduler_queue = f"scheduler-{suffix}"  # this test's own, so parallel tests never share queues
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=[scheduler_queue, node_queue(node.name)],
        loglevel="WARNING",
    ):
        scheduler_tick.apply_async(queue=scheduler_queue)
        assert eventually(
            lambda: ChannelRuntime.objects.filter(channel=channel, phase=Phase.READY).exists(),
            timeout=60,
            every=0.1,
        )
    runtime = ChannelRuntime.objects.get(channel=channel)
    assert runtime.phase == Phase.READY, runtime.error
    assert (runtime.model_id, runtime.preset_id) == (tiny.model.pk, tiny.small.pk)
    assert ChannelTarget.objects.get(channel=channel).reason == "default"
    node.refresh_from_db()
    assert node.is_ready(timezone.now())


@pytest.mark.django_db(transaction=True)
def test_run_log_through_the_api_and_the_portal(node_env, tiny, ana, staff):
    from rest_framework.test import APIClient

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    converge(channel, until={Phase.READY})
    api = APIClient()
    api.force_authenticate(ana)
    lines = api.get(f"/api/channels/{channel.pk}/log", {"lines": 5}).data["lines"]
    assert 0 < len(lines) <= 5
    first = api.get(f"/api/channels/{channel.pk}/log", {"lines": 5000}).data["lines"][0]
    assert first.startswith("$ ") and "--alias tiny" in first  # the command line heads every run log
    assert api.get(f"/api/channels/{channel.pk}/log", {"full": 1}).status_code == 403
    api.force_authenticate(staff)
    whole = api.get(f"/api/channels/{channel.pk}/log", {"full": 1})
    assert whole.status_code == 200 and b"--alias tiny" in b"".join(whole.streaming_content)  # type: ignore[attr-defined]
    portal = Client()
    portal.force_login(ana)
    assert "--alias tiny" in portal.get(f"/channel/{channel.pk}/log").content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_run_log_reaches_hosts_that_do_not_have_the_file(node_env, tiny, ana, staff, monkeypatch):
    """The node worker ships its runs' lines to a bounded Redis stream; the API and the portal
    read it from any host, following new lines as the process writes them."""
    from rest_framework.test import APIClient

    from channels_app.node_worker import log_shipping

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    # The web host is another machine: the node's file is not there.
    monkeypatch.setattr("channels_app.node_worker.run_logs.run_log_of", lambda c: (None, runtime.api_secret))
    api = APIClient()
    api.force_authenticate(ana)
    lines: list[str] = []

    def listening() -> bool:
        lines[:] = api.get(f"/api/channels/{channel.pk}/log", {"lines": 5000}).data["lines"]
        return any("listening" in line for line in lines)

    assert eventually(listening, timeout=10, every=0.05)
    assert lines[0].startswith("$ ") and "--alias tiny" in lines[0], lines[:3]
    assert any("listening" in line for line in lines)
    portal = Client()
    portal.force_login(ana)
    assert "--alias tiny" in portal.get(f"/channel/{channel.pk}/log").content.decode()
    api.force_authenticate(staff)
    whole = b"".join(api.get(f"/api/channels/{channel.pk}/log", {"full": 1}).streaming_content)  # type: ignore[attr-defined]
    assert b"--alias tiny" in whole
    # Bounded: a chatty process cannot fill Redis.
    client = redis_client()
    for _ in range(3):
        log_shipping._add(
            channel.pk, runtime.run_id, [f"line {i}" for i in range(log_shipping.STREAM_MAXLEN)]
        )
    assert client.xlen(log_shipping.stream_key(channel.pk)) <= log_shipping.STREAM_MAXLEN * 1.2


@pytest.mark.django_db
def test_the_run_log_is_followed_live_from_a_cursor(ana):
    """Each answer carries a cursor; asking ``after`` it gives only the lines shipped since, and
    a new run's lines replace the old run's (``new_run``). The portal page starts from it."""
    from rest_framework.test import APIClient

    from channels_app.node_worker import log_shipping

    channel = factories.channel("cpu-0")
    log_shipping._add(channel.pk, "run-1", ["$ llama-server", "loading"])
    api = APIClient()
    api.force_authenticate(ana)
    url = f"/api/channels/{channel.pk}/log"
    first = api.get(url).data
    assert first["lines"] == ["$ llama-server", "loading"]
    assert api.get(url, {"after": first["cursor"]}).data["lines"] == []  # nothing new yet

    log_shipping._add(channel.pk, "run-1", ["listening"])
    since = api.get(url, {"after": first["cursor"]}).data
    assert (since["lines"], since["new_run"]) == (["listening"], False)
    assert api.get(url, {"after": since["cursor"]}).data["lines"] == []

    log_shipping._add(channel.pk, "run-2", ["$ llama-server again"])
    again = api.get(url, {"after": since["cursor"]}).data
    assert (again["lines"], again["new_run"]) == (["$ llama-server again"], True)

    bad = api.get(url, {"after": "yesterday"})
    assert bad.status_code == 400 and "after" in bad.data

    portal = Client()
    portal.force_login(ana)
    page = portal.get(f"/channel/{channel.pk}/log").content.decode()
    assert f'data-cursor="{again["cursor"]}"' in page and "$ llama-server again" in page


@pytest.mark.django_db(transaction=True)
def test_an_edited_preset_is_a_new_target_and_reaches_the_node_at_once(
    node_env, tiny, staff, node_queue_sends, django_capture_on_commit_callbacks
):
    """Seed 000: editing a running preset's arguments restarts the process with them (drain,
    restart), at once, not at the next tick and not never."""

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    first = converge(channel, until={Phase.READY})
    assert phase_after(channel, timezone.now()) == Phase.READY  # steady: nothing to do
    api = APIClient()
    api.force_authenticate(staff)
    with django_capture_on_commit_callbacks(execute=True):
        edited = api.patch(f"/api/presets/{tiny.small.pk}/", {"args": "-c 384 -t 1"}, format="json")
    assert edited.status_code == 200, edited.data
    assert (
        "channels_app.node_worker.tasks.channel_reconcile",
        (channel.pk,),
        channel.node.name,
    ) in node_queue_sends
    assert phase_after(channel, timezone.now()) == Phase.STOPPING  # nothing in flight: no drain
    again = converge(channel, until={Phase.READY})
    assert again.pid != first.pid and again.preset_id == tiny.small.pk
    command = Path(again.log_path).read_text().splitlines()[0]
    assert "-c 384" in command and "-c 256" not in command
    assert phase_after(channel, timezone.now()) == Phase.READY  # and it stays


@pytest.mark.django_db(transaction=True)
def test_a_process_from_before_fingerprints_is_not_restarted_by_the_upgrade(node_env, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    first = converge(channel, until={Phase.READY})
    ChannelRuntime.objects.filter(pk=first.pk).update(fingerprint="")  # as an older node stored it
    assert phase_after(channel, timezone.now()) == Phase.READY
    assert ChannelRuntime.objects.get(pk=first.pk).fingerprint != ""  # adopted, same process
    assert ChannelRuntime.objects.get(pk=first.pk).pid == first.pid


def test_a_runs_exit_code_is_known_to_every_look_not_only_the_first(tmp_path):
    """The log shipper asks whether the run is alive as often as the reconcile does; whichever
    looks first after a kill, the reconcile still learns the signal (it once heard "gone"
    whenever the shipper had looked first)."""
    from channels_app.backends import Backend
    from channels_app.node_worker import processes

    started = processes.start(
        processes.Launch(
            backend=Backend.VLLM,
            executable=STANDIN,
            model_path="qwen",
            alias="qwen",
            preset_args=[],
            gpu_indexes=[],
            host="127.0.0.1",
            log_dir=tmp_path,
        )
    )
    os.killpg(started.pid, signal.SIGKILL)
    assert eventually(lambda: not processes.alive(started.pid, started.run_id)[0])
    assert processes.alive(started.pid, started.run_id) == (False, -signal.SIGKILL)
    assert processes.alive(started.pid, started.run_id) == (False, -signal.SIGKILL)


@pytest.mark.django_db(transaction=True)
def test_the_places_of_a_real_llama_server_are_read_when_it_is_ready(node_env, tiny):
    """The gateway's fair queue needs the requests a process serves at once: llama-server's own
    ``/props`` tells (``-np 2``); a preset's ``places`` overrides it; a stopped channel has none."""
    parallel = factories.preset(tiny.model, "two", "-c 512 -t 1 -np 2")
    channel = factories.channel("cpu-0", default=parallel)
    decide_channels(now=timezone.now())
    assert converge(channel, until={Phase.READY}).places == 2
    parallel.places = 3  # an admin's edit counts at the next look, with no restart
    parallel.save()
    pid = ChannelRuntime.objects.get(channel=channel).pid
    assert converge(channel, until={Phase.READY}).places == 3
    parallel.places = None
    parallel.save()
    runtime = converge(channel, until={Phase.READY})
    assert (runtime.places, runtime.pid) == (2, pid)
    channel.default_model, channel.default_preset = None, None
    channel.save()
    decide_channels(now=timezone.now())
    assert converge(channel, until={Phase.STOPPED}).places is None


@pytest.mark.django_db(transaction=True)
def test_processes_listen_in_the_port_range_and_a_full_range_fails_naming_it(node_env, tiny, settings):
    from tests.conftest import free_port

    first = free_port()
    with socket.socket() as taken:  # something else already listens on the range's first port
        taken.bind(("127.0.0.1", first))
        taken.listen()
        settings.SLOTSERVE_PROCESS_PORTS = range(first, first + 2)
        channel = factories.channel("cpu-0", default=tiny.small)
        decide_channels(now=timezone.now())
        runtime = converge(channel, until={Phase.READY})
        assert runtime.port == first + 1
        assert httpx.get(f"http://127.0.0.1:{runtime.port}/health", timeout=5).status_code == 200

        # A second channel finds no port left: its load fails, saying which setting to widen.
        other = factories.channel("cpu-1", default=tiny.small)
        decide_channels(now=timezone.now())
        failed = converge(other, until={Phase.FAILED})
        assert f"no free port on 127.0.0.1 in SLOTSERVE_PROCESS_PORTS ({first}-{first + 1})" in failed.error


def test_a_port_range_inside_the_machines_ephemeral_ports_is_warned_of(tmp_path):
    said = tmp_path / "ip_local_port_range"
    said.write_text("32768\t60999\n")
    ephemeral = ports.ephemeral_ports(said)
    assert ephemeral == range(32768, 61000)
    assert ports.port_range_warning(range(31000, 32000), ephemeral) == ""
    assert ports.port_range_warning(None, ephemeral) == ""  # "any": the kernel picks, knowingly
    warning = ports.port_range_warning(range(40000, 40064), ephemeral)
    assert warning.startswith(
        "SLOTSERVE_PROCESS_PORTS (40000-40063) overlaps this machine's ephemeral ports (32768-60999"
    )
    assert ports.port_range_warning(range(32000, 32769), ephemeral) != ""  # one port in common
    assert ports.ephemeral_ports(tmp_path / "absent") is None


@pytest.mark.django_db(transaction=True)
def test_a_process_started_by_a_step_that_cannot_be_stored_is_stopped_not_left_to_no_channel(
    node_env, tiny, monkeypatch
):
    """The database goes away between starting a run and storing it (the chaos day's restarts
    and cut links): the step fails, and the run it started is stopped with it rather than left
    running with no channel naming it — the worker itself never takes its own children for
    strays, so nobody else would stop it."""
    from django.db import OperationalError

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    started: list[int] = []
    real_start = processes.start

    def start(launch):
        run = real_start(launch)
        started.append(run.pid)
        return run

    def store(runtime, state):
        raise OperationalError("the database went away")

    from channels_app.node_worker.rows import store as real_store

    monkeypatch.setattr(processes, "start", start)
    monkeypatch.setattr(worker, "store", store)
    with pytest.raises(OperationalError):
        worker.reconcile(channel_id=channel.pk, now=timezone.now())
    [pid] = started
    assert not ChannelRuntime.objects.filter(pid=pid).exists()

    def gone() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    assert eventually(gone, timeout=5), "the run no channel names still runs"
    # Its load was recorded as begun and never finished; the next step's load ends it, so usage
    # does not count the channel as loading from then on.
    [orphan] = LoadRecord.objects.filter(channel=channel, finished__isnull=True)
    monkeypatch.setattr(worker, "store", real_store)
    runtime = converge(channel, until={Phase.READY})
    orphan.refresh_from_db()
    assert orphan.finished is not None and orphan.succeeded is False
    assert runtime.load_id is not None and LoadRecord.objects.get(pk=runtime.load_id).succeeded is True


@pytest.mark.django_db(transaction=True)
def test_a_start_another_reconcile_stored_first_is_stopped_not_left_running(node_env, tiny, monkeypatch):
    """Two reconciles of one channel at once (its lock lost under a live holder: Redis restarted,
    the node's link cut) both start its process. The one whose start would be stored second
    finds the runtime naming another run: it stops what it started and keeps the other's, so no
    process runs that no channel owns (the worker's own children are never swept as strays)."""
    import subprocess

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mine: list[int] = []
    start = processes.start

    def overtaken(launch):
        started = start(launch)
        mine.append(started.pid)
        # Meanwhile the other reconcile started its own process and stored it.
        ChannelRuntime.objects.filter(channel=channel).update(run_id="the-others", pid=other.pid)
        return started

    monkeypatch.setattr(processes, "start", overtaken)
    try:
        assert worker.reconcile(channel_id=channel.pk, now=timezone.now()) is None
        [pid] = mine
        assert eventually(lambda: not _runs(pid), timeout=10), "what it started still runs"
        runtime = ChannelRuntime.objects.get(channel=channel)
        assert (runtime.run_id, runtime.pid) == ("the-others", other.pid)
    finally:
        other.kill()
        other.wait()


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # reaped between the two looks (or during the read)
        return False
    return state != "Z"


@pytest.mark.django_db
def test_ports_squatted_by_another_local_user_are_named_in_the_error():
    import os
    import subprocess

    from channels_app.node_worker.ports import free_port

    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another local user")
    ports = range(30950, 30954)
    squatter = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import socket, time\n"
            f"held = [socket.create_server(('0.0.0.0', p)) for p in range({ports.start}, {ports.stop})]\n"
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        with pytest.raises(OSError, match="no free port") as refused:
            free_port("127.0.0.1", ports)
    finally:
        squatter.kill()
        squatter.wait()
    message = str(refused.value)
    assert "no free port on 127.0.0.1 in SLOTSERVE_PROCESS_PORTS (30950-30953)" in message
    assert "4 are listened on, by uid 65534 (4 of them, port 30950 first)" in message, message
    assert "Ports taken by another user" in message


@pytest.mark.django_db(transaction=True)
def test_a_step_another_reconcile_stored_first_is_neither_stored_nor_told_again(node_env, tiny, monkeypatch):
    """Two reconciles of one channel at once (its lock lost under a live holder whose link was
    cut) both see the load become ready. The second to store finds the runtime moved on since it
    read it: it stores nothing and tells nothing, so the channel's ready is told once (a
    webhook's receiver heard "ready" after "switched" when both told it)."""
    from channels_app.models import StoryEntry

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    converge(channel, until={Phase.LOADING})
    assert eventually(
        lambda: processes.healthy(*ChannelRuntime.objects.values_list("host", "port", "api_secret").get()),
        timeout=30,
    )
    observe = worker.observe
    raced: list[Phase | None] = []

    def observed_then_overtaken(*args, **kwargs):
        seen = observe(*args, **kwargs)
        if not raced:  # the other reconcile runs whole while this one holds what it read
            raced.append(None)  # before it runs: its own look must not race again
            raced[0] = worker._reconcile(channel.pk, timezone.now()).phase
        return seen

    monkeypatch.setattr(worker, "observe", observed_then_overtaken)
    assert worker.reconcile(channel_id=channel.pk, now=timezone.now()) is None
    assert raced == [Phase.READY]
    assert StoryEntry.objects.filter(channel=channel, kind="ready").count() == 1
    assert ChannelRuntime.objects.get(channel=channel).phase == Phase.READY
