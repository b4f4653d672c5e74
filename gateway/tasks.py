"""The gateway's periodic tasks: its usage counts, from Redis into the database, and the
request log's backlog into the roll-ups."""

from __future__ import annotations

import redis
from celery import shared_task
from django.utils import timezone

from gateway.usage.budgets import tell_budgets_used
from gateway.usage.flush import flush_usage
from gateway.usage.request_log import flush_request_log
from slotserve_base import dispatch
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import RedisKey, redis_key


@shared_task(name=dispatch.FLUSH_USAGE, ignore_result=True, soft_time_limit=30, time_limit=60)
def flush_gateway_usage() -> int:
    """Move the gateway's usage counts into reservations, profiles and API keys, and its
    request records into the request log; announce weekly token budgets used up."""
    client = redis_client()
    flushed = flush_usage(client) + flush_request_log(client)
    tell_budgets_used(client, now=timezone.now())
    keep_catching_up(client)
    return flushed


def keep_catching_up(client: redis.Redis) -> None:
    """Send the catch-up again if a backlog waits and no slice of it ran lately (a worker that
    died in one, a broker that lost it)."""
    from gateway.models import RollupMark

    if RollupMark.objects.filter(backlog_to__gt=0).exists() and client.set(
        redis_key(RedisKey.USAGE_CATCH_UP, "alive"), 1, nx=True, ex=CATCH_UP_ALIVE_SECONDS
    ):
        dispatch.send_quietly(dispatch.CATCH_UP_USAGE)


# The catch-up works in slices of this many seconds, each a task of its own, so that it never holds
# a worker of the scheduler's for long; each slice says it is alive for a while.
CATCH_UP_SLICE_SECONDS = 2.0
CATCH_UP_ALIVE_SECONDS = 30


@shared_task(name=dispatch.CATCH_UP_USAGE, ignore_result=True, soft_time_limit=60, time_limit=90)
def catch_up_usage() -> int:
    """Fold a slice of the request log's backlog into the roll-ups (``gateway.usage.rollups``)
    and send the next slice while any is left; the rows folded so far."""
    from gateway.usage.rollups import catch_up

    redis_client().set(redis_key(RedisKey.USAGE_CATCH_UP, "alive"), 1, ex=CATCH_UP_ALIVE_SECONDS)
    caught = catch_up(seconds=CATCH_UP_SLICE_SECONDS)
    if not caught.finished:
        dispatch.send_quietly(dispatch.CATCH_UP_USAGE)
    return caught.done


@shared_task(name=dispatch.KEYS_EXPIRING, ignore_result=True, soft_time_limit=30, time_limit=60)
def tell_keys_expiring() -> int:
    """Tell owners of API keys that stop working within a week (once per expiry)."""
    from gateway.api_keys import tell_keys_expiring as tell

    return tell(now=timezone.now())
