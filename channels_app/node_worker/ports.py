"""The ports of a node's inference processes (docs/security.md, "Ports taken by another user"):
a free one for each run, from SLOTSERVE_PROCESS_PORTS or the kernel, and what is wrong with that
range on this machine. No decisions here."""

from __future__ import annotations

import collections
import random
import socket
from pathlib import Path

# Where Linux says which ports it hands out for outgoing connections and for port 0.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports(path: Path = EPHEMERAL_PORTS) -> range | None:
    """The machine's ephemeral ports, or None where it does not say."""
    try:
        first, last = (int(number) for number in path.read_text().split())
    except (OSError, ValueError):
        return None
    return range(first, last + 1)


def port_range_warning(ports: range | None, ephemeral: range | None) -> str:
    """What is wrong with SLOTSERVE_PROCESS_PORTS on this machine ("" when nothing is): ports the
    kernel also hands out can be taken by an outgoing connection between the worker's choice and
    the process's bind, and that load then fails."""
    if (
        ports is None
        or ephemeral is None
        or max(ports.start, ephemeral.start) >= min(ports.stop, ephemeral.stop)
    ):
        return ""
    return (
        f"SLOTSERVE_PROCESS_PORTS ({ports.start}-{ports.stop - 1}) overlaps this machine's ephemeral "
        f"ports ({ephemeral.start}-{ephemeral.stop - 1}, {EPHEMERAL_PORTS}): an outgoing connection "
        "can take a process's port before it binds, and that load fails. Choose ports outside them."
    )


# Ports lately handed out: a process started a moment ago may not have bound its own yet.
_handed_out: collections.deque[int] = collections.deque(maxlen=64)


def free_port(host: str, ports: range | None = None) -> int:
    """A port nothing on ``host`` listens on: from ``ports`` (SLOTSERVE_PROCESS_PORTS), tried
    from a random one on and never one handed out lately, or, with none, one the kernel picks."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if ports is None:
        with socket.socket(family) as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])
    first = random.randrange(len(ports))
    for step in range(len(ports)):
        port = ports[(first + step) % len(ports)]
        if port in _handed_out:
            continue
        with socket.socket(family) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _handed_out.append(port)
        return port
    raise OSError(
        f"no free port on {host} in SLOTSERVE_PROCESS_PORTS ({ports.start}-{ports.stop - 1})"
        + _who_listens(ports)
        + " (docs/security.md, 'Ports taken by another user')"
    )


def _who_listens(ports: range) -> str:
    """Who holds the listening sockets in ``ports``, from /proc/net/tcp and tcp6: ``: 1000 are
    listened on, by uid 1001 (port 31000 first)``; "" where that cannot be read."""
    holders: dict[int, list[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 8 or fields[3] != "0A":  # 0A: LISTEN
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports:
                holders.setdefault(int(fields[7]), []).append(port)
    if not holders:
        return ""
    taken = sorted({port for held in holders.values() for port in held})
    who = ", ".join(
        f"uid {uid} ({len(set(held))} of them, port {min(held)} first)"
        for uid, held in sorted(holders.items())
    )
    return f": {len(taken)} are listened on, by {who}"
