"""The lifecycle's state and wants to and from their rows: ``ChannelRuntime`` becomes a
``ProcessState`` and back, a ``ChannelTarget`` becomes what the channel is ``Wanted`` to run."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from channels_app.models import Channel, ChannelRuntime, ChannelTarget
from channels_app.node_worker.lifecycle import (
    Failure,
    ProcessState,
    Sleeper,
    Wanted,
)
from channels_app.node_worker.step_reads import StepReads
from channels_app.scheduling.selectors import booked_targets
from slotserve_base.target import Target, fingerprint_of
from slotserve_base.vocabulary import Phase, Reason

SERVES_RESERVATION = {Reason.ACTIVE_RESERVATION, Reason.PRELOAD_NEXT, Reason.SKIP_DEFAULT_SHORT_GAP}
FREES_THE_CARD = {Reason.MANUAL_UNLOAD, Reason.STOP_FOR_EXCLUSIVE, Reason.ACTIVE_EXCLUSIVE}


def target_of(model_id: int | None, preset_id: int | None, fingerprint: str = "") -> Target | None:
    return None if model_id is None else Target(model_id, preset_id, fingerprint)


def with_fingerprint(target: Target | None, reads: StepReads | None = None) -> Target | None:
    """The target with the digest of how it would be started now (its model's backend and path,
    its preset's effective arguments): an edited preset gives another digest."""
    if target is None:
        return None
    reads = reads or StepReads()
    reads.read([target])
    model = reads.model(target.model_id)
    if model is None:
        return target
    preset = reads.preset(target.preset_id)
    args = list(preset.args_effective) if preset is not None else []
    fingerprint = fingerprint_of(backend=model.backend, path=model.path, args=args)
    return dataclasses.replace(target, fingerprint=fingerprint)


def state_of(runtime: ChannelRuntime) -> ProcessState:
    failure = None
    failed = target_of(runtime.failed_model_id, runtime.failed_preset_id, runtime.failed_fingerprint)
    if failed is not None and runtime.retry_at is not None:
        failure = Failure(
            failed,
            runtime.attempts,
            runtime.retry_at,
            runtime.failure_error,
            runtime.fallback_failed,
            runtime.failure_purpose,
            runtime.failure_began,
        )
    return ProcessState(
        phase=Phase(runtime.phase),
        running=target_of(runtime.model_id, runtime.preset_id, runtime.fingerprint),
        since=runtime.since,
        pid=runtime.pid,
        stop_sent_at=runtime.stop_sent_at,
        kill_sent=runtime.kill_sent,
        fallback=runtime.fallback,
        failing=runtime.failing,
        failure=failure,
        error=runtime.error,
        reload_generation=runtime.reload_generation,
        asleep=sleeper_of(runtime.asleep),
        sleeping_out=runtime.sleeping_out,
        waking=runtime.waking,
    )


# What the runtime keeps of a sleeper's process, beside its target (``ChannelRuntime.asleep``).
SLEEPER_PROCESS = ("run_id", "pid", "host", "port", "api_secret", "log_path")


def sleeper_of(record: dict[str, Any] | None) -> Sleeper | None:
    if not record:
        return None
    target = target_of(record.get("model_id"), record.get("preset_id"), record.get("fingerprint", ""))
    since = datetime.fromisoformat(record["since"]) if record.get("since") else None
    if target is None or not record.get("pid") or since is None:
        return None
    return Sleeper(target, int(record["pid"]), since)


def sleeper_record(runtime: ChannelRuntime, sleeper: Sleeper) -> dict[str, Any]:
    """The runtime's process as the channel's sleeper: read before its fields are given to the
    next run (``worker._reconcile``)."""
    target = sleeper.target
    return {
        **{name: getattr(runtime, name) for name in SLEEPER_PROCESS},
        "model_id": target.model_id,
        "preset_id": target.preset_id,
        "fingerprint": target.fingerprint,
        "since": sleeper.since.isoformat(),
    }


def store(runtime: ChannelRuntime, state: ProcessState) -> None:
    running, failure = state.running, state.failure
    runtime.phase = state.phase.value
    runtime.model_id = running.model_id if running else None
    runtime.preset_id = running.preset_id if running else None
    runtime.fingerprint = running.fingerprint if running else ""
    if state.since is not None:
        runtime.since = state.since
    runtime.pid = state.pid
    runtime.stop_sent_at = state.stop_sent_at
    runtime.kill_sent = state.kill_sent
    runtime.fallback = state.fallback
    runtime.failing = state.failing
    runtime.error = state.error
    runtime.reload_generation = state.reload_generation
    runtime.failed_model_id = failure.target.model_id if failure else None
    runtime.failed_preset_id = failure.target.preset_id if failure else None
    runtime.failed_fingerprint = failure.target.fingerprint if failure else ""
    runtime.attempts = failure.attempts if failure else 0
    runtime.retry_at = failure.retry_at if failure else None
    runtime.failure_error = failure.error if failure else ""
    runtime.fallback_failed = failure.fallback_failed if failure else False
    runtime.failure_purpose = failure.purpose if failure else ""
    runtime.failure_began = failure.began if failure else None
    runtime.sleeping_out, runtime.waking = state.sleeping_out, state.waking
    if state.asleep is None:
        runtime.asleep = None
    if state.pid is None:
        runtime.run_id, runtime.port, runtime.api_secret = "", None, ""
    runtime.save()


def returning_of(
    channel: Channel, default: Target | None, now: datetime, reads: StepReads | None = None
) -> frozenset[Target]:
    """What the channel will want again: its default, and the models of its bookings that begin
    within ``SLOTSERVE_PREWARM_SECONDS`` (docs/scheduling.md, "Sleep and wake")."""
    horizon = timedelta(seconds=float(settings.SLOTSERVE_PREWARM_SECONDS))
    reads = reads or StepReads()
    upcoming = booked_targets(channel.pk, now, now + horizon)
    reads.read(upcoming)
    booked = {with_fingerprint(t, reads) for t in upcoming}
    return frozenset(t for t in {default, *booked} if t is not None)


def wanted_of(
    channel: Channel,
    target_row: ChannelTarget | None,
    reload_generation: int = 0,
    now: datetime | None = None,
    reads: StepReads | None = None,
) -> Wanted:
    reads = reads or StepReads()
    wanted = target_of(target_row.model_id, target_row.preset_id) if target_row is not None else None
    reads.read([channel.default_target, wanted])
    default = with_fingerprint(channel.default_target, reads)
    # Nothing sleeps on a card that must be free: staff unloaded it, or a whole-card booking holds it.
    frees_the_card = target_row is None or target_row.reason in FREES_THE_CARD
    sleeps = bool(settings.SLOTSERVE_SLEEP_MODE) and now is not None and not frees_the_card
    common: dict[str, Any] = {
        "default": default,
        "returning": (
            returning_of(channel, default, now, reads) if sleeps and now is not None else frozenset()
        ),
        "reload_generation": reload_generation,
        "drain_seconds": settings.SLOTSERVE_DRAIN_SECONDS,
        "stop_timeout_seconds": settings.SLOTSERVE_STOP_TIMEOUT_SECONDS,
        "load_timeout_seconds": settings.SLOTSERVE_LOAD_TIMEOUT_SECONDS,
    }
    if target_row is None:
        return Wanted(target=None, **common)
    serves_reservation = target_row.reason in SERVES_RESERVATION and target_row.reservation_id is not None
    return Wanted(
        target=with_fingerprint(wanted, reads),
        serves_reservation=serves_reservation,
        purpose=f"reservation:{target_row.reservation_id}" if serves_reservation else target_row.reason,
        **common,
    )
