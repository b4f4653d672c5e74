#!/usr/bin/env python
"""Benchmark: fair sharing under contention (docs/gateway.md, "Fair sharing under contention").

    .venv/bin/python bench/fairness_bench.py [--streams 10] [--seconds 20] [--places 2]

The whole gateway in front of a real ``llama-server`` with the tiny test model and 2 parallel
slots (``-np 2``). User A keeps ``--streams`` long streams going (each asks for as many tokens as
a slot holds, ``ignore_eos``); user B sends short requests one after another. Measured for the
fair queue and for first come first served (``SLOTSERVE_FAIR_QUEUE=false``: every request goes
straight to the process, whose own queue is first come first served), each by its own gateway
process on the same channel, in the same run:

- B's time to first token alone, and under A's flood (p50, p95);
- A's median stream time in the flood (from sending to the last byte, its own wait included);
- A's throughput (tokens per second) alone and while B asks.

Goals: B's p95 under the flood at most 0.25 × A's median stream time (first come first served
gives about 1.0), A alone keeps at least 95 % of its throughput with the queue on.
Needs Redis and ``scripts/build-llama-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_bench import bench_database, forget_redis_keys, free_port, uvicorn_argv, wait_http  # noqa: E402

LONG = {"max_tokens": 480, "ignore_eos": True}
SHORT = {"max_tokens": 8}


async def stream(
    client: httpx.AsyncClient, url: str, key: str, extra: Mapping[str, object]
) -> tuple[float, float, int]:
    """One streamed completion: its time to the first token, its whole time, its tokens."""
    body = {"model": "tiny", "prompt": "Once upon a time", "stream": True, **extra}
    started = time.perf_counter()
    first, tokens = None, 0
    async with client.stream(
        "POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {(await answer.aread())[:300]!r}")
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                tokens += 1
                if first is None:
                    first = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, ended - started, tokens


async def flood(url: str, key: str, streams: int, until: float) -> tuple[list[float], int, float]:
    """A's closed loop of ``streams`` long streams until ``until``: stream times, tokens, seconds."""
    times: list[float] = []
    tokens = 0
    started = time.perf_counter()

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while time.perf_counter() < until:
            _, whole, made = await stream(client, url, key, LONG)
            times.append(whole)
            tokens += made

    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(streams)))
    return times, tokens, time.perf_counter() - started


async def asking(url: str, key: str, until: float, delay: float = 0.0) -> list[float]:
    """B's short requests one after another until ``until``: times to first token."""
    await asyncio.sleep(delay)
    ttfts: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        while time.perf_counter() < until:
            ttft, _, _ = await stream(client, url, key, SHORT)
            ttfts.append(ttft)
            await asyncio.sleep(0.05)
    return ttfts


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_mode(url: str, keys: dict[str, str], streams: int, seconds: float) -> dict[str, float]:
    now = time.perf_counter
    alone_b = await asking(url, keys["b"], now() + seconds / 4)
    _, a_tokens, a_seconds = await flood(url, keys["a"], streams, now() + seconds / 2)
    until = now() + seconds
    (f_times, f_tokens, f_seconds), b_ttfts = await asyncio.gather(
        flood(url, keys["a"], streams, until), asking(url, keys["b"], until, delay=1.0)
    )
    median_stream = statistics.median(f_times)
    return {
        "b_alone_p50": p(alone_b, 0.5),
        "b_alone_p95": p(alone_b, 0.95),
        "b_flood_p50": p(b_ttfts, 0.5),
        "b_flood_p95": p(b_ttfts, 0.95),
        "b_requests": len(b_ttfts),
        "a_median_stream": median_stream,
        "a_alone_tps": a_tokens / a_seconds,
        "a_flood_tps": f_tokens / f_seconds,
        "ratio": p(b_ttfts, 0.95) / median_stream,
    }


def prepare(llama_port: int, places: int) -> tuple[dict[str, str], dict[str, str]]:
    """A SlotServe database with one channel running the llama-server, and a key for A and B."""
    env = bench_database("fairbench")
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, Node
    from gateway.api_keys import api_key_create

    node = Node.objects.create(name="bench", last_heartbeat=timezone.now())
    model = LLMModel.objects.create(name="tiny", backend="llama.cpp", path="/tiny.gguf")
    channel = Channel.objects.create(name="bench-0", node=node, gpu_indexes=[0])
    ChannelRuntime.objects.create(
        channel=channel, phase="ready", model=model, host="127.0.0.1", port=llama_port, pid=1, places=places
    )
    keys = {}
    for who in ("a", "b"):
        user = get_user_model().objects.create_user(f"user-{who}")
        keys[who] = api_key_create(user=user, name="bench")[1]
    return env, keys


def tiny_llama_server(places: int, *options: str) -> tuple[subprocess.Popen[bytes], int]:
    """A real ``llama-server`` (built by ``scripts/build-llama-server``) with the tiny test model
    and ``places`` parallel slots, as ``tiny``: the process and its port."""
    import tempfile

    from devtools.tinymodel import write_tiny_llama

    binary = subprocess.run(
        [str(ROOT / "scripts" / "build-llama-server")], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    model = write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny.gguf")
    port = free_port()
    argv = [binary, "-m", str(model), "--port", str(port), "-np", str(places), "-c", str(512 * places)]
    server = subprocess.Popen(
        [*argv, "--alias", "tiny", *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return server, port


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=10, help="A's streams at once")
    parser.add_argument("--seconds", type=float, default=20, help="the flood's length in each mode")
    parser.add_argument("--places", type=int, default=2, help="llama-server's parallel slots")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of both modes, in turn first (medians reported)"
    )
    options = parser.parse_args()
    llama, llama_port = tiny_llama_server(options.places)
    gateways: list[subprocess.Popen[bytes]] = []
    try:
        wait_http(llama_port)
        env, keys = prepare(llama_port, options.places)
        urls = {}
        for mode, fair in (("fair queue", "true"), ("first come first served", "false")):
            port = free_port()
            gateways.append(
                subprocess.Popen(
                    uvicorn_argv("slotserve_site.asgi:application", port),
                    env={**env, "SLOTSERVE_FAIR_QUEUE": fair},
                    cwd=ROOT,
                )
            )
            wait_http(port)
            urls[mode] = f"http://127.0.0.1:{port}"
        rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in urls}
        for n in range(options.rounds):
            order = list(urls) if n % 2 == 0 else list(reversed(urls))
            for mode in order:
                rounds[mode].append(asyncio.run(run_mode(urls[mode], keys, options.streams, options.seconds)))
        results = {
            mode: {name: statistics.median(r[name] for r in runs) for name in runs[0]}
            for mode, runs in rounds.items()
        }
        print(
            f"\n{options.streams} streams of user A on {options.places} places; user B's short "
            f"requests; medians of {options.rounds} rounds\n"
        )
        print("| | fair queue | first come first served |")
        print("| --- | --- | --- |")
        rows = [
            ("B's time to first token alone, p50 / p95 (ms)", "b_alone_p50", "b_alone_p95"),
            ("B's time to first token under A's flood, p50 / p95 (ms)", "b_flood_p50", "b_flood_p95"),
        ]
        for label, lo, hi in rows:
            cells = [f"{results[m][lo] * 1000:.0f} / {results[m][hi] * 1000:.0f}" for m in urls]
            print(f"| {label} | {' | '.join(cells)} |")
        cells = [f"{results[m]['a_median_stream'] * 1000:.0f}" for m in urls]
        print(f"| A's median stream time in the flood (ms) | {' | '.join(cells)} |")
        cells = [f"{results[m]['ratio']:.2f}" for m in urls]
        print(f"| B's p95 ÷ A's median stream time (goal ≤ 0.25) | {' | '.join(cells)} |")
        cells = [f"{results[m]['a_alone_tps']:.0f} / {results[m]['a_flood_tps']:.0f}" for m in urls]
        print(f"| A's tokens per second alone / while B asks | {' | '.join(cells)} |")
        cells = [f"{results[m]['b_requests']:.0f}" for m in urls]
        print(f"| B's requests answered under the flood | {' | '.join(cells)} |")
        kept = results["fair queue"]["a_alone_tps"] / results["first come first served"]["a_alone_tps"]
        print(f"\nA alone with the queue on keeps {kept:.0%} of its throughput without it (goal ≥ 95 %).")
    finally:
        for child in [*gateways, llama]:
            child.terminate()
            child.wait()
        forget_redis_keys(os.environ.get("SLOTSERVE_REDIS_PREFIX", "fairbench"))


if __name__ == "__main__":
    main()
