"""This process's client of SlotServe's Redis: one connection pool, kept for the process."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


def redis_client() -> redis.Redis:
    """This process's client of SlotServe's Redis: one connection pool, kept for the process."""
    return _client_for(settings.REDIS_URL)


@functools.cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
