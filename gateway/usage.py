"""Usage counted by the gateway in Redis, copied into the database by the tick."""

from __future__ import annotations

import redis
from django.contrib.auth import get_user_model
from django.db.models import F

from gateway.counters import USAGE_RESERVATION, USAGE_USER, key

FIELDS = ("requests", "prompt_tokens", "completion_tokens")


def flush_usage(client: redis.Redis) -> int:
    """Move the counts from Redis into reservations and profiles; returns how many rows changed.

    Each hash is renamed before it is read, so counts the gateway adds meanwhile
    go to a fresh hash and are flushed next time: nothing is lost or counted twice.
    """
    from reservations.models import Profile, Reservation

    changed = 0
    for kind in (USAGE_RESERVATION, USAGE_USER):
        for found in client.scan_iter(match=key(kind, "*")):
            name = found.decode() if isinstance(found, bytes) else str(found)
            ident = name.rsplit(":", 1)[1]
            if not ident.isdigit():
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
            if updates and kind == USAGE_RESERVATION:
                changed += Reservation.objects.filter(pk=int(ident)).update(**updates)
            elif updates and get_user_model().objects.filter(pk=int(ident)).exists():
                Profile.objects.get_or_create(user_id=int(ident))
                changed += Profile.objects.filter(user_id=int(ident)).update(**updates)
            client.delete(flushing)
    return changed
