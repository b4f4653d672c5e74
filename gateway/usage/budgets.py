"""A user's weekly token budget used up, told to their webhooks once a week
(``limit.reached``, docs/webhooks.md): the periodic flush looks at the week's counts, and marks
in Redis whom it told (the happening's key makes a second telling a no-op where the mark is
lost; what the webhooks keep is theirs)."""

from __future__ import annotations

from datetime import datetime, timedelta

import redis
from django.contrib.auth import get_user_model

from gateway.wire.counter_scripts import week_start
from slotserve_base.api_fields import is_id
from slotserve_base.happenings import Happening, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import RedisKey, WebhookEvent
from slotserve_base.vocabulary import redis_key as key


def tell_budgets_used(client: redis.Redis, *, now: datetime) -> int:
    """Announce each user whose tokens this week reached their budget; returns how many."""
    from gateway.admit.snapshot import limits_reader

    monday = week_start(now)
    label = f"{monday:%Y%m%d}"
    limits = limits_reader()
    told = 0
    for found in client.scan_iter(match=key(RedisKey.WEEK_TOKENS, f"*-{label}")):
        name = found.decode() if isinstance(found, bytes) else str(found)
        ident = name.rsplit(":", 1)[1].split("-", 1)[0]
        if not is_id(ident):
            continue
        user_id = int(ident)
        mine = limits(user_id, None, None)
        budget = mine.user_weekly_tokens if mine is not None else 0
        used = int(client.get(name) or 0)
        once = f"{WebhookEvent.LIMIT_REACHED}:weekly_tokens:{user_id}:{label}"
        mark = key(RedisKey.BUDGET_TOLD, f"{user_id}-{label}")
        if not budget or used < budget or client.exists(mark):
            continue
        user = get_user_model().objects.filter(pk=user_id).first()
        if user is None:
            continue
        resets = monday + timedelta(days=7)
        tell(
            Happening(
                type=WebhookEvent.LIMIT_REACHED,
                at=now,
                data={
                    "user": user_ref(user),
                    "limit": "weekly_tokens",
                    "budget": budget,
                    "used": used,
                    "resets_at": iso_moment(resets),
                },
                subject=f"user:{user_id}",
                words=(
                    f"{user} used the week's {budget} tokens outside their own slots; the budget "
                    f"starts again on {resets:%Y-%m-%d} 00:00 UTC."
                ),
                users=frozenset({user_id}),
                link="/usage/",
                key=once,
            )
        )
        client.set(mark, 1, ex=TOLD_MARK_SECONDS)
        told += 1
    return told


# A mark lives past its week's end.
TOLD_MARK_SECONDS = 8 * 24 * 3600
