"""The gateway's periodic task: its usage counts, from Redis into the database."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from gateway.usage.budgets import tell_budgets_used
from gateway.usage.flush import flush_usage
from gateway.usage.request_log import flush_request_log
from slotserve_base import dispatch
from slotserve_base.redis_client import redis_client


@shared_task(name=dispatch.FLUSH_USAGE, ignore_result=True, soft_time_limit=30, time_limit=60)
def flush_gateway_usage() -> int:
    """Move the gateway's usage counts into reservations, profiles and API keys, and its
    request records into the request log; announce weekly token budgets used up."""
    client = redis_client()
    flushed = flush_usage(client) + flush_request_log(client)
    tell_budgets_used(client, now=timezone.now())
    return flushed


@shared_task(name=dispatch.KEYS_EXPIRING, ignore_result=True, soft_time_limit=30, time_limit=60)
def tell_keys_expiring() -> int:
    """Tell owners of API keys that stop working within a week (once per expiry)."""
    from gateway.api_keys import tell_keys_expiring as tell

    return tell(now=timezone.now())
