"""The channel's switching gate (docs/gateway.md, "Draining"): closed by the node worker before it
reads the requests in flight, so that a request is either counted (and drained) or refused, and
opened a snapshot's life after the switch, so that no gateway sends a request to a process gone."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from channels_app.node_worker.lifecycle import ProcessState, Wanted, effective_target
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase, RedisKey, redis_key

# A closed gate outlives a worker that died while switching, but not forever.
GATE_SECONDS = 600
# What a gateway's snapshot read may take, beyond its age limit, before it shows a switch.
GATE_READ_SECONDS = 1.0


def publish_gate(channel_id: int, state: ProcessState, wanted: Wanted, now: datetime) -> None:
    """Close the channel's gate when it must switch, before the in-flight count is read.

    The gateway counts a request in before it looks at the gate; closing the
    gate first means a request either is counted (and drained) or is refused
    with ``503 model_switching`` — never sent to a process being stopped.

    The gate holds the moment it closed, and opens (by its expiry, once the switch is over) no
    sooner than a gateway's snapshot can be old (``SLOTSERVE_GATEWAY_REFRESH_SECONDS``, and a
    second for the read) after it: a
    switch with nothing to drain stops the old process at once, and a snapshot read just
    before still shows it ready on its port (docs/gateway.md, "Draining").
    """
    target, _ = effective_target(state, wanted, now)
    reload = wanted.reload_generation != state.reload_generation
    switching = state.phase in (Phase.READY, Phase.DRAINING, Phase.STOPPING) and (
        target != state.running or reload or state.phase == Phase.STOPPING
    )
    gate = redis_key(RedisKey.GATE, channel_id)
    client = redis_client()
    if switching:
        closed = client.get(gate)
        # A gate still closed from the last switch, before the process now left was ready, is
        # closed anew: a gateway lets a snapshot showing the process ready since after the gate's
        # moment through it (the switch's new process: slotserve_base.inflight.GATE_HOLDS).
        ready_since = state.since.timestamp() if state.phase == Phase.READY and state.since else None
        if closed is None or (ready_since is not None and _moment(closed) < ready_since):
            client.set(gate, repr(now.timestamp()), ex=GATE_SECONDS)
        else:
            client.expire(gate, GATE_SECONDS)  # keeps the moment it first closed
        return
    closed = client.get(gate)
    if closed is None:
        return
    left = (
        _moment(closed)
        + float(settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS)
        + GATE_READ_SECONDS
        - now.timestamp()
    )
    if left <= 0:
        client.delete(gate)
    else:
        client.pexpire(gate, max(1, int(left * 1000)))  # Redis opens it then, with no tick to wait for


def _moment(closed: bytes | str) -> float:
    """The moment a gate closed, as it keeps it; 0 when it keeps none (it opens)."""
    try:
        return float(closed)
    except ValueError:
        return 0.0
