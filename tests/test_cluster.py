"""Several machines for real, on one: two GPU nodes, each in its own network namespace with its
own address, data directory and model directory, joined to the control host by a bridge.

The control host runs ``manage.py run --no-node`` (portal, API, gateway, scheduler) on the
bridge address. The node workers run as ``manage.py nodeworker`` inside their namespaces, each
with a private mount of its own home (model and data directories the control host cannot even
see), and reach PostgreSQL and Redis over the bridge address, never loopback; their inference
processes (the real llama-server) bind to their node's address and the gateway on the control
host reaches them across the bridge. Then the faults: node B loses its link (not_ready while
its process keeps running, ready again by itself when the link returns), the scheduler is
killed (nodes stay ready, processes keep serving, it is started again and decides), and Redis
restarts (the gateway says so meanwhile, then counts and the next switch behave).

Needs root (``ip netns``, ``unshare``) and PostgreSQL (a shared database is what several
machines have); elsewhere it says why and skips. CI runs it in its PostgreSQL pass.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from channels_app.models import Channel, ChannelRuntime, ChannelTarget, LLMModel, ModelFile, Node, Preset
from devtools.cluster import Cluster, Forwarder, namespaces_work, redis_answers, redis_executable
from gateway.api_keys import api_key_create
from tests import factories
from tests.clock import eventually, throughout
from tests.conftest import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.alone]  # timed: the machine to itself

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.231.77"  # or the next free one (devtools/cluster.py)
UNSHARE = ["unshare", "--mount", "--propagation", "private"]  # the node's own view of its home


def _wait(
    what: str, check: Callable[[], bool], timeout: float = 60, tell: Callable[[], str] | None = None
) -> None:
    """Wait for ``check``; on a timeout say what, and what ``tell`` says of the cluster then."""
    if not eventually(check, timeout=timeout, every=0.2):
        raise AssertionError(f"timed out waiting for {what}" + (f"\n{tell()}" if tell else ""))


def _told(cluster: dict[str, Any], control_log: Path) -> Callable[[], str]:
    """What the cluster looks like: each channel's run and target, the ends of the logs."""

    def tell() -> str:
        runs = ChannelRuntime.objects.values_list("channel__name", "phase", "preset__name", "since", "error")
        targets = ChannelTarget.objects.values_list("channel__name", "preset__name", "reason", "decided_at")
        logs = [control_log, *(cluster["tmp"] / name / "node-worker.log" for name in ("node-a", "node-b"))]
        tails = "\n".join(
            f"--- {log.parent.name}/{log.name}:\n{log.read_text(errors='replace')[-4000:]}"
            for log in logs
            if log.exists()
        )
        return f"runs: {list(runs)}\ntargets: {list(targets)}\n{tails}"

    return tell


@pytest.fixture
def cluster(settings, tmp_path) -> Iterator[dict[str, Any]]:
    why = namespaces_work()
    if why:
        pytest.skip(why)
    if connection.vendor != "postgresql":
        pytest.skip("several machines share a PostgreSQL database (run with DATABASE_URL=postgres://...)")
    tag = secrets.token_hex(2)
    net = Cluster(tag, SUBNET)
    control = net.control
    started: list[subprocess.Popen[bytes]] = []
    stoppers: list[Callable[[], None]] = []
    state: dict[str, Any] = {}
    try:
        net.up()
        # Redis and PostgreSQL on the control host's bridge address, as the nodes reach them.
        redis_port, redis_password = free_port(), secrets.token_urlsafe(16)
        started.append(
            subprocess.Popen(
                [
                    redis_executable(),
                    "--bind",
                    control,
                    "--port",
                    str(redis_port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp_path),
                    "--requirepass",  # as in production: not on loopback, so behind a password
                    redis_password,
                ],
                stdout=subprocess.DEVNULL,
            )
        )
        db = connection.settings_dict
        pg_port = free_port()
        # PostgreSQL listens on loopback here; the nodes reach it on the bridge, as other machines would.
        forwarder = Forwarder((control, pg_port), (db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
        forwarder.start()
        stoppers.append(lambda: state["forwarder"].stop())
        redis_argv = started[0].args
        settings.REDIS_URL = f"redis://:{redis_password}@{control}:{redis_port}/0"
        _wait("Redis on the bridge", lambda: redis_answers(settings.REDIS_URL), timeout=10)
        user = db["USER"] or "postgres"
        password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
        database_url = f"postgres://{user}{password}@{control}:{pg_port}/{db['NAME']}"
        state |= {
            "net": net,
            "tmp": tmp_path,
            "redis_url": settings.REDIS_URL,
            "database_url": database_url,
            "started": started,
            "redis_argv": redis_argv,
            "forwarder": forwarder,
            "prefix": settings.SLOTSERVE_REDIS_PREFIX,
            "secret": settings.SECRET_KEY,
        }
        yield state
    finally:
        try:
            _stop_everything(state.get("control"), started, stoppers)
        finally:
            net.down()  # whatever failed before, the bridge and namespaces go


def _stop_everything(
    control: subprocess.Popen[bytes] | None,
    started: list[subprocess.Popen[bytes]],
    stoppers: list[Callable[[], None]],
) -> None:
    if control is not None and control.poll() is None:
        os.killpg(control.pid, signal.SIGINT)
        try:
            control.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(control.pid, signal.SIGKILL)
    for runtime in ChannelRuntime.objects.exclude(pid=None):
        if runtime.pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runtime.pid, signal.SIGKILL)
    for process in started:
        process.kill()
        process.wait(timeout=10)
    for stop in stoppers:
        stop()


def _environment(cluster: dict[str, Any], home: Path) -> dict[str, str]:
    """What every SlotServe process of the cluster is given: the shared database, Redis and
    secret over the bridge, and a home of its own."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
        "DATABASE_URL": cluster["database_url"],
        "SLOTSERVE_REDIS_URL": cluster["redis_url"],
        "SLOTSERVE_REDIS_PREFIX": cluster["prefix"],
        "SLOTSERVE_SECRET_KEY": cluster["secret"],
        "SLOTSERVE_DATA_DIR": str(home / "data"),
        "SLOTSERVE_TICK_SECONDS": "1",
        "SLOTSERVE_LOG_LEVEL": "INFO",  # what a failure shows of the logs (_told) says what happened
    }


def _start_control(cluster: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The control host: ``manage.py run --no-node`` on the bridge address (no model folders)."""
    home: Path = cluster["tmp"] / "control"
    home.mkdir()
    port = free_port()
    log = home / "run.log"
    control = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "run",
            "--no-node",
            "--host",
            cluster["net"].control,
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env={**_environment(cluster, home), "SLOTSERVE_GATEWAY_REFRESH_SECONDS": "0.2"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cluster["control"] = control
    base = f"http://{cluster['net'].control}:{port}"

    seen: list[str] = []

    def healthy() -> bool:
        assert control.poll() is None, log.read_text()[-3000:]
        try:
            answer = httpx.get(f"{base}/health", timeout=1)
        except httpx.HTTPError as exc:
            seen.append(repr(exc))
            return False
        seen.append(answer.text)
        return answer.status_code == 200

    try:
        _wait("the control host to serve", healthy, timeout=60)
    except AssertionError:
        raise AssertionError(f"{seen[-1:]}\n{log.read_text()[-3000:]}") from None
    return control, base, log


def _start_node(cluster: dict[str, Any], name: str, host: int, llama_server: str) -> Path:
    """A GPU node: its namespace, a private mount of its home with its data and model folders,
    and ``manage.py nodeworker``."""
    namespace = cluster["net"].add_node(name, host)
    outside: Path = cluster["tmp"] / name
    home = outside / "home"  # a mount point; what the node writes there only the node sees
    home.mkdir(parents=True)
    env = {
        **_environment(cluster, home),
        "SLOTSERVE_NODE_NAME": name,
        "SLOTSERVE_PROCESS_HOST": f"{cluster['net'].subnet}.{host}",
        "SLOTSERVE_FAKE_GPUS": "1x24GiB",
        "SLOTSERVE_MODEL_DIRS": str(home / "models"),
        "SLOTSERVE_LLAMA_SERVER": llama_server,
    }
    python = shlex.quote(sys.executable)
    script = (
        'mount -t tmpfs -o size=256m "slotserve-$SLOTSERVE_NODE_NAME" "$HOME" && '
        f'{python} -m devtools.tinymodel "$HOME/models/tiny-{name}.gguf" {host} >/dev/null && '
        f'exec {python} manage.py nodeworker --name "$SLOTSERVE_NODE_NAME"'
    )
    log = (outside / "node-worker.log").open("wb")
    cluster["started"].append(
        subprocess.Popen(
            ["ip", "netns", "exec", namespace, *UNSHARE, "sh", "-c", script],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    )
    return home


def _part_of(parent: int, flag: str) -> int:
    """The pid of the process ``parent`` started whose command line has ``flag``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if int(stat[1]) == parent and flag in cmdline:
            return int(entry.name)
    raise AssertionError(f"no process of {parent} runs with {flag}")


def _health(runtime: ChannelRuntime) -> int:
    """The process's own /health, reached across the bridge (no gateway)."""
    return httpx.get(f"http://{runtime.host}:{runtime.port}/health", timeout=2).status_code


def test_two_nodes_in_their_own_namespaces_serve_through_the_control_host(
    cluster, settings, llama_server_bin, ana, bo
):
    settings.SLOTSERVE_TICK_SECONDS = 1
    control, gateway, control_log = _start_control(cluster)
    home_a = _start_node(cluster, "node-a", 11, llama_server_bin)
    home_b = _start_node(cluster, "node-b", 12, llama_server_bin)

    # Both nodes register, with their GPUs and the model files only they have.
    def registered() -> bool:
        return ModelFile.objects.filter(node__name__in=["node-a", "node-b"]).count() == 2

    _wait("both nodes to register their GPUs and files", registered)
    assert set(Node.objects.values_list("name", flat=True)) >= {"node-a", "node-b"}
    file_b = ModelFile.objects.get(node__name="node-b")
    assert file_b.path.startswith(str(home_b)) and file_b.shape is not None  # read on node B
    assert not Path(file_b.path).exists()  # the control host cannot see node B's files at all
    assert not ModelFile.objects.filter(node__name="node-a", path=file_b.path).exists()

    # Node A serves its default to everyone; node B is booked by ana now. The control host's
    # scheduler decides; each node worker converges.
    model_a = LLMModel.objects.create(
        name="tiny-a", backend="llama.cpp", path=str(home_a / "models" / "tiny-node-a.gguf")
    )
    model_b = LLMModel.objects.create(name="tiny-b", backend="llama.cpp", path=file_b.path)
    preset_a = Preset.objects.create(model=model_a, name="small", args="-c 256 -t 1")
    preset_a2 = Preset.objects.create(model=model_a, name="smaller", args="-c 128 -t 1")
    preset_b = Preset.objects.create(model=model_b, name="small", args="-c 256 -t 1")
    node_a, node_b = Node.objects.get(name="node-a"), Node.objects.get(name="node-b")
    channel_a = Channel.objects.create(
        name="ch-a", node=node_a, gpu_indexes=[0], default_model=model_a, default_preset=preset_a
    )
    channel_b = Channel.objects.create(name="ch-b", node=node_b, gpu_indexes=[0])
    now = timezone.now()
    factories.reservation(
        owner=ana,
        on=channel_b,
        start=now - timedelta(minutes=1),
        end=now + timedelta(hours=1),
        target=preset_b,
    )

    def serving(channel: Channel, preset: Preset) -> Callable[[], bool]:
        return lambda: ChannelRuntime.objects.filter(channel=channel, phase="ready", preset=preset).exists()

    told = _told(cluster, control_log)
    _wait("node A to serve its default", serving(channel_a, preset_a), timeout=90, tell=told)
    _wait("node B to load the booked model", serving(channel_b, preset_b), timeout=90, tell=told)
    runtime_a = ChannelRuntime.objects.get(channel=channel_a)
    runtime_b = ChannelRuntime.objects.get(channel=channel_b)
    assert runtime_b.host == f"{cluster['net'].subnet}.12"  # bound to node B's own address
    with pytest.raises(httpx.HTTPError):  # not on the control host's loopback
        httpx.get(f"http://127.0.0.1:{runtime_b.port}/health", timeout=1)

    _, ana_key = api_key_create(user=ana, name="t")
    _, bo_key = api_key_create(user=bo, name="t")

    def chat(key: str, model: str, prefix: str = "") -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return httpx.post(
            f"{gateway}{prefix}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )

    assert chat(ana_key, "tiny-b").status_code == 200  # across the bridge, to node B
    assert chat(bo_key, "anything", "/channels/ch-b").json()["error"]["code"] == "gpu_reserved"
    assert chat(bo_key, "tiny-a").status_code == 200  # node A serves everyone

    # Node B's run log, shown on the control host from the lines node B shipped.
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(ana)
    _wait(
        "node B's run log on the control host",
        lambda: any(
            "--alias tiny-b" in line
            for line in api.get(f"/api/channels/{channel_b.pk}/log", {"lines": 5000}).data["lines"]
        ),
        timeout=20,
    )
    portal = Client()
    portal.force_login(ana)
    assert "--alias tiny-b" in portal.get(f"/channel/{channel_b.pk}/log").content.decode()

    # The booking dialog's memory hint, for a file only node B has, from the shape node B read.
    later = timezone.now() + timedelta(hours=3)
    huge = Preset.objects.create(model=model_b, name="huge context", args="-c 64000000")
    hints = api.get(
        "/api/reservations/hints",
        {
            "channel": channel_b.pk,
            "start": later.isoformat(),
            "end": (later + timedelta(hours=1)).isoformat(),
            "model": model_b.pk,
            "preset": huge.pk,
        },
    ).data
    assert "estimated_memory_exceeds_vram" in [w["code"] for w in hints["warnings"]], hints

    # "Any channel" places by the files the nodes reported: only node B has tiny-b's file.
    placed = api.post(
        "/api/reservations/",
        {
            "channel": "auto",
            "model": model_b.pk,
            "start": later.isoformat(),
            "end": (later + timedelta(hours=1)).isoformat(),
        },
        format="json",
    )
    assert placed.status_code == 201 and placed.data["channel_name"] == "ch-b", placed.data

    # Node B loses its link: not_ready within three heartbeats, its process keeps running.
    cluster["net"].link("node-b", up=False)
    cut = time.monotonic()
    _wait(
        "node B to turn not_ready",
        lambda: not Node.objects.get(name="node-b").is_ready(timezone.now()),
        timeout=15,
    )
    assert time.monotonic() - cut <= 3 * settings.SLOTSERVE_TICK_SECONDS + 3
    os.kill(runtime_b.pid, 0)  # still running
    assert Node.objects.get(name="node-a").is_ready(timezone.now())
    overview = portal.get("/", {"partial": 1}).content.decode()
    assert overview.count("node not ready") == 1  # node B's card says so; node A's does not

    # The link returns: node B is ready again by itself, with the same process.
    cluster["net"].link("node-b", up=True)
    _wait(
        "node B to be ready again",
        lambda: Node.objects.get(name="node-b").is_ready(timezone.now()),
        timeout=20,
    )
    assert ChannelRuntime.objects.get(channel=channel_b).pid == runtime_b.pid
    assert chat(ana_key, "tiny-b").status_code == 200
    # Connections opened or written to while the link was down catch up only at TCP's next
    # retransmission (seconds apart): let node B's heartbeat settle before the next check.
    restored = timezone.now()
    _wait(
        "node B's heartbeat to settle after the link returned",
        lambda: (
            (Node.objects.get(name="node-b").last_heartbeat or restored) > restored + timedelta(seconds=5)
        ),
        timeout=20,
    )

    # The scheduler is killed: the nodes keep their own heartbeats (ready for more than three
    # ticks without it), the processes keep serving; `run` starts it again and it decides.
    os.kill(_part_of(control.pid, "--beat"), signal.SIGKILL)

    def nodes_ready() -> bool:
        nodes = Node.objects.filter(name__in=["node-a", "node-b"])
        return all(n.is_ready(timezone.now()) for n in nodes)

    assert throughout(nodes_ready, 4 * settings.SLOTSERVE_TICK_SECONDS, every=0.25), [
        (n.name, timezone.now() - n.last_heartbeat) for n in Node.objects.all() if n.last_heartbeat
    ]
    assert chat(ana_key, "tiny-b").status_code == 200 and chat(bo_key, "tiny-a").status_code == 200
    _wait("the scheduler to be started again", lambda: "scheduler started again" in control_log.read_text())
    booked_a = factories.reservation(
        owner=bo,
        on=channel_a,
        start=timezone.now() - timedelta(minutes=1),
        end=timezone.now() + timedelta(hours=1),
        target=preset_a2,
    )
    _wait(
        "the restarted scheduler to switch node A to bo's booking",
        serving(channel_a, preset_a2),
        timeout=60,
        tell=told,
    )
    assert ChannelRuntime.objects.get(channel=channel_b).pid == runtime_b.pid
    _wait("the gateway to serve bo's booking", lambda: chat(bo_key, "tiny-a").status_code == 200, timeout=10)

    # Redis restarts (it keeps nothing): meanwhile the gateway says so and the processes serve
    # on; afterwards requests are counted from zero and the next switch drains and happens.
    redis = cluster["started"][0]
    redis.kill()
    redis.wait(timeout=10)
    outage = chat(bo_key, "tiny-a")
    assert outage.status_code == 503 and "Redis" in outage.json()["error"]["message"], (
        outage.text,
        list(ChannelRuntime.objects.values_list("channel__name", "phase", "preset__name", "since", "error")),
        list(ChannelTarget.objects.values_list("channel__name", "preset__name", "reason", "decided_at")),
    )
    assert outage.headers["retry-after"]
    assert _health(ChannelRuntime.objects.get(channel=channel_a)) == 200
    assert _health(runtime_b) == 200
    cluster["started"][0] = subprocess.Popen(cluster["redis_argv"], stdout=subprocess.DEVNULL)
    _wait("Redis to be back", lambda: redis_answers(cluster["redis_url"]), timeout=10)
    _wait("the gateway to serve again", lambda: chat(bo_key, "tiny-a").status_code == 200, timeout=30)
    assert chat(ana_key, "tiny-b").status_code == 200
    from slotserve_base.inflight import in_flight_counts
    from slotserve_base.redis_client import redis_client

    # A request is counted out right after its answer went out (the count out may wait a couple
    # of milliseconds to share a write with the next count in): nothing stays in flight.
    _wait(
        "the answered requests to be counted out",
        lambda: (
            in_flight_counts(redis_client(), [channel_a.pk, channel_b.pk])
            == {channel_a.pk: 0, channel_b.pk: 0}
        ),
        timeout=5,
    )
    from reservations.services import reservation_end

    reservation_end(reservation=booked_a, by=bo, now=timezone.now())
    _wait(
        "node A to return to its default after Redis restarted",
        serving(channel_a, preset_a),
        timeout=60,
        tell=told,
    )
    _wait("the gateway to see the switch", lambda: chat(bo_key, "tiny-a").status_code == 200, timeout=10)
    assert ChannelRuntime.objects.get(channel=channel_b).pid == runtime_b.pid
    assert runtime_a.pid != ChannelRuntime.objects.get(channel=channel_a).pid  # it did switch

    # The database goes away for a while (the nodes' way to it is cut): the processes serve on;
    # when it returns the nodes catch up by themselves and the gateway serves again.
    forwarder = cluster["forwarder"]
    forwarder.stop()
    runtime_a = ChannelRuntime.objects.get(channel=channel_a)
    assert throughout(
        lambda: _health(runtime_b) == 200 and _health(runtime_a) == 200, 3 * settings.SLOTSERVE_TICK_SECONDS
    )
    cluster["forwarder"] = Forwarder(forwarder.listen, forwarder.target)
    cluster["forwarder"].start()
    back = timezone.now()
    _wait(
        "both nodes to heartbeat again after the database returned",
        lambda: Node.objects.filter(name__in=["node-a", "node-b"], last_heartbeat__gt=back).count() == 2,
        timeout=20,
        tell=told,
    )
    _wait(
        "the gateway to serve after the database returned",
        lambda: chat(ana_key, "tiny-b").status_code == 200,
        tell=told,
    )
    assert ChannelRuntime.objects.get(channel=channel_b).pid == runtime_b.pid
