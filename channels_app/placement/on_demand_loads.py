"""Loads on demand made (docs/scheduling.md, "Loaded on demand"): when a request names a model
no channel runs, the channel ``channels_app.placement.on_demand`` chooses is recorded, and the
scheduler's decision (its rule 5) makes it the channel's target. Released by
``channels_app.scheduling.on_demand``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, IntegrityError, transaction
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from channels_app import story
from channels_app.models import (
    Channel,
    LLMModel,
    OnDemandLoad,
    StoryKind,
)
from channels_app.models.channel import channels_bookable_by
from channels_app.placement.inputs import placement_inputs
from channels_app.placement.on_demand import OnDemandChannel, on_demand_placement
from channels_app.placement.selectors import maximums
from channels_app.scheduling import selectors
from channels_app.scheduling.tasks import channel_redecide
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.inflight import in_flight_counts
from slotserve_base.redis_client import redis_client
from slotserve_base.target import Target
from slotserve_base.vocabulary import ErrorCode

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


def on_demand_load(
    *, user: User, model_name: str, now: datetime, within: frozenset[int] | None = None
) -> OnDemandAnswer | None:
    """Load ``model_name`` on demand for ``user`` (on one of the channels ``within``, the caller's
    key's scope, where it has one), or say why not; None when no registered model has that name
    (the request's own ``404 model_not_loaded`` stands)."""
    model = LLMModel.objects.filter(name=model_name).first()
    if model is None:
        return None
    not_loaded = f"model {model.name!r} is not loaded"
    if not model.loads_on_demand:
        return _refused(
            404, ErrorCode.MODEL_NOT_LOADED, f"{not_loaded}, and staff do not let it load on request"
        )
    joined = _joined(model)
    if joined is not None:
        return joined
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
    chosen = _choose(user, model, now, within)
    if isinstance(chosen, str):
        return _refused(
            404, ErrorCode.MODEL_NOT_LOADED, f"{not_loaded}, and no channel can load it now: {chosen}"
        )
    channel, seconds = chosen
    try:
        with transaction.atomic():
            load = OnDemandLoad.objects.create(
                channel=channel, model=model, requested_by=user, started_at=now
            )
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
        return _joined(model) or _refused(503, ErrorCode.MODEL_LOADING, f"{not_loaded}; try again", 1)
    log.info(
        "on demand: %s loads %s on %s (about %.0f s)", user.get_username(), model.name, channel.name, seconds
    )
    # Decided here and now, the node told at once, rather than a queue's hop later (the queued
    # re-decision above, for when this one cannot be made, then finds nothing to change).
    try:
        channel_redecide(channel.pk)
    except (DatabaseError, OperationalError, RedisError):
        log.warning("on demand: %s is decided by the queued re-decision", channel.name, exc_info=True)
    return OnDemandAnswer(load, seconds)


def _joined(model: LLMModel) -> OnDemandAnswer | None:
    """The model's load on demand already under way, joined; None when there is none."""
    running = (
        OnDemandLoad.objects.filter(model=model, released_at__isnull=True).select_related("channel").first()
    )
    return None if running is None else OnDemandAnswer(running, _estimate(running.channel, running.target))


def _estimate(channel: Channel, target: Target) -> float:
    estimates = selectors.load_estimates([(channel.node_id, target)])
    return estimates.get((channel.node_id, target), 0.0)


def _choose(
    user: User, model: LLMModel, now: datetime, within: frozenset[int] | None
) -> tuple[Channel, float] | str:
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
            admits_caller=c.id in bookable and (within is None or c.id in within),
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
