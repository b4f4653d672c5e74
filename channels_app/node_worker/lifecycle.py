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
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, WebhookEvent

RETRY_FIRST_SECONDS = 30
RETRY_MAX_SECONDS = 600


@dataclass(frozen=True)
class Failure:
    """A failure episode: the target that failed, what it was wanted for (``Wanted.purpose``),
    since when it fails, how often it failed in a row, and when to try again.

    An episode starts with a failed load and ends when its target loads, is no longer wanted
    for the same purpose (the booking ended, another booking of the same model began), or is
    reloaded; its retries, fallback, error and notifications are its own (docs/scheduling.md
    "Retries")."""

    target: Target
    attempts: int
    retry_at: datetime
    error: str
    fallback_failed: bool = False
    purpose: str = ""
    began: datetime | None = None


@dataclass(frozen=True)
class ProcessState:
    """What the node worker knows of a channel's process (``ChannelRuntime``)."""

    phase: Phase = Phase.STOPPED
    running: Target | None = None
    since: datetime | None = None
    pid: int | None = None
    stop_sent_at: datetime | None = None
    kill_sent: bool = False
    fallback: bool = False
    failing: bool = False
    failure: Failure | None = None
    error: str = ""
    reload_generation: int = 0


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """What the scheduler stored for the channel, and the settings that bound each phase
    (``SLOTSERVE_DRAIN_SECONDS``, ``SLOTSERVE_STOP_TIMEOUT_SECONDS``,
    ``SLOTSERVE_LOAD_TIMEOUT_SECONDS``: given by ``rows.wanted_of``, defaults nowhere but in
    the settings)."""

    target: Target | None
    default: Target | None = None
    serves_reservation: bool = False
    # What the target is wanted for: ``reservation:<id>``, or the decision's reason. A failure
    # episode belongs to one purpose: a later booking of the same model starts afresh.
    purpose: str = ""
    reload_generation: int = 0
    drain_seconds: float
    stop_timeout_seconds: float
    load_timeout_seconds: float


@dataclass(frozen=True)
class Observed:
    """What the node worker saw of the process this tick."""

    alive: bool = False
    exit_code: int | None = None
    healthy: bool = False
    in_flight: int = 0
    gpu_freed: bool = True
    log_tail: str = ""
    backend: str = ""  # of the model the process runs: its out-of-memory advice names its options


# --- Actions the worker performs -------------------------------------------


@dataclass(frozen=True)
class Start:
    target: Target
    fallback: bool = False


@dataclass(frozen=True)
class Terminate:
    pid: int


@dataclass(frozen=True)
class Kill:
    pid: int


@dataclass(frozen=True)
class LoadFinished:
    """Close the load record of the current run: a success, or a failure and why."""

    succeeded: bool
    error: str = ""


@dataclass(frozen=True)
class Tell:
    """A fact the phase alone does not say (``node_worker.announce`` tells it): a run failed
    (each time), the default model serves as a fallback, the booked model serves again after a
    failure, the booked model is ready. ``episode``: when the failure episode began; whoever
    tells people of a failure, a fallback or a recovery does so once per episode."""

    event: WebhookEvent
    episode: datetime | None = None


Action = Start | Terminate | Kill | LoadFinished | Tell


@dataclass(frozen=True)
class Step:
    state: ProcessState
    actions: list[Action] = field(default_factory=list)


def retry_delay(attempts: int) -> timedelta:
    """30 s, 60 s, 120 s, … capped at 10 minutes (docs/scheduling.md)."""
    seconds = RETRY_FIRST_SECONDS * 2 ** max(attempts - 1, 0)
    return timedelta(seconds=min(seconds, RETRY_MAX_SECONDS))


# Out-of-memory messages of llama.cpp, vLLM/PyTorch and SGLang.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaMalloc failed"
    r"|out of memory|failed to allocate .*buffer|unable to allocate .*buffer"
    r"|ggml_backend_cuda_buffer_type_alloc_buffer: allocating .* failed"
    r"|Not enough memory|insufficient memory",
    re.IGNORECASE,
)


# How the node worker's record of a launch that never ran begins (channels_app.node_worker.worker._launch).
LAUNCH_FAILED = "could not start"


# What to change after running out of GPU memory, in each backend's own options.
OOM_ADVICE = {
    "llama.cpp": "Lower -ngl (fewer layers on the GPU) or -c (a shorter context) in the preset, or book "
    "a channel with more GPU memory.",
    "vllm": "Lower --gpu-memory-utilization (the share of GPU memory vLLM takes) or --max-model-len "
    "(a shorter context) in the preset, or spread the model over more GPUs with "
    "--tensor-parallel-size on a channel that has them.",
    "sglang": "Lower --mem-fraction-static (the share of GPU memory SGLang keeps) or --context-length in "
    "the preset, or spread the model over more GPUs with --tp-size on a channel that has them.",
}


def explain_failure(
    *, exit_code: int | None, log_tail: str, timed_out_after: float | None = None, backend: str = ""
) -> str:
    """A failed run's reason in plain words, from its exit and its own output."""
    if OOM_PATTERNS.search(log_tail):
        advice = OOM_ADVICE.get(backend, OOM_ADVICE["llama.cpp"])
        return f"The GPU ran out of memory while loading the model. {advice}"
    if timed_out_after is not None:
        return f"The model was not ready within {timed_out_after:g} s (SLOTSERVE_LOAD_TIMEOUT_SECONDS)."
    # The run log begins with the command it ran ("$ …": its paths and port): staff read it
    # there; the reason, which everyone reads, tells what the process said.
    said = [line for line in log_tail.strip().splitlines() if line.strip() and not line.startswith("$ ")]
    last = said[-3:]
    tail = (" Last output: " + " | ".join(last)) if last else ""
    if exit_code is None and last and last[-1].startswith(LAUNCH_FAILED):
        return f"The process could not be started: {last[-1][len(LAUNCH_FAILED) :].strip()}"
    if exit_code is None:
        return "The process is gone (killed or crashed)." + tail
    if exit_code < 0:
        return f"The process was killed by signal {-exit_code}." + tail
    return f"The process exited with status {exit_code}." + tail


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
    base = dataclasses.replace(state, failure=kept, error=error, since=now)
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
    loading = dataclasses.replace(
        state,
        phase=Phase.LOADING,
        running=target,
        since=now,
        pid=None,
        stop_sent_at=None,
        kill_sent=False,
        fallback=fallback,
        failing=False,
        reload_generation=wanted.reload_generation,
    )
    return Step(loading, [*actions, Start(target, fallback)])


def step(state: ProcessState, wanted: Wanted, seen: Observed, now: datetime) -> Step:
    """One step of the lifecycle; see the module docstring for the phases."""
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
        if seen.healthy:
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
                return _stop(state, now, [])  # nothing to drain
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
            return _stop(state, now, [])
        return Step(state)

    # STOPPING: wait for the exit, then for the GPUs' memory, then rest.
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
    stopping = dataclasses.replace(state, phase=Phase.STOPPING, since=now, stop_sent_at=now, kill_sent=False)
    return Step(stopping, [*actions, Terminate(state.pid)] if state.pid is not None else actions)


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
    ready = dataclasses.replace(state, phase=Phase.READY, since=now, failure=failure, error=error)
    return Step(ready, actions)
