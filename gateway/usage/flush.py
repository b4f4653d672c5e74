"""Usage the gateway counted in Redis, copied into reservations, profiles and API keys by its
periodic task (``gateway.tasks.flush_gateway_usage``)."""

from __future__ import annotations

import redis
from django.contrib.auth import get_user_model
from django.db.models import F
from django.utils import timezone

from slotserve_base.api_fields import is_id
from slotserve_base.vocabulary import RedisKey
from slotserve_base.vocabulary import redis_key as key

USAGE_RESERVATION, USAGE_USER, USAGE_KEY = RedisKey.USAGE_RESERVATION, RedisKey.USAGE_USER, RedisKey.USAGE_KEY

FIELDS = ("requests", "prompt_tokens", "completion_tokens")


def flush_usage(client: redis.Redis) -> int:
    """Move the counts from Redis into reservations and profiles; returns how many rows changed.

    Each hash is renamed before it is read, so counts the gateway adds meanwhile
    go to a fresh hash and are flushed next time: nothing is lost or counted twice.
    """
    from gateway.models import ApiKey
    from reservations.models import Profile, Reservation

    changed = 0
    now = timezone.now()
    for kind in (USAGE_RESERVATION, USAGE_USER, USAGE_KEY):
        for found in client.scan_iter(match=key(kind, "*")):
            name = found.decode() if isinstance(found, bytes) else str(found)
            ident = name.rsplit(":", 1)[1]
            if not is_id(ident):
                continue  # a hash being flushed right now
            flushing = f"{name}:flushing"
            try:
                client.rename(name, flushing)
            except redis.ResponseError:  # gone since the scan: another flush took it
                continue
            counts = {
                (k.decode() if isinstance(k, bytes) else k): int(v)
                for k, v in client.hgetall(flushing).items()
            }
            updates = {f: F(f) + counts[f] for f in FIELDS if counts.get(f)}
            # A user or reservation deleted since: its counts go with it (update() finds no row).
            if kind == USAGE_KEY:
                # When a key was last used (to within a flush): what its owner sees in the key list.
                changed += ApiKey.objects.filter(pk=int(ident)).update(last_used=now)
            elif updates and kind == USAGE_RESERVATION:
                changed += Reservation.objects.filter(pk=int(ident)).update(**updates)
            elif updates and get_user_model().objects.filter(pk=int(ident)).exists():
                Profile.objects.get_or_create(user_id=int(ident))
                changed += Profile.objects.filter(user_id=int(ident)).update(**updates)
            client.delete(flushing)
    return changed
