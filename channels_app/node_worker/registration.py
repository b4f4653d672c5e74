"""A node registering itself: its name claimed by one machine, its GPUs, RAM and installed
backends, and its heartbeat (a node whose heartbeat is older than three ticks is not ready)."""

from __future__ import annotations

import logging
import shlex
import shutil
import socket
from datetime import datetime

from django.conf import settings
from django.db import transaction

from channels_app.backends import Backend
from channels_app.models import (
    HEARTBEAT_TICKS,
    ChannelRuntime,
    Gpu,
    Node,
)
from channels_app.node_worker import discovery, gpus

log = logging.getLogger(__name__)


def executable_for(backend: Backend) -> str:
    """The backend's program as configured (docs/api.md, "Backend programs")."""
    return {
        Backend.LLAMA_CPP: settings.SLOTSERVE_LLAMA_SERVER,
        Backend.VLLM: settings.SLOTSERVE_VLLM,
        Backend.SGLANG: settings.SLOTSERVE_SGLANG,
    }[backend]


def backends_available() -> list[str]:
    return [b.value for b in Backend if shutil.which(shlex.split(executable_for(b))[0])]


class NodeNameTaken(Exception):
    """Another machine's node worker heartbeats under this node name."""


def this_machine() -> str:
    """The name the node worker records for the machine it runs on (its host name)."""
    return socket.gethostname()


def claim(*, node_name: str, machine: str, now: datetime) -> None:
    """Refuse a node name that another machine's worker heartbeats with: two machines under one
    name would each manage the node's channels' processes, starting what the other already runs.
    The same machine starting its worker again goes ahead, and so does any machine once the other's
    heartbeat is older than a ready node's."""
    node = Node.objects.filter(name=node_name).first()
    if node is None or not node.beating_elsewhere(machine, now):
        return
    assert node.last_heartbeat is not None  # a ready node has heartbeated
    age = (now - node.last_heartbeat).total_seconds()
    raise NodeNameTaken(
        f"the node name {node_name!r} is in use by the machine {node.machine!r} (its last heartbeat "
        f"{age:.0f} s ago): give each GPU machine a name of its own (SLOTSERVE_NODE_NAME or --name); "
        f"if {node.machine!r} has stopped for good, this name is free "
        f"{HEARTBEAT_TICKS * settings.SLOTSERVE_TICK_SECONDS:g} s after its last heartbeat"
    )


def heartbeat(*, node_name: str, now: datetime) -> Node:
    """Register the node, the machine it runs on, its RAM and its GPUs (index, name, total and
    free memory)."""
    found = gpus.discover(settings.SLOTSERVE_FAKE_GPUS)
    if gpus.is_fake(found):
        found = gpus.fake_use(found, _holders(node_name))
    with transaction.atomic():
        node, _ = Node.objects.get_or_create(name=node_name)
        machine = this_machine()
        if node.beating_elsewhere(machine, now):
            # Both started while the other's heartbeat was away (claim lets one in then): say so.
            log.error(
                "node %s: the machine %r heartbeats under this name too; give each GPU machine a "
                "name of its own (SLOTSERVE_NODE_NAME)",
                node_name,
                node.machine,
            )
        node.last_heartbeat = now
        node.machine = machine
        node.backends = backends_available()
        node.ram_bytes = gpus.host_ram_bytes()
        node.save(update_fields=["last_heartbeat", "machine", "backends", "ram_bytes"])
        for gpu in found:
            Gpu.objects.update_or_create(
                node=node,
                index=gpu.index,
                defaults={
                    "name": gpu.name,
                    "memory_bytes": gpu.memory_bytes,
                    "free_bytes": gpu.free_bytes,
                    "utilization_percent": gpu.utilization_percent,
                    "temperature_c": gpu.temperature_c,
                    "sampled_at": now,
                },
            )
        Gpu.objects.filter(node=node).exclude(index__in=[g.index for g in found]).delete()
    if settings.SLOTSERVE_MODEL_DIRS:
        discovery.report(node=node, files=discovery.scan(settings.SLOTSERVE_MODEL_DIRS), now=now)
    return node


def _holders(node_name: str) -> dict[int, list[int]]:
    """GPU index → the pids of the inference processes this node's channels run on it."""
    held: dict[int, list[int]] = {}
    running = ChannelRuntime.objects.filter(channel__node__name=node_name, pid__isnull=False)
    for pid, indexes in running.values_list("pid", "channel__gpu_indexes"):
        for index in indexes or []:
            if pid is not None:
                held.setdefault(index, []).append(pid)
    return held
