"""docs/node-workers.md, "Readiness pushed": one reconcile task carries a quick switch through to
ready, looking every few milliseconds, and a health probe costs a local request, not a TLS setup."""

from __future__ import annotations

import ssl
import time

import pytest
from django.utils import timezone

from channels_app.models import ChannelRuntime, ChannelTarget
from channels_app.node_worker import processes, settle
from channels_app.node_worker.tasks import channel_reconcile
from channels_app.scheduling.services import decide_channels
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.conftest import free_port, running_llama_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_health_probe_loads_no_certificates(llama_server_bin, tiny_gguf, monkeypatch):
    """Each probe of a plain-HTTP local process once built a TLS context with the system's
    certificates: 42 ms of CPU a probe, more than a tiny model's whole load."""
    with running_llama_server(llama_server_bin, tiny_gguf, "-c", "256", "-t", "1") as port:
        assert processes.healthy("127.0.0.1", port)  # the probe's client, made once
        loaded: list[str] = []
        real = ssl.SSLContext.load_verify_locations

        def counting(self, *args, **kwargs):
            loaded.append("certificates")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
        began = time.perf_counter()
        assert all(processes.healthy("127.0.0.1", port) for _ in range(20))
        assert (processes.slots("127.0.0.1", port) or 0) >= 1
        assert loaded == []
        print(f"20 probes: {(time.perf_counter() - began) * 1000:.1f} ms")
    assert not processes.healthy("127.0.0.1", free_port())  # nothing listens: not healthy, no error


def test_one_task_carries_a_quick_load_and_a_quick_switch_through_to_ready(node_env, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    # The tiny model loads in tens of milliseconds: the task that starts it sees it ready.
    assert channel_reconcile(channel.pk) == Phase.READY.value
    first = ChannelRuntime.objects.get(channel=channel)

    ChannelTarget.objects.filter(channel=channel).update(preset=tiny.big, reason="manual_override")
    began = time.monotonic()
    assert channel_reconcile(channel.pk) == Phase.READY.value  # stopped, started, ready: one task
    took = time.monotonic() - began
    switched = ChannelRuntime.objects.get(channel=channel)
    assert (switched.preset_id, switched.phase) == (tiny.big.pk, Phase.READY)
    assert switched.pid != first.pid and not processes.alive(first.pid, first.run_id)[0]
    assert took < settle.SETTLE_SECONDS * 2, took


def test_a_slow_load_is_handed_to_the_follow_ups(node_env, tiny, settings):
    """A load that takes longer than the close watch leaves the task loading (the follow-ups
    take it from there), so a worker thread is never held for a whole load."""
    slow = factories.llm("slow", backend="vllm")
    slow.path = tiny.model.path
    slow.save()
    channel = factories.channel("cpu-1", default=factories.preset(slow, "slow", "--standin-load-seconds 3"))
    decide_channels(now=timezone.now())
    began = time.monotonic()
    assert channel_reconcile(channel.pk) == Phase.LOADING.value
    assert time.monotonic() - began < settle.SETTLE_SECONDS + 1.0


def test_the_overview_and_the_gateways_are_told_of_a_phase_once_it_is_stored(node_env, tiny, monkeypatch):
    """Told before the store, a page (or a gateway) reading at once saw the old phase."""
    from channels_app.node_worker import worker
    from slotserve_base import news, overview

    channel = factories.channel("cpu-2", default=tiny.small)
    decide_channels(now=timezone.now())
    seen: list[tuple[str, str, str]] = []

    def stored_phase() -> str:
        return ChannelRuntime.objects.get(channel=channel).phase

    monkeypatch.setattr(
        overview, "refresh", lambda ids, what: seen.append(("overview", what, stored_phase()))
    )
    monkeypatch.setattr(news, "changed", lambda what: seen.append(("news", what, stored_phase())))
    worker.reconcile(channel_id=channel.pk, now=timezone.now())
    assert seen == [("news", "loading", "loading"), ("overview", "loading", "loading")]


def test_a_stop_whose_memory_is_not_yet_freed_is_not_stepped_again_and_again(node_env, tiny, monkeypatch):
    """The process has exited but its GPU memory is still held (a driver slow to free it): the
    watch saw the exit, the next step still waits for the memory, and the task hands the channel
    to the follow-ups instead of stepping it again every few milliseconds for half a second."""
    from channels_app.node_worker import gpus, worker

    channel = factories.channel("cpu-3", default=tiny.small)
    decide_channels(now=timezone.now())
    assert channel_reconcile(channel.pk) == Phase.READY.value
    old = ChannelRuntime.objects.get(channel=channel).pid
    monkeypatch.setattr(gpus, "pids_on", lambda indexes: {old})  # the old run still holds memory
    steps: list[str] = []
    real = worker.reconcile

    def counted(**kwargs):
        state = real(**kwargs)
        steps.append(state.phase.value if state else "held")
        return state

    monkeypatch.setattr(worker, "reconcile", counted)
    ChannelTarget.objects.filter(channel=channel).update(preset=tiny.big, reason="manual_override")
    phase = channel_reconcile(channel.pk)
    assert (phase, steps) == (
        Phase.STOPPING.value,
        ["stopping", "stopping"],
    )  # the stop, and one look once it exited


def test_each_step_of_a_switch_reads_the_models_and_presets_once(node_env, tiny):
    """A step named the same model and presets for its default, its target, its process, its
    load and its story, and read them again each time: 20-29 queries a step, of which a
    quarter read the same rows again (docs/benchmarks.md, "The pushes, and the steps' reads")."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from channels_app.node_worker.worker import reconcile

    channel = factories.channel("cpu-3", default=tiny.small)
    decide_channels(now=timezone.now())
    assert channel_reconcile(channel.pk) == Phase.READY.value
    ChannelTarget.objects.filter(channel=channel).update(preset=tiny.big, reason="manual_override")
    phases = []
    for _ in range(10):
        with CaptureQueriesContext(connection) as step:
            state = reconcile(channel_id=channel.pk, now=timezone.now())
        assert state is not None
        phases.append(state.phase)
        reads = [q["sql"] for q in step.captured_queries if q["sql"].startswith("SELECT")]
        for table in ("channels_app_llmmodel", "channels_app_preset"):
            read = [sql for sql in reads if sql.split(" FROM ", 1)[1].startswith(f'"{table}"')]
            assert len(read) <= 1, (state.phase, table, read)
        if state.phase == Phase.READY and len(phases) > 1:
            break
    assert {Phase.STOPPING, Phase.LOADING, Phase.READY} <= set(phases), phases
