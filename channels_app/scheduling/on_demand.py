"""Loads on demand (docs/scheduling.md, "Loaded on demand"): made when a request names a model
no channel runs, released when idle. The choice of channel is
``channels_app.placement.on_demand``'s; the channel's target stays the scheduler's (rule 5)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app import story
from channels_app.models import (
    Channel,
    ChannelRuntime,
    LLMModel,
    OnDemandLoad,
    OnDemandRelease,
    StoryKind,
)
from channels_app.models.channel import channels_bookable_by
from channels_app.placement.inputs import placement_inputs
from channels_app.placement.on_demand import OnDemandChannel, on_demand_placement
from channels_app.placement.selectors import maximums
from channels_app.scheduling import selectors
from channels_app.scheduling.decision import on_demand_holds
from reservations.models import GroupPolicy
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.inflight import in_flight_counts
from slotserve_base.redis_client import redis_client
from slotserve_base.target import Target
from slotserve_base.vocabulary import ErrorCode, Phase, RedisKey, redis_key

log = logging.getLogger(__name__)

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class OnDemandAnswer:
    """What a request for a model no channel runs is told: the load it started or joined (and
    its estimate), or why none (an HTTP status, an error code, words, a ``Retry-After``)."""

    load: OnDemandLoad | None
    load_seconds: float = 0.0
    status: int = 0
    code: str = ""
    message: str = ""
    retry_after: int | None = None


def _refused(status: int, code: str, message: str, retry_after: int | None = None) -> OnDemandAnswer:
    return OnDemandAnswer(None, status=status, code=code, message=message, retry_after=retry_after)


def on_demand_load(*, user: User, model_name: str, now: datetime) -> OnDemandAnswer | None:
    """Load ``model_name`` on demand for ``user``, or say why not; None when no registered model
    has that name (the request's own ``404 model_not_loaded`` stands)."""
    model = LLMModel.objects.filter(name=model_name).first()
    if model is None:
        return None
    not_loaded = f"model {model.name!r} is not loaded"
    if not model.loads_on_demand:
        return _refused(404, ErrorCode.MODEL_NOT_LOADED, f"{not_loaded}, and staff do not let it load on request")
    running = OnDemandLoad.objects.filter(model=model, released_at__isnull=True).select_related("channel").first()
    if running is not None:
        return OnDemandAnswer(running, _estimate(running.channel, running.target))
    if GroupPolicy.objects.filter(group__user=user, loads_on_demand=False).exists():
        return _refused(
            404, ErrorCode.MODEL_NOT_LOADED, f"{not_loaded}, and your group does not load models on request"
        )
    limit = settings.SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR
    recent = list(
        OnDemandLoad.objects.filter(requested_by=user, started_at__gt=now - HOUR)
        .order_by("started_at")
        .values_list("started_at", flat=True)
    )
    if len(recent) >= limit:
        free_at = recent[len(recent) - limit] + HOUR if limit > 0 else now + HOUR
        wait = max(int((free_at - now).total_seconds()) + 1, 1)
        return _refused(
            429,
            ErrorCode.RATE_LIMIT_EXCEEDED,
            f"{not_loaded}; you loaded {len(recent)} models on request in the last hour (at most {limit})",
            wait,
        )
    chosen = _choose(user, model, now)
    if isinstance(chosen, str):
        return _refused(404, ErrorCode.MODEL_NOT_LOADED, f"{not_loaded}, and no channel can load it now: {chosen}")
    channel, seconds = chosen
    try:
        with transaction.atomic():
            load = OnDemandLoad.objects.create(channel=channel, model=model, requested_by=user, started_at=now)
            story.told(
                channel.pk,
                now,
                StoryKind.ON_DEMAND,
                model_id=model.pk,
                model=model.name,
                by=user.get_username(),
                load_seconds=seconds,
            )
            enqueue_redecide(channel.pk)
    except IntegrityError:
        # Someone else's request loaded it (or took the channel) a moment before: join theirs.
        running = OnDemandLoad.objects.filter(model=model, released_at__isnull=True).select_related("channel").first()
        if running is None:
            return _refused(503, ErrorCode.MODEL_LOADING, f"{not_loaded}; try again", 1)
        return OnDemandAnswer(running, _estimate(running.channel, running.target))
    log.info("on demand: %s loads %s on %s (about %.0f s)", user.get_username(), model.name, channel.name, seconds)
    return OnDemandAnswer(load, seconds)


def _estimate(channel: Channel, target: Target) -> float:
    estimates = selectors.load_estimates([(channel.node_id, target)])
    return estimates.get((channel.node_id, target), 0.0)


def _choose(user: User, model: LLMModel, now: datetime) -> tuple[Channel, float] | str:
    """The channel to load ``model`` on, with its load estimate there; or why none may."""
    target = Target(model.pk, None)
    stay = settings.SLOTSERVE_ON_DEMAND_MIN_STAY_SECONDS
    facts = selectors.decision_inputs(now=now)
    estimates = selectors.load_estimates({(f.channel.node_id, target) for f in facts.values()})
    longest = max(estimates.values(), default=0.0)
    candidates, wanted = placement_inputs(
        model=model, preset=None, start=now, end=now + timedelta(seconds=longest + stay), now=now
    )
    bookable = set(channels_bookable_by(user).values_list("pk", flat=True))
    in_flight = in_flight_counts(redis_client(), list(facts))
    channels = [
        OnDemandChannel(
            candidate=c,
            serves_on_demand=facts[c.id].channel.serves_on_demand,
            admits_caller=c.id in bookable,
            decision_input=facts[c.id].decision_input,
            load_seconds=estimates.get((facts[c.id].channel.node_id, target), 0.0),
            default_in_flight=in_flight.get(c.id, 0),
        )
        for c in candidates
        if c.id in facts
    ]
    placed = on_demand_placement(
        channels,
        wanted,
        now=now,
        min_stay_seconds=stay,
        policy=model.placement_strategy,
        maximums=maximums(),
    )
    if not placed.ranked:
        return placed.message
    best = facts[placed.ranked[0].candidate.id].channel
    return best, estimates.get((best.node_id, target), 0.0)


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
                idle_seconds=settings.SLOTSERVE_ON_DEMAND_IDLE_SECONDS if why == OnDemandRelease.IDLE else None,
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
        c: datetime.fromtimestamp(float(v), tz=UTC) for c, v in zip(channel_ids, values, strict=True) if v is not None
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
        why = release_reason(
            load=load,
            runtime=runtimes.get(load.channel_id),
            holds=load.channel_id in facts and on_demand_holds(facts[load.channel_id].decision_input, now),
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
    holds: bool,
    used: datetime | None,
    in_flight: int,
    idle: timedelta,
    now: datetime,
) -> str | None:
    """Why ``load`` is released now, or None while it stays (docs/scheduling.md)."""
    if not holds:
        return OnDemandRelease.BOOKING
    if runtime is not None and runtime.phase == Phase.FAILED and runtime.since >= load.started_at:
        return OnDemandRelease.FAILED
    if runtime is None or runtime.running != load.target:
        return None  # not started yet: its load is still to come
    if runtime.phase != Phase.READY or in_flight > 0:
        return None
    quiet_since = max(runtime.since, used) if used is not None else runtime.since
    return OnDemandRelease.IDLE if now - quiet_since >= idle else None
