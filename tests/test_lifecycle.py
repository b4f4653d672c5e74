"""docs/scheduling.md's process lifecycle as a table: every phase × every observation."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest

from channels_app.node_worker.lifecycle import (
    Failure,
    Kill,
    LoadFinished,
    Observed,
    ProcessState,
    Start,
    Tell,
    Terminate,
    Wanted,
    explain_failure,
    retry_delay,
    step,
)
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase
from tests.clock import T0

A = Target(1, 10)  # the default
B = Target(2, 20)  # a booked model
PID = 4242


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


FIVE_SECONDS_AGO = T0 - timedelta(seconds=5)


def state(
    phase: Phase, running: Target | None = B, since: datetime = FIVE_SECONDS_AGO, **extra
) -> ProcessState:
    pid = PID if running is not None and phase not in (Phase.STOPPED, Phase.FAILED) else None
    return ProcessState(phase=phase, running=running, since=since, pid=pid, **extra)


# The bounds of each phase, as the settings give them by default (docs/settings.md).
BOUNDS = {"drain_seconds": 30.0, "stop_timeout_seconds": 15.0, "load_timeout_seconds": 600.0}
WANT_B = Wanted(target=B, default=A, serves_reservation=True, **BOUNDS)
WANT_A = Wanted(target=A, default=A, **BOUNDS)
WANT_NONE = Wanted(target=None, default=A, **BOUNDS)
ALIVE = Observed(alive=True)
HEALTHY = Observed(alive=True, healthy=True)
DEAD = Observed(alive=False, exit_code=1, log_tail="error: bad magic\n")
OOM = Observed(
    alive=False,
    exit_code=1,
    log_tail="ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8000 MiB failed",
)
BUSY = Observed(alive=True, healthy=True, in_flight=2)
GONE_GPU_BUSY = Observed(alive=False, gpu_freed=False)
GONE = Observed(alive=False)

OOM_TEXT = explain_failure(exit_code=1, log_tail=OOM.log_tail)
DEAD_TEXT = explain_failure(exit_code=1, log_tail=DEAD.log_tail)

CASES = [
    # (name, state, wanted, observed, now, phase after, running after, actions)
    (
        "stopped, nothing wanted: stays",
        state(Phase.STOPPED, None),
        WANT_NONE,
        GONE,
        T0,
        Phase.STOPPED,
        None,
        [],
    ),
    (
        "stopped, target wanted: starts",
        state(Phase.STOPPED, None),
        WANT_B,
        GONE,
        T0,
        Phase.LOADING,
        B,
        [Start(B)],
    ),
    ("loading, still loading: waits", state(Phase.LOADING), WANT_B, ALIVE, T0, Phase.LOADING, B, []),
    (
        "loading, /health 200: ready, load recorded, booker told",
        state(Phase.LOADING),
        WANT_B,
        HEALTHY,
        T0,
        Phase.READY,
        B,
        [LoadFinished(True), Tell("channel.ready")],
    ),
    (
        "loading, exits: failed with its reason",
        state(Phase.LOADING),
        WANT_B,
        DEAD,
        T0,
        Phase.FAILED,
        None,
        [LoadFinished(False, DEAD_TEXT), Tell("channel.failed", episode=T0)],
    ),
    (
        "loading, out of memory: failed, explained",
        state(Phase.LOADING),
        WANT_B,
        OOM,
        T0,
        Phase.FAILED,
        None,
        [LoadFinished(False, OOM_TEXT), Tell("channel.failed", episode=T0)],
    ),
    (
        "loading past the load timeout: stop it, failing",
        state(Phase.LOADING, since=T0 - s(600)),
        WANT_B,
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [
            LoadFinished(False, "The model was not ready within 600 s (SLOTSERVE_LOAD_TIMEOUT_SECONDS)."),
            Tell("channel.failed", episode=T0),
            Terminate(PID),
        ],
    ),
    (
        "loading one second before the timeout: waits",
        state(Phase.LOADING, since=T0 - s(599)),
        WANT_B,
        ALIVE,
        T0,
        Phase.LOADING,
        B,
        [],
    ),
    (
        "loading, target changed: abandon at once, no drain",
        state(Phase.LOADING),
        WANT_A,
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [LoadFinished(False, "load abandoned: the channel's target changed"), Terminate(PID)],
    ),
    ("ready, healthy, same target: stays", state(Phase.READY), WANT_B, HEALTHY, T0, Phase.READY, B, []),
    (
        "ready, process killed by someone: failed",
        state(Phase.READY),
        WANT_B,
        DEAD,
        T0,
        Phase.FAILED,
        None,
        [Tell("channel.failed", episode=T0)],
    ),
    ("ready, target changed: drain", state(Phase.READY), WANT_A, BUSY, T0, Phase.DRAINING, B, []),
    (
        "ready, target changed, nothing in flight: stop at once",
        state(Phase.READY),
        WANT_A,
        HEALTHY,
        T0,
        Phase.STOPPING,
        B,
        [Terminate(PID)],
    ),
    ("ready, target now nothing: drain", state(Phase.READY), WANT_NONE, BUSY, T0, Phase.DRAINING, B, []),
    (
        "ready, explicit reload: stop at once without draining",
        state(Phase.READY),
        dataclasses.replace(WANT_B, reload_generation=1),
        BUSY,
        T0,
        Phase.STOPPING,
        B,
        [Terminate(PID)],
    ),
    # Reload restarts at once, whatever the phase (seed 000): it clears the back-off of a failure.
    (
        "failed with 10 min of back-off left, reload: starts now",
        state(
            Phase.FAILED, running=None, failure=Failure(B, 3, T0 + timedelta(minutes=10), "oom"), error="oom"
        ),
        dataclasses.replace(WANT_B, reload_generation=1),
        GONE,
        T0,
        Phase.LOADING,
        B,
        [Start(B)],
    ),
    (
        "loading, reload: the load stops and starts again",
        state(Phase.LOADING),
        dataclasses.replace(WANT_B, reload_generation=1),
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [LoadFinished(False, "load abandoned: the channel was reloaded"), Terminate(PID)],
    ),
    (
        "draining, reload: stops at once",
        state(Phase.DRAINING),
        dataclasses.replace(WANT_A, reload_generation=1),
        BUSY,
        T0,
        Phase.STOPPING,
        B,
        [Terminate(PID)],
    ),
    ("draining, requests in flight: waits", state(Phase.DRAINING), WANT_A, BUSY, T0, Phase.DRAINING, B, []),
    (
        "draining, last request done: SIGTERM",
        state(Phase.DRAINING),
        WANT_A,
        HEALTHY,
        T0,
        Phase.STOPPING,
        B,
        [Terminate(PID)],
    ),
    (
        "draining past SLOTSERVE_DRAIN_SECONDS: SIGTERM anyway",
        state(Phase.DRAINING, since=T0 - s(30)),
        WANT_A,
        BUSY,
        T0,
        Phase.STOPPING,
        B,
        [Terminate(PID)],
    ),
    (
        "draining, target back to what runs: ready again",
        state(Phase.DRAINING),
        WANT_B,
        BUSY,
        T0,
        Phase.READY,
        B,
        [],
    ),
    (
        "draining, process died: stopped, next starts",
        state(Phase.DRAINING),
        WANT_A,
        GONE,
        T0,
        Phase.LOADING,
        A,
        [Start(A)],
    ),
    (
        "stopping, still alive: waits",
        state(Phase.STOPPING, stop_sent_at=T0 - s(14)),
        WANT_A,
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [],
    ),
    (
        "stopping past SLOTSERVE_STOP_TIMEOUT_SECONDS: SIGKILL",
        state(Phase.STOPPING, stop_sent_at=T0 - s(15)),
        WANT_A,
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [Kill(PID)],
    ),
    (
        "stopping, killed already: does not kill twice",
        state(Phase.STOPPING, stop_sent_at=T0 - s(20), kill_sent=True),
        WANT_A,
        ALIVE,
        T0,
        Phase.STOPPING,
        B,
        [],
    ),
    (
        "stopping, exited but GPU memory not yet freed: waits",
        state(Phase.STOPPING, stop_sent_at=T0),
        WANT_A,
        GONE_GPU_BUSY,
        T0,
        Phase.STOPPING,
        B,
        [],
    ),
    (
        "stopping, exited and freed: the next target starts",
        state(Phase.STOPPING, stop_sent_at=T0),
        WANT_A,
        GONE,
        T0,
        Phase.LOADING,
        A,
        [Start(A)],
    ),
    (
        "stopping, exited, nothing wanted: stopped",
        state(Phase.STOPPING, stop_sent_at=T0),
        WANT_NONE,
        GONE,
        T0,
        Phase.STOPPED,
        None,
        [],
    ),
    (
        "stopping after a failure: rests failed",
        state(Phase.STOPPING, stop_sent_at=T0, failing=True, failure=Failure(B, 1, T0 + s(30), "x")),
        WANT_B,
        GONE,
        T0,
        Phase.FAILED,
        None,
        [],
    ),
    (
        "failed, booked model waits for its retry: the default serves as fallback",
        state(Phase.FAILED, None, failure=Failure(B, 1, T0 + s(30), "x")),
        WANT_B,
        GONE,
        T0,
        Phase.LOADING,
        A,
        [Tell("channel.fallback"), Start(A, True)],
    ),
    (
        "failed, no reservation: waits for the retry with nothing",
        state(Phase.FAILED, None, failure=Failure(B, 1, T0 + s(30), "x")),
        dataclasses.replace(WANT_B, serves_reservation=False),
        GONE,
        T0,
        Phase.FAILED,
        None,
        [],
    ),
    (
        "failed, retry time reached: start the booked model again",
        state(Phase.FAILED, None, failure=Failure(B, 1, T0, "x")),
        WANT_B,
        GONE,
        T0,
        Phase.LOADING,
        B,
        [Start(B)],
    ),
    (
        "ready on the fallback, retry time reached: drain to switch back",
        state(Phase.READY, A, fallback=True, failure=Failure(B, 1, T0, "x")),
        WANT_B,
        BUSY,
        T0,
        Phase.DRAINING,
        A,
        [],
    ),
    (
        "loading the booked model after a retry, healthy: recovered",
        state(Phase.LOADING, B, failure=Failure(B, 2, T0 - s(1), "x")),
        WANT_B,
        HEALTHY,
        T0,
        Phase.READY,
        B,
        [LoadFinished(True), Tell("channel.recovered")],
    ),
]


@pytest.mark.parametrize(
    ("before", "wanted", "seen", "now", "phase", "running", "actions"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_step(before, wanted, seen, now, phase, running, actions):
    after = step(before, wanted, seen, now)
    assert after.state.phase == phase
    assert after.state.running == running
    assert after.actions == actions


def test_failure_schedules_growing_retries_and_success_resets():
    now = T0
    current = state(Phase.LOADING, since=now)
    delays = []
    for _ in range(7):
        failed = step(current, WANT_B, DEAD, now).state
        assert failed.failure is not None
        delays.append((failed.failure.retry_at - now).total_seconds())
        now = failed.failure.retry_at
        current = step(
            dataclasses.replace(failed, fallback=False), Wanted(target=B, **BOUNDS), GONE, now
        ).state
        assert current.phase == Phase.LOADING
    assert delays == [30, 60, 120, 240, 480, 600, 600]
    ready = step(current, Wanted(target=B, **BOUNDS), HEALTHY, now).state
    assert ready.failure is None and ready.error == ""


# A failure episode belongs to what its target was wanted for (docs/scheduling.md "Retries").
BOOKING_1, BOOKING_2 = "reservation:1", "reservation:2"
LAST_WEEK = T0 - timedelta(days=7)
EPISODE_1 = Failure(B, 4, LAST_WEEK + s(480), "oom", purpose=BOOKING_1, began=LAST_WEEK)
FOR_BOOKING_1 = dataclasses.replace(WANT_B, purpose=BOOKING_1)
FOR_BOOKING_2 = dataclasses.replace(WANT_B, purpose=BOOKING_2)
AFTER_THE_BOOKING = dataclasses.replace(WANT_A, purpose="default")


def test_the_episode_ends_with_its_booking_and_the_fallback_serves_as_the_default():
    on_fallback = state(
        Phase.READY,
        A,
        fallback=True,
        failure=dataclasses.replace(EPISODE_1, retry_at=T0 + s(60)),
        error="oom",
    )
    after = step(on_fallback, AFTER_THE_BOOKING, HEALTHY, T0)
    assert (after.state.phase, after.state.running, after.actions) == (Phase.READY, A, [])
    assert after.state.failure is None and not after.state.fallback and after.state.error == ""


def test_a_failed_channel_whose_booking_ended_is_stopped_not_failed():
    failed = state(Phase.FAILED, None, failure=EPISODE_1, error="oom")
    after = step(failed, WANT_NONE, GONE, T0)
    assert (after.state.phase, after.state.failure, after.state.error, after.actions) == (
        Phase.STOPPED,
        None,
        "",
        [],
    )


def test_a_later_booking_of_the_same_target_starts_a_new_episode():
    # It fails once: the first retry is 30 s away, not the old episode's fifth step.
    loading = state(Phase.LOADING, B, since=T0 - s(5), failure=EPISODE_1)
    failed = step(loading, FOR_BOOKING_2, DEAD, T0)
    assert failed.state.failure == Failure(B, 1, T0 + s(30), DEAD_TEXT, purpose=BOOKING_2, began=T0)
    assert Tell("channel.failed", episode=T0) in failed.actions
    # It loads at once: the booker hears that it is ready, not that it recovered.
    ready = step(loading, FOR_BOOKING_2, HEALTHY, T0)
    assert ready.actions == [LoadFinished(True), Tell("channel.ready")]
    assert ready.state.failure is None


def test_each_failure_is_told_with_its_episode_and_a_second_one_in_the_same_booking_begins_another():
    now, told = T0, []
    current = state(Phase.LOADING, since=now)
    for _ in range(3):  # three failures in a row: one episode
        failed = step(current, FOR_BOOKING_1, DEAD, now)
        told += [a for a in failed.actions if isinstance(a, Tell)]
        now = failed.state.failure.retry_at
        current = step(dataclasses.replace(failed.state, fallback=False), FOR_BOOKING_1, GONE, now).state
    assert told == [Tell("channel.failed", episode=T0)] * 3  # people hear of it once (its episode)
    recovered = step(current, FOR_BOOKING_1, HEALTHY, now)
    assert recovered.actions[1] == Tell("channel.recovered", episode=T0)
    # The same booking's model dies an hour later: a new episode, told again.
    later = now + timedelta(hours=1)
    again = step(recovered.state, FOR_BOOKING_1, DEAD, later)
    assert again.actions == [Tell("channel.failed", episode=later)]
    assert again.state.failure is not None and again.state.failure.attempts == 1


def test_the_default_failing_again_is_the_same_episode():
    failed = step(state(Phase.LOADING, A), AFTER_THE_BOOKING, DEAD, T0)
    assert failed.actions == [LoadFinished(False, DEAD_TEXT), Tell("channel.failed", episode=T0)]
    retried = step(failed.state, AFTER_THE_BOOKING, GONE, T0 + s(30))
    assert retried.actions == [Start(A)]
    again = step(retried.state, AFTER_THE_BOOKING, DEAD, T0 + s(31))
    assert again.actions == [LoadFinished(False, DEAD_TEXT), Tell("channel.failed", episode=T0)]


def test_fallback_that_fails_too_waits_for_the_booked_retry():
    booked_failure = Failure(B, 1, T0 + s(30), "oom")
    on_fallback = state(Phase.LOADING, A, fallback=True, failure=booked_failure)
    failed = step(on_fallback, WANT_B, DEAD, T0).state
    assert failed.phase == Phase.FAILED
    assert failed.failure is not None and failed.failure.target == B and failed.failure.fallback_failed
    assert step(failed, WANT_B, GONE, T0 + s(10)).actions == []
    assert step(failed, WANT_B, GONE, T0 + s(30)).actions == [Start(B)]


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "ran out of memory"),
        ("RuntimeError: CUDA error: out of memory", "ran out of memory"),
        ("llama_model_load: error loading model: unable to allocate CUDA0 buffer", "ran out of memory"),
        ("ValueError: No available memory for the cache blocks. Not enough memory", "ran out of memory"),
        (
            "error: invalid argument: --bogus",
            "exited with status 1. Last output: error: invalid argument: --bogus",
        ),
    ],
)
def test_failure_explanations(log, expected):
    assert expected in explain_failure(exit_code=1, log_tail=log)


def test_retry_delay():
    assert [retry_delay(n).total_seconds() for n in (1, 2, 3, 4, 5, 6, 10)] == [
        30,
        60,
        120,
        240,
        480,
        600,
        600,
    ]


@pytest.mark.parametrize(
    ("phase", "age", "delay"),
    [
        ("loading", 0, 0.05),
        ("loading", 2, 0.2),
        ("loading", 60, 1.0),
        ("stopping", 0.1, 0.05),
        ("ready", 5, None),
        ("failed", 5, None),
        ("draining", 3, 0.3),
    ],
)
def test_follow_up_delay(phase, age, delay):
    from channels_app.node_worker.tasks import follow_up_delay

    assert follow_up_delay(phase, age) == (pytest.approx(delay) if delay is not None else None)


@pytest.mark.parametrize(
    ("backend", "advice", "not_advice"),
    [
        ("llama.cpp", ["-ngl", "-c"], ["--gpu-memory-utilization"]),
        ("vllm", ["--gpu-memory-utilization", "--max-model-len", "--tensor-parallel-size"], ["-ngl"]),
        ("sglang", ["--mem-fraction-static", "--context-length", "--tp-size"], ["-ngl"]),
    ],
)
def test_out_of_memory_advice_speaks_each_backends_options(backend, advice, not_advice):
    text = explain_failure(
        exit_code=1, log_tail="torch.OutOfMemoryError: CUDA out of memory.", backend=backend
    )
    assert "ran out of memory" in text
    assert all(option in text for option in advice), text
    assert not any(option in text.split() for option in not_advice), text


def test_a_failures_reason_says_the_error_not_the_command_line():
    """The run log begins with the command (staff read it there); the reason everyone reads on
    the channel's card and in its story tells the error, not the paths and port of the command."""
    tail = (
        "$ /opt/llama/llama-server -m /models/private/qwen.gguf --host 127.0.0.1 --port 41234 --foo\n"
        "error: invalid argument: --foo\n"
    )
    said = explain_failure(exit_code=1, log_tail=tail)
    assert "invalid argument: --foo" in said
    assert "/models/private" not in said and "41234" not in said and "$ " not in said
    only_command = explain_failure(exit_code=1, log_tail="$ /opt/llama/llama-server --port 41234\n")
    assert only_command == "The process exited with status 1." and "41234" not in only_command
