"""The inference process lifecycle of docs/scheduling.md, as a pure state machine.

``step`` takes a channel's process state, what it should run, what was
observed of the process and ``now``, and returns the next state and the
actions to perform. The node worker (``channels_app.node_worker.worker``) observes,
steps and acts; every step is short, never waits, and is safe to repeat.

Phases: stopped → loading → ready → draining → stopping → stopped;
loading → failed (exit or load timeout); failed → loading (retry, or the
default model as a fallback while the booked one waits for its retry).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from channels_app.node_worker.failures import explain_failure
from channels_app.node_worker.lifecycle_state import (
    Action,
    Failure,
    Kill,
    LoadFinished,
    Observed,
    ProcessState,
    Sleep,
    Sleeper,
    Start,
    Step,
    Tell,
    Terminate,
    Wake,
    Wanted,
)
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, WebhookEvent

__all__ = [
    "RETRY_FIRST_SECONDS",
    "RETRY_MAX_SECONDS",
    "Action",
    "Failure",
    "Kill",
    "LoadFinished",
    "Observed",
    "ProcessState",
    "Sleep",
    "Sleeper",
    "Start",
    "Step",
    "Tell",
    "Terminate",
    "Wake",
    "Wanted",
    "effective_target",
    "explain_failure",
    "retry_delay",
    "step",
]

RETRY_FIRST_SECONDS = 30
RETRY_MAX_SECONDS = 600


def retry_delay(attempts: int) -> timedelta:
    """30 s, 60 s, 120 s, … capped at 10 minutes (docs/scheduling.md)."""
    seconds = RETRY_FIRST_SECONDS * 2 ** max(attempts - 1, 0)
    return timedelta(seconds=min(seconds, RETRY_MAX_SECONDS))


def effective_target(state: ProcessState, wanted: Wanted, now: datetime) -> tuple[Target | None, bool]:
    """What to run now: the wanted target, or while it waits for a retry the
    default as a fallback for a reservation (docs/scheduling.md), or nothing."""
    failure = state.failure
    if wanted.target is None or failure is None or failure.target != wanted.target or now >= failure.retry_at:
        return wanted.target, False
    if (
        wanted.serves_reservation
        and wanted.default is not None
        and wanted.default != wanted.target
        and not failure.fallback_failed
    ):
        return wanted.default, True
    return None, False


def _same_target(one: Target | None, other: Target | None) -> bool:
    """The same model and preset (an edited preset is still the same one for its episode)."""
    return (
        one is not None
        and other is not None
        and (one.model_id, one.preset_id) == (other.model_id, other.preset_id)
    )


def _end_stale_episode(state: ProcessState, wanted: Wanted) -> ProcessState:
    """A failure episode whose target is no longer wanted for its purpose is over: its retry
    time, error and fallback go with it, and a later want of the same target starts afresh."""
    failure = state.failure
    if failure is None or (_same_target(failure.target, wanted.target) and failure.purpose == wanted.purpose):
        return state
    ended = dataclasses.replace(state, failure=None, error="")
    if state.fallback and state.running == wanted.target:
        ended = dataclasses.replace(ended, fallback=False)  # what served as the fallback is now wanted
    if state.phase == Phase.FAILED:
        ended = dataclasses.replace(ended, phase=Phase.STOPPED)
    return ended


def _fail(state: ProcessState, wanted: Wanted, now: datetime, error: str, alive: bool) -> Step:
    """A run failed: remember it, schedule the retry, stop what is left of it. Every failure is
    told with its episode (people hear of an episode's first only)."""
    assert state.running is not None
    previous = state.failure
    attempts = previous.attempts + 1 if previous and previous.target == state.running else 1
    began = previous.began if previous is not None and previous.began is not None else now
    retry_at = now + retry_delay(attempts)
    failure = Failure(state.running, attempts, retry_at, error, purpose=wanted.purpose, began=began)
    actions: list[Action] = [LoadFinished(False, error)] if state.phase == Phase.LOADING else []
    actions.append(Tell(WebhookEvent.CHANNEL_FAILED, episode=began))
    # A failing fallback keeps the booked model's failure record, and is not
    # tried again before the booked model's own retry.
    kept = dataclasses.replace(previous, fallback_failed=True) if state.fallback and previous else failure
    base = dataclasses.replace(state, failure=kept, error=error, since=now, waking=False, sleeping_out=False)
    if alive and state.pid is not None:
        stopping = dataclasses.replace(
            base, phase=Phase.STOPPING, stop_sent_at=now, kill_sent=False, failing=True
        )
        return Step(stopping, [*actions, Terminate(state.pid)])
    failed = dataclasses.replace(
        base, phase=Phase.FAILED, pid=None, running=None, fallback=False, failing=False
    )
    return Step(failed, actions)


def _start_if_wanted(state: ProcessState, wanted: Wanted, now: datetime, actions: list[Action]) -> Step:
    """From stopped or failed: start the effective target, if there is one."""
    target, fallback = effective_target(state, wanted, now)
    if target is None:
        return Step(state, actions)
    if fallback and not state.fallback:
        began = state.failure.began if state.failure is not None else None
        actions.append(Tell(WebhookEvent.CHANNEL_FALLBACK, episode=began))
    asleep = state.asleep
    wakes = asleep is not None and asleep.target == target  # its next turn: woken, not loaded cold
    loading = dataclasses.replace(
        state,
        phase=Phase.LOADING,
        running=target,
        since=now,
        pid=asleep.pid if asleep is not None and wakes else None,
        stop_sent_at=None,
        kill_sent=False,
        fallback=fallback,
        failing=False,
        reload_generation=wanted.reload_generation,
        asleep=None if wakes else asleep,
        waking=wakes,
    )
    if asleep is not None and wakes:
        return Step(loading, [*actions, Wake(asleep.pid)])
    return Step(loading, [*actions, Start(target, fallback)])


def step(state: ProcessState, wanted: Wanted, seen: Observed, now: datetime) -> Step:
    """One step of the lifecycle; see the module docstring for the phases."""
    state, first = _tend_sleeper(state, wanted, seen, now)
    result = _step(state, wanted, seen, now)
    return Step(result.state, [*first, *result.actions]) if first else result


def _tend_sleeper(
    state: ProcessState, wanted: Wanted, seen: Observed, now: datetime
) -> tuple[ProcessState, list[Action]]:
    """A sleeper that died is forgotten; one the channel no longer wants, or a reload, stops it."""
    asleep = state.asleep
    if asleep is None:
        return state, []
    if not seen.sleeper_alive:
        return dataclasses.replace(state, asleep=None), []
    target, _ = effective_target(state, wanted, now)
    reloaded = wanted.reload_generation != state.reload_generation
    if reloaded or (asleep.target != target and asleep.target not in wanted.returning):
        return dataclasses.replace(state, asleep=None), [Terminate(asleep.pid)]
    return state, []


def _step(state: ProcessState, wanted: Wanted, seen: Observed, now: datetime) -> Step:
    phase = state.phase
    if wanted.reload_generation != state.reload_generation:
        # "Reload" restarts at once, whatever the phase: a failure's back-off is forgotten
        # (an admin who fixed the preset should not wait for it), a load or a drain stops now.
        if state.failure is not None:
            state = dataclasses.replace(state, failure=None, error="")
        if phase == Phase.LOADING:
            return _stop(state, now, [LoadFinished(False, "load abandoned: the channel was reloaded")])
        if phase == Phase.DRAINING:
            return _stop(state, now, [])
    state = _end_stale_episode(state, wanted)
    phase = state.phase
    target, _ = effective_target(state, wanted, now)

    if phase in (Phase.STOPPED, Phase.FAILED):
        return _start_if_wanted(state, wanted, now, [])

    assert state.since is not None
    if phase == Phase.LOADING:
        if not seen.alive:
            error = explain_failure(exit_code=seen.exit_code, log_tail=seen.log_tail, backend=seen.backend)
            return _fail(state, wanted, now, error, alive=False)
        if target != state.running:
            # Nothing is served yet, so nothing to drain: stop the load at once.
            return _stop(state, now, [LoadFinished(False, "load abandoned: the channel's target changed")])
        overslept = seen.sleeping and now - state.since >= timedelta(seconds=wanted.stop_timeout_seconds)
        if state.waking and (seen.wake_failed or overslept):
            return _stop(state, now, [])  # stopped, and loaded cold (no failure: nothing was wrong with it)
        if seen.healthy and (not state.waking or seen.sleeping is False):
            return _ready(state, wanted, now)
        if now - state.since >= timedelta(seconds=wanted.load_timeout_seconds):
            error = explain_failure(
                exit_code=None,
                log_tail=seen.log_tail,
                timed_out_after=wanted.load_timeout_seconds,
                backend=seen.backend,
            )
            return _fail(state, wanted, now, error, alive=True)
        return Step(state)

    if phase == Phase.READY:
        if not seen.alive:
            error = explain_failure(exit_code=seen.exit_code, log_tail=seen.log_tail, backend=seen.backend)
            return _fail(state, wanted, now, error, alive=False)
        if wanted.reload_generation != state.reload_generation:
            return _stop(state, now, [])  # an explicit reload restarts at once, without draining
        if target != state.running:
            if seen.in_flight <= 0:
                return _leave(state, wanted, seen, now)  # nothing to drain
            return Step(dataclasses.replace(state, phase=Phase.DRAINING, since=now))
        return Step(state)

    if phase == Phase.DRAINING:
        if not seen.alive:
            stopped = dataclasses.replace(state, phase=Phase.STOPPED, pid=None, running=None, since=now)
            return _start_if_wanted(stopped, wanted, now, [])
        if target == state.running:
            return Step(dataclasses.replace(state, phase=Phase.READY, since=now))
        drained = seen.in_flight <= 0
        if drained or now - state.since >= timedelta(seconds=wanted.drain_seconds):
            return _leave(state, wanted, seen, now)
        return Step(state)

    # STOPPING: wait for the exit, then for the GPUs' memory, then rest.
    if state.sleeping_out:
        if seen.alive and seen.sleeping:
            return _fell_asleep(state, wanted, now)
        assert state.stop_sent_at is not None and state.pid is not None
        if seen.alive and now - state.stop_sent_at >= timedelta(seconds=wanted.stop_timeout_seconds):
            stopping = dataclasses.replace(state, sleeping_out=False, stop_sent_at=now, kill_sent=False)
            return Step(stopping, [Terminate(state.pid)])  # it did not fall asleep: stopped instead
        if seen.alive:
            return Step(state)
        state = dataclasses.replace(state, sleeping_out=False)  # it died on the way: as stopped
    if seen.alive:
        assert state.pid is not None and state.stop_sent_at is not None
        overdue = now - state.stop_sent_at >= timedelta(seconds=wanted.stop_timeout_seconds)
        if overdue and not state.kill_sent:
            return Step(dataclasses.replace(state, kill_sent=True), [Kill(state.pid)])
        return Step(state)
    if not seen.gpu_freed:
        return Step(state)
    rest = Phase.FAILED if state.failing else Phase.STOPPED
    rested = dataclasses.replace(
        state, phase=rest, pid=None, running=None, fallback=False, failing=False, since=now
    )
    if rest == Phase.FAILED:
        return Step(rested)
    return _start_if_wanted(rested, wanted, now, [])


def _stop(state: ProcessState, now: datetime, actions: list[Action]) -> Step:
    stopping = dataclasses.replace(
        state, phase=Phase.STOPPING, since=now, stop_sent_at=now, kill_sent=False, waking=False
    )
    return Step(stopping, [*actions, Terminate(state.pid)] if state.pid is not None else actions)


def _leave(state: ProcessState, wanted: Wanted, seen: Observed, now: datetime) -> Step:
    """The running process is no longer wanted: put to sleep where the channel will want it
    again and it can sleep (one sleeper a channel: an older one that is not wanted now stops),
    stopped otherwise."""
    running = state.running
    if running is None or state.pid is None or not seen.sleep_fits or running not in wanted.returning:
        return _stop(state, now, [])
    target, _ = effective_target(state, wanted, now)
    actions: list[Action] = []
    asleep = state.asleep
    if asleep is not None and asleep.target != target:
        actions.append(Terminate(asleep.pid))
        asleep = None
    going = dataclasses.replace(
        state,
        phase=Phase.STOPPING,
        since=now,
        stop_sent_at=now,
        kill_sent=False,
        sleeping_out=True,
        asleep=asleep,
    )
    return Step(going, [*actions, Sleep(state.pid)])


def _fell_asleep(state: ProcessState, wanted: Wanted, now: datetime) -> Step:
    """The process sleeps: it is the channel's sleeper, and the target starts (or wakes)."""
    assert state.running is not None and state.pid is not None
    sleeper = Sleeper(state.running, state.pid, now)
    rested = dataclasses.replace(
        state,
        phase=Phase.STOPPED,
        pid=None,
        running=None,
        fallback=False,
        failing=False,
        since=now,
        stop_sent_at=None,
        sleeping_out=False,
    )
    result = _start_if_wanted(rested, wanted, now, [])
    return Step(dataclasses.replace(result.state, asleep=sleeper), result.actions)


def _ready(state: ProcessState, wanted: Wanted, now: datetime) -> Step:
    actions: list[Action] = [LoadFinished(True)]
    failure = state.failure
    # The booked model serves again, be it at its retry or after its preset was mended.
    recovered = failure is not None and _same_target(failure.target, state.running)
    if recovered:
        assert failure is not None
        if wanted.serves_reservation:
            actions.append(Tell(WebhookEvent.CHANNEL_RECOVERED, episode=failure.began))
        failure = None
    elif wanted.serves_reservation and not state.fallback:
        actions.append(Tell(WebhookEvent.CHANNEL_READY))
    error = "" if recovered or not state.fallback else state.error
    ready = dataclasses.replace(
        state, phase=Phase.READY, since=now, failure=failure, error=error, waking=False
    )
    return Step(ready, actions)
