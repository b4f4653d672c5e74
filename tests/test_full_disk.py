"""A node whose run-log folder is full: a load that cannot write its run log fails saying so
(not a crash of the node worker, not "killed or crashed"), and the channel loads once there is
room again. A real full filesystem: a small tmpfs mounted over the runs folder (root only)."""

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

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root"),
]


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
