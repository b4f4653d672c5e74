"""What each GPU is doing, on the overview (docs/portal.md, "Overview"): use, memory held and
temperature as the node's heartbeat last saw them. NVML's numbers on an NVIDIA card
(scripts/gpu-check prints them on a GPU machine); a fake GPU reports what its channel's
processes use of the machine, so the numbers move with real work."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from channels_app.models import ChannelRuntime, Gpu
from channels_app.node_worker import gpus, registration
from portal.views import gpu_use_words
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import eventually

GiB = 2**30

# A process that holds 200 MiB and keeps a core busy, as a model answering would.
BUSY = "import time\nheld = bytearray(200 * 2**20)\nwhile True:\n    sum(range(10_000))\n"


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _sample(holders: dict[int, list[int]]) -> list[gpus.GpuInfo]:
    return gpus.fake_use(gpus.parse_fake_gpus("2x24GiB"), holders)


def test_a_fake_gpu_reports_what_its_processes_use_and_an_idle_one_is_cool(busy):
    _sample({0: [busy.pid]})  # the first look starts the measure of CPU use
    seen: list[list[gpus.GpuInfo]] = []

    def busy_enough() -> bool:
        seen.append(_sample({0: [busy.pid]}))
        return (seen[-1][0].utilization_percent or 0) >= 50

    assert eventually(busy_enough, 20, 0.5)
    used, idle = seen[-1]
    assert used.memory_bytes - used.free_bytes >= 200 * 2**20  # the process's resident memory
    assert used.temperature_c is not None and gpus.IDLE_C < used.temperature_c <= gpus.BUSY_C
    assert (idle.utilization_percent, idle.free_bytes, idle.temperature_c) == (0, 24 * GiB, gpus.IDLE_C)


def test_a_process_on_two_gpus_shares_its_use_between_them_and_a_gone_one_counts_nothing(busy):
    _sample({0: [busy.pid], 1: [busy.pid]})
    seen: list[list[gpus.GpuInfo]] = []
    both = {0: [busy.pid], 1: [busy.pid]}

    def both_busy() -> bool:
        seen.append(_sample(both))
        return (seen[-1][0].utilization_percent or 0) >= 25

    assert eventually(both_busy, 20, 0.5)
    first, second = seen[-1]
    assert first.utilization_percent == second.utilization_percent
    assert (first.utilization_percent or 0) <= 60  # one core, halved
    busy.kill()
    busy.wait()
    gone, _ = _sample({0: [busy.pid]})
    assert (gone.utilization_percent, gone.free_bytes) == (0, 24 * GiB)


@pytest.mark.django_db
def test_the_heartbeat_keeps_each_gpus_use_and_the_overview_shows_it_while_fresh(settings, busy, ana):
    settings.SLOTSERVE_FAKE_GPUS = "2x24GiB"
    node = factories.node("gpu-a", gpus=0)
    channel = factories.channel("a100-0", on=node, gpu_indexes=[1])
    qwen = factories.llm("qwen")
    ChannelRuntime.objects.create(channel=channel, phase=Phase.READY, model=qwen, port=1, pid=busy.pid)

    def beat_until_busy() -> bool:
        registration.heartbeat(node_name="gpu-a", now=timezone.now())
        return (Gpu.objects.get(node=node, index=1).utilization_percent or 0) >= 50

    assert eventually(beat_until_busy, timeout=20, every=0.5)
    held, spare = Gpu.objects.get(node=node, index=1), Gpu.objects.get(node=node, index=0)
    assert held.sampled_at is not None and held.free_bytes is not None and held.temperature_c is not None
    assert held.free_bytes < 24 * GiB and held.temperature_c > gpus.IDLE_C
    assert (spare.utilization_percent, spare.free_bytes) == (0, 24 * GiB)
    page = factories.client_for(ana).get("/").content.decode()
    card = page[page.index('data-channel="a100-0"') :]
    line = card[card.index('<ul class="gpu-use') : card.index("</ul>")]
    assert f"GPU 1: {held.utilization_percent} % busy" in line and f"{held.temperature_c} °C" in line
    assert "GPU 0" not in line  # not this channel's
    nodes = factories.client_for(ana).get("/api/nodes/").json()
    listed = {g["index"]: g for n in nodes for g in n["gpus"]}
    assert listed[1]["utilization_percent"] == held.utilization_percent
    assert listed[1]["temperature_c"] == held.temperature_c


def test_a_stale_sample_is_not_shown_as_now(settings):
    now = timezone.now()
    gpu = Gpu(index=0, memory_bytes=24 * GiB, free_bytes=20 * GiB, utilization_percent=40, temperature_c=55)
    gpu.sampled_at = now - timedelta(seconds=2)
    assert gpu_use_words([gpu], [0], now) == ["GPU 0: 40 % busy · 4 GiB of 24 GiB held · 55 °C"]
    gpu.sampled_at = now - timedelta(seconds=4 * settings.SLOTSERVE_TICK_SECONDS)
    assert gpu_use_words([gpu], [0], now) == []
    gpu.sampled_at, gpu.temperature_c, gpu.utilization_percent = now, None, None  # a MIG slice
    assert gpu_use_words([gpu], [0], now) == ["GPU 0: 4 GiB of 24 GiB held"]
