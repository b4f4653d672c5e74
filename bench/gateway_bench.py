#!/usr/bin/env python
"""Benchmark: what the gateway adds to streamed completions.

    .venv/bin/python bench/gateway_bench.py [--server gateway|uvicorn|daphne] [--seconds 5]
        [--delay-ms 20] [--upstream raw|uvicorn|fastapi] [--levels 1,16,64] [--litellm PATH]
        [--bare] [--no-lane] [--against CHECKOUT] [--channels 12] [--limits] [--places N] [--rounds 3]
        [--traces] [--lent]

A fast upstream (16 SSE chunks per request, back to back or --delay-ms apart;
in raw asyncio, as a bare ASGI app under uvicorn, or as a FastAPI streaming
route under uvicorn like vLLM's and SGLang's servers) is called directly and through SlotServe's gateway (a
separate server process) and through a byte relay written with asyncio streams (no HTTP
parsing: the floor any Python proxy costs), alternating, by a closed-loop load generator: each
of 1, 16 and 64 concurrent workers keeps its own keep-alive connection and
sends the next request when the last one ends. Reported per level: time to
first token (p50, p99), requests per second, the gateway's added latency and
throughput ratio, and the CPU milliseconds each server process spent per
request, split into its own code's (user: for a Python server, the interpreter's) and the
kernel's (its reads and writes). With --litellm PATH (a litellm executable), LiteLLM's proxy is
measured in the same run, configured to the same upstream. With --bare, the gateway's own
HTTP server and upstream client passing requests through with none of the gateway's work
(``bench/bare_gateway.py``): what its design costs, apart from what its work costs. With
--no-lane, SlotServe with its fast lane switched off (``bench/application_gateway.py``: every
request through the gateway's ASGI application) in the same run: what the lane saves. With
--against CHECKOUT, the gateway of another checkout (``git worktree add /tmp/before HEAD~1``)
in the same run: what a change saves, apart from the noise between runs. With
--limits, fair sharing's limits are set (high enough never to refuse), so every request is
checked against them before it goes upstream. With --traces, a second SlotServe gateway with
OpenTelemetry's traces on (``OTEL_EXPORTER_OTLP_ENDPOINT``, to a sink that takes them, like a
collector) in the same run: what a trace per request costs. With --places N, the serving
channel's fair queue is on (docs/gateway.md): what counting its places costs. With --lent, a
second channel runs the same upstream in someone else's slot that lends (docs/gateway.md,
"Lending"), both channels with the same places (--places, 1,000 unless given), and each SlotServe
gateway is also measured borrowing there ("lent", "ag. lent"): what a borrowed request costs
beside a free channel's (no fast lane, watched for its end). Needs Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHUNKS = 16
# An added time to the first token shorter than this is within the noise of the direct runs.
MEASURABLE_MS = 0.05
# The kernel counts CPU time in clock ticks (10 ms): a run that spent less than this is too coarse
# to compare.
MEASURABLE_CPU_SECONDS = 0.2


# --- The fast upstream ------------------------------------------------------------

CHUNK = (
    b'data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
)
USAGE = (
    b'data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":'
    b'{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}\n\n'
)


async def upstream_main(port: int, delay: float) -> None:
    framed = f"{len(CHUNK):x}\r\n".encode() + CHUNK + b"\r\n"
    framed_usage = f"{len(USAGE):x}\r\n".encode() + USAGE + b"\r\n"
    done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"cache-control: no-cache\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                if headers.startswith(b"GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    continue
                writer.write(head)
                for _ in range(CHUNKS):
                    writer.write(framed)
                    if delay:
                        await writer.drain()
                        await asyncio.sleep(delay)
                if b"include_usage" in body:
                    writer.write(framed_usage)
                writer.write(done)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def uvicorn_upstream_main(port: int, delay: float) -> None:
    """The same answers from an ASGI application under uvicorn (httptools, uvloop): the server
    vLLM's and SGLang's OpenAI endpoints run in, without their framework on top."""
    import uvicorn

    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send(start)
        for _ in range(CHUNKS):
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            if delay:
                await asyncio.sleep(delay)
        if b"include_usage" in body:
            await send({"type": "http.response.body", "body": USAGE, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    uvicorn.run(app, port=port, log_level="warning", access_log=False, lifespan="off")


# --- The closed-loop load generator -------------------------------------------


async def one_worker(
    host: str,
    port: int,
    path: str,
    key: str,
    deadline: float,
    ttfts: list[float],
    counts: list[int],
    model: str = "m",
) -> None:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            first = True
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip(), 16)
                data = await reader.readexactly(size + 2)
                if first and size:
                    ttfts.append(time.perf_counter() - started)
                    first = False
                if size == 0:
                    break
                del data
            counts[0] += 1
    finally:
        writer.close()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The CPU seconds a process has spent in its own code (user) and in the kernel's (system:
    its reads and writes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


async def load(
    port: int, path: str, key: str, workers: int, seconds: float, model: str = "m"
) -> tuple[list[float], int]:
    ttfts: list[float] = []
    counts = [0]
    deadline = time.perf_counter() + seconds
    await asyncio.gather(
        *(one_worker("127.0.0.1", port, path, key, deadline, ttfts, counts, model) for _ in range(workers))
    )
    return ttfts, counts[0]


def measure(
    name: str, port: int, path: str, key: str, workers: int, seconds: float, pid: int, model: str = "m"
) -> dict[str, float]:
    asyncio.run(load(port, path, key, workers, min(1.0, seconds), model))  # warm up connections and caches
    user_before, system_before = cpu_seconds(pid)
    started = time.perf_counter()
    ttfts, done = asyncio.run(load(port, path, key, workers, seconds, model))
    elapsed = time.perf_counter() - started
    user_after, system_after = cpu_seconds(pid)
    user, system = user_after - user_before, system_after - system_before
    ttfts.sort()
    return {
        "p50": statistics.median(ttfts) * 1000,
        "p99": ttfts[int(len(ttfts) * 0.99) - 1] * 1000 if len(ttfts) > 1 else ttfts[0] * 1000,
        "rps": done / elapsed,
        "cpu_ms": (user + system) * 1000 / max(done, 1),
        "user_ms": user * 1000 / max(done, 1),
        "system_ms": system * 1000 / max(done, 1),
        "cpu_seconds": user + system,
    }


def cpu_versus(ours: dict[str, float], floor: dict[str, float]) -> str:
    """``ours``'s CPU per request against ``floor``'s: in all, in its own code and in the kernel."""
    if min(ours["cpu_seconds"], floor["cpu_seconds"]) < MEASURABLE_CPU_SECONDS:
        return "CPU per request too little to compare (under 0.2 s in a run)"

    def times(figure: str) -> str:
        return f"{ours[figure] / floor[figure]:.1f}x" if floor[figure] > 0 else "-"

    return (
        f"CPU per request {times('cpu_ms')} the relay's "
        f"(user {times('user_ms')}, kernel {times('system_ms')})"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_http(port: int, path: str = "/health", timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def bench_database(name: str) -> dict[str, str]:
    """A fresh SlotServe database (SQLite, in a folder of its own) and Redis prefix for a
    benchmark named ``name``, set up in this process: the environment its servers run with."""
    data = tempfile.mkdtemp(prefix=f"slotserve-{name}-")
    env = {
        **os.environ,
        "SLOTSERVE_DATA_DIR": data,
        "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
        "SLOTSERVE_REDIS_PREFIX": f"{name}-{os.getpid()}",
    }
    env.pop("DATABASE_URL", None)
    os.environ.update(env)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return env


def prepare_gateway(
    upstream_port: int, channels: int = 1, places: int | None = None, lent: bool = False
) -> tuple[dict[str, str], str]:
    """A SlotServe database with one channel running the upstream (with ``places``: its fair
    queue on), ``channels - 1`` more running other models (never called: what the gateway looks
    through for each request), and an API key; with ``lent``, a channel running the upstream as
    model ``m-lent`` in someone else's slot that lends, with the same places."""
    env = bench_database("gwbench")
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, Node
    from gateway.api_keys import api_key_create

    user = get_user_model().objects.create_user("bench")
    node = Node.objects.create(name="bench", last_heartbeat=timezone.now())
    model = LLMModel.objects.create(name="m", backend="vllm", path="/m")
    channel = Channel.objects.create(name="bench-0", node=node, gpu_indexes=[0])
    ChannelRuntime.objects.create(
        channel=channel,
        phase="ready",
        model=model,
        host="127.0.0.1",
        port=upstream_port,
        pid=1,
        places=places,
    )
    for n in range(1, channels):
        other = Channel.objects.create(name=f"bench-{n}", node=node, gpu_indexes=[n])
        ChannelRuntime.objects.create(
            channel=other,
            phase="ready",
            model=LLMModel.objects.create(name=f"m{n}", backend="vllm", path=f"/m{n}"),
            host="127.0.0.1",
            port=free_port(),
            pid=1,
        )
    if lent:
        lend_lent_channel(node, upstream_port, places)
    _, key = api_key_create(user=user, name="bench")
    return env, key


def lend_lent_channel(node: Any, upstream_port: int, places: int | None) -> None:
    """Channel ``bench-lent``: the upstream as model ``m-lent``, booked by someone else for the
    day and lent while they are idle (they send nothing): every request the bench sends there is
    borrowed."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, Preset
    from reservations.models import Reservation

    model = LLMModel.objects.create(name="m-lent", backend="vllm", path="/m-lent")
    preset = Preset.objects.create(model=model, name="default")
    channel = Channel.objects.create(name="bench-lent", node=node, gpu_indexes=[99], lend_while_idle=True)
    ChannelRuntime.objects.create(
        channel=channel, phase="ready", model=model, preset=preset, host="127.0.0.1",
        port=upstream_port, pid=1, places=places,
    )  # fmt: skip
    now = timezone.now()
    Reservation.objects.create(
        user=get_user_model().objects.create_user("booker"), channel=channel,
        start=now - timedelta(minutes=1), end=now + timedelta(days=1), model=model, preset=preset,
        status="approved", lend=True,
    )  # fmt: skip


def own_http_server(root: Path) -> str:
    """The gateway's own HTTP server in the checkout at ``root``: ``gateway.serve.server`` since
    the gateway has rooms, ``gateway.server`` before (a checkout measured with --against)."""
    room = root / "gateway" / "serve" / "server.py"
    return "gateway.serve.server:GatewayHttp" if room.exists() else "gateway.server:GatewayHttp"


def uvicorn_argv(app: str, port: int, *, own_http: bool = True, root: Path = ROOT) -> list[str]:
    """uvicorn serving ``app`` on ``port`` quietly; with the gateway's own HTTP server in front
    (``gateway.serve.server``, as ``./slotserve start`` runs it) unless ``own_http`` is false."""
    return [
        str(Path(sys.executable).parent / "uvicorn"),
        app,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--lifespan",
        "off",
        *(["--http", own_http_server(root)] if own_http else []),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server",
        choices=["gateway", "uvicorn", "daphne"],
        default="gateway",
        help="gateway: uvicorn with the gateway's own HTTP server in front (gateway.serve.server, what "
        "./slotserve start runs); uvicorn: uvicorn's own HTTP for every request; daphne",
    )
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--delay-ms", type=float, default=0, help="pause between upstream chunks")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the servers in turn this many times per level and report the medians "
        "(steadier ratios on a busy machine)",
    )
    parser.add_argument(
        "--upstream",
        choices=["raw", "uvicorn", "fastapi"],
        default="raw",
        help="raw asyncio (the fastest possible upstream), a bare ASGI app under uvicorn, or a "
        "FastAPI streaming route under uvicorn (how vLLM and SGLang serve)",
    )
    parser.add_argument("--litellm", metavar="PATH", help="a litellm executable to compare with")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also measure the gateway's server and upstream client doing none of its work",
    )
    parser.add_argument(
        "--no-lane",
        action="store_true",
        help="also measure SlotServe with its fast lane off (every request through the application)",
    )
    parser.add_argument(
        "--channels",
        type=int,
        default=1,
        help="channels in the gateway's snapshot: the one that serves, and others running other "
        "models (a lab with three servers of four GPUs has twelve)",
    )
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="also measure the gateway of another checkout of SlotServe (git worktree add DIR "
        "COMMIT) in the same run, on the same database: a change's effect, apart from the noise "
        "between runs",
    )
    parser.add_argument(
        "--places",
        type=int,
        help="the serving channel's places (docs/gateway.md, fair sharing): its fair queue is on, "
        "and with more places than workers never holds a request",
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="set fair sharing's limits (never reached): each request is checked before it goes up",
    )
    parser.add_argument(
        "--traces", action="store_true", help="also a gateway exporting a trace per request (OTLP)"
    )
    parser.add_argument(
        "--lent",
        action="store_true",
        help="also measure each SlotServe gateway borrowing in someone else's lent slot",
    )
    args = parser.parse_args()
    if args.lent and args.places is None:
        args.places = 1000  # a lent slot needs its places known; never reached
    if args.limits:
        os.environ.update(
            SLOTSERVE_LIMIT_CONCURRENT_REQUESTS="100000",
            SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE="100000000",
            SLOTSERVE_LIMIT_WEEKLY_TOKENS="1000000000000",
        )

    upstream_port, gateway_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [
            sys.executable,
            __file__,
            f"--{args.upstream}-upstream",
            str(upstream_port),
            str(args.delay_ms / 1000),
        ]
    )
    env, key = prepare_gateway(upstream_port, args.channels, args.places, args.lent)
    venv_bin = Path(sys.executable).parent
    if args.server in ("gateway", "uvicorn"):
        argv = uvicorn_argv(
            "slotserve_site.asgi:application", gateway_port, own_http=args.server == "gateway"
        )
    else:
        argv = [
            str(venv_bin / "daphne"),
            "-p",
            str(gateway_port),
            "-v",
            "0",
            "slotserve_site.asgi:application",
        ]
    gateway = subprocess.Popen(argv, env=env, cwd=ROOT)
    relay_port = free_port()
    relay = subprocess.Popen([sys.executable, __file__, "--relay", str(relay_port), str(upstream_port)])
    servers = {
        "direct": (upstream_port, "/v1/chat/completions", upstream.pid),
        "relay": (relay_port, "/v1/chat/completions", relay.pid),
    }
    bare = None
    if args.bare:
        bare_port = free_port()
        bare = subprocess.Popen(
            [*uvicorn_argv("bare_gateway:application", bare_port), "--app-dir", str(ROOT / "bench")],
            env={**env, "SLOTSERVE_BENCH_UPSTREAM": f"http://127.0.0.1:{upstream_port}"},
            cwd=ROOT,
        )
        servers["bare"] = (bare_port, "/v1/chat/completions", bare.pid)
    servers["slotserve"] = (gateway_port, "/v1/chat/completions", gateway.pid)
    no_lane = None
    if args.no_lane:
        no_lane_port = free_port()
        no_lane = subprocess.Popen(
            [
                *uvicorn_argv("application_gateway:application", no_lane_port),
                "--app-dir",
                str(ROOT / "bench"),
            ],
            env=env,
            cwd=ROOT,
        )
        servers["no lane"] = (no_lane_port, "/v1/chat/completions", no_lane.pid)
    traced = sink = None
    if args.traces:
        sink_port, traced_port = free_port(), free_port()
        sink = subprocess.Popen([sys.executable, __file__, "--otlp-sink", str(sink_port)])
        traced = subprocess.Popen(
            uvicorn_argv("slotserve_site.asgi:application", traced_port, own_http=args.server == "gateway"),
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}"},
            cwd=ROOT,
        )
        servers["traced"] = (traced_port, "/v1/chat/completions", traced.pid)
    against = None
    if args.against:
        against_port = free_port()
        against_root = Path(args.against).resolve()
        against = subprocess.Popen(
            [
                *uvicorn_argv("slotserve_site.asgi:application", against_port, root=against_root),
                "--app-dir",
                str(against_root),
            ],
            env={**env, "PYTHONPATH": str(against_root)},
            cwd=against_root,
        )
        servers["against"] = (against_port, "/v1/chat/completions", against.pid)
    models = {name: "m" for name in servers}
    if args.lent:
        for name, lent_name in (("slotserve", "lent"), ("against", "ag. lent")):
            if name in servers:
                servers[lent_name], models[lent_name] = servers[name], "m-lent"
    litellm = None
    if args.litellm:
        litellm_port = free_port()
        config = Path(env["SLOTSERVE_DATA_DIR"]) / "litellm.yaml"
        config.write_text(
            "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
            f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: none\n"
        )
        litellm_env = {
            **env,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MASTER_KEY": "sk-bench",
            "LITELLM_LOG": "ERROR",
        }
        litellm = subprocess.Popen(
            [args.litellm, "--config", str(config), "--port", str(litellm_port), "--num_workers", "1"],
            env=litellm_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        servers["litellm"] = (litellm_port, "/v1/chat/completions", litellm.pid)
    try:
        wait_http(upstream_port)
        wait_http(gateway_port, "/v1/models")
        if litellm:
            wait_http(servers["litellm"][0], "/health/liveliness", timeout=180)
        wait_http(relay_port)
        if bare:
            wait_http(servers["bare"][0], "/v1/models")
        if no_lane:
            wait_http(servers["no lane"][0], "/v1/models")
        if against:
            wait_http(servers["against"][0], "/v1/models")
        if traced:
            wait_http(servers["traced"][0], "/v1/models")
        keys = {
            "direct": "none",
            "relay": "none",
            "bare": "none",
            "slotserve": key,
            "no lane": key,
            "against": key,
            "traced": key,
            "lent": key,
            "ag. lent": key,
            "litellm": "sk-bench",
        }
        print(
            f"server: {args.server}; upstream: {args.upstream}, chunk delay {args.delay_ms:g} ms; "
            f"{args.seconds:g} s per run"
            + (f", medians of {args.rounds} rounds" if args.rounds > 1 else "")
            + ("; fair sharing's limits set" if args.limits else "")
            + (f"; {args.channels} channels" if args.channels > 1 else "")
            + (f"; {args.places} places a channel" if args.places else "")
        )
        print(
            f"{'streams':>7} {'via':>9} {'TTFT p50':>9} {'p99':>8} {'req/s':>8} {'vs direct':>9} "
            f"{'added p50':>9} {'CPU/req':>9} {'user':>8} {'kernel':>8}"
        )
        for level in [int(x) for x in args.levels.split(",")]:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
            for _ in range(args.rounds):  # the servers in turn, round after round
                for name, (port, path, pid) in servers.items():
                    runs[name].append(
                        measure(name, port, path, keys[name], level, args.seconds, pid, models.get(name, "m"))
                    )
            results = {
                name: {figure: statistics.median(run[figure] for run in measured) for figure in measured[0]}
                for name, measured in runs.items()
            }
            direct = results["direct"]
            for name, r in results.items():
                ratio = r["rps"] / direct["rps"]
                added = r["p50"] - direct["p50"]
                print(
                    f"{level:>7} {name:>9} {r['p50']:>7.2f}ms {r['p99']:>6.2f}ms {r['rps']:>8.0f} "
                    f"{ratio:>8.0%} {added:>7.2f}ms {r['cpu_ms']:>6.3f}ms {r['user_ms']:>6.3f}ms "
                    f"{r['system_ms']:>6.3f}ms"
                )
            floor = results["relay"]
            floor_added = floor["p50"] - direct["p50"]
            for name in (
                name
                for name in ("bare", "slotserve", "no lane", "against", "traced", "lent", "ag. lent")
                if name in results
            ):
                ours = results[name]
                # Under load the relay may answer as soon as the upstream itself (its queue is
                # the upstream's): no time of its own to compare with.
                versus = (
                    f"{(ours['p50'] - direct['p50']) / floor_added:.1f}x the relay's"
                    if floor_added >= MEASURABLE_MS
                    else f"{ours['p50'] - direct['p50']:.2f} ms (the relay's {floor_added:.2f} ms)"
                )
                print(f"{level:>7} {'÷ relay':>9}  {name}: added TTFT {versus}, {cpu_versus(ours, floor)}")
    finally:
        for process in (gateway, upstream, relay, litellm, bare, no_lane, against, traced, sink):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=10)
        forget_redis_keys(env["SLOTSERVE_REDIS_PREFIX"])


async def relay_main(port: int, upstream_port: int) -> None:
    """The floor: a byte relay in asyncio streams (no HTTP parsing) in front of the upstream,
    what any Python proxy costs at least."""
    from devtools.cluster import pipe

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def otlp_sink(port: int) -> None:
    """Takes OTLP/HTTP exports and answers 200, as a collector would, keeping nothing."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


def forget_redis_keys(prefix: str) -> None:
    """The run's counters and metrics leave Redis with it."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter(match=f"{prefix}:*"):
        client.delete(name)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--relay":
        try:
            import uvloop

            uvloop.install()  # as fast a loop as the gateway's
        except ImportError:
            pass
        asyncio.run(relay_main(int(sys.argv[2]), int(sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--otlp-sink":
        otlp_sink(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--raw-upstream":
        asyncio.run(upstream_main(int(sys.argv[2]), float(sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--uvicorn-upstream":
        uvicorn_upstream_main(int(sys.argv[2]), float(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--fastapi-upstream":
        from fastapi_upstream import serve  # beside this file

        serve(int(sys.argv[2]), float(sys.argv[3]), chunks=CHUNKS, chunk=CHUNK, usage=USAGE)
    else:
        main()
