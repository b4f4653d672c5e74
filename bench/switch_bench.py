#!/usr/bin/env python
"""Benchmark: from a target change to a ready process, with the real llama-server.

    .venv/bin/python bench/switch_bench.py [--rounds 10] [--cold 5] [--warm 5] [--on-demand 5]

Needs Redis (SLOTSERVE_REDIS_URL) and builds llama-server if not cached.
A channel alternates between two presets of the tiny GGUF model through
admin overrides — the real path: override saved → re-decision task → reconcile
task on the node's queue → drain (nothing in flight) → SIGTERM → exit → start
→ ``/health`` 200. Measured against llama-server's own stop and load times,
taken by starting and stopping it directly, polling ``/health`` every 2 ms.
The difference is what SlotServe adds.

``--cold N``: a 1.6 GB GGUF evicted from the page cache is loaded N times cold and N times
after the node worker's prewarm read it (docs/node-workers.md, "Prewarm from the calendar").

``--on-demand N``: a gateway is asked N times for a model no channel runs, its caller waiting,
to its first streamed token (the default stopped, the model loaded on demand, released after).

``--warm N``: the channel's default becomes a vLLM model (the stand-in, whose load takes
``WARM_LOAD_SECONDS``); an override to the tiny model and its clearing, N times, with sleep mode
off (the default loads cold again) and on (it sleeps through the override and is woken,
docs/scheduling.md "Sleep and wake"): the time from the clearing to the default ready.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_once(binary: str, model: Path, port: int) -> tuple[float, subprocess.Popen[bytes]]:
    """Start llama-server on ``model``: seconds from start to ``/health`` 200, and the process."""
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-t", "1"]
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                return time.perf_counter() - started, child
        except httpx.HTTPError:
            pass
        if child.poll() is not None:
            raise SystemExit(f"llama-server exited with {child.returncode} loading {model}")
        time.sleep(0.002)


def stop(child: subprocess.Popen[bytes]) -> float:
    stopping = time.perf_counter()
    child.send_signal(signal.SIGTERM)
    child.wait()
    return time.perf_counter() - stopping


def direct_times(binary: str, model: Path, rounds: int) -> tuple[list[float], list[float]]:
    """llama-server's own load time (start → /health 200) and stop time (SIGTERM → exit)."""
    loads, stops = [], []
    for i in range(rounds):
        seconds, child = load_once(binary, model, 18500 + i)
        loads.append(seconds)
        stops.append(stop(child))
    return loads, stops


def cold_times(binary: str, folder: Path, rounds: int) -> dict[str, list[float]]:
    """A 1.6 GB model evicted from the page cache (``posix_fadvise(DONTNEED)``) and loaded, then
    evicted, read by the node worker's prewarm and loaded: both loads, and the prewarm's read."""
    from channels_app.node_worker import page_cache
    from devtools.tinymodel import write_tiny_llama

    model = write_tiny_llama(folder / "big.gguf", width=1024, blocks=24, ff=4096)
    times: dict[str, list[float]] = {"cold": [], "prewarmed": [], "prewarm read": []}
    for i in range(rounds):
        page_cache.evict(model)
        seconds, child = load_once(binary, model, 18600 + i)
        times["cold"].append(seconds)
        stop(child)
        page_cache.evict(model)
        read = page_cache.read_into_cache(model, mbps=0, reserve_bytes=0)
        times["prewarm read"].append(read.seconds)
        seconds, child = load_once(binary, model, 18650 + i)
        times["prewarmed"].append(seconds)
        stop(child)
    model.unlink()
    return times


def start_gateway(port: int) -> Any:
    """SlotServe's gateway on ``port``, in a thread of this process, started: its uvicorn server."""
    import threading

    import uvicorn

    from gateway.serve.proxy import Gateway

    server = uvicorn.Server(
        uvicorn.Config(
            Gateway(), host="127.0.0.1", port=port, lifespan="off", log_level="warning",
            http="gateway.serve.server:GatewayHttp",
        )
    )  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server


def news_times(channel: Any, model: Any, rounds: int) -> dict[str, list[float]]:
    """A gateway serving the channel's ready llama-server, its snapshot's age limit 30 s: how long
    from an approval (of a booking already begun) to the gateway refusing someone else, from its
    ending early to serving them again, and from a key's revocation to refusing it."""

    from django.conf import settings
    from django.contrib.auth.models import User
    from django.utils import timezone

    from gateway.api_keys import api_key_create, api_key_revoke
    from reservations.models import Reservation, ReservationStatus
    from reservations.services.transitions import reservation_approve, reservation_end

    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 30
    settings.SLOTSERVE_TICK_SECONDS = 3600  # the node counts as ready without its worker's beats
    boss = User.objects.create(username="boss", is_staff=True)
    ana, bo = User.objects.create(username="ana"), User.objects.create(username="bo")
    _, bo_key = api_key_create(user=bo, name="bench")
    server = start_gateway(18700)
    client = httpx.Client(base_url="http://127.0.0.1:18700", timeout=10)

    def status(key: str, path: str = "/v1/chat/completions") -> int:
        if path != "/v1/chat/completions":
            return client.get(path, headers={"Authorization": f"Bearer {key}"}).status_code
        asked = {"model": model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        return client.post(path, json=asked, headers={"Authorization": f"Bearer {key}"}).status_code

    def until(wanted: int, key: str, path: str = "/v1/chat/completions") -> float:
        """After a change: how long until the gateway answers ``wanted`` (each change half a second
        after the last, as changes come in a lab; a storm of them is read more slowly, a read at
        most every four reads' time: docs/gateway.md)."""
        began = time.perf_counter()
        while status(key, path) != wanted:
            if time.perf_counter() - began > 10:
                raise SystemExit(f"the gateway never answered {wanted}")
        return time.perf_counter() - began

    times: dict[str, list[float]] = {
        "approval → refused at the gateway": [],
        "ended early → served again": [],
    }
    times["key revoked → refused"] = []
    until(200, bo_key)  # the last switch's gate open
    from gateway.admit.snapshot import read_snapshot

    read_times = []
    for _ in range(10):
        began = time.perf_counter()
        read_snapshot()
        read_times.append(time.perf_counter() - began)
    for _ in range(rounds):
        now = timezone.now()
        booking = Reservation.objects.create(
            user=ana, channel=channel, start=now - timedelta(minutes=1), end=now + timedelta(hours=1),
            model=model, status=ReservationStatus.PENDING,
        )  # fmt: skip
        time.sleep(0.5)
        reservation_approve(reservation=booking, by=boss, now=timezone.now())
        times["approval → refused at the gateway"].append(until(403, bo_key))
        time.sleep(0.5)
        reservation_end(reservation=booking, by=boss, now=timezone.now())
        times["ended early → served again"].append(until(200, bo_key))
        key, plain = api_key_create(user=bo, name="revoked")
        until(200, plain, "/v1/models")
        time.sleep(0.5)
        api_key_revoke(api_key=key)
        times["key revoked → refused"].append(until(401, plain, "/v1/models"))
    server.should_exit = True
    times["a snapshot's read (10, beside)"] = read_times
    return times


# A switch's legs, each from one happening of the channel's story to the next (the moments its
# deciders and node worker stepped at): where SlotServe's share goes.
def legs(channel: Any, since: Any) -> dict[str, float]:
    """The legs of the switch begun at ``since``, in seconds: from each happening told to the next
    (the first of each kind, in the order told)."""
    from channels_app.models import StoryEntry

    first: dict[str, Any] = {}
    for kind, at in StoryEntry.objects.filter(channel=channel, at__gte=since).values_list("kind", "at"):
        first.setdefault(kind, at)
    told = list(first.items())
    return {f"{a} → {b}": (b_at - a_at).total_seconds() for (a, a_at), (b, b_at) in itertools.pairwise(told)}


def on_demand_times(
    channel: Any, default: Any, model_path: Path, rounds: int, wait_ready: Any
) -> dict[str, list[float]]:
    """``--on-demand``: a request through a gateway for a model no channel runs, its caller
    waiting (``X-SlotServe-Wait``), to its first streamed token; the load released after each
    round and the default back (docs/scheduling.md, "Loaded on demand")."""

    from django.conf import settings
    from django.contrib.auth.models import User
    from django.utils import timezone

    from channels_app.models import Gpu, LLMModel, OnDemandLoad, StoryEntry
    from channels_app.scheduling.on_demand import on_demand_release
    from channels_app.scheduling.services import override_clear
    from gateway.api_keys import api_key_create

    settings.SLOTSERVE_TICK_SECONDS = 3600  # the node counts as ready without its worker's beats
    settings.SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR = rounds + 1
    node = channel.node
    node.backends, node.last_heartbeat = ["llama.cpp"], timezone.now()
    node.save()
    Gpu.objects.get_or_create(node=node, index=0, defaults={"name": "bench", "memory_bytes": 24 * 2**30})
    LLMModel.objects.create(
        name="asked", backend="llama.cpp", path=str(model_path), size_bytes=model_path.stat().st_size
    )
    override_clear(channel=channel, now=timezone.now(), by=None)
    wait_ready(default)
    user = User.objects.create(username="ondemand")
    _, key = api_key_create(user=user, name="bench")
    server = start_gateway(18701)
    client = httpx.Client(base_url="http://127.0.0.1:18701", timeout=60)
    body = {
        "model": "asked",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}", "X-SlotServe-Wait": "60"}

    def first_token() -> float:
        began = time.perf_counter()
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
            if answer.status_code != 200:
                raise SystemExit(f"on demand: {answer.status_code} {answer.read()!r}")
            for line in answer.iter_lines():
                if line.startswith("data: {"):  # the first chunk: the first token generated
                    return time.perf_counter() - began
        raise SystemExit(f"on demand: the stream ended without a token: {line!r}")

    times: dict[str, list[float]] = {
        "request → first token (loaded on demand)": [],
        "first token, loaded": [],
    }
    for _ in range(rounds):
        asked_at = timezone.now()
        times["request → first token (loaded on demand)"].append(first_token())
        answered_at = timezone.now()
        load = OnDemandLoad.objects.get(released_at__isnull=True)
        ready = StoryEntry.objects.filter(channel=channel, at__gte=asked_at, kind="ready").first()
        times.setdefault("  request → recorded", []).append((load.started_at - asked_at).total_seconds())
        for leg, seconds in legs(channel, asked_at).items():
            times.setdefault(f"  {leg}", []).append(seconds)
        if ready is not None:
            times.setdefault("  ready → first token", []).append((answered_at - ready.at).total_seconds())
        times["first token, loaded"].append(first_token())
        on_demand_release(load=load, now=timezone.now(), why="staff")
        wait_ready(default)
    server.should_exit = True
    return times


# The stand-in vLLM's load in the warm case: what a cold load costs beside a wake.
WARM_LOAD_SECONDS = 2.0


def warm_times(channel: Any, tiny: Any, rounds: int, wait_ready: Any) -> dict[str, list[float]]:
    """The default's return after an override, loaded cold and woken (``--warm``)."""
    from django.conf import settings
    from django.utils import timezone

    from channels_app.models import LLMModel, Preset
    from channels_app.scheduling.services import override_clear, override_set

    sleepy = LLMModel.objects.create(name="sleepy", backend="vllm", path=tiny.model.path, size_bytes=1)
    preset = Preset.objects.create(model=sleepy, name="s", args=f"--standin-load-seconds {WARM_LOAD_SECONDS}")
    channel.default_model, channel.default_preset = sleepy, preset
    channel.save()
    found: dict[str, list[float]] = {}
    for mode in (False, True):
        settings.SLOTSERVE_SLEEP_MODE = mode
        override_clear(channel=channel, now=timezone.now(), by=None)
        wait_ready(preset)
        times = found.setdefault("woken" if mode else "loaded cold", [])
        for turn in range(rounds + 1):  # the first turn starts the default as the mode starts it
            until = timezone.now() + timedelta(hours=1)
            override_set(
                channel=channel, model=tiny.model, preset=tiny, until=until, now=timezone.now(), by=None
            )
            wait_ready(tiny)
            started = time.perf_counter()
            override_clear(channel=channel, now=timezone.now(), by=None)
            wait_ready(preset)
            if turn:
                times.append(time.perf_counter() - started)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--news",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time approvals and revocations at a gateway",
    )
    parser.add_argument(
        "--cold", type=int, default=0, metavar="ROUNDS", help="also load a 1.6 GB model cold and prewarmed"
    )
    parser.add_argument(
        "--warm", type=int, default=0, metavar="ROUNDS", help="also hand back to a default that slept"
    )
    parser.add_argument(
        "--on-demand",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also ask a gateway for a model no channel runs",
    )
    args = parser.parse_args()

    binary = subprocess.run(
        [str(ROOT / "scripts" / "build-llama-server")], capture_output=True, text=True, check=True
    ).stdout.strip()
    os.environ.pop("DATABASE_URL", None)
    os.environ["SLOTSERVE_DATA_DIR"] = tempfile.mkdtemp(prefix="slotserve-switch-")
    os.environ["SLOTSERVE_LLAMA_SERVER"] = binary
    os.environ["SLOTSERVE_FAKE_GPUS"] = "1x24GiB"
    os.environ["SLOTSERVE_VLLM"] = f"{sys.executable} -m devtools.standin"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)
    from celery.contrib.testing.worker import start_worker
    from django.core.management import call_command
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, LoadRecord, Node, Preset
    from channels_app.scheduling.services import decide_channels, override_set
    from devtools.tinymodel import write_tiny_llama
    from slotserve_base.dispatch import decisions_queue, node_queue
    from slotserve_site.celery import app

    call_command("migrate", verbosity=0)
    model_path = write_tiny_llama(Path(os.environ["SLOTSERVE_DATA_DIR"]) / "tiny.gguf")
    loads, stops = direct_times(binary, model_path, args.rounds)

    node = Node.objects.create(name=f"bench-{uuid.uuid4().hex[:6]}", last_heartbeat=timezone.now())
    model = LLMModel.objects.create(
        name="tiny", backend="llama.cpp", path=str(model_path), size_bytes=model_path.stat().st_size
    )
    presets = [
        Preset.objects.create(model=model, name=n, args=f"-c {c} -t 1") for n, c in (("a", 256), ("b", 384))
    ]
    channel = Channel.objects.create(
        name="bench-0", node=node, gpu_indexes=[0], default_model=model, default_preset=presets[0]
    )
    decide_channels(now=timezone.now())

    def wait_ready(preset: Preset) -> None:
        while True:
            runtime = ChannelRuntime.objects.filter(channel=channel).first()
            if runtime and runtime.phase == "ready" and runtime.preset_id == preset.pk:
                return
            time.sleep(0.002)

    switches = []
    load_began: list[float] = []  # the override's commit → the node worker's step that starts the load
    stages: dict[str, list[float]] = {}  # each leg of a switch, from the channel's story
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=[decisions_queue(), node_queue(node.name)],
        loglevel="WARNING",
    ):
        from channels_app.node_worker.tasks import channel_reconcile

        channel_reconcile.apply_async(args=(channel.pk,), queue=node_queue(node.name))
        wait_ready(presets[0])
        for i in range(args.rounds):
            target = presets[(i + 1) % 2]
            started = time.perf_counter()
            overridden = timezone.now()
            override_set(
                channel=channel,
                model=model,
                preset=target,
                until=timezone.now() + timedelta(hours=1),
                now=timezone.now(),
                by=None,
            )
            wait_ready(target)
            switches.append(time.perf_counter() - started)
            load = LoadRecord.objects.filter(channel=channel).order_by("-started").first()
            if load is not None:
                load_began.append((load.started - overridden).total_seconds())
            for leg, seconds in legs(channel, overridden).items():
                stages.setdefault(leg, []).append(seconds)
        news = news_times(channel, model, args.news) if args.news else {}
        on_demand = (
            on_demand_times(channel, presets[0], model_path, args.on_demand, wait_ready)
            if args.on_demand
            else {}
        )
        warm = warm_times(channel, presets[1], args.warm, wait_ready) if args.warm else {}
    runtime = ChannelRuntime.objects.get(channel=channel)
    if runtime.asleep:
        os.killpg(int(runtime.asleep["pid"]), signal.SIGTERM)
    if runtime.pid:
        os.killpg(runtime.pid, signal.SIGTERM)

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values) * 1000:7.1f} ms, max {max(values) * 1000:7.1f} ms"

    overhead = [s - statistics.median(loads) - statistics.median(stops) for s in switches]
    print(f"rounds: {args.rounds}")
    print(f"llama-server load (start → /health 200): {ms(loads)}")
    print(f"llama-server stop (SIGTERM → exit):      {ms(stops)}")
    print(f"SlotServe switch (override → ready):     {ms(switches)}")
    print(f"SlotServe's own share:                   {ms(overhead)}")
    print(f"override → the load began (idle):        {ms(load_began)}")
    for leg, values in stages.items():
        print(f"  {leg:<39}{ms(values)}")
    for what, values in news.items():
        print(f"{what:<41}{ms(values)}")
    if on_demand:
        asked, loaded = (
            on_demand["request → first token (loaded on demand)"],
            on_demand["first token, loaded"],
        )
        share = [
            a - statistics.median(loads) - statistics.median(stops) - b
            for a, b in zip(asked, loaded, strict=True)
        ]
        print(f"on-demand rounds: {args.on_demand}, the default stopped and the asked model loaded")
        print(f"request → first token (loaded on demand): {ms(asked)}")
        print(f"first token once loaded:                 {ms(loaded)}")
        print(f"SlotServe's own share (less load, stop): {ms(share)}")
        for leg, values in on_demand.items():
            if leg.startswith("  "):
                print(f"{leg:<41}{ms(values)}")
    if args.cold:
        cold = cold_times(binary, Path(os.environ["SLOTSERVE_DATA_DIR"]), args.cold)
        ratio = statistics.median(cold["cold"]) / statistics.median(cold["prewarmed"])
        print(f"cold rounds: {args.cold}, a 1.6 GB GGUF")
        print(f"load, evicted from the page cache:       {ms(cold['cold'])}")
        print(f"load after the prewarm:                  {ms(cold['prewarmed'])}")
        print(f"the prewarm's read (in the slot before): {ms(cold['prewarm read'])}")
        print(f"cold ÷ prewarmed (medians):              {ratio:.2f}×")
    if warm:
        ratio = statistics.median(warm["loaded cold"]) / statistics.median(warm["woken"])
        print(f"warm rounds: {args.warm}, a stand-in vLLM whose load takes {WARM_LOAD_SECONDS:g} s")
        print(f"override cleared → default loaded cold:  {ms(warm['loaded cold'])}")
        print(f"override cleared → default woken:        {ms(warm['woken'])}")
        print(f"loaded cold ÷ woken (medians):           {ratio:.2f}×")


if __name__ == "__main__":
    main()
