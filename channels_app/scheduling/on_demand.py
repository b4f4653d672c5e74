"""Loads on demand released (docs/scheduling.md, "Loaded on demand"): by the tick when idle,
failed or ended by a booking, or by staff. Made by ``channels_app.placement.on_demand_loads``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from channels_app import story
from channels_app.models import ChannelRuntime, OnDemandLoad, OnDemandRelease, StoryKind
from channels_app.scheduling import selectors
from channels_app.scheduling.decision import decide
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.inflight import in_flight_counts
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase, Reason, RedisKey, redis_key


def on_demand_release(*, load: OnDemandLoad, now: datetime, why: str, by: User | None = None) -> bool:
    """Release ``load`` (its channel goes back to its default); False when it was released already."""
    with transaction.atomic():
        released = OnDemandLoad.objects.filter(pk=load.pk, released_at__isnull=True).update(
            released_at=now, released_why=why
        )
        if released:
            story.told(
                load.channel_id,
                now,
                StoryKind.ON_DEMAND_RELEASED,
                model_id=load.model_id,
                why=why,
                idle_seconds=settings.SLOTSERVE_ON_DEMAND_IDLE_SECONDS
                if why == OnDemandRelease.IDLE
                else None,
                by=by.get_username() if by else None,
            )
            enqueue_redecide(load.channel_id)
    return bool(released)


def last_used(channel_ids: list[int]) -> dict[int, datetime]:
    """When a request last went to each channel's load on demand (the gateway notes it)."""
    if not channel_ids:
        return {}
    values = redis_client().mget([redis_key(RedisKey.ON_DEMAND_USED, c) for c in channel_ids])
    return {
        c: datetime.fromtimestamp(float(v), tz=UTC)
        for c, v in zip(channel_ids, values, strict=True)
        if v is not None
    }


def release_idle_on_demand(*, now: datetime) -> int:
    """The tick's job: release each load on demand that is idle, failed, or ended by a booking."""
    loads = list(OnDemandLoad.objects.filter(released_at__isnull=True))
    if not loads:
        return 0
    ids = [load.channel_id for load in loads]
    runtimes = {r.channel_id: r for r in ChannelRuntime.objects.filter(channel_id__in=ids)}
    facts = selectors.decision_inputs(now=now, channel_ids=ids)
    used = last_used(ids)
    in_flight = in_flight_counts(redis_client(), ids)
    idle = timedelta(seconds=settings.SLOTSERVE_ON_DEMAND_IDLE_SECONDS)
    released = 0
    for load in loads:
        fact = facts.get(load.channel_id)
        why = release_reason(
            load=load,
            runtime=runtimes.get(load.channel_id),
            decided=decide(fact.decision_input, now).reason if fact is not None else None,
            used=used.get(load.channel_id),
            in_flight=in_flight.get(load.channel_id, 0),
            idle=idle,
            now=now,
        )
        if why is not None and on_demand_release(load=load, now=now, why=why):
            released += 1
    return released


def release_reason(
    *,
    load: OnDemandLoad,
    runtime: ChannelRuntime | None,
    decided: str | None,
    used: datetime | None,
    in_flight: int,
    idle: timedelta,
    now: datetime,
) -> str | None:
    """Why ``load`` is released now, or None while it stays (docs/scheduling.md): ``decided`` is
    the reason of the channel's decision with the load in it (None: the channel is gone)."""
    if decided in (Reason.MANUAL_OVERRIDE, Reason.MANUAL_UNLOAD):
        return OnDemandRelease.STAFF  # an admin's override took the channel: not back after it
    if decided != Reason.ON_DEMAND:
        return OnDemandRelease.BOOKING  # a booking (or its preload) took the channel
    if runtime is not None and runtime.phase == Phase.FAILED and runtime.since >= load.started_at:
        return OnDemandRelease.FAILED
    if runtime is None or runtime.running != load.target:
        return None  # not started yet: its load is still to come
    if runtime.phase != Phase.READY or in_flight > 0:
        return None
    quiet_since = max(runtime.since, used) if used is not None else runtime.since
    return OnDemandRelease.IDLE if now - quiet_since >= idle else None
