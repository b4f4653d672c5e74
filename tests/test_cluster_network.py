"""The several machines on one (devtools/cluster.py) take a subnet nobody on the host holds:
a run that was killed before it could take its bridge down leaves that bridge and its
address behind, and a new bridge with the same address would route the nodes' answers into
the dead one (their connections time out)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading

import pytest

from devtools.cluster import Cluster, ip, namespaces_work


@pytest.fixture
def stale_bridge():
    why = namespaces_work()
    if why:
        pytest.skip(why)
    name = f"ssstale{secrets.token_hex(2)}"
    ip("link", "add", name, "type", "bridge")
    try:
        ip("addr", "add", "10.231.70.1/24", "dev", name)
        ip("link", "set", name, "up")
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=10)


def test_a_cluster_takes_another_subnet_when_a_stale_bridge_holds_its_own(stale_bridge):
    net = Cluster(secrets.token_hex(2), "10.231.70")
    try:
        net.up()
        assert net.subnet != "10.231.70"
        assert net.control == f"{net.subnet}.1"
        namespace = net.add_node("node-a", 11)
        # A node reaches a service on the control host's address, and hears its answer.
        listener = socket.create_server((net.control, 0))
        port = listener.getsockname()[1]
        threading.Thread(target=lambda: listener.accept()[0].sendall(b"hello"), daemon=True).start()
        script = (
            "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5);"
            "print(s.recv(5).decode())"
        )
        answer = subprocess.run(
            ["ip", "netns", "exec", namespace, "python3", "-c", script, net.control, str(port)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        listener.close()
        assert answer.stdout.strip() == "hello", answer.stderr
    finally:
        net.down()


def test_a_cluster_keeps_its_subnet_when_it_is_free():
    why = namespaces_work()
    if why:
        pytest.skip(why)
    net = Cluster(secrets.token_hex(2), "10.231.71")
    try:
        net.up()
        assert (net.subnet, net.control) == ("10.231.71", "10.231.71.1")
    finally:
        net.down()
