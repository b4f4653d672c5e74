"""Warm handovers (docs/scheduling.md, "Sleep and wake"): a process whose target the channel
wants again, on a backend that sleeps and with host RAM for its weights, is put to sleep
instead of stopped, and woken for its next turn; a sleeper that died, is no longer wanted, or
fails to wake gives way to a cold load."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from channels_app.node_worker.lifecycle import (
    LoadFinished,
    Observed,
    ProcessState,
    Sleep,
    Sleeper,
    Start,
    Terminate,
    Wake,
    Wanted,
    step,
)
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase
from tests.clock import T0

A = Target(1, 10)  # the default, on a backend that sleeps
B = Target(2, 20)  # a booked model
C = Target(3, 30)  # another booked model
PID, SLEEPER_PID = 4242, 5151
BOUNDS = {"drain_seconds": 30.0, "stop_timeout_seconds": 15.0, "load_timeout_seconds": 600.0}
EARLIER = T0 - timedelta(seconds=5)

WANT_B = Wanted(target=B, default=A, serves_reservation=True, returning=frozenset({A}), **BOUNDS)
WANT_A = Wanted(target=A, default=A, returning=frozenset({A}), **BOUNDS)
FITS = Observed(alive=True, healthy=True, sleep_fits=True, sleeper_alive=True)


def ready(running: Target, **extra) -> ProcessState:
    return ProcessState(phase=Phase.READY, running=running, since=EARLIER, pid=PID, **extra)


def test_the_default_leaving_for_a_booking_is_put_to_sleep_not_stopped():
    result = step(ready(A), WANT_B, FITS, T0)
    assert result.actions == [Sleep(PID)]
    assert result.state.phase == Phase.STOPPING and result.state.sleeping_out
    assert result.state.stop_sent_at == T0


def test_a_process_the_channel_does_not_want_again_is_stopped():
    leaving_b = ready(B)
    result = step(leaving_b, WANT_A, FITS, T0)
    assert result.actions == [Terminate(PID)]
    assert not result.state.sleeping_out


def test_without_room_in_host_ram_or_a_backend_that_sleeps_it_is_stopped():
    result = step(ready(A), WANT_B, dataclasses.replace(FITS, sleep_fits=False), T0)
    assert result.actions == [Terminate(PID)]


def test_once_asleep_it_is_kept_and_the_booked_model_starts():
    going = step(ready(A), WANT_B, FITS, T0).state
    asleep = Observed(alive=True, sleeping=True, sleep_fits=True, sleeper_alive=True)
    result = step(going, WANT_B, asleep, T0 + timedelta(seconds=1))
    assert result.state.asleep == Sleeper(A, PID, T0 + timedelta(seconds=1))
    assert result.state.phase == Phase.LOADING and result.state.running == B
    assert result.actions == [Start(B)]
    assert result.state.pid is None  # the new run's, once started


def test_a_process_that_does_not_fall_asleep_in_time_is_stopped():
    going = step(ready(A), WANT_B, FITS, T0).state
    awake = Observed(alive=True, sleeping=False, sleep_fits=True)
    assert step(going, WANT_B, awake, T0 + timedelta(seconds=5)).actions == []
    late = step(going, WANT_B, awake, T0 + timedelta(seconds=15))
    assert late.actions == [Terminate(PID)]
    assert late.state.phase == Phase.STOPPING and not late.state.sleeping_out


def test_the_sleeper_is_woken_for_its_next_turn_instead_of_a_cold_load():
    serving_b = ready(B, asleep=Sleeper(A, SLEEPER_PID, EARLIER))
    # B leaves (its booking ended); it is not wanted again: stopped; then A wakes.
    stopping = step(serving_b, WANT_A, FITS, T0)
    assert stopping.actions == [Terminate(PID)]
    gone = Observed(alive=False, gpu_freed=True, sleeper_alive=True)
    woken = step(stopping.state, WANT_A, gone, T0 + timedelta(seconds=1))
    assert woken.actions == [Wake(SLEEPER_PID)]
    assert woken.state.phase == Phase.LOADING and woken.state.waking
    assert (woken.state.running, woken.state.pid, woken.state.asleep) == (A, SLEEPER_PID, None)
    # Ready once it answers and says it is awake.
    still = Observed(alive=True, healthy=True, sleeping=True)
    assert step(woken.state, WANT_A, still, T0 + timedelta(seconds=2)).state.phase == Phase.LOADING
    awake = Observed(alive=True, healthy=True, sleeping=False)
    done = step(woken.state, WANT_A, awake, T0 + timedelta(seconds=2))
    assert done.state.phase == Phase.READY and not done.state.waking
    assert LoadFinished(True) in done.actions


def test_a_wake_that_fails_stops_the_sleeper_and_loads_cold():
    waking = ProcessState(phase=Phase.LOADING, running=A, since=T0, pid=SLEEPER_PID, waking=True)
    failed = Observed(alive=True, healthy=True, sleeping=True, wake_failed="CUDA out of memory")
    result = step(waking, WANT_A, failed, T0 + timedelta(seconds=1))
    assert result.actions == [Terminate(SLEEPER_PID)]
    assert result.state.phase == Phase.STOPPING and not result.state.waking
    gone = Observed(alive=False, gpu_freed=True)
    cold = step(result.state, WANT_A, gone, T0 + timedelta(seconds=2))
    assert cold.actions == [Start(A)] and cold.state.failure is None


def test_a_sleeper_that_died_is_forgotten_and_the_target_loads_cold():
    stopped = ProcessState(phase=Phase.STOPPED, asleep=Sleeper(A, SLEEPER_PID, EARLIER))
    result = step(stopped, WANT_A, Observed(sleeper_alive=False), T0)
    assert result.actions == [Start(A)] and result.state.asleep is None


def test_a_sleeper_no_longer_wanted_is_stopped():
    serving_b = ready(B, asleep=Sleeper(C, SLEEPER_PID, EARLIER))
    result = step(serving_b, WANT_B, FITS, T0)
    assert result.actions == [Terminate(SLEEPER_PID)] and result.state.asleep is None
    assert result.state.phase == Phase.READY


def test_one_sleeper_a_channel_the_older_one_is_stopped():
    # C serves, A sleeps; C is wanted again (an upcoming booking) and B comes now.
    both = Wanted(target=B, default=A, returning=frozenset({A, C}), **BOUNDS)
    serving_c = ready(C, asleep=Sleeper(A, SLEEPER_PID, EARLIER))
    result = step(serving_c, both, FITS, T0)
    assert result.actions == [Terminate(SLEEPER_PID), Sleep(PID)]
    assert result.state.asleep is None and result.state.sleeping_out


def test_a_reload_stops_the_sleeper_too():
    reloaded = dataclasses.replace(WANT_B, reload_generation=1)
    serving_b = ready(B, asleep=Sleeper(A, SLEEPER_PID, EARLIER))
    result = step(serving_b, reloaded, FITS, T0)
    assert Terminate(SLEEPER_PID) in result.actions and Terminate(PID) in result.actions
    assert result.state.asleep is None


def test_a_sleeper_still_asleep_long_after_its_wake_is_loaded_cold():
    """A wake whose answer was lost (the node worker restarted meanwhile) is not waited on for the
    whole load timeout: still asleep after the stop timeout, it is stopped and loaded cold."""
    waking = ProcessState(phase=Phase.LOADING, running=A, since=T0, pid=SLEEPER_PID, waking=True)
    asleep = Observed(alive=True, healthy=True, sleeping=True)
    assert step(waking, WANT_A, asleep, T0 + timedelta(seconds=14)).actions == []
    late = step(waking, WANT_A, asleep, T0 + timedelta(seconds=15))
    assert late.actions == [Terminate(SLEEPER_PID)] and late.state.phase == Phase.STOPPING
