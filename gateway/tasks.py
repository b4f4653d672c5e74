"""The gateway's periodic task: its usage counts, from Redis into the database."""

from __future__ import annotations

from celery import shared_task

from gateway.usage.flush import flush_usage
from gateway.usage.request_log import flush_request_log
from slotserve_base import dispatch
from slotserve_base.redis_client import redis_client


@shared_task(name=dispatch.FLUSH_USAGE, ignore_result=True, soft_time_limit=30, time_limit=60)
def flush_gateway_usage() -> int:
    """Move the gateway's usage counts into reservations, profiles and API keys, and its
    request records into the request log."""
    client = redis_client()
    return flush_usage(client) + flush_request_log(client)


@shared_task(name=dispatch.KEYS_EXPIRING, ignore_result=True, soft_time_limit=30, time_limit=60)
def tell_keys_expiring() -> int:
    """Tell owners of API keys that stop working within a week (once per expiry)."""
    from django.utils import timezone

    from gateway.api_keys import tell_keys_expiring as tell

    return tell(now=timezone.now())
