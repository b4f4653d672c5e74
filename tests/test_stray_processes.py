"""Inference processes that no channel owns: a node worker killed between starting a run and
recording it leaves one behind, holding its GPU. The next worker finds its node's runs (a
process writing to a run log in its data folder, with a run id) that no channel's runtime
names and that it did not start itself, and stops them (docs/faults.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from channels_app.models import ChannelRuntime
from channels_app.node_worker import strays
from tests import factories
from tests.clock import eventually, throughout

pytestmark = pytest.mark.django_db(transaction=True)

SLEEPER = """
import signal, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def run_in(runs: Path, run_id: str, how: str = "plain") -> subprocess.Popen[bytes]:
    """A process as the node worker starts a run: its own session, its output to a run log,
    its run id in its environment."""
    runs.mkdir(parents=True, exist_ok=True)
    with (runs / f"{run_id}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", SLEEPER, how],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SLOTSERVE_RUN_ID": run_id},
            start_new_session=True,
        )


def seen_as_runs(runs: Path, *processes: subprocess.Popen[bytes]) -> bool:
    """Whether the node's scan sees each of ``processes`` as a run (it has exec'd, its run id
    in its environment)."""
    seen = {run.pid for run in strays.runs_here(runs)}
    return all(process.pid in seen for process in processes)


@pytest.fixture
def node_data(settings, tmp_path, monkeypatch):
    settings.DATA_DIR = str(tmp_path / "node")
    settings.SLOTSERVE_STOP_TIMEOUT_SECONDS = 0.5
    monkeypatch.setattr(strays, "MIN_AGE_SECONDS", 0.0)
    started: list[subprocess.Popen[bytes]] = []
    yield Path(settings.DATA_DIR) / "runs", started
    for process in started:
        process.kill()
        process.wait()


def test_a_run_no_channel_owns_is_stopped_and_the_others_are_left_alone(node_data, tmp_path):
    runs, started = node_data
    channel = factories.channel("gpu-0")
    owned = run_in(runs / "gpu-0", "owned")
    ChannelRuntime.objects.update_or_create(channel=channel, defaults={"run_id": "owned", "pid": owned.pid})
    lost = run_in(runs / "gpu-0", "lost")
    # Another node worker's run on the same machine (its own data folder) is not this node's.
    elsewhere = run_in(tmp_path / "other-node" / "runs" / "gpu-0", "theirs")
    started += [owned, lost, elsewhere]
    assert eventually(lambda: seen_as_runs(runs, owned, lost))  # each has its run id (exec'd)

    signalled = time.monotonic()
    assert strays.stop_strays(channel.node.name) == 1
    assert eventually(lambda: lost.poll() is not None, timeout=5), "the stray run still runs"
    # A run signalled with it would have ended as fast: three times as long, the others still run.
    took = time.monotonic() - signalled
    assert throughout(lambda: owned.poll() is None and elsewhere.poll() is None, max(3 * took, 0.2))


def test_a_stray_that_ignores_sigterm_is_killed_after_the_stop_timeout(node_data, settings):
    runs, started = node_data
    channel = factories.channel("gpu-1")
    stubborn = run_in(runs / "gpu-1", "stubborn", how="stubborn")
    started.append(stubborn)
    # (its SIGTERM handler set: it says so in its run log)
    assert eventually(lambda: "ready" in (runs / "gpu-1" / "stubborn.log").read_text())
    assert eventually(lambda: seen_as_runs(runs, stubborn))
    signalled = time.monotonic()
    assert strays.stop_strays(channel.node.name) == 1
    # SIGTERM, ignored: it outlives the grace a run that heeds it is given (the stop timeout).
    assert throughout(lambda: stubborn.poll() is None, settings.SLOTSERVE_STOP_TIMEOUT_SECONDS * 0.8)
    # Looked at again until past the stop timeout (0.5 s): then SIGKILL.

    def killed() -> bool:
        strays.stop_strays(channel.node.name)
        return stubborn.poll() is not None

    assert eventually(killed, timeout=5, every=0.1)
    assert time.monotonic() - signalled >= 0.5
    assert eventually(lambda: stubborn.poll() is not None, timeout=5)


def test_a_young_run_or_one_this_worker_started_is_not_a_stray():
    """A run a reconcile is starting right now is not recorded yet: not a stray until it is
    older than ``MIN_AGE_SECONDS``; and the worker's own children never are."""
    found = [
        strays.Run(pid=10, run_id="young", age_seconds=1.0),
        strays.Run(pid=11, run_id="old", age_seconds=60.0),
        strays.Run(pid=12, run_id="mine", age_seconds=60.0),
        strays.Run(pid=13, run_id="owned", age_seconds=60.0),
    ]
    assert [r.run_id for r in strays.strays(found, owned={"owned"}, mine={12})] == ["old"]
