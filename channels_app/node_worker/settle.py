"""Watching a quick phase closely (docs/node-workers.md, "Readiness pushed"): after a step that
leaves a channel stopping, loading or draining, the node worker looks at what the next step
depends on every few milliseconds — the process's exit, its health endpoint, the requests in
flight — and steps again the moment it changes, within the same task. A phase that lasts longer
than ``SETTLE_SECONDS`` is handed to the follow-ups (``tasks.follow_up_delay``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from channels_app.models import ChannelRuntime
from channels_app.node_worker import processes
from channels_app.node_worker.lifecycle import ProcessState
from slotserve_base.inflight import in_flight_counts
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase

# How long one task watches a phase before it hands it to the follow-ups.
SETTLE_SECONDS = 0.5
# How often it looks meanwhile.
LOOK_SECONDS = 0.003
# A health probe of a process that is still loading is answered at once (503) or refused; one
# that hangs is not worth waiting for here.
PROBE_TIMEOUT_SECONDS = 0.2


def settled(channel_id: int, state: ProcessState, *, until: float) -> bool:
    """Whether what the next step of ``state`` depends on changed before ``until``
    (``time.monotonic``); looks every ``LOOK_SECONDS``."""
    changed = _watch(channel_id, state)
    if changed is None:
        return False
    while True:
        if changed():
            return True
        if time.monotonic() + LOOK_SECONDS >= until:
            return False
        time.sleep(LOOK_SECONDS)


def _watch(channel_id: int, state: ProcessState) -> Callable[[], bool] | None:
    if state.phase == Phase.DRAINING:
        return lambda: in_flight_counts(redis_client(), [channel_id])[channel_id] == 0
    run = (
        ChannelRuntime.objects.filter(pk=channel_id)
        .values_list("pid", "run_id", "host", "port", "api_secret")
        .first()
    )
    if run is None:
        return None
    pid, run_id, host, port, secret = run
    if pid is None or not run_id:
        return None
    if state.phase == Phase.STOPPING:
        return lambda: not processes.alive(pid, run_id)[0]
    if state.phase == Phase.LOADING and port is not None:
        return lambda: (
            not processes.alive(pid, run_id)[0]
            or processes.healthy(host, port, secret, timeout=PROBE_TIMEOUT_SECONDS)
        )
    return None
