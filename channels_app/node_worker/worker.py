"""The node worker's shell around ``channels_app.node_worker.lifecycle``: observe, step, act, store.

The node worker is the only writer of ``ChannelRuntime`` and of load records
(docs/architecture.md, one writer per fact). Each reconcile is short and never waits for
a process; a second one running at the same moment for the same channel
finds the channel's lock taken and leaves it to the first, and one that ran anyway (the lock
lost under it) stores and tells nothing over a state another stored first.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import assert_never

from django.conf import settings
from django.db import transaction

from channels_app.backends import Backend
from channels_app.models import (
    Channel,
    ChannelRuntime,
    ChannelTarget,
    LLMModel,
    LoadRecord,
    ReloadRequest,
)
from channels_app.node_worker import (
    gpus,
    log_shipping,
    prewarm,
    processes,
    run_log_folder,
    sleep_mode,
    sleepers,
)
from channels_app.node_worker.announce import announce_channel
from channels_app.node_worker.failures import LAUNCH_FAILED
from channels_app.node_worker.gate import publish_gate
from channels_app.node_worker.lifecycle import (
    Action,
    Kill,
    LoadFinished,
    Observed,
    ProcessState,
    Sleep,
    Start,
    Tell,
    Terminate,
    Wake,
    Wanted,
    effective_target,
    step,
)
from channels_app.node_worker.places import places_of
from channels_app.node_worker.registration import executable_for
from channels_app.node_worker.rows import state_of, store, target_of, wanted_of
from channels_app.node_worker.step_reads import StepReads
from channels_app.scheduling.selectors import load_estimate_details
from slotserve_base import locks, news, overview
from slotserve_base.inflight import in_flight_counts
from slotserve_base.redis_client import redis_client
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, RedisKey, redis_key

log = logging.getLogger(__name__)

# A reconcile holds its channel's lock for this long, renewed while it runs (slotserve_base.locks):
# a worker that dies holding it frees the channel within the lock time, less than a tick.
LOCK_SECONDS = 2.0


def in_flight(channel_id: int) -> int:
    """Requests the gateway has admitted to the channel and not yet finished."""
    return in_flight_counts(redis_client(), [channel_id])[channel_id]


# --- Observe, act ------------------------------------------------------------------


def _follow_log(channel_id: int, run_id: str, pid: int, path: Path, *, from_start: bool) -> None:
    """Ship the run's output to the control plane as it is written (node_worker.log_shipping)."""
    log_shipping.follow(
        channel_id, run_id, path, alive=lambda: processes.alive(pid, run_id)[0], from_start=from_start
    )


def observe(
    runtime: ChannelRuntime,
    channel: Channel,
    now: datetime,
    state: ProcessState | None = None,
    leaving: bool = False,
    reads: StepReads | None = None,
) -> Observed:
    alive, exit_code = False, None
    if runtime.pid is not None and runtime.run_id:
        alive, exit_code = processes.alive(runtime.pid, runtime.run_id)
        if alive and runtime.log_path and not log_shipping.following(runtime.run_id):
            # A run this worker adopted (it restarted): ship its lines from here on.
            _follow_log(channel.pk, runtime.run_id, runtime.pid, Path(runtime.log_path), from_start=False)
    phase = Phase(runtime.phase)
    healthy = (
        alive
        and runtime.port is not None
        and phase in (Phase.LOADING, Phase.READY)
        and processes.healthy(runtime.host, runtime.port, runtime.api_secret)
    )
    count = in_flight(channel.pk) if phase in (Phase.READY, Phase.DRAINING) else 0
    freed = True
    if not alive and phase == Phase.STOPPING and runtime.pid is not None:
        on_gpu = gpus.pids_on(list(channel.gpu_indexes))
        waited = now - (runtime.stop_sent_at or now)
        # A driver that never reports the memory freed must not hold the channel forever.
        give_up = waited >= timedelta(seconds=2 * settings.SLOTSERVE_STOP_TIMEOUT_SECONDS)
        freed = on_gpu is None or runtime.pid not in on_gpu or give_up
    tail = (
        processes.log_tail(runtime.log_path)
        if runtime.log_path and (not alive or phase == Phase.LOADING)
        else ""
    )
    backend = ""
    if tail and runtime.model_id is not None:
        model = (reads or StepReads()).model(runtime.model_id)
        backend = model.backend if model is not None else ""
    return Observed(
        alive=alive,
        exit_code=exit_code,
        healthy=healthy,
        in_flight=count,
        gpu_freed=freed,
        log_tail=tail,
        backend=backend,
        **(sleepers.observed(runtime, state, leaving) if state is not None else {}),
    )


def _estimate(node_id: int, target: Target, size_bytes: int) -> float | None:
    """The estimate this load is planned with, before the node's margin (docs/scheduling.md)."""
    planned = load_estimate_details([(node_id, target)], {target.model_id: size_bytes}).get((node_id, target))
    return planned.unmargined_seconds if planned else None


def _launch(
    runtime: ChannelRuntime, channel: Channel, target: Target, now: datetime, reads: StepReads
) -> None:
    """Start the target's process; a target that cannot be launched fails like a failed load."""
    prewarm.yield_to_load()
    model = reads.model(target.model_id)
    if model is None:
        raise LLMModel.DoesNotExist(f"model {target.model_id} was deleted")
    preset = reads.preset(target.preset_id)
    backend = Backend(model.backend)
    executable = executable_for(backend)
    log_dir = Path(settings.DATA_DIR) / "runs" / channel.name
    # A load begun by a step that could not be stored never finished: it ends with this one.
    LoadRecord.objects.filter(channel=channel, finished__isnull=True, started__lte=now).update(
        finished=now, succeeded=False, error="never finished: the next load began"
    )
    runtime.load = LoadRecord.objects.create(
        model=model,
        preset=preset,
        node=channel.node,
        channel=channel,
        started=now,
    )
    runtime.host = settings.SLOTSERVE_PROCESS_HOST
    try:
        if target.preset_id and preset is None:
            raise ValueError(f"preset {target.preset_id} of {model.name} was deleted")
        launch = processes.Launch(
            backend=backend,
            executable=executable,
            model_path=model.path,
            alias=model.name,
            preset_args=preset.args_list if preset else [],
            gpu_indexes=list(channel.gpu_indexes),
            host=runtime.host,
            log_dir=log_dir,
            extra_env=settings.SLOTSERVE_PROCESS_ENV,
            ports=settings.SLOTSERVE_PROCESS_PORTS,
            sleep_mode=sleep_mode.enabled_for(backend),
        )
        live = {*processes.children(), runtime.run_id}  # a run that still runs keeps its log
        run_log_folder.prune(log_dir, keep=settings.SLOTSERVE_RUN_LOGS_KEPT, live=live)
        started = processes.start(launch)
    except (OSError, ValueError) as exc:
        # Recorded in a log of its own; the next step sees no process and fails the load with it
        # (error shown, retries and fallback as for any failed load).
        what = f"preset {preset}" if isinstance(exc, ValueError) and preset else executable
        log.warning("channel %s: could not start %s: %s", channel.name, what, exc)
        runtime.run_id, runtime.pid, runtime.port, runtime.api_secret = "", None, None, ""
        runtime.log_path = str(log_dir / "start-failure.log")
        processes.write_start_failure(Path(runtime.log_path), f"{LAUNCH_FAILED} {what}: {exc}\n")
        log_shipping.ship_file(channel.pk, f"failed-{now.timestamp():.0f}", Path(runtime.log_path))
        return
    runtime.run_id, runtime.pid, runtime.port = started.run_id, started.pid, started.port
    runtime.api_secret = started.secret
    runtime.log_path = str(started.log_path)
    _follow_log(channel.pk, started.run_id, started.pid, started.log_path, from_start=True)
    # The estimate this load was planned with, read while the process loads (off a switch's path).
    runtime.load.estimated_seconds = _estimate(channel.node_id, target, model.size_bytes)
    LoadRecord.objects.filter(pk=runtime.load.pk).update(estimated_seconds=runtime.load.estimated_seconds)
    log.info(
        "channel %s: started %s (run %s, pid %s, port %s)",
        channel.name,
        model.name,
        started.run_id,
        started.pid,
        started.port,
    )


def act(
    actions: Sequence[Action],
    runtime: ChannelRuntime,
    channel: Channel,
    now: datetime,
    reads: StepReads | None = None,
) -> None:
    for action in actions:
        match action:
            case Start(target=target):
                _launch(runtime, channel, target, now, reads or StepReads())
            case Terminate(pid=pid):
                processes.send(pid, signal.SIGTERM)
            case Kill(pid=pid):
                log.warning("channel %s: pid %s ignored SIGTERM; sending SIGKILL", channel.name, pid)
                processes.send(pid, signal.SIGKILL)
            case Sleep():
                log.info("channel %s: putting run %s to sleep", channel.name, runtime.run_id)
                sleepers.put_to_sleep(runtime)
            case Wake():
                sleepers.wake(runtime)
                log.info("channel %s: waking run %s", channel.name, runtime.run_id)
            case LoadFinished(succeeded=succeeded, error=error):
                if runtime.load_id is not None:
                    LoadRecord.objects.filter(pk=runtime.load_id, finished__isnull=True).update(
                        finished=now, succeeded=succeeded, error=error
                    )
            case Tell():
                pass  # told with the step's other happenings, once the step is stored (``announce``)
            case _:
                assert_never(action)


def reconcile(*, channel_id: int, now: datetime) -> ProcessState | None:
    """Observe the channel's process, step its lifecycle, act, and store the result.

    Returns the new state, or None when another reconcile holds the channel.
    """
    ttl = min(LOCK_SECONDS, float(settings.SLOTSERVE_TICK_SECONDS))
    with locks.held(redis_client(), redis_key(RedisKey.RECONCILE, channel_id), ttl) as mine:
        if not mine:
            return None
        try:
            return _reconcile(channel_id, now)
        except Overtaken as overtaken:
            log.warning("channel %s: %s", channel_id, overtaken)
            return None


class Overtaken(Exception):
    """Another reconcile of the channel stored a start first (the lock was lost under this one)."""


def _reconcile(channel_id: int, now: datetime) -> ProcessState:
    channel = Channel.objects.select_related("node").get(pk=channel_id)
    runtime, _ = ChannelRuntime.objects.get_or_create(channel=channel)
    target_row = ChannelTarget.objects.select_related("reservation__user").filter(channel=channel).first()
    before = state_of(runtime)
    generation = ReloadRequest.objects.filter(channel=channel).values_list("generation", flat=True).first()
    reads = StepReads()  # each model and preset the step names, read once
    wants = target_of(target_row.model_id, target_row.preset_id) if target_row is not None else None
    reads.read([before.running, channel.default_target, wants])
    wanted = wanted_of(channel, target_row, generation or 0, now, reads)
    before = _adopt_unknown_fingerprints(before, wanted)
    publish_gate(channel.pk, before, wanted, now)
    leaving = effective_target(before, wanted, now)[0] != before.running
    result = step(before, wanted, observe(runtime, channel, now, before, leaving, reads), now)
    if result.state.phase != before.phase:
        log.info("channel %s: %s → %s", channel.name, before.phase, result.state.phase)
    known_run = runtime.run_id
    read = (runtime.run_id, runtime.phase, runtime.since)  # what this step stepped from
    fell_asleep = sleepers.fell_asleep(runtime, before, result.state)
    try:
        act(result.actions, runtime, channel, now, reads)
        if fell_asleep is not None:
            runtime.asleep = fell_asleep
        after = result.state
        if any(isinstance(a, Start) for a in result.actions):
            after = dataclasses.replace(after, pid=runtime.pid)  # known once the process runs
        if after.phase not in (Phase.READY, Phase.DRAINING):
            runtime.places = None
        elif after.phase == Phase.READY:
            runtime.places = places_of(runtime, reads)
        # Stored before it is told: a process just started is the channel's if telling fails.
        # A step is stored only over the state it stepped from: another reconcile of the channel
        # at once (its lock lost under a live holder) that stored first wins, and this one
        # neither stores nor tells what that one told already.
        with transaction.atomic():
            stored = (
                ChannelRuntime.objects.select_for_update()
                .filter(pk=runtime.pk)
                .values_list("run_id", "phase", "since")
                .first()
            )
            if stored is not None and stored != read:
                if runtime.run_id != known_run:
                    raise Overtaken(f"another reconcile started a run first; stopping {runtime.run_id}")
                raise Overtaken("another reconcile stored the channel's step first")
            store(runtime, after)
        if after.phase != before.phase:  # told once stored: whoever reads it now sees it
            news.changed(after.phase.value)  # the gateways read it now, not within their snapshot's life
            overview.refresh([channel_id], after.phase.value)
    except BaseException:
        if runtime.run_id and runtime.run_id != known_run and runtime.pid is not None:
            # Started, never stored: nobody would stop it (strays are never this worker's children).
            log.warning("channel %s: run %s could not be recorded; stopping it", channel.name, runtime.run_id)
            processes.send(runtime.pid, signal.SIGKILL)
        raise
    announce_channel(channel, target_row, before, after, result.actions, runtime.load_id, now, reads)
    return after


def _adopt_unknown_fingerprints(state: ProcessState, wanted: Wanted) -> ProcessState:
    """A process started before runs carried a fingerprint is taken to be what it was asked
    to be (not restarted because of an upgrade)."""
    known = [t for t in (wanted.target, wanted.default) if t is not None]

    def adopt(target: Target | None) -> Target | None:
        if target is None or target.fingerprint:
            return target
        same = next(
            (t for t in known if (t.model_id, t.preset_id) == (target.model_id, target.preset_id)), None
        )
        return same or target

    running = adopt(state.running)
    failure = state.failure
    if failure is not None:
        adopted = adopt(failure.target)
        if adopted is not None and adopted != failure.target:
            failure = dataclasses.replace(failure, target=adopted)
    if running == state.running and failure is state.failure:
        return state
    return dataclasses.replace(state, running=running, failure=failure)
