from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

import slotserve_base.dispatch
from channels_app.models import ChannelRuntime
from gateway.api_keys import api_key_create
from tests import factories
from tests.clock import PORTAL_T0, eventually
from tests.queued import MEMORY, Queued, use_broker
from tests.world import Tiny, World

STANDIN = f"{sys.executable} -m devtools.standin"
GiB = 2**30


@pytest.fixture
def frozen(request):
    """Time stands still at the test module's ``T0`` (``tests.clock.T0`` unless it names another)."""
    import time_machine

    from tests import clock

    with time_machine.travel(getattr(request.module, "T0", clock.T0), tick=False) as traveller:
        yield traveller


@pytest.fixture(autouse=True)
def queued() -> Iterator[Queued]:
    """Tasks wait on Celery's in-memory broker until the test runs them (``queued.run()``,
    tests/queued.py); a test that needs Redis and a real worker switches the broker back."""
    use_broker(MEMORY)
    waiting = Queued()
    waiting.clear()
    yield waiting
    waiting.clear()


REAL_SEND_TO_NODE = slotserve_base.dispatch.send_to_node


@pytest.fixture(autouse=True)
def node_queue_sends(monkeypatch):
    """What the scheduler sent to node queues. Tests drive node workers themselves
    (``channels_app.node_worker.worker.reconcile`` with ``now`` injected), so nothing runs here."""
    sent: list[tuple[str, tuple[Any, ...], str]] = []
    monkeypatch.setattr(
        "slotserve_base.dispatch.send_to_node",
        lambda task, args, node, countdown=None: sent.append((task, args, node)),
    )
    return sent


@pytest.fixture
def real_node_queues(monkeypatch):
    """For the tests that run a real node worker on Redis."""
    monkeypatch.setattr("slotserve_base.dispatch.send_to_node", REAL_SEND_TO_NODE)
    use_broker(settings.CELERY_BROKER_URL)


@pytest.fixture
def staff(db):
    return factories.user("admin", staff=True)


@pytest.fixture
def ana(db):
    return factories.user("ana")


@pytest.fixture
def bo(db):
    return factories.user("bo")


def _client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def staff_api(staff) -> APIClient:
    return _client_for(staff)


@pytest.fixture
def ana_api(ana) -> APIClient:
    return _client_for(ana)


@pytest.fixture
def bo_api(bo) -> APIClient:
    return _client_for(bo)


@pytest.fixture(autouse=True)
def _own_redis_keys(settings):
    """Each test its own Redis keys, so parallel test processes never see each other's counts."""
    import uuid

    settings.SLOTSERVE_REDIS_PREFIX = f"slotserve-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Test users need no slow password hashing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    """A real llama-server, built once per machine by the project's own script (cached)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "build-llama-server"
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=3000)
    if done.returncode != 0:
        pytest.fail(f"could not build llama-server:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    from devtools.tinymodel import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture
def node_env(settings, tmp_path, llama_server_bin):
    settings.DATA_DIR = tmp_path
    settings.SLOTSERVE_LLAMA_SERVER = llama_server_bin
    settings.SLOTSERVE_VLLM = STANDIN
    settings.SLOTSERVE_SGLANG = STANDIN
    settings.SLOTSERVE_FAKE_GPUS = "1x24GiB"
    yield
    # Stop whatever a failing test left running.
    from channels_app.models import ChannelRuntime
    from channels_app.node_worker import processes

    for runtime in ChannelRuntime.objects.exclude(pid=None):
        processes.send(runtime.pid, signal.SIGKILL)


@pytest.fixture
def tiny(tiny_gguf):
    model = factories.llm("tiny", size=tiny_gguf.stat().st_size)
    model.path = str(tiny_gguf)
    model.save()
    return Tiny(
        model=model,
        small=factories.preset(model, "small", "-c 256 --port 1 -t 1"),
        big=factories.preset(model, "big", "-c 512 -t 1"),
    )


def _port_block() -> Iterator[int]:
    """This test process's own ports, below the kernel's ephemeral range, round and round."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = 20000 + 500 * (int(worker) % 20 if worker.isdigit() else 0)  # under 30000
    return itertools.cycle(range(first, first + 500))


_ports = _port_block()


def free_port() -> int:
    """A port nothing listens on, for a server a test starts.

    Not one the kernel hands out for port 0: between a probe and the server's bind, the kernel can
    hand that same port to an outgoing connection (to PostgreSQL, say), and the server then fails
    with "Address already in use". Ports below the ephemeral range are never handed out so, and
    each xdist worker counts through a block of its own, so no two running tests pick the same.
    """
    for _ in range(500):
        port = next(_ports)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this test process's block")


@pytest.fixture(params=["lane", "application"])
def gateway_url(request, settings, transactional_db):
    """A live server running only the gateway (through its own HTTP server, ``gateway.serve.server``),
    with a snapshot that is never stale for long. It needs the database first, so it stops (and
    its snapshot reads end) before the database is flushed after the test.

    Each test runs twice: with the fast lane (``gateway.serve.fast_lane``) carrying what it can, as
    ``./slotserve start`` serves, and with every request through the ASGI application. The lane
    carries only requests that find a fresh snapshot, so for the lane a test in the gateway's
    ``world`` has the gateway read that world before the test begins: its first request is the
    lane's too."""
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 0.05
    from gateway.serve.proxy import Gateway

    settings.SLOTSERVE_GATEWAY_MAX_BODY_BYTES = 64 * 1024
    gateway = Gateway()
    gateway.lane = request.param == "lane"
    # A test in the gateway's world: the world first, then the gateway reads it (no request:
    # nothing counted) and keeps it fresh. Tests that build their own data after the gateway
    # starts are left as they were: their first request reads the snapshot.
    read_first = gateway.lane and "world" in request.fixturenames
    if read_first:
        request.getfixturevalue("world")
    with serving(gateway) as url:
        if read_first:
            asyncio.run_coroutine_threadsafe(gateway.snapshots.get(), SERVING_LOOPS[url]).result(timeout=10)
        yield url


# The event loop each live server of ``serving`` runs in, and the application it serves, by its URL.
SERVING_LOOPS: dict[str, asyncio.AbstractEventLoop] = {}
SERVING_APPS: dict[str, Any] = {}
SERVING_SERVERS: dict[str, uvicorn.Server] = {}


def snapshot_seen(url: str, timeout: float = 10.0) -> None:
    """Until the gateway at ``url`` has finished a read of the database that began after this
    call: what the test just changed (a channel, a key, a booking, a limit) is in its snapshot.
    Its keeper reads every few hundredths of a second while requests come; a fixed sleep fails
    when one read is slow. A gateway with no read for a second has stopped keeping: its next
    request reads the database itself."""
    served = SERVING_APPS[url]
    snapshots = getattr(served, "gateway", served).snapshots  # the whole site's gateway, or a gateway
    called = time.monotonic()
    first: float | None = None
    while time.monotonic() - called < timeout:
        taken = snapshots.current.taken_at
        if first is None and taken > called:
            first = taken
        elif first is not None and taken > first:
            return  # the read that ended at ``taken`` began after ``first`` ended, after the call
        if time.monotonic() - taken > snapshots.max_age + 1.0:
            return
        time.sleep(0.005)
    raise AssertionError(f"the gateway did not read the database within {timeout:g} s")


def healthy(port: int) -> bool:
    """Whether the process on ``port`` answers its ``/health`` with 200."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def serving(app, **options) -> Iterator[str]:
    """``app`` under uvicorn in a thread, as ``./slotserve start`` serves it (the gateway's own
    HTTP server in front of uvicorn's), with uvicorn's ``options``: its URL while the block runs."""
    from channels.layers import channel_layers

    # Each server's event loop gets a channel layer of its own, as each process does: the Redis
    # layer waits for pushes on the loop that first asked, and a server stopped meanwhile would
    # hold it.
    channel_layers.backends.clear()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_level="warning",
            http="gateway.serve.server:GatewayHttp",
            # A page's socket waits for pushes until its client leaves: one a test left open
            # is closed at the server's stop, as ``run`` stops its web processes.
            **{"timeout_graceful_shutdown": 3, **options},
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert eventually(lambda: server.started, timeout=30, every=0.01), "the gateway did not start"
    url = f"http://127.0.0.1:{port}"
    SERVING_LOOPS[url] = server.servers[0].get_loop()
    SERVING_APPS[url] = app
    SERVING_SERVERS[url] = server
    try:
        yield url
    finally:
        SERVING_LOOPS.pop(url, None)
        SERVING_APPS.pop(url, None)
        SERVING_SERVERS.pop(url, None)
        server.should_exit = True
        thread.join(timeout=10)
        channel_layers.backends.clear()
        # A server still running would read the database while the test's is flushed.
        assert not thread.is_alive(), "the test server did not stop within 10 s"


@pytest.fixture
def standins(tmp_path):
    """Start stand-in servers on demand; all are stopped after the test."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(alias: str, *options: str) -> tuple[int, Path]:
        port = free_port()
        log = tmp_path / f"{alias}-{port}.log"
        model = tmp_path / "model.gguf"
        model.write_bytes(b"GGUF")
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devtools.standin",
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--alias",
                alias,
                "--standin-load-seconds",
                "0",
                *options,
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        started.append((child, log))
        assert eventually(lambda: healthy(port), timeout=10), f"stand-in did not start: {log.read_text()}"
        return port, log

    yield start
    for child, _ in started:
        child.kill()
        child.wait()


def serve(channel, model, port: int | None, phase: str = "ready") -> None:
    """What a node worker would have stored: the channel runs ``model`` on ``port``."""
    ChannelRuntime.objects.update_or_create(
        channel=channel,
        defaults={
            "phase": phase,
            "model": model,
            "host": "127.0.0.1",
            "port": port,
            "since": timezone.now(),
            "pid": 1 if port else None,
        },
    )


@pytest.fixture
def portal(db, ana, bo, staff) -> Iterator[World]:
    """The portal's pages' world, at ``PORTAL_T0`` (time stands still): a100-0 on a 24 GiB node
    serving qwen-7b's "chat" by default, llama-70b (too big for it) beside, and ana's booking
    under way."""
    import time_machine

    with time_machine.travel(PORTAL_T0, tick=False):
        qwen = factories.llm("qwen-7b", size=5 * GiB)
        chat = factories.preset(qwen, "chat", "-c 8192 --port 9 -ngl 99")
        big = factories.llm("llama-70b", size=40 * GiB)
        factories.preset(big, "long")
        channel = factories.channel("a100-0", default=chat, on=factories.node("gpu-a", memory=24 * GiB))
        hour = timedelta(hours=1)
        booked = factories.reservation(
            owner=ana, on=channel, start=PORTAL_T0 - hour, end=PORTAL_T0 + hour, target=chat
        )
        yield World(channel=channel, model=qwen, preset=chat, other_model=big, ana=ana, bo=bo, booked=booked)


@pytest.fixture
def world(standins, ana, bo):
    """Two channels on one node, each serving a stand-in (qwen on ch-a, llama on ch-b), and a key
    each for ana and bo: the gateway tests' world (modules may define their own)."""
    qwen, llama = factories.llm("qwen"), factories.llm("llama")
    node = factories.node("n1", gpus=2)
    a = factories.channel("ch-a", on=node, gpu_indexes=[0])
    b = factories.channel("ch-b", on=node, gpu_indexes=[1])
    port_a, log_a = standins("qwen", "--standin-chunks", "8")
    port_b, _log_b = standins("llama", "--standin-chunks", "8")
    serve(a, qwen, port_a)
    serve(b, llama, port_b)
    _, ana_key = api_key_create(user=ana, name="t")
    _, bo_key = api_key_create(user=bo, name="t")
    return World(
        channel=a,
        other=b,
        model=qwen,
        other_model=llama,
        node=node,
        ana=ana,
        bo=bo,
        ana_key=ana_key,
        bo_key=bo_key,
        log=log_a,
    )


@contextlib.contextmanager
def running_llama_server(binary: str, model: Path, *args: str, secret: str = "") -> Iterator[int]:
    """A real llama-server on a free port, healthy before the block runs (behind ``secret`` when
    given, as a node starts it); stopped after. Yields the port."""
    port = free_port()
    extra = ["--api-key", secret] if secret else []
    child = subprocess.Popen(
        [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert eventually(lambda: healthy(port), timeout=30, every=0.05)
        yield port
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:  # busy with a generation nobody reads: it goes all the same
            child.kill()
            child.wait()
