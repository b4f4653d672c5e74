"""The node worker's hands for sleep and wake (docs/scheduling.md, "Sleep and wake"): what it
observes of a channel's sleeper and of a process falling asleep or waking, and how a sleeper's
process moves between the runtime's fields and its record (``ChannelRuntime.asleep``); and
stopping every process of the node, sleepers included (the one-command start's Ctrl-C)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from channels_app.models import ChannelRuntime, LLMModel
from channels_app.node_worker import processes, sleep_mode
from channels_app.node_worker.lifecycle import ProcessState
from channels_app.node_worker.rows import SLEEPER_PROCESS, sleeper_record, store
from slotserve_base.vocabulary import Phase


def observed(runtime: ChannelRuntime, state: ProcessState, leaving: bool) -> dict[str, Any]:
    """The sleep part of ``Observed``: whether the sleeper still runs, whether a process
    falling asleep or waking says it sleeps, a wake's failure, and (only when the running
    process is about to leave) whether it could sleep."""
    seen: dict[str, Any] = {}
    record = runtime.asleep
    if record:
        seen["sleeper_alive"] = processes.alive(int(record["pid"]), str(record["run_id"]))[0]
    asking = (state.phase == Phase.STOPPING and state.sleeping_out) or (
        state.phase == Phase.LOADING and state.waking
    )
    if asking and runtime.port is not None:
        seen["sleeping"] = sleep_mode.is_sleeping(runtime.host, runtime.port, runtime.api_secret)
    if state.waking:
        seen["wake_failed"] = sleep_mode.wake_failure(runtime.run_id)
    about_to_leave = leaving and state.phase in (Phase.READY, Phase.DRAINING)
    if about_to_leave and settings.SLOTSERVE_SLEEP_MODE and runtime.model_id is not None:
        found = LLMModel.objects.filter(pk=runtime.model_id).values_list("backend", "path").first()
        if found is not None:
            backend, path = found
            seen["sleep_fits"] = (
                sleep_mode.enabled_for(backend) and sleeps(runtime) and sleep_mode.room_for(path)
            )
    return seen


def sleeps(runtime: ChannelRuntime) -> bool:
    """The run was started able to sleep (its command line says so)."""
    try:
        argv = Path(f"/proc/{runtime.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"--enable-sleep-mode" in argv


def fell_asleep(runtime: ChannelRuntime, before: ProcessState, after: ProcessState) -> dict[str, Any] | None:
    """The record of a process that fell asleep in this step (read before a wake or a start
    gives the runtime's fields to another run), or None."""
    sleeper = after.asleep
    if sleeper is None or (before.asleep is not None and before.asleep.pid == sleeper.pid):
        return None
    return sleeper_record(runtime, sleeper) if sleeper.pid == runtime.pid else None


def put_to_sleep(runtime: ChannelRuntime) -> None:
    if runtime.port is not None:
        sleep_mode.put_to_sleep(runtime.run_id, runtime.host, runtime.port, runtime.api_secret)


def wake(runtime: ChannelRuntime) -> None:
    """The sleeper's process becomes the runtime's, and is asked to wake."""
    record = runtime.asleep or {}
    for name in SLEEPER_PROCESS:
        setattr(runtime, name, record.get(name))
    runtime.host = runtime.host or ""
    runtime.load = None  # a wake is not a load: the load estimates stay those of cold loads
    runtime.asleep = None
    if runtime.port is not None and runtime.pid is not None:
        sleep_mode.wake(runtime.run_id, runtime.host, runtime.port, runtime.api_secret)


def stop_sleeper(runtime: ChannelRuntime, send: Any) -> None:
    """Stop the channel's sleeper with ``send`` (a signal), if it is this runtime's record."""
    record = runtime.asleep
    if record and processes.alive(int(record["pid"]), str(record["run_id"]))[0]:
        send(int(record["pid"]))


def stop_local_processes(*, node_name: str, timeout: float) -> int:
    """Stop every inference process of this node now (the one-command start's Ctrl-C).

    SIGTERM to each run's process group, SIGKILL to what is left after
    ``timeout`` seconds; the channels are stored as stopped. Returns how many
    processes were running.
    """
    runtimes = [
        r
        for r in ChannelRuntime.objects.filter(channel__node__name=node_name).exclude(pid=None)
        if r.pid is not None and processes.alive(r.pid, r.run_id)[0]
    ]
    for runtime in ChannelRuntime.objects.filter(channel__node__name=node_name).exclude(asleep=None):
        stop_sleeper(runtime, lambda pid: processes.send(pid, signal.SIGKILL))  # nothing to drain
    for runtime in runtimes:
        assert runtime.pid is not None
        processes.send(runtime.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(processes.alive(r.pid or 0, r.run_id)[0] for r in runtimes):
        time.sleep(0.1)
    for runtime in runtimes:
        if runtime.pid is not None and processes.alive(runtime.pid, runtime.run_id)[0]:
            processes.send(runtime.pid, signal.SIGKILL)
        store(runtime, ProcessState(phase=Phase.STOPPED))
    return len(runtimes)
