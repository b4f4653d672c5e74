#!/usr/bin/env python
"""Benchmark: lending a booked model while its booker is idle (docs/gateway.md, "Lending").

    .venv/bin/python bench/lend_bench.py [--seconds 30] [--places 2] [--rounds 2]

The whole gateway in front of a real ``llama-server`` with the tiny test model and 2 parallel
slots. The booker, in their slot, sends bursts (two short streams at once, then a pause of
1–3 s); two colleagues keep long streams going on the same model (each asks for as many tokens
as a slot holds), obeying ``Retry-After`` when they are refused or ended. Measured with the
booking lent and not lent, in turns, on the same channel:

- the booker's time to first token (p50, p95);
- the share of the booker's idle place-seconds (the slot's places × its seconds, less the
  booker's own requests' time) that the colleagues' borrowed requests used;
- how many borrowed requests the booker's ended.

Goals: the booker's p95 with lending on within 100 ms of lending off; borrowers use at least
80 % of the idle place-seconds. ``llama-server`` runs on one thread (``-t 1``): on a 2-core machine
its other thread would take the CPU the gateway and the clients need, where on a GPU the model's
work is the GPU's. Needs Redis and ``scripts/build-llama-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fairness_bench import p, tiny_llama_server  # noqa: E402
from gateway_bench import bench_database, forget_redis_keys, free_port, uvicorn_argv, wait_http  # noqa: E402

BURST: dict[str, object] = {"max_tokens": 24}
LONG: dict[str, object] = {"max_tokens": 480, "ignore_eos": True}


async def stream(
    client: httpx.AsyncClient, url: str, key: str, extra: dict[str, object]
) -> dict[str, object]:
    """One streamed completion: its status, time to first token, whole time, and whether the
    booker's request ended it (and the ``Retry-After`` it was told)."""
    body = {"model": "tiny", "prompt": "Once upon a time", "stream": True, **extra}
    started = time.perf_counter()
    first = None
    ended_by_booker = False
    async with client.stream(
        "POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as answer:
        retry = float(answer.headers.get("retry-after", 0) or 0)
        if answer.status_code != 200:
            text = await answer.aread()
            refused = answer.status_code == 403  # lending off: nothing to wait for here
            return {
                "status": answer.status_code,
                "retry": 1.0 if refused else retry,
                "ended": b"preempted" in text,
            }
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                ended_by_booker = chunk["error"].get("code") == "preempted_by_booker"
                retry = 0.0  # as its message says: send it again, it waits its turn
            elif first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter()
    done = time.perf_counter()
    return {
        "status": 200,
        "ttft": (first or done) - started,
        "seconds": done - started,
        "ended": ended_by_booker,
        "retry": retry,
    }


async def booker(url: str, key: str, until: float, rng: random.Random) -> tuple[list[float], float]:
    """Bursts of two streams, then a pause: the booker's times to first token and busy
    place-seconds."""
    ttfts: list[float] = []
    busy = 0.0
    async with httpx.AsyncClient(timeout=120) as client:
        while time.perf_counter() < until:
            answers = await asyncio.gather(*(stream(client, url, key, BURST) for _ in range(2)))
            for answer in answers:
                if answer["status"] == 200:
                    ttfts.append(float(answer["ttft"]))  # type: ignore[arg-type]
                    busy += float(answer["seconds"])  # type: ignore[arg-type]
            await asyncio.sleep(rng.uniform(1.0, 3.0))
    return ttfts, busy


async def borrower(url: str, key: str, until: float) -> tuple[int, int]:
    """Long streams one after another, waiting as told when refused or ended: (served, ended)."""
    served = ended = 0
    async with httpx.AsyncClient(timeout=120) as client:
        while time.perf_counter() < until:
            answer = await stream(client, url, key, LONG)
            served += answer["status"] == 200
            ended += bool(answer["ended"])
            if answer["status"] != 200 or answer["ended"]:
                await asyncio.sleep(min(float(answer["retry"]), max(0.0, until - time.perf_counter())))  # type: ignore[arg-type]
    return served, ended


def borrowed_place_seconds(since: float) -> float:
    """The borrowed requests' time in the process since ``since`` (from the request log: each
    one's duration less its wait in the queue)."""
    from datetime import UTC, datetime

    from gateway.models import RequestLog
    from gateway.usage.request_log import flush_request_log
    from slotserve_base.redis_client import redis_client

    flush_request_log(redis_client())
    rows = RequestLog.objects.filter(borrowed=True, at__gte=datetime.fromtimestamp(since, tz=UTC))
    return sum((d - (q or 0.0)) / 1000 for d, q in rows.values_list("duration_ms", "queued_ms"))


async def run_mode(
    url: str, keys: dict[str, str], seconds: float, places: int, seed: int
) -> dict[str, float]:
    started_wall = time.time()
    until = time.perf_counter() + seconds
    (ttfts, busy), *borrowed = await asyncio.gather(
        booker(url, keys["booker"], until, random.Random(seed)),
        borrower(url, keys["c1"], until),
        borrower(url, keys["c2"], until),
    )
    await asyncio.sleep(1.5)  # the last records reach the log
    return {
        "since": started_wall,
        "p50": p(ttfts, 0.5),
        "p95": p(ttfts, 0.95),
        "bursts": len(ttfts) / 2,
        "idle": places * seconds - busy,
        "served": sum(s for s, _ in borrowed),
        "ended": sum(e for _, e in borrowed),
    }


def measured(url: str, keys: dict[str, str], seconds: float, places: int, seed: int) -> dict[str, float]:
    """One run, with the borrowed requests' place-seconds read from the request log after it."""
    run = asyncio.run(run_mode(url, keys, seconds, places, seed))
    used = borrowed_place_seconds(run.pop("since"))
    return {**run, "used": used, "share": used / run["idle"] if run["idle"] > 0 else 0.0}


def prepare(llama_port: int, places: int) -> tuple[dict[str, str], dict[str, str], int]:
    """A database with one lending channel running the llama-server, the booker's slot on it
    (an hour), and keys for the booker and two colleagues. Returns the env, keys, the booking's id."""
    env = bench_database("lendbench")
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, Node, Preset
    from gateway.api_keys import api_key_create
    from reservations.models import Reservation

    node = Node.objects.create(name="bench", last_heartbeat=timezone.now())
    model = LLMModel.objects.create(name="tiny", backend="llama.cpp", path="/tiny.gguf")
    preset = Preset.objects.create(model=model, name="default")
    channel = Channel.objects.create(name="bench-0", node=node, gpu_indexes=[0], lend_while_idle=True)
    ChannelRuntime.objects.create(
        channel=channel, phase="ready", model=model, preset=preset, host="127.0.0.1", port=llama_port,
        pid=1, places=places,
    )  # fmt: skip
    keys, users = {}, {}
    for who in ("booker", "c1", "c2"):
        users[who] = get_user_model().objects.create_user(f"user-{who}")
        keys[who] = api_key_create(user=users[who], name="bench")[1]
    now = timezone.now()
    booking = Reservation.objects.create(
        user=users["booker"], channel=channel, start=now - timedelta(minutes=1), end=now + timedelta(hours=1),
        model=model, preset=preset, status="approved",
    )  # fmt: skip
    return env, keys, booking.pk


def lend(booking_id: int, on: bool) -> None:
    from reservations.models import Reservation

    Reservation.objects.filter(pk=booking_id).update(lend=on)
    time.sleep(2.5)  # the gateway's snapshot sees it


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30, help="each run's length")
    parser.add_argument("--places", type=int, default=2, help="llama-server's parallel slots")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both modes (medians reported)")
    options = parser.parse_args()
    llama, llama_port = tiny_llama_server(options.places, "-t", "1")
    gateway = None
    try:
        wait_http(llama_port)
        env, keys, booking_id = prepare(llama_port, options.places)
        port = free_port()
        gateway = subprocess.Popen(uvicorn_argv("slotserve_site.asgi:application", port), env=env, cwd=ROOT)
        wait_http(port)
        url = f"http://127.0.0.1:{port}"
        runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for n in range(options.rounds):
            for mode in ("off", "on") if n % 2 == 0 else ("on", "off"):
                lend(booking_id, mode == "on")
                runs[mode].append(measured(url, keys, options.seconds, options.places, seed=n))
        results = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
        print(f"\nbooker's bursts of 2 on {options.places} places, two colleagues borrowing; "
              f"{options.seconds:g} s runs, medians of {options.rounds} rounds\n")  # fmt: skip
        print("| | lending off | lending on |")
        print("| --- | --- | --- |")
        cells = [f"{results[m]['p50'] * 1000:.0f} / {results[m]['p95'] * 1000:.0f}" for m in ("off", "on")]
        print(f"| booker's time to first token, p50 / p95 (ms) | {' | '.join(cells)} |")
        cells = [f"{results[m]['idle']:.1f} / {results[m]['used']:.1f}" for m in ("off", "on")]
        print(f"| booker's idle place-seconds / used by borrowers | {' | '.join(cells)} |")
        cells = [f"{results[m]['share']:.0%}" for m in ("off", "on")]
        print(f"| share of the idle place-seconds borrowed (goal ≥ 80 %) | {' | '.join(cells)} |")
        cells = [f"{results[m]['served']:.0f} / {results[m]['ended']:.0f}" for m in ("off", "on")]
        print(f"| borrowed requests served / ended by the booker's | {' | '.join(cells)} |")
        added = (results["on"]["p95"] - results["off"]["p95"]) * 1000
        print(f"\nThe booker's p95 with lending on is {added:+.0f} ms from lending off (goal ≤ 100 ms).")
    finally:
        for child in (gateway, llama):
            if child is not None:
                child.terminate()
                child.wait()
        forget_redis_keys(os.environ.get("SLOTSERVE_REDIS_PREFIX", "lendbench"))


if __name__ == "__main__":
    main()
