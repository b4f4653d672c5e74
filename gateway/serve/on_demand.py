"""A request for a model no channel runs asks for a load on demand (docs/scheduling.md, "Loaded
on demand"): the scheduler's service chooses the channel and records the load; the request is
told what it came to as any refusal (``503 model_loading`` with ``Retry-After``, held where the
caller waits) and the channel's decision reaches the gateways as news of a change."""

from __future__ import annotations

import logging
import math

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.utils import timezone

from gateway.rules.access import Refusal
from gateway.rules.callers import Caller
from slotserve_base.vocabulary import ErrorCode

log = logging.getLogger(__name__)

# Added to a load's estimate in ``Retry-After``, as for any load (a fifth, at least 2 s).
MARGIN_SHARE, MARGIN_MIN = 0.2, 2.0


def _ask(user_id: int, model: str, within: frozenset[int] | None = None) -> Refusal | None:
    # Models are imported here: the gateway's server imports this module before Django's apps.
    from django.contrib.auth.models import User

    from channels_app.placement.on_demand_loads import on_demand_load
    from reservations.models import GroupPolicy

    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    if GroupPolicy.objects.filter(group__user=user, loads_on_demand=False).exists():
        return Refusal(
            404,
            ErrorCode.MODEL_NOT_LOADED,
            f"model {model!r} is not loaded, and your group does not load models on request",
        )
    answer = on_demand_load(user=user, model_name=model, now=timezone.now(), within=within)
    if answer is None:
        return None
    load = answer.load
    if load is None:
        return Refusal(answer.status, answer.code, answer.message, answer.retry_after)
    seconds = answer.load_seconds
    wait = math.ceil(seconds + max(seconds * MARGIN_SHARE, MARGIN_MIN))
    return Refusal(
        503,
        ErrorCode.MODEL_LOADING,
        f"model {model!r} is loading on demand on channel {load.channel.name} (about {seconds:.0f} s)",
        wait,
        load.channel_id,
    )


async def ask_on_demand(caller: Caller, model: str) -> Refusal | None:
    """What a load on demand of ``model`` for ``caller`` came to; None where the request's own
    answer stands (no model of that name, or the database away: never a 500 for this)."""
    try:
        return await sync_to_async(_ask, thread_sensitive=False)(
            caller.user_id, model, caller.channels_allowed
        )
    except DatabaseError:
        log.warning("on demand: the database is away; %s not loaded for user %s", model, caller.user_id)
        return None
