"""A node whose run-log folder is full: a load that cannot write its run log fails saying so
(not a crash of the node worker, not "killed or crashed"), and the channel loads once there is
room again (a real full filesystem: a small tmpfs mounted over the runs folder, root only); and
the folder keeps only a channel's last runs, so that it does not fill."""

from __future__ import annotations

import contextlib
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from channels_app.models import ChannelRuntime
from channels_app.node_worker import worker
from channels_app.node_worker.lifecycle import RETRY_FIRST_SECONDS
from channels_app.scheduling.services import decide_channels
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.test_node_worker import converge

pytestmark = pytest.mark.django_db(transaction=True)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")


@pytest.fixture
def full_runs_folder(node_env):
    runs = Path(settings.DATA_DIR) / "runs"
    runs.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(runs)], check=True)
    filler = runs / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as fill:
        while True:
            fill.write(b"\0" * 4096)
            fill.flush()
    yield filler
    subprocess.run(["umount", "-l", str(runs)], check=True)


@needs_root
def test_a_load_on_a_full_disk_fails_naming_it_and_succeeds_once_there_is_room(full_runs_folder, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    decide_channels(now=now)
    for _ in range(3):  # start, then see that nothing runs
        state = worker.reconcile(channel_id=channel.pk, now=now)
        assert state is not None
    runtime = ChannelRuntime.objects.get(channel=channel)
    assert runtime.phase == Phase.FAILED
    assert "could not be started" in runtime.error and "No space left on device" in runtime.error, (
        runtime.error
    )

    full_runs_folder.unlink()  # room again
    later = now + timedelta(seconds=RETRY_FIRST_SECONDS + 1)
    assert converge(channel, until={Phase.READY}, now=later).phase == Phase.READY


def test_a_channels_run_log_folder_keeps_its_last_runs_and_never_a_live_ones(node_env, tiny, settings):
    """A real llama-server logs every request: a folder of every run ever would fill the disk.
    Starting a run deletes the oldest runs' logs (and config files) past
    ``SLOTSERVE_RUN_LOGS_KEPT``, never the log of a run that still runs."""
    settings.SLOTSERVE_RUN_LOGS_KEPT = 5
    runs = Path(settings.DATA_DIR) / "runs" / "cpu-0"
    runs.mkdir(parents=True)
    for number in range(8):
        (runs / f"old{number}.log").write_text("a run's output\n")
        (runs / f"old{number}.config.yaml").write_text("api-key: x\n")
        os.utime(runs / f"old{number}.log", (1_000_000 + number, 1_000_000 + number))
    (runs / "start-failure.log").write_text("could not start\n")
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    logs = sorted(p.name for p in runs.glob("*.log"))
    # The 4 newest old runs and the new one; the start-failure note stays.
    assert logs == sorted(
        ["old4.log", "old5.log", "old6.log", "old7.log", Path(runtime.log_path).name, "start-failure.log"]
    )
    assert sorted(p.name for p in runs.glob("*.config.yaml")) == [f"old{n}.config.yaml" for n in (4, 5, 6, 7)]


def test_a_live_runs_log_is_never_deleted_however_old():
    from channels_app.node_worker.run_log_folder import to_delete

    runs = [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0)]
    assert to_delete(runs, keep=2, live=set()) == ["c", "b", "a"]
    assert to_delete(runs, keep=2, live={"a"}) == ["c", "b"]
    assert to_delete(runs, keep=10, live=set()) == []
