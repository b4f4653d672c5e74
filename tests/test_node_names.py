"""One machine per node name: a second GPU machine that starts its node worker under a name
another machine heartbeats with (a copied configuration, a cloned image) stops at once, naming
that machine, instead of both managing the same channels' processes; the same machine starting
its worker again, or another after the first machine's heartbeat has stopped, goes ahead."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from channels_app.models import HEARTBEAT_TICKS, Node
from channels_app.node_worker import registration
from tests.clock import eventually

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_a_name_another_machine_heartbeats_with_is_refused_until_its_heartbeat_stops(settings):
    now = timezone.now()
    Node.objects.create(name="gpu-1", machine="gpu-a", last_heartbeat=now - timedelta(seconds=2))
    with pytest.raises(registration.NodeNameTaken) as taken:
        registration.claim(node_name="gpu-1", machine="gpu-b", now=now)
    assert "'gpu-1' is in use by the machine 'gpu-a' (its last heartbeat 2 s ago)" in str(taken.value)
    assert "SLOTSERVE_NODE_NAME" in str(taken.value)
    # The same machine starting its worker again, at once.
    registration.claim(node_name="gpu-1", machine="gpu-a", now=now)
    # The other machine once gpu-a's heartbeat is older than a node stays ready.
    later = now + timedelta(seconds=HEARTBEAT_TICKS * settings.SLOTSERVE_TICK_SECONDS + 1)
    registration.claim(node_name="gpu-1", machine="gpu-b", now=later)
    # A new name, and a node row no worker has heartbeated under yet (made in the admin).
    registration.claim(node_name="gpu-2", machine="gpu-b", now=now)
    Node.objects.create(name="gpu-3")
    registration.claim(node_name="gpu-3", machine="gpu-b", now=now)


@pytest.mark.django_db
def test_the_heartbeat_records_the_machine_and_says_when_another_beats_under_its_name(node_env, caplog):
    node = registration.heartbeat(node_name="gpu-9", now=timezone.now())
    assert node.machine == socket.gethostname()
    assert Node.objects.get(name="gpu-9").machine == socket.gethostname()
    assert "heartbeats under this name too" not in caplog.text
    # Another machine took the name while this one's heartbeat was away (a lost link).
    Node.objects.filter(name="gpu-9").update(machine="gpu-a", last_heartbeat=timezone.now())
    registration.heartbeat(node_name="gpu-9", now=timezone.now())
    assert "node gpu-9: the machine 'gpu-a' heartbeats under this name too" in caplog.text


def _unshare_works() -> str:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-u", "hostname", "probe"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot make a UTS namespace here: {probe.stderr.strip()}"


def test_a_second_machine_with_the_same_node_name_stops_at_once_naming_the_first(tmp_path):
    """Two real node workers: this machine's, and one under another host name (a UTS namespace:
    to the worker, another machine) on the same database and Redis."""
    why = _unshare_works()
    if why:
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        SLOTSERVE_DATA_DIR=str(tmp_path),
        SLOTSERVE_REDIS_URL=django_settings.REDIS_URL,
        SLOTSERVE_REDIS_PREFIX=f"slotserve-test-{uuid.uuid4().hex[:12]}",
        SLOTSERVE_NODE_NAME="gpu-1",
        SLOTSERVE_FAKE_GPUS="1x24GiB",
        PYTHONUNBUFFERED="1",
    )
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    log = (tmp_path / "first.log").open("w+")
    first = subprocess.Popen(
        [sys.executable, "manage.py", "nodeworker"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def started() -> bool:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            return "node gpu-1:" in (tmp_path / "first.log").read_text()

        assert eventually(started, timeout=60, every=0.2)
        python = sys.executable
        second = subprocess.run(
            ["unshare", "-u", "sh", "-c", f"hostname gpu-clone && exec {python} manage.py nodeworker"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"the node name 'gpu-1' is in use by the machine '{socket.gethostname()}'" in second.stderr
        assert "node gpu-1:" not in second.stdout
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=30)


@pytest.mark.django_db
def test_the_api_shows_each_nodes_machine_and_nobody_sets_it(staff_api):
    Node.objects.create(name="gpu-1", machine="gpu-a", last_heartbeat=timezone.now())
    listed = staff_api.get("/api/nodes/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [(row["name"], row["machine"]) for row in rows] == [("gpu-1", "gpu-a")]
    made = staff_api.post("/api/nodes/", {"name": "gpu-2", "machine": "forged"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["machine"] == "" and Node.objects.get(name="gpu-2").machine == ""
