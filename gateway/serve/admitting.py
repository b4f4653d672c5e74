"""The application's admission loop: observe, step, act (``gateway.admit.step``), until a request
may go upstream, is refused or its client leaves. What the step sees is made here for the fast
lane too (``seen``), so that both lanes take the same first step from the same inputs."""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import datetime
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.admit.admission import Entry
from gateway.admit.places import Places
from gateway.admit.refusals import held_cap, refuse, send_event_error
from gateway.admit.request import Asked
from gateway.admit.snapshot import Snapshot, SnapshotCache
from gateway.admit.step import (
    Abandon,
    Action,
    Admission,
    AskOnDemand,
    CountFlights,
    CountHeld,
    CountIn,
    Forward,
    GiveBack,
    Go,
    GoNow,
    Hold,
    Refuse,
    Seen,
    WaitTurn,
    step,
)
from gateway.rules.access import Refusal
from gateway.rules.callers import Caller
from gateway.stream.answer import Answer
from gateway.stream.holding import Holding, wait_turn
from gateway.wire.counter_scripts import OverLimit
from gateway.wire.counters import Counters


class GatewayParts(Protocol):
    """What the loop needs of the gateway (``gateway.serve.proxy.Gateway``)."""

    snapshots: SnapshotCache
    counters: Counters
    places: Places

    async def ask_on_demand(self, caller: Caller, model: str) -> Refusal | None: ...


def seen(gateway: GatewayParts, snapshot: Snapshot, **outcome: Any) -> Seen:
    """What the admission step sees now: the snapshot, the clock, the room noted for requests
    that go at once, and what the last action came to (``outcome``)."""
    return Seen(
        snapshot.channels,
        time.monotonic(),
        snapshot.index,
        place_room=gateway.places.room,
        limit_room=gateway.counters.room,
        **outcome,
    )


def take_room(gateway: GatewayParts, go: Go, caller: Caller) -> None:
    """A request goes at once: it takes the room the step saw for it."""
    if go.queued:
        gateway.places.may_take(go.channel.id)
    if go.limits is not None:
        gateway.counters.may_go_ahead(caller.user_id, caller.key_id)


async def admitted(
    gateway: GatewayParts,
    state: Admission,
    request: Asked,
    snapshot: Snapshot,
    holding: Holding,
    answer: Answer,
) -> tuple[Go, Entry] | None:
    """The channel ``request`` goes to and its count in (settled, or on its way alongside); None
    when it was refused (the refusal is sent) or its client left (nothing went upstream)."""
    caller, send = request.caller, holding.send
    hold_token = uuid.uuid4().hex
    looked, now = seen(gateway, snapshot), answer.decide()
    try:
        while True:
            state, action = step(state, looked, now)
            if isinstance(action, GoNow | Forward):
                break
            if isinstance(action, Refuse):
                if holding.begun:  # the stream has begun: the refusal is its last event
                    await send_event_error(send, action.refusal)
                else:
                    await refuse(send, action.refusal)
                return None
            if isinstance(action, Abandon):
                return None  # the client left: nothing went upstream
            looked, now = await act(gateway, action, looked, now, request, holding, answer, hold_token)
    finally:
        # The client may have left while the gateway looked again (outside the wait).
        gone = holding.close()
        if state.held:
            with contextlib.suppress(RedisError):  # the entry expires by itself anyway
                await gateway.counters.unhold(caller.user_id, hold_token)
    go = action.go
    if go.channel.on_demand:
        gateway.counters.note_on_demand_use(go.channel.id)  # its idle time starts again
    if isinstance(action, GoNow):
        # Nothing to wait for, and no limit to check or room under them: the request goes
        # upstream while Redis counts it in (and checks the limits); nothing comes back before
        # it is counted.
        take_room(gateway, go, caller)
        entry = Entry.soon(gateway.counters, go, caller, now)
    else:
        entry = Entry(action.request_id)
    if gone:
        if await entry.settled():  # counted in: count it out, unsent
            assert entry.request_id is not None
            await gateway.counters.leave(
                go.channel.id,
                entry.request_id,
                user_id=caller.user_id,
                reservation_id=None,
                prompt=0,
                completion=0,
            )
        return None  # nothing goes upstream
    return go, entry


async def act(
    gateway: GatewayParts,
    action: Action,
    looked: Seen,
    now: datetime,
    request: Asked,
    holding: Holding,
    answer: Answer,
    hold_token: str,
) -> tuple[Seen, datetime]:
    """Do what the admission step said, short of going upstream or answering: what is seen next,
    and the moment the next step decides at."""
    caller = request.caller
    if isinstance(action, CountFlights):
        return looked._replace(in_flight=await gateway.counters.in_flight(action.channel_ids)), now
    if isinstance(action, WaitTurn):
        place, refusal = await wait_turn(gateway.places, action.go, caller, request, holding, answer)
        left = place is None and refusal is None
        # Its turn: looked at again with the channels as they are now.
        snapshot = await gateway.snapshots.get()
        return seen(gateway, snapshot, turn=place or refusal, left=left), answer.decide()
    if isinstance(action, CountIn):
        go = action.go
        try:
            entered: str | OverLimit | None = await gateway.counters.enter(
                go.channel.id,
                go.limits,
                user_id=caller.user_id,
                key_id=caller.key_id,
                request_id=action.place,
                ready_at=go.channel.ready_at,
            )
        except OverLimit as over:
            entered = over
        return looked._replace(entered=entered, clock=time.monotonic()), now
    if isinstance(action, AskOnDemand):
        answer_now = await gateway.ask_on_demand(caller, action.model)
        snapshot = await gateway.snapshots.get()
        return seen(gateway, snapshot, on_demand=answer_now), answer.decide()
    if isinstance(action, GiveBack):
        await gateway.places.leave(action.channel_id, action.place, caller.user_id)
        return looked, now
    if isinstance(action, CountHeld):
        held_ok = await gateway.counters.hold(caller.user_id, hold_token, held_cap(caller))
        return looked._replace(held_ok=held_ok, clock=time.monotonic()), now
    assert isinstance(action, Hold), action
    await holding.comment(action.note)
    # Woken by the next snapshot (news of a change is read at once): a model ready, a load on
    # demand decided, is seen within a read, not at the next poll.
    if await holding.pause(action.seconds, wake=gateway.snapshots.next_read()):
        return looked._replace(left=True), now
    return seen(gateway, await gateway.snapshots.get()), answer.decide()
