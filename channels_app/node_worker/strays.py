"""Inference processes no channel owns, and stopping them.

A node worker killed between starting a run and recording it (``worker._launch``) leaves a
process that nobody will stop, holding its GPU. Each node tick looks for this node's runs —
processes whose output goes to a run log under this node's ``DATA_DIR/runs`` and that carry a
``SLOTSERVE_RUN_ID`` (``processes.start``) — that no channel's runtime names and that this worker
did not start itself, and stops them as any run is stopped: SIGTERM to its process group, then
SIGKILL once ``SLOTSERVE_STOP_TIMEOUT_SECONDS`` have passed (docs/faults.md)."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from channels_app.models import ChannelRuntime
from channels_app.node_worker import processes

log = logging.getLogger(__name__)

# A run this young may be one a reconcile is starting right now and has not recorded yet.
MIN_AGE_SECONDS = 10.0

# Strays sent SIGTERM: pid → when (time.monotonic()).
_stopping: dict[int, float] = {}


@dataclass(frozen=True)
class Run:
    pid: int
    run_id: str
    age_seconds: float


def strays(found: list[Run], *, owned: set[str], mine: set[int]) -> list[Run]:
    """The runs no channel owns (``owned``: the run ids the runtimes name) that this worker did
    not start (``mine``: its children's pids), old enough not to be a start in progress."""
    return [
        run
        for run in found
        if run.run_id not in owned and run.pid not in mine and run.age_seconds >= MIN_AGE_SECONDS
    ]


def signal_for(since: float | None, *, now: float, stop_timeout: float) -> signal.Signals | None:
    """SIGTERM for a stray not signalled yet (``since``: when it was); SIGKILL once
    ``stop_timeout`` passed since; else None (it is given its time)."""
    if since is None:
        return signal.SIGTERM
    return signal.SIGKILL if now - since >= stop_timeout else None


def runs_here(runs_dir: Path) -> list[Run]:
    """This node's runs: processes with a run id whose output goes to a file under ``runs_dir``."""
    inside = str(runs_dir.resolve()) + os.sep
    try:
        ticks, uptime = os.sysconf("SC_CLK_TCK"), float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not os.readlink(entry / "fd" / "1").startswith(inside):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            run_id = processes.run_id_of(int(entry.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if run_id and stat[0] != "Z":
            found.append(Run(int(entry.name), run_id, uptime - int(stat[19]) / ticks))
    return found


def stop_strays(node_name: str) -> int:
    """Stop this node's runs that no channel owns; returns how many were found."""
    found = runs_here(Path(settings.DATA_DIR) / "runs")
    if not found:
        _stopping.clear()
        return 0
    # Any channel's, not only this node's: a second worker sharing this data folder (run ids
    # are unique) keeps its runs.
    owned = set(
        ChannelRuntime.objects.filter(run_id__in=[run.run_id for run in found]).values_list(
            "run_id", flat=True
        )
    )
    # A channel's sleeper is owned too (docs/scheduling.md, "Sleep and wake").
    owned |= {
        str(record.get("run_id"))
        for record in ChannelRuntime.objects.exclude(asleep=None).values_list("asleep", flat=True)
        if isinstance(record, dict)
    }
    lost = strays(found, owned=owned, mine=set(processes.children().values()))
    now = time.monotonic()
    for run in lost:
        sig = signal_for(
            _stopping.get(run.pid), now=now, stop_timeout=settings.SLOTSERVE_STOP_TIMEOUT_SECONDS
        )
        if sig is None:
            continue
        log.warning(
            "node %s: run %s (pid %s) belongs to no channel: %s", node_name, run.run_id, run.pid, sig.name
        )
        processes.send(run.pid, sig)
        _stopping.setdefault(run.pid, now)
    for pid in set(_stopping) - {run.pid for run in lost}:
        del _stopping[pid]
    return len(lost)
